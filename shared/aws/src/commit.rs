//! What one commit writes: a single `TransactWriteItems`, and what its cancellation means.
//!
//! The transaction holds, in this order:
//! 1. the head `Put`, conditioned on the version (`attribute_not_exists(PK)` to create,
//!    `version = :expected` after that), carrying the new snapshot, version, message count,
//!    agent, owner, times and the index attributes (the due index's only with a wake time);
//! 2. one `Put` per turn or call id the events use first ([`Commit::first_used`]), each
//!    conditioned `attribute_not_exists(SK)`, so an id once used is kept for good;
//! 3. one event pack: every event of the commit in one item, keyed by its first sequence
//!    number;
//! 4. one item per new message node;
//! 5. the chunk items of whichever of these payloads did not fit in its item.
//!
//! All or nothing: when DynamoDB cancels it, the reasons come back in the same order, so the
//! head's failed condition is a [`StoreError::Conflict`] and an id item's an `IdsUsed` naming
//! exactly the ids already there. A commit larger than a transaction may be (100 items, 4 MB)
//! is refused before anything is sent.

use aws_sdk_dynamodb::types::{CancellationReason, Put, TransactWriteItem};
use turnstone_engine::session::UsedId;
use turnstone_engine::time::Timestamp;
use turnstone_runtime::store::{Commit, StoreError};

use crate::chunks;
use crate::error::{AwsError, build_error};
use crate::items::{
    self, AGENT, COUNT, CREATED_AT, CREATED_KEY, DECLARED, DUE_SHARD, FIRST, HEAD, Item, LIST_SHARD, LISTED,
    MESSAGES, OWNER, PK, SK, UPDATED_AT, VERSION, WAKE_AT, WAKE_KEY,
};

/// The most items one `TransactWriteItems` takes.
pub(crate) const MAX_ITEMS: usize = 100;
/// The most bytes of items one `TransactWriteItems` takes (4 MB, with room for our estimate).
pub(crate) const MAX_BYTES: usize = 4_000_000;
/// The most bytes one item holds (400 KB).
pub(crate) const MAX_ITEM_BYTES: usize = 400 * 1024;

/// What an item of the transaction is, to read the cancellation reasons (same order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    Head,
    Used(UsedId),
    Data,
}

/// A commit as one transaction.
#[derive(Debug)]
pub(crate) struct Transaction {
    pub items: Vec<TransactWriteItem>,
    pub roles: Vec<Role>,
    /// The version the head will have.
    pub new_version: u64,
    /// About how many bytes of items it writes.
    pub bytes: usize,
}

/// Builds the transaction of `commit` onto `table`, refusing one that does not fit.
pub(crate) fn transaction(
    table: &str,
    session_id: &str,
    expected: u64,
    commit: &Commit<'_>,
    now: Timestamp,
) -> Result<Transaction, AwsError> {
    check(session_id, commit)?;
    let serialize = |source| AwsError::Serialize { session_id: session_id.to_owned(), source };
    let session = commit.session;
    let new_version = expected + 1;

    let mut head = items::key(session_id, HEAD);
    head.insert(VERSION.to_owned(), items::n(new_version));
    head.insert(MESSAGES.to_owned(), items::n(session.tree().len()));
    head.insert(AGENT.to_owned(), items::s(session.agent_id()));
    // An index key may not be empty: an empty owner is not indexed (and lists as none).
    if let Some(owner) = session.init().and_then(|i| i.identity.id.as_deref()).filter(|o| !o.is_empty()) {
        head.insert(OWNER.to_owned(), items::s(owner));
    }
    head.insert(CREATED_AT.to_owned(), items::n(session.created_at().0));
    head.insert(UPDATED_AT.to_owned(), items::n(now.0));
    head.insert(CREATED_KEY.to_owned(), items::s(items::timed_key(session.created_at(), session_id)));
    head.insert(LIST_SHARD.to_owned(), items::s(LISTED));
    if let Some(wake_at) = commit.wake_at {
        head.insert(WAKE_AT.to_owned(), items::n(wake_at.0));
        head.insert(DUE_SHARD.to_owned(), items::s(items::due_shard(session_id)));
        head.insert(WAKE_KEY.to_owned(), items::s(items::timed_key(wake_at, session_id)));
    }
    // The declared agent config (a system prompt, every tool's schema) is the bulk of a head and
    // never changes: the creating commit writes it once as its own item, the head leaves it out.
    let mut snapshot = serde_json::to_value(session).map_err(serialize)?;
    let declared = snapshot
        .get_mut("init")
        .and_then(|init| init.as_object_mut())
        .and_then(|init| init.remove("declared"));
    let snapshot = serde_json::to_string(&snapshot).map_err(serialize)?;
    let mut chunk_items = chunks::lay_out(session_id, HEAD, snapshot, Some(new_version), &mut head);

    let mut puts: Vec<(Item, Role)> = vec![(head, Role::Head)];
    if expected == 0
        && let Some(declared) = declared.filter(|d| !d.is_null())
    {
        let mut item = items::key(session_id, DECLARED);
        let body = serde_json::to_string(&declared).map_err(serialize)?;
        chunk_items.extend(chunks::lay_out(session_id, DECLARED, body, None, &mut item));
        puts.push((item, Role::Data));
    }
    for id in first_used(commit) {
        puts.push((items::key(session_id, items::used_key(&id)), Role::Used(id)));
    }
    if !commit.events.is_empty() {
        let first = commit.first_seq();
        let sk = items::event_key(first);
        let mut pack = items::key(session_id, sk.as_str());
        pack.insert(FIRST.to_owned(), items::n(first));
        pack.insert(COUNT.to_owned(), items::n(commit.events.len()));
        let body = serde_json::to_string(commit.events).map_err(serialize)?;
        chunk_items.extend(chunks::lay_out(session_id, &sk, body, None, &mut pack));
        puts.push((pack, Role::Data));
    }
    for (pos, node) in commit.new_messages() {
        let sk = items::message_key(pos);
        let mut message = items::key(session_id, sk.as_str());
        let body = serde_json::to_string(&node).map_err(serialize)?;
        chunk_items.extend(chunks::lay_out(session_id, &sk, body, None, &mut message));
        puts.push((message, Role::Data));
    }
    puts.extend(chunk_items.into_iter().map(|chunk| (chunk, Role::Data)));

    let bytes = fits(session_id, &puts)?;
    let mut items = Vec::with_capacity(puts.len());
    let mut roles = Vec::with_capacity(puts.len());
    for (item, role) in puts {
        let put = Put::builder().table_name(table).set_item(Some(item));
        let put = match &role {
            Role::Head if expected == 0 => {
                put.condition_expression("attribute_not_exists(#pk)").expression_attribute_names("#pk", PK)
            }
            Role::Head => put
                .condition_expression("#version = :expected")
                .expression_attribute_names("#version", VERSION)
                .expression_attribute_values(":expected", items::n(expected)),
            Role::Used(_) => {
                put.condition_expression("attribute_not_exists(#sk)").expression_attribute_names("#sk", SK)
            }
            Role::Data => put,
        };
        let put = put.build().map_err(build_error("TransactWriteItems"))?;
        items.push(TransactWriteItem::builder().put(put).build());
        roles.push(role);
    }
    Ok(Transaction { items, roles, new_version, bytes })
}

/// The commit must be about this session and agree with itself.
fn check(session_id: &str, commit: &Commit<'_>) -> Result<(), AwsError> {
    commit
        .check(session_id)
        .map_err(|message| AwsError::InvalidCommit { session_id: session_id.to_owned(), message })
}

/// The ids the commit uses first, each once (a queued turn that starts in the same commit
/// names its id twice; one transaction may not write an item twice).
fn first_used(commit: &Commit<'_>) -> Vec<UsedId> {
    let mut seen = std::collections::HashSet::new();
    commit.first_used().into_iter().filter(|id| seen.insert(id.clone())).collect()
}

/// Checks the transaction's limits; returns its size.
fn fits(session_id: &str, puts: &[(Item, Role)]) -> Result<usize, AwsError> {
    let too_large = |reason: String| AwsError::CommitTooLarge { session_id: session_id.to_owned(), reason };
    if puts.len() > MAX_ITEMS {
        let used = puts.iter().filter(|(_, role)| matches!(role, Role::Used(_))).count();
        return Err(too_large(format!(
            "{} items (the head, {used} used ids, events, messages and chunks), at most {MAX_ITEMS}",
            puts.len()
        )));
    }
    let mut total = 0;
    for (item, _) in puts {
        let size = items::item_size(item);
        if size > MAX_ITEM_BYTES {
            let sk = items::get_s(item, SK).unwrap_or("?");
            return Err(too_large(format!("item {sk} holds {size} bytes, at most {MAX_ITEM_BYTES}")));
        }
        total += size;
    }
    if total > MAX_BYTES {
        return Err(too_large(format!("{total} bytes of items, at most {MAX_BYTES}")));
    }
    Ok(total)
}

/// What a cancelled transaction means for the commit. DynamoDB gives one reason per item, in
/// the request's order, `None` for an item that was fine; moto does the same.
pub(crate) fn refusal(
    session_id: &str,
    expected: u64,
    roles: &[Role],
    reasons: &[CancellationReason],
) -> Result<StoreError, String> {
    let failed = |reason: &CancellationReason, code: &str| reason.code() == Some(code);
    let conflict = StoreError::Conflict { session_id: session_id.to_owned(), expected };
    let mut used = Vec::new();
    for (role, reason) in roles.iter().zip(reasons) {
        // Another transaction on the same items is in flight: a concurrent writer.
        if failed(reason, "TransactionConflict") {
            return Ok(conflict);
        }
        match role {
            Role::Head if failed(reason, "ConditionalCheckFailed") => return Ok(conflict),
            Role::Used(id) if failed(reason, "ConditionalCheckFailed") => used.push(id.clone()),
            _ => {}
        }
    }
    if !used.is_empty() {
        return Ok(StoreError::IdsUsed { session_id: session_id.to_owned(), ids: used });
    }
    // Anything else (throttling, validation, a capacity problem) is the backend's failure.
    let codes: Vec<String> = reasons
        .iter()
        .enumerate()
        .filter(|(_, r)| r.code().is_some_and(|c| c != "None"))
        .map(|(i, r)| format!("item {i}: {} {}", r.code().unwrap_or("?"), r.message().unwrap_or("")))
        .collect();
    Err(if codes.is_empty() { "no cancellation reasons given".to_owned() } else { codes.join("; ") })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(code: &str) -> CancellationReason {
        CancellationReason::builder().code(code).build()
    }

    #[test]
    fn the_head_failing_is_a_conflict_even_when_ids_fail_too() {
        let roles = [Role::Head, Role::Used(UsedId::Turn("t".into())), Role::Data];
        let reasons = [reason("ConditionalCheckFailed"), reason("ConditionalCheckFailed"), reason("None")];
        let refused = refusal("s", 3, &roles, &reasons).unwrap();
        assert!(matches!(refused, StoreError::Conflict { expected: 3, .. }), "{refused:?}");
    }

    #[test]
    fn only_failed_ids_are_named() {
        let (t1, c1, t2) = (UsedId::Turn("t1".into()), UsedId::Call("c1".into()), UsedId::Turn("t2".into()));
        let roles = [Role::Head, Role::Used(t1), Role::Used(c1.clone()), Role::Used(t2.clone()), Role::Data];
        let reasons = [
            reason("None"),
            reason("None"),
            reason("ConditionalCheckFailed"),
            reason("ConditionalCheckFailed"),
            reason("None"),
        ];
        match refusal("s", 3, &roles, &reasons).unwrap() {
            StoreError::IdsUsed { ids, .. } => assert_eq!(ids, [c1, t2]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn other_reasons_are_backend_failures() {
        let roles = [Role::Head, Role::Data];
        let reasons = [reason("None"), reason("ValidationError")];
        let message = refusal("s", 3, &roles, &reasons).unwrap_err();
        assert!(message.contains("item 1: ValidationError"), "{message}");
        let reasons = [reason("None"), reason("TransactionConflict")];
        assert!(matches!(refusal("s", 3, &roles, &reasons), Ok(StoreError::Conflict { .. })));
    }
}

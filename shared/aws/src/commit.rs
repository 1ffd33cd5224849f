//! What one commit writes: one write request (DESIGN.md section 5), and what its refusal
//! means.
//!
//! A commit is its event pack `E#<first seq>`, put on the condition that no pack starts
//! there: two writers of one session continue the log from the same position, so only one
//! wins, and a stale writer's position is taken already. Most commits are that one
//! `PutItem` (a pack under 1 KB costs one write unit). The pack also carries the commit's
//! wake time in the due index's keys when no queued wake-up covers it
//! ([`Commit::wake_queued`]).
//!
//! Now and then a commit is a **checkpoint**: one `TransactWriteItems` of, in this order,
//! 1. the pack (same condition), marked with the session's message count;
//! 2. the head `H`: the snapshot as of this commit (without the declared agent config, which
//!    the creating checkpoint writes once as `I`), the listing attributes, and the version it
//!    stands for, conditioned on being newer than the head it replaces;
//! 3. one item per turn or call id first used since the last checkpoint (`T#`, `C#`), each
//!    conditioned on its absence: ids are kept for good from here on;
//! 4. one item of the message nodes recorded since the last checkpoint (`M#<last position>`);
//! 5. one item of the version entries written since (`L#<last seq>`: where each version of
//!    the state and agent config applies from, and the event that wrote it);
//! 6. the chunks of any payload too large for its item.
//!
//! A checkpoint is due when the session is created; after [`CHECKPOINT_COMMITS`] commits,
//! [`CHECKPOINT_BYTES`] of packs or [`CHECKPOINT_IDS`] new ids (they bound what a cold load
//! replays and what one checkpoint writes); and when a payload needs chunks. A commit that
//! uses an id first is refused if the id is among those of the packs since the checkpoint, or
//! (between checkpoints, read before the pack is written) among the id items.

use aws_sdk_dynamodb::types::{CancellationReason, Put, TransactWriteItem, Update};
use turnstone_engine::session::{Event, UsedId};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::store::{Commit, StoreError};

use crate::chunks;
use crate::error::{AwsError, build_error};
use crate::items::{
    self, AGENT, COUNT, CREATED_AT, CREATED_KEY, DECLARED, DUE_SHARD, FIRST, HEAD, Item, LIST_SHARD,
    MESSAGES, OWNER, PK, SESSIONS, SK, UPDATED_AT, VERSION, WAKE_AT, WAKE_KEY, WRITER,
};

/// The most items one `TransactWriteItems` takes.
pub(crate) const MAX_ITEMS: usize = 100;
/// The most bytes of items one `TransactWriteItems` takes (4 MB, with room for our estimate).
pub(crate) const MAX_BYTES: usize = 4_000_000;
/// The most bytes one item holds (400 KB).
pub(crate) const MAX_ITEM_BYTES: usize = 400 * 1024;

/// Commits after a checkpoint that make the next one due.
pub(crate) const CHECKPOINT_COMMITS: u32 = 32;
/// Bytes of packs after a checkpoint that make the next one due.
pub(crate) const CHECKPOINT_BYTES: usize = 64 * 1024;
/// Ids first used after a checkpoint that make the next one due. A transaction holds 100
/// items, and a checkpoint writes every id since the last one: this leaves room for a commit
/// that itself uses about 60 ids first (a worker proposing that many calls at once); one with
/// more is refused whole (`CommitTooLarge`).
pub(crate) const CHECKPOINT_IDS: usize = 32;

/// What the store knows of a session's log since its last checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tail {
    /// How many message nodes the `M#` items hold (every one recorded up to the checkpoint).
    pub stored_messages: u64,
    /// How many version entries the `L#` items hold (every one up to the checkpoint).
    pub stored_versions: u64,
    /// Turn and call ids first used since the checkpoint, not yet kept as items.
    pub pending: Vec<UsedId>,
    /// Commits and bytes of packs since the checkpoint.
    pub commits: u32,
    pub bytes: usize,
}

impl Tail {
    /// The tail after a pack of `events` (`bytes` long) written by an ordinary commit, or by a
    /// checkpoint that left the session with `(messages, versions)` nodes and version entries
    /// (all stored by it).
    pub fn after(&self, events: &[Event], bytes: usize, checkpoint: Option<(u64, u64)>) -> Tail {
        if let Some((messages, versions)) = checkpoint {
            return Tail { stored_messages: messages, stored_versions: versions, ..Tail::default() };
        }
        let mut pending = self.pending.clone();
        for id in UsedId::first_used_by(events) {
            if !pending.contains(&id) {
                pending.push(id);
            }
        }
        Tail { pending, commits: self.commits + 1, bytes: self.bytes + bytes, ..self.clone() }
    }
}

/// How a commit is written.
#[derive(Debug)]
pub(crate) enum Write {
    /// The pack alone, with the ids it uses first (checked against the id items before).
    Pack { pack: Item, first_used: Vec<UsedId> },
    /// A checkpoint.
    Checkpoint(Transaction),
}

/// A checkpoint as one transaction.
#[derive(Debug)]
pub(crate) struct Transaction {
    pub items: Vec<TransactWriteItem>,
    pub roles: Vec<Role>,
}

/// What an item of the transaction is, to read the cancellation reasons (same order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    Pack,
    Head,
    Used(UsedId),
    Data,
    /// The owner's session count, raised by a creating commit within this limit.
    Owner {
        owner: String,
        limit: Option<u64>,
    },
}

/// A commit, laid out.
#[derive(Debug)]
pub(crate) struct Planned {
    pub write: Write,
    /// The session's version after it.
    pub new_version: u64,
    /// The tail after it.
    pub tail: Tail,
    /// About how many bytes of items it writes.
    pub bytes: usize,
}

/// Lays out `commit` of `session_id` onto `table`, made against version `expected` whose tail is `tail`,
/// at `now`, by `writer` (a token unique to this attempt: a retried request that finds its
/// own pack knows it won).
pub(crate) fn plan(
    table: &str,
    session_id: &str,
    expected: u64,
    commit: &Commit<'_>,
    tail: &Tail,
    now: Timestamp,
    writer: &str,
) -> Result<Planned, AwsError> {
    commit
        .check(session_id)
        .map_err(|message| AwsError::InvalidCommit { session_id: session_id.to_owned(), message })?;
    let serialize = |source| AwsError::Serialize { session_id: session_id.to_owned(), source };
    let session = commit.session;
    let new_version = expected + 1;
    let first = commit.first_seq();

    let sk = items::event_key(first);
    let mut pack = items::key(session_id, sk.as_str());
    pack.insert(FIRST.to_owned(), items::n(first));
    pack.insert(COUNT.to_owned(), items::n(commit.events.len()));
    pack.insert(VERSION.to_owned(), items::n(new_version));
    pack.insert(UPDATED_AT.to_owned(), items::n(now.0));
    pack.insert(WRITER.to_owned(), items::s(writer));
    if let Some(wake_at) = commit.wake_at.filter(|_| !commit.wake_queued) {
        pack.insert(WAKE_AT.to_owned(), items::n(wake_at.0));
        pack.insert(DUE_SHARD.to_owned(), items::s(items::due_shard(session_id)));
        pack.insert(WAKE_KEY.to_owned(), items::s(items::timed_key(wake_at, session_id)));
    }
    let body = serde_json::to_string(commit.events).map_err(serialize)?;
    let pack_bytes = body.len();
    let mut chunk_items = chunks::lay_out(session_id, &sk, body, None, &mut pack);

    let first_used = first_used(commit);
    let ordinary = tail.after(commit.events, pack_bytes, None);
    let checkpoint = expected == 0
        || !chunk_items.is_empty()
        || ordinary.commits >= CHECKPOINT_COMMITS
        || ordinary.bytes >= CHECKPOINT_BYTES
        || ordinary.pending.len() >= CHECKPOINT_IDS;
    if !checkpoint {
        let bytes = items::item_size(&pack);
        return Ok(Planned { write: Write::Pack { pack, first_used }, new_version, tail: ordinary, bytes });
    }

    let messages = session.tree().len() as u64;
    pack.insert(MESSAGES.to_owned(), items::n(messages));
    let mut head = items::key(session_id, HEAD);
    head.insert(VERSION.to_owned(), items::n(new_version));
    head.insert(MESSAGES.to_owned(), items::n(messages));
    head.insert(AGENT.to_owned(), items::s(session.agent_id()));
    // An index key may not be empty: an empty owner is not indexed (and lists as none).
    if let Some(owner) = session.init().and_then(|i| i.identity.id.as_deref()).filter(|o| !o.is_empty()) {
        head.insert(OWNER.to_owned(), items::s(owner));
    }
    head.insert(CREATED_AT.to_owned(), items::n(session.created_at().0));
    head.insert(UPDATED_AT.to_owned(), items::n(now.0));
    head.insert(CREATED_KEY.to_owned(), items::s(items::timed_key(session.created_at(), session_id)));
    head.insert(LIST_SHARD.to_owned(), items::s(items::list_shard(session_id)));
    // The snapshot leaves the declared agent config out (the bulk of an agent, and it never
    // changes): the creating commit writes it once as its own item.
    let snapshot = serde_json::to_string(session).map_err(serialize)?;
    session.wrote_snapshot(snapshot.len());
    chunk_items.extend(chunks::lay_out(session_id, HEAD, snapshot, Some(new_version), &mut head));

    let mut puts: Vec<(Item, Role)> = vec![(pack, Role::Pack), (head, Role::Head)];
    if expected == 0
        && let Some(declared) = session.declared()
    {
        let mut item = items::key(session_id, DECLARED);
        let body = serde_json::to_string(declared).map_err(serialize)?;
        chunk_items.extend(chunks::lay_out(session_id, DECLARED, body, None, &mut item));
        puts.push((item, Role::Data));
    }
    for id in &ordinary.pending {
        puts.push((items::key(session_id, items::used_key(id)), Role::Used(id.clone())));
    }
    if messages > tail.stored_messages {
        let nodes = session.tree().nodes_from(tail.stored_messages as usize);
        let sk = items::messages_key(messages - 1);
        let batch = batch_item(session_id, &sk, tail.stored_messages, &nodes, &mut chunk_items)?;
        puts.push((batch, Role::Data));
    }
    let versions = session.version_entry_count() as u64;
    if versions > tail.stored_versions {
        let entries = session.newest_version_entries((versions - tail.stored_versions) as usize);
        let sk = items::versions_key(entries.last().map_or(0, |e| e.seq));
        let batch = batch_item(session_id, &sk, tail.stored_versions, &entries, &mut chunk_items)?;
        puts.push((batch, Role::Data));
    }
    puts.extend(chunk_items.into_iter().map(|chunk| (chunk, Role::Data)));

    if let Some(owner) = commit.counted_owner(expected) {
        let limit = commit.sessions_per_owner;
        puts.push((items::owner_count_key(owner), Role::Owner { owner: owner.to_owned(), limit }));
    }
    let bytes = fits(session_id, &puts)?;
    let mut items = Vec::with_capacity(puts.len());
    let mut roles = Vec::with_capacity(puts.len());
    for (item, role) in puts {
        if let Role::Owner { limit, .. } = &role {
            // Counted in the creating transaction: exact, however many hosts create at once.
            let update = Update::builder()
                .table_name(table)
                .set_key(Some(item))
                .update_expression("ADD #n :one")
                .expression_attribute_names("#n", SESSIONS)
                .expression_attribute_values(":one", items::n(1));
            let update = match limit {
                Some(limit) => update
                    .condition_expression("attribute_not_exists(#n) OR #n < :limit")
                    .expression_attribute_values(":limit", items::n(*limit)),
                None => update,
            };
            let update = update.build().map_err(build_error("TransactWriteItems"))?;
            items.push(TransactWriteItem::builder().update(update).build());
            roles.push(role);
            continue;
        }
        let put = Put::builder().table_name(table).set_item(Some(item));
        let put = match &role {
            Role::Pack | Role::Used(_) => {
                put.condition_expression("attribute_not_exists(#pk)").expression_attribute_names("#pk", PK)
            }
            Role::Head => put
                .condition_expression("attribute_not_exists(#pk) OR #version < :new")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_names("#version", VERSION)
                .expression_attribute_values(":new", items::n(new_version)),
            Role::Data | Role::Owner { .. } => put,
        };
        let put = put.build().map_err(build_error("TransactWriteItems"))?;
        items.push(TransactWriteItem::builder().put(put).build());
        roles.push(role);
    }
    let tail = Tail { stored_messages: messages, stored_versions: versions, ..Tail::default() };
    Ok(Planned { write: Write::Checkpoint(Transaction { items, roles }), new_version, tail, bytes })
}

/// An immutable item `sk` of `records` (message nodes, version entries) that continue the
/// session's stored ones at position `first`, its chunks (if it needs any) added to `chunks`.
fn batch_item<T: serde::Serialize>(
    session_id: &str,
    sk: &str,
    first: u64,
    records: &[T],
    chunks: &mut Vec<Item>,
) -> Result<Item, AwsError> {
    let mut batch = items::key(session_id, sk);
    batch.insert(FIRST.to_owned(), items::n(first));
    batch.insert(COUNT.to_owned(), items::n(records.len()));
    let body = serde_json::to_string(records)
        .map_err(|source| AwsError::Serialize { session_id: session_id.to_owned(), source })?;
    chunks.extend(chunks::lay_out(session_id, sk, body, None, &mut batch));
    Ok(batch)
}

/// The ids `commit` uses first, each once (a queued turn that starts in the same commit names
/// its id twice; one transaction may not write an item twice).
pub(crate) fn first_used(commit: &Commit<'_>) -> Vec<UsedId> {
    let mut seen = std::collections::HashSet::new();
    commit.first_used().into_iter().filter(|id| seen.insert(id.clone())).collect()
}

/// Checks the transaction's limits; returns its size.
fn fits(session_id: &str, puts: &[(Item, Role)]) -> Result<usize, AwsError> {
    let too_large = |reason: String| AwsError::CommitTooLarge { session_id: session_id.to_owned(), reason };
    if puts.len() > MAX_ITEMS {
        let used = puts.iter().filter(|(_, role)| matches!(role, Role::Used(_))).count();
        return Err(too_large(format!(
            "{} items (the pack, the head, {used} used ids, messages and chunks), at most {MAX_ITEMS}",
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
/// What a cancelled checkpoint means for the commit. DynamoDB gives one reason per item, in
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
    let mut full = None;
    for (role, reason) in roles.iter().zip(reasons) {
        // Another transaction on the same items is in flight: a concurrent writer.
        if failed(reason, "TransactionConflict") {
            return Ok(conflict);
        }
        match role {
            Role::Pack | Role::Head if failed(reason, "ConditionalCheckFailed") => return Ok(conflict),
            Role::Used(id) if failed(reason, "ConditionalCheckFailed") => used.push(id.clone()),
            Role::Owner { owner, limit: Some(limit) } if failed(reason, "ConditionalCheckFailed") => {
                full = Some(StoreError::OwnerFull { owner: owner.clone(), limit: *limit });
            }
            _ => {}
        }
    }
    if let Some(full) = full {
        return Ok(full);
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
    fn the_pack_failing_is_a_conflict_even_when_ids_fail_too() {
        let roles = [Role::Pack, Role::Head, Role::Used(UsedId::Turn("t".into())), Role::Data];
        let reasons = [
            reason("ConditionalCheckFailed"),
            reason("None"),
            reason("ConditionalCheckFailed"),
            reason("None"),
        ];
        let refused = refusal("s", 3, &roles, &reasons).unwrap();
        assert!(matches!(refused, StoreError::Conflict { expected: 3, .. }), "{refused:?}");
    }

    #[test]
    fn only_failed_ids_are_named() {
        let (t1, c1, t2) = (UsedId::Turn("t1".into()), UsedId::Call("c1".into()), UsedId::Turn("t2".into()));
        let roles = [Role::Pack, Role::Head, Role::Used(t1), Role::Used(c1.clone()), Role::Used(t2.clone())];
        let reasons = [
            reason("None"),
            reason("None"),
            reason("None"),
            reason("ConditionalCheckFailed"),
            reason("ConditionalCheckFailed"),
        ];
        match refusal("s", 3, &roles, &reasons).unwrap() {
            StoreError::IdsUsed { ids, .. } => assert_eq!(ids, [c1, t2]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn other_reasons_are_backend_failures() {
        let roles = [Role::Pack, Role::Data];
        let reasons = [reason("None"), reason("ValidationError")];
        let message = refusal("s", 3, &roles, &reasons).unwrap_err();
        assert!(message.contains("item 1: ValidationError"), "{message}");
        let reasons = [reason("None"), reason("TransactionConflict")];
        assert!(matches!(refusal("s", 3, &roles, &reasons), Ok(StoreError::Conflict { .. })));
    }

    #[test]
    fn a_tail_collects_new_ids_until_a_checkpoint_resets_it() {
        let started = |id: &str| Event::TurnAliased { alias: id.into(), turn_id: "t0".into() };
        let tail = Tail { stored_messages: 2, ..Tail::default() };
        let one = tail.after(&[started("a"), started("a")], 100, None);
        assert_eq!(one.pending, [UsedId::Turn("a".into())]);
        assert_eq!((one.commits, one.bytes, one.stored_messages), (1, 100, 2));
        let two = one.after(&[started("b")], 50, None);
        assert_eq!(two.pending.len(), 2);
        assert_eq!((two.commits, two.bytes), (2, 150));
        let reset = two.after(&[started("c")], 10, Some((4, 2)));
        assert_eq!(reset, Tail { stored_messages: 4, stored_versions: 2, ..Tail::default() });
    }
}

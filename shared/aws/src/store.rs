//! The DynamoDB store: the `Store` port on one table (DESIGN.md section 5). The layout is in
//! [`crate::items`], what a commit writes in [`crate::commit`], large payloads in
//! [`crate::chunks`], the indexes in [`crate::table`].
//!
//! A session is its last checkpoint (the head, and the message items) and the event packs
//! after it, replayed. A store remembers the sessions it last read or wrote (at most 4,096, and
//! [`DynamoStore::with_cache_bytes`] of them by `Session::approx_bytes`, least recently used
//! first out): loading one of those again reads only the packs written since, one query; a
//! commit against the version it remembers reads nothing first.
//!
//! Reads that must see the latest commit (the head, messages, events, used ids, packs) are
//! strongly consistent; index queries (listing, due work) cannot be and are not.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{DeleteRequest, Put, PutRequest, TransactWriteItem, Update, WriteRequest};
use serde::de::DeserializeOwned;
use turnstone_engine::protocol::TreeNode;
use turnstone_engine::session::{Event, Session, UsedId, VersionEntry};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::memo::{Memo, session_budget};
use turnstone_runtime::store::{
    Commit, ListingCursor, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};

use crate::chunks::{self, Body, JoinError};
use crate::commit::{self, Tail, Write};
use crate::error::{AwsError, describe};
use crate::items::{
    self, AGENT, COUNT, CREATED_AT, CREATED_KEY, DECLARED, DISPOSED, DUE_SHARD, FIRST, HEAD, Item,
    LIST_SHARD, LISTED, MESSAGES, OWNER, PK, SESSIONS, SK, UPDATED_AT, VERSION, WAKE_AT, WAKE_KEY, WRITER,
};
use crate::table;

/// How often a load reads the head again when its chunks belong to a newer commit.
const HEAD_ATTEMPTS: u32 = 5;

/// The highest sort key of a kind of numbered item (`E#`, `M#`): 20 nines sort after every
/// zero-padded `u64`.
const LAST_NUMBER: &str = "99999999999999999999";

/// The `Store` port on a DynamoDB table. Cheap to clone: clones share the SDK client and
/// what the store remembers.
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    clock: Arc<dyn Clock>,
    tokens: Arc<Tokens>,
    cache: Arc<Memo<String, Cached>>,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore").field("table", &self.table).finish_non_exhaustive()
    }
}

/// A session as this store last read or wrote it: its state, version, and log since the
/// last checkpoint.
#[derive(Debug, Clone)]
struct Cached {
    session: Session,
    version: u64,
    tail: Tail,
}

/// What a remembered session weighs.
fn weigh(cached: &Cached) -> usize {
    cached.session.approx_bytes()
}

/// How a query reads: in key order or backwards; strongly or eventually consistent (half the
/// price, and may miss what was written a moment ago).
#[derive(Debug, Clone, Copy)]
struct Read {
    forward: bool,
    consistent: bool,
}

impl Read {
    /// In order, seeing every write that returned before it began.
    const LATEST: Read = Read { forward: true, consistent: true };
    /// Backwards, eventually consistent.
    const NEWEST_SOON: Read = Read { forward: false, consistent: false };
}

/// A session's head as read.
struct Head {
    session: Session,
    /// The version its snapshot stands for.
    version: u64,
    /// How many message nodes the message items hold.
    messages: u64,
}

impl DynamoStore {
    /// The store on `table` through `client`; the system clock stamps `updated_at`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self::with_clock(client, table, Arc::new(SystemClock))
    }

    /// The store on `table`; `clock` stamps `updated_at`.
    pub fn with_clock(client: Client, table: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        DynamoStore {
            client,
            table: table.into(),
            clock,
            tokens: Arc::new(Tokens::default()),
            cache: Arc::new(Memo::weighed(session_budget(None), weigh)),
        }
    }

    /// The same store, remembering at most `bytes` of sessions (by `Session::approx_bytes`).
    pub fn with_cache_bytes(self, bytes: usize) -> Self {
        DynamoStore { cache: Arc::new(Memo::weighed(bytes, weigh)), ..self }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table with the store's key schema and indexes, unless it exists, and waits
    /// until it is active (see [`crate::table`]).
    pub async fn create_table(&self) -> Result<(), AwsError> {
        table::create_table(&self.client, &self.table).await
    }

    fn failed(&self, operation: &'static str, session_id: &str, message: String) -> StoreError {
        AwsError::Session { operation, session_id: session_id.to_owned(), table: self.table.clone(), message }
            .into()
    }

    fn table_failed(&self, operation: &'static str, message: String) -> StoreError {
        AwsError::Table { operation, table: self.table.clone(), message }.into()
    }

    fn cached(&self, session_id: &str) -> Option<Cached> {
        self.cache.get(session_id)
    }

    fn remember(&self, session_id: &str, cached: Cached) {
        self.cache.update(session_id.to_owned(), |known| match known {
            // Never step back: a slower reader may finish after a newer commit.
            Some(known) if known.version > cached.version => known.clone(),
            _ => cached,
        });
    }

    fn forget(&self, session_id: &str) {
        self.cache.remove(session_id);
    }

    /// The session as it stands now, or None if it does not exist (or was disposed): what this store remembers
    /// and the packs written since (one query), or else the head, the message items and the
    /// packs after the head.
    async fn current(&self, session_id: &str) -> Result<Option<Cached>, StoreError> {
        let known = match self.cached(session_id) {
            Some(known) => known,
            None => {
                let head = match self.read_checkpoint(session_id, false).await {
                    Ok(Some(head)) => Some(head),
                    // An eventually consistent read (half the price) may miss a checkpoint written a
                    // moment ago, or part of it: then read it consistently.
                    _ => self.read_checkpoint(session_id, true).await?,
                };
                let Some(head) = head else { return Ok(None) };
                let stored_versions = head.session.version_entry_count() as u64;
                let tail = Tail { stored_messages: head.messages, stored_versions, ..Tail::default() };
                Cached { session: head.session, version: head.version, tail }
            }
        };
        let packs = self.packs_after(session_id, known.session.events_applied()).await?;
        if packs.iter().any(is_husk) {
            self.forget(session_id);
            return Ok(None);
        }
        let current = self.replay(session_id, known, &packs).await?;
        self.remember(session_id, current.clone());
        Ok(Some(current))
    }

    /// `known` with `packs` (the packs right after it, in order) applied.
    async fn replay(&self, session_id: &str, known: Cached, packs: &[Item]) -> Result<Cached, StoreError> {
        let Cached { mut session, mut version, mut tail } = known;
        let bodies: Vec<Vec<Event>> = self.payloads(session_id, packs).await?;
        for (pack, events) in packs.iter().zip(bodies) {
            let first =
                items::get_u64(pack, FIRST).ok_or_else(|| corrupt(session_id, "event pack without first"))?;
            if first != session.events_applied() + 1 {
                return Err(corrupt(
                    session_id,
                    format!("the pack at {first} does not follow event {}", session.events_applied()),
                ));
            }
            if items::get_u64(pack, COUNT) != Some(events.len() as u64) || events.is_empty() {
                return Err(corrupt(
                    session_id,
                    format!("event pack {first} holds another count than it says"),
                ));
            }
            if items::get_u64(pack, VERSION) != Some(version + 1) {
                return Err(corrupt(
                    session_id,
                    format!("event pack {first} does not follow version {version}"),
                ));
            }
            version += 1;
            for event in &events {
                session.apply(event);
            }
            let checkpoint =
                items::get_u64(pack, MESSAGES).map(|m| (m, session.version_entry_count() as u64));
            tail = tail.after(&events, pack_bytes(pack), checkpoint);
        }
        Ok(Cached { session, version, tail })
    }

    /// Reads the last checkpoint: the head, the declared agent config and the message items in
    /// one strongly consistent query (their sort keys are adjacent: `H`, `I`, `M#...`), their
    /// chunks if they have any; the session of the snapshot with its messages.
    async fn read_checkpoint(&self, session_id: &str, consistent: bool) -> Result<Option<Head>, StoreError> {
        let last_message = format!("M#{LAST_NUMBER}");
        for _ in 0..HEAD_ATTEMPTS {
            let mut found = self.query_all(session_id, (HEAD, &last_message), consistent).await?;
            let messages_at =
                found.iter().position(|i| items::get_s(i, SK).is_some_and(|sk| sk.starts_with("M#")));
            let message_items = messages_at.map(|at| found.split_off(at)).unwrap_or_default();
            let versions_at =
                found.iter().position(|i| items::get_s(i, SK).is_some_and(|sk| sk.starts_with("L#")));
            let version_items = versions_at.map(|at| found.split_off(at)).unwrap_or_default();
            let declared = found
                .iter()
                .position(|i| items::get_s(i, SK) == Some(DECLARED))
                .map(|at| found.swap_remove(at));
            let Some(item) = found.into_iter().find(|i| items::get_s(i, SK) == Some(HEAD)) else {
                return Ok(None);
            };
            let version =
                items::get_u64(&item, VERSION).ok_or_else(|| corrupt(session_id, "head version"))?;
            let messages =
                items::get_u64(&item, MESSAGES).ok_or_else(|| corrupt(session_id, "head message count"))?;
            let bytes: Cow<'_, [u8]> = match chunks::body(&item) {
                Some(Body::Inline(body)) => Cow::Borrowed(body.as_bytes()),
                Some(Body::Chunked(count)) => {
                    let fetched = self.chunks(session_id, HEAD, count).await?;
                    match chunks::join(HEAD, count, Some(version), &fetched) {
                        Ok(bytes) => Cow::Owned(bytes),
                        // A checkpoint rewrote the chunks after the head was read: read again.
                        Err(JoinError::OtherVersion { .. }) => continue,
                        Err(err) => return Err(corrupt(session_id, format!("head snapshot: {err}"))),
                    }
                }
                None => return Err(corrupt(session_id, "the head holds no snapshot")),
            };
            let mut snapshot: Session = parse(session_id, &bytes, || "head snapshot".to_owned())?;
            if *snapshot.id() != *session_id {
                return Err(corrupt(session_id, format!("the head holds session {:?}", snapshot.id())));
            }
            if let Some(declared) = declared {
                // One payload per item given.
                snapshot.restore_declared(self.payloads(session_id, &[declared]).await?.pop());
            }
            snapshot.restore_messages(self.message_nodes(session_id, &message_items, messages).await?);
            let entries = self.version_entries(session_id, &version_items, snapshot.events_applied()).await?;
            snapshot.restore_versions(entries).map_err(|e| corrupt(session_id, e))?;
            return Ok(Some(Head { session: snapshot, version, messages }));
        }
        Err(AwsError::HeadKeptChanging { session_id: session_id.to_owned(), attempts: HEAD_ATTEMPTS }.into())
    }

    /// The chunk items of the payload of item `owner`, by sort key.
    async fn chunks(
        &self,
        session_id: &str,
        owner: &str,
        count: usize,
    ) -> Result<HashMap<String, Item>, StoreError> {
        let keys = chunks::keys(owner, count).map(|sk| items::key(session_id, sk)).collect();
        self.get_by_keys(session_id, keys).await
    }

    /// Items of a session by key (consistent), by sort key.
    async fn get_by_keys(
        &self,
        session_id: &str,
        keys: Vec<Item>,
    ) -> Result<HashMap<String, Item>, StoreError> {
        let found = crate::batch::get(&self.client, &self.table, keys, &[], true)
            .await
            .map_err(|message| self.failed("BatchGetItem", session_id, message))?;
        Ok(found.into_iter().filter_map(|item| Some((items::get_s(&item, SK)?.to_owned(), item))).collect())
    }

    /// One page of a session's items with sort keys from `from` to `to` (inclusive).
    async fn query_page(
        &self,
        session_id: &str,
        (from, to): (&str, &str),
        read: Read,
        limit: Option<usize>,
        start: Option<Item>,
    ) -> Result<(Vec<Item>, Option<Item>), StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("#pk = :pk AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#sk", SK)
            .expression_attribute_values(":pk", items::s(items::partition(session_id)))
            .expression_attribute_values(":from", items::s(from))
            .expression_attribute_values(":to", items::s(to))
            .scan_index_forward(read.forward)
            .consistent_read(read.consistent)
            .set_limit(limit.map(|l| i32::try_from(l).unwrap_or(i32::MAX)))
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|err| self.failed("Query", session_id, describe(&err)))?;
        Ok((out.items.unwrap_or_default(), out.last_evaluated_key.filter(|k| !k.is_empty())))
    }

    /// The payloads of `found` (each inline or chunked), parsed; chunks are fetched in one go.
    async fn payloads<T: DeserializeOwned>(
        &self,
        session_id: &str,
        found: &[Item],
    ) -> Result<Vec<T>, StoreError> {
        let mut keys = Vec::new();
        for item in found {
            if let Some(Body::Chunked(count)) = chunks::body(item) {
                let owner = items::get_s(item, SK).unwrap_or_default();
                keys.extend(chunks::keys(owner, count).map(|sk| items::key(session_id, sk)));
            }
        }
        let fetched =
            if keys.is_empty() { HashMap::new() } else { self.get_by_keys(session_id, keys).await? };
        found
            .iter()
            .map(|item| {
                let owner = items::get_s(item, SK).unwrap_or_default();
                match chunks::body(item) {
                    Some(Body::Inline(body)) => parse(session_id, body.as_bytes(), || owner.to_owned()),
                    Some(Body::Chunked(count)) => {
                        let bytes = chunks::join(owner, count, None, &fetched)
                            .map_err(|err| corrupt(session_id, format!("{owner}: {err}")))?;
                        parse(session_id, &bytes, || owner.to_owned())
                    }
                    None => Err(corrupt(session_id, format!("{owner} holds no body"))),
                }
            })
            .collect()
    }

    /// The first `count` message nodes, from the message items `found` (in key order; items a
    /// later checkpoint wrote may follow, and are left out).
    async fn message_nodes(
        &self,
        session_id: &str,
        found: &[Item],
        count: u64,
    ) -> Result<Vec<TreeNode>, StoreError> {
        let wanted: Vec<Item> = found
            .iter()
            .take_while(|item| items::get_u64(item, FIRST).is_some_and(|first| first < count))
            .cloned()
            .collect();
        let nodes: Vec<TreeNode> = self.batches(session_id, &wanted, "message").await?;
        if nodes.len() as u64 != count {
            return Err(corrupt(session_id, format!("{} of {count} messages found", nodes.len())));
        }
        Ok(nodes)
    }

    /// The version entries of the versions written up to event `through`, from the entry
    /// items `found` (in key order; items a later checkpoint wrote may follow, and are left
    /// out).
    async fn version_entries(
        &self,
        session_id: &str,
        found: &[Item],
        through: u64,
    ) -> Result<Vec<VersionEntry>, StoreError> {
        let mut entries: Vec<VersionEntry> = self.batches(session_id, found, "version").await?;
        entries.retain(|e| e.seq <= through);
        Ok(entries)
    }

    /// The records of the batch items `found` (`commit::batch_item`: message nodes, version
    /// entries), joined in order; each must continue where the one before it ended.
    async fn batches<T: DeserializeOwned>(
        &self,
        session_id: &str,
        found: &[Item],
        what: &str,
    ) -> Result<Vec<T>, StoreError> {
        let batches: Vec<Vec<T>> = self.payloads(session_id, found).await?;
        let mut records = Vec::new();
        for (item, batch) in found.iter().zip(batches) {
            let first = items::get_u64(item, FIRST).unwrap_or_default();
            if first != records.len() as u64 || items::get_u64(item, COUNT) != Some(batch.len() as u64) {
                return Err(corrupt(
                    session_id,
                    format!("the {what} item at {first} does not fit its neighbours"),
                ));
            }
            records.extend(batch);
        }
        Ok(records)
    }

    /// Every item of a session with sort keys from `from` to `to` (inclusive), in order.
    async fn query_all(
        &self,
        session_id: &str,
        range: (&str, &str),
        consistent: bool,
    ) -> Result<Vec<Item>, StoreError> {
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let read = Read { forward: true, consistent };
            let (page, next) = self.query_page(session_id, range, read, None, start).await?;
            found.extend(page);
            match next {
                Some(key) => start = Some(key),
                None => return Ok(found),
            }
        }
    }

    /// The packs after log position `after`, in order.
    async fn packs_after(&self, session_id: &str, after: u64) -> Result<Vec<Item>, StoreError> {
        let range = (items::event_key(after + 1), format!("E#{LAST_NUMBER}"));
        self.query_all(session_id, (&range.0, &range.1), true).await
    }

    /// The session at version `expected`, remembered or read; None if it is not at that
    /// version.
    async fn at_version(&self, session_id: &str, expected: u64) -> Result<Option<Cached>, StoreError> {
        let known = match self.cached(session_id) {
            Some(known) if known.version == expected => Some(known),
            _ => self.current(session_id).await?,
        };
        Ok(known.filter(|k| k.version == expected))
    }

    /// Commits `commit`: one `PutItem` of its pack, or one checkpoint (see [`crate::commit`]).
    async fn write(&self, session_id: &str, expected: u64, commit: &Commit<'_>) -> Result<u64, StoreError> {
        let conflict = || StoreError::Conflict { session_id: session_id.to_owned(), expected };
        // The commit must continue the log where the version it names ends.
        let (log_length, tail) = if expected == 0 {
            (0, Tail::default())
        } else {
            match self.at_version(session_id, expected).await? {
                Some(known) => (known.session.events_applied(), known.tail),
                None => return Err(conflict()),
            }
        };
        if commit.first_seq() != log_length + 1 {
            return Err(conflict());
        }
        // Ids the packs since the checkpoint used are known here; older ones are items.
        let reused: Vec<UsedId> =
            commit::first_used(commit).into_iter().filter(|id| tail.pending.contains(id)).collect();
        if !reused.is_empty() {
            return Err(StoreError::IdsUsed { session_id: session_id.to_owned(), ids: reused });
        }
        let writer = self.tokens.next(session_id, expected);
        let planned =
            commit::plan(&self.table, session_id, expected, commit, &tail, self.clock.now(), &writer)?;
        match planned.write {
            Write::Pack { pack, first_used } => {
                let used = self.stored_ids(session_id, &first_used).await?;
                if !used.is_empty() {
                    return Err(StoreError::IdsUsed { session_id: session_id.to_owned(), ids: used });
                }
                let sk = items::event_key(log_length + 1);
                self.put_pack(session_id, expected, pack, &sk, &writer).await?;
            }
            Write::Checkpoint(tx) => {
                // The token makes the SDK's own retries of this request idempotent (DynamoDB
                // answers a repeated token within 10 minutes with the first outcome), so a retry
                // after a lost response is not refused as a conflict with itself. moto ignores it.
                let result = self
                    .client
                    .transact_write_items()
                    .set_transact_items(Some(tx.items))
                    .client_request_token(writer)
                    .send()
                    .await;
                const OPERATION: &str = "TransactWriteItems (checkpoint)";
                if let Err(err) = result {
                    let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
                        err.as_service_error()
                    else {
                        return Err(self.failed(OPERATION, session_id, describe(&err)));
                    };
                    return Err(
                        match commit::refusal(
                            session_id,
                            expected,
                            &tx.roles,
                            cancelled.cancellation_reasons(),
                        ) {
                            Ok(refused) => refused,
                            Err(reasons) => {
                                self.failed(OPERATION, session_id, format!("cancelled: {reasons}"))
                            }
                        },
                    );
                }
            }
        }
        tracing::debug!(session_id, version = planned.new_version, bytes = planned.bytes, "committed");
        let cached =
            Cached { session: commit.session.clone(), version: planned.new_version, tail: planned.tail };
        self.remember(session_id, cached);
        Ok(planned.new_version)
    }

    /// Puts a commit's pack unless one starts there. A request the SDK retried after a lost
    /// answer may find its own pack: the writer token tells.
    async fn put_pack(
        &self,
        session_id: &str,
        expected: u64,
        pack: Item,
        sk: &str,
        writer: &str,
    ) -> Result<(), StoreError> {
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(pack))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .send()
            .await;
        const OPERATION: &str = "PutItem (commit)";
        let err = match result {
            Ok(_) => return Ok(()),
            Err(err) => err,
        };
        if !matches!(err.as_service_error(), Some(PutItemError::ConditionalCheckFailedException(_))) {
            return Err(self.failed(OPERATION, session_id, describe(&err)));
        }
        let found =
            crate::batch::get(&self.client, &self.table, vec![items::key(session_id, sk)], &[WRITER], true)
                .await
                .map_err(|message| self.failed("BatchGetItem (pack)", session_id, message))?;
        if found.iter().any(|item| items::get_s(item, WRITER) == Some(writer)) {
            return Ok(());
        }
        Err(StoreError::Conflict { session_id: session_id.to_owned(), expected })
    }

    /// Which of `ids` the id items hold.
    async fn stored_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys = ids.iter().map(|id| items::key(session_id, items::used_key(id))).collect();
        let found = crate::batch::get(&self.client, &self.table, keys, &[SK], true)
            .await
            .map_err(|message| self.failed("BatchGetItem (used ids)", session_id, message))?;
        let found: HashSet<UsedId> =
            found.iter().filter_map(|item| items::get_s(item, SK).and_then(items::used_id_of)).collect();
        Ok(ids.iter().filter(|id| found.contains(id)).cloned().collect())
    }

    /// Event packs from `after + 1` on (at least `limit` events, or all), and the pack before
    /// them when it may hold events after `after`.
    async fn event_packs(&self, session_id: &str, after: u64, limit: usize) -> Result<Vec<Item>, StoreError> {
        let range_after = (items::event_key(after.saturating_add(1)), format!("E#{LAST_NUMBER}"));
        let mut packs: Vec<Item> = Vec::new();
        let mut events = 0usize;
        let mut start = None;
        loop {
            let range = (range_after.0.as_str(), range_after.1.as_str());
            // Each pack holds at least one event: `limit` packs are always enough.
            let (page, next) = self.query_page(session_id, range, Read::LATEST, Some(limit), start).await?;
            events += page.iter().map(|p| items::get_u64(p, COUNT).unwrap_or(1) as usize).sum::<usize>();
            packs.extend(page);
            match next {
                Some(key) if events < limit => start = Some(key),
                _ => break,
            }
        }
        // A pack starting at or before `after` may straddle it: read the last one that does,
        // unless the packs found start right after `after`.
        let starts_right_after = packs.first().and_then(|p| items::get_u64(p, FIRST)) == Some(after + 1);
        if after > 0 && !starts_right_after {
            let range = (items::event_key(0), items::event_key(after));
            let read = Read { forward: false, consistent: true };
            let (page, _) = self.query_page(session_id, (&range.0, &range.1), read, Some(1), None).await?;
            if let Some(pack) = page.into_iter().next() {
                let first = items::get_u64(&pack, FIRST).unwrap_or(0);
                let count = items::get_u64(&pack, COUNT).unwrap_or(0);
                if first + count > after + 1 {
                    packs.insert(0, pack);
                }
            }
        }
        Ok(packs)
    }
}

/// Tokens for `ClientRequestToken`: unique per commit attempt, at most 36 characters.
#[derive(Default)]
struct Tokens {
    /// Keys chosen at random per process (the standard library's hasher seeds).
    seed: RandomState,
    counter: AtomicU64,
}

impl Tokens {
    fn next(&self, session_id: &str, expected: u64) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let half = |salt: u8| self.seed.hash_one((salt, session_id, expected, n));
        format!("{:016x}{:016x}", half(1), half(2))
    }
}

fn corrupt(session_id: &str, message: impl Into<String>) -> StoreError {
    StoreError::Corrupt { session_id: session_id.to_owned(), message: message.into() }
}

/// Parses stored JSON; bad JSON is `Corrupt`, naming the session and the item.
fn parse<T: DeserializeOwned>(
    session_id: &str,
    bytes: &[u8],
    what: impl FnOnce() -> String,
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(session_id, format!("{}: {e}", what())))
}

impl DynamoStore {
    /// The newest `want` sessions of one listing index partition (created strictly before
    /// `after`, an index range key), filtered to `agent`: `(created_key, session)`.
    async fn listed(
        &self,
        index: &str,
        hash_name: &str,
        hash_value: &str,
        after: Option<&str>,
        agent: Option<&str>,
        want: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut sessions = Vec::with_capacity(want);
        let mut start = None;
        loop {
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(index)
                .expression_attribute_names("#h", hash_name)
                .expression_attribute_values(":h", items::s(hash_value))
                .scan_index_forward(false)
                .limit(i32::try_from(want).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start);
            query = match after {
                Some(after) => query
                    .key_condition_expression("#h = :h AND #r < :after")
                    .expression_attribute_names("#r", CREATED_KEY)
                    .expression_attribute_values(":after", items::s(after)),
                None => query.key_condition_expression("#h = :h"),
            };
            if let Some(agent) = agent {
                query = query
                    .filter_expression("#agent = :agent")
                    .expression_attribute_names("#agent", AGENT)
                    .expression_attribute_values(":agent", items::s(agent));
            }
            let out = query
                .send()
                .await
                .map_err(|err| self.table_failed("Query (list sessions)", describe(&err)))?;
            for item in out.items.unwrap_or_default() {
                let (Some(session), Some(key)) =
                    (items::get_s(&item, PK).and_then(items::session_of), items::get_s(&item, CREATED_KEY))
                else {
                    continue;
                };
                sessions.push((key.to_owned(), session.to_owned()));
            }
            match out.last_evaluated_key.filter(|k| !k.is_empty()) {
                Some(key) if sessions.len() < want => start = Some(key),
                _ => return Ok(sessions),
            }
        }
    }
}

/// Whether `pack` is a husk left by `dispose`.
fn is_husk(pack: &Item) -> bool {
    pack.contains_key(DISPOSED)
}

/// The most times `dispose` fences the log after a commit took the place it chose.
const FENCE_ATTEMPTS: u32 = 8;

impl DynamoStore {
    /// Takes the place of the session's next pack with a husk (on the condition that it is
    /// free, as a commit's pack): every commit after it, of a writer that loaded the session
    /// before, is refused. Returns false if there is no session (or it is disposed).
    async fn fence(&self, session_id: &str, now: Timestamp) -> Result<bool, StoreError> {
        for _ in 0..FENCE_ATTEMPTS {
            let Some(current) = self.current(session_id).await? else { return Ok(false) };
            let mut husk = items::key(session_id, items::event_key(current.session.events_applied() + 1));
            husk.insert(DISPOSED.to_owned(), items::n(now.0));
            let owner = current.session.init().and_then(|i| i.identity.id.clone()).filter(|o| !o.is_empty());
            if let Some(owner) = owner {
                match self.fence_counted(session_id, husk.clone(), &owner).await? {
                    Some(true) => return Ok(true),
                    Some(false) => {
                        self.forget(session_id);
                        continue;
                    }
                    // The owner has no count to lower (its sessions predate the counts).
                    None => {}
                }
            }
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(husk))
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", PK)
                .send()
                .await;
            match put {
                Ok(_) => return Ok(true),
                // A commit took the place: read what it wrote and fence after it.
                Err(err)
                    if matches!(
                        err.as_service_error(),
                        Some(PutItemError::ConditionalCheckFailedException(_))
                    ) =>
                {
                    self.forget(session_id);
                }
                Err(err) => return Err(self.failed("PutItem", session_id, describe(&err))),
            }
        }
        Err(StoreError::Conflict { session_id: session_id.to_owned(), expected: 0 })
    }

    /// The fence and the lowering of the owner's session count in one transaction, so a
    /// dispose lowers it once however often it is retried. `Some(false)`: a commit took the
    /// husk's place; `None`: the owner has no count above zero (sessions created before the
    /// counts), so only the fence is to be written.
    async fn fence_counted(
        &self,
        session_id: &str,
        husk: Item,
        owner: &str,
    ) -> Result<Option<bool>, StoreError> {
        const OPERATION: &str = "TransactWriteItems (dispose)";
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(husk))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .build()
            .map_err(|e| self.failed(OPERATION, session_id, e.to_string()))?;
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(items::owner_count_key(owner)))
            .update_expression("ADD #n :less")
            .condition_expression("#n > :zero")
            .expression_attribute_names("#n", SESSIONS)
            .expression_attribute_values(":less", items::n(-1))
            .expression_attribute_values(":zero", items::n(0))
            .build()
            .map_err(|e| self.failed(OPERATION, session_id, e.to_string()))?;
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(put).build())
            .transact_items(TransactWriteItem::builder().update(update).build())
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(Some(true)),
            Err(err) => err,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) = err.as_service_error()
        else {
            return Err(self.failed(OPERATION, session_id, describe(&err)));
        };
        let reasons = cancelled.cancellation_reasons();
        let failed = |at: usize| reasons.get(at).and_then(|r| r.code()) == Some("ConditionalCheckFailed");
        if failed(0) || reasons.iter().any(|r| r.code() == Some("TransactionConflict")) {
            Ok(Some(false))
        } else if failed(1) {
            Ok(None)
        } else {
            Err(self.failed(OPERATION, session_id, describe(&err)))
        }
    }

    /// Every item of the session's partition but the husks: packs become husks (their places
    /// stay taken, for good), everything else is deleted. Returns whether anything was left.
    async fn purge(&self, session_id: &str, now: Timestamp) -> Result<bool, StoreError> {
        // Every sort key is printable ASCII, between these two.
        let found = self.query_all(session_id, (" ", "~"), true).await?;
        let mut writes = Vec::new();
        for item in found.iter().filter(|i| !is_husk(i)) {
            let Some(sk) = items::get_s(item, SK) else { continue };
            let key = items::key(session_id, sk);
            let request = if sk.starts_with("E#") {
                let mut husk = key;
                husk.insert(DISPOSED.to_owned(), items::n(now.0));
                let put = PutRequest::builder().set_item(Some(husk)).build();
                WriteRequest::builder()
                    .put_request(put.map_err(|e| self.failed("BatchWriteItem", session_id, e.to_string()))?)
            } else {
                let delete = DeleteRequest::builder().set_key(Some(key)).build();
                WriteRequest::builder().delete_request(
                    delete.map_err(|e| self.failed("BatchWriteItem", session_id, e.to_string()))?,
                )
            };
            writes.push(request.build());
        }
        let left = !writes.is_empty();
        crate::batch::write(&self.client, &self.table, writes)
            .await
            .map_err(|message| self.failed("BatchWriteItem", session_id, message))?;
        Ok(left)
    }
}

/// About how many bytes a pack's events take (its body, or its chunks).
fn pack_bytes(pack: &Item) -> usize {
    match chunks::body(pack) {
        Some(Body::Inline(body)) => body.len(),
        Some(Body::Chunked(count)) => count * chunks::CHUNK_BYTES,
        None => 0,
    }
}

#[async_trait]
impl Store for DynamoStore {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        Ok(self.current(session_id).await?.map(|c| Loaded { version: c.version, session: c.session }))
    }

    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Ids used since the last checkpoint are in the packs after it; older ones are items.
        let Some(current) = self.current(session_id).await? else { return Ok(Vec::new()) };
        let stored = self.stored_ids(session_id, ids).await?;
        Ok(ids
            .iter()
            .filter(|id| current.tail.pending.contains(id) || stored.contains(id))
            .cloned()
            .collect())
    }

    async fn commit(
        &self,
        session_id: &str,
        expected_version: u64,
        commit: Commit<'_>,
    ) -> Result<u64, StoreError> {
        self.write(session_id, expected_version, &commit).await
    }

    async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let packs = self.event_packs(session_id, after_seq, limit).await?;
        if packs.iter().any(is_husk) {
            return Ok(Vec::new());
        }
        let bodies: Vec<Vec<Event>> = self.payloads(session_id, &packs).await?;
        let mut out = Vec::with_capacity(limit);
        let mut next: Option<u64> = None;
        for (pack, events) in packs.iter().zip(bodies) {
            let first =
                items::get_u64(pack, FIRST).ok_or_else(|| corrupt(session_id, "event pack without first"))?;
            if items::get_u64(pack, COUNT) != Some(events.len() as u64) {
                return Err(corrupt(
                    session_id,
                    format!("event pack {first} holds another count than it says"),
                ));
            }
            if let Some(expected) = next
                && first != expected
            {
                return Err(corrupt(session_id, format!("events {expected}..{first} are missing")));
            }
            next = Some(first + events.len() as u64);
            for (seq, event) in (first..).zip(events) {
                if seq > after_seq && out.len() < limit {
                    out.push(LoggedEvent { seq, event });
                }
            }
        }
        if let Some(first) = out.first()
            && first.seq != after_seq + 1
        {
            return Err(corrupt(session_id, format!("events {}..{} are missing", after_seq + 1, first.seq)));
        }
        Ok(out)
    }

    /// Fences the log (a husk in the next pack's place), then turns every pack into a husk
    /// and deletes every other item (head, messages, used ids, chunks, AHP subscriptions) with
    /// `BatchWriteItem`. A dispose that stopped half-way leaves a session that reads as
    /// disposed already; disposing it again finishes the purge.
    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let fenced = self.fence(session_id, now).await?;
        let purged = self.purge(session_id, now).await?;
        self.forget(session_id);
        Ok(fenced || purged)
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        let after = ListingCursor::decode(cursor)?;
        // A page of nothing could not say where the next one starts: at least one item.
        let limit = limit.max(1);
        // One more than asked tells whether another page follows.
        let want = limit + 1;
        let partitions: Vec<(&str, &str, String)> = match (&filter.owner, &filter.agent_id) {
            (Some(owner), _) => vec![(table::BY_OWNER, OWNER, owner.clone())],
            (None, Some(agent)) => vec![(table::BY_AGENT, AGENT, agent.clone())],
            (None, None) => (0..items::LIST_SHARDS)
                .map(|shard| shard.to_string())
                .chain([LISTED.to_owned()])
                .map(|shard| (table::BY_CREATED, LIST_SHARD, shard))
                .collect(),
        };
        let after_key = after.as_ref().map(|c| items::timed_key(c.created_at, &c.session_id));
        let agent = filter.owner.as_ref().and(filter.agent_id.as_deref());
        let mut reads = tokio::task::JoinSet::new();
        for (index, hash_name, hash_value) in partitions {
            let (store, after_key, agent) = (self.clone(), after_key.clone(), agent.map(str::to_owned));
            reads.spawn(async move {
                store
                    .listed(index, hash_name, &hash_value, after_key.as_deref(), agent.as_deref(), want)
                    .await
            });
        }
        // Newest first across the partitions: each gave its newest `want`.
        let mut found: Vec<(String, String)> = Vec::new();
        while let Some(joined) = reads.join_next().await {
            let listed = joined.map_err(|err| {
                self.table_failed("Query (list sessions)", format!("the query task failed: {err}"))
            })?;
            found.extend(listed?);
        }
        found.sort_by(|a, b| b.0.cmp(&a.0));
        let mut sessions: Vec<String> = found.into_iter().map(|(_, session)| session).take(want).collect();
        let more = sessions.len() > limit;
        sessions.truncate(limit);
        let keys = sessions.iter().map(|id| items::key(id, HEAD)).collect();
        let heads = crate::batch::get(&self.client, &self.table, keys, &[PK, AGENT, OWNER, CREATED_AT], true)
            .await
            .map_err(|message| self.table_failed("BatchGetItem (listed heads)", message))?;
        let mut heads: HashMap<String, Item> = heads
            .into_iter()
            .filter_map(|head| Some((items::get_s(&head, PK).and_then(items::session_of)?.to_owned(), head)))
            .collect();
        // The version and last write are the latest pack's: one small query per session.
        let mut latest = HashMap::new();
        for group in sessions.chunks(LISTING_READS_AT_ONCE) {
            let mut reads = tokio::task::JoinSet::new();
            for session_id in group {
                let (store, session_id) = (self.clone(), session_id.clone());
                reads.spawn(async move {
                    let range = (items::event_key(0), format!("E#{LAST_NUMBER}"));
                    let found = store
                        .query_page(&session_id, (&range.0, &range.1), Read::NEWEST_SOON, Some(1), None)
                        .await;
                    (session_id, found.map(|(page, _)| page.into_iter().next()))
                });
            }
            while let Some(joined) = reads.join_next().await {
                let (session_id, found) = joined.map_err(|err| {
                    self.table_failed("Query (latest pack)", format!("the query task failed: {err}"))
                })?;
                if let Some(pack) = found? {
                    latest.insert(session_id, pack);
                }
            }
        }
        let mut listed = Vec::with_capacity(sessions.len());
        for session_id in sessions {
            let (Some(head), Some(pack)) = (heads.remove(&session_id), latest.remove(&session_id)) else {
                continue;
            };
            let field = |name: &str| corrupt(&session_id, format!("listed {name}"));
            listed.push(SessionListing {
                agent_id: items::get_s(&head, AGENT).ok_or_else(|| field(AGENT))?.to_owned(),
                owner: items::get_s(&head, OWNER).map(str::to_owned),
                version: items::get_u64(&pack, VERSION).ok_or_else(|| field(VERSION))?,
                created_at: Timestamp(items::get_i64(&head, CREATED_AT).ok_or_else(|| field(CREATED_AT))?),
                updated_at: Timestamp(items::get_i64(&pack, UPDATED_AT).ok_or_else(|| field(UPDATED_AT))?),
                session_id,
            });
        }
        let next_cursor =
            if more { listed.last().map(|last| ListingCursor::after(last).encode()) } else { None };
        Ok(Page { items: listed, next_cursor })
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Every wake key up to `now` sorts before the key of the next millisecond.
        let bound = items::time_key(now.plus_ms(1));
        let mut shards = tokio::task::JoinSet::new();
        for shard in 0..items::DUE_SHARDS {
            let (store, bound) = (self.clone(), bound.clone());
            shards.spawn(async move { store.due_in_shard(shard, &bound, limit).await });
        }
        let mut due: Vec<(String, String)> = Vec::new();
        while let Some(joined) = shards.join_next().await {
            due.extend(joined.map_err(|err| {
                self.table_failed("Query (due)", format!("the query task failed: {err}"))
            })??);
        }
        // Each shard's first `limit` are enough: the merged first `limit` are among them.
        due.sort();
        Ok(due.into_iter().take(limit).map(|(_, session_id)| session_id).collect())
    }
}

/// How many sessions' latest packs a listing reads at once.
const LISTING_READS_AT_ONCE: usize = 32;

impl DynamoStore {
    /// Up to `limit` sessions of due-index shard `shard` whose wake time sorts before `bound`,
    /// as `(wake key, session)`. An entry is a pack's: one with a newer pack after it is out of
    /// date (the session moved on, and a newer commit or a run holds its wake time), and is
    /// taken out of the index on the way.
    async fn due_in_shard(
        &self,
        shard: u64,
        bound: &str,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut due = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(table::DUE)
                .key_condition_expression("#s = :s AND #w < :bound")
                .expression_attribute_names("#s", DUE_SHARD)
                .expression_attribute_names("#w", WAKE_KEY)
                .expression_attribute_values(":s", items::s(shard.to_string()))
                .expression_attribute_values(":bound", items::s(bound))
                .limit(i32::try_from(limit).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|err| self.table_failed("Query (due)", describe(&err)))?;
            for entry in out.items.unwrap_or_default() {
                let (Some(wake_key), Some(session_id), Some(sk)) = (
                    items::get_s(&entry, WAKE_KEY),
                    items::get_s(&entry, PK).and_then(items::session_of),
                    items::get_s(&entry, SK),
                ) else {
                    continue;
                };
                if self.outdated(session_id, sk).await? {
                    self.unindex(session_id, sk).await;
                } else {
                    due.push((wake_key.to_owned(), session_id.to_owned()));
                }
            }
            match out.last_evaluated_key.filter(|k| !k.is_empty()) {
                Some(key) if due.len() < limit => start = Some(key),
                _ => return Ok(due),
            }
        }
    }

    /// Whether a pack follows the pack at `sk`.
    async fn outdated(&self, session_id: &str, sk: &str) -> Result<bool, StoreError> {
        let first = sk.strip_prefix("E#").and_then(|n| n.parse::<u64>().ok());
        let Some(first) = first else { return Ok(false) };
        let range = (items::event_key(first + 1), format!("E#{LAST_NUMBER}"));
        // Eventually consistent: missing a pack written a moment ago only keeps the entry for
        // the next sweep; a pack it finds is there.
        let read = Read { forward: true, consistent: false };
        let (page, _) = self.query_page(session_id, (&range.0, &range.1), read, Some(1), None).await?;
        Ok(!page.is_empty())
    }

    /// Takes the pack at `sk` out of the due index. A failure only leaves it to the next sweep.
    async fn unindex(&self, session_id: &str, sk: &str) {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(items::key(session_id, sk)))
            .update_expression("REMOVE #s, #w, #a")
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#s", DUE_SHARD)
            .expression_attribute_names("#w", WAKE_KEY)
            .expression_attribute_names("#a", WAKE_AT)
            .expression_attribute_names("#pk", PK)
            .send()
            .await;
        if let Err(err) = result {
            tracing::warn!(session_id, pack = sk, error = %describe(&err), "could not take an outdated wake time out of the due index");
        }
    }
}

//! The DynamoDB store: the `Store` port on one table (DESIGN.md section 5). The layout is in
//! [`crate::items`], what a commit writes in [`crate::commit`], large payloads in
//! [`crate::chunks`], the indexes in [`crate::table`].
//!
//! Reads that must see the latest commit (the head, messages, events, used ids, listed heads)
//! are strongly consistent; index queries (listing, due work) cannot be and are not.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use serde::de::DeserializeOwned;
use turnstone_engine::protocol::TreeNode;
use turnstone_engine::session::{Event, Session, UsedId};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::store::{
    Commit, ListingCursor, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};

use crate::chunks::{self, Body, JoinError};
use crate::commit;
use crate::error::{AwsError, describe};
use crate::items::{
    self, AGENT, COUNT, CREATED_AT, CREATED_KEY, DECLARED, DUE_SHARD, FIRST, HEAD, Item, LIST_SHARD, LISTED,
    MESSAGES, OWNER, PK, SK, UPDATED_AT, VERSION, WAKE_KEY,
};
use crate::table;

/// How often a load reads the head again when its chunks belong to a newer commit.
const HEAD_ATTEMPTS: u32 = 5;

/// The highest sort key of a kind of numbered item (`E#`, `M#`): 20 nines sort after every
/// zero-padded `u64`.
const LAST_NUMBER: &str = "99999999999999999999";

/// The `Store` port on a DynamoDB table. Cheap to clone: clones share the SDK client.
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    clock: Arc<dyn Clock>,
    tokens: Arc<Tokens>,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore").field("table", &self.table).finish_non_exhaustive()
    }
}

/// A session's head as read.
struct Head {
    session: Session,
    version: u64,
    /// How many message nodes the session has at this version.
    messages: u64,
}

impl DynamoStore {
    /// The store on `table` through `client`; the system clock stamps `updated_at`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self::with_clock(client, table, Arc::new(SystemClock))
    }

    /// The store on `table`; `clock` stamps `updated_at`.
    pub fn with_clock(client: Client, table: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        DynamoStore { client, table: table.into(), clock, tokens: Arc::new(Tokens::default()) }
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

    /// Reads the head and the declared agent config in one strongly consistent query (their
    /// sort keys are adjacent), their chunks if they have any, and the snapshot.
    async fn read_head(&self, session_id: &str) -> Result<Option<Head>, StoreError> {
        for _ in 0..HEAD_ATTEMPTS {
            let (mut found, _) = self.query_page(session_id, (HEAD, DECLARED), true, None, None).await?;
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
            let mut snapshot: serde_json::Value = match chunks::body(&item) {
                Some(Body::Inline(body)) => {
                    parse(session_id, body.as_bytes(), || "head snapshot".to_owned())?
                }
                Some(Body::Chunked(count)) => {
                    let fetched = self.chunks(session_id, HEAD, count).await?;
                    match chunks::join(HEAD, count, Some(version), &fetched) {
                        Ok(bytes) => parse(session_id, &bytes, || "head snapshot".to_owned())?,
                        // A commit rewrote the chunks after the head was read: read again.
                        Err(JoinError::OtherVersion { .. }) => continue,
                        Err(err) => return Err(corrupt(session_id, format!("head snapshot: {err}"))),
                    }
                }
                None => return Err(corrupt(session_id, "the head holds no snapshot")),
            };
            if let Some(declared) = declared {
                // One payload per item given.
                let config = self.payloads(session_id, &[declared]).await?.pop().unwrap_or_default();
                let Some(init) = snapshot.get_mut("init").and_then(|init| init.as_object_mut()) else {
                    return Err(corrupt(session_id, "a declared config for a head without init"));
                };
                init.insert("declared".to_owned(), config);
            }
            let snapshot: Session = serde_json::from_value(snapshot)
                .map_err(|e| corrupt(session_id, format!("head snapshot: {e}")))?;
            if *snapshot.id() != *session_id {
                return Err(corrupt(session_id, format!("the head holds session {:?}", snapshot.id())));
            }
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
        forward: bool,
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
            .scan_index_forward(forward)
            .consistent_read(true)
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

    /// The message nodes at positions `from..to`, in order.
    async fn messages(&self, session_id: &str, from: u64, to: u64) -> Result<Vec<TreeNode>, StoreError> {
        if from >= to {
            return Ok(Vec::new());
        }
        let (first, last) = (items::message_key(from), items::message_key(to - 1));
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let (page, next) = self.query_page(session_id, (&first, &last), true, None, start).await?;
            found.extend(page);
            match next {
                Some(key) => start = Some(key),
                None => break,
            }
        }
        for (expected, item) in (from..).zip(&found) {
            if items::get_s(item, SK) != Some(items::message_key(expected).as_str()) {
                return Err(corrupt(session_id, format!("message {expected} is missing")));
            }
        }
        if found.len() as u64 != to - from {
            return Err(corrupt(session_id, format!("only {} of messages {from}..{to} found", found.len())));
        }
        self.payloads(session_id, &found).await
    }

    /// Commits `commit`: one `TransactWriteItems` (see [`crate::commit`]).
    async fn write(&self, session_id: &str, expected: u64, commit: &Commit<'_>) -> Result<u64, StoreError> {
        let tx = commit::transaction(&self.table, session_id, expected, commit, self.clock.now())?;
        let count = tx.items.len();
        // The token makes the SDK's own retries of this request idempotent (DynamoDB answers a
        // repeated token within 10 minutes with the first outcome), so a retry after a lost
        // response is not refused as a conflict with itself. moto ignores it.
        let token = self.tokens.next(session_id, expected);
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(tx.items))
            .client_request_token(token)
            .send()
            .await;
        const OPERATION: &str = "TransactWriteItems (commit)";
        let err = match result {
            Ok(_) => {
                let (version, bytes) = (tx.new_version, tx.bytes);
                tracing::debug!(session_id, version, items = count, bytes, "committed");
                return Ok(version);
            }
            Err(err) => err,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) = err.as_service_error()
        else {
            return Err(self.failed(OPERATION, session_id, describe(&err)));
        };
        Err(match commit::refusal(session_id, expected, &tx.roles, cancelled.cancellation_reasons()) {
            Ok(refused) => refused,
            Err(reasons) => self.failed(OPERATION, session_id, format!("cancelled: {reasons}")),
        })
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
            let (page, next) = self.query_page(session_id, range, true, Some(limit), start).await?;
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
            let (page, _) = self.query_page(session_id, (&range.0, &range.1), false, Some(1), None).await?;
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

#[async_trait]
impl Store for DynamoStore {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        let Some(head) = self.read_head(session_id).await? else { return Ok(None) };
        let nodes = self.messages(session_id, 0, head.messages).await?;
        let mut session = head.session;
        session.restore_messages(nodes);
        Ok(Some(Loaded { session, version: head.version }))
    }

    async fn load_since(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Option<(Loaded, Vec<TreeNode>)>, StoreError> {
        let Some(head) = self.read_head(session_id).await? else { return Ok(None) };
        let nodes = self.messages(session_id, from, head.messages).await?;
        Ok(Some((Loaded { session: head.session, version: head.version }, nodes)))
    }

    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
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

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        let after = ListingCursor::decode(cursor)?;
        // A page of nothing could not say where the next one starts: at least one item.
        let limit = limit.max(1);
        let (index, hash_name, hash_value) = match (&filter.owner, &filter.agent_id) {
            (Some(owner), _) => (table::BY_OWNER, OWNER, owner.as_str()),
            (None, Some(agent)) => (table::BY_AGENT, AGENT, agent.as_str()),
            (None, None) => (table::BY_CREATED, LIST_SHARD, LISTED),
        };
        // One more than asked tells whether another page follows.
        let want = limit + 1;
        let mut sessions: Vec<String> = Vec::with_capacity(want);
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
            query = match &after {
                Some(cursor) => query
                    .key_condition_expression("#h = :h AND #r < :after")
                    .expression_attribute_names("#r", CREATED_KEY)
                    .expression_attribute_values(
                        ":after",
                        items::s(items::timed_key(cursor.created_at, &cursor.session_id)),
                    ),
                None => query.key_condition_expression("#h = :h"),
            };
            if let (Some(_), Some(agent)) = (&filter.owner, &filter.agent_id) {
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
                if let Some(session) = items::get_s(&item, PK).and_then(items::session_of) {
                    sessions.push(session.to_owned());
                }
            }
            match out.last_evaluated_key.filter(|k| !k.is_empty()) {
                Some(key) if sessions.len() < want => start = Some(key),
                _ => break,
            }
        }
        let more = sessions.len() > limit;
        sessions.truncate(limit);
        let keys = sessions.iter().map(|id| items::key(id, HEAD)).collect();
        let heads = crate::batch::get(
            &self.client,
            &self.table,
            keys,
            &[PK, VERSION, AGENT, OWNER, CREATED_AT, UPDATED_AT],
            true,
        )
        .await
        .map_err(|message| self.table_failed("BatchGetItem (listed heads)", message))?;
        let mut heads: HashMap<String, Item> = heads
            .into_iter()
            .filter_map(|head| Some((items::get_s(&head, PK).and_then(items::session_of)?.to_owned(), head)))
            .collect();
        let mut listed = Vec::with_capacity(sessions.len());
        for session_id in sessions {
            let Some(head) = heads.remove(&session_id) else { continue };
            let field = |name: &str| corrupt(&session_id, format!("head {name}"));
            listed.push(SessionListing {
                agent_id: items::get_s(&head, AGENT).ok_or_else(|| field(AGENT))?.to_owned(),
                owner: items::get_s(&head, OWNER).map(str::to_owned),
                version: items::get_u64(&head, VERSION).ok_or_else(|| field(VERSION))?,
                created_at: Timestamp(items::get_i64(&head, CREATED_AT).ok_or_else(|| field(CREATED_AT))?),
                updated_at: Timestamp(items::get_i64(&head, UPDATED_AT).ok_or_else(|| field(UPDATED_AT))?),
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
        let mut queries = tokio::task::JoinSet::new();
        for shard in 0..items::DUE_SHARDS {
            let (client, table, bound) = (self.client.clone(), self.table.clone(), bound.clone());
            queries.spawn(async move {
                client
                    .query()
                    .table_name(table)
                    .index_name(table::DUE)
                    .key_condition_expression("#s = :s AND #w < :bound")
                    .expression_attribute_names("#s", DUE_SHARD)
                    .expression_attribute_names("#w", WAKE_KEY)
                    .expression_attribute_values(":s", items::s(shard.to_string()))
                    .expression_attribute_values(":bound", items::s(bound))
                    .limit(i32::try_from(limit).unwrap_or(i32::MAX))
                    .send()
                    .await
                    .map_err(|err| describe(&err))
            });
        }
        let mut due: Vec<String> = Vec::new();
        while let Some(joined) = queries.join_next().await {
            let out = joined
                .map_err(|err| self.table_failed("Query (due)", format!("the query task failed: {err}")))?
                .map_err(|message| self.table_failed("Query (due)", message))?;
            // Each shard's first `limit` are enough: the merged first `limit` are among them.
            due.extend(
                out.items
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|i| items::get_s(i, WAKE_KEY))
                    .map(str::to_owned),
            );
        }
        due.sort();
        Ok(due
            .iter()
            .take(limit)
            .filter_map(|key| items::session_of_timed_key(key))
            .map(str::to_owned)
            .collect())
    }
}

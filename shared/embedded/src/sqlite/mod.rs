//! The SQLite store: the `Store` port on one local file, for the embedded deployment.
//!
//! # Layout
//! See [`schema`]: `heads` (one row per session: version, snapshot without messages, agent,
//! owner, wake time), `events` (the log) and `messages` (the transcript's nodes). A commit is one
//! `IMMEDIATE` transaction: the head write conditioned on the version, the new events, the new
//! messages and the wake time. Nothing already written is rewritten: a step costs its events,
//! its new messages and the head.
//!
//! # Durability
//! The file runs in WAL mode with `synchronous=NORMAL` by default: a committed transaction is in
//! the WAL (the OS's page cache) when `commit` returns, so it survives the process crashing or
//! being killed (`kill -9`) at any point. A power loss or OS crash may lose the last commits
//! before the next checkpoint, never consistency: the database is never corrupt and a commit is
//! all or nothing. That is the promise of the embedded deployment. [`SqliteOptions::sync_full`]
//! (`synchronous=FULL`) fsyncs every commit for power-loss durability, at a cost per commit.
//!
//! # Threads
//! rusqlite is blocking, so every operation runs in `tokio::task::spawn_blocking`, never on an
//! async worker thread. Writes go through one writer connection behind a `std::sync::Mutex`
//! (SQLite admits one writer at a time anyway; taking the lock in-process avoids busy-waiting
//! on the file lock). Reads take a connection from a small pool of read-only connections, so in
//! WAL mode they run in parallel with each other and with the writer, each in its own
//! consistent snapshot. No `std` lock is ever held across an `.await`: it is taken and released
//! inside one blocking closure.
//!
//! Callers queue for a connection asynchronously, not on threads: a fair `tokio` semaphore
//! admits one writer task and at most [`SqliteOptions::max_readers`] reader tasks into
//! `spawn_blocking` at a time; its permit travels into the blocking closure and is released when
//! the SQLite work ends. So a burst of a thousand commits parks a thousand futures (back-pressure
//! on their callers), not a thousand blocking threads, and commits are served in arrival order.

mod cursor;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use turnstone_engine::protocol::TreeNode;
use turnstone_engine::session::{Event, Session, UsedId};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::store::{
    Commit, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};

pub use schema::SCHEMA_VERSION;

use crate::error::{SqliteError, backend};
use cursor::Cursor;

/// How the store opens and uses its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// How long a statement waits for a lock held by another connection or process.
    pub busy_timeout: Duration,
    /// How many reads run at once (each on its own read-only connection, kept open).
    pub max_readers: usize,
    /// `synchronous=FULL`: fsync every commit (power-loss durable) instead of `NORMAL`.
    pub sync_full: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions { busy_timeout: Duration::from_secs(5), max_readers: 4, sync_full: false }
    }
}

/// Counters of what the store wrote since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Commits that succeeded.
    pub commits: u64,
    /// Commits refused with a version conflict.
    pub conflicts: u64,
    /// Payload bytes of successful commits: snapshot, event and message JSON.
    pub payload_bytes: u64,
}

/// The `Store` port on a SQLite file (WAL). Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The database file (`:memory:` for an in-memory store).
    path: PathBuf,
    /// The one connection that writes.
    writer: Mutex<Connection>,
    /// Admits one task at a time to the writer.
    write_gate: Arc<Semaphore>,
    /// Idle read-only connections; `None` for an in-memory store, which reads on the writer.
    readers: Option<Mutex<Vec<Connection>>>,
    /// Admits up to `max_readers` tasks at a time to the read connections.
    read_gate: Arc<Semaphore>,
    options: SqliteOptions,
    clock: Arc<dyn Clock>,
    commits: AtomicU64,
    conflicts: AtomicU64,
    payload_bytes: AtomicU64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("path", &self.inner.path).finish_non_exhaustive()
    }
}

/// Locks a mutex; a panic while it was held leaves a usable connection (any open transaction
/// rolled back when it was dropped), so poisoning is ignored.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path` with default options and the system clock.
    /// Blocks on file I/O: call it at start-up or inside `spawn_blocking`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SqliteError> {
        Self::open_with(path, SqliteOptions::default(), Arc::new(SystemClock))
    }

    /// Opens (creating if needed) the store at `path`; `clock` stamps `updated_at`.
    /// Creates the parent directory and the schema; refuses a file with a newer schema.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, SqliteError> {
        let path = path.as_ref().to_owned();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|source| SqliteError::CreateDir { path: dir.to_owned(), source })?;
        }
        let mut writer = Connection::open(&path)?;
        schema::configure_writer(&writer, options.busy_timeout, options.sync_full, true)?;
        schema::ensure(&mut writer, &path)?;
        let store = Self::from_parts(path, writer, Some(Mutex::new(Vec::new())), options, clock);
        // Open one reader now so that a file readers cannot open fails here, not on first use.
        let reader = store.open_reader()?;
        store.return_reader(reader);
        Ok(store)
    }

    /// A store in memory, gone when dropped (reads share the writer connection). For unit
    /// tests of other components; durability tests need [`SqliteStore::open`] on a file.
    pub fn open_in_memory() -> Result<Self, SqliteError> {
        let path = PathBuf::from(":memory:");
        let options = SqliteOptions::default();
        let mut writer = Connection::open_in_memory()?;
        schema::configure_writer(&writer, options.busy_timeout, false, false)?;
        schema::ensure(&mut writer, &path)?;
        Ok(Self::from_parts(path, writer, None, options, Arc::new(SystemClock)))
    }

    fn from_parts(
        path: PathBuf,
        writer: Connection,
        readers: Option<Mutex<Vec<Connection>>>,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Self {
        SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: Mutex::new(writer),
                write_gate: Arc::new(Semaphore::new(1)),
                readers,
                read_gate: Arc::new(Semaphore::new(options.max_readers.max(1))),
                options,
                clock,
                commits: AtomicU64::new(0),
                conflicts: AtomicU64::new(0),
                payload_bytes: AtomicU64::new(0),
            }),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What this store wrote since it was opened.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            commits: self.inner.commits.load(Ordering::Relaxed),
            conflicts: self.inner.conflicts.load(Ordering::Relaxed),
            payload_bytes: self.inner.payload_bytes.load(Ordering::Relaxed),
        }
    }

    /// The session's message nodes from position `from` on, in order: what a warm host that
    /// already holds the first `from` nodes needs to catch up.
    pub async fn messages_from(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Vec<(u64, TreeNode)>, StoreError> {
        let id = session_id.to_owned();
        let from = to_i64(from);
        self.read(move |conn| read_messages(conn, &id, from)).await
    }

    fn open_reader(&self) -> Result<Connection, SqliteError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.inner.path, flags)?;
        schema::configure_reader(&conn, self.inner.options.busy_timeout)?;
        Ok(conn)
    }

    fn return_reader(&self, conn: Connection) {
        if let Some(pool) = &self.inner.readers {
            let mut idle = lock(pool);
            if idle.len() < self.inner.options.max_readers {
                idle.push(conn);
            }
        }
    }

    /// Runs `f` on a read connection, off the async threads.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let gate = if self.inner.readers.is_some() { &self.inner.read_gate } else { &self.inner.write_gate };
        let permit = Arc::clone(gate).acquire_owned().await.map_err(|_| gate_closed())?;
        let store = self.clone();
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let Some(pool) = &store.inner.readers else {
                return f(&mut lock(&store.inner.writer));
            };
            let idle = lock(pool).pop();
            let mut conn = match idle {
                Some(conn) => conn,
                None => store.open_reader()?,
            };
            let result = f(&mut conn);
            store.return_reader(conn);
            result
        });
        task.await.map_err(|e| StoreError::from(SqliteError::Task(e)))?
    }

    /// Runs `f` on the writer connection, off the async threads.
    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let permit = Arc::clone(&self.inner.write_gate).acquire_owned().await.map_err(|_| gate_closed())?;
        let inner = Arc::clone(&self.inner);
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f(&mut lock(&inner.writer))
        });
        task.await.map_err(|e| StoreError::from(SqliteError::Task(e)))?
    }
}

/// A commit serialized and checked, ready to move into a blocking task.
struct PreparedCommit {
    session_id: String,
    expected: u64,
    snapshot: String,
    agent_id: String,
    owner: Option<String>,
    created_at: i64,
    updated_at: i64,
    wake_at: Option<i64>,
    /// `(seq, name, body)`.
    events: Vec<(i64, &'static str, String)>,
    /// `(pos, body)`.
    messages: Vec<(i64, String)>,
    /// The turn and call ids the events use first, written only if never used before.
    used: Vec<UsedId>,
}

/// What writing a commit came to.
enum Written {
    Committed(u64),
    /// The head's version moved on: nothing was written.
    VersionMoved,
    /// These ids were used before: nothing was written.
    IdsUsed(Vec<UsedId>),
}

impl PreparedCommit {
    fn new(
        session_id: &str,
        expected: u64,
        commit: &Commit<'_>,
        now: Timestamp,
    ) -> Result<Self, SqliteError> {
        let invalid =
            |message: String| SqliteError::InvalidCommit { session_id: session_id.to_owned(), message };
        let session = commit.session;
        if *session.id() != *session_id {
            return Err(invalid(format!("the commit carries session {:?}", session.id())));
        }
        let event_count = commit.events.len() as u64;
        if event_count > session.events_applied() {
            return Err(invalid(format!(
                "{event_count} new events but the session has applied only {}",
                session.events_applied()
            )));
        }
        let recorded = commit.events.iter().filter(|e| matches!(e, Event::MessageRecorded { .. })).count();
        if recorded > session.tree().len() {
            return Err(invalid(format!(
                "{recorded} recorded messages but the session's tree holds {}",
                session.tree().len()
            )));
        }
        let serialize = |source| SqliteError::Serialize { session_id: session_id.to_owned(), source };
        let snapshot = serde_json::to_string(session).map_err(serialize)?;
        let first_seq = commit.first_seq();
        let events = commit
            .events
            .iter()
            .enumerate()
            .map(|(i, event)| {
                let body = serde_json::to_string(event)?;
                Ok((to_i64(first_seq + i as u64), event.name(), body))
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()
            .map_err(serialize)?;
        let messages = commit
            .new_messages()
            .into_iter()
            .map(|(pos, node)| Ok((to_i64(pos), serde_json::to_string(&node)?)))
            .collect::<Result<Vec<_>, serde_json::Error>>()
            .map_err(serialize)?;
        let init = session.init();
        Ok(PreparedCommit {
            session_id: session_id.to_owned(),
            expected,
            snapshot,
            agent_id: session.agent_id().to_owned(),
            owner: init.and_then(|i| i.identity.id.clone()),
            created_at: session.created_at().0,
            updated_at: now.0,
            wake_at: commit.wake_at.map(|t| t.0),
            events,
            messages,
            used: commit.first_used(),
        })
    }

    /// Bytes of JSON this commit writes.
    fn payload_bytes(&self) -> u64 {
        let events: usize = self.events.iter().map(|(_, name, body)| name.len() + body.len()).sum();
        let messages: usize = self.messages.iter().map(|(_, body)| body.len()).sum();
        (self.snapshot.len() + events + messages) as u64
    }

    /// Writes the commit in one transaction, or nothing when the version check fails or an id
    /// it uses first was used before.
    fn write(&self, conn: &mut Connection) -> rusqlite::Result<Written> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let new_version = if self.expected == 0 {
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO heads \
                     (session_id, version, snapshot, agent_id, owner, wake_at, created_at, updated_at) \
                     VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (session_id) DO NOTHING",
                )?
                .execute(params![
                    self.session_id,
                    self.snapshot,
                    self.agent_id,
                    self.owner,
                    self.wake_at,
                    self.created_at,
                    self.updated_at
                ])?;
            if inserted == 0 {
                return Ok(Written::VersionMoved);
            }
            1
        } else {
            let expected = to_i64(self.expected);
            let updated = tx
                .prepare_cached(
                    "UPDATE heads SET version = version + 1, snapshot = ?3, wake_at = ?4, updated_at = ?5 \
                     WHERE session_id = ?1 AND version = ?2",
                )?
                .execute(params![self.session_id, expected, self.snapshot, self.wake_at, self.updated_at])?;
            if updated == 0 {
                return Ok(Written::VersionMoved);
            }
            self.expected + 1
        };
        if !self.used.is_empty() {
            let mut insert = tx.prepare_cached(
                "INSERT INTO used_ids (session_id, kind, id) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            )?;
            let mut again = Vec::new();
            for used in &self.used {
                if insert.execute(params![self.session_id, used.kind(), used.id()])? == 0 {
                    again.push(used.clone());
                }
            }
            if !again.is_empty() {
                // Dropping the transaction rolls back the head update too.
                return Ok(Written::IdsUsed(again));
            }
        }
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO events (session_id, seq, name, body) VALUES (?1, ?2, ?3, ?4)")?;
            for (seq, name, body) in &self.events {
                insert.execute(params![self.session_id, seq, name, body])?;
            }
            let mut insert =
                tx.prepare_cached("INSERT INTO messages (session_id, pos, body) VALUES (?1, ?2, ?3)")?;
            for (pos, body) in &self.messages {
                insert.execute(params![self.session_id, pos, body])?;
            }
        }
        tx.commit()?;
        Ok(Written::Committed(new_version))
    }
}

/// `u64` to SQLite's `i64`; positions and versions never come near the limit, so saturating is
/// only a guard against garbage.
fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `i64` read from SQLite to `u64` (negative values cannot be written: CHECK constraints).
fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The gates are never closed; should one be, the store is unusable.
fn gate_closed() -> StoreError {
    SqliteError::Closed.into()
}

fn corrupt(session_id: &str, message: impl Into<String>) -> StoreError {
    StoreError::Corrupt { session_id: session_id.to_owned(), message: message.into() }
}

/// Parses the JSON in column `idx` of `row`; bad JSON is `Corrupt`, naming the session and what.
fn json_column<T: DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    idx: usize,
    session_id: &str,
    what: impl FnOnce() -> String,
) -> Result<T, StoreError> {
    match row.get_ref(idx).map_err(backend)? {
        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => {
            serde_json::from_slice(bytes).map_err(|e| corrupt(session_id, format!("{}: {e}", what())))
        }
        _ => Err(corrupt(session_id, format!("{}: not JSON text", what()))),
    }
}

fn read_messages(conn: &Connection, session_id: &str, from: i64) -> Result<Vec<(u64, TreeNode)>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT pos, body FROM messages WHERE session_id = ?1 AND pos >= ?2 ORDER BY pos")
        .map_err(backend)?;
    let mut rows = stmt.query(params![session_id, from]).map_err(backend)?;
    let mut nodes = Vec::new();
    let mut expected = from;
    while let Some(row) = rows.next().map_err(backend)? {
        let pos: i64 = row.get(0).map_err(backend)?;
        if pos != expected {
            return Err(corrupt(session_id, format!("message position {expected} is missing (found {pos})")));
        }
        let node: TreeNode = json_column(row, 1, session_id, || format!("message {pos}"))?;
        nodes.push((to_u64(pos), node));
        expected += 1;
    }
    Ok(nodes)
}

fn load_session(conn: &mut Connection, session_id: &str) -> Result<Option<Loaded>, StoreError> {
    let Some((mut loaded, nodes)) = load_session_since(conn, session_id, 0)? else { return Ok(None) };
    loaded.session.restore_messages(nodes);
    Ok(Some(loaded))
}

/// The head and the message nodes from position `from` on, from one read snapshot.
fn load_session_since(
    conn: &mut Connection,
    session_id: &str,
    from: i64,
) -> Result<Option<(Loaded, Vec<TreeNode>)>, StoreError> {
    // One read transaction: the head and the messages come from the same snapshot.
    let tx = conn.transaction().map_err(backend)?;
    let head = {
        let mut stmt = tx
            .prepare_cached("SELECT version, snapshot FROM heads WHERE session_id = ?1")
            .map_err(backend)?;
        stmt.query_row([session_id], |row| {
            let version: i64 = row.get(0)?;
            Ok((version, json_column::<Session>(row, 1, session_id, || "head snapshot".to_owned())))
        })
        .optional()
        .map_err(backend)?
    };
    let Some((version, session)) = head else { return Ok(None) };
    let session = session?;
    if *session.id() != *session_id {
        return Err(corrupt(session_id, format!("the head holds session {:?}", session.id())));
    }
    let nodes = read_messages(&tx, session_id, from)?;
    tx.finish().map_err(backend)?;
    let nodes = nodes.into_iter().map(|(_, node)| node).collect();
    Ok(Some((Loaded { session, version: to_u64(version) }, nodes)))
}

fn read_events(
    conn: &Connection,
    session_id: &str,
    after: i64,
    limit: i64,
) -> Result<Vec<LoggedEvent>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, body FROM events WHERE session_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .map_err(backend)?;
    let mut rows = stmt.query(params![session_id, after, limit]).map_err(backend)?;
    let mut events = Vec::new();
    while let Some(row) = rows.next().map_err(backend)? {
        let seq: i64 = row.get(0).map_err(backend)?;
        let event: Event = json_column(row, 1, session_id, || format!("event {seq}"))?;
        events.push(LoggedEvent { seq: to_u64(seq), event });
    }
    Ok(events)
}

/// The listing query for a filter, with or without a cursor. Each variant is its own cached
/// statement, so each can use the index that fits it.
fn list_sql(filter: &SessionFilter, after: bool) -> String {
    let mut sql = String::from(
        "SELECT session_id, agent_id, owner, version, created_at, updated_at FROM heads WHERE 1 = 1",
    );
    if filter.agent_id.is_some() {
        sql.push_str(" AND agent_id = :agent");
    }
    if filter.owner.is_some() {
        sql.push_str(" AND owner = :owner");
    }
    if after {
        sql.push_str(" AND (created_at, session_id) < (:created_at, :session_id)");
    }
    sql.push_str(" ORDER BY created_at DESC, session_id DESC LIMIT :limit");
    sql
}

fn list(
    conn: &Connection,
    filter: &SessionFilter,
    after: Option<&Cursor>,
    limit: usize,
) -> Result<Page<SessionListing>, StoreError> {
    let sql = list_sql(filter, after.is_some());
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    // One more than asked tells whether another page follows.
    let fetch = to_i64(limit as u64).saturating_add(1);
    let mut named: Vec<(&str, &dyn rusqlite::ToSql)> = vec![(":limit", &fetch)];
    if let Some(agent) = &filter.agent_id {
        named.push((":agent", agent));
    }
    if let Some(owner) = &filter.owner {
        named.push((":owner", owner));
    }
    if let Some(cursor) = after {
        named.push((":created_at", &cursor.created_at));
        named.push((":session_id", &cursor.session_id));
    }
    let mut items = stmt
        .query_map(named.as_slice(), |row| {
            Ok(SessionListing {
                session_id: row.get(0)?,
                agent_id: row.get(1)?,
                owner: row.get(2)?,
                version: to_u64(row.get(3)?),
                created_at: Timestamp(row.get(4)?),
                updated_at: Timestamp(row.get(5)?),
            })
        })
        .map_err(backend)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(backend)?;
    let next_cursor = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|last| {
            Cursor { created_at: last.created_at.0, session_id: last.session_id.clone() }.encode()
        })
    } else {
        None
    };
    Ok(Page { items, next_cursor })
}

fn due_sessions(conn: &Connection, now: i64, limit: i64) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT session_id FROM heads WHERE wake_at IS NOT NULL AND wake_at <= ?1 \
             ORDER BY wake_at, session_id LIMIT ?2",
        )
        .map_err(backend)?;
    let ids = stmt
        .query_map(params![now, limit], |row| row.get(0))
        .map_err(backend)?
        .collect::<rusqlite::Result<Vec<String>>>()
        .map_err(backend)?;
    Ok(ids)
}

#[async_trait]
impl Store for SqliteStore {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        let id = session_id.to_owned();
        self.read(move |conn| load_session(conn, &id)).await
    }

    async fn load_since(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Option<(Loaded, Vec<TreeNode>)>, StoreError> {
        let id = session_id.to_owned();
        let from = to_i64(from);
        self.read(move |conn| load_session_since(conn, &id, from)).await
    }

    async fn commit(
        &self,
        session_id: &str,
        expected_version: u64,
        commit: Commit<'_>,
    ) -> Result<u64, StoreError> {
        let prepared = PreparedCommit::new(session_id, expected_version, &commit, self.inner.clock.now())?;
        let bytes = prepared.payload_bytes();
        let written = self.write(move |conn| prepared.write(conn).map_err(backend)).await?;
        match written {
            Written::Committed(version) => {
                self.inner.commits.fetch_add(1, Ordering::Relaxed);
                self.inner.payload_bytes.fetch_add(bytes, Ordering::Relaxed);
                Ok(version)
            }
            Written::VersionMoved => {
                self.inner.conflicts.fetch_add(1, Ordering::Relaxed);
                Err(StoreError::Conflict { session_id: session_id.to_owned(), expected: expected_version })
            }
            Written::IdsUsed(ids) => Err(StoreError::IdsUsed { session_id: session_id.to_owned(), ids }),
        }
    }

    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let (id, ids) = (session_id.to_owned(), ids.to_vec());
        self.read(move |conn| {
            let mut query = conn
                .prepare_cached("SELECT 1 FROM used_ids WHERE session_id = ?1 AND kind = ?2 AND id = ?3")
                .map_err(backend)?;
            let mut found = Vec::new();
            for used in ids {
                if query.exists(params![id, used.kind(), used.id()]).map_err(backend)? {
                    found.push(used);
                }
            }
            Ok(found)
        })
        .await
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
        let id = session_id.to_owned();
        let (after, limit) = (to_i64(after_seq), to_i64(limit as u64));
        self.read(move |conn| read_events(conn, &id, after, limit)).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        let after = match cursor {
            Some(text) => Some(Cursor::decode(text).ok_or(StoreError::InvalidCursor)?),
            None => None,
        };
        let filter = filter.clone();
        // A page of nothing could not say where the next one starts: at least one item.
        let limit = limit.max(1);
        self.read(move |conn| list(conn, &filter, after.as_ref(), limit)).await
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = to_i64(limit as u64);
        self.read(move |conn| due_sessions(conn, now.0, limit)).await
    }
}

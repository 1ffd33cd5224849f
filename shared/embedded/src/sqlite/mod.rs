//! The SQLite store: the `Store` port on one local file, for the embedded deployment.
//!
//! # Layout
//! See [`schema`]: `heads` (one row per session: version, snapshot without messages, agent,
//! owner, wake time), `events` (the log) and `messages` (the transcript's nodes). A commit is one
//! savepoint inside an `IMMEDIATE` transaction it may share with other sessions' commits (see
//! "Group commit"): the head write conditioned on the version, the turn and call ids it uses
//! first (conditioned on their absence), the new events, the new messages and the wake time.
//! Nothing already written is rewritten: a step costs its events, its new messages and the head.
//!
//! # Durability
//! [`SqliteOptions::durability`] chooses what an acknowledged commit survives (`[server]
//! durability` in the configuration):
//! - [`Durability::Full`], the default: power loss and OS crashes. The file runs in WAL mode with
//!   `synchronous=FULL`, so SQLite fsyncs the WAL when a write transaction commits, and `commit`
//!   returns only after its transaction committed: what it wrote is on disk.
//! - [`Durability::Process`]: the process crashing or being killed (`kill -9`) at any point, not
//!   a power loss or an OS crash. `synchronous=NORMAL`: a committed transaction is in the WAL
//!   (the OS's page cache) when `commit` returns; a power loss may lose the last commits before
//!   the next checkpoint.
//!
//! Neither level ever loses consistency: the database is never corrupt and every commit is all
//! or nothing. Checkpoints (moving the WAL into the database) fsync at both levels.
//!
//! Why `synchronous=FULL` rather than `NORMAL` plus an fsync of our own: SQLite then syncs the
//! WAL exactly once per transaction, at the point its own recovery relies on (after the commit
//! frame is written, before the transaction counts as committed), through its VFS, with the
//! directory sync on creating the WAL. An fsync from outside would need a second handle on the
//! `-wal` file and knowledge of when SQLite rewinds or truncates it, for the same one fsync per
//! transaction. The cost of FULL is that fsync per transaction, and group commit shares it.
//!
//! # Group commit
//! One writer thread owns the writer connection and takes commits from a bounded queue. When it
//! becomes free it takes the first commit queued, waiting if there is none, and with it every
//! commit queued behind it (at most [`MAX_GROUP`]): that is a group, written in one `IMMEDIATE`
//! transaction, so one fsync at `full`. Inside it each commit is its own `SAVEPOINT`, with its
//! own version check and its own `used_ids` check: a commit refused with `Conflict` or
//! `IdsUsed`, or failing on its own (a constraint), is rolled back to its savepoint and writes
//! nothing, while the others of its group land. Two commits of one session in one group are
//! checked in arrival order, the second against what the first wrote. A failure of the group's
//! transaction itself (begin, commit, an I/O error that rolls it all back) fails every member
//! with [`SqliteError::GroupFailed`], naming the step: none of them was written. Each caller
//! gets its own answer only after the group's transaction committed.
//!
//! The writer never waits for company: a lone commit is written as soon as the writer is free,
//! with no added latency, and commits group by themselves when they arrive while a transaction
//! (and its fsync) is in progress, which is exactly when sharing one pays. So a commit waits at
//! most for the group in progress to finish, then for its own group: two transactions of at
//! most [`MAX_GROUP`] commits each. [`SqliteStore::group_stats`] counts commits, groups and
//! fsyncs, so a benchmark can print fsyncs per commit.
//!
//! # Threads
//! rusqlite is blocking, so every operation runs off the async worker threads. Writes go to the
//! writer thread through a bounded `tokio` channel ([`QUEUE_CAPACITY`] jobs): a burst of a
//! thousand commits parks the callers' futures on the full channel (back-pressure), not a
//! thousand threads, and commits are served in arrival order. Each caller waits on its own
//! one-shot answer. The thread ends when the last clone of the store is dropped, after the jobs
//! already queued; dropping the store waits for it (at most the group in progress), so the file
//! is closed when the drop returns.
//!
//! Reads run in `tokio::task::spawn_blocking` on a small pool of read-only connections, so in
//! WAL mode they run in parallel with each other and with the writer, each in its own
//! consistent snapshot. A fair `tokio` semaphore admits at most [`SqliteOptions::max_readers`]
//! reader tasks at a time; its permit travels into the blocking closure. An in-memory store has
//! no second connection: its reads run on the writer thread, between groups. No `std` lock is
//! ever held across an `.await`.

mod schema;

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, mpsc, oneshot};
use turnstone_engine::protocol::{AgentConfig, TreeNode};
use turnstone_engine::session::{Event, Session, UsedId, VersionEntry, VersionKind};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::clock::{Clock, SystemClock};
pub use turnstone_runtime::config::Durability;
use turnstone_runtime::store::{
    Commit, ListingCursor, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};

pub use schema::SCHEMA_VERSION;

use crate::error::{SqliteError, backend};

/// The most commits one group (one write transaction) carries.
pub const MAX_GROUP: usize = 256;

/// How many jobs (commits, in-memory reads) wait for the writer before callers wait to queue.
pub const QUEUE_CAPACITY: usize = 1024;

/// How the store opens and uses its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// How long a statement waits for a lock held by another connection or process.
    pub busy_timeout: Duration,
    /// How many reads run at once (each on its own read-only connection, kept open).
    pub max_readers: usize,
    /// What an acknowledged commit survives: [`Durability::Full`] (the default,
    /// `synchronous=FULL`: fsynced before `commit` returns) or [`Durability::Process`]
    /// (`synchronous=NORMAL`: survives a killed process, not a power loss).
    pub durability: Durability,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            busy_timeout: Duration::from_secs(5),
            max_readers: 4,
            durability: Durability::default(),
        }
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

/// How the writer grouped commits since the store was opened (see "Group commit" above).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Commits the writer ran: written, refused (`Conflict`, `IdsUsed`) or failed.
    pub commits: u64,
    /// Write transactions that committed, one per group.
    pub groups: u64,
    /// WAL fsyncs at transaction commit: `groups` at [`Durability::Full`], 0 at
    /// [`Durability::Process`]. The fsyncs of checkpoints (both levels) are not counted.
    pub syncs: u64,
}

/// The `Store` port on a SQLite file (WAL). Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The database file (`:memory:` for an in-memory store).
    path: PathBuf,
    /// The writer thread, which owns the writer connection.
    writer: Writer,
    /// Idle read-only connections; `None` for an in-memory store, which reads on the writer.
    readers: Option<Mutex<Vec<Connection>>>,
    /// Admits up to `max_readers` tasks at a time to the read connections.
    read_gate: Arc<Semaphore>,
    options: SqliteOptions,
    clock: Arc<dyn Clock>,
    counters: Arc<Counters>,
    /// The lock held on `<path>.lock` while the store is open (file-backed stores only);
    /// declared last so it is released after the writer thread has finished.
    _lock: Option<File>,
}

/// The counters, written by the writer thread.
#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    conflicts: AtomicU64,
    payload_bytes: AtomicU64,
    attempts: AtomicU64,
    groups: AtomicU64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("durability", &self.inner.options.durability)
            .finish_non_exhaustive()
    }
}

/// Takes the lock that keeps other processes out of the store at `path`: an exclusive lock on
/// `<path>.lock`, which the OS releases when the process ends, however it ends.
fn lock_file(path: &Path) -> Result<File, SqliteError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock = PathBuf::from(name);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .map_err(|source| SqliteError::Lock { lock: lock.clone(), source })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(SqliteError::InUse { path: path.to_owned(), lock }),
        Err(TryLockError::Error(source)) => Err(SqliteError::Lock { lock, source }),
    }
}

/// Locks a mutex; a panic while it was held leaves a usable connection (any open transaction
/// rolled back when it was dropped), so poisoning is ignored.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path` with default options (power-loss
    /// durable) and the system clock. Blocks on file I/O: call it at start-up or inside
    /// `spawn_blocking`.
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
        let lock = lock_file(&path)?;
        let mut writer = Connection::open(&path)?;
        let sync_full = options.durability == Durability::Full;
        schema::configure_writer(&writer, options.busy_timeout, sync_full, true)?;
        schema::ensure(&mut writer, &path)?;
        let readers = Some(Mutex::new(Vec::new()));
        let store = Self::from_parts(path, writer, readers, options, clock, Some(lock))?;
        // Open one reader now so that a file readers cannot open fails here, not on first use.
        let reader = store.open_reader()?;
        store.return_reader(reader);
        Ok(store)
    }

    /// A store in memory, gone when dropped (reads run on the writer connection). For unit
    /// tests of other components; durability tests need [`SqliteStore::open`] on a file.
    pub fn open_in_memory() -> Result<Self, SqliteError> {
        let path = PathBuf::from(":memory:");
        let options = SqliteOptions { durability: Durability::Process, ..SqliteOptions::default() };
        let mut writer = Connection::open_in_memory()?;
        schema::configure_writer(&writer, options.busy_timeout, false, false)?;
        schema::ensure(&mut writer, &path)?;
        Self::from_parts(path, writer, None, options, Arc::new(SystemClock), None)
    }

    fn from_parts(
        path: PathBuf,
        writer: Connection,
        readers: Option<Mutex<Vec<Connection>>>,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
        lock: Option<File>,
    ) -> Result<Self, SqliteError> {
        let counters = Arc::new(Counters::default());
        let writer = Writer::start(writer, Arc::clone(&counters))?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer,
                readers,
                read_gate: Arc::new(Semaphore::new(options.max_readers.max(1))),
                options,
                clock,
                counters,
                _lock: lock,
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What an acknowledged commit of this store survives.
    pub fn durability(&self) -> Durability {
        self.inner.options.durability
    }

    /// What this store wrote since it was opened.
    pub fn stats(&self) -> StoreStats {
        let c = &self.inner.counters;
        StoreStats {
            commits: c.commits.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            payload_bytes: c.payload_bytes.load(Ordering::Relaxed),
        }
    }

    /// How the writer grouped commits since the store was opened.
    pub fn group_stats(&self) -> GroupStats {
        let c = &self.inner.counters;
        let groups = c.groups.load(Ordering::Relaxed);
        GroupStats {
            commits: c.attempts.load(Ordering::Relaxed),
            groups,
            syncs: if self.inner.options.durability == Durability::Full { groups } else { 0 },
        }
    }

    /// The writer connection's `PRAGMA synchronous`: 2 (`FULL`) at [`Durability::Full`], 1
    /// (`NORMAL`) at [`Durability::Process`] and in memory. The setting is the connection's,
    /// so only the writer can tell.
    pub async fn synchronous(&self) -> Result<i64, StoreError> {
        self.on_writer(|conn| {
            conn.pragma_query_value(None, "synchronous", |row| row.get::<_, i64>(0)).map_err(backend)
        })
        .await
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

    /// Runs `f` on a read connection (on the writer thread for an in-memory store), off the
    /// async threads.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        if self.inner.readers.is_none() {
            return self.on_writer(f).await;
        }
        let gate = &self.inner.read_gate;
        let permit = Arc::clone(gate).acquire_owned().await.map_err(|_| gate_closed())?;
        let store = self.clone();
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let Some(pool) = &store.inner.readers else { return Err(gate_closed()) };
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

    /// Runs `f` on the writer thread's connection, between groups.
    async fn on_writer<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Job::Run(Box::new(move |conn: &mut Connection| {
            // The caller may have gone away; nothing to tell it then.
            let _ = reply.send(f(conn));
        }));
        self.inner.writer.send(job).await?;
        answer.await.map_err(|_| StoreError::from(SqliteError::WriterStopped))?
    }
}

/// Work for the writer thread.
enum Job {
    /// A commit, grouped with the commits queued next to it (boxed: the channel holds jobs of
    /// the largest variant's size).
    Commit(Box<Pending>),
    /// Anything else that needs the writer connection (an in-memory store's reads, a pragma).
    Run(Box<dyn FnOnce(&mut Connection) + Send>),
}

/// A commit waiting for the writer, and where its answer goes.
struct Pending {
    commit: PreparedCommit,
    reply: oneshot::Sender<Result<u64, StoreError>>,
}

/// The writer thread and the queue into it. Dropping it closes the queue and waits for the
/// thread to finish what was queued.
struct Writer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    fn start(conn: Connection, counters: Arc<Counters>) -> Result<Self, SqliteError> {
        let (jobs, queue) = mpsc::channel(QUEUE_CAPACITY);
        let thread = std::thread::Builder::new()
            .name("turnstone-sqlite-writer".to_owned())
            .spawn(move || writer_loop(conn, queue, &counters))
            .map_err(SqliteError::Spawn)?;
        Ok(Writer { jobs: Some(jobs), thread: Some(thread) })
    }

    /// Queues `job`, waiting while the queue is full.
    async fn send(&self, job: Job) -> Result<(), StoreError> {
        let jobs = self.jobs.as_ref().ok_or(SqliteError::Closed)?;
        jobs.send(job).await.map_err(|_| SqliteError::WriterStopped.into())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has run what is queued.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the SQLite writer thread panicked");
        }
    }
}

/// The writer thread: takes the first job queued (waiting for one), then whatever is queued
/// behind it, up to [`MAX_GROUP`]; consecutive commits among them are one group.
fn writer_loop(mut conn: Connection, mut queue: mpsc::Receiver<Job>, counters: &Counters) {
    let mut batch = Vec::with_capacity(MAX_GROUP);
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut group = Vec::with_capacity(batch.len());
        for job in batch.drain(..) {
            match job {
                Job::Commit(pending) => group.push(*pending),
                Job::Run(task) => {
                    write_group(&mut conn, std::mem::take(&mut group), counters);
                    task(&mut conn);
                }
            }
        }
        write_group(&mut conn, group, counters);
    }
}

/// What one commit of a group came to, when the group's transaction commits.
enum Outcome {
    Written(Written),
    /// It failed on its own (e.g. a constraint); rolled back to its savepoint.
    Failed(rusqlite::Error),
}

/// Why a group's transaction failed: nothing of it was written.
struct GroupFailure {
    step: String,
    error: rusqlite::Error,
}

/// Writes `group` in one transaction and answers each member.
fn write_group(conn: &mut Connection, group: Vec<Pending>, counters: &Counters) {
    if group.is_empty() {
        return;
    }
    counters.attempts.fetch_add(group.len() as u64, Ordering::Relaxed);
    match run_group(conn, &group) {
        Ok(outcomes) => {
            counters.groups.fetch_add(1, Ordering::Relaxed);
            for (pending, outcome) in group.into_iter().zip(outcomes) {
                let commit = &pending.commit;
                let result = match outcome {
                    Outcome::Written(Written::Committed(version)) => {
                        counters.commits.fetch_add(1, Ordering::Relaxed);
                        counters.payload_bytes.fetch_add(commit.payload_bytes(), Ordering::Relaxed);
                        Ok(version)
                    }
                    Outcome::Written(Written::VersionMoved) => {
                        counters.conflicts.fetch_add(1, Ordering::Relaxed);
                        Err(StoreError::Conflict {
                            session_id: commit.session_id.clone(),
                            expected: commit.expected,
                        })
                    }
                    Outcome::Written(Written::IdsUsed(ids)) => {
                        Err(StoreError::IdsUsed { session_id: commit.session_id.clone(), ids })
                    }
                    Outcome::Written(Written::OwnerFull(owner, limit)) => {
                        Err(StoreError::OwnerFull { owner, limit })
                    }
                    Outcome::Failed(error) => Err(backend(error)),
                };
                // The caller may have gone away; the commit stands all the same.
                let _ = pending.reply.send(result);
            }
        }
        Err(GroupFailure { step, error }) => {
            let commits = group.len();
            let message = error.to_string();
            tracing::error!(commits, %step, error = %message, "a group commit failed");
            for pending in group {
                let failed =
                    SqliteError::GroupFailed { commits, step: step.clone(), message: message.clone() };
                let _ = pending.reply.send(Err(failed.into()));
            }
        }
    }
}

/// One `IMMEDIATE` transaction for the group, a savepoint per commit.
fn run_group(conn: &mut Connection, group: &[Pending]) -> Result<Vec<Outcome>, GroupFailure> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|error| GroupFailure { step: "beginning its transaction".to_owned(), error })?;
    let mut outcomes = Vec::with_capacity(group.len());
    for pending in group {
        let outcome = write_one(&tx, &pending.commit).map_err(|error| GroupFailure {
            step: format!("writing the commit of session {:?}", pending.commit.session_id),
            error,
        })?;
        outcomes.push(outcome);
    }
    tx.commit().map_err(|error| GroupFailure { step: "committing its transaction".to_owned(), error })?;
    Ok(outcomes)
}

/// Writes one commit of a group inside its own savepoint, rolled back unless it was written.
/// An error is the group's only when the savepoint cannot be rolled back (or SQLite rolled the
/// whole transaction back).
fn write_one(conn: &Connection, commit: &PreparedCommit) -> rusqlite::Result<Outcome> {
    conn.prepare_cached("SAVEPOINT one_commit")?.execute([])?;
    let outcome = match commit.write(conn) {
        Ok(Written::Committed(version)) => {
            conn.prepare_cached("RELEASE one_commit")?.execute([])?;
            return Ok(Outcome::Written(Written::Committed(version)));
        }
        Ok(refused) => Outcome::Written(refused),
        Err(error) if conn.is_autocommit() => return Err(error),
        Err(error) => Outcome::Failed(error),
    };
    conn.prepare_cached("ROLLBACK TO one_commit")?.execute([])?;
    conn.prepare_cached("RELEASE one_commit")?.execute([])?;
    Ok(outcome)
}

/// A commit serialized and checked, ready to move into a blocking task.
struct PreparedCommit {
    session_id: String,
    expected: u64,
    snapshot: String,
    /// The declared agent config, written by the creating commit only (JSON).
    declared: Option<String>,
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
    /// Where the versions the events write apply from.
    versions: Vec<VersionEntry>,
    /// The owner a creating commit counts a session for, and the most it may have.
    counted: Option<(String, Option<u64>)>,
}

/// What writing a commit came to.
enum Written {
    Committed(u64),
    /// The head's version moved on: nothing was written.
    VersionMoved,
    /// These ids were used before: nothing was written.
    IdsUsed(Vec<UsedId>),
    /// The owner has as many sessions as it may: nothing was written.
    OwnerFull(String, u64),
}

impl PreparedCommit {
    fn new(
        session_id: &str,
        expected: u64,
        commit: &Commit<'_>,
        now: Timestamp,
    ) -> Result<Self, SqliteError> {
        commit
            .check(session_id)
            .map_err(|message| SqliteError::InvalidCommit { session_id: session_id.to_owned(), message })?;
        let session = commit.session;
        let serialize = |source| SqliteError::Serialize { session_id: session_id.to_owned(), source };
        let snapshot = serde_json::to_string(session).map_err(serialize)?;
        session.wrote_snapshot(snapshot.len());
        let declared = match session.declared() {
            Some(declared) if expected == 0 => Some(serde_json::to_string(declared).map_err(serialize)?),
            _ => None,
        };
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
            declared,
            agent_id: session.agent_id().to_owned(),
            owner: init.and_then(|i| i.identity.id.clone()),
            created_at: session.created_at().0,
            updated_at: now.0,
            wake_at: commit.wake_at.map(|t| t.0),
            events,
            messages,
            used: commit.first_used(),
            versions: commit.new_versions(),
            counted: commit.counted_owner(expected).map(|o| (o.to_owned(), commit.sessions_per_owner)),
        })
    }

    /// Bytes of JSON this commit writes.
    fn payload_bytes(&self) -> u64 {
        let events: usize = self.events.iter().map(|(_, name, body)| name.len() + body.len()).sum();
        let messages: usize = self.messages.iter().map(|(_, body)| body.len()).sum();
        (self.snapshot.len() + self.declared.as_ref().map_or(0, String::len) + events + messages) as u64
    }

    /// Writes the commit on `tx`, inside the caller's savepoint; `VersionMoved` or `IdsUsed`
    /// when the version check fails or an id it uses first was used before, and then the caller
    /// rolls back what was written.
    fn write(&self, tx: &Connection) -> rusqlite::Result<Written> {
        let new_version = if self.expected == 0 {
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO heads \
                     (session_id, version, snapshot, declared, agent_id, owner, wake_at, created_at, updated_at) \
                     SELECT ?1, 1, ?2, ?8, ?3, ?4, ?5, ?6, ?7 \
                     WHERE NOT EXISTS (SELECT 1 FROM disposed WHERE session_id = ?1) \
                     ON CONFLICT (session_id) DO NOTHING",
                )?
                .execute(params![
                    self.session_id,
                    self.snapshot,
                    self.agent_id,
                    self.owner,
                    self.wake_at,
                    self.created_at,
                    self.updated_at,
                    self.declared
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
        if let Some((owner, limit)) = &self.counted {
            // Counted in the creating commit's transaction: exact, whoever creates at once.
            let limit = limit.map_or(i64::MAX, to_i64);
            let counted = tx
                .prepare_cached(
                    "INSERT INTO owners (owner, sessions) SELECT ?1, 1 WHERE ?2 > 0 \
                     ON CONFLICT (owner) DO UPDATE SET sessions = sessions + 1 WHERE sessions < ?2",
                )?
                .execute(params![owner, limit])?;
            if counted == 0 {
                return Ok(Written::OwnerFull(owner.clone(), to_u64(limit)));
            }
        }
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
                // The caller rolls the head update back with the savepoint.
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
            let mut insert = tx.prepare_cached(
                "INSERT INTO versions (session_id, seq, kind, anchor) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for v in &self.versions {
                insert.execute(params![
                    self.session_id,
                    to_i64(v.seq),
                    v.kind.as_str(),
                    v.anchor.as_deref()
                ])?;
            }
        }
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

/// Where each version of the session's state and agent config applies from, in log order.
fn read_versions(conn: &Connection, session_id: &str) -> Result<Vec<VersionEntry>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, kind, anchor FROM versions WHERE session_id = ?1 ORDER BY seq")
        .map_err(backend)?;
    let mut rows = stmt.query([session_id]).map_err(backend)?;
    let mut entries = Vec::new();
    while let Some(row) = rows.next().map_err(backend)? {
        let seq: i64 = row.get(0).map_err(backend)?;
        let kind: String = row.get(1).map_err(backend)?;
        let anchor: Option<String> = row.get(2).map_err(backend)?;
        let kind = VersionKind::parse(&kind)
            .ok_or_else(|| corrupt(session_id, format!("version {seq} is of kind {kind:?}")))?;
        entries.push(VersionEntry { kind, seq: to_u64(seq), anchor: anchor.map(Into::into) });
    }
    Ok(entries)
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
            .prepare_cached("SELECT version, snapshot, declared FROM heads WHERE session_id = ?1")
            .map_err(backend)?;
        stmt.query_row([session_id], |row| {
            let version: i64 = row.get(0)?;
            let session = json_column::<Session>(row, 1, session_id, || "head snapshot".to_owned());
            let declared = match row.get_ref(2)? {
                ValueRef::Null => Ok(None),
                _ => json_column::<AgentConfig>(row, 2, session_id, || "declared agent config".to_owned())
                    .map(Some),
            };
            Ok((version, session, declared))
        })
        .optional()
        .map_err(backend)?
    };
    let Some((version, session, declared)) = head else { return Ok(None) };
    let mut session = session?;
    // The snapshot leaves the declared config out; rows written before hold it inline.
    session.restore_declared(declared?);
    if *session.id() != *session_id {
        return Err(corrupt(session_id, format!("the head holds session {:?}", session.id())));
    }
    let nodes = read_messages(&tx, session_id, from)?;
    session.restore_versions(read_versions(&tx, session_id)?).map_err(|e| corrupt(session_id, e))?;
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
    after: Option<&ListingCursor>,
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
        named.push((":created_at", &cursor.created_at.0));
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
        items.last().map(|last| ListingCursor::after(last).encode())
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
        let (reply, answer) = oneshot::channel();
        self.inner.writer.send(Job::Commit(Box::new(Pending { commit: prepared, reply }))).await?;
        answer.await.map_err(|_| StoreError::from(SqliteError::WriterStopped))?
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
        let after = ListingCursor::decode(cursor)?;
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

    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError> {
        let (id, now) = (session_id.to_owned(), self.inner.clock.now().0);
        // On the writer, between groups: a commit of the session lands wholly before or is
        // refused after (its version check finds no head).
        self.on_writer(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(backend)?;
            tx.execute(
                "UPDATE owners SET sessions = sessions - 1 \
                 WHERE owner = (SELECT owner FROM heads WHERE session_id = ?1) AND sessions > 0",
                params![id],
            )
            .map_err(backend)?;
            // The events, messages, versions and used ids follow by `ON DELETE CASCADE`.
            let deleted =
                tx.execute("DELETE FROM heads WHERE session_id = ?1", params![id]).map_err(backend)?;
            if deleted > 0 {
                tx.execute(
                    "INSERT INTO disposed (session_id, disposed_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                    params![id, now],
                )
                .map_err(backend)?;
            }
            tx.commit().map_err(backend)?;
            Ok(deleted > 0)
        })
        .await
    }

    /// A file-backed store holds its lock file; one in memory no other process can reach.
    fn exclusive(&self) -> bool {
        true
    }
}

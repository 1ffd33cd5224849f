//! The SQLite store's own failures; behind the `Store` port they travel as
//! `StoreError::Backend` with this error as the source.

use std::path::PathBuf;

use turnstone_runtime::store::StoreError;

/// What can go wrong opening or using the SQLite store.
#[derive(Debug, thiserror::Error)]
pub enum SqliteError {
    /// The database's directory could not be created.
    #[error("cannot create the store directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another process has the store open (its lock file is held): two processes writing one
    /// store would each serve stale reads from what they committed themselves.
    #[error("store {path} is open in another process (it holds {lock}); stop that one first")]
    InUse { path: PathBuf, lock: PathBuf },
    /// The store's lock file could not be opened or locked.
    #[error("cannot lock the store with {lock}: {source}")]
    Lock {
        lock: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// SQLite itself failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The file was written by a newer Turnstone.
    #[error(
        "store {path} has schema version {found}, newer than this build supports ({supported}); \
         run a newer Turnstone or point it at another file"
    )]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// The file has a schema version no Turnstone writes.
    #[error("store {path} has unknown schema version {found}; is it a Turnstone store?")]
    SchemaUnknown { path: PathBuf, found: i64 },
    /// The file system refused write-ahead logging (e.g. a network file system).
    #[error("the store needs WAL journaling, but SQLite chose journal mode {mode:?}")]
    NoWal { mode: String },
    /// The caller handed over a commit that contradicts itself.
    #[error("invalid commit for session {session_id}: {message}")]
    InvalidCommit {
        session_id: String,
        /// What does not add up.
        message: String,
    },
    /// A session could not be serialized.
    #[error("cannot serialize session {session_id}: {source}")]
    Serialize {
        session_id: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The store was shut down.
    #[error("the store is closed")]
    Closed,
    /// The writer thread could not be started.
    #[error("cannot start the store's writer thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The writer thread stopped (it panicked) before answering.
    #[error("the store's writer thread stopped before answering")]
    WriterStopped,
    /// The write transaction a commit shared with others failed: none of them was written.
    #[error(
        "the write transaction shared by {commits} commit(s) failed {step}: {message}; none of them was written"
    )]
    GroupFailed {
        /// How many commits the transaction carried.
        commits: usize,
        /// Where it failed, e.g. `committing its transaction`.
        step: String,
        /// SQLite's error.
        message: String,
    },
    /// A blocking store task panicked or was cancelled.
    #[error("a store task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

impl From<SqliteError> for StoreError {
    fn from(err: SqliteError) -> Self {
        StoreError::Backend(Box::new(err))
    }
}

/// A rusqlite error as a store error.
pub(crate) fn backend(err: rusqlite::Error) -> StoreError {
    SqliteError::Sqlite(err).into()
}

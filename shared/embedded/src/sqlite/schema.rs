//! The SQLite schema, the per-connection settings, and the schema version check.
//!
//! The database's `user_version` pragma holds the schema version. A new file is created at
//! [`SCHEMA_VERSION`]; a file at a newer version is refused (an older build must not write a
//! layout it does not know); future versions migrate forward from older ones here.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::SqliteError;

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: i64 = 5;

/// Version 1: heads (one row per session), the event log, and the message nodes.
///
/// - `heads.snapshot` is the session's JSON without its messages; `version` fences commits;
///   `wake_at` (ms since the epoch) is set only while the session has timed work, so its
///   partial index holds exactly the sessions the sweep may need.
/// - `events` and `messages` are append-only and keyed by (session, position): a session's log
///   and transcript are each one contiguous range of the primary key.
/// - The listing indexes end in `(created_at, session_id)`, the key cursors page by.
const SCHEMA_V1: &str = "
CREATE TABLE IF NOT EXISTS heads (
    session_id TEXT PRIMARY KEY NOT NULL,
    version    INTEGER NOT NULL CHECK (version > 0),
    snapshot   TEXT NOT NULL,
    agent_id   TEXT NOT NULL,
    owner      TEXT,
    wake_at    INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS heads_by_wake ON heads (wake_at, session_id) WHERE wake_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS heads_by_created ON heads (created_at, session_id);
CREATE INDEX IF NOT EXISTS heads_by_agent ON heads (agent_id, created_at, session_id);
CREATE INDEX IF NOT EXISTS heads_by_owner ON heads (owner, created_at, session_id);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL REFERENCES heads (session_id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL CHECK (seq > 0),
    name       TEXT NOT NULL,
    body       TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS messages (
    session_id TEXT NOT NULL REFERENCES heads (session_id) ON DELETE CASCADE,
    pos        INTEGER NOT NULL CHECK (pos >= 0),
    body       TEXT NOT NULL,
    PRIMARY KEY (session_id, pos)
);
";

/// Version 2: `used_ids`, every turn id and call id a session ever used, so idempotency has no
/// horizon although the head forgets old ids. A commit inserts the ids its events use first
/// and is refused if one is there already. Migrating from version 1 fills it from the log.
const SCHEMA_V2: &str = "
CREATE TABLE IF NOT EXISTS used_ids (
    session_id TEXT NOT NULL REFERENCES heads (session_id) ON DELETE CASCADE,
    kind       TEXT NOT NULL CHECK (kind IN ('turn', 'call')),
    id         TEXT NOT NULL,
    PRIMARY KEY (session_id, kind, id)
) WITHOUT ROWID;
";

/// Fills `used_ids` from a version 1 log: the ids of `turn.started`, `turn.queued`,
/// `turn.aliased` and `call.created` events.
const BACKFILL_V2: &str = "
INSERT OR IGNORE INTO used_ids (session_id, kind, id)
    SELECT session_id, 'turn', json_extract(body, '$.turn.id') FROM events
    WHERE name IN ('turn.started', 'turn.queued') AND json_extract(body, '$.turn.id') IS NOT NULL;
INSERT OR IGNORE INTO used_ids (session_id, kind, id)
    SELECT session_id, 'turn', json_extract(body, '$.alias') FROM events
    WHERE name = 'turn.aliased' AND json_extract(body, '$.alias') IS NOT NULL;
INSERT OR IGNORE INTO used_ids (session_id, kind, id)
    SELECT session_id, 'call', json_extract(body, '$.call.id') FROM events
    WHERE name = 'call.created' AND json_extract(body, '$.call.id') IS NOT NULL;
";

/// Version 3: `heads.declared`, the agent config the session was created with, written once by
/// the creating commit: the snapshot leaves it out (it never changes, and is most of an agent's
/// size), so every later commit writes a smaller head. Rows of older versions keep it inside
/// their snapshot until their session is created again (never): both read back the same.
const SCHEMA_V3: &str = "
ALTER TABLE heads ADD COLUMN declared TEXT;
";

/// Version 4: `disposed`, the ids of disposed sessions: their rows are deleted (the other
/// tables follow the head by `ON DELETE CASCADE`), and a creating commit of one of these ids
/// is refused, so a writer that loaded a session before it was disposed never writes into a
/// new session of the same name.
const SCHEMA_V4: &str = "
CREATE TABLE IF NOT EXISTS disposed (
    session_id  TEXT PRIMARY KEY NOT NULL,
    disposed_at INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Version 5 also: `owners`, how many sessions each owner has (created less disposed), counted
/// by the creating commit on the condition that it stays within `[limits] sessions_per_owner`,
/// so the quota is exact and costs no listing. Migrating fills it from the heads.
const BACKFILL_V5: &str = "
INSERT OR IGNORE INTO owners (owner, sessions)
    SELECT owner, count(*) FROM heads WHERE owner IS NOT NULL AND owner != '' GROUP BY owner;
";

/// Version 5: `versions`, where each version of a session's state and agent config applies
/// from (`anchor`, a message id; NULL: the root) and the log position of the event that wrote
/// it, so the head holds only the values it needs (see `turnstone_engine::session`'s
/// `versions`). Append-only, one row per `state.written` / `agent.written`. Heads of older
/// versions hold every version whole and keep them so: their versions need no rows.
const SCHEMA_V5: &str = "
CREATE TABLE IF NOT EXISTS versions (
    session_id TEXT NOT NULL REFERENCES heads (session_id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL CHECK (seq > 0),
    kind       TEXT NOT NULL CHECK (kind IN ('state', 'agent')),
    anchor     TEXT,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS owners (
    owner    TEXT PRIMARY KEY NOT NULL,
    sessions INTEGER NOT NULL CHECK (sessions >= 0)
) WITHOUT ROWID;
";

/// How many prepared statements each connection keeps (the store uses about a dozen).
const STATEMENT_CACHE: usize = 32;

/// The size (bytes) a checkpointed WAL file is truncated to.
const WAL_SIZE_LIMIT: i64 = 64 << 20;

/// Settings of the writer connection: WAL, the chosen `synchronous` level, foreign keys.
pub(crate) fn configure_writer(
    conn: &Connection,
    busy_timeout: Duration,
    sync_full: bool,
    file_backed: bool,
) -> Result<(), SqliteError> {
    conn.busy_timeout(busy_timeout)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    if file_backed {
        let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(SqliteError::NoWal { mode });
        }
    }
    conn.pragma_update(None, "synchronous", if sync_full { "FULL" } else { "NORMAL" })?;
    // After a checkpoint, a WAL that one large transaction grew is cut back to this size.
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    Ok(())
}

/// Settings of a read connection (reads only, so only the busy timeout and the cache matter).
pub(crate) fn configure_reader(conn: &Connection, busy_timeout: Duration) -> Result<(), SqliteError> {
    conn.busy_timeout(busy_timeout)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.pragma_update(None, "foreign_keys", true)?;
    Ok(())
}

/// Creates the schema in a new database, accepts the current one, refuses a newer one.
pub(crate) fn ensure(conn: &mut Connection, path: &Path) -> Result<(), SqliteError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    match found {
        SCHEMA_VERSION => {}
        0 => {
            tx.execute_batch(SCHEMA_V1)?;
            tx.execute_batch(SCHEMA_V2)?;
            tx.execute_batch(SCHEMA_V3)?;
            tx.execute_batch(SCHEMA_V4)?;
            tx.execute_batch(SCHEMA_V5)?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
            tracing::info!(path = %path.display(), version = SCHEMA_VERSION, "created the store schema");
        }
        older @ (1..=4) => {
            if older == 1 {
                tx.execute_batch(SCHEMA_V2)?;
                tx.execute_batch(BACKFILL_V2)?;
            }
            if older <= 2 {
                tx.execute_batch(SCHEMA_V3)?;
            }
            if older <= 3 {
                tx.execute_batch(SCHEMA_V4)?;
            }
            tx.execute_batch(SCHEMA_V5)?;
            tx.execute_batch(BACKFILL_V5)?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
            tracing::info!(path = %path.display(), from = older, to = SCHEMA_VERSION, "migrated the store schema");
        }
        newer if newer > SCHEMA_VERSION => {
            return Err(SqliteError::SchemaTooNew {
                path: path.to_owned(),
                found: newer,
                supported: SCHEMA_VERSION,
            });
        }
        other => return Err(SqliteError::SchemaUnknown { path: path.to_owned(), found: other }),
    }
    tx.commit()?;
    Ok(())
}

//! `SqliteStore` beyond the shared suite: file settings, schema versions, corrupt rows,
//! refused commits, and the read-after-position API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

use rusqlite::Connection;
use turnstone_embedded::sqlite::SCHEMA_VERSION;
use turnstone_embedded::{SqliteError, SqliteStore};
use turnstone_runtime::conformance::{Commits, Driver, T0, assert_stored};
use turnstone_runtime::store::{Commit, SessionFilter, Store, StoreError};

fn temp_store() -> (tempfile::TempDir, std::path::PathBuf, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path).unwrap();
    (dir, path, store)
}

/// A stored session with a couple of turns.
async fn stored(store: &SqliteStore, id: &str) -> Driver {
    let mut d = Driver::create(id, "agent", Some("owner"), false, T0);
    d.commit_ok(store).await;
    d.turn("hello", "hi");
    d.commit_ok(store).await;
    d
}

#[test]
fn the_file_runs_in_wal_mode_with_the_current_schema() {
    let (_dir, path, store) = temp_store();
    let raw = Connection::open(&path).unwrap();
    let mode: String = raw.pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    let version: i64 = raw.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(store.path(), path);
}

#[test]
fn open_creates_missing_directories() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a").join("b").join("store.db");
    SqliteStore::open(&path).unwrap();
    assert!(path.exists());
}

#[test]
fn a_newer_schema_is_refused_clearly() {
    let (_dir, path, store) = temp_store();
    drop(store);
    Connection::open(&path).unwrap().pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(err, SqliteError::SchemaTooNew { found, supported, .. } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION)
    );
    let text = err.to_string();
    assert!(text.contains("newer than this build supports"), "{text}");
    assert!(text.contains("store.db"), "{text}");
}

#[test]
fn a_file_that_is_not_sqlite_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    std::fs::write(&path, vec![b'x'; 8192]).unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(matches!(err, SqliteError::Sqlite(_)), "{err:?}");
}

#[tokio::test]
async fn reopening_keeps_the_data_and_the_schema() {
    let (_dir, path, store) = temp_store();
    let d = stored(&store, "s").await;
    drop(store);
    let store = SqliteStore::open(&path).unwrap();
    assert_stored(&store, &d).await;
}

#[tokio::test]
async fn a_corrupt_snapshot_is_reported_naming_the_session() {
    let (_dir, path, store) = temp_store();
    stored(&store, "broken").await;
    let raw = Connection::open(&path).unwrap();
    raw.execute("UPDATE heads SET snapshot = '{not json' WHERE session_id = 'broken'", []).unwrap();
    match store.load("broken").await {
        Err(StoreError::Corrupt { session_id, message }) => {
            assert_eq!(session_id, "broken");
            assert!(message.contains("snapshot"), "{message}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A snapshot of another session is corrupt too.
    stored(&store, "other").await;
    raw.execute(
        "UPDATE heads SET snapshot = (SELECT snapshot FROM heads WHERE session_id = 'other') \
         WHERE session_id = 'broken'",
        [],
    )
    .unwrap();
    assert!(matches!(store.load("broken").await, Err(StoreError::Corrupt { .. })));
    // Listing reads no JSON, so it still works.
    let page = store.list_sessions(&SessionFilter::default(), None, 10).await.unwrap();
    assert_eq!(page.items.len(), 2);
}

#[tokio::test]
async fn a_corrupt_message_or_event_is_reported_naming_the_session() {
    let (_dir, path, store) = temp_store();
    stored(&store, "s").await;
    let raw = Connection::open(&path).unwrap();
    raw.execute("UPDATE messages SET body = X'00FF' WHERE session_id = 's' AND pos = 1", []).unwrap();
    match store.load("s").await {
        Err(StoreError::Corrupt { session_id, message }) => {
            assert_eq!(session_id, "s");
            assert!(message.contains("message 1"), "{message}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    raw.execute("DELETE FROM messages WHERE session_id = 's' AND pos = 0", []).unwrap();
    match store.load("s").await {
        Err(StoreError::Corrupt { message, .. }) => assert!(message.contains("position 0"), "{message}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    raw.execute(
        "UPDATE events SET body = '{\"type\":\"no_such_event\"}' WHERE session_id = 's' AND seq = 3",
        [],
    )
    .unwrap();
    assert!(store.events_after("s", 0, 2).await.unwrap().len() == 2, "the events before it still read");
    match store.events_after("s", 0, 10).await {
        Err(StoreError::Corrupt { session_id, message }) => {
            assert_eq!(session_id, "s");
            assert!(message.contains("event 3"), "{message}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn a_self_contradicting_commit_is_refused_and_writes_nothing() {
    let (_dir, _path, store) = temp_store();
    let d = stored(&store, "s").await;
    let before = store.stats();
    // The commit names another session than the one it carries.
    let commit = Commit { session: &d.session, events: &[], wake_at: None };
    let err = store.commit("not-s", 0, commit).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(err.to_string().contains("invalid commit"), "{err}");
    // More new events than the session ever applied.
    let mut log = d.log.clone();
    log.extend(d.log.iter().cloned());
    let commit = Commit { session: &d.session, events: &log, wake_at: None };
    assert!(matches!(store.commit("s", d.version, commit).await, Err(StoreError::Backend(_))));
    assert!(store.load("not-s").await.unwrap().is_none());
    assert_stored(&store, &d).await;
    assert_eq!(store.stats().commits, before.commits);
}

#[tokio::test]
async fn events_whose_positions_exist_already_roll_the_whole_commit_back() {
    let (_dir, _path, store) = temp_store();
    let mut d = stored(&store, "s").await;
    // Pretend the last two commits' events are new again: the head would move, the events clash.
    let mut stale = d.clone();
    d.submit("next");
    let events = d.log[d.log.len() - 1 - d.uncommitted().len()..].to_vec();
    let commit = Commit { session: &d.session, events: &events, wake_at: None };
    let err = store.commit("s", d.version, commit).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    stale.version = d.version;
    assert_stored(&store, &stale).await;
}

#[tokio::test]
async fn messages_from_a_position_return_only_the_new_ones() {
    let (_dir, _path, store) = temp_store();
    let mut d = stored(&store, "s").await;
    d.turn("again", "again and again");
    d.commit_ok(&store).await;
    let all = store.messages_from("s", 0).await.unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(all.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(
        all.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>(),
        d.session.tree().nodes().cloned().collect::<Vec<_>>()
    );
    let tail = store.messages_from("s", 2).await.unwrap();
    assert_eq!(tail.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [2, 3]);
    assert!(store.messages_from("s", 4).await.unwrap().is_empty());
    assert!(store.messages_from("missing", 0).await.unwrap().is_empty());
}

#[tokio::test]
async fn stats_count_commits_conflicts_and_bytes() {
    let (_dir, _path, store) = temp_store();
    let d = stored(&store, "s").await;
    let stats = store.stats();
    assert_eq!(stats.commits, 2);
    assert_eq!(stats.conflicts, 0);
    assert!(stats.payload_bytes > 1000, "{stats:?}");
    let commit = Commit { session: &d.session, events: &[], wake_at: None };
    assert!(store.commit("s", 1, commit).await.is_err());
    assert_eq!(store.stats().conflicts, 1);
}

#[tokio::test]
async fn a_garbage_cursor_is_refused_and_a_real_one_is_accepted() {
    let (_dir, _path, store) = temp_store();
    for i in 0..3 {
        let mut d = Driver::create(&format!("s{i}"), "agent", None, false, T0.plus_ms(i));
        d.commit_ok(&store).await;
    }
    let filter = SessionFilter::default();
    let page = store.list_sessions(&filter, None, 2).await.unwrap();
    assert_eq!(page.items.iter().map(|s| s.session_id.as_str()).collect::<Vec<_>>(), ["s2", "s1"]);
    let cursor = page.next_cursor.unwrap();
    let page = store.list_sessions(&filter, Some(&cursor), 2).await.unwrap();
    assert_eq!(page.items.iter().map(|s| s.session_id.as_str()).collect::<Vec<_>>(), ["s0"]);
    assert_eq!(page.next_cursor, None);
    for garbage in ["v1.", "v1.x.73", "v9.1.73", &cursor[..cursor.len() - 1], "garbage"] {
        assert!(
            matches!(store.list_sessions(&filter, Some(garbage), 2).await, Err(StoreError::InvalidCursor)),
            "{garbage:?}"
        );
    }
    // A limit of 0 still returns a page that can go on.
    let page = store.list_sessions(&filter, None, 0).await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert!(page.next_cursor.is_some());
}

/// A version 1 file (no `used_ids`) is migrated on open: the ids its log used are filled in,
/// so idempotency keeps holding for sessions written before.
#[tokio::test]
async fn a_version_1_file_is_migrated_and_its_used_ids_filled_from_the_log() {
    use turnstone_engine::session::UsedId;
    let (_dir, path, store) = temp_store();
    let d = stored(&store, "s-v1").await;
    let first_used: Vec<UsedId> = UsedId::first_used_by(&d.log);
    assert!(first_used.len() >= 2, "a turn and its model call: {first_used:?}");
    drop(store);
    let raw = Connection::open(&path).unwrap();
    raw.execute_batch("DROP TABLE used_ids").unwrap();
    raw.pragma_update(None, "user_version", 1).unwrap();
    drop(raw);

    let store = SqliteStore::open(&path).unwrap();
    let raw = Connection::open(&path).unwrap();
    let version: i64 = raw.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let mut probe = first_used.clone();
    probe.push(UsedId::Turn("never".into()));
    assert_eq!(store.used_ids("s-v1", &probe).await.unwrap(), first_used);
    assert_stored(&store, &d).await;
}

//! `SqliteStore` beyond the shared suite: file settings, schema versions, corrupt rows,
//! refused commits, and the read-after-position API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

use std::sync::Arc;

use rusqlite::Connection;
use turnstone_embedded::sqlite::SCHEMA_VERSION;
use turnstone_embedded::{Durability, SqliteError, SqliteOptions, SqliteStore};
use turnstone_runtime::clock::SystemClock;
use turnstone_runtime::conformance::{Commits, Driver, T0, assert_log, assert_stored};
use turnstone_runtime::store::{Commit, SessionFilter, Store, StoreError};

/// A commit of `events` with no wake time and no owner limit.
fn unannounced<'a>(
    session: &'a turnstone_engine::session::Session,
    events: &'a [turnstone_engine::session::Event],
) -> Commit<'a> {
    Commit { session, events, wake_at: None, wake_queued: false, sessions_per_owner: None }
}

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
    let commit = unannounced(&d.session, &[]);
    let err = store.commit("not-s", 0, commit).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(err.to_string().contains("invalid commit"), "{err}");
    // More new events than the session ever applied.
    let mut log = d.log.clone();
    log.extend(d.log.iter().cloned());
    let commit = unannounced(&d.session, &log);
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
    let commit = unannounced(&d.session, &events);
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
    let commit = unannounced(&d.session, &[]);
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
    // A version 1 file: no used ids, and the declared config inside the snapshot.
    let raw = Connection::open(&path).unwrap();
    raw.execute_batch(
        "DROP TABLE used_ids;
         UPDATE heads SET snapshot = json_set(snapshot, '$.init.declared', json(declared));
         ALTER TABLE heads DROP COLUMN declared;",
    )
    .unwrap();
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

#[tokio::test]
async fn the_declared_config_is_written_once_and_kept_out_of_the_head() {
    let (_dir, path, store) = temp_store();
    let d = stored(&store, "s-declared").await;
    let raw = Connection::open(&path).unwrap();
    let (snapshot, declared): (String, Option<String>) = raw
        .query_row("SELECT snapshot, declared FROM heads WHERE session_id = 's-declared'", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert!(!snapshot.contains("test-model"), "the head leaves the config out: {snapshot}");
    assert!(declared.is_some_and(|d| d.contains("test-model")), "the creating commit wrote it");
    assert_stored(&store, &d).await;
    assert!(store.load("s-declared").await.unwrap().unwrap().session.declared().is_some());
}

fn store_at(dir: &tempfile::TempDir, durability: Durability) -> SqliteStore {
    let options = SqliteOptions { durability, ..SqliteOptions::default() };
    SqliteStore::open_with(dir.path().join("store.db"), options, Arc::new(SystemClock)).unwrap()
}

#[tokio::test]
async fn full_durability_is_the_default_and_runs_synchronous_full() {
    assert_eq!(SqliteOptions::default().durability, Durability::Full);
    let (_dir, _path, store) = temp_store();
    assert_eq!(store.durability(), Durability::Full);
    assert_eq!(store.synchronous().await.unwrap(), 2, "PRAGMA synchronous = FULL on the writer");
    let dir = tempfile::tempdir().unwrap();
    let store = store_at(&dir, Durability::Process);
    assert_eq!(store.synchronous().await.unwrap(), 1, "PRAGMA synchronous = NORMAL on the writer");
    let stats = store.group_stats();
    stored(&store, "s").await;
    let after = store.group_stats();
    assert_eq!(after.commits - stats.commits, 2);
    assert_eq!(after.syncs, 0, "no fsync per transaction at process durability");
}

/// A commit's answer comes only after its group's transaction committed: another connection
/// sees what it wrote as soon as `commit` returns, for sessions committing at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_returns_after_its_transaction_committed() {
    let (_dir, path, store) = temp_store();
    let before = store.group_stats();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (store, path) = (store.clone(), path.clone());
            tokio::spawn(async move {
                let raw = Connection::open(&path).unwrap();
                let id = format!("seen-{i}");
                let mut d = Driver::create(id.as_str(), "agent", None, false, T0);
                let mut call = None;
                for step in 0..7 {
                    // Create, then turns of three commits: the message, the claim, the reply.
                    match (step % 3, call.take()) {
                        (0, Some(claimed)) => {
                            d.finish_llm(claimed, "a reply");
                        }
                        (1, _) => {
                            d.submit(&format!("message {step}"));
                        }
                        (2, _) => call = Some(d.claim_llm()),
                        _ => {}
                    }
                    let version = d.commit(&store).await.unwrap();
                    let seen: i64 = raw
                        .query_row("SELECT version FROM heads WHERE session_id = ?1", [&id], |r| r.get(0))
                        .unwrap();
                    assert_eq!(seen as u64, version, "{id}: another connection sees the commit");
                    let events: i64 = raw
                        .query_row("SELECT count(*) FROM events WHERE session_id = ?1", [&id], |r| r.get(0))
                        .unwrap();
                    assert_eq!(events as u64, d.session.events_applied(), "{id}: and its events");
                }
                d
            })
        })
        .collect();
    for task in tasks {
        let d = task.await.unwrap();
        assert_stored(&store, &d).await;
    }
    let after = store.group_stats();
    assert_eq!(after.commits - before.commits, 16 * 7);
    assert!(after.groups - before.groups <= 16 * 7);
    assert_eq!(after.syncs, after.groups, "one fsync per transaction at full durability");
}

/// Commits of many sessions queued together share one transaction; each keeps its own checks:
/// a stale one and one that fails on a constraint fail alone and write nothing, the others land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_are_grouped_and_fail_alone() {
    const SESSIONS: usize = 40;
    let (_dir, path, store) = temp_store();
    let mut drivers = Vec::new();
    for i in 0..SESSIONS {
        let mut d = Driver::create(format!("g{i}").as_str(), "agent", None, false, T0);
        d.commit_ok(&store).await;
        drivers.push(d);
    }
    let clash_base = stored(&store, "clash").await;
    let before = store.group_stats();

    // Another connection holds the write lock, so the commits pile up behind the writer.
    let raw = Connection::open(&path).unwrap();
    raw.execute_batch("BEGIN IMMEDIATE").unwrap();

    let mut tasks = Vec::new();
    for mut d in drivers.clone() {
        let store = store.clone();
        d.submit("grouped");
        tasks.push(tokio::spawn(async move {
            let result = d.commit(&store).await;
            (d, result)
        }));
    }
    // A create of a session that exists: a version conflict.
    let stale = {
        let store = store.clone();
        let mut d = Driver::create("g7", "agent", None, false, T0.plus_ms(1));
        tokio::spawn(async move { d.commit(&store).await })
    };
    // Events at positions that exist already: a constraint error of this commit alone.
    let clash = {
        let store = store.clone();
        let mut d = clash_base.clone();
        d.submit("next");
        tokio::spawn(async move {
            let events = d.log[d.log.len() - 1 - d.uncommitted().len()..].to_vec();
            let commit = unannounced(&d.session, &events);
            store.commit("clash", d.version, commit).await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    raw.execute_batch("COMMIT").unwrap();

    for (i, task) in tasks.into_iter().enumerate() {
        let (d, result) = task.await.unwrap();
        assert_eq!(result.unwrap(), 2, "g{i} lands");
        drivers[i] = d;
    }
    match stale.await.unwrap() {
        Err(StoreError::Conflict { session_id, expected }) => {
            assert_eq!((session_id.as_str(), expected), ("g7", 0))
        }
        other => panic!("the stale create must conflict, got {other:?}"),
    }
    let err = clash.await.unwrap().unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(!err.to_string().contains("shared by"), "the clash fails alone, not its group: {err}");

    let after = store.group_stats();
    let (commits, groups) = (after.commits - before.commits, after.groups - before.groups);
    assert_eq!(commits, SESSIONS as u64 + 2);
    assert!(groups <= 2, "{commits} commits queued together took {groups} transactions");
    for d in &drivers {
        assert_stored(&store, d).await;
        assert_log(&store, d, 100).await;
    }
    assert_stored(&store, &clash_base).await;
    assert_log(&store, &clash_base, 100).await;
}

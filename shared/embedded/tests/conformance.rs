//! The runtime's conformance suite against `SqliteStore` on a real file and `MemoryQueue`, plus
//! durability across a reopen and a kill -9, and concurrent committers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use turnstone_embedded::{Durability, MemoryQueue, MemoryStore, SqliteOptions, SqliteStore};
use turnstone_engine::session::Session;
use turnstone_runtime::clock::SystemClock;
use turnstone_runtime::conformance::{
    self, Commits, Driver, QueueSuite, T0, all_events, assert_log, assert_stored,
};
use turnstone_runtime::store::{Store, StoreError};

fn store() -> (TempDir, SqliteStore) {
    store_at(Durability::Full)
}

fn store_at(durability: Durability) -> (TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions { durability, ..SqliteOptions::default() };
    let store =
        SqliteStore::open_with(dir.path().join("turnstone.db"), options, Arc::new(SystemClock)).unwrap();
    assert_eq!(store.durability(), durability);
    (dir, store)
}

/// The store cases, each its own test, at one durability level.
macro_rules! store_cases {
    ($level:ident, $durability:expr) => {
        mod $level {
            use super::*;

            #[tokio::test]
            async fn store_used_ids_are_kept_for_good() {
                let (_dir, store) = store_at($durability);
                conformance::store_used_ids_are_kept_for_good(&store).await;
            }

            #[tokio::test]
            async fn store_round_trip() {
                let (_dir, store) = store_at($durability);
                conformance::store_round_trip(&store).await;
            }

            #[tokio::test]
            async fn store_create_conflicts() {
                let (_dir, store) = store_at($durability);
                conformance::store_create_conflicts(&store).await;
            }

            #[tokio::test]
            async fn store_stale_commit_writes_nothing() {
                let (_dir, store) = store_at($durability);
                conformance::store_stale_commit_writes_nothing(&store).await;
            }

            #[tokio::test]
            async fn store_events_after_pages() {
                let (_dir, store) = store_at($durability);
                conformance::store_events_after_pages(&store).await;
            }

            #[tokio::test]
            async fn store_list_sessions() {
                let (_dir, store) = store_at($durability);
                conformance::store_list_sessions(&store).await;
            }

            #[tokio::test]
            async fn store_due() {
                let (_dir, store) = store_at($durability);
                conformance::store_due(&store).await;
            }

            #[tokio::test]
            async fn store_large_session() {
                let (_dir, store) = store_at($durability);
                conformance::store_large_session(&store).await;
            }

            #[tokio::test]
            async fn store_long_lived_state() {
                let (_dir, store) = store_at($durability);
                conformance::store_long_lived_state(&store).await;
            }

            #[tokio::test]
            async fn store_owner_quota() {
                let (_dir, store) = store_at($durability);
                conformance::store_owner_quota(&store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn store_owner_quota_under_concurrency() {
                let (_dir, store) = store_at($durability);
                conformance::store_owner_quota_under_concurrency(&store).await;
            }

            #[tokio::test]
            async fn store_dispose() {
                let (_dir, store) = store_at($durability);
                conformance::store_dispose(&store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn whole_store_suite_on_one_file() {
                let (_dir, store) = store_at($durability);
                conformance::store_suite(&store).await;
            }
        }
    };
}

store_cases!(full, Durability::Full);
store_cases!(process, Durability::Process);

#[tokio::test]
async fn the_in_memory_store_conforms_too() {
    // The large case is left to the file-backed runs: it costs seconds and tests nothing new here.
    let store = SqliteStore::open_in_memory().unwrap();
    conformance::store_round_trip(&store).await;
    conformance::store_create_conflicts(&store).await;
    conformance::store_stale_commit_writes_nothing(&store).await;
    conformance::store_events_after_pages(&store).await;
    conformance::store_list_sessions(&store).await;
    conformance::store_due(&store).await;
    conformance::store_dispose(&store).await;
}

#[tokio::test]
async fn the_memory_store_conforms() {
    conformance::store_suite(&MemoryStore::new()).await;
    conformance::store_owner_quota_under_concurrency(&MemoryStore::new()).await;
}

const QUEUE: QueueSuite = QueueSuite {
    visibility_timeout: Duration::from_secs(30),
    delay: Duration::from_secs(2),
    coalesces: true,
};

fn queue() -> MemoryQueue {
    MemoryQueue::new(QUEUE.visibility_timeout)
}

#[tokio::test(start_paused = true)]
async fn queue_delay_respected() {
    conformance::queue_delay_respected(&queue(), QUEUE).await;
}

#[tokio::test(start_paused = true)]
async fn queue_duplicate_sends() {
    conformance::queue_duplicate_sends(&queue(), QUEUE).await;
}

#[tokio::test(start_paused = true)]
async fn queue_redelivers_without_ack() {
    conformance::queue_redelivers_without_ack(&queue(), QUEUE).await;
}

#[tokio::test(start_paused = true)]
async fn queue_no_redelivery_after_ack() {
    conformance::queue_no_redelivery_after_ack(&queue(), QUEUE).await;
}

#[tokio::test(start_paused = true)]
async fn whole_queue_suite_on_one_queue() {
    let queue = queue();
    conformance::queue_suite(&queue, QUEUE).await;
    assert_eq!(queue.sessions(), 0, "everything was acknowledged");
}

#[tokio::test(start_paused = true)]
async fn whole_queue_suite_with_a_short_visibility_timeout() {
    let suite =
        QueueSuite { visibility_timeout: Duration::from_secs(1), delay: Duration::from_secs(3), ..QUEUE };
    conformance::queue_suite(&MemoryQueue::new(suite.visibility_timeout), suite).await;
}

#[tokio::test]
async fn a_commit_survives_closing_and_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested").join("dir").join("turnstone.db");
    let mut d = Driver::create("durable", "agent", Some("owner"), false, T0);
    let call = {
        let store = SqliteStore::open(&path).unwrap();
        d.commit_ok(&store).await;
        d.turn("remember me", "I will");
        d.commit_ok(&store).await;
        d.submit("and this, in flight");
        let call = d.claim_llm();
        d.commit_ok(&store).await;
        call
    };
    let store = SqliteStore::open(&path).unwrap();
    assert_stored(&store, &d).await;
    assert_log(&store, &d, 100).await;
    assert_eq!(store.due(d.wake_at().unwrap(), 10).await.unwrap(), ["durable"], "the wake time is kept");
    // The log goes on from where it was.
    d.finish_llm(call, "done");
    d.commit_ok(&store).await;
    drop(store);
    let store = SqliteStore::open(&path).unwrap();
    assert_stored(&store, &d).await;
    assert_log(&store, &d, 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_committers_one_wins_one_conflicts() {
    let (_dir, store) = store();
    let store = Arc::new(store);
    let mut base = Driver::create("race", "agent", None, false, T0);
    base.commit_ok(store.as_ref()).await;
    for round in 0..25 {
        let mut a = base.clone();
        let mut b = base.clone();
        a.submit(&format!("a{round}"));
        b.submit(&format!("b{round}"));
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let race = |mut d: Driver| {
            let store = Arc::clone(&store);
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                let result = d.commit(store.as_ref()).await;
                (d, result)
            })
        };
        let (ta, tb) = (race(a), race(b));
        let (ra, rb) = (ta.await.unwrap(), tb.await.unwrap());
        let (winner, loser) = match (&ra.1, &rb.1) {
            (Ok(_), Err(_)) => (ra, rb),
            (Err(_), Ok(_)) => (rb, ra),
            other => panic!("round {round}: exactly one commit must win, got {other:?}"),
        };
        assert!(matches!(loser.1, Err(StoreError::Conflict { .. })), "round {round}: {:?}", loser.1);
        assert_eq!(winner.1.as_ref().ok(), Some(&(base.version + 1)));
        assert_stored(store.as_ref(), &winner.0).await;
        // The winner finishes its turn; the next round races from there.
        base = winner.0;
        let call = base.claim_llm();
        base.finish_llm(call, "ok");
        base.commit_ok(store.as_ref()).await;
    }
    assert_log(store.as_ref(), &base, 1000).await;
}

/// Kills the child process however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const KILL_DB_ENV: &str = "TURNSTONE_EMBEDDED_KILL_DB";

/// Run by [`a_kill_9_loses_no_acknowledged_commit`] in a child process: commits turns, printing
/// each version once `commit` returned, until killed (or, should the parent die, 3,000 commits).
#[tokio::test]
#[ignore = "the child process of a_kill_9_loses_no_acknowledged_commit"]
async fn kill_child_writer() {
    let Ok(path) = std::env::var(KILL_DB_ENV) else { return };
    let store = SqliteStore::open(path).unwrap();
    let mut d = Driver::create("killed", "agent", None, false, T0);
    d.commit_ok(&store).await;
    println!("committed {}", d.version);
    for i in 0..1000 {
        d.submit(&format!("message {i}"));
        d.commit_ok(&store).await;
        println!("committed {}", d.version);
        let call = d.claim_llm();
        d.commit_ok(&store).await;
        println!("committed {}", d.version);
        d.finish_llm(call, &format!("reply {i}"));
        d.commit_ok(&store).await;
        println!("committed {}", d.version);
    }
}

#[tokio::test]
async fn a_kill_9_loses_no_acknowledged_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.db");
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["kill_child_writer", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(KILL_DB_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut acknowledged = 0_u64;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(v) = line.strip_prefix("committed ") {
            acknowledged = v.trim().parse().unwrap();
            if acknowledged >= 200 {
                break;
            }
        }
    }
    child.0.kill().unwrap(); // SIGKILL: no destructor, no checkpoint, mid-transaction
    child.0.wait().unwrap();
    assert!(acknowledged >= 200, "the child stopped early at version {acknowledged}");

    let store = SqliteStore::open(&path).unwrap();
    let loaded = store.load("killed").await.unwrap().expect("the session survives");
    assert!(loaded.version >= acknowledged, "version {} < acknowledged {acknowledged}", loaded.version);
    // The head, the log and the messages are one consistent commit.
    let log = all_events(&store, "killed", 500).await;
    assert_eq!(log.len() as u64, loaded.session.events_applied());
    let replayed = Session::replay("killed", log.iter().map(|e| &e.event));
    assert_eq!(replayed, loaded.session, "the head equals the replayed log");
}

//! The local host's app is its SQLite store's only writer: it serves loads from what it
//! committed itself, and a commit whose caller went away before its answer never leaves it
//! serving the state before that commit.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use turnstone_embedded::{MemoryQueue, SqliteError, SqliteStore};
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DraftMessage, TreeNode};
use turnstone_engine::session::{TurnStatus, UsedId};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::api::Placement;
use turnstone_runtime::app::App;
use turnstone_runtime::assemble::{self, Topology};
use turnstone_runtime::auth::Caller;
use turnstone_runtime::config::Config;
use turnstone_runtime::store::{
    Commit, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};

/// The SQLite store, counting its loads, whose commit answers can be held back after the
/// commit has landed (as when the caller's connection drops while it waits).
struct Instrumented {
    inner: SqliteStore,
    loads: AtomicUsize,
    hold_answers: AtomicBool,
}

#[async_trait]
impl Store for Instrumented {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        self.loads.fetch_add(1, Ordering::SeqCst);
        self.inner.load(session_id).await
    }

    async fn load_since(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Option<(Loaded, Vec<TreeNode>)>, StoreError> {
        self.loads.fetch_add(1, Ordering::SeqCst);
        self.inner.load_since(session_id, from).await
    }

    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
        self.inner.used_ids(session_id, ids).await
    }

    async fn commit(&self, session_id: &str, expected: u64, commit: Commit<'_>) -> Result<u64, StoreError> {
        let landed = self.inner.commit(session_id, expected, commit).await;
        if self.hold_answers.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        landed
    }

    async fn events_after(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        self.inner.events_after(session_id, after, limit).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        self.inner.list_sessions(filter, cursor, limit).await
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.due(now, limit).await
    }

    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError> {
        self.inner.dispose(session_id).await
    }

    fn exclusive(&self) -> bool {
        self.inner.exclusive()
    }
}

fn message(text: &str) -> ClientInput {
    ClientInput::Message(ClientMessageInput {
        agent_id: "demo".to_owned(),
        turn_id: None,
        message: DraftMessage::user(text),
        stream: None,
        client: None,
    })
}

/// The local host's app (the demo config, one process) over an instrumented store in `dir`.
/// No queue worker runs, so a submitted turn stays at its claimed model call.
fn local_app(dir: &tempfile::TempDir) -> (Arc<App>, Arc<Instrumented>) {
    let inner = SqliteStore::open(dir.path().join("turnstone.sqlite")).unwrap();
    let store =
        Arc::new(Instrumented { inner, loads: AtomicUsize::new(0), hold_answers: AtomicBool::new(false) });
    let config = Config::demo().unwrap();
    let agents = assemble::agents(&config, &config.resolve_secrets(|_| None).unwrap()).unwrap();
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(60)));
    let engine = assemble::engine(&config, agents, store.clone(), queue, Topology::OneProcess).unwrap();
    (engine.app, store)
}

#[tokio::test]
async fn a_store_open_in_another_process_is_refused_until_it_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turnstone.sqlite");
    let store = SqliteStore::open(&path).unwrap();
    assert!(store.exclusive());
    // The lock is per open file, so a second open in this process meets it as another
    // process would.
    let err = SqliteStore::open(&path).expect_err("the store is open");
    assert!(matches!(&err, SqliteError::InUse { path: p, .. } if *p == path), "{err:?}");
    assert!(err.to_string().contains("is open in another process"), "{err}");
    drop(store);
    SqliteStore::open(&path).expect("once closed, the store opens again");
}

#[tokio::test]
async fn loads_after_its_own_commits_do_not_read_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (app, store) = local_app(&dir);
    let submitted = app.submit("s", message("first"), Placement::Start, &Caller::Anyone).await.unwrap();
    let turn_id = submitted.turn_id.expect("a turn");
    let loads = store.loads.load(Ordering::SeqCst);
    let session = app.session("s").await.unwrap();
    assert_eq!(session.turn(&turn_id).map(|t| t.status), Some(TurnStatus::Active));
    let queued = app.submit("s", message("second"), Placement::Queue, &Caller::Anyone).await.unwrap();
    assert!(queued.queued);
    assert_eq!(store.loads.load(Ordering::SeqCst), loads, "a read and a submit after this app's commits");
}

#[tokio::test]
async fn a_commit_whose_caller_went_away_is_not_hidden_by_the_state_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let (app, store) = local_app(&dir);
    app.submit("s", message("first"), Placement::Start, &Caller::Anyone).await.unwrap();
    store.hold_answers.store(true, Ordering::SeqCst);
    let gone = tokio::time::timeout(
        Duration::from_millis(200),
        app.submit("s", message("second"), Placement::Queue, &Caller::Anyone),
    )
    .await;
    assert!(gone.is_err(), "the caller gave up before the answer");
    store.hold_answers.store(false, Ordering::SeqCst);
    let loads = store.loads.load(Ordering::SeqCst);
    let session = app.session("s").await.unwrap();
    assert!(store.loads.load(Ordering::SeqCst) > loads, "the app no longer knows the newest state: it reads");
    let queued: Vec<_> = session.turns().filter(|t| t.status == TurnStatus::Queued).collect();
    assert_eq!(queued.len(), 1, "the commit landed, and a read shows it");
    // The next commit starts from the store and is remembered again.
    app.submit("s", message("third"), Placement::Queue, &Caller::Anyone).await.unwrap();
    let loads = store.loads.load(Ordering::SeqCst);
    let session = app.session("s").await.unwrap();
    assert_eq!(store.loads.load(Ordering::SeqCst), loads);
    assert_eq!(session.turns().filter(|t| t.status == TurnStatus::Queued).count(), 2);
}

//! What one plain turn costs the local host, counted (issue 42): a turn of the demo config's
//! engine-hosted agent on the scripted model, submitted and run as `turnstone serve` runs it
//! (SQLite store, in-process queue, the submit claiming the model call), counted at the store,
//! the notifier and the engine's snapshot serializer. Each count is exact: a change that adds a
//! load, a commit, an event, a serialization of the session or a notification fails here, and
//! the message says what a turn does now. Speed itself is the benchmark's
//! (`functions/local/examples/bench.rs`), which prints these counts beside CPU per turn.
//!
//! Alone in its test binary: the serialization count is the process's.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{broadcast, watch};
use turnstone_embedded::{MemoryQueue, SqliteStore};
use turnstone_engine::ids::{CallId, SessionId, TurnId};
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DraftMessage, StreamDelta};
use turnstone_engine::session::snapshot_serializations;
use turnstone_runtime::api::Placement;
use turnstone_runtime::assemble::{self, Topology};
use turnstone_runtime::auth::Caller;
use turnstone_runtime::clock::SystemClock;
use turnstone_runtime::config::Config;
use turnstone_runtime::error::Result;
use turnstone_runtime::notify::{Delta, Notifier, Progress, RootNotice};
use turnstone_runtime::observed::{ObservedStore, StoreCall, StoreObserver};
use turnstone_runtime::queue::Consumer;

/// The counts, over the whole run.
#[derive(Default)]
struct Counts {
    loads: AtomicU64,
    used_ids: AtomicU64,
    commits: AtomicU64,
    events: AtomicU64,
    event_bytes: AtomicU64,
    committed_notices: AtomicU64,
    root_notices: AtomicU64,
}

/// What one turn cost, from the counts' difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Turn {
    loads: u64,
    used_ids: u64,
    commits: u64,
    events: u64,
    event_bytes: u64,
    serializations: u64,
    committed_notices: u64,
    root_notices: u64,
}

impl Counts {
    fn now(&self) -> Turn {
        Turn {
            loads: self.loads.load(Ordering::SeqCst),
            used_ids: self.used_ids.load(Ordering::SeqCst),
            commits: self.commits.load(Ordering::SeqCst),
            events: self.events.load(Ordering::SeqCst),
            event_bytes: self.event_bytes.load(Ordering::SeqCst),
            serializations: snapshot_serializations(),
            committed_notices: self.committed_notices.load(Ordering::SeqCst),
            root_notices: self.root_notices.load(Ordering::SeqCst),
        }
    }
}

impl Turn {
    fn since(self, before: Turn) -> Turn {
        Turn {
            loads: self.loads - before.loads,
            used_ids: self.used_ids - before.used_ids,
            commits: self.commits - before.commits,
            events: self.events - before.events,
            event_bytes: self.event_bytes - before.event_bytes,
            serializations: self.serializations - before.serializations,
            committed_notices: self.committed_notices - before.committed_notices,
            root_notices: self.root_notices - before.root_notices,
        }
    }
}

/// The store's calls, counted.
struct CountingStore(Arc<Counts>);

#[async_trait]
impl StoreObserver for CountingStore {
    async fn before(&self, call: StoreCall<'_>) {
        let counts = &self.0;
        match call {
            StoreCall::Load(_) => counts.loads.fetch_add(1, Ordering::SeqCst),
            StoreCall::UsedIds(_) => counts.used_ids.fetch_add(1, Ordering::SeqCst),
            StoreCall::Commit(_, commit) => {
                counts.events.fetch_add(commit.events.len() as u64, Ordering::SeqCst);
                let bytes: usize = commit.events.iter().map(turnstone_engine::json_len).sum();
                counts.event_bytes.fetch_add(bytes as u64, Ordering::SeqCst);
                counts.commits.fetch_add(1, Ordering::SeqCst)
            }
            StoreCall::Other => 0,
        };
    }
}

/// The local host's notifier, counted.
struct CountingNotifier {
    inner: Arc<dyn Notifier>,
    counts: Arc<Counts>,
}

#[async_trait]
impl Notifier for CountingNotifier {
    fn committed(&self, session_id: &str, last_seq: u64, ended_turns: &[TurnId], shows_in_chat: bool) {
        self.counts.committed_notices.fetch_add(1, Ordering::SeqCst);
        self.inner.committed(session_id, last_seq, ended_turns, shows_in_chat);
    }
    fn delta(&self, session_id: &str, call_id: &CallId, delta: StreamDelta) {
        self.inner.delta(session_id, call_id, delta);
    }
    async fn progress(&self, session_id: &str) -> Result<watch::Receiver<Progress>> {
        self.inner.progress(session_id).await
    }
    fn deltas(&self, session_id: &str) -> broadcast::Receiver<Delta> {
        self.inner.deltas(session_id)
    }
    fn root(&self, notice: RootNotice) {
        self.counts.root_notices.fetch_add(1, Ordering::SeqCst);
        self.inner.root(notice);
    }
    fn hears_root(&self) -> bool {
        self.inner.hears_root()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_turn_costs_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(include_str!("../../runtime/src/demo.toml"), "demo.toml").unwrap();
    let secrets = config.resolve_secrets(|_| None).unwrap();
    let counts = Arc::new(Counts::default());
    let inner = SqliteStore::open(dir.path().join("turnstone.sqlite")).unwrap();
    let store = Arc::new(ObservedStore { inner, observer: CountingStore(Arc::clone(&counts)) });
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(30)));
    let agents = assemble::agents(&config, &secrets).unwrap();
    let wrap = {
        let counts = Arc::clone(&counts);
        move |inner| Arc::new(CountingNotifier { inner, counts }) as Arc<dyn Notifier>
    };
    let engine = assemble::engine_at(
        &config,
        agents,
        store,
        queue.clone(),
        Topology::OneProcess,
        wrap,
        Arc::new(SystemClock),
    )
    .unwrap();
    let session = SessionId::from("cost");
    let mut turns = Vec::new();
    for n in 1..=12 {
        let before = counts.now();
        let input = ClientInput::Message(ClientMessageInput {
            agent_id: "demo".into(),
            turn_id: Some(format!("t{n}").as_str().into()),
            message: DraftMessage::user(format!("hello {n}")),
            stream: None,
            client: None,
        });
        engine.app.submit(&session, input, Placement::Start, &Caller::Anyone).await.unwrap();
        // The dispatcher runs what the submit claimed, as a queue worker would.
        for delivery in queue.receive(10, Duration::from_millis(100)).await.unwrap() {
            engine.dispatcher.run(&delivery.wake_up).await.unwrap();
            queue.ack(&delivery).await.unwrap();
        }
        turns.push(counts.now().since(before));
        let state = engine.app.session(&session).await.unwrap();
        let turn = engine.app.turn_record(&state, &format!("t{n}").as_str().into()).await.unwrap();
        assert!(turn.is_some_and(|t| t.status.is_ended()), "turn {n} did not end");
    }
    // The first turn creates the session; every later one is alike (but for the digits of
    // its ids and message: `hello 10` is a byte longer than `hello 9`).
    let plain = turns[1];
    let alike = |t: &Turn| Turn { event_bytes: plain.event_bytes, ..*t } == plain;
    assert!(turns[2..].iter().all(alike), "turns differ: {turns:#?}");
    let expected = Turn {
        loads: 0,
        used_ids: 0,
        commits: 2,
        events: 8,
        event_bytes: plain.event_bytes,
        serializations: 2,
        committed_notices: 2,
        // Nobody follows the catalog: no root notice is built.
        root_notices: 0,
    };
    assert_eq!(plain, expected, "a plain turn now costs {plain:#?}");
    // What the events of a plain turn write.
    assert!(plain.event_bytes <= 1_500, "{plain:?}");
}

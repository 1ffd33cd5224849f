//! The Lambda topology in one process: an API app and a dispatcher app that share only the
//! store and the queue (as the `api` and `dispatch` functions do), never a notifier. Clients
//! talk to the API's router; the dispatcher's pool runs the sessions. Long-polls and event
//! streams must learn of the dispatcher's commits by following the store, `?wait` is cut at the
//! host's limit, and a turn costs one wake-up however many steps it takes.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use tempfile::TempDir;
use turnstone_embedded::MemoryQueue;
use turnstone_runtime::api::Turn;
use turnstone_runtime::assemble::{self, Topology};
use turnstone_runtime::config::Config;
use turnstone_runtime::http::{HttpConfig, router};
use turnstone_runtime::pool::Pool;
use turnstone_runtime::queue::{Consumer, Delivery, Queue, QueueError, WakeUp};
use turnstone_tests::{ApiClient, FakeWorker};

/// An in-process queue that counts what is sent to it, and keeps the delayed wake-ups.
struct CountingQueue {
    inner: MemoryQueue,
    sent: AtomicUsize,
    delayed: std::sync::Mutex<Vec<(WakeUp, Duration)>>,
}

#[async_trait]
impl Queue for CountingQueue {
    async fn send(&self, wake_up: WakeUp, delay: Duration) -> Result<(), QueueError> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        if delay > Duration::ZERO {
            self.delayed.lock().unwrap().push((wake_up.clone(), delay));
        }
        self.inner.send(wake_up, delay).await
    }
}

#[async_trait]
impl Consumer for CountingQueue {
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, QueueError> {
        self.inner.receive(max, wait).await
    }

    async fn ack(&self, delivery: &Delivery) -> Result<(), QueueError> {
        self.inner.ack(delivery).await
    }

    async fn close(&self) {
        Consumer::close(&self.inner).await;
    }
}

/// An API app and a dispatcher app over one store and queue (or, for [`Topology::OneProcess`],
/// one app that is both), the API served over HTTP.
struct Split {
    client: ApiClient,
    queue: Arc<CountingQueue>,
    pool: Option<Pool>,
    _dir: TempDir,
}

impl Split {
    async fn start(config_toml: &str, topology: Topology, max_wait: Duration) -> Split {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::parse(config_toml, "split.toml").unwrap();
        let secrets = config.resolve_secrets(|_| None).unwrap();
        let (store, _) = turnstone_embedded::open_local(&config, dir.path()).unwrap();
        let store: Arc<dyn turnstone_runtime::store::Store> = Arc::new(store);
        let queue = Arc::new(CountingQueue {
            inner: MemoryQueue::new(Duration::from_secs(30)),
            sent: AtomicUsize::new(0),
            delayed: std::sync::Mutex::default(),
        });
        let agents = assemble::agents(&config, &secrets).unwrap();
        let api =
            assemble::engine(&config, agents.clone(), Arc::clone(&store), queue.clone(), topology).unwrap();
        // Split: the dispatcher is another app, as another function is; one process: the API's.
        let dispatcher = match topology {
            Topology::Split => {
                assemble::engine(&config, agents, store, queue.clone(), topology).unwrap().dispatcher
            }
            Topology::OneProcess => Arc::clone(&api.dispatcher),
        };
        let pool = Pool::spawn(dispatcher, queue.clone(), 2);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let http = HttpConfig { max_wait, ..assemble::http(&config, &secrets) };
        tokio::spawn(async move { axum::serve(listener, router(api.app, http)).await });
        Split { client: ApiClient::new(url), queue, pool: Some(pool), _dir: dir }
    }

    fn sent(&self) -> usize {
        self.queue.sent.load(Ordering::SeqCst)
    }

    async fn stop(mut self) {
        if let Some(pool) = self.pool.take() {
            pool.shutdown().await;
        }
    }
}

const SCRIPTED: &str = r#"
[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"

[[agent.demo.tools]]
name = "confirm"
description = "Asks the user."
handler = "client"
input = { type = "object", properties = { question = { type = "string" } }, required = ["question"] }
"#;

fn message(agent: &str, text: &str) -> Value {
    json!({"type": "client.message", "agent_id": agent, "message": {"role": "user", "content": text}})
}

#[tokio::test]
async fn a_long_poll_on_the_api_learns_of_the_dispatchers_commits_from_the_store() {
    let split = Split::start(SCRIPTED, Topology::Split, Duration::from_secs(20)).await;
    let turn_id = split.client.submit_ok("s1", &message("demo", "hello there")).await;
    // One long-poll: the API's process never hears of the dispatcher's commits except by
    // following the store, so it returns early only if that works.
    let asked = Instant::now();
    let turn: Turn = split.client.get_ok(&format!("/v1/sessions/s1/turns/{turn_id}?wait=20")).await;
    assert!(turn.status.is_ended(), "{turn:?}");
    assert!(asked.elapsed() < Duration::from_secs(10), "the long-poll waited for its deadline");
    let messages = split.client.messages("s1").await;
    assert_eq!(messages.last().unwrap()["content"], "You said: hello there");

    // An event stream on the API follows the dispatcher's commits of the next turn too.
    let mut stream = split.client.stream("s1", None).await;
    let seen = stream.until(Duration::from_secs(10), |f| f.event == "turn.ended").await;
    let first_end = seen.iter().filter(|f| f.event == "turn.ended").count();
    assert_eq!(first_end, 1, "the log so far has one turn end");
    split.client.submit_ok("s1", &message("demo", "again")).await;
    let seen = stream.until(Duration::from_secs(10), |f| f.event == "turn.ended").await;
    assert!(
        seen.iter().any(|f| f.event == "turn.started"),
        "{:?}",
        seen.iter().map(|f| &f.event).collect::<Vec<_>>()
    );
    assert_eq!(seen.last().unwrap().event, "turn.ended");
    split.stop().await;
}

#[tokio::test]
async fn a_long_poll_is_cut_at_the_hosts_limit() {
    let split = Split::start(SCRIPTED, Topology::Split, Duration::from_secs(1)).await;
    let input = message("demo", "/tool confirm {\"question\": \"ok?\"}");
    let turn_id = split.client.submit_ok("s2", &input).await;
    // The turn waits for its client tool for good; a 60 s wait is cut to the host's 1 s.
    let asked = Instant::now();
    let turn: Turn = split.client.get_ok(&format!("/v1/sessions/s2/turns/{turn_id}?wait=60")).await;
    let waited = asked.elapsed();
    assert!(!turn.status.is_ended(), "{turn:?}");
    assert!(waited >= Duration::from_millis(900), "returned before the limit: {waited:?}");
    assert!(waited < Duration::from_secs(20), "not cut at the limit: {waited:?}");
    split.stop().await;
}

/// A worker agent whose turn takes many steps: a model call, two worker tools, a model call.
fn worker_agent(worker: &FakeWorker) -> String {
    format!(
        r#"
[llm.s]
type = "scripted"

[agent.calc]
model = "scripted"
llm = "s"
worker = "{}"

[[agent.calc.tools]]
name = "add"
description = "Adds."
input = {{ type = "object", properties = {{ a = {{ type = "number" }}, b = {{ type = "number" }} }}, required = ["a", "b"] }}
"#,
        worker.url()
    )
}

#[tokio::test]
async fn a_turn_of_many_steps_sends_one_wake_up() {
    let worker = FakeWorker::tools(None, |_, args| {
        Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)))
    })
    .await;
    let config = worker_agent(&worker);
    for topology in [Topology::Split, Topology::OneProcess] {
        let split = Split::start(&config, topology, Duration::from_secs(20)).await;
        let session = format!("calc-{topology:?}");
        for turn in 0..3 {
            let text =
                format!("/tool add {{\"a\": {turn}, \"b\": 1}}\n/tool add {{\"a\": 2, \"b\": {turn}}}");
            let turn_id = split.client.submit_ok(&session, &message("calc", &text)).await;
            let ended = split.client.wait_turn(&session, &turn_id).await;
            assert!(ended.status.is_ended(), "{ended:?}");
            let messages = split.client.messages(&session).await;
            assert_eq!(
                messages.last().unwrap()["content"],
                format!("add returned: {}\nadd returned: {}", turn + 1, turn + 2),
                "{topology:?}"
            );
            // The submit's commit (or its hand-off) sends one; the run's own commits none, and
            // a run that leaves nothing due later arms nothing.
            assert_eq!(split.sent(), turn + 1, "{topology:?}: wake-ups after turn {turn}");
        }
        let decisions = worker.records().len();
        assert!(decisions >= 4, "each turn is several worker decisions: {decisions}");
        split.stop().await;
    }
}

#[tokio::test]
async fn a_wake_up_whose_commit_never_lands_looks_again_later() {
    // A wake-up is sent before the commit it announces; a commit that then fails leaves a
    // wake-up that finds the session short of it. It waits a moment, then leaves one more
    // wake-up for later (a slow commit may still land) and ends.
    let split = Split::start(SCRIPTED, Topology::Split, Duration::from_secs(20)).await;
    let turn_id = split.client.submit_ok("s4", &message("demo", "hello")).await;
    let ended = split.client.wait_turn("s4", &turn_id).await;
    assert!(ended.status.is_ended(), "{ended:?}");
    let announced = WakeUp { seq: Some(10_000), ..WakeUp::new("s4", "commit") };
    split.queue.send(announced, Duration::ZERO).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let delayed = split.queue.delayed.lock().unwrap().clone();
        if let Some((wake_up, delay)) = delayed.iter().find(|(w, _)| w.reason == "late commit") {
            assert_eq!((wake_up.session_id.as_str(), wake_up.seq), ("s4", None));
            assert!(*delay > Duration::from_secs(30), "looks again after any commit in flight: {delay:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no later wake-up: {delayed:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    split.stop().await;
}

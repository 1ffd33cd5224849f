//! A local host running in the test's process, and a client for its HTTP API.
//!
//! [`TestHost::start`] parses a configuration (TOML text), opens a real [`SqliteStore`] file in
//! the given data directory, builds the [`App`] over it and a [`MemoryQueue`], and runs
//! [`turnstone_runtime::host::serve`] on `127.0.0.1:0`: the same wiring as `turnstone serve`.
//! With `TURNSTONE_TEST_BACKEND=aws` ([`BACKEND_ENV`]) it runs on a fresh DynamoDB table and
//! SQS queue of a moto server instead (`turnstone serve --backend aws`), so the same tests
//! check both backends.
//! Everything a test does to it goes through HTTP, with the [`ApiClient`] it derefs to:
//! [`ApiClient::submit`], [`ApiClient::wait_turn`], [`ApiClient::messages`],
//! [`ApiClient::events`], [`ApiClient::stream`] (the SSE log); [`TestHost::stop`] ends it
//! gracefully. An [`ApiClient`] also drives a host in another process (`turnstone serve`).

use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use turnstone_aws::QueueSettings;
use turnstone_runtime::api::{EventPage, LoggedEvent, SessionSummary, Submitted, Turn};
use turnstone_runtime::app::App;
use turnstone_runtime::assemble::{self, Topology};
use turnstone_runtime::config::Config;
use turnstone_runtime::host::Backing;
use turnstone_runtime::net::{self, SseEvent, SseStream};

use crate::topology::Deployed;
use crate::topology::template::Template;

/// Set to `aws` to run test hosts on DynamoDB and SQS (a moto server; see
/// `turnstone_aws::moto`) instead of the embedded store and queue; set to `topology` to run
/// them as the template's functions, each under its own IAM role ([`crate::topology`]).
pub const BACKEND_ENV: &str = "TURNSTONE_TEST_BACKEND";

/// How many queue workers the test host runs.
const WORKERS: usize = 4;
/// How long a graceful stop may take before the host is aborted.
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// A running local host.
pub struct TestHost {
    app: Arc<App>,
    client: ApiClient,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    /// On the topology: the stack, whose IAM refusals fail the test when it stops.
    deployed: Option<Deployed>,
}

impl TestHost {
    /// Starts a host for `config_toml` with its store in `data_dir`; secrets named by the
    /// configuration are read from the process environment.
    pub async fn start(config_toml: &str, data_dir: &Path) -> TestHost {
        TestHost::start_with_env(config_toml, data_dir, |name| std::env::var(name).ok()).await
    }

    /// Starts a host whose secrets come from `env` (name -> value) instead of the process
    /// environment, so tests never need to set environment variables.
    pub async fn start_with_env(
        config_toml: &str,
        data_dir: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> TestHost {
        if std::env::var(BACKEND_ENV).as_deref() == Ok("topology") {
            let template = Template::load().unwrap_or_else(|e| panic!("{e}"));
            let deployed =
                Deployed::start(config_toml, env, &template).await.unwrap_or_else(|e| panic!("{e}"));
            let client = ApiClient::new(deployed.url()).with_streams_at(deployed.stream_url());
            let app = Arc::clone(&deployed.app);
            return TestHost { app, client, shutdown: None, task: None, deployed: Some(deployed) };
        }
        let config =
            Config::parse(config_toml, "e2e.toml").unwrap_or_else(|e| panic!("bad test config: {e}"));
        let secrets = config.resolve_secrets(env).unwrap_or_else(|e| panic!("test secrets: {e}"));
        let backing = open_backend(&config, data_dir).await;
        let agents = assemble::agents(&config, &secrets).expect("assemble the agents");
        let engine = assemble::engine(&config, agents, backing.store, backing.queue, Topology::OneProcess)
            .expect("a worker client");
        let app = Arc::clone(&engine.app);
        let http_config = assemble::http(&config, &secrets);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the host");
        let addr = listener.local_addr().expect("the host's address");
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = rx.await;
        };
        let task = tokio::spawn(turnstone_runtime::host::serve(
            engine,
            backing.consumer,
            http_config,
            listener,
            WORKERS,
            shutdown,
        ));
        let client = ApiClient::new(format!("http://{addr}"));
        TestHost { app, client, shutdown: Some(tx), task: Some(task), deployed: None }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.client.url().to_owned()
    }

    /// Where an AHP client connects: the host's `ws://…/v1/ahp`, or on the topology the
    /// WebSocket API's stage (API Gateway in front of the ahp function).
    pub fn ahp_url(&self) -> String {
        match &self.deployed {
            Some(deployed) => deployed.ahp_url().to_owned(),
            None => format!("{}/v1/ahp", self.url().replacen("http://", "ws://", 1)),
        }
    }

    /// Whether the event stream carries the model's live token deltas: not on the topology,
    /// where the stream function serves only the durable log (the deltas are the dispatch
    /// function's, pushed to AHP subscribers; README "Deploy to AWS").
    pub fn streams_deltas(&self) -> bool {
        self.deployed.is_none()
    }

    /// Whether it runs as the template's functions (`TURNSTONE_TEST_BACKEND=topology`): there
    /// what a connection was sent is kept in the table, which a restart of the harness (a new
    /// stack) does not keep.
    pub fn is_deployed(&self) -> bool {
        self.deployed.is_some()
    }

    /// The app behind the API (for what HTTP does not show).
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Stops the host gracefully (HTTP first, then the queue workers); aborts it if that
    /// takes longer than 10 s.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(deployed) = &mut self.deployed {
            self.task = deployed.stop();
        }
        if let Some(mut task) = self.task.take() {
            match tokio::time::timeout(STOP_WITHIN, &mut task).await {
                Ok(result) => result.expect("the host task").expect("the host ended cleanly"),
                Err(_) => {
                    task.abort();
                    panic!("the host did not stop within {STOP_WITHIN:?}");
                }
            }
        }
        if let Some(deployed) = &self.deployed {
            let refused: Vec<_> = deployed.refused().into_iter().filter_map(|c| c.refused).collect();
            assert!(refused.is_empty(), "IAM refused calls the functions made:\n{}", refused.join("\n"));
        }
    }
}

/// The store and queue [`BACKEND_ENV`] asks for: the embedded ones in `data_dir`, or a fresh
/// table and queue on moto.
async fn open_backend(config: &Config, data_dir: &Path) -> Backing {
    match std::env::var(BACKEND_ENV).as_deref() {
        Ok("aws") => {
            use turnstone_aws::moto;
            let clients = moto::clients().await;
            let aws = moto::config(&moto::unique("e2e"), &moto::unique("e2e"));
            // Redelivery as quick as the local queue's; no dead-letter queue to fill.
            let settings = QueueSettings {
                visibility_timeout: Duration::from_secs(60),
                max_receive_count: None,
                ..QueueSettings::default()
            };
            let (store, queue) =
                aws.open(&clients, true, &settings).await.expect("a table and a queue on moto");
            Backing::new(store, queue)
        }
        Ok("local") | Err(_) => {
            let (store, queue) =
                turnstone_embedded::open_local(config, data_dir).expect("open the SQLite store");
            Backing::new(store, queue)
        }
        Ok(other) => panic!("{BACKEND_ENV}={other:?}: expected \"local\", \"aws\" or \"topology\""),
    }
}

impl Deref for TestHost {
    type Target = ApiClient;

    fn deref(&self) -> &ApiClient {
        &self.client
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A client for a Turnstone host's HTTP API, with the helpers the tests use.
#[derive(Debug, Clone)]
pub struct ApiClient {
    base: String,
    /// Where event streams are opened, when not at `base` (a deployed stack's `StreamUrl`).
    streams: Option<String>,
    http: reqwest::Client,
    /// Sent as `Authorization: Bearer <token>` with every request.
    token: Option<String>,
}

impl ApiClient {
    /// A client for the host at `base` (`http://host:port`, no trailing slash).
    pub fn new(base: impl Into<String>) -> Self {
        let http = net::client().expect("an HTTP client");
        ApiClient { base: base.into().trim_end_matches('/').to_owned(), streams: None, http, token: None }
    }

    /// The same client, opening event streams at `base` (as a client of a deployed stack does
    /// with its `StreamUrl`).
    pub fn with_streams_at(self, base: impl Into<String>) -> Self {
        ApiClient { streams: Some(base.into().trim_end_matches('/').to_owned()), ..self }
    }

    /// The same client, authenticating with `token` (an API key or a JWT).
    pub fn with_token(&self, token: impl Into<String>) -> Self {
        ApiClient { token: Some(token.into()), ..self.clone() }
    }

    /// A request to `path` (at the stream base for an event stream), with the token when there
    /// is one.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let base = match &self.streams {
            Some(streams) if path.split('?').next().is_some_and(|p| p.ends_with("/events/stream")) => streams,
            _ => &self.base,
        };
        let request = self.http.request(method, format!("{base}{path}"));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// The base URL, e.g. `http://127.0.0.1:8787`.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The underlying HTTP client.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `GET <path>`: the status and the body as JSON (`Null` when it is not JSON).
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self.request(reqwest::Method::GET, path).send().await.expect("GET");
        status_and_json(response).await
    }

    /// `DELETE <path>`: the status and the body as JSON.
    pub async fn delete(&self, path: &str) -> (u16, Value) {
        let response = self.request(reqwest::Method::DELETE, path).send().await.expect("DELETE");
        status_and_json(response).await
    }

    /// `POST <path>` with a raw body (sent as `application/json`).
    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let response = self
            .request(reqwest::Method::POST, path)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST");
        status_and_json(response).await
    }

    /// `POST <path>` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    /// Submits a `ClientInput` to `POST /v1/sessions/{session}/inputs`.
    pub async fn submit(&self, session: &str, input: &Value) -> (u16, Value) {
        self.post(&format!("/v1/sessions/{session}/inputs"), input).await
    }

    /// `GET <path>`, which must answer 200 with a `T`.
    pub async fn get_ok<T: DeserializeOwned>(&self, path: &str) -> T {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// Submits a `ClientInput` that must be accepted (202); returns its `turn_id`.
    pub async fn submit_ok(&self, session: &str, input: &Value) -> String {
        let (status, body) = self.submit(session, input).await;
        assert_eq!(status, 202, "submit {input} -> {body}");
        let submitted: Submitted = serde_json::from_value(body).expect("a submit answer");
        submitted.turn_id.map(String::from).unwrap_or_default()
    }

    /// Waits (long-polling `GET .../turns/{turn_id}?wait=30`) until the turn has ended;
    /// returns the turn record.
    pub async fn wait_turn(&self, session: &str, turn_id: &str) -> Turn {
        self.wait_turn_within(session, turn_id, Duration::from_secs(60)).await
    }

    /// The turn once it has ended, which it must within `patience`.
    pub async fn wait_turn_within(&self, session: &str, turn_id: &str, patience: Duration) -> Turn {
        let started = tokio::time::Instant::now();
        loop {
            let turn: Turn = self.get_ok(&format!("/v1/sessions/{session}/turns/{turn_id}?wait=20")).await;
            if turn.status.is_ended() {
                return turn;
            }
            assert!(started.elapsed() < patience, "turn {turn_id} never ended within {patience:?}: {turn:?}");
        }
    }

    /// `GET /v1/sessions/{session}`: the summary.
    pub async fn summary(&self, session: &str) -> SessionSummary {
        self.get_ok(&format!("/v1/sessions/{session}")).await
    }

    /// Polls the summary until `ready` holds (panics after `timeout`).
    pub async fn wait_summary(
        &self,
        session: &str,
        timeout: Duration,
        ready: impl Fn(&SessionSummary) -> bool,
    ) -> SessionSummary {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (status, body) = self.get(&format!("/v1/sessions/{session}")).await;
            if status == 200 {
                let summary: SessionSummary = serde_json::from_value(body.clone()).expect("a summary");
                if ready(&summary) {
                    return summary;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "session {session} never got there: {body}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Answers the client tool calls `call_1` to `call_<calls>` of `session` in turn, each with
    /// `result` once it is pending (panics after `timeout` waiting for one).
    pub async fn answer_client_calls(&self, session: &str, calls: usize, result: &str, timeout: Duration) {
        for step in 1..=calls {
            let call = format!("call_{step}");
            self.wait_summary(session, timeout, |s| {
                s.pending_client_calls.iter().any(|c| c.id.as_str() == call)
            })
            .await;
            let (status, body) = self
                .submit(session, &serde_json::json!({"type": "tool.result", "id": call, "result": result}))
                .await;
            assert_eq!(status, 202, "{body}");
        }
    }

    /// `GET /v1/sessions/{session}/messages`: the active path, every page of it.
    pub async fn messages(&self, session: &str) -> Vec<Value> {
        let pages = self.pages(&format!("/v1/sessions/{session}/messages")).await;
        pages.iter().flat_map(|page| page["messages"].as_array().cloned().unwrap_or_default()).collect()
    }

    /// The content of the last tool message on the session's active path.
    pub async fn last_tool_result(&self, session: &str) -> String {
        let messages = self.messages(session).await;
        let tool = messages.iter().rev().find(|m| m["role"] == "tool").expect("a tool message");
        tool["content"].as_str().unwrap_or_default().to_owned()
    }

    /// `GET /v1/sessions/{session}/messages?tree=1`: the whole message tree, every page of it
    /// (`{"nodes": [...], "head_id": ...}`).
    pub async fn message_tree(&self, session: &str) -> Value {
        let pages = self.pages(&format!("/v1/sessions/{session}/messages?tree=1")).await;
        let nodes: Vec<Value> =
            pages.iter().flat_map(|page| page["nodes"].as_array().cloned().unwrap_or_default()).collect();
        let mut tree = json!({ "nodes": nodes });
        if let Some(head) = pages.last().and_then(|p| p.get("head_id")) {
            tree["head_id"] = head.clone();
        }
        tree
    }

    /// Every page of `path`, following `next_after`.
    pub async fn pages(&self, path: &str) -> Vec<Value> {
        let mut pages: Vec<Value> = Vec::new();
        loop {
            let after = pages.last().and_then(|p| p["next_after"].as_str()).map(|a| format!("after={a}"));
            let page_path = match after {
                None => path.to_owned(),
                Some(after) if path.contains('?') => format!("{path}&{after}"),
                Some(after) => format!("{path}?{after}"),
            };
            let (status, body) = self.get(&page_path).await;
            assert_eq!(status, 200, "GET {page_path}: {body}");
            let last = body.get("next_after").is_none_or(Value::is_null);
            pages.push(body);
            if last {
                return pages;
            }
        }
    }

    /// Every durable event after `after`, paging through `GET .../events?after=`; the events
    /// are read as JSON (`{"type": ..}`), as the wire has them.
    pub async fn events(&self, session: &str, after: u64) -> Vec<LoggedEvent<Value>> {
        let mut all = Vec::new();
        let mut after = after;
        loop {
            let page: EventPage<Value> =
                self.get_ok(&format!("/v1/sessions/{session}/events?after={after}")).await;
            if page.events.is_empty() {
                return all;
            }
            after = page.next_after;
            all.extend(page.events);
        }
    }

    /// Opens `GET /v1/sessions/{session}/events/stream`, resuming after `last_event_id`.
    pub async fn stream(&self, session: &str, last_event_id: Option<u64>) -> EventStream {
        let mut request = self
            .request(reqwest::Method::GET, &format!("/v1/sessions/{session}/events/stream"))
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.expect("open the event stream");
        assert_eq!(response.status().as_u16(), 200, "event stream status");
        EventStream { events: SseStream::new(response, 32 << 20) }
    }
}

async fn status_and_json(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let bytes = response.bytes().await.expect("read the body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// One Server-Sent Event of the log stream.
pub type SseFrame = SseEvent;

/// What tests read of a frame.
pub trait FrameExt {
    /// The data as JSON (`Null` when it is not JSON).
    fn json(&self) -> Value;
}

impl FrameExt for SseEvent {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// An open event stream; dropping it closes the connection.
pub struct EventStream {
    events: SseStream,
}

impl EventStream {
    /// The next event (comments such as keep-alives are skipped); `None` when the stream
    /// ends or nothing arrives within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<SseFrame> {
        match tokio::time::timeout(timeout, self.events.next()).await {
            Ok(Some(Ok(frame))) => Some(frame),
            Ok(Some(Err(_)) | None) | Err(_) => None,
        }
    }

    /// Reads events until one satisfies `stop` (included); panics if the stream ends or
    /// stalls for `timeout` first.
    pub async fn until(&mut self, timeout: Duration, stop: impl Fn(&SseFrame) -> bool) -> Vec<SseFrame> {
        let mut frames = Vec::new();
        loop {
            let Some(frame) = self.next(timeout).await else {
                let names: Vec<&str> = frames.iter().map(|f: &SseFrame| f.event.as_str()).collect();
                panic!("the event stream ended or stalled before the expected event; got {names:?}");
            };
            let done = stop(&frame);
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }
}

//! A fake worker webhook: the customer's side of the decision protocol (seed 000).
//!
//! An axum server on `127.0.0.1:0` that receives `DecisionRequest` POSTs, checks the
//! `X-Turnstone-Signature` header with [`turnstone_runtime::worker::verify`] when it was given a
//! secret (a request that does not verify gets 401, as a real worker would answer), records
//! every request ([`WorkerRecord`]: the parsed request, the headers, the idempotency key,
//! whether it verified, when it arrived), and answers by a per-test script: a closure
//! `Fn(&DecisionRequest, delivery_no) -> FakeAnswer`, where `delivery_no` counts the deliveries
//! of that `decision_id` received so far, this one included (1 for the first).
//!
//! Ready-made scripts: [`FakeWorker::accept_all`] (answer every decision with its `proposed`
//! response) and [`FakeWorker::tools`] (the same, but answer `tool.execute` triggers whose
//! proposal is empty with a `tool.result` computed by a function of the tool's name and
//! arguments, or a `tool.error` when it returns `Err`).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use turnstone_engine::protocol::{
    Action, CallErrorAction, DecisionRequest, DecisionResponse, StreamDelta, ToolInput, ToolResultAction,
    Trigger, parse_slice,
};
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::worker::{DEFAULT_TOLERANCE_SECS, IDEMPOTENCY_KEY_HEADER, SIGNATURE_HEADER, verify};

/// A gate a held answer waits on until the test opens it (once open, it stays open).
#[derive(Debug, Clone, Default)]
pub struct Gate {
    open: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Gate::default()
    }

    /// Opens the gate: every waiter goes on, now and later.
    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Whether the gate is open.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// Waits until the gate is open.
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_open() {
                return;
            }
            notified.await;
        }
    }
}

/// How the fake worker answers one delivery.
#[derive(Debug, Clone)]
pub enum FakeAnswer {
    /// 200 with the request's `proposed` response as JSON.
    Accept,
    /// 200 with this response as JSON.
    Respond(DecisionResponse),
    /// 200 with this JSON, verbatim (for answers the protocol types cannot express).
    Json(Value),
    /// This status with this body (sent as `application/json`).
    Status(u16, String),
    /// Waits, then answers.
    Delay(Duration, Box<FakeAnswer>),
    /// Waits until the gate is open, then answers.
    Hold(Gate, Box<FakeAnswer>),
    /// 200, `Content-Type: application/json`, and these bytes (not a valid answer).
    Garbage(Vec<u8>),
    /// 200 `text/event-stream`: one `llm.token.delta` event per delta, each flushed on its own
    /// (with `pause` between them), then `decision.result` with the response.
    Sse { deltas: Vec<StreamDelta>, result: DecisionResponse, pause: Duration },
}

impl FakeAnswer {
    /// `answer` after `delay`.
    pub fn delayed(delay: Duration, answer: FakeAnswer) -> Self {
        FakeAnswer::Delay(delay, Box::new(answer))
    }

    /// `answer` once `gate` opens.
    pub fn held(gate: &Gate, answer: FakeAnswer) -> Self {
        FakeAnswer::Hold(gate.clone(), Box::new(answer))
    }

    /// A text-only stream: one delta per piece of `pieces`, then `result`.
    pub fn sse_text(pieces: &[&str], result: DecisionResponse, pause: Duration) -> Self {
        let deltas = pieces
            .iter()
            .map(|p| StreamDelta { text: Some((*p).to_owned()), ..StreamDelta::default() })
            .collect();
        FakeAnswer::Sse { deltas, result, pause }
    }
}

/// The script a fake worker answers by.
pub type Script = Arc<dyn Fn(&DecisionRequest, usize) -> FakeAnswer + Send + Sync>;

/// One delivery the fake worker received.
#[derive(Debug, Clone)]
pub struct WorkerRecord {
    /// The request, parsed.
    pub request: DecisionRequest,
    /// Every header.
    pub headers: HeaderMap,
    /// The `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
    /// Whether the signature verified: `None` when the worker has no secret.
    pub verified: Option<bool>,
    /// The deliveries of this decision so far, this one included.
    pub delivery_no: usize,
    /// When it arrived.
    pub received_at: Instant,
    /// When it arrived, by the wall clock (milliseconds since the epoch).
    pub received_at_ms: i64,
}

impl WorkerRecord {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    /// The trigger's type name (`tool.execute`, `llm.finished`...).
    pub fn trigger_name(&self) -> &'static str {
        self.request.trigger.name()
    }
}

struct Inner {
    secret: Option<Vec<u8>>,
    script: Script,
    records: Mutex<Vec<WorkerRecord>>,
    /// Bodies that were not a `DecisionRequest`, with the parse error.
    unparsed: Mutex<Vec<(Bytes, String)>>,
    deliveries: Mutex<HashMap<String, usize>>,
    /// Told after each recorded delivery.
    arrived: Notify,
}

/// A running fake worker; stops when dropped.
pub struct FakeWorker {
    addr: SocketAddr,
    inner: Arc<Inner>,
    task: JoinHandle<()>,
}

impl FakeWorker {
    /// Starts a worker answering by `script`; with `secret`, it verifies every signature.
    pub async fn start(
        secret: Option<&str>,
        script: impl Fn(&DecisionRequest, usize) -> FakeAnswer + Send + Sync + 'static,
    ) -> Self {
        let inner = Arc::new(Inner {
            secret: secret.map(|s| s.as_bytes().to_vec()),
            script: Arc::new(script),
            records: Mutex::new(Vec::new()),
            unparsed: Mutex::new(Vec::new()),
            deliveries: Mutex::new(HashMap::new()),
            arrived: Notify::new(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake worker");
        let addr = listener.local_addr().expect("the fake worker's address");
        // A worker is the customer's own server, with no size limit of the protocol's: this one
        // takes the decision requests of a long session (axum refuses bodies over 2 MB by
        // default; a 1,000-turn session's conversation passes that).
        let app = Router::new()
            .fallback(handle)
            .layer(axum::extract::DefaultBodyLimit::max(256 << 20))
            .with_state(inner.clone());
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeWorker { addr, inner, task }
    }

    /// A worker that accepts every proposal.
    pub async fn accept_all(secret: Option<&str>) -> Self {
        FakeWorker::start(secret, |_, _| FakeAnswer::Accept).await
    }

    /// A worker that accepts every proposal and executes tools with `execute(name, arguments)`.
    pub async fn tools(
        secret: Option<&str>,
        execute: impl Fn(&str, &Value) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        let execute = tools_script(execute);
        FakeWorker::start(secret, move |request, _| execute(request)).await
    }

    /// The webhook URL: `http://127.0.0.1:<port>/decide`.
    pub fn url(&self) -> String {
        format!("http://{}/decide", self.addr)
    }

    /// Every delivery received so far, in arrival order.
    pub fn records(&self) -> Vec<WorkerRecord> {
        self.inner.records.lock().unwrap().clone()
    }

    /// The deliveries of one decision, in arrival order.
    pub fn deliveries_of(&self, decision_id: &str) -> Vec<WorkerRecord> {
        self.records().into_iter().filter(|r| r.request.decision_id == decision_id).collect()
    }

    /// The trigger names of every delivery, in arrival order.
    pub fn trigger_names(&self) -> Vec<&'static str> {
        self.records().iter().map(WorkerRecord::trigger_name).collect()
    }

    /// Bodies that did not parse as a `DecisionRequest` (the parse errors).
    pub fn unparsed(&self) -> Vec<String> {
        self.inner.unparsed.lock().unwrap().iter().map(|(_, e)| e.clone()).collect()
    }

    /// Waits until a delivery matching `matches` has arrived (panics after `timeout`).
    pub async fn wait_for(&self, timeout: Duration, matches: impl Fn(&WorkerRecord) -> bool) -> WorkerRecord {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.arrived.notified();
            if let Some(found) = self.records().into_iter().find(|r| matches(r)) {
                return found;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "the fake worker saw no matching delivery within {timeout:?}: {:?}",
                    self.trigger_names()
                );
            }
        }
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The script of [`FakeWorker::tools`], to combine with others: accept the proposal, except
/// for a `tool.execute` the engine proposes nothing for (valid input, a declared tool), which
/// gets `execute(name, value)`'s result as `tool.result` (or its `Err` as a terminal
/// `tool.error`). `tool.result` carries no id or attempt: they come from the trigger.
pub fn tools_script(
    execute: impl Fn(&str, &Value) -> Result<Value, String> + Send + Sync + 'static,
) -> impl Fn(&DecisionRequest) -> FakeAnswer + Send + Sync + 'static {
    move |request| match &request.trigger {
        Trigger::ToolExecute(t) if request.proposed.is_empty() => {
            let args = match &t.input {
                ToolInput::Valid { value } | ToolInput::Invalid { value, .. } => value.clone(),
                ToolInput::Malformed { .. } => Value::Null,
            };
            FakeAnswer::Respond(tool_answer(execute(&t.name, &args)))
        }
        _ => FakeAnswer::Accept,
    }
}

/// A response with one `tool.result` (or terminal `tool.error`) answering the trigger.
pub fn tool_answer(outcome: Result<Value, String>) -> DecisionResponse {
    let action = match outcome {
        Ok(result) => Action::ToolResult(ToolResultAction { id: None, attempt: None, result }),
        Err(error) => Action::ToolError(CallErrorAction {
            id: None,
            attempt: None,
            error,
            retryable: Some(false),
            code: None,
            detail: None,
        }),
    };
    DecisionResponse { actions: Some(vec![action]), ..DecisionResponse::default() }
}

async fn handle(State(inner): State<Arc<Inner>>, headers: HeaderMap, raw: Bytes) -> Response {
    let verified = inner.secret.as_ref().map(|secret| {
        let signature = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let now_unix = SystemClock.now().0 / 1000;
        verify(secret, signature, &raw, now_unix, DEFAULT_TOLERANCE_SECS).is_ok()
    });
    let request = match parse_slice::<DecisionRequest>(&raw) {
        Ok(request) => request,
        Err(e) => {
            inner.unparsed.lock().unwrap().push((raw, e.to_string()));
            inner.arrived.notify_waiters();
            let body = json!({"error": {"message": format!("not a DecisionRequest: {e}")}});
            return json_response(StatusCode::BAD_REQUEST, body.to_string());
        }
    };
    let delivery_no = {
        let mut deliveries = inner.deliveries.lock().unwrap();
        let n = deliveries.entry(request.decision_id.to_string()).or_default();
        *n += 1;
        *n
    };
    let idempotency_key =
        headers.get(IDEMPOTENCY_KEY_HEADER).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let record = WorkerRecord {
        request: request.clone(),
        headers,
        idempotency_key,
        verified,
        delivery_no,
        received_at: Instant::now(),
        received_at_ms: SystemClock.now().0,
    };
    inner.records.lock().unwrap().push(record);
    inner.arrived.notify_waiters();
    if verified == Some(false) {
        let body = json!({"error": {"message": "signature does not verify"}});
        return json_response(StatusCode::UNAUTHORIZED, body.to_string());
    }
    let answer = (inner.script)(&request, delivery_no);
    answer_with(answer, &request).await
}

async fn answer_with(mut answer: FakeAnswer, request: &DecisionRequest) -> Response {
    loop {
        answer = match answer {
            FakeAnswer::Delay(delay, then) => {
                tokio::time::sleep(delay).await;
                *then
            }
            FakeAnswer::Hold(gate, then) => {
                gate.wait().await;
                *then
            }
            FakeAnswer::Accept => return decision_json(&request.proposed),
            FakeAnswer::Respond(response) => return decision_json(&response),
            FakeAnswer::Json(value) => return json_response(StatusCode::OK, value.to_string()),
            FakeAnswer::Status(status, body) => {
                let status = StatusCode::from_u16(status).expect("a valid status");
                return json_response(status, body);
            }
            FakeAnswer::Garbage(bytes) => {
                let mut response = Body::from(bytes).into_response();
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                return response;
            }
            FakeAnswer::Sse { deltas, result, pause } => return event_stream(deltas, result, pause),
        };
    }
}

fn decision_json(response: &DecisionResponse) -> Response {
    json_response(StatusCode::OK, serde_json::to_string(response).expect("a response serializes"))
}

fn json_response(status: StatusCode, body: String) -> Response {
    let mut response = Body::from(body).into_response();
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `llm.token.delta` events then `decision.result`, each its own chunk.
fn event_stream(deltas: Vec<StreamDelta>, result: DecisionResponse, pause: Duration) -> Response {
    let mut events: Vec<String> = deltas
        .iter()
        .map(|d| {
            let data = serde_json::to_string(d).expect("a delta serializes");
            format!("event: llm.token.delta\ndata: {data}\n\n")
        })
        .collect();
    let data = serde_json::to_string(&result).expect("a response serializes");
    events.push(format!("event: decision.result\ndata: {data}\n\n"));
    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(1);
    tokio::spawn(async move {
        for (i, event) in events.into_iter().enumerate() {
            if i > 0 && !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            if tx.send(Ok(Bytes::from(event))).await.is_err() {
                return;
            }
        }
    });
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

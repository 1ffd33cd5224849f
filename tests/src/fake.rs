//! The plumbing shared by the fake model servers: scripted replies, recorded requests, the
//! axum server, and event streams flushed one event at a time.
//!
//! A test queues [`Reply`]s with [`FakeServer::push`]; each request takes the next one (when
//! the queue is empty, the default reply, `Reply::text("ok")` unless
//! [`FakeServer::set_default`] changed it). Whether the answer is streamed follows the
//! request body's `stream` flag, as with the real servers. Stream faults count SSE events:
//! `cut_after(n)` sends `n` events then breaks the connection, `end_after(n)` ends the body
//! cleanly after `n`, `pause_after(n)` waits for [`FakeServer::release`] (or the
//! [`FakeServer::gate`] being notified) after `n`, `error_after(n, ..)` sends the provider's
//! error event after `n` and ends.
//!
//! Every request's input is counted in tokens the way the fake reports it in `usage` (see
//! [`fake_prompt_cache::tokens_of`](crate::fake_prompt_cache::tokens_of): each block of the
//! prompt a quarter of its JSON length, cached or not). With a context window set
//! ([`FakeServer::set_context_window`]) a request whose input, or input plus the output it asks
//! room for, exceeds the window is refused the way the provider refuses it, before it takes a
//! reply (the queue is untouched), and is recorded like any other.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use crate::fake_prompt_cache::{CacheUse, Prompt, PromptCache};

/// One tool call a scripted reply makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeToolCall {
    /// The call id (`call_...` for OpenAI, `toolu_...` for Anthropic, by convention).
    pub id: String,
    pub name: String,
    /// The argument string (a JSON object for Anthropic, which sends it parsed as `input`).
    pub arguments: String,
}

impl FakeToolCall {
    /// A tool call.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        FakeToolCall { id: id.into(), name: name.into(), arguments: arguments.into() }
    }
}

/// What a reply is.
#[derive(Debug, Clone)]
pub(crate) enum ReplyKind {
    /// A model answer: text and/or tool calls.
    Answer { text: Option<String>, calls: Vec<FakeToolCall> },
    /// An error status with the provider's JSON error body.
    Error { status: u16, kind: Option<String>, message: String },
    /// Any status, content type and body, verbatim.
    Raw { status: u16, content_type: String, body: String },
}

/// How a streamed reply goes wrong.
#[derive(Debug, Clone)]
pub(crate) enum StreamFault {
    Cut,
    End,
    Pause,
    Error { kind: String, message: String },
}

/// One scripted response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub(crate) kind: ReplyKind,
    pub(crate) model: Option<String>,
    pub(crate) finish: Option<String>,
    pub(crate) usage: Option<(u64, u64)>,
    pub(crate) delay: Option<Duration>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) fragment_chars: usize,
    pub(crate) fault: Option<(usize, StreamFault)>,
    /// What the request did with the fake's prompt cache, when the wire has one.
    pub(crate) cache: Option<CacheUse>,
    /// The request's input tokens as the fake counted them (set when a request takes the reply).
    pub(crate) input: Option<u64>,
}

impl Reply {
    fn of(kind: ReplyKind) -> Self {
        Reply {
            kind,
            model: None,
            finish: None,
            usage: None,
            delay: None,
            headers: Vec::new(),
            fragment_chars: 7,
            fault: None,
            cache: None,
            input: None,
        }
    }

    /// A text answer (streamed word by word).
    pub fn text(text: impl Into<String>) -> Self {
        Self::of(ReplyKind::Answer { text: Some(text.into()), calls: Vec::new() })
    }

    /// A text answer of `words` words (`word word ...`), each one output token: a default reply
    /// of a known size for long tests ([`FakeServer::set_default`] answers every request with it).
    pub fn filler(words: usize) -> Self {
        Self::text(vec!["word"; words].join(" "))
    }

    /// Tool calls, in parallel (streamed one after the other, arguments in fragments).
    pub fn tool_calls(calls: impl IntoIterator<Item = FakeToolCall>) -> Self {
        Self::of(ReplyKind::Answer { text: None, calls: calls.into_iter().collect() })
    }

    /// Text followed by tool calls.
    pub fn text_and_tool_calls(
        text: impl Into<String>,
        calls: impl IntoIterator<Item = FakeToolCall>,
    ) -> Self {
        Self::of(ReplyKind::Answer { text: Some(text.into()), calls: calls.into_iter().collect() })
    }

    /// An error status with the provider's error body, its type chosen by the status.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        Self::of(ReplyKind::Error { status, kind: None, message: message.into() })
    }

    /// An error status with the provider's error body of error type `kind`.
    pub fn error_of_type(status: u16, kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self::of(ReplyKind::Error { status, kind: Some(kind.into()), message: message.into() })
    }

    /// A response with any status, content type and body.
    pub fn raw(status: u16, content_type: impl Into<String>, body: impl Into<String>) -> Self {
        Self::of(ReplyKind::Raw { status, content_type: content_type.into(), body: body.into() })
    }

    /// Names `model` as the answering model (default: the request's).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// The provider's own finish/stop reason (default: `stop`/`tool_calls`, `end_turn`/`tool_use`).
    pub fn finish_reason(mut self, reason: impl Into<String>) -> Self {
        self.finish = Some(reason.into());
        self
    }

    /// The usage to report (default: the request's input tokens as the fake counts them, and
    /// one output token per word or argument fragment).
    pub fn usage(mut self, prompt: u64, completion: u64) -> Self {
        self.usage = Some((prompt, completion));
        self
    }

    /// Waits `delay` before answering at all.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Adds a response header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Splits streamed tool arguments into fragments of `chars` characters (default 7).
    pub fn fragment_chars(mut self, chars: usize) -> Self {
        self.fragment_chars = chars.max(1);
        self
    }

    /// Streams `events` SSE events, then breaks the connection.
    pub fn cut_after(mut self, events: usize) -> Self {
        self.fault = Some((events, StreamFault::Cut));
        self
    }

    /// Streams `events` SSE events, then ends the body cleanly (before the stream's real end).
    pub fn end_after(mut self, events: usize) -> Self {
        self.fault = Some((events, StreamFault::End));
        self
    }

    /// Streams `events` SSE events, then waits for [`FakeServer::release`] before the rest.
    pub fn pause_after(mut self, events: usize) -> Self {
        self.fault = Some((events, StreamFault::Pause));
        self
    }

    /// Streams `events` SSE events, then the provider's error event of type `kind`, and ends.
    pub fn error_after(mut self, events: usize, kind: impl Into<String>, message: impl Into<String>) -> Self {
        self.fault = Some((events, StreamFault::Error { kind: kind.into(), message: message.into() }));
        self
    }

    /// The text and tool calls of an answer (empty for errors and raw replies).
    pub(crate) fn answer(&self) -> (Option<&str>, &[FakeToolCall]) {
        match &self.kind {
            ReplyKind::Answer { text, calls } => (text.as_deref(), calls),
            _ => (None, &[]),
        }
    }

    /// The answering model: the reply's, else the request's, else `default`.
    pub(crate) fn model_for(&self, request: &Value, default: &str) -> String {
        self.model
            .clone()
            .or_else(|| request.get("model").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| default.to_owned())
    }

    /// `(prompt, completion)` tokens.
    pub(crate) fn tokens(&self) -> (u64, u64) {
        self.usage.unwrap_or_else(|| {
            let (text, calls) = self.answer();
            let words = text.map_or(0, |t| t.split_whitespace().count());
            let fragments: usize =
                calls.iter().map(|c| fragments(&c.arguments, self.fragment_chars).len() + 1).sum();
            (self.input.unwrap_or(12), (words + fragments) as u64)
        })
    }
}

/// `text` in pieces of at most `chars` characters (none for empty text).
pub(crate) fn fragments(text: &str, chars: usize) -> Vec<String> {
    let all: Vec<char> = text.chars().collect();
    all.chunks(chars.max(1)).map(|c| c.iter().collect()).collect()
}

/// `text` cut before each whitespace that follows a word: the pieces concatenate to `text`.
pub(crate) fn words(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    let mut prev_space = true;
    for c in text.chars() {
        if c.is_whitespace() && !prev_space && !current.is_empty() {
            pieces.push(std::mem::take(&mut current));
        }
        prev_space = c.is_whitespace();
        current.push(c);
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    /// Every header.
    pub headers: HeaderMap,
    /// The body parsed as JSON (`Null` when it is not JSON).
    pub body: Value,
    pub raw: Bytes,
}

impl Recorded {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }
}

/// What a format renders a reply into.
pub(crate) enum Rendered {
    /// A JSON body with a status.
    Json { status: u16, body: Value },
    /// An event stream: each string one complete SSE event.
    Events(Vec<String>),
    /// Anything, verbatim.
    Raw { status: u16, content_type: String, body: String },
}

/// A request that does not fit the context window (see [`FakeServer::set_context_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overflow {
    /// The input alone exceeds the window.
    Input { input: u64, window: u64 },
    /// The input fits, but not with the output the request asks room for.
    Output { input: u64, output: u64, window: u64 },
}

impl Overflow {
    /// How `input` tokens asking room for `output` more overflow `window`, if they do.
    pub(crate) fn of(input: u64, output: u64, window: u64) -> Option<Self> {
        if input > window {
            Some(Overflow::Input { input, window })
        } else if input.saturating_add(output) > window {
            Some(Overflow::Output { input, output, window })
        } else {
            None
        }
    }
}

/// A provider's wire format, as the fake server needs it.
pub(crate) struct Wire {
    /// Which provider, in messages.
    pub name: &'static str,
    /// The one path the provider answers.
    pub path: &'static str,
    /// The response header carrying a request id.
    pub request_id_header: &'static str,
    /// A reply (to the request body, as JSON) rendered; `serial` numbers the request.
    pub render: fn(&Reply, &Value, u64) -> Rendered,
    /// The error event a stream reports midway.
    pub stream_error: fn(&str, &str) -> String,
    /// The JSON error body of an error status.
    pub error_body: fn(u16, Option<&str>, &str) -> Value,
    /// Why the real API refuses this request body (answered 400, the reply queue untouched),
    /// or `None`.
    pub refuse: fn(&Value) -> Option<String>,
    /// The request as the fake counts its input tokens (blocks in the provider's order), and as
    /// the provider's prompt cache sees it when `caches`.
    pub prompt: fn(&Value) -> Prompt,
    /// Whether the provider's prompt cache serves the request (its usage reports what was read
    /// and written).
    pub caches: bool,
    /// The output tokens the request asks room for (its `max_tokens` or the like; 0 without).
    pub requested_output: fn(&Value) -> u64,
    /// The provider's 400 body refusing a request that overflows the context window.
    pub context_error: fn(&Overflow) -> Value,
}

struct Inner {
    wire: Wire,
    replies: Mutex<VecDeque<Reply>>,
    default: Mutex<Reply>,
    recorded: Mutex<Vec<Recorded>>,
    gate: Arc<Notify>,
    connections: AtomicUsize,
    cache: Mutex<(PromptCache, Vec<CacheUse>)>,
    /// The model's context window in tokens, if the fake enforces one.
    window: Mutex<Option<u64>>,
}

/// A running fake server; stops when dropped.
pub struct FakeServer {
    addr: SocketAddr,
    inner: Arc<Inner>,
    task: JoinHandle<()>,
}

impl FakeServer {
    /// Starts a server for `wire` on `127.0.0.1:0`, with `TCP_NODELAY` on every connection.
    pub(crate) async fn start(wire: Wire) -> Self {
        let inner = Arc::new(Inner {
            wire,
            replies: Mutex::new(VecDeque::new()),
            default: Mutex::new(Reply::text("ok")),
            recorded: Mutex::new(Vec::new()),
            gate: Arc::new(Notify::new()),
            connections: AtomicUsize::new(0),
            cache: Mutex::new((PromptCache::default(), Vec::new())),
            window: Mutex::new(None),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake server");
        let addr = listener.local_addr().expect("the fake server's address");
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let counter = inner.clone();
        let listener = listener.tap_io(move |tcp| {
            let _ = tcp.set_nodelay(true);
            counter.connections.fetch_add(1, Ordering::SeqCst);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeServer { addr, inner, task }
    }

    /// `http://127.0.0.1:<port>`, without any path.
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues the reply to the next request that has none yet.
    pub fn push(&self, reply: Reply) -> &Self {
        self.inner.replies.lock().unwrap().push_back(reply);
        self
    }

    /// The reply used when the queue is empty.
    pub fn set_default(&self, reply: Reply) {
        *self.inner.default.lock().unwrap() = reply;
    }

    /// Sets (or, with `None`, lifts) the model's context window in tokens: a request whose
    /// input tokens, or input plus requested output (`max_tokens` for Anthropic,
    /// `max_completion_tokens` or `max_tokens` for Chat Completions, `max_output_tokens` for
    /// Responses), exceed it is refused with the provider's 400. The input is counted as the
    /// fake reports it in `usage` (cached tokens included). Default: no window.
    pub fn set_context_window(&self, window: Option<u64>) {
        *self.inner.window.lock().unwrap() = window;
    }

    /// The context window the fake enforces, if any.
    pub fn context_window(&self) -> Option<u64> {
        *self.inner.window.lock().unwrap()
    }

    /// The input tokens the fake counts for request `body` (what its `usage` reports, cached
    /// tokens included, and what it holds against the context window).
    pub fn input_tokens(&self, body: &Value) -> u64 {
        (self.inner.wire.prompt)(body).tokens()
    }

    /// How many queued replies have not been used.
    pub fn pending_replies(&self) -> usize {
        self.inner.replies.lock().unwrap().len()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.recorded.lock().unwrap().clone()
    }

    /// How many requests arrived.
    pub fn request_count(&self) -> usize {
        self.inner.recorded.lock().unwrap().len()
    }

    /// The latest request; panics when there was none.
    pub fn last_request(&self) -> Recorded {
        self.inner.recorded.lock().unwrap().last().cloned().expect("the fake received no request")
    }

    /// How many TCP connections clients opened so far (to check connection reuse).
    pub fn connection_count(&self) -> usize {
        self.inner.connections.load(Ordering::SeqCst)
    }

    /// What each answered request did with the prompt cache, in order (empty for a provider
    /// without one).
    pub fn cache_uses(&self) -> Vec<CacheUse> {
        self.inner.cache.lock().unwrap().1.clone()
    }

    /// Lets a stream paused by [`Reply::pause_after`] go on (now, or as soon as it pauses).
    pub fn release(&self) {
        self.inner.gate.notify_one();
    }

    /// The gate paused streams wait on; `notify_one` it (from a delta callback, say) to release.
    pub fn gate(&self) -> Arc<Notify> {
        self.inner.gate.clone()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let serial = {
        let mut recorded = inner.recorded.lock().unwrap();
        recorded.push(Recorded {
            method: method.clone(),
            path: uri.path().to_owned(),
            headers,
            body: body.clone(),
            raw,
        });
        recorded.len() as u64
    };
    let wire = &inner.wire;
    if method != Method::POST || uri.path() != wire.path {
        let message = format!("{} fake: no route for {method} {}", wire.name, uri.path());
        return json_response(404, &(wire.error_body)(404, None, &message), &[]);
    }
    if let Some(reason) = (wire.refuse)(&body) {
        let request_id = (wire.request_id_header.to_owned(), format!("req_fake_{serial}"));
        return json_response(400, &(wire.error_body)(400, None, &reason), &[request_id]);
    }
    let prompt = (wire.prompt)(&body);
    let input = prompt.tokens();
    let window = *inner.window.lock().unwrap();
    if let Some(overflow) = window.and_then(|w| Overflow::of(input, (wire.requested_output)(&body), w)) {
        let request_id = (wire.request_id_header.to_owned(), format!("req_fake_{serial}"));
        return json_response(400, &(wire.context_error)(&overflow), &[request_id]);
    }
    let mut reply = {
        let queued = inner.replies.lock().unwrap().pop_front();
        queued.unwrap_or_else(|| inner.default.lock().unwrap().clone())
    };
    reply.input = Some(input);
    if wire.caches && matches!(reply.kind, ReplyKind::Answer { .. }) {
        let mut cache = inner.cache.lock().unwrap();
        let used = cache.0.serve(&prompt);
        cache.1.push(used);
        reply.cache = Some(used);
    }
    if let Some(delay) = reply.delay {
        tokio::time::sleep(delay).await;
    }
    let request_id = (wire.request_id_header, format!("req_fake_{serial}"));
    let mut extra: Vec<(String, String)> = vec![(request_id.0.to_owned(), request_id.1)];
    extra.extend(reply.headers.iter().cloned());
    if let ReplyKind::Error { status, kind, message } = &reply.kind {
        return json_response(*status, &(wire.error_body)(*status, kind.as_deref(), message), &extra);
    }
    match (wire.render)(&reply, &body, serial) {
        Rendered::Json { status, body } => json_response(status, &body, &extra),
        Rendered::Raw { status, content_type, body } => {
            with_headers(status, &content_type, Body::from(body), &extra)
        }
        Rendered::Events(events) => {
            let body = event_stream(events, reply.fault.clone(), inner.gate.clone(), wire.stream_error);
            with_headers(200, "text/event-stream; charset=utf-8", body, &extra)
        }
    }
}

fn json_response(status: u16, body: &Value, extra: &[(String, String)]) -> Response {
    with_headers(status, "application/json", Body::from(body.to_string()), extra)
}

fn with_headers(status: u16, content_type: &str, body: Body, extra: &[(String, String)]) -> Response {
    let mut response = body.into_response();
    *response.status_mut() = StatusCode::from_u16(status).expect("a valid status");
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(content_type).expect("a content type"));
    for (name, value) in extra {
        headers.insert(
            HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
            HeaderValue::from_str(value).expect("a header value"),
        );
    }
    response
}

/// A body that sends each event as its own chunk, applying `fault`.
fn event_stream(
    events: Vec<String>,
    fault: Option<(usize, StreamFault)>,
    gate: Arc<Notify>,
    stream_error: fn(&str, &str) -> String,
) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(1);
    tokio::spawn(async move {
        for (i, event) in events.into_iter().enumerate() {
            if let Some((at, fault)) = &fault
                && i == *at
            {
                match fault {
                    StreamFault::Cut => {
                        let _ = tx.send(Err(io::Error::other("the fake cut the stream"))).await;
                        return;
                    }
                    StreamFault::End => return,
                    StreamFault::Pause => gate.notified().await,
                    StreamFault::Error { kind, message } => {
                        let _ = tx.send(Ok(Bytes::from(stream_error(kind, message)))).await;
                        return;
                    }
                }
            }
            if tx.send(Ok(Bytes::from(event))).await.is_err() {
                return;
            }
        }
    });
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Body::from_stream(stream)
}

/// One SSE event: an optional `event:` line and one `data:` line.
pub(crate) fn sse(event: Option<&str>, data: &str) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

//! The worker webhook client: delivers a `DecisionRequest` to an agent's worker and reads its
//! `DecisionResponse` (DESIGN.md section 7, PROTOCOL-NOTES rules 31 and 50).
//!
//! One [`WorkerClient::deliver`] call is one delivery attempt. The request is serialized once
//! and exactly those bytes are signed and sent. The worker answers JSON, or an event stream of
//! `llm.token.delta` events (passed to a callback as they arrive) ended by `decision.result` or
//! `decision.error`. Every failure is a [`DeliveryError`] whose
//! [`is_retryable`](DeliveryError::is_retryable) decides whether the caller tries again; the
//! attempt counter, backoff and deadlines belong to the caller.

mod error;
mod signature;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use reqwest::{Response, StatusCode};
use turnstone_engine::protocol::{DecisionRequest, DecisionResponse, StreamDelta, parse_response, parse_str};
use turnstone_engine::session::Transcript;

pub use error::DeliveryError;
pub use signature::{DEFAULT_TOLERANCE_SECS, SIGNATURE_HEADER, SignatureError, sign, verify};

use crate::net::{self, SseError, SseEvent, SseStream, SseStreamError, error_chain, short_text};
use error::{WORKER_MESSAGE_CHARS, status_hint};

/// The `Accept` header of every delivery.
pub const ACCEPT_VALUE: &str = "text/event-stream, application/json";
/// The header carrying `<decision_id>:<attempt>`.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// The header carrying the session id.
pub const SESSION_HEADER: &str = "x-turnstone-session";
/// The header carrying the decision id.
pub const DECISION_HEADER: &str = "x-turnstone-decision";
/// The largest JSON body or single stream event read from a worker by default (32 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 << 20;

/// How much of an error status body is read to look for a hint.
const HINT_BODY_BYTES: usize = 16 << 10;
/// Event names of a worker's event stream.
const DELTA_EVENT: &str = "llm.token.delta";
const RESULT_EVENT: &str = "decision.result";
const ERROR_EVENT: &str = "decision.error";

/// A worker's answer to one delivery: the response, and the fields of it this engine does not
/// know and ignored (their paths, e.g. `actions[1].trace`). Worker answers are read leniently:
/// a worker may echo `session_id` or add fields of its own; unknown action types still fail.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub response: DecisionResponse,
    pub ignored_fields: Vec<String>,
}

impl From<(DecisionResponse, Vec<String>)> for Answer {
    fn from((response, ignored_fields): (DecisionResponse, Vec<String>)) -> Self {
        Answer { response, ignored_fields }
    }
}

/// Where an agent's worker listens, and the secret its requests are signed with.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerEndpoint {
    /// The webhook URL (`http` or `https`).
    pub url: String,
    /// The HMAC secret; `None` sends no signature header. Never printed.
    pub secret: Option<String>,
    /// How much of the conversation its decision requests carry (`worker_messages`).
    pub transcript: Transcript,
}

impl WorkerEndpoint {
    /// An endpoint at `url`, signing with `secret` when one is given.
    pub fn new(url: impl Into<String>, secret: Option<String>) -> Self {
        WorkerEndpoint { url: url.into(), secret, transcript: Transcript::Whole }
    }
}

impl fmt::Debug for WorkerEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerEndpoint")
            .field("url", &self.url)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("transcript", &self.transcript)
            .finish()
    }
}

/// Delivers one attempt of a decision to an agent's worker: what the dispatcher needs of a
/// worker. [`WorkerClient`] delivers over HTTP; a simulation delivers in memory, with faults.
#[async_trait]
pub trait Deliver: Send + Sync + 'static {
    /// Delivers `request` once to `endpoint` (see [`WorkerClient::deliver`]): `timeout` bounds
    /// the whole attempt, `on_delta` hears each streamed token delta as it arrives.
    async fn deliver(
        &self,
        endpoint: &WorkerEndpoint,
        request: &DecisionRequest,
        timeout: Option<Duration>,
        now_unix: i64,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<Answer, DeliveryError>;
}

#[async_trait]
impl Deliver for WorkerClient {
    async fn deliver(
        &self,
        endpoint: &WorkerEndpoint,
        request: &DecisionRequest,
        timeout: Option<Duration>,
        now_unix: i64,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<Answer, DeliveryError> {
        WorkerClient::deliver(self, endpoint, request, timeout, now_unix, on_delta).await
    }
}

/// Delivers decisions to workers over HTTP; cheap to clone, share one per process.
#[derive(Debug, Clone)]
pub struct WorkerClient {
    http: reqwest::Client,
    max_body_bytes: usize,
}

impl WorkerClient {
    /// A client with its own connection pool and the settings of [`net::client_builder`].
    pub fn new() -> Result<Self, reqwest::Error> {
        Ok(WorkerClient::from_client(net::client()?))
    }

    /// A client over an existing `reqwest::Client` (which should set `tcp_nodelay(true)` and
    /// no redirect policy).
    pub fn from_client(http: reqwest::Client) -> Self {
        WorkerClient { http, max_body_bytes: DEFAULT_MAX_BODY_BYTES }
    }

    /// The same client with another limit on a JSON body or a single stream event, in bytes.
    pub fn with_max_body_bytes(mut self, max_body_bytes: usize) -> Self {
        self.max_body_bytes = max_body_bytes;
        self
    }

    /// Delivers `request` once: POSTs it to `endpoint` (signed at `now_unix` when the endpoint
    /// has a secret) and reads the answer, calling `on_delta` for each streamed token delta as
    /// it arrives. `timeout` bounds the whole attempt, response stream included.
    #[tracing::instrument(
        name = "worker.deliver",
        skip_all,
        fields(session_id = %request.session_id, decision_id = %request.decision_id, attempt = request.attempts)
    )]
    pub async fn deliver(
        &self,
        endpoint: &WorkerEndpoint,
        request: &DecisionRequest,
        timeout: Option<Duration>,
        now_unix: i64,
        mut on_delta: impl FnMut(StreamDelta),
    ) -> Result<Answer, DeliveryError> {
        let http_request = self.build_request(endpoint, request, now_unix)?;
        let attempt = self.exchange(http_request, &mut on_delta);
        let outcome = match timeout {
            Some(limit) => match tokio::time::timeout(limit, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => Err(DeliveryError::Timeout { after: Some(limit) }),
            },
            None => attempt.await,
        };
        match &outcome {
            Ok(answer) if !answer.ignored_fields.is_empty() => tracing::warn!(
                ignored_fields = ?answer.ignored_fields,
                "worker answered with fields this engine does not know; they were ignored"
            ),
            Ok(_) => tracing::debug!("worker answered"),
            Err(err) => {
                tracing::debug!(code = err.code(), retryable = err.is_retryable(), error = %err, "delivery failed");
            }
        }
        outcome
    }

    fn build_request(
        &self,
        endpoint: &WorkerEndpoint,
        request: &DecisionRequest,
        now_unix: i64,
    ) -> Result<reqwest::Request, DeliveryError> {
        let invalid = |message: String| DeliveryError::InvalidRequest { message };
        let url = reqwest::Url::parse(&endpoint.url).map_err(|e| invalid(format!("worker URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!("worker URL scheme {:?} is not http or https", url.scheme())));
        }
        let header = |name: &str, value: String| {
            HeaderValue::try_from(value).map_err(|_| invalid(format!("{name} is not a valid header value")))
        };
        let idempotency_key = header("decision_id", format!("{}:{}", request.decision_id, request.attempts))?;
        let session = header("session_id", request.session_id.to_string())?;
        let decision = header("decision_id", request.decision_id.to_string())?;
        let body = serde_json::to_vec(request).map_err(|e| invalid(format!("cannot serialize: {e}")))?;
        let mut builder = self
            .http
            .post(url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(ACCEPT, HeaderValue::from_static(ACCEPT_VALUE))
            .header(IDEMPOTENCY_KEY_HEADER, idempotency_key)
            .header(SESSION_HEADER, session)
            .header(DECISION_HEADER, decision);
        if let Some(traceparent) = crate::trace::traceparent() {
            builder = builder.header(crate::trace::TRACEPARENT_HEADER, traceparent);
        }
        if let Some(secret) = &endpoint.secret {
            if secret.is_empty() {
                return Err(invalid("the worker secret is empty".to_owned()));
            }
            let signature = sign(secret.as_bytes(), now_unix, &body);
            builder = builder.header(SIGNATURE_HEADER, header("signature", signature)?);
        }
        builder.body(body).build().map_err(|e| invalid(error_chain(&e)))
    }

    async fn exchange(
        &self,
        http_request: reqwest::Request,
        on_delta: &mut impl FnMut(StreamDelta),
    ) -> Result<Answer, DeliveryError> {
        let response = self.http.execute(http_request).await.map_err(|e| {
            if e.is_timeout() {
                DeliveryError::Timeout { after: None }
            } else if e.is_builder() {
                DeliveryError::InvalidRequest { message: error_chain(&e) }
            } else {
                DeliveryError::Connection { message: error_chain(&e) }
            }
        })?;
        let status = response.status();
        tracing::debug!(status = status.as_u16(), "worker responded");
        if status.is_success() {
            return self.read_success(response, on_delta).await;
        }
        let code = status.as_u16();
        if status.is_client_error() || status.is_server_error() {
            let hint =
                net::read_limited(response, HINT_BODY_BYTES).await.ok().and_then(|body| status_hint(&body));
            return Err(if status.is_client_error() {
                DeliveryError::Status4xx { status: code, hint }
            } else {
                DeliveryError::Status5xx { status: code, hint }
            });
        }
        Err(DeliveryError::UnexpectedStatus { status: code })
    }

    /// Reads a 2xx answer: an event stream, a JSON body, or nothing (the empty response).
    async fn read_success(
        &self,
        response: Response,
        on_delta: &mut impl FnMut(StreamDelta),
    ) -> Result<Answer, DeliveryError> {
        if response.status() == StatusCode::NO_CONTENT {
            return Ok(Answer::default());
        }
        let unexpected_type = match media_type(&response) {
            MediaType::EventStream => return self.read_event_stream(response, on_delta).await,
            MediaType::Json | MediaType::Missing => None,
            MediaType::Other(declared) => Some(declared),
        };
        if response.content_length().is_some_and(|length| length > self.max_body_bytes as u64) {
            return Err(too_large(self.max_body_bytes));
        }
        let body = net::read_limited(response, self.max_body_bytes).await.map_err(body_error)?;
        if body.len() > self.max_body_bytes {
            return Err(too_large(self.max_body_bytes));
        }
        if body.trim_ascii().is_empty() {
            return Ok(Answer::default());
        }
        match unexpected_type {
            None => parse_response(&body).map(Answer::from).map_err(DeliveryError::invalid),
            Some(declared) => Err(DeliveryError::invalid_body(format!(
                "content type `{declared}` is neither application/json nor text/event-stream"
            ))),
        }
    }

    /// Reads an event stream as it arrives until `decision.result` or `decision.error`;
    /// whatever follows the end is not read.
    async fn read_event_stream(
        &self,
        response: Response,
        on_delta: &mut impl FnMut(StreamDelta),
    ) -> Result<Answer, DeliveryError> {
        let mut stream = SseStream::new(response, self.max_body_bytes);
        let mut deltas = 0_usize;
        while let Some(event) = stream.next().await {
            let event = event.map_err(|e| match e {
                SseStreamError::Body(e) => body_error(e),
                SseStreamError::Sse(SseError::NotUtf8) => {
                    DeliveryError::invalid_body("event stream is not UTF-8")
                }
                SseStreamError::Sse(SseError::TooLarge { limit }) => DeliveryError::invalid_body(format!(
                    "event stream line or event is larger than {limit} bytes"
                )),
            })?;
            if let Some(response) = handle_event(&event, on_delta)? {
                tracing::debug!(deltas, "event stream answered");
                return Ok(response);
            }
            deltas += 1;
        }
        Err(DeliveryError::BrokenStream {
            message: format!(
                "event stream ended without {RESULT_EVENT} or {ERROR_EVENT} (after {deltas} deltas)"
            ),
        })
    }
}

/// A `decision.error` event's data.
#[derive(serde::Deserialize)]
struct WorkerErrorEvent {
    message: String,
    #[serde(default = "retryable_by_default")]
    retryable: bool,
}

fn retryable_by_default() -> bool {
    true
}

/// Acts on one event: a delta goes to `on_delta` (`None`: read on), a result ends the stream.
fn handle_event(
    event: &SseEvent,
    on_delta: &mut impl FnMut(StreamDelta),
) -> Result<Option<Answer>, DeliveryError> {
    match event.event.as_str() {
        DELTA_EVENT => {
            let delta = parse_str::<StreamDelta>(&event.data)
                .map_err(|e| DeliveryError::invalid_event(DELTA_EVENT, e))?;
            on_delta(delta);
            Ok(None)
        }
        RESULT_EVENT => parse_response(event.data.as_bytes())
            .map(|parsed| Some(Answer::from(parsed)))
            .map_err(|e| DeliveryError::invalid_event(RESULT_EVENT, e)),
        ERROR_EVENT => {
            let error = parse_str::<WorkerErrorEvent>(&event.data)
                .map_err(|e| DeliveryError::invalid_event(ERROR_EVENT, e))?;
            Err(DeliveryError::WorkerError {
                message: short_text(&error.message, WORKER_MESSAGE_CHARS),
                retryable: error.retryable,
            })
        }
        _ => Err(DeliveryError::InvalidResponse {
            path: "event".to_owned(),
            message: format!("unknown event (expected {DELTA_EVENT}, {RESULT_EVENT} or {ERROR_EVENT})"),
        }),
    }
}

/// What kind of body a response declares.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MediaType {
    Json,
    EventStream,
    Missing,
    /// Anything else, as declared (shortened, for the error message).
    Other(String),
}

fn media_type(response: &Response) -> MediaType {
    let Some(value) = response.headers().get(CONTENT_TYPE) else {
        return MediaType::Missing;
    };
    let essence = String::from_utf8_lossy(value.as_bytes());
    let essence = essence.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => MediaType::Json,
        "text/event-stream" => MediaType::EventStream,
        other if other.starts_with("application/") && other.ends_with("+json") => MediaType::Json,
        other => MediaType::Other(short_text(other, 100)),
    }
}

fn too_large(limit: usize) -> DeliveryError {
    DeliveryError::invalid_body(format!("response body is larger than {limit} bytes"))
}

fn body_error(err: reqwest::Error) -> DeliveryError {
    if err.is_timeout() {
        DeliveryError::Timeout { after: None }
    } else {
        DeliveryError::BrokenStream { message: error_chain(&err) }
    }
}

/// Property tests of a worker's event stream: whatever bytes arrive, cut wherever, the parser
/// and the event handling never panic, and every refusal says what was wrong.
#[cfg(test)]
mod stream_properties {
    // Test code: a failed expectation is a failed test.
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use proptest::prelude::*;
    use proptest::test_runner::Config;

    use super::*;
    use crate::net::SseParser;

    /// Event data: valid answers and deltas, the same with a part cut off, and anything.
    fn data() -> impl Strategy<Value = String> {
        let valid = prop_oneof![
            Just(r#"{"text": "hel"}"#.to_owned()),
            Just(r#"{"tool_calls": [{"id": "c1", "name": "f", "arguments": "{"}]}"#.to_owned()),
            Just(r#"{"actions": [{"type": "done", "data": "ok"}], "state": {"n": 1}}"#.to_owned()),
            Just(r#"{"message": "busy", "retryable": false}"#.to_owned()),
        ];
        prop_oneof![
            2 => valid.clone(),
            2 => (valid, any::<usize>()).prop_map(|(d, cut)| d[..cut % (d.len() + 1)].to_owned()),
            1 => ".{0,40}",
        ]
    }

    fn event() -> impl Strategy<Value = (String, String)> {
        let name = prop_oneof![
            Just(DELTA_EVENT.to_owned()),
            Just(RESULT_EVENT.to_owned()),
            Just(ERROR_EVENT.to_owned()),
            "[a-z.]{0,12}",
        ];
        (name, data())
    }

    proptest! {
        #![proptest_config(Config { cases: 2_000, failure_persistence: None, ..Config::default() })]

        #[test]
        fn any_worker_event_stream(
            events in proptest::collection::vec(event(), 0..6),
            noise in proptest::collection::vec(any::<u8>(), 0..16),
            cuts in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            let mut bytes = Vec::new();
            for (name, data) in &events {
                bytes.extend(format!("event: {name}\ndata: {data}\n\n").into_bytes());
            }
            bytes.extend(noise);
            let mut parser = SseParser::new(4096);
            let mut parsed = Vec::new();
            let mut at = 0;
            for cut in cuts.iter().chain([&usize::MAX]) {
                let end = if *cut == usize::MAX { bytes.len() } else { at + cut % (bytes.len() - at + 1) };
                if parser.feed(&bytes[at..end], &mut parsed).is_err() {
                    return Ok(());
                }
                at = end;
            }
            for event in &parsed {
                match handle_event(event, &mut |_| {}) {
                    Ok(Some(_)) => break,
                    Ok(None) => {}
                    Err(e) => {
                        prop_assert!(!e.to_string().is_empty());
                        break;
                    }
                }
            }
        }
    }
}

//! The worker webhook client against real HTTP: an in-process axum fake worker on loopback
//! (and, for broken connections, a raw TCP server that misbehaves on purpose).

// The fake worker and helpers are test code too: a failure there must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use turnstone_engine::protocol::{Action, DecisionRequest, DecisionResponse, StreamDelta, parse_str};
use turnstone_runtime::worker::{DeliveryError, SignatureError, WorkerClient, WorkerEndpoint, sign, verify};

const NOW: i64 = 1_700_000_000;
const SECRET: &str = "whsec_test_secret";
const PLENTY: Option<Duration> = Some(Duration::from_secs(10));

/// A decision request as the engine would send it (attempt 3).
fn request() -> DecisionRequest {
    parse_str(
        r#"{
            "session_id": "ses-1", "decision_id": "dec-1", "agent_id": "agent",
            "identity": {"id": "user-7"}, "trigger": {"type": "session.start"},
            "proposed": {}, "state": {"n": 1}, "agent": null, "calls": [], "pending_calls": 0,
            "messages": [], "message_tree": {"nodes": []}, "ancestry": [], "attempts": 3,
            "deadline": null, "turn_id": "turn-1"
        }"#,
    )
    .unwrap()
}

/// What the fake worker received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Shared {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Signalled by the test's delta callback; streams wait on it to prove deltas arrive live.
    delta_seen: Arc<Notify>,
}

/// One step of a streamed response body.
enum Step {
    Chunk(&'static [u8]),
    Sleep(u64),
    /// Wait until the client has handed a delta to its callback.
    WaitForDelta,
}

fn stream(shared: &Shared, content_type: &'static str, steps: Vec<Step>) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let notify = shared.delta_seen.clone();
    tokio::spawn(async move {
        for step in steps {
            match step {
                Step::Chunk(bytes) => {
                    if tx.send(Bytes::from_static(bytes)).await.is_err() {
                        return;
                    }
                }
                Step::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Step::WaitForDelta => notify.notified().await,
            }
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (Ok::<_, Infallible>(chunk), rx))
    });
    ([(header::CONTENT_TYPE, content_type)], Body::from_stream(body)).into_response()
}

fn sse(shared: &Shared, steps: Vec<Step>) -> Response {
    stream(shared, "text/event-stream; charset=utf-8", steps)
}

fn json(status: StatusCode, body: &'static str) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The body texts the garbage routes answer; none may appear in an error.
const SECRET_IN_BODY: &str = "private-words-from-the-body";
const GARBAGE_TEXT: &str = "this is not json private-words-from-the-body";
const GARBAGE_TYPE: &str = r#"{"messages": "private-words-from-the-body"}"#;
const GARBAGE_NESTED: &str =
    r#"{"actions": [{"type": "done"}, {"type": "tool.call", "name": ["private-words-from-the-body"]}]}"#;
const GARBAGE_ROLE: &str = r#"{"messages": [{"role": "private words from the body", "content": "x"}]}"#;

async fn worker(State(shared): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    shared.seen.lock().unwrap().push(Seen { path: path.clone(), headers, body });
    match path.as_str() {
        "/json" => json(StatusCode::OK, r#"{"actions": [{"type": "done", "data": "hi"}], "state": {"n": 2}}"#),
        "/echoing" => json(
            StatusCode::OK,
            r#"{"session_id": "s1", "decision_id": "dec_1", "actions": [{"type": "done", "data": "hi", "trace": "t-9"}]}"#,
        ),
        "/echoing-sse" => (
            [(header::CONTENT_TYPE, "text/event-stream")],
            "event: decision.result\ndata: {\"session_id\": \"s1\", \"actions\": []}\n\n",
        )
            .into_response(),
        "/unknown-action" => json(StatusCode::OK, r#"{"session_id": "s1", "actions": [{"type": "tool.cal", "id": "x"}]}"#),
        "/json-suffix" => {
            ([(header::CONTENT_TYPE, "application/vnd.turnstone+json")], r#"{"actions": []}"#).into_response()
        }
        "/no-content" => StatusCode::NO_CONTENT.into_response(),
        "/empty" => StatusCode::OK.into_response(),
        "/blank-json" => json(StatusCode::OK, " \n"),
        "/html" => ([(header::CONTENT_TYPE, "text/html")], "<p>private-words-from-the-body</p>").into_response(),
        "/garbage-text" => json(StatusCode::OK, GARBAGE_TEXT),
        "/garbage-type" => json(StatusCode::OK, GARBAGE_TYPE),
        "/garbage-nested" => json(StatusCode::OK, GARBAGE_NESTED),
        "/garbage-role" => json(StatusCode::OK, GARBAGE_ROLE),
        "/500" => json(StatusCode::INTERNAL_SERVER_ERROR, r#"{"error": {"message": "database\nunavailable"}}"#),
        "/503-html" => {
            (StatusCode::SERVICE_UNAVAILABLE, "<html>private-words-from-the-body</html>").into_response()
        }
        "/400" => json(StatusCode::BAD_REQUEST, r#"{"error": {"message": "unknown agent", "detail": "private-words-from-the-body"}}"#),
        "/400-text" => (StatusCode::BAD_REQUEST, "private-words-from-the-body").into_response(),
        "/302" => (StatusCode::FOUND, [(header::LOCATION, "/json")]).into_response(),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            json(StatusCode::OK, "{}")
        }
        "/sse" => sse(
            &shared,
            vec![
                // A comment, then the first delta split mid-name and mid-JSON across writes.
                Step::Chunk(b": keep-alive\n\nevent: llm.tok"),
                Step::Sleep(15),
                Step::Chunk(b"en.delta\nid: 1\ndata: {\"te"),
                Step::Sleep(15),
                Step::Chunk(b"xt\":\"hel\"}\n"),
                Step::Sleep(15),
                Step::Chunk(b"\n"),
                Step::WaitForDelta,
                // CRLF line ends, with the pair itself split across writes.
                Step::Chunk(b"event: llm.token.delta\r"),
                Step::Sleep(15),
                Step::Chunk(b"\ndata: {\"text\":\"lo\",\"finish_reason\":\"stop\"}\r\n\r\n"),
                Step::WaitForDelta,
                // The result's data on several lines.
                Step::Chunk(b"event: decision.result\ndata: {\"actions\":\ndata: [{\"type\":\"done\",\"data\":\"hello\"}]}\n"),
                Step::Sleep(15),
                Step::Chunk(b"\n"),
                // Anything after the result is ignored.
                Step::Chunk(b"event: surprise\ndata: {}\n\n"),
            ],
        ),
        "/sse-error" => sse(
            &shared,
            vec![
                Step::Chunk(b"event: llm.token.delta\ndata: {\"text\":\"x\"}\n\n"),
                Step::Chunk(b"event: decision.error\ndata: {\"message\": \"model overloaded\"}\n\n"),
            ],
        ),
        "/sse-error-final" => sse(
            &shared,
            vec![Step::Chunk(b"event: decision.error\ndata: {\"message\": \"no such tool\", \"retryable\": false}\n\n")],
        ),
        "/sse-no-result" => sse(
            &shared,
            vec![
                Step::Chunk(b"event: llm.token.delta\ndata: {\"text\":\"x\"}\n\n"),
                // An unfinished event (no blank line) is not a result either.
                Step::Chunk(b"event: decision.result\ndata: {}\n"),
            ],
        ),
        "/sse-empty" => sse(&shared, vec![]),
        "/sse-unknown" => sse(&shared, vec![Step::Chunk(b"event: surprise\ndata: {}\n\n")]),
        "/sse-default-event" => sse(&shared, vec![Step::Chunk(b"data: {}\n\n")]),
        "/sse-bad-delta" => sse(
            &shared,
            vec![Step::Chunk(b"event: llm.token.delta\ndata: {\"text\": \"private words\", \"tool_calls\": [{\"name\": \"x\"}]}\n\n")],
        ),
        "/sse-stall" => sse(
            &shared,
            vec![Step::Chunk(b"event: llm.token.delta\ndata: {\"text\":\"x\"}\n\n"), Step::Sleep(30_000)],
        ),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

struct FakeWorker {
    base: String,
    shared: Shared,
}

impl FakeWorker {
    async fn start() -> FakeWorker {
        let shared = Shared::default();
        let app = Router::new().fallback(worker).with_state(shared.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeWorker { base, shared }
    }

    fn endpoint(&self, path: &str, secret: Option<&str>) -> WorkerEndpoint {
        WorkerEndpoint::new(format!("{}{path}", self.base), secret.map(str::to_owned))
    }

    fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// Delivers the standard request to `path`, collecting deltas.
    async fn deliver(
        &self,
        path: &str,
        timeout: Option<Duration>,
    ) -> (Result<DecisionResponse, DeliveryError>, Vec<StreamDelta>) {
        let client = WorkerClient::new().unwrap();
        let mut deltas = Vec::new();
        let notify = self.shared.delta_seen.clone();
        let result = client
            .deliver(&self.endpoint(path, None), &request(), timeout, NOW, |delta| {
                deltas.push(delta);
                notify.notify_one();
            })
            .await
            .map(|answer| answer.response);
        (result, deltas)
    }
}

fn header<'a>(seen: &'a Seen, name: &str) -> Option<&'a str> {
    seen.headers.get(name).map(|v| v.to_str().unwrap())
}

fn assert_invalid(err: &DeliveryError, want_path: &str) {
    let DeliveryError::InvalidResponse { path, message } = err else {
        panic!("expected InvalidResponse, got {err:?}");
    };
    assert_eq!(path, want_path, "{message}");
    assert!(!err.is_retryable());
    assert_eq!(err.code(), "invalid_response");
    assert_no_body_text(err);
}

fn assert_no_body_text(err: &DeliveryError) {
    for text in [format!("{err}"), format!("{err:?}")] {
        assert!(!text.contains(SECRET_IN_BODY), "error quotes the body: {text}");
        assert!(!text.contains("private words"), "error quotes the body: {text}");
    }
}

#[tokio::test]
async fn json_answer_is_parsed_and_headers_are_sent() {
    let worker = FakeWorker::start().await;
    let (result, deltas) = worker.deliver("/json", PLENTY).await;
    let response = result.unwrap();
    assert!(deltas.is_empty());
    assert!(matches!(response.actions(), [Action::Done(_)]));
    assert_eq!(response.state, Some(serde_json::json!({"n": 2})));

    let seen = worker.seen();
    let [seen] = seen.as_slice() else { panic!("one request expected, got {seen:?}") };
    assert_eq!(seen.path, "/json");
    assert_eq!(header(seen, "content-type"), Some("application/json"));
    assert_eq!(header(seen, "accept"), Some("text/event-stream, application/json"));
    assert_eq!(header(seen, "idempotency-key"), Some("dec-1:3"));
    assert_eq!(header(seen, "x-turnstone-session"), Some("ses-1"));
    assert_eq!(header(seen, "x-turnstone-decision"), Some("dec-1"));
    assert_eq!(header(seen, "x-turnstone-signature"), None, "no secret, no signature");
    // The body is the request, serialized once.
    assert_eq!(seen.body.as_ref(), serde_json::to_vec(&request()).unwrap().as_slice());
    let echoed: DecisionRequest = parse_str(std::str::from_utf8(&seen.body).unwrap()).unwrap();
    assert_eq!(echoed, request());
}

#[tokio::test]
async fn json_suffix_media_type_is_json() {
    let worker = FakeWorker::start().await;
    let (result, _) = worker.deliver("/json-suffix", PLENTY).await;
    assert_eq!(result.unwrap().actions, Some(vec![]));
}

#[tokio::test]
async fn signature_verifies_against_the_raw_body() {
    let worker = FakeWorker::start().await;
    let client = WorkerClient::new().unwrap();
    let endpoint = worker.endpoint("/json", Some(SECRET));
    client.deliver(&endpoint, &request(), PLENTY, NOW, |_| {}).await.unwrap();

    let seen = worker.seen();
    let seen = &seen[0];
    let signature = header(seen, "x-turnstone-signature").expect("signed");
    assert!(signature.starts_with(&format!("t={NOW},v1=")), "{signature}");
    assert_eq!(signature, sign(SECRET.as_bytes(), NOW, &seen.body));
    // The worker's side: the raw body, its own clock a little later.
    assert_eq!(verify(SECRET.as_bytes(), signature, &seen.body, NOW + 5, 300), Ok(()));
    // A wrong secret, or a body changed in transit, fails.
    assert_eq!(verify(b"wrong secret", signature, &seen.body, NOW, 300), Err(SignatureError::Mismatch));
    let mut tampered = seen.body.to_vec();
    tampered.push(b' ');
    assert_eq!(verify(SECRET.as_bytes(), signature, &tampered, NOW, 300), Err(SignatureError::Mismatch));
    // An old timestamp (a replay an hour later) fails.
    assert_eq!(
        verify(SECRET.as_bytes(), signature, &seen.body, NOW + 3600, 300),
        Err(SignatureError::OutsideTolerance { skew_secs: 3600 })
    );
}

#[tokio::test]
async fn empty_secret_is_refused() {
    let worker = FakeWorker::start().await;
    let client = WorkerClient::new().unwrap();
    let err = client
        .deliver(&worker.endpoint("/json", Some("")), &request(), PLENTY, NOW, |_| {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_request");
    assert!(!err.is_retryable());
    assert!(worker.seen().is_empty());
}

#[tokio::test]
async fn endpoint_debug_redacts_the_secret() {
    let endpoint = WorkerEndpoint::new("https://worker.example/hook", Some(SECRET.to_owned()));
    let printed = format!("{endpoint:?}");
    assert!(!printed.contains(SECRET), "{printed}");
    assert!(printed.contains("https://worker.example/hook") && printed.contains("redacted"), "{printed}");
}

#[tokio::test]
async fn sse_deltas_arrive_live_and_in_order_before_the_result() {
    let worker = FakeWorker::start().await;
    // The stream waits for the callback to have seen each delta before going on, so this only
    // finishes if deltas are parsed and handed over as their bytes arrive.
    let started = Instant::now();
    let (result, deltas) = worker.deliver("/sse", PLENTY).await;
    let response = result.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let texts: Vec<_> = deltas.iter().map(|d| d.text.as_deref().unwrap()).collect();
    assert_eq!(texts, ["hel", "lo"]);
    assert_eq!(deltas[1].finish_reason.as_deref(), Some("stop"));
    let [Action::Done(done)] = response.actions() else { panic!("{response:?}") };
    assert_eq!(done.data, Some(serde_json::json!("hello")));
}

#[tokio::test]
async fn sse_decision_error_is_retryable_by_default() {
    let worker = FakeWorker::start().await;
    let (result, deltas) = worker.deliver("/sse-error", PLENTY).await;
    assert_eq!(deltas.len(), 1);
    let err = result.unwrap_err();
    assert_eq!(err, DeliveryError::WorkerError { message: "model overloaded".into(), retryable: true });
    assert!(err.is_retryable());
    assert_eq!(err.code(), "worker_error");
}

#[tokio::test]
async fn sse_decision_error_can_be_final() {
    let worker = FakeWorker::start().await;
    let (result, _) = worker.deliver("/sse-error-final", PLENTY).await;
    let err = result.unwrap_err();
    assert_eq!(err, DeliveryError::WorkerError { message: "no such tool".into(), retryable: false });
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn sse_ending_without_a_result_is_retryable() {
    let worker = FakeWorker::start().await;
    for path in ["/sse-no-result", "/sse-empty"] {
        let (result, _) = worker.deliver(path, PLENTY).await;
        let err = result.unwrap_err();
        assert!(matches!(err, DeliveryError::BrokenStream { .. }), "{path}: {err:?}");
        assert!(err.is_retryable());
        assert_eq!(err.code(), "broken_stream");
    }
}

#[tokio::test]
async fn sse_unknown_event_is_final() {
    let worker = FakeWorker::start().await;
    // `data:` without `event:` is the format's default event, `message`: unknown too.
    for path in ["/sse-unknown", "/sse-default-event"] {
        let (result, _) = worker.deliver(path, PLENTY).await;
        assert_invalid(&result.unwrap_err(), "event");
    }
}

#[tokio::test]
async fn sse_invalid_delta_names_the_field() {
    let worker = FakeWorker::start().await;
    let (result, deltas) = worker.deliver("/sse-bad-delta", PLENTY).await;
    assert!(deltas.is_empty());
    let err = result.unwrap_err();
    assert_invalid(&err, "tool_calls[0].id");
    assert!(err.to_string().contains("llm.token.delta"), "{err}");
    assert!(err.to_string().contains("id"), "{err}");
}

#[tokio::test]
async fn status_500_is_retryable_with_a_short_hint() {
    let worker = FakeWorker::start().await;
    let (result, _) = worker.deliver("/500", PLENTY).await;
    let err = result.unwrap_err();
    assert_eq!(err, DeliveryError::Status5xx { status: 500, hint: Some("database unavailable".into()) });
    assert!(err.is_retryable());
    assert_eq!(err.code(), "worker_status_5xx");
    assert_eq!(err.to_string(), "worker answered HTTP 500: database unavailable");

    let (result, _) = worker.deliver("/503-html", PLENTY).await;
    let err = result.unwrap_err();
    assert_eq!(err, DeliveryError::Status5xx { status: 503, hint: None });
    assert_no_body_text(&err);
}

#[tokio::test]
async fn status_400_is_final_and_never_quotes_the_body() {
    let worker = FakeWorker::start().await;
    let (result, _) = worker.deliver("/400", PLENTY).await;
    let err = result.unwrap_err();
    assert_eq!(err, DeliveryError::Status4xx { status: 400, hint: Some("unknown agent".into()) });
    assert!(!err.is_retryable());
    assert_eq!(err.code(), "worker_status_4xx");
    assert_no_body_text(&err);

    let (result, _) = worker.deliver("/400-text", PLENTY).await;
    let err = result.unwrap_err();
    assert_eq!(err, DeliveryError::Status4xx { status: 400, hint: None });
    assert_no_body_text(&err);

    let (result, _) = worker.deliver("/no-such-route", PLENTY).await;
    assert_eq!(result.unwrap_err(), DeliveryError::Status4xx { status: 404, hint: None });
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let worker = FakeWorker::start().await;
    let (result, _) = worker.deliver("/302", PLENTY).await;
    let err = result.unwrap_err();
    assert_eq!(err, DeliveryError::UnexpectedStatus { status: 302 });
    assert!(!err.is_retryable());
    assert_eq!(worker.seen().len(), 1);
}

#[tokio::test]
async fn garbage_body_is_invalid_response_naming_the_field() {
    let worker = FakeWorker::start().await;
    for (path, field) in [
        ("/garbage-text", ""),
        ("/garbage-type", "messages"),
        ("/garbage-nested", "actions[1].name"),
        ("/garbage-role", "messages[0].role"),
        ("/html", ""),
    ] {
        let (result, _) = worker.deliver(path, PLENTY).await;
        let err = result.unwrap_err();
        assert_invalid(&err, field);
    }
}

#[tokio::test]
async fn empty_answers_are_the_empty_response() {
    let worker = FakeWorker::start().await;
    for path in ["/no-content", "/empty", "/blank-json"] {
        let (result, _) = worker.deliver(path, PLENTY).await;
        let response = result.unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(response, DecisionResponse::default(), "{path}");
        assert!(response.is_empty());
    }
}

#[tokio::test]
async fn slow_worker_times_out() {
    let worker = FakeWorker::start().await;
    let limit = Duration::from_millis(300);
    let started = Instant::now();
    let (result, _) = worker.deliver("/slow", Some(limit)).await;
    let err = result.unwrap_err();
    assert_eq!(err, DeliveryError::Timeout { after: Some(limit) });
    assert!(err.is_retryable());
    assert_eq!(err.code(), "timeout");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn the_timeout_covers_reading_the_stream() {
    let worker = FakeWorker::start().await;
    let limit = Duration::from_millis(500);
    let started = Instant::now();
    let (result, deltas) = worker.deliver("/sse-stall", Some(limit)).await;
    assert_eq!(result.unwrap_err(), DeliveryError::Timeout { after: Some(limit) });
    assert_eq!(deltas.len(), 1, "the delta before the stall was delivered");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn connection_refused_is_retryable() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = WorkerClient::new().unwrap();
    let endpoint = WorkerEndpoint::new(format!("http://{addr}/hook"), Some(SECRET.into()));
    let err = client.deliver(&endpoint, &request(), PLENTY, NOW, |_| {}).await.unwrap_err();
    assert!(matches!(err, DeliveryError::Connection { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(err.code(), "connection_failed");
    assert!(!err.to_string().contains(SECRET));
}

#[tokio::test]
async fn invalid_request_is_final() {
    let client = WorkerClient::new().unwrap();
    for url in ["not a url", "ftp://worker.example/hook"] {
        let err = client
            .deliver(&WorkerEndpoint::new(url, None), &request(), PLENTY, NOW, |_| {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), "invalid_request", "{url}: {err}");
        assert!(!err.is_retryable());
    }
    let mut bad_id = request();
    bad_id.decision_id = "dec\n1".into();
    let endpoint = WorkerEndpoint::new("http://127.0.0.1:9/hook", None);
    let err = client.deliver(&endpoint, &bad_id, PLENTY, NOW, |_| {}).await.unwrap_err();
    assert_eq!(err.code(), "invalid_request", "{err}");
}

/// Serves one connection: reads a whole request, writes `response`, then drops the socket.
async fn raw_server(response: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut received = Vec::new();
        let mut buf = [0_u8; 4096];
        loop {
            let n = socket.read(&mut buf).await.unwrap();
            received.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&received);
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if received.len() >= end + 4 + length {
                    break;
                }
            }
            assert!(n > 0, "client closed early");
        }
        socket.write_all(response).await.unwrap();
        socket.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    url
}

#[tokio::test]
async fn a_body_that_breaks_off_is_retryable() {
    let client = WorkerClient::new().unwrap();
    let cases: [&'static [u8]; 2] = [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"actions\":",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
          2b\r\nevent: llm.token.delta\ndata: {\"text\":\"x\"}\n\n\r\n",
    ];
    for (response, want_deltas) in cases.into_iter().zip([0, 1]) {
        let url = raw_server(response).await;
        let mut deltas = 0;
        let err = client
            .deliver(&WorkerEndpoint::new(url, None), &request(), PLENTY, NOW, |_| deltas += 1)
            .await
            .unwrap_err();
        assert!(matches!(err, DeliveryError::BrokenStream { .. }), "{err:?}");
        assert!(err.is_retryable());
        assert_eq!(deltas, want_deltas);
    }
}

#[tokio::test]
async fn oversized_body_is_refused() {
    let worker = FakeWorker::start().await;
    let client = WorkerClient::new().unwrap().with_max_body_bytes(16);
    let err =
        client.deliver(&worker.endpoint("/json", None), &request(), PLENTY, NOW, |_| {}).await.unwrap_err();
    assert_invalid(&err, "");
    let err =
        client.deliver(&worker.endpoint("/sse", None), &request(), PLENTY, NOW, |_| {}).await.unwrap_err();
    assert_invalid(&err, "");
}

#[tokio::test]
async fn delivery_runs_on_a_spawned_task() {
    // The dispatcher runs deliveries on spawned tasks: the future must be `Send`.
    let worker = FakeWorker::start().await;
    let client = WorkerClient::new().unwrap();
    let endpoint = worker.endpoint("/sse", Some(SECRET));
    let notify = worker.shared.delta_seen.clone();
    let task = tokio::spawn(async move {
        let mut deltas = 0;
        let result = client
            .deliver(&endpoint, &request(), PLENTY, NOW, |_| {
                deltas += 1;
                notify.notify_one();
            })
            .await;
        (result, deltas)
    });
    let (result, deltas) = task.await.unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(deltas, 2);
}

/// Workers are read leniently: fields this engine does not know (an echoed `session_id`, a
/// `trace` of the worker's own) are ignored and named; an action type it does not know still
/// fails, naming where.
#[tokio::test]
async fn unknown_fields_are_ignored_and_named_but_unknown_actions_fail() {
    let worker = FakeWorker::start().await;
    let client = WorkerClient::new().unwrap();
    let answer =
        client.deliver(&worker.endpoint("/echoing", None), &request(), PLENTY, NOW, |_| {}).await.unwrap();
    assert_eq!(answer.ignored_fields, ["session_id", "decision_id", "actions[0].trace"]);
    let [Action::Done(done)] = answer.response.actions() else { panic!("{answer:?}") };
    assert_eq!(done.data, Some(serde_json::json!("hi")));
    let answer = client
        .deliver(&worker.endpoint("/echoing-sse", None), &request(), PLENTY, NOW, |_| {})
        .await
        .unwrap();
    assert_eq!(answer.ignored_fields, ["session_id"]);
    let err = client
        .deliver(&worker.endpoint("/unknown-action", None), &request(), PLENTY, NOW, |_| {})
        .await
        .unwrap_err();
    assert_invalid(&err, "actions[0].type");
}

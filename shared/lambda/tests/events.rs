//! Each function's handler fed the payloads Lambda hands it: an API Gateway HTTP API (payload
//! 2.0) request, an SQS batch with a poisoned record, scheduled events. The engine behind them
//! is the real one (`Topology::Split`, as on Lambda) over a SQLite file and the in-process
//! queue; the DynamoDB and SQS adapters have their own suite on moto.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use serde_json::{Value, json};
use tempfile::TempDir;
use tower::ServiceExt;
use turnstone_embedded::MemoryQueue;
use turnstone_lambda::http::api_router;
use turnstone_lambda::schedule::handle_schedule;
use turnstone_lambda::sqs::handle_batch;
use turnstone_runtime::app::App;
use turnstone_runtime::assemble::{self, Engine, Topology};
use turnstone_runtime::config::Config;
use turnstone_runtime::http::{HttpConfig, StreamEnds};
use turnstone_runtime::observed::{ObservedStore, StoreCall, StoreObserver};
use turnstone_runtime::queue::{Consumer, Delivery};

const CONFIG: &str = r#"
[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"
"#;

struct Fixture {
    engine: Engine,
    queue: Arc<MemoryQueue>,
    _dir: TempDir,
}

fn fixture() -> Fixture {
    fixture_with(CONFIG)
}

fn fixture_with(config: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(config, "lambda.toml").unwrap();
    let secrets = config.resolve_secrets(|_| None).unwrap();
    let (store, _) = turnstone_embedded::open_local(&config, dir.path()).unwrap();
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(30)));
    let agents = assemble::agents(&config, &secrets).unwrap();
    let engine = assemble::engine(&config, agents, Arc::new(store), queue.clone(), Topology::Split).unwrap();
    Fixture { engine, queue, _dir: dir }
}

/// An API Gateway HTTP API request event (payload format 2.0), as API Gateway sends it.
fn http_api_event(method: &str, path: &str, query: &str, body: Option<&Value>) -> String {
    json!({
        "version": "2.0",
        "routeKey": "ANY /{proxy+}",
        "rawPath": path,
        "rawQueryString": query,
        "cookies": [],
        "headers": {
            "accept": "application/json",
            "content-type": "application/json",
            "host": "abc123.execute-api.us-east-1.amazonaws.com",
            "user-agent": "curl/8.5.0",
            "x-amzn-trace-id": "Root=1-674b5a2e-0123456789abcdef01234567",
            "x-forwarded-for": "203.0.113.7",
            "x-forwarded-port": "443",
            "x-forwarded-proto": "https"
        },
        "queryStringParameters": query.split('&').filter(|p| !p.is_empty()).map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), Value::from(v))
        }).collect::<serde_json::Map<_, _>>(),
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc123",
            "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "abc123",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.7",
                "userAgent": "curl/8.5.0"
            },
            "requestId": "C6oJ1jWzIAMEbCg=",
            "routeKey": "ANY /{proxy+}",
            "stage": "$default",
            "time": "30/Nov/2026:18:10:00 +0000",
            "timeEpoch": 1_796_062_200_000_i64
        },
        "pathParameters": { "proxy": path.trim_start_matches('/') },
        "body": body.map(Value::to_string),
        "isBase64Encoded": false
    })
    .to_string()
}

async fn call_api(engine: &Engine, event: &str) -> (u16, Value) {
    call_app(Arc::clone(&engine.app), event).await
}

async fn call_app(app: Arc<App>, event: &str) -> (u16, Value) {
    let request = lambda_http::request::from_str(event).unwrap();
    let response = api_router(app, HttpConfig::default()).oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn drain(queue: &MemoryQueue) -> Vec<Delivery> {
    let got = queue.receive(100, Duration::from_millis(50)).await.unwrap();
    for d in &got {
        queue.ack(d).await.unwrap();
    }
    got
}

fn sqs_record(message_id: &str, body: &str) -> Value {
    json!({
        "messageId": message_id,
        "receiptHandle": format!("AQEB{message_id}..."),
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": "1796062200000",
            "SenderId": "AROAEXAMPLE:turnstone-dev-api",
            "ApproximateFirstReceiveTimestamp": "1796062200100"
        },
        "messageAttributes": {},
        "md5OfBody": "0123456789abcdef0123456789abcdef",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:turnstone-dev-wakeups",
        "awsRegion": "us-east-1"
    })
}

#[tokio::test]
async fn the_api_answers_an_http_api_request_and_the_dispatch_batch_runs_the_turn() {
    let f = fixture();
    let input = json!({"type": "client.message", "agent_id": "demo", "turn_id": "t1",
        "message": {"role": "user", "content": "hello lambda"}});
    let (status, body) =
        call_api(&f.engine, &http_api_event("POST", "/v1/sessions/s1/inputs", "", Some(&input))).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["turn_id"], "t1");
    // The submit's commit enqueued one wake-up; nothing ran it yet (no handoff on Lambda).
    let wakes = drain(&f.queue).await;
    assert_eq!(wakes.len(), 1);
    let (status, turn) =
        call_api(&f.engine, &http_api_event("GET", "/v1/sessions/s1/turns/t1", "", None)).await;
    assert_eq!(status, 200);
    assert_eq!(turn["status"], "active", "{turn}");

    // The SQS event source hands the wake-up to `dispatch`, twice (at-least-once delivery).
    let body = serde_json::to_string(&wakes[0].wake_up).unwrap();
    let event: SqsEvent = serde_json::from_value(json!({"Records": [
        sqs_record("m-1", &body),
        sqs_record("m-2", &body),
    ]}))
    .unwrap();
    let response = handle_batch(&f.engine.dispatcher, event, None, None, None).await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    let (_, turn) =
        call_api(&f.engine, &http_api_event("GET", "/v1/sessions/s1/turns/t1", "wait=5", None)).await;
    assert_eq!(turn["status"], "completed", "{turn}");
    let (_, messages) =
        call_api(&f.engine, &http_api_event("GET", "/v1/sessions/s1/messages", "", None)).await;
    assert_eq!(messages["messages"].as_array().unwrap().last().unwrap()["content"], "You said: hello lambda");
    // A run that leaves nothing due later arms no wake-up.
    assert!(drain(&f.queue).await.is_empty());

    // Errors keep their shape behind API Gateway.
    let (status, body) = call_api(&f.engine, &http_api_event("GET", "/v1/sessions/nope", "", None)).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "session_not_found", "{body}");
}

#[tokio::test]
async fn a_poisoned_record_is_a_partial_batch_failure_and_the_others_run() {
    let f = fixture();
    for session in ["a", "b"] {
        let input = turnstone_engine_input(session);
        let (status, _) = call_api(
            &f.engine,
            &http_api_event("POST", &format!("/v1/sessions/{session}/inputs"), "", Some(&input)),
        )
        .await;
        assert_eq!(status, 202);
    }
    drain(&f.queue).await;
    let event: SqsEvent = serde_json::from_value(json!({"Records": [
        sqs_record("m-a", r#"{"session_id": "a", "reason": "commit"}"#),
        sqs_record("m-poison", "this is not a wake-up"),
        sqs_record("m-b", r#"{"session_id": "b", "reason": "commit"}"#),
        sqs_record("m-shape", r#"{"session": "b"}"#),
    ]}))
    .unwrap();
    let response = handle_batch(&f.engine.dispatcher, event, None, None, None).await;
    let mut failed: Vec<&str> =
        response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    failed.sort_unstable();
    assert_eq!(failed, ["m-poison", "m-shape"]);
    // The wire shape Lambda reads.
    let wire = serde_json::to_value(&response).unwrap();
    assert_eq!(wire["batchItemFailures"].as_array().unwrap().len(), 2, "{wire}");
    assert!(wire["batchItemFailures"][0]["itemIdentifier"].is_string(), "{wire}");
    for session in ["a", "b"] {
        let (_, turn) = call_api(
            &f.engine,
            &http_api_event("GET", &format!("/v1/sessions/{session}/turns/t-{session}"), "", None),
        )
        .await;
        assert_eq!(turn["status"], "completed", "{session}: {turn}");
    }
}

/// Two wake-ups of one session in one batch: the later one announces a commit that has not
/// landed (its sender's commit is slow). The batch's run is for both, so it waits for that
/// commit and, as it does not land in time, arms a later look; keeping only the first record's
/// wake-up would drop the announcement, and the commit, once it lands, would wake nothing.
#[tokio::test]
async fn one_batch_merges_a_sessions_wake_ups() {
    let f = fixture();
    let input = turnstone_engine_input("m");
    let (status, _) =
        call_api(&f.engine, &http_api_event("POST", "/v1/sessions/m/inputs", "", Some(&input))).await;
    assert_eq!(status, 202);
    let wakes = drain(&f.queue).await;
    let event: SqsEvent = serde_json::from_value(json!({"Records": [
        sqs_record("m-1", &serde_json::to_string(&wakes[0].wake_up).unwrap()),
        sqs_record("m-2", r#"{"session_id": "m", "reason": "commit", "seq": 1000000}"#),
    ]}))
    .unwrap();
    assert_eq!(f.queue.sessions(), 0);
    let response = handle_batch(&f.engine.dispatcher, event, None, None, None).await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    assert_eq!(f.queue.sessions(), 1, "a later look for the announced commit is armed");
}

/// Commits written only after `0` (a throttled or loaded DynamoDB).
struct SlowCommits(Duration);

#[async_trait::async_trait]
impl StoreObserver for SlowCommits {
    async fn before(&self, call: StoreCall<'_>) {
        if let StoreCall::Commit(..) = call {
            tokio::time::sleep(self.0).await;
        }
    }
}

/// A commit slower than the dispatch run waits for: the run its wake-up started gives up on it
/// and arms a look a minute later, so once the commit lands its wake-up goes out again, and
/// the turn runs at once instead of a minute late. (Found when a loaded moto held a turn of the
/// IAM-gated topology's MCP test past its patience.)
#[tokio::test]
async fn a_slow_commit_is_announced_again_once_it_lands() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(CONFIG, "lambda.toml").unwrap();
    let secrets = config.resolve_secrets(|_| None).unwrap();
    let (inner, _) = turnstone_embedded::open_local(&config, dir.path()).unwrap();
    let store = ObservedStore { inner, observer: SlowCommits(Duration::from_millis(1_500)) };
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(30)));
    let agents = assemble::agents(&config, &secrets).unwrap();
    let engine = assemble::engine(&config, agents, Arc::new(store), queue.clone(), Topology::Split).unwrap();
    let input = turnstone_engine_input("slow");
    let submit = http_api_event("POST", "/v1/sessions/slow/inputs", "", Some(&input));
    let app = Arc::clone(&engine.app);
    let submitted = tokio::spawn(async move { call_app(app, &submit).await });
    // The wake-up goes out before the commit: its run waits, gives up, and arms a later look.
    let announced = queue.receive(1, Duration::from_secs(1)).await.unwrap();
    assert_eq!(announced.len(), 1, "the commit's wake-up goes out before it is written");
    queue.ack(&announced[0]).await.unwrap();
    engine.dispatcher.run(&announced[0].wake_up).await.unwrap();
    assert!(!submitted.is_finished(), "the run gave up before the commit landed");
    assert_eq!(submitted.await.unwrap().0, 202);
    // Landed: announced again, due now.
    let again = drain(&queue).await;
    assert_eq!(again.len(), 1, "the slow commit's wake-up goes out again");
    assert_eq!(again[0].wake_up.seq, announced[0].wake_up.seq);
    engine.dispatcher.run(&again[0].wake_up).await.unwrap();
    let (_, turn) =
        call_api(&engine, &http_api_event("GET", "/v1/sessions/slow/turns/t-slow", "", None)).await;
    assert_eq!(turn["status"], "completed", "{turn}");
}

/// A record the event source sent without a `messageId` is never reported with an empty
/// identifier, which would fail (and run again) the whole batch.
#[tokio::test]
async fn a_record_without_a_message_id_never_fails_the_batch() {
    let f = fixture();
    let mut nameless = sqs_record("x", "not a wake-up");
    nameless.as_object_mut().unwrap().remove("messageId");
    let event: SqsEvent =
        serde_json::from_value(json!({"Records": [nameless, sqs_record("m-poison", "not one either")]}))
            .unwrap();
    let response = handle_batch(&f.engine.dispatcher, event, None, None, None).await;
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    assert_eq!(failed, ["m-poison"]);
}

/// A run inside an invocation's deadline starts no effect that could not end before it: the
/// turn's model call runs (a run always makes progress), its reply asks for a sub-agent, and
/// with under [`DEADLINE_MARGIN`] left the spawn is handed back to the queue instead of being
/// started; the next invocation, with time enough, carries the turn on.
#[tokio::test]
async fn a_run_hands_back_what_its_deadline_leaves_no_time_for() {
    let config = format!(
        "{CONFIG}[[agent.demo.sub_agents]]\nid = \"helper\"\n\n[agent.helper]\nmodel = \"scripted\"\nllm = \"s\"\n"
    );
    let f = fixture_with(&config);
    let input = json!({"type": "client.message", "agent_id": "demo", "turn_id": "t-d",
        "message": {"role": "user", "content": "/agent helper look it up"}});
    let (status, _) =
        call_api(&f.engine, &http_api_event("POST", "/v1/sessions/d/inputs", "", Some(&input))).await;
    assert_eq!(status, 202);
    let wakes = drain(&f.queue).await;
    let body = serde_json::to_string(&wakes[0].wake_up).unwrap();
    let batch = |id: &str| -> SqsEvent {
        serde_json::from_value(json!({"Records": [sqs_record(id, &body)]})).unwrap()
    };
    let now = turnstone_runtime::clock::Clock::now(&turnstone_runtime::clock::SystemClock);
    let response =
        handle_batch(&f.engine.dispatcher, batch("d-1"), Some(now.plus_ms(1_000)), None, None).await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    assert!(
        f.engine.app.session("d").await.unwrap().calls().iter().any(|c| c.name() == Some("helper")),
        "the model asked for the helper"
    );
    let listed = f.engine.app.store().list_sessions(&Default::default(), None, 10).await.unwrap().items.len();
    assert_eq!(listed, 1, "no child was spawned this late");
    let handed_back = drain(&f.queue).await;
    assert_eq!(handed_back.len(), 1, "the rest is handed back");
    assert_eq!(handed_back[0].wake_up.reason, "deadline");
    // With time enough the turn goes on: the child is spawned and answers.
    let body = serde_json::to_string(&handed_back[0].wake_up).unwrap();
    let event: SqsEvent = serde_json::from_value(json!({"Records": [sqs_record("d-2", &body)]})).unwrap();
    let later = turnstone_runtime::clock::Clock::now(&turnstone_runtime::clock::SystemClock).plus_ms(600_000);
    handle_batch(&f.engine.dispatcher, event, Some(later), None, None).await;
    let listed = f.engine.app.store().list_sessions(&Default::default(), None, 10).await.unwrap().items.len();
    assert_eq!(listed, 2, "the child exists now");
}

fn turnstone_engine_input(session: &str) -> Value {
    json!({"type": "client.message", "agent_id": "demo", "turn_id": format!("t-{session}"),
        "message": {"role": "user", "content": format!("hi {session}")}})
}

#[tokio::test]
async fn a_scheduled_sweep_enqueues_a_session_whose_wake_up_was_lost() {
    let f = fixture();
    let input = turnstone_engine_input("lost");
    call_api(&f.engine, &http_api_event("POST", "/v1/sessions/lost/inputs", "", Some(&input))).await;
    // The wake-up is lost (taken and acknowledged, never run).
    assert_eq!(drain(&f.queue).await.len(), 1);
    let swept = handle_schedule(&f.engine.dispatcher).await.unwrap();
    assert_eq!(swept.enqueued, 1);
    let again = drain(&f.queue).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].wake_up.session_id, "lost");
    assert_eq!(again[0].wake_up.reason, "sweep");
    // Run it: the turn ends, and the next sweep finds nothing.
    f.engine.dispatcher.run(&again[0].wake_up).await.unwrap();
    assert_eq!(handle_schedule(&f.engine.dispatcher).await.unwrap().enqueued, 0);
}

/// The event stream of a session with one input, as a router whose streams end as `ends` says
/// answers it: the whole body, which must come within 5 s; the last frame apart.
async fn one_stream(session: &str, ends: StreamEnds) -> (String, String) {
    let f = fixture();
    let input = turnstone_engine_input(session);
    let inputs = format!("/v1/sessions/{session}/inputs");
    let (status, _) = call_api(&f.engine, &http_api_event("POST", &inputs, "", Some(&input))).await;
    assert_eq!(status, 202);
    let http = HttpConfig { stream_ends: ends, ..HttpConfig::default() };
    let stream = format!("/v1/sessions/{session}/events/stream");
    let request = lambda_http::request::from_str(&http_api_event("GET", &stream, "", None)).unwrap();
    let response =
        turnstone_runtime::http::router(Arc::clone(&f.engine.app), http).oneshot(request).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body =
        tokio::time::timeout(Duration::from_secs(5), axum::body::to_bytes(response.into_body(), 1 << 20))
            .await
            .expect("the stream ends by itself, in time")
            .unwrap();
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains("id: 1\n"), "the durable events come first, with their ids: {text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default().to_owned();
    (text, last)
}

/// A function that streams must end its response before its deadline: a stream cut at
/// `StreamEnds::After` ends with a `retry:` hint, after the durable events (with their ids, for
/// `Last-Event-ID`), instead of running into the function's timeout.
#[tokio::test]
async fn an_event_stream_ends_with_a_retry_hint_before_the_deadline() {
    let (_, last) = one_stream("st", StreamEnds::After(Duration::from_millis(300))).await;
    assert!(last.contains("retry: 500"), "the last frame asks to reconnect: {last:?}");
    // The stream function's own cut comes before its timeout (900 s in the template).
    assert!(turnstone_lambda::http::MAX_STREAM_ON_LAMBDA < Duration::from_secs(900));
}

/// Behind API Gateway's buffered HTTP API a stream ends as soon as it has sent what there is
/// (`StreamEnds::WithNews`), asking the client back at once: a stream that waited for its
/// cut (60 s here, past the 5 s the helper waits) would reach the client only then.
#[tokio::test]
async fn an_event_stream_with_news_ends_at_once_behind_a_buffering_gateway() {
    let (_, last) = one_stream("sn", StreamEnds::WithNews(Duration::from_secs(60))).await;
    assert!(last.contains("retry: 50\n") || last.ends_with("retry: 50"), "the next poll at once: {last:?}");
}

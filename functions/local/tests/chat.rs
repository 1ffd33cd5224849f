//! The client commands against a tiny fake server that speaks the HTTP contract. `chat` gets
//! canned turns with streamed deltas, tool calls (one answered by the user), an interrupt, a
//! sub-agent, a failure and a dropped event stream that it resumes with `Last-Event-ID`;
//! `events` and `sessions` page through short pages and follow a stream.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::Notify;
use turnstone::cli::chat::{Io, chat};
use turnstone::cli::client::Client;
use turnstone_engine::protocol::{
    CallStatus, Message, RetryPolicy, Role, ToolCall, ToolHandler, WorkerIdentity,
};
use turnstone_engine::session::{CallRecord, CallSpec, Event, Interrupt, OutboxItem, TurnStatus};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::api::{
    ApiError, EventPage, LoggedEvent, SessionListing, SessionPage, SessionStatus, SessionSummary, Submitted,
    UsageSummary,
};

/// One step of a canned event-stream connection.
#[derive(Clone)]
enum Chunk {
    /// Bytes to send.
    Data(String),
    /// Wait until the client has posted an answer (a `tool.result` or `interrupt.resume`).
    WaitForAnswer,
    /// Keep the connection open for good.
    Hold,
}

#[derive(Default)]
struct FakeState {
    created: bool,
    last_seq: u64,
    turn_ids: VecDeque<String>,
    connections: VecDeque<Vec<Chunk>>,
    inputs: Vec<Value>,
    auth: Vec<Option<String>>,
    /// `(after, Last-Event-ID)` of each stream request.
    streams: Vec<(Option<String>, Option<String>)>,
    /// The durable log `GET …/events` serves, two events a page.
    log: Vec<(u64, Value)>,
    /// The sessions `GET /v1/sessions` lists, two a page.
    sessions: Vec<SessionListing>,
    /// The query of each `GET /v1/sessions`.
    session_queries: Vec<HashMap<String, String>>,
}

#[derive(Clone, Default)]
struct Fake {
    state: Arc<Mutex<FakeState>>,
    answered: Arc<Notify>,
}

fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "session_not_found", "no such session").into_response()
}

async fn summary(State(fake): State<Fake>, Path(id): Path<String>) -> Response {
    let state = fake.state.lock().unwrap();
    if !state.created {
        return not_found();
    }
    Json(SessionSummary {
        session_id: id.into(),
        agent_id: "demo".into(),
        owner: None,
        status: SessionStatus::Idle,
        active_turn: None,
        queued_turns: Vec::new(),
        open_interrupts: Vec::new(),
        pending_client_calls: Vec::new(),
        awaiting_approval: Vec::new(),
        mcp_calls: Vec::new(),
        usage: UsageSummary {
            llm_calls: 0,
            tokens: Default::default(),
            counts: Default::default(),
            cost: "0".into(),
        },
        last_seq: state.last_seq,
        messages: 0,
        created_at: Timestamp(0),
        parent: None,
        forked_from: None,
    })
    .into_response()
}

async fn inputs(
    State(fake): State<Fake>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(input): Json<Value>,
) -> Response {
    let mut state = fake.state.lock().unwrap();
    let auth = headers.get(header::AUTHORIZATION).map(|v| v.to_str().unwrap().to_owned());
    state.auth.push(auth);
    state.inputs.push(input.clone());
    let turn_id = if input["type"] == "client.message" {
        state.created = true;
        state.turn_ids.pop_front()
    } else {
        fake.answered.notify_one();
        None
    };
    (
        StatusCode::ACCEPTED,
        Json(Submitted { session_id: id.into(), turn_id: turn_id.map(Into::into), queued: false }),
    )
        .into_response()
}

async fn stream(
    State(fake): State<Fake>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let chunks = {
        let mut state = fake.state.lock().unwrap();
        let last_event_id = headers.get("last-event-id").map(|v| v.to_str().unwrap().to_owned());
        state.streams.push((query.get("after").cloned(), last_event_id));
        match state.connections.pop_front() {
            Some(chunks) => chunks,
            None => return not_found(),
        }
    };
    let body =
        futures_util::stream::unfold((VecDeque::from(chunks), fake), |(mut chunks, fake)| async move {
            loop {
                match chunks.pop_front()? {
                    Chunk::Data(text) => {
                        let seqs = text.lines().filter_map(|l| l.strip_prefix("id: ")?.parse::<u64>().ok());
                        let mut state = fake.state.lock().unwrap();
                        state.last_seq = seqs.fold(state.last_seq, u64::max);
                        drop(state);
                        return Some((Ok::<_, Infallible>(text), (chunks, fake)));
                    }
                    Chunk::WaitForAnswer => fake.answered.notified().await,
                    Chunk::Hold => std::future::pending::<()>().await,
                }
            }
        });
    ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(body)).into_response()
}

async fn events(State(fake): State<Fake>, Query(query): Query<HashMap<String, String>>) -> Response {
    let state = fake.state.lock().unwrap();
    let after: u64 = query["after"].parse().unwrap();
    let limit: usize = query["limit"].parse().unwrap();
    let events: Vec<_> = state
        .log
        .iter()
        .filter(|(seq, _)| *seq > after)
        .take(limit.min(2))
        .map(|(seq, event)| LoggedEvent { seq: *seq, event: event.clone() })
        .collect();
    let next_after = events.last().map_or(after, |e| e.seq);
    Json(EventPage { events, next_after }).into_response()
}

async fn sessions(State(fake): State<Fake>, Query(query): Query<HashMap<String, String>>) -> Response {
    let mut state = fake.state.lock().unwrap();
    state.session_queries.push(query.clone());
    let matching: Vec<_> = state
        .sessions
        .iter()
        .filter(|s| query.get("agent").is_none_or(|a| s.agent_id == **a))
        .cloned()
        .collect();
    let start: usize = query.get("cursor").map_or(0, |c| c.parse().unwrap());
    let limit: usize = query["limit"].parse().unwrap();
    let end = (start + limit.min(2)).min(matching.len());
    let next = (end < matching.len()).then(|| end.to_string());
    Json(SessionPage { sessions: matching[start..end].to_vec(), next_cursor: next }).into_response()
}

/// Serves the fake; returns its base URL.
async fn serve(fake: Fake) -> String {
    let app = Router::new()
        .route("/v1/sessions/{id}", get(summary))
        .route("/v1/sessions/{id}/inputs", post(inputs))
        .route("/v1/sessions/{id}/events/stream", get(stream))
        .route("/v1/sessions/{id}/events", get(events))
        .route("/v1/sessions", get(sessions))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn durable(seq: u64, event: Event) -> Chunk {
    let data = serde_json::to_string(&event).unwrap();
    Chunk::Data(format!("id: {seq}\nevent: {}\ndata: {data}\n\n", event.name()))
}

fn raw(seq: u64, name: &str, data: Value) -> Chunk {
    Chunk::Data(format!("id: {seq}\r\nevent: {name}\r\ndata: {data}\r\n\r\n"))
}

fn delta(text: &str) -> Chunk {
    let data = json!({"call_id": "llm-1", "delta": {"text": text}});
    Chunk::Data(format!("event: llm.token.delta\ndata: {data}\n\n"))
}

fn message(id: &str, role: Role, content: &str) -> Message {
    Message {
        id: id.into(),
        role,
        content: Some(content.into()),
        tool_calls: None,
        tool_call_id: None,
        name: None,
        provider_blocks: None,
        compaction: None,
    }
}

fn recorded(message: Message) -> Event {
    Event::MessageRecorded { message, parent_id: None }
}

fn tool_result(id: &str, call: &str, name: &str, content: &str) -> Event {
    let mut m = message(id, Role::Tool, content);
    m.tool_call_id = Some(call.into());
    m.name = Some(name.into());
    recorded(m)
}

fn tool_call(id: &str, name: &str, arguments: &str, handler: ToolHandler) -> Event {
    Event::CallCreated {
        call: CallRecord {
            id: id.into(),
            spec: CallSpec::ToolCall { name: name.into(), arguments: arguments.into(), handler },
            status: CallStatus::Queued,
            attempt: 0,
            deadline: None,
            retry_at: None,
            anchor: None,
            turn_id: Some("turn-1".into()),
            policy: RetryPolicy::NONE,
            outcome: None,
            awaiting_approval: false,
        },
    }
}

fn ended(turn_id: &str, status: TurnStatus, error: Option<&str>) -> Event {
    Event::TurnEnded {
        turn_id: turn_id.into(),
        status,
        data: None,
        error: error.map(Into::into),
        code: None,
        at: Timestamp(1),
    }
}

/// Runs `chat` against a fake with these turn ids and stream connections, typing `typed`.
async fn run_chat(
    turn_ids: &[&str],
    connections: Vec<Vec<Chunk>>,
    session: &str,
    message: Option<&str>,
    typed: &str,
) -> (anyhow::Result<()>, String, FakeState) {
    let fake = Fake::default();
    {
        let mut state = fake.state.lock().unwrap();
        state.turn_ids = turn_ids.iter().map(|t| t.to_string()).collect();
        state.connections = connections.into();
    }
    let url = serve(fake.clone()).await;
    let client = Client::new(&url, Some("k1".into())).unwrap();
    let (mut input, mut out) = (typed.as_bytes(), Vec::new());
    let io = Io { input: &mut input, out: &mut out, echo: true };
    let result = tokio::time::timeout(Duration::from_secs(20), chat(&client, "demo", session, message, io))
        .await
        .expect("chat hung");
    let state = std::mem::take(&mut *fake.state.lock().unwrap());
    (result, String::from_utf8(out).unwrap(), state)
}

#[tokio::test]
async fn a_message_streams_its_turn_with_tools_and_a_resumed_stream() {
    let mut asking = message("m2", Role::Assistant, "");
    asking.content = None;
    asking.tool_calls = Some(vec![ToolCall::function("c1", "weather", r#"{"city":"Paris"}"#)]);
    let first = vec![
        durable(1, recorded(message("m1", Role::User, "Weather in Paris?"))),
        raw(2, "turn.started", json!({"type": "turn_started", "turn": {"id": "turn-1", "status": "active"}})),
        raw(
            3,
            "call.created",
            json!({"type": "call_created", "call": {"id": "llm-1", "spec": {"kind": "llm_call"}}}),
        ),
        delta("Let me "),
        Chunk::Data(": keep-alive\r\n\r\n".into()),
        delta("check."),
        durable(4, recorded(asking)),
        // The connection drops here; the client must come back with Last-Event-ID: 4.
    ];
    let second = vec![
        durable(4, recorded(message("m-dup", Role::Assistant, "(a replayed event is skipped)"))),
        durable(5, tool_call("c1", "weather", r#"{"city":"Paris"}"#, ToolHandler::Worker)),
        durable(6, tool_result("m3", "c1", "weather", "18°C,\nsunny")),
        durable(7, tool_call("c2", "confirm", r#"{"question":"Share it?"}"#, ToolHandler::Client)),
        Chunk::WaitForAnswer,
        durable(8, tool_result("m4", "c2", "confirm", "yes")),
        delta("It is 18°C"),
        delta(" and sunny."),
        durable(9, recorded(message("m5", Role::Assistant, "It is 18°C and sunny."))),
        durable(10, ended("turn-0", TurnStatus::Failed, Some("someone else's turn"))),
        durable(11, ended("turn-1", TurnStatus::Completed, None)),
        Chunk::Hold,
    ];
    let (result, out, state) =
        run_chat(&["turn-1"], vec![first, second], "s1", Some("Weather in Paris?"), "yes\n").await;
    result.unwrap();
    assert_eq!(
        out,
        "Let me check.\n\
         \x20 → tool weather({\"city\":\"Paris\"})\n\
         \x20 ← weather: 18°C, sunny\n\
         \x20 → tool confirm({\"question\":\"Share it?\"})\n\
         \x20 ? confirm({\"question\":\"Share it?\"}) > yes\n\
         \x20 ← confirm: yes\n\
         It is 18°C and sunny.\n"
    );
    assert_eq!(
        state.inputs,
        vec![
            json!({"type": "client.message", "agent_id": "demo",
                   "message": {"role": "user", "content": "Weather in Paris?"}, "stream": true}),
            json!({"type": "tool.result", "id": "c2", "result": "yes"}),
        ]
    );
    assert!(state.auth.iter().all(|a| a.as_deref() == Some("Bearer k1")));
    assert_eq!(state.streams, vec![(Some("0".into()), None), (Some("4".into()), Some("4".into()))]);
}

#[tokio::test]
async fn the_repl_resumes_interrupts_shows_sub_agents_and_survives_a_failed_turn() {
    let interrupt = Interrupt {
        id: "i1".into(),
        reason: "Approve a refund of $5?".into(),
        payload: Some(json!({"amount": 5})),
        anchor: None,
        turn_id: Some("turn-1".into()),
    };
    let spawn = OutboxItem::SpawnChild {
        session_id: "s-child".into(),
        agent_id: "researcher".into(),
        tool_call_id: "c9".into(),
        ancestry: vec!["s-repl".into()],
        identity: WorkerIdentity::default(),
    };
    let turn1 = vec![
        durable(1, recorded(message("m1", Role::User, "Refund me"))),
        durable(2, Event::InterruptOpened { interrupt }),
        Chunk::WaitForAnswer,
        durable(3, Event::InterruptResumed { interrupt_id: "i1".into(), payload: Some(json!("yes please")) }),
        durable(4, recorded(message("m2", Role::Assistant, "Refunded."))),
        durable(5, ended("turn-1", TurnStatus::Completed, None)),
        Chunk::Hold,
    ];
    let turn2 = vec![
        durable(6, recorded(message("m3", Role::User, "break it"))),
        durable(7, Event::OutboxQueued { seq: 1, item: spawn }),
        durable(8, ended("turn-2", TurnStatus::Failed, Some("the model refused"))),
        Chunk::Hold,
    ];
    let typed = "Refund me\nyes please\n\nbreak it\n/quit\nnever read\n";
    let (result, out, state) =
        run_chat(&["turn-1", "turn-2"], vec![turn1, turn2], "s-repl", None, typed).await;
    result.unwrap();
    assert_eq!(
        out,
        "session s-repl, agent demo (/quit or end of input to leave)\n\
         > Refund me\n\
         \x20 ⏸ interrupt i1: Approve a refund of $5?\n\
         \x20   {\"amount\":5}\n\
         \x20 resume > yes please\n\
         Refunded.\n\
         > \n\
         > break it\n\
         \x20 ⇢ sub-agent researcher (session s-child)\n\
         \x20 ✗ the model refused\n\
         > /quit\n"
    );
    let kinds: Vec<_> = state.inputs.iter().map(|i| i["type"].as_str().unwrap().to_owned()).collect();
    assert_eq!(kinds, ["client.message", "interrupt.resume", "client.message"]);
    assert_eq!(
        state.inputs[1],
        json!({"type": "interrupt.resume", "interrupt_id": "i1", "payload": "yes please"})
    );
    // The second turn follows the stream from the seq the summary reported.
    assert_eq!(state.streams, vec![(Some("0".into()), None), (Some("5".into()), None)]);
}

#[tokio::test]
async fn a_failed_turn_fails_a_one_shot_chat() {
    let turn = vec![durable(1, ended("turn-1", TurnStatus::Failed, Some("boom"))), Chunk::Hold];
    let (result, out, _) = run_chat(&["turn-1"], vec![turn], "s1", Some("hi"), "").await;
    assert_eq!(out, "  ✗ boom\n");
    assert!(result.unwrap_err().to_string().contains("did not complete"));
}

#[tokio::test]
async fn events_pages_through_the_log() {
    let log: Vec<(u64, Value)> = (1..=5)
        .map(|seq| {
            (seq, serde_json::to_value(recorded(message(&format!("m{seq}"), Role::User, "hi"))).unwrap())
        })
        .collect();
    let fake = Fake::default();
    fake.state.lock().unwrap().log = log;
    let client = Client::new(&serve(fake).await, None).unwrap();
    let mut out = Vec::new();
    turnstone::cli::events::list(&client, "s1", 1, &mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    let lines: Vec<_> = out.lines().collect();
    assert_eq!(lines.len(), 4);
    assert!(lines[0].starts_with(r#"2 message.recorded {"message":{"content":"hi","id":"m2","#), "{out}");
    assert!(lines[3].starts_with("5 message.recorded "), "{out}");
}

/// A writer the test reads while the command still runs.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn events_follow_resumes_a_dropped_stream() {
    let fake = Fake::default();
    fake.state.lock().unwrap().connections = VecDeque::from([
        vec![
            durable(3, recorded(message("m3", Role::User, "hi"))),
            delta("not in the log"),
            durable(4, ended("turn-1", TurnStatus::Completed, None)),
        ],
        vec![
            durable(4, ended("turn-1", TurnStatus::Completed, None)),
            durable(5, ended("turn-2", TurnStatus::Cancelled, None)),
            Chunk::Hold,
        ],
    ]);
    let client = Client::new(&serve(fake.clone()).await, None).unwrap();
    let shared = Shared::default();
    let mut out = shared.clone();
    let follow = turnstone::cli::events::follow(&client, "s1", 2, &mut out);
    let three_lines = async {
        while String::from_utf8_lossy(&shared.0.lock().unwrap()).lines().count() < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        result = follow => panic!("follow ended: {result:?}"),
        () = three_lines => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => panic!("follow printed too little"),
    }
    let out = String::from_utf8(shared.0.lock().unwrap().clone()).unwrap();
    let heads: Vec<_> = out.lines().map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(heads, ["3 message.recorded", "4 turn.ended", "5 turn.ended"]);
    let streams = fake.state.lock().unwrap().streams.clone();
    assert_eq!(streams, vec![(Some("2".into()), None), (Some("4".into()), Some("4".into()))]);
}

#[tokio::test]
async fn sessions_follow_cursors_up_to_the_limit() {
    let fake = Fake::default();
    fake.state.lock().unwrap().sessions = (1..=6)
        .map(|i| {
            let agent = if i % 2 == 0 { "demo" } else { "other" };
            SessionListing {
                session_id: format!("s{i}"),
                agent_id: agent.into(),
                owner: None,
                version: 1,
                created_at: Timestamp(0),
                updated_at: Timestamp(86_400_000 * i),
            }
        })
        .collect();
    let client = Client::new(&serve(fake.clone()).await, None).unwrap();
    let rows = turnstone::cli::sessions::collect(&client, None, 5).await.unwrap();
    let ids: Vec<_> = rows.iter().map(|r| r.session_id.as_str()).collect();
    assert_eq!(ids, ["s1", "s2", "s3", "s4", "s5"]);
    let rows = turnstone::cli::sessions::collect(&client, Some("demo"), 10).await.unwrap();
    assert_eq!(
        turnstone::cli::sessions::table(&rows),
        "ID  AGENT  UPDATED\n\
         s2  demo   1970-01-03 00:00:00Z\n\
         s4  demo   1970-01-05 00:00:00Z\n\
         s6  demo   1970-01-07 00:00:00Z\n"
    );
    let queries = fake.state.lock().unwrap().session_queries.clone();
    let limits: Vec<_> = queries.iter().map(|q| q["limit"].as_str()).collect();
    assert_eq!(limits, ["5", "3", "1", "10", "8"]);
    assert_eq!(queries[4].get("cursor").map(String::as_str), Some("2"));
    assert_eq!(queries[4].get("agent").map(String::as_str), Some("demo"));
}

//! End to end through the HTTP API of a local host running in this process (a real SQLite file,
//! the in-process queue, `host::serve`), against the fake OpenAI server for the model and the
//! fake worker for decisions. Each test asserts the exact transcript, statuses and errors a
//! client sees.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tempfile::TempDir;
use turnstone_engine::protocol::{
    Action, DecisionResponse, ErrorCode, InterruptAction, LlmResultAction, ReasoningConfig, ToolInput,
    Trigger,
};
use turnstone_engine::session::TurnStatus;
use turnstone_runtime::api::{LoggedEvent, SessionStatus, Turn};
use turnstone_tests::{
    FakeAnswer, FakeAnthropic, FakeOpenAi, FakeToolCall, FakeWorker, FrameExt, Gate, Reply, SseFrame,
    TestHost, tools_script,
};

/// Long enough for anything a test waits on; tests finish in well under a second each when
/// nothing is wrong.
const PATIENCE: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------
// Helpers

/// Short policies so retries and timeouts play out in milliseconds.
const FAST_DEFAULTS: &str = r#"
[defaults]
llm = { timeout_secs = 5, max_retries = 1, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }
tool = { timeout_secs = 5, max_retries = 0, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }
decision = { timeout_secs = 5, max_retries = 2, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }
"#;

/// A config: the fast defaults, one `[llm.fake]` on `openai`, and `agents` (TOML).
fn config(openai: &FakeOpenAi, agents: &str) -> String {
    format!(
        "{FAST_DEFAULTS}\n[llm.fake]\ntype = \"openai\"\nbase_url = \"{}\"\n\n{agents}",
        openai.base_url()
    )
}

/// The tool declarations of the calculator agents.
const CALC_TOOLS: &str = r#"
[[agent.calc.tools]]
name = "add"
description = "Adds two numbers."
input = { type = "object", properties = { a = { type = "number" }, b = { type = "number" } }, required = ["a", "b"] }

[[agent.calc.tools]]
name = "upper"
description = "Upper-cases a text."
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
"#;

/// A worker agent `calc` with the two calculator tools.
fn calc_agent(worker: &FakeWorker) -> String {
    format!(
        "[agent.calc]\nmodel = \"gpt-fake\"\nsystem = \"You calculate.\"\nllm = \"fake\"\nworker = \"{}\"\n{CALC_TOOLS}",
        worker.url()
    )
}

/// The calculator tools' implementation.
fn calculate(name: &str, args: &Value) -> Result<Value, String> {
    match name {
        "add" => Ok(json!(args["a"].as_f64().unwrap() + args["b"].as_f64().unwrap())),
        "upper" => Ok(json!(args["text"].as_str().unwrap().to_uppercase())),
        other => Err(format!("no tool {other}")),
    }
}

fn message(agent: &str, text: &str) -> Value {
    json!({"type": "client.message", "agent_id": agent, "message": {"role": "user", "content": text}})
}

fn message_as(agent: &str, text: &str, turn_id: &str) -> Value {
    let mut m = message(agent, text);
    m["turn_id"] = json!(turn_id);
    m
}

/// A worker that takes every proposal, its model calls with `reasoning`, streamed or not.
async fn reasoning_worker(reasoning: ReasoningConfig, stream: bool) -> FakeWorker {
    FakeWorker::start(None, move |request, _| {
        let mut response = request.proposed.clone();
        for action in response.actions.iter_mut().flatten() {
            if let Action::LlmCall(call) = action {
                call.reasoning = Some(reasoning.clone());
                call.stream = Some(stream);
            }
        }
        FakeAnswer::Respond(response)
    })
    .await
}

/// Starts a host on `config` in a fresh temporary directory (kept alive by the returned guard).
async fn host(config: &str) -> (TestHost, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(config, dir.path()).await;
    (host, dir)
}

/// `(role, content)` of each message, tool calls shown as `name(args)#id`, tool messages as
/// `tool_call_id=content`.
fn transcript(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap();
            let content = m["content"].as_str().unwrap_or_default();
            match (role, m.get("tool_calls")) {
                ("assistant", Some(calls)) => {
                    let calls: Vec<String> = calls
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|c| {
                            format!(
                                "{}({})#{}",
                                c["function"]["name"].as_str().unwrap(),
                                c["function"]["arguments"].as_str().unwrap(),
                                c["id"].as_str().unwrap()
                            )
                        })
                        .collect();
                    format!("assistant: {content}[{}]", calls.join(", "))
                }
                ("tool", _) => format!(
                    "tool {}/{}: {content}",
                    m["name"].as_str().unwrap_or_default(),
                    m["tool_call_id"].as_str().unwrap()
                ),
                _ => format!("{role}: {content}"),
            }
        })
        .collect()
}

/// The OpenAI request's messages, as `role: content` (tool messages with their call id).
fn openai_transcript(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap();
            let content = m["content"].as_str().unwrap_or_default();
            match role {
                "tool" => format!("tool {}: {content}", m["tool_call_id"].as_str().unwrap()),
                "assistant" if m.get("tool_calls").is_some() => {
                    let ids: Vec<&str> = m["tool_calls"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|c| c["id"].as_str().unwrap())
                        .collect();
                    format!("assistant: {content}{ids:?}")
                }
                _ => format!("{role}: {content}"),
            }
        })
        .collect()
}

fn event_types(events: &[LoggedEvent<Value>]) -> Vec<String> {
    events.iter().map(|e| e.event["type"].as_str().unwrap().to_owned()).collect()
}

// ---------------------------------------------------------------------------------------------
// Plain replies

/// An engine-hosted agent answers with the model's text: the transcript is the user message and
/// the reply (whose id is the LLM call's), the turn completes with the text as its data, and
/// the model got the system prompt and the user message, not streamed.
#[tokio::test(flavor = "multi_thread")]
async fn plain_reply() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::text("Hello there, friend.").usage(7, 4));
    let agents = "[agent.plain]\nmodel = \"gpt-fake\"\nsystem = \"Be brief.\"\nllm = \"fake\"\n";
    let (host, _dir) = host(&config(&openai, agents)).await;

    let (status, body) = host.submit("s-plain", &message_as("plain", "Hi!", "turn-1")).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body, json!({"session_id": "s-plain", "turn_id": "turn-1", "queued": false}));

    let turn = host.wait_turn("s-plain", "turn-1").await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    assert_eq!(turn.data, Some(json!("Hello there, friend.")));
    assert_eq!(turn.error, None);

    let messages = host.messages("s-plain").await;
    assert_eq!(transcript(&messages), ["user: Hi!", "assistant: Hello there, friend."]);
    assert_eq!(messages[0]["content"], "Hi!");
    // The reply's id is its LLM call's.
    let events = host.events("s-plain", 0).await;
    let call = events.iter().find(|e| e.event["type"] == "call_created").expect("a call.created event");
    assert_eq!(call.event["call"]["spec"]["kind"], "llm_call");
    assert_eq!(messages[1]["id"], call.event["call"]["id"]);

    assert_eq!(openai.request_count(), 1);
    let request = openai.last_request();
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.body["model"], "gpt-fake");
    assert_ne!(request.body["stream"], json!(true));
    assert_eq!(openai_transcript(&request.body), ["system: Be brief.", "user: Hi!"]);

    let summary = host.summary("s-plain").await;
    assert_eq!(summary.status, SessionStatus::Idle);
    assert_eq!(summary.agent_id, "plain");
    assert_eq!(summary.active_turn, None);
    assert_eq!(summary.usage.llm_calls, 1);
    assert_eq!(summary.messages, 2);
    host.stop().await;
}

/// The session as an Agent Host Protocol chat: each turn with its user message, its reply as a
/// markdown part and its end state, a worker's tool call completed with its result inside its
/// turn; old turns paged newest first.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_an_ahp_chat() {
    let openai = FakeOpenAi::start().await;
    for n in 1..=3 {
        openai.push(Reply::text(format!("Reply {n}.")));
    }
    let agents = "[agent.plain]\nmodel = \"gpt-fake\"\nllm = \"fake\"\n";
    let (host, _dir) = host(&config(&openai, agents)).await;
    for n in 1..=3 {
        let turn_id = format!("turn-{n}");
        host.submit_ok("s-chat", &message_as("plain", &format!("Question {n}?"), &turn_id)).await;
        assert_eq!(host.wait_turn("s-chat", &turn_id).await.status, TurnStatus::Completed);
    }
    let chat: Value = host.get_ok("/v1/sessions/s-chat/chat").await;
    assert_eq!(chat["resource"], "ahp-chat:/s-chat");
    let turns = chat["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 3, "{chat}");
    for (n, turn) in (1..).zip(turns) {
        assert_eq!(turn["id"], format!("turn-{n}"));
        assert_eq!(turn["state"], "complete");
        assert_eq!(turn["message"]["text"], format!("Question {n}?"));
        let parts = turn["responseParts"].as_array().expect("parts");
        assert_eq!((parts.len(), &parts[0]["kind"]), (1, &json!("markdown")), "{turn}");
        assert_eq!(parts[0]["content"], format!("Reply {n}."));
    }
    assert!(chat["activeTurn"].is_null() && chat["turnsNextCursor"].is_null(), "{chat}");

    // Paged: the newest two, then what comes before.
    let page: Value = host.get_ok("/v1/sessions/s-chat/chat?turns=2").await;
    let ids =
        |page: &Value| page["turns"].as_array().unwrap().iter().map(|t| t["id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&page), [json!("turn-2"), json!("turn-3")]);
    let cursor = page["turnsNextCursor"].as_str().expect("a cursor to older turns").to_owned();
    let older: Value = host.get_ok(&format!("/v1/sessions/s-chat/chat?turns=2&cursor={cursor}")).await;
    assert_eq!(ids(&older), [json!("turn-1")]);
    assert!(older["turnsNextCursor"].is_null());
    let (status, body) = host.get("/v1/sessions/s-chat/chat?cursor=turns-before.9").await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_cursor")), "{body}");
    host.stop().await;
}

/// A streaming agent: while the model's stream is paused halfway, the SSE log already carries
/// the `llm.token.delta` events of what arrived, in order; after it resumes, the deltas add up
/// to the final text and `message.recorded` carries the whole reply, after every delta.
#[tokio::test(flavor = "multi_thread")]
async fn streaming_reply_reaches_the_event_stream() {
    let openai = FakeOpenAi::start().await;
    let text = "The quick brown fox jumps over";
    // Give the event stream time to subscribe, then send the role chunk and three words, then
    // wait for the test.
    openai.push(Reply::text(text).delay(Duration::from_millis(300)).pause_after(4));
    let agents = "[agent.streamer]\nmodel = \"gpt-fake\"\nstream = true\nllm = \"fake\"\n";
    let (host, _dir) = host(&config(&openai, agents)).await;

    let turn_id = host.submit_ok("s-stream", &message("streamer", "Tell me.")).await;
    let mut stream = host.stream("s-stream", None).await;
    if !host.streams_deltas() {
        // Split across functions: the stream shows the durable reply, and no delta.
        openai.release();
        let frames = stream.until(PATIENCE, |f| f.event == "turn.ended").await;
        assert!(frames.iter().all(|f| f.event != "llm.token.delta"), "{frames:?}");
        let reply = frames
            .iter()
            .find(|f| f.event == "message.recorded" && f.json()["message"]["role"] == "assistant");
        assert_eq!(reply.expect("the reply is recorded").json()["message"]["content"], text);
        return;
    }

    let mut deltas = String::new();
    let mut frames = Vec::new();
    while !deltas.contains("The quick brown") {
        let frame = stream.next(PATIENCE).await.expect("a frame while the model streams");
        if frame.event == "llm.token.delta" {
            assert_eq!(frame.id, None, "deltas are not durable");
            deltas.push_str(frame.json()["delta"]["text"].as_str().unwrap_or_default());
        }
        frames.push(frame);
    }
    assert_eq!(deltas, "The quick brown", "in order, nothing more yet");
    // The call is still running.
    let turn: Turn = host.get_ok(&format!("/v1/sessions/s-stream/turns/{turn_id}")).await;
    assert_eq!(turn.status, TurnStatus::Active);
    assert!(frames.iter().all(|f| f.event != "message.recorded" || f.json()["message"]["role"] == "user"));

    openai.release();
    frames.extend(stream.until(PATIENCE, |f| f.event == "turn.ended").await);
    let mut all_deltas = String::new();
    let mut recorded_at = None;
    for (i, frame) in frames.iter().enumerate() {
        match frame.event.as_str() {
            "llm.token.delta" => {
                assert!(recorded_at.is_none(), "a delta after the message was recorded");
                all_deltas.push_str(frame.json()["delta"]["text"].as_str().unwrap_or_default());
            }
            "message.recorded" if frame.json()["message"]["role"] == "assistant" => {
                assert_eq!(frame.json()["message"]["content"], text);
                recorded_at = Some(i);
            }
            _ => {}
        }
    }
    assert_eq!(all_deltas, text);
    assert!(recorded_at.is_some(), "no message.recorded for the reply");
    drop(stream);

    let turn = host.wait_turn("s-stream", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed);
    assert_eq!(
        transcript(&host.messages("s-stream").await),
        ["user: Tell me.", format!("assistant: {text}").as_str()]
    );
    assert_eq!(openai.last_request().body["stream"], true);
    host.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Tools

/// The model calls two worker tools at once, then answers: the worker executes both (each
/// `tool.execute` carries the validated input), the transcript is user, assistant with both
/// calls, one tool message per call, the answer; the model's second request carries both
/// results; the worker saw the decisions in the order the engine delivers them.
#[tokio::test(flavor = "multi_thread")]
async fn tool_loop_with_two_parallel_worker_tools() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::tool_calls([
        FakeToolCall::new("call_add", "add", r#"{"a":2,"b":3}"#),
        FakeToolCall::new("call_up", "upper", r#"{"text":"hi"}"#),
    ]));
    openai.push(Reply::text("2+3 is 5 and hi is HI."));
    let worker = FakeWorker::tools(None, calculate).await;
    let (host, _dir) = host(&config(&openai, &calc_agent(&worker))).await;

    let turn_id = host.submit_ok("s-tools", &message("calc", "Add 2 and 3; shout hi.")).await;
    let turn = host.wait_turn("s-tools", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    assert_eq!(turn.data, Some(json!("2+3 is 5 and hi is HI.")));

    assert_eq!(
        transcript(&host.messages("s-tools").await),
        [
            "user: Add 2 and 3; shout hi.",
            r#"assistant: [add({"a":2,"b":3})#call_add, upper({"text":"hi"})#call_up]"#,
            "tool add/call_add: 5.0",
            "tool upper/call_up: HI",
            "assistant: 2+3 is 5 and hi is HI.",
        ]
    );
    assert_eq!(
        worker.trigger_names(),
        [
            "session.start",
            "client.messages",
            "llm.finished",
            "tool.execute",
            "tool.execute",
            "tool.finished",
            "tool.finished",
            "llm.finished",
        ]
    );
    let executes: Vec<_> = worker
        .records()
        .into_iter()
        .filter_map(|r| match r.request.trigger {
            Trigger::ToolExecute(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(executes[0].id, "call_add");
    assert_eq!(executes[0].input, ToolInput::Valid { value: json!({"a": 2, "b": 3}) });
    assert_eq!(executes[0].attempt, 1);
    assert!(executes[0].deadline.is_some());
    assert_eq!(executes[1].id, "call_up");
    assert_eq!(executes[1].arguments, r#"{"text":"hi"}"#);
    for record in worker.records() {
        assert_eq!(record.request.session_id, "s-tools");
        assert_eq!(record.request.agent_id, "calc");
        assert_eq!(record.verified, None);
        assert_eq!(record.delivery_no, 1);
        assert_eq!(record.idempotency_key, Some(format!("{}:1", record.request.decision_id)));
    }
    // The tool messages reach the model.
    assert_eq!(openai.request_count(), 2);
    assert_eq!(
        openai_transcript(&openai.requests()[1].body),
        [
            "system: You calculate.",
            "user: Add 2 and 3; shout hi.",
            r#"assistant: ["call_add", "call_up"]"#,
            "tool call_add: 5.0",
            "tool call_up: HI",
        ]
    );
    let first_request = openai.requests()[0].body.clone();
    let tools: Vec<&str> = first_request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["add", "upper"]);
    host.stop().await;
}

/// A worker that asks for the last messages only (`worker_messages`) gets them and their nodes,
/// not the conversation, in every decision request: the request's size stays that of its
/// window however long the session grows. Its echo of the window plus news continues the
/// branch at the head, as the whole path's would; the model still sees the whole conversation.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_asking_for_the_last_messages_gets_only_them() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::tool_calls([FakeToolCall::new("call_add", "add", r#"{"a":2,"b":3}"#)]));
    openai.push(Reply::text("5."));
    openai.push(Reply::text("Still 5."));
    let execute = tools_script(calculate);
    // At the second turn's end, the worker echoes its window and adds a note of its own.
    let worker = FakeWorker::start(None, move |request, _| match &request.trigger {
        Trigger::LlmFinished(_)
            if request.messages.last().is_some_and(|m| m.content_text() == "And again?") =>
        {
            // The proposal: the window, then the model's reply.
            let mut messages = request.proposed.messages.clone().unwrap_or_default();
            assert_eq!(messages.len(), 4, "{messages:?}");
            messages.push(turnstone_engine::protocol::DraftMessage::text(
                turnstone_engine::protocol::Role::Assistant,
                "(noted)",
            ));
            FakeAnswer::Respond(DecisionResponse { messages: Some(messages), ..request.proposed.clone() })
        }
        _ => execute(request),
    })
    .await;
    let agent = calc_agent(&worker).replace("worker = ", "worker_messages = 3\nworker = ");
    let (host, _dir) = host(&config(&openai, &agent)).await;

    let first = host.submit_ok("s-window", &message("calc", "Add 2 and 3.")).await;
    assert_eq!(host.wait_turn("s-window", &first).await.status, TurnStatus::Completed);
    let second = host.submit_ok("s-window", &message("calc", "And again?")).await;
    assert_eq!(host.wait_turn("s-window", &second).await.status, TurnStatus::Completed);

    let messages = host.messages("s-window").await;
    assert_eq!(
        transcript(&messages),
        [
            "user: Add 2 and 3.",
            r#"assistant: [add({"a":2,"b":3})#call_add]"#,
            "tool add/call_add: 5.0",
            "assistant: 5.",
            "user: And again?",
            "assistant: Still 5.",
            "assistant: (noted)",
        ]
    );
    let ids: Vec<&str> = messages.iter().map(|m| m["id"].as_str().unwrap()).collect();
    let records = worker.records();
    assert_eq!(records.len(), 8, "{:?}", worker.trigger_names());
    for record in &records {
        let request = &record.request;
        // The window ends at the head the decision saw: the path's last (at most) 3 messages.
        let head = request.message_tree.head_id.as_ref().map(|h| h.as_str());
        let end = head.map_or(0, |h| ids.iter().position(|id| *id == h).unwrap() + 1);
        let window: Vec<&str> = request.messages.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(window, ids[end.saturating_sub(3)..end], "{}", record.trigger_name());
        // The tree holds just those nodes, each with its parent: the first one's names the
        // message before the window.
        let nodes: Vec<&str> = request.message_tree.nodes.iter().map(|n| n.message.id.as_str()).collect();
        assert_eq!(nodes, window);
        let parents: Vec<Option<&str>> =
            request.message_tree.nodes.iter().map(|n| n.parent_id.as_ref().map(|p| p.as_str())).collect();
        let expected: Vec<Option<&str>> =
            (end.saturating_sub(3)..end).map(|i| i.checked_sub(1).map(|p| ids[p])).collect();
        assert_eq!(parents, expected);
    }
    // The last decision (the second turn's answer) saw 3 of the 6 messages then recorded.
    assert_eq!(records.last().unwrap().request.messages.len(), 3);
    // The second turn's view: the window's 3 recorded messages, then the news, which
    // `new_from` counts from there; the proposal (record the view) is cut the same way.
    let second_view = &records[6].request;
    let Trigger::ClientMessages(view) = &second_view.trigger else { panic!("{}", records[6].trigger_name()) };
    let texts: Vec<String> = view.messages.iter().map(|m| m.content_text()).collect();
    assert_eq!(texts, ["", "5.0", "5.", "And again?"]);
    assert_eq!(view.new_from, 3);
    let view_ids: Vec<Option<&str>> =
        view.messages.iter().map(|m| m.id.as_ref().map(|id| id.as_str())).collect();
    assert_eq!(view_ids[..3], ids[1..4].iter().map(|id| Some(*id)).collect::<Vec<_>>());
    assert_eq!(second_view.proposed.messages.as_ref().map(Vec::len), Some(4));
    // The model got the whole conversation.
    assert_eq!(
        openai_transcript(&openai.requests()[2].body),
        [
            "system: You calculate.",
            "user: Add 2 and 3.",
            r#"assistant: ["call_add"]"#,
            "tool call_add: 5.0",
            "assistant: 5.",
            "user: And again?"
        ]
    );
    host.stop().await;
}

/// The model calls a tool with arguments that violate its schema: the engine proposes a
/// terminal `tool.error` naming the problem, the worker accepts it (executing nothing), and
/// the model's second request sees that error text in the tool message.
#[tokio::test(flavor = "multi_thread")]
async fn tool_with_invalid_arguments() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::tool_calls([FakeToolCall::new("call_bad", "add", r#"{"a":"two"}"#)]));
    openai.push(Reply::text("Sorry, I got the arguments wrong."));
    let executed = Arc::new(AtomicUsize::new(0));
    let counter = executed.clone();
    let worker = FakeWorker::tools(None, move |name, args| {
        counter.fetch_add(1, Ordering::SeqCst);
        calculate(name, args)
    })
    .await;
    let (host, _dir) = host(&config(&openai, &calc_agent(&worker))).await;

    let turn_id = host.submit_ok("s-invalid", &message("calc", "Add two.")).await;
    let turn = host.wait_turn("s-invalid", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    assert_eq!(executed.load(Ordering::SeqCst), 0, "the worker executed nothing");

    let execute = worker
        .records()
        .into_iter()
        .find(|r| r.trigger_name() == "tool.execute")
        .expect("a tool.execute delivery");
    let Trigger::ToolExecute(t) = &execute.request.trigger else { unreachable!() };
    let ToolInput::Invalid { value, error } = &t.input else { panic!("input: {:?}", t.input) };
    assert_eq!(value, &json!({"a": "two"}));
    assert!(!error.is_empty());
    let proposed = execute.request.proposed.actions();
    let [Action::ToolError(proposed_error)] = proposed else { panic!("proposed: {proposed:?}") };
    assert_eq!(proposed_error.retryable, Some(false));
    let error_text = proposed_error.error.clone();
    assert!(error_text.starts_with("invalid arguments for tool add: "), "{error_text}");

    let messages = host.messages("s-invalid").await;
    assert_eq!(
        transcript(&messages),
        [
            "user: Add two.".to_owned(),
            r#"assistant: [add({"a":"two"})#call_bad]"#.to_owned(),
            format!("tool add/call_bad: {error_text}"),
            "assistant: Sorry, I got the arguments wrong.".to_owned(),
        ]
    );
    let second = &openai.requests()[1].body;
    let tool_message = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool_message["tool_call_id"], "call_bad");
    assert_eq!(tool_message["content"], error_text.as_str());
    host.stop().await;
}

/// A client tool: the turn waits, the summary shows the pending client call (id, name,
/// arguments, attempt); a `tool.result` ClientInput answers it and the turn completes with the
/// result in the transcript. Settling it again is refused.
#[tokio::test(flavor = "multi_thread")]
async fn client_tool_answered_through_tool_result() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::tool_calls([FakeToolCall::new("call_ask", "confirm", r#"{"question":"Deploy?"}"#)]));
    openai.push(Reply::text("Deploying, as you confirmed."));
    let agents = r#"
[agent.asker]
model = "gpt-fake"
llm = "fake"

[[agent.asker.tools]]
name = "confirm"
description = "Asks the user."
handler = "client"
input = { type = "object", properties = { question = { type = "string" } }, required = ["question"] }
"#;
    let (host, _dir) = host(&config(&openai, agents)).await;

    let turn_id = host.submit_ok("s-client", &message("asker", "Deploy it.")).await;
    let summary = host.wait_summary("s-client", PATIENCE, |s| !s.pending_client_calls.is_empty()).await;
    assert_eq!(summary.status, SessionStatus::Waiting);
    assert_eq!(summary.active_turn.as_deref(), Some(turn_id.as_str()));
    assert_eq!(
        serde_json::to_value(&summary.pending_client_calls).unwrap(),
        json!([{"id": "call_ask", "name": "confirm", "arguments": r#"{"question":"Deploy?"}"#, "attempt": 1}])
    );
    let turn: Turn = host.get_ok(&format!("/v1/sessions/s-client/turns/{turn_id}")).await;
    assert_eq!(turn.status, TurnStatus::Active);

    let (status, body) =
        host.submit("s-client", &json!({"type": "tool.result", "id": "call_ask", "result": "yes"})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["turn_id"], Value::Null);

    let turn = host.wait_turn("s-client", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    assert_eq!(
        transcript(&host.messages("s-client").await),
        [
            "user: Deploy it.",
            r#"assistant: [confirm({"question":"Deploy?"})#call_ask]"#,
            "tool confirm/call_ask: yes",
            "assistant: Deploying, as you confirmed.",
        ]
    );
    let summary = host.summary("s-client").await;
    assert_eq!(serde_json::to_value(&summary.pending_client_calls).unwrap(), json!([]));
    assert_eq!(summary.status, SessionStatus::Idle);

    let (status, body) =
        host.submit("s-client", &json!({"type": "tool.result", "id": "call_ask", "result": "again"})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "call_already_settled");
    host.stop().await;
}

/// A tool declared `approval = "always"`: its call waits, listed under `awaiting_approval`,
/// until a `tool.approval` input approves it (then it runs: here a client tool, so it becomes a
/// pending client call) or denies it (the model is told why, and the turn goes on).
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_needing_approval_waits_for_a_tool_approval_input() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::tool_calls([FakeToolCall::new("call_1", "deploy", "{}")]));
    openai.push(Reply::text("Deployed."));
    openai.push(Reply::tool_calls([FakeToolCall::new("call_2", "deploy", "{}")]));
    openai.push(Reply::text("Not deploying, then."));
    let agents = r#"
[agent.guarded]
model = "gpt-fake"
llm = "fake"

[[agent.guarded.tools]]
name = "deploy"
description = "Deploys."
handler = "client"
approval = "always"
"#;
    let (host, _dir) = host(&config(&openai, agents)).await;
    let approve = |id: &str, approved: bool, reason: Option<&str>| json!({"type": "tool.approval", "id": id, "approved": approved, "reason": reason});

    let first = host.submit_ok("s-approve", &message("guarded", "Deploy.")).await;
    let summary = host.wait_summary("s-approve", PATIENCE, |s| !s.awaiting_approval.is_empty()).await;
    assert_eq!(summary.status, SessionStatus::Waiting);
    assert_eq!(serde_json::to_value(&summary.awaiting_approval).unwrap()[0]["id"], "call_1");
    assert!(summary.pending_client_calls.is_empty(), "not started before approval");
    let (status, body) = host.submit("s-approve", &approve("call_1", true, None)).await;
    assert_eq!(status, 202, "{body}");
    let summary = host.wait_summary("s-approve", PATIENCE, |s| !s.pending_client_calls.is_empty()).await;
    assert!(summary.awaiting_approval.is_empty());
    let (status, body) = host.submit("s-approve", &approve("call_1", true, None)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("not_awaiting_approval")), "{body}");
    let (status, _) =
        host.submit("s-approve", &json!({"type": "tool.result", "id": "call_1", "result": "ok"})).await;
    assert_eq!(status, 202);
    assert_eq!(host.wait_turn("s-approve", &first).await.status, TurnStatus::Completed);

    let second = host.submit_ok("s-approve", &message("guarded", "Deploy again.")).await;
    host.wait_summary("s-approve", PATIENCE, |s| !s.awaiting_approval.is_empty()).await;
    let (status, body) = host.submit("s-approve", &approve("call_2", false, Some("not on Fridays"))).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(host.wait_turn("s-approve", &second).await.status, TurnStatus::Completed);
    let denial = "the user denied this call of deploy: not on Fridays";
    assert_eq!(
        transcript(&host.messages("s-approve").await)[4..],
        [
            "user: Deploy again.".to_owned(),
            "assistant: [deploy({})#call_2]".to_owned(),
            format!("tool deploy/call_2: {denial}"),
            "assistant: Not deploying, then.".to_owned(),
        ]
    );
    let told = &openai.requests()[3].body;
    assert_eq!(told["messages"].as_array().unwrap().last().unwrap()["content"], denial);
    let (status, body) = host.submit("s-approve", &approve("call_9", true, None)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("unknown_call")), "{body}");
    host.stop().await;
}

/// `?steer=true`: a message sent while a turn waits on a tool call enters that turn after the
/// tool's result and before the next model call; its turn id then names the running turn.
#[tokio::test(flavor = "multi_thread")]
async fn a_steering_message_enters_the_running_turn_at_its_next_model_call() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::tool_calls([FakeToolCall::new("call_s", "confirm", "{}")]));
    openai.push(Reply::text("Done, and hi."));
    let agents = r#"
[agent.steered]
model = "gpt-fake"
llm = "fake"

[[agent.steered.tools]]
name = "confirm"
handler = "client"
"#;
    let (host, _dir) = host(&config(&openai, agents)).await;
    let turn_id = host.submit_ok("s-steer", &message("steered", "Do it.")).await;
    host.wait_summary("s-steer", PATIENCE, |s| !s.pending_client_calls.is_empty()).await;

    let path = "/v1/sessions/s-steer/inputs";
    let (status, body) = host.post(&format!("{path}?steer=true&queue=true"), &message("steered", "x")).await;
    assert_eq!((status, body["error"]["param"].as_str()), (422, Some("steer")), "{body}");
    let action = json!({"type": "client.action", "agent_id": "steered", "name": "go"});
    let (status, body) = host.post(&format!("{path}?steer=true"), &action).await;
    assert_eq!((status, body["error"]["param"].as_str()), (422, Some("steer")), "{body}");
    let (status, body) =
        host.post(&format!("{path}?steer=true"), &message_as("steered", "Also say hi.", "steer-1")).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!((body["turn_id"].as_str(), body["queued"].as_bool()), (Some("steer-1"), Some(true)));
    assert_eq!(host.messages("s-steer").await.len(), 2, "not between the call and its result");

    let (status, _) =
        host.submit("s-steer", &json!({"type": "tool.result", "id": "call_s", "result": "confirmed"})).await;
    assert_eq!(status, 202);
    let turn = host.wait_turn("s-steer", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed);
    assert_eq!(
        transcript(&host.messages("s-steer").await),
        [
            "user: Do it.",
            "assistant: [confirm({})#call_s]",
            "tool confirm/call_s: confirmed",
            "user: Also say hi.",
            "assistant: Done, and hi.",
        ]
    );
    let asked = openai.requests()[1].body["messages"].as_array().unwrap().clone();
    assert_eq!(asked.last().unwrap()["content"], "Also say hi.");
    let steered: Turn = host.get_ok("/v1/sessions/s-steer/turns/steer-1").await;
    assert_eq!(steered.id.as_str(), turn_id, "the steering id names the turn it joined");
    host.stop().await;
}

/// `POST /v1/sessions/{id}/forks`: a new session continuing the conversation through a
/// completed turn; the source goes on unchanged; the same fork again writes nothing (200);
/// an unknown turn is 404, a cancelled one 422, a taken id 409.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_continues_the_conversation_through_a_completed_turn() {
    let openai = FakeOpenAi::start().await;
    for text in ["One.", "Two.", "Fork reply."] {
        openai.push(Reply::text(text));
    }
    let (host, _dir) = host(&config(&openai, "[agent.plain]\nmodel = \"gpt-fake\"\nllm = \"fake\"\n")).await;
    for (text, turn) in [("First?", "t-1"), ("Second?", "t-2")] {
        host.submit_ok("s-src", &message_as("plain", text, turn)).await;
        assert_eq!(host.wait_turn("s-src", turn).await.status, TurnStatus::Completed);
    }
    let (status, body) =
        host.post("/v1/sessions/s-src/forks", &json!({"turn_id": "t-1", "session_id": "s-fork"})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body,
        json!({"session_id": "s-fork", "forked_from": {"session_id": "s-src", "turn_id": "t-1"}})
    );
    assert_eq!(transcript(&host.messages("s-fork").await), ["user: First?", "assistant: One."]);
    let turn = host.submit_ok("s-fork", &message("plain", "Instead?")).await;
    assert_eq!(host.wait_turn("s-fork", &turn).await.status, TurnStatus::Completed);
    assert_eq!(
        transcript(&host.messages("s-fork").await),
        ["user: First?", "assistant: One.", "user: Instead?", "assistant: Fork reply."]
    );
    assert_eq!(host.messages("s-src").await.len(), 4, "the source is unchanged");
    let origin = host.summary("s-fork").await.forked_from.expect("a fork names its origin");
    assert_eq!((origin.session_id.as_str(), origin.turn_id.as_str()), ("s-src", "t-1"));
    assert_eq!(host.summary("s-src").await.forked_from, None);
    let chat: Value = host.get_ok("/v1/sessions/s-fork/chat").await;
    assert_eq!(chat["turns"].as_array().unwrap().len(), 2, "the copied turn, then its own");
    assert_eq!(chat["origin"], json!({"kind": "fork", "chat": "ahp-chat:/s-src", "turnId": "t-1"}));

    let (status, _) =
        host.post("/v1/sessions/s-src/forks", &json!({"turn_id": "t-1", "session_id": "s-fork"})).await;
    assert_eq!(status, 200, "the same fork again");
    let (status, body) =
        host.post("/v1/sessions/s-src/forks", &json!({"turn_id": "t-2", "session_id": "s-fork"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("session_exists")), "{body}");
    let (status, body) = host.post("/v1/sessions/s-src/forks", &json!({"turn_id": "t-9"})).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = host.post("/v1/sessions/s-src/forks", &json!({"turn": "t-1"})).await;
    assert_eq!((status, body["error"]["param"].as_str()), (422, Some("turn")), "{body}");
    let (status, body) = host.post("/v1/sessions/s-src/forks", &json!({"turn_id": "t-2"})).await;
    assert_eq!(status, 201, "{body}");
    assert!(body["session_id"].as_str().unwrap().starts_with("fork-"), "{body}");
    host.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Interrupts

/// The worker answers the model's question with an `interrupt`: the summary shows it open and
/// the session waiting; an unknown id gets 404 `unknown_interrupt`; resuming the open one with
/// a payload delivers `interrupt.resumed` with that payload, and the turn goes on to complete.
#[tokio::test(flavor = "multi_thread")]
async fn interrupt_resumed_through_interrupt_resume() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::text("Shall I deploy?"));
    openai.push(Reply::text("Deployed."));
    let worker = FakeWorker::start(None, |request, _| match &request.trigger {
        Trigger::LlmFinished(t)
            if t.message.as_ref().is_some_and(|m| m.content_text() == "Shall I deploy?") =>
        {
            FakeAnswer::Respond(DecisionResponse {
                messages: request.proposed.messages.clone(),
                actions: Some(vec![Action::Interrupt(InterruptAction {
                    interrupt_id: Some("int_approve".into()),
                    reason: "needs approval".into(),
                    payload: Some(json!({"plan": "deploy v2"})),
                })]),
                ..DecisionResponse::default()
            })
        }
        _ => FakeAnswer::Accept,
    })
    .await;
    let agents =
        format!("[agent.ops]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\n", worker.url());
    let (host, _dir) = host(&config(&openai, &agents)).await;

    let turn_id = host.submit_ok("s-int", &message("ops", "Deploy v2.")).await;
    let summary = host.wait_summary("s-int", PATIENCE, |s| !s.open_interrupts.is_empty()).await;
    assert_eq!(summary.status, SessionStatus::Waiting);
    assert_eq!(summary.active_turn.as_deref(), Some(turn_id.as_str()));
    assert_eq!(
        serde_json::to_value(&summary.open_interrupts).unwrap(),
        json!([{"id": "int_approve", "reason": "needs approval", "payload": {"plan": "deploy v2"}}])
    );
    assert_eq!(transcript(&host.messages("s-int").await), ["user: Deploy v2.", "assistant: Shall I deploy?"]);

    let (status, body) =
        host.submit("s-int", &json!({"type": "interrupt.resume", "interrupt_id": "int_nope"})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_interrupt");
    assert!(body["error"]["message"].as_str().unwrap().contains("int_nope"), "{body}");

    let payload = json!({"approved": true, "by": "alice"});
    let (status, body) = host
        .submit(
            "s-int",
            &json!({"type": "interrupt.resume", "interrupt_id": "int_approve", "payload": payload}),
        )
        .await;
    assert_eq!(status, 202, "{body}");

    let turn = host.wait_turn("s-int", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    assert_eq!(turn.data, Some(json!("Deployed.")));
    let resumed = worker
        .records()
        .into_iter()
        .find(|r| r.trigger_name() == "interrupt.resumed")
        .expect("an interrupt.resumed delivery");
    let Trigger::InterruptResumed(t) = &resumed.request.trigger else { unreachable!() };
    assert_eq!(t.interrupt_id, "int_approve");
    assert_eq!(t.payload, Some(payload));
    assert_eq!(
        transcript(&host.messages("s-int").await),
        ["user: Deploy v2.", "assistant: Shall I deploy?", "assistant: Deployed."]
    );
    let summary = host.summary("s-int").await;
    assert_eq!(serde_json::to_value(&summary.open_interrupts).unwrap(), json!([]));
    assert_eq!(summary.status, SessionStatus::Idle);
    host.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Sub-agents

/// The parent's model calls the sub-agent's tool: a child session runs on its own agent (a
/// worker agent on its own model server), its worker sees the parent in `ancestry`, and the
/// child's answer becomes the parent's tool message before the parent's final answer.
#[tokio::test(flavor = "multi_thread")]
async fn sub_agent_runs_in_a_child_session() {
    let parent_model = FakeOpenAi::start().await;
    let child_model = FakeOpenAi::start().await;
    parent_model.push(Reply::tool_calls([FakeToolCall::new(
        "call_h",
        "helper",
        r#"{"message":"What is six times seven?"}"#,
    )]));
    parent_model.push(Reply::text("The helper says 42."));
    child_model.push(Reply::text("42"));
    let child_worker = FakeWorker::accept_all(None).await;
    let config = format!(
        r#"{FAST_DEFAULTS}
[llm.parent]
type = "openai"
base_url = "{}"

[llm.child]
type = "openai"
base_url = "{}"

[agent.boss]
model = "gpt-boss"
llm = "parent"

[[agent.boss.sub_agents]]
id = "helper"
description = "Does arithmetic."

[agent.helper]
model = "gpt-helper"
llm = "child"
worker = "{}"
"#,
        parent_model.base_url(),
        child_model.base_url(),
        child_worker.url()
    );
    let (host, _dir) = host(&config).await;

    let turn_id = host.submit_ok("s-boss", &message("boss", "Ask the helper.")).await;
    let turn = host.wait_turn("s-boss", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    assert_eq!(turn.data, Some(json!("The helper says 42.")));

    assert_eq!(
        transcript(&host.messages("s-boss").await),
        [
            "user: Ask the helper.",
            r#"assistant: [helper({"message":"What is six times seven?"})#call_h]"#,
            "tool helper/call_h: 42",
            "assistant: The helper says 42.",
        ]
    );
    // The parent's model sees the sub-agent as a tool.
    let tools = &parent_model.requests()[0].body["tools"];
    assert_eq!(tools[0]["function"]["name"], "helper");

    // The child session.
    let (status, list) = host.get("/v1/sessions?agent=helper").await;
    assert_eq!(status, 200, "{list}");
    let children = list["sessions"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{list}");
    let child = children[0]["session_id"].as_str().unwrap().to_owned();
    assert!(child.ends_with("-call_h"), "{child}");
    let summary = host.summary(&child).await;
    assert_eq!(summary.agent_id, "helper");
    assert_eq!(summary.status, SessionStatus::Idle);
    let parent = summary.parent.expect("a child names its parent");
    assert_eq!((parent.session_id.as_str(), parent.tool_call_id.as_str()), ("s-boss", "call_h"));
    assert_eq!(host.summary("s-boss").await.parent, None);
    assert_eq!(transcript(&host.messages(&child).await), ["user: What is six times seven?", "assistant: 42"]);
    assert_eq!(child_model.request_count(), 1);
    assert_eq!(child_model.last_request().body["model"], "gpt-helper");

    // The child's worker sees its ancestry; the child's log names its parent.
    let records = child_worker.records();
    assert!(!records.is_empty());
    for record in &records {
        assert_eq!(record.request.session_id, child);
        assert_eq!(record.request.agent_id, "helper");
        assert_eq!(record.request.ancestry, ["s-boss"]);
    }
    let created = &host.events(&child, 0).await[0].event;
    assert_eq!(created["type"], "session_created");
    assert_eq!(created["init"]["parent"], json!({"session_id": "s-boss", "tool_call_id": "call_h"}));
    assert_eq!(created["init"]["ancestry"], json!(["s-boss"]));

    // Disposing the parent disposes the child it started.
    let (status, body) = host.delete("/v1/sessions/s-boss").await;
    assert_eq!((status, &body), (200, &json!({"session_id": "s-boss", "disposed": ["s-boss", child]})));
    for gone in ["s-boss", child.as_str()] {
        for path in [format!("/v1/sessions/{gone}"), format!("/v1/sessions/{gone}/events")] {
            let (status, body) = host.get(&path).await;
            assert_eq!(status, 404, "{path}: {body}");
        }
    }
    let (status, list) = host.get("/v1/sessions").await;
    assert_eq!((status, list["sessions"].as_array().map(Vec::len)), (200, Some(0)), "{list}");
    host.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Worker failures

/// A worker that answers 500 twice: the decision is delivered again by policy, three times in
/// all, with the same decision id and trigger, `attempts` 1, 2, 3 and Idempotency-Keys
/// `<decision_id>:1..3`; the turn completes.
#[tokio::test(flavor = "multi_thread")]
async fn worker_500_twice_then_success() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::text("Fine."));
    let worker = FakeWorker::start(None, |request, delivery_no| match &request.trigger {
        Trigger::ClientMessages(_) if delivery_no <= 2 => {
            FakeAnswer::Status(500, json!({"error": {"message": "database down"}}).to_string())
        }
        _ => FakeAnswer::Accept,
    })
    .await;
    let agents =
        format!("[agent.flaky]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\n", worker.url());
    let (host, _dir) = host(&config(&openai, &agents)).await;

    let turn_id = host.submit_ok("s-flaky", &message("flaky", "Hello?")).await;
    let turn = host.wait_turn("s-flaky", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    assert_eq!(transcript(&host.messages("s-flaky").await), ["user: Hello?", "assistant: Fine."]);

    let first = worker.records().into_iter().find(|r| r.trigger_name() == "client.messages").unwrap();
    let decision_id = first.request.decision_id.clone();
    let deliveries = worker.deliveries_of(&decision_id);
    assert_eq!(deliveries.len(), 3);
    let keys: Vec<String> = deliveries.iter().map(|r| r.idempotency_key.clone().unwrap()).collect();
    assert_eq!(keys, [1, 2, 3].map(|n| format!("{decision_id}:{n}")));
    let attempts: Vec<u32> = deliveries.iter().map(|r| r.request.attempts).collect();
    assert_eq!(attempts, [1, 2, 3]);
    for record in &deliveries {
        assert_eq!(record.request.trigger, first.request.trigger);
        assert_eq!(record.request.proposed, first.request.proposed);
        assert_eq!(record.header("x-turnstone-decision").as_deref(), Some(decision_id.as_str()));
    }
    let events = host.events("s-flaky", 0).await;
    let retries: Vec<&Value> =
        events.iter().map(|e| &e.event).filter(|e| e["type"] == "decision_retry_scheduled").collect();
    assert_eq!(retries.len(), 2);
    for retry in retries {
        assert_eq!(retry["decision_id"], decision_id.as_str());
        let error = retry["error"].as_str().unwrap();
        assert!(error.contains("HTTP 500"), "{error}");
    }
    host.stop().await;
}

/// A worker that never answers in time: each delivery times out, the retries run out, and the
/// turn fails with an error that names the timeout and the decision's trigger.
#[tokio::test(flavor = "multi_thread")]
async fn worker_timing_out_past_its_retries_fails_the_turn() {
    let openai = FakeOpenAi::start().await;
    let worker = FakeWorker::start(None, |request, _| match &request.trigger {
        Trigger::ClientMessages(_) => FakeAnswer::delayed(Duration::from_secs(5), FakeAnswer::Accept),
        _ => FakeAnswer::Accept,
    })
    .await;
    let config = format!(
        r#"
[defaults]
decision = {{ timeout_secs = 0.4, max_retries = 1, backoff_base_secs = 0.05, backoff_max_secs = 0.1 }}

[llm.fake]
type = "openai"
base_url = "{}"

[agent.slow]
model = "gpt-fake"
llm = "fake"
worker = "{}"
"#,
        openai.base_url(),
        worker.url()
    );
    let (host, _dir) = host(&config).await;

    let started = Instant::now();
    let turn_id = host.submit_ok("s-slow", &message("slow", "Anyone?")).await;
    let turn = host.wait_turn("s-slow", &turn_id).await;
    let took = started.elapsed();
    assert_eq!(turn.status, TurnStatus::Failed, "{turn:?}");
    let error = turn.error.as_deref().unwrap();
    assert!(error.contains("client.messages"), "{error}");
    assert!(error.contains("timeout") || error.contains("timed out"), "{error}");
    assert!(error.contains("after 2 attempts"), "{error}");
    assert!(took < Duration::from_secs(4), "the turn failed after {took:?}, not after the worker's 5 s");

    let decision_id = worker
        .records()
        .into_iter()
        .find(|r| r.trigger_name() == "client.messages")
        .unwrap()
        .request
        .decision_id;
    assert_eq!(worker.deliveries_of(&decision_id).len(), 2);
    assert_eq!(openai.request_count(), 0, "no model call without the worker's answer");
    assert_eq!(transcript(&host.messages("s-slow").await), Vec::<String>::new());
    let summary = host.summary("s-slow").await;
    assert_eq!(summary.active_turn, None);
    host.stop().await;
}

/// A worker that answers garbage with a 200: a terminal `invalid_response`, delivered once;
/// the turn fails at once with an error that names the problem and never quotes the body.
#[tokio::test(flavor = "multi_thread")]
async fn worker_answering_garbage_fails_the_turn_at_once() {
    let openai = FakeOpenAi::start().await;
    let worker = FakeWorker::start(None, |request, _| match &request.trigger {
        Trigger::ClientMessages(_) => FakeAnswer::Garbage(b"<html>SECRET-TOKEN-12345 oops".to_vec()),
        _ => FakeAnswer::Accept,
    })
    .await;
    let agents =
        format!("[agent.broken]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\n", worker.url());
    let (host, _dir) = host(&config(&openai, &agents)).await;

    let started = Instant::now();
    let turn_id = host.submit_ok("s-garbage", &message("broken", "Hi")).await;
    let turn = host.wait_turn("s-garbage", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Failed, "{turn:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "failed after {:?}", started.elapsed());
    let error = turn.error.as_deref().unwrap();
    assert!(error.contains("failed: invalid_response: invalid worker response: "), "{error}");
    assert!(error.contains("client.messages"), "{error}");
    assert!(!error.contains("SECRET-TOKEN"), "the error quotes the body: {error}");
    assert!(!error.contains("<html>"), "the error quotes the body: {error}");
    assert!(!error.contains("attempts"), "a terminal failure is not retried: {error}");

    assert_eq!(worker.trigger_names(), ["session.start", "client.messages"]);
    assert_eq!(openai.request_count(), 0);
    let events = host.events("s-garbage", 0).await;
    let types = event_types(&events);
    assert!(types.contains(&"decision_failed".to_owned()), "{types:?}");
    assert!(!types.contains(&"decision_retry_scheduled".to_owned()), "{types:?}");
    assert_eq!(types.last().map(String::as_str), Some("turn_ended"));
    // The log does not keep the body either.
    let log = serde_json::to_string(&events).unwrap();
    assert!(!log.contains("SECRET-TOKEN"));
    host.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Signatures

/// The worker verifies every request's HMAC signature with the secret the config names (read
/// through the host's env closure, never the process environment); a worker holding another
/// secret refuses the requests (401) and that turn fails, naming the status.
#[tokio::test(flavor = "multi_thread")]
async fn worker_verifies_the_hmac_signature() {
    const SECRET: &str = "whsec-e2e-right-0123456789";
    let openai = FakeOpenAi::start().await;
    openai.set_default(Reply::text("Signed and sealed."));
    let signed = FakeWorker::accept_all(Some(SECRET)).await;
    let forged = FakeWorker::accept_all(Some(SECRET)).await;
    let agents = format!(
        "[agent.signed]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\nworker_secret_env = \"E2E_HMAC_SIGNED\"\n\n\
         [agent.forged]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\nworker_secret_env = \"E2E_HMAC_FORGED\"\n",
        signed.url(),
        forged.url()
    );
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start_with_env(&config(&openai, &agents), dir.path(), |name| match name {
        "E2E_HMAC_SIGNED" => Some(SECRET.to_owned()),
        "E2E_HMAC_FORGED" => Some("whsec-e2e-wrong".to_owned()),
        _ => None,
    })
    .await;

    let turn_id = host.submit_ok("s-signed", &message("signed", "Sign it.")).await;
    let turn = host.wait_turn("s-signed", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    let records = signed.records();
    assert_eq!(records.len(), 3, "session.start, client.messages, llm.finished");
    for record in &records {
        assert_eq!(record.verified, Some(true), "{:?}", record.header("x-turnstone-signature"));
        let header = record.header("x-turnstone-signature").unwrap();
        assert!(header.starts_with("t=") && header.contains(",v1="), "{header}");
    }

    let turn_id = host.submit_ok("s-forged", &message("forged", "Sign it.")).await;
    let turn = host.wait_turn("s-forged", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Failed, "{turn:?}");
    let error = turn.error.as_deref().unwrap();
    assert!(error.contains("HTTP 401"), "{error}");
    assert!(!error.contains(SECRET) && !error.contains("whsec-e2e-wrong"), "{error}");
    assert!(forged.records().iter().all(|r| r.verified == Some(false)));
    host.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Turns

/// While a turn runs, another message is refused with 409 `turn_already_active` naming the
/// running turn, and writes nothing; resubmitting the running turn's `turn_id` returns that
/// turn and writes nothing (same `last_seq`), during the turn and after it.
#[tokio::test(flavor = "multi_thread")]
async fn turn_already_active_and_idempotent_turn_id() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::text("First answer."));
    let gate = Gate::new();
    let held = gate.clone();
    let worker = FakeWorker::start(None, move |request, _| match &request.trigger {
        Trigger::ClientMessages(_) => FakeAnswer::held(&held, FakeAnswer::Accept),
        _ => FakeAnswer::Accept,
    })
    .await;
    let agents =
        format!("[agent.busy]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\n", worker.url());
    let (host, _dir) = host(&config(&openai, &agents)).await;

    let first = message_as("busy", "First.", "turn-a");
    let (status, body) = host.submit("s-busy", &first).await;
    assert_eq!(
        (status, &body),
        (202, &json!({"session_id": "s-busy", "turn_id": "turn-a", "queued": false}))
    );
    worker.wait_for(PATIENCE, |r| r.trigger_name() == "client.messages").await;
    let before = host.summary("s-busy").await.last_seq;

    let (status, body) = host.submit("s-busy", &message_as("busy", "Second.", "turn-b")).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "turn_already_active");
    assert!(body["error"]["message"].as_str().unwrap().contains("turn-a"), "{body}");
    let (status, body) = host.submit("s-busy", &message("busy", "No turn id.")).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "turn_already_active");

    let (status, body) = host.submit("s-busy", &first).await;
    assert_eq!(
        (status, &body),
        (202, &json!({"session_id": "s-busy", "turn_id": "turn-a", "queued": false}))
    );
    let summary = host.summary("s-busy").await;
    assert_eq!(summary.last_seq, before, "a refused or known input wrote something");
    assert_eq!(summary.active_turn.as_deref(), Some("turn-a"));
    let (status, _) = host.get("/v1/sessions/s-busy/turns/turn-b").await;
    assert_eq!(status, 404);

    gate.open();
    let turn = host.wait_turn("s-busy", "turn-a").await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    let after = host.summary("s-busy").await.last_seq;
    let (status, body) = host.submit("s-busy", &first).await;
    assert_eq!(
        (status, &body),
        (202, &json!({"session_id": "s-busy", "turn_id": "turn-a", "queued": false}))
    );
    assert_eq!(host.summary("s-busy").await.last_seq, after);
    assert_eq!(transcript(&host.messages("s-busy").await), ["user: First.", "assistant: First answer."]);
    assert_eq!(worker.trigger_names().iter().filter(|n| **n == "client.messages").count(), 1);
    host.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The event stream

/// Reading part of the SSE log, dropping the connection mid-turn and reconnecting with
/// `Last-Event-ID` loses and repeats nothing: the ids are exactly 1..=last_seq, consecutive,
/// and the events are those of `GET .../events`, in order.
#[tokio::test(flavor = "multi_thread")]
async fn sse_resumes_with_last_event_id() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::tool_calls([
        FakeToolCall::new("call_1", "add", r#"{"a":1,"b":1}"#),
        FakeToolCall::new("call_2", "upper", r#"{"text":"ok"}"#),
    ]));
    openai.push(Reply::text("Two and OK."));
    let gate = Gate::new();
    let held = gate.clone();
    let execute = tools_script(calculate);
    let worker = FakeWorker::start(None, move |request, _| match &request.trigger {
        Trigger::ToolExecute(t) if t.id == "call_1" => FakeAnswer::held(&held, execute(request)),
        _ => execute(request),
    })
    .await;
    let (host, _dir) = host(&config(&openai, &calc_agent(&worker))).await;

    let turn_id = host.submit_ok("s-sse", &message("calc", "Go.")).await;
    let mut stream = host.stream("s-sse", None).await;
    let mut seen: Vec<SseFrame> = Vec::new();
    while seen.len() < 5 {
        let frame = stream.next(PATIENCE).await.expect("a durable event");
        assert!(frame.id.is_some(), "a non-streaming agent sends only durable events: {frame:?}");
        seen.push(frame);
    }
    drop(stream);

    // More happens while no one listens.
    worker.wait_for(PATIENCE, |r| r.trigger_name() == "tool.execute").await;
    gate.open();
    worker.wait_for(PATIENCE, |r| r.trigger_name() == "tool.finished").await;

    let last = seen.last().unwrap().seq().unwrap();
    let mut resumed = host.stream("s-sse", Some(last)).await;
    seen.extend(resumed.until(PATIENCE, |f| f.event == "turn.ended").await);
    drop(resumed);

    let turn = host.wait_turn("s-sse", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    let ids: Vec<u64> = seen.iter().map(|f| f.seq().expect("an id")).collect();
    let expected: Vec<u64> = (1..=ids.len() as u64).collect();
    assert_eq!(ids, expected, "ids strictly consecutive from 1, none missed or repeated");
    let log = host.events("s-sse", 0).await;
    assert_eq!(log.len(), seen.len(), "turn.ended is the last event");
    for (frame, logged) in seen.iter().zip(&log) {
        assert_eq!(frame.seq(), Some(logged.seq));
        assert_eq!(frame.json(), logged.event, "seq {:?}", frame.id);
        assert_eq!(frame.event.replace('.', "_"), logged.event["type"].as_str().unwrap());
    }
    assert_eq!(host.summary("s-sse").await.last_seq, ids.len() as u64);
    // Resuming at the end sends nothing old.
    let mut tail = host.stream("s-sse", Some(ids.len() as u64)).await;
    assert_eq!(tail.next(Duration::from_millis(300)).await, None);
    drop(tail);
    host.stop().await;
}

/// A worker that runs the model itself (`handler = "worker"`) and answers a streaming
/// `llm.execute` with an event stream: its deltas reach the session's SSE clients as
/// `llm.token.delta` for that call, and its `decision.result` settles the call.
#[tokio::test(flavor = "multi_thread")]
async fn worker_streams_an_llm_execute_answer() {
    let openai = FakeOpenAi::start().await;
    let worker = FakeWorker::start(None, |request, _| match &request.trigger {
        Trigger::LlmExecute(t) => {
            assert!(t.stream);
            let result = DecisionResponse {
                actions: Some(vec![Action::LlmResult(LlmResultAction {
                    id: None,
                    attempt: None,
                    response: json!({"model": "worker-model", "content": "Hello from the worker.", "finish_reason": "stop"}),
                })]),
                ..DecisionResponse::default()
            };
            let answer =
                FakeAnswer::sse_text(&["Hello ", "from ", "the ", "worker."], result, Duration::from_millis(30));
            FakeAnswer::delayed(Duration::from_millis(300), answer)
        }
        _ => FakeAnswer::Accept,
    })
    .await;
    let agents = format!(
        "[agent.selfhosted]\nmodel = \"worker-model\"\nstream = true\nhandler = \"worker\"\nworker = \"{}\"\n",
        worker.url()
    );
    let (host, _dir) = host(&config(&openai, &agents)).await;

    let turn_id = host.submit_ok("s-wstream", &message("selfhosted", "Hi worker.")).await;
    let mut stream = host.stream("s-wstream", None).await;
    let frames = stream.until(PATIENCE, |f| f.event == "turn.ended").await;
    drop(stream);
    let execute = worker.records().into_iter().find(|r| r.trigger_name() == "llm.execute").unwrap();
    let Trigger::LlmExecute(t) = &execute.request.trigger else { unreachable!() };
    let deltas: Vec<Value> =
        frames.iter().filter(|f| f.event == "llm.token.delta").map(FrameExt::json).collect();
    if host.streams_deltas() {
        assert!(!deltas.is_empty());
        assert!(deltas.iter().all(|d| d["call_id"] == t.id.as_str()), "{deltas:?}");
        let text: String = deltas.iter().map(|d| d["delta"]["text"].as_str().unwrap_or_default()).collect();
        assert_eq!(text, "Hello from the worker.");
    } else {
        assert!(deltas.is_empty(), "the stream function has no live deltas: {deltas:?}");
    }

    let turn = host.wait_turn("s-wstream", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    assert_eq!(
        transcript(&host.messages("s-wstream").await),
        ["user: Hi worker.", "assistant: Hello from the worker."]
    );
    assert_eq!(openai.request_count(), 0, "the engine ran no model call itself");
    host.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Request validation

/// A body over the configured limit gets 413; an invalid ClientInput gets 422 naming the
/// field; neither creates the session.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_and_invalid_inputs() {
    let openai = FakeOpenAi::start().await;
    let agents = "[server]\nmax_body_bytes = 4096\n";
    let config =
        format!("{agents}{}", config(&openai, "[agent.plain]\nmodel = \"gpt-fake\"\nllm = \"fake\"\n"));
    let (host, _dir) = host(&config).await;

    let big = message("plain", &"x".repeat(8 * 1024));
    let (status, body) = host.submit("s-val", &big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "body_too_large", "{body}");
    // Just over the limit, too.
    let filler = 4096 - message("plain", "").to_string().len() + 1;
    let (status, body) = host.submit("s-val", &message("plain", &"y".repeat(filler))).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "body_too_large", "{body}");

    let robot =
        json!({"type": "client.message", "agent_id": "plain", "message": {"role": "robot", "content": "hi"}});
    let (status, body) = host.submit("s-val", &robot).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");
    assert_eq!(body["error"]["param"], "message.role", "{body}");

    let system = json!({"type": "client.message", "agent_id": "plain", "message": {"role": "system", "content": "hi"}});
    let (status, body) = host.submit("s-val", &system).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["param"], "message.role", "{body}");

    let (status, body) = host.submit("s-val", &json!({"type": "client.message", "agent_id": "plain"})).await;
    assert_eq!(status, 422, "{body}");
    // A missing field is named.
    assert_eq!(body["error"]["code"], "invalid_request");
    assert_eq!(body["error"]["param"], "message", "{body}");

    let (status, body) = host.post_raw("/v1/sessions/s-val/inputs", "{not json").await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");

    let (status, body) = host.submit("s-val", &message("nobody", "hi")).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_agent");

    let (status, body) = host.get("/v1/sessions/s-val").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "session_not_found");
    assert_eq!(openai.request_count(), 0);
    host.stop().await;
}

/// Keeps the suite honest about its own helpers: a fake worker records an unparseable body
/// instead of answering it as a decision.
#[tokio::test(flavor = "multi_thread")]
async fn fake_worker_refuses_what_is_not_a_decision_request() {
    let worker = FakeWorker::accept_all(None).await;
    let response = reqwest::Client::new().post(worker.url()).body("{}").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 400);
    assert_eq!(worker.unparsed().len(), 1);
    assert!(worker.records().is_empty());
}

/// The head keeps only recent turns and forgets even the ids of the oldest: an old turn's
/// record is rebuilt from the log, and resubmitting its id is still a no-op, however old (the
/// store keeps every turn id).
#[tokio::test(flavor = "multi_thread")]
async fn old_turns_are_answered_from_the_log() {
    let config = format!(
        "{FAST_DEFAULTS}\n[llm.s]\ntype = \"scripted\"\n\n[agent.echo]\nmodel = \"scripted\"\nllm = \"s\"\n"
    );
    let (host, _dir) = host(&config).await;
    let turns = turnstone_engine::session::RECENT_TURNS + turnstone_engine::session::PAST_TURN_IDS + 3;
    for i in 0..turns {
        let turn_id = format!("t{i}");
        host.submit_ok("s-old", &message_as("echo", &format!("m{i}"), &turn_id)).await;
        assert_eq!(host.wait_turn("s-old", &turn_id).await.status, TurnStatus::Completed);
    }
    let first = host.wait_turn("s-old", "t0").await;
    assert_eq!(first.status, TurnStatus::Completed, "{first:?}");
    assert_eq!(first.data, Some(json!("You said: m0")));
    let last_seq = host.summary("s-old").await.last_seq;
    let (status, body) = host.submit("s-old", &message_as("echo", "again", "t0")).await;
    assert_eq!((status, &body["turn_id"]), (202, &json!("t0")), "{body}");
    assert_eq!(host.summary("s-old").await.last_seq, last_seq);
    host.stop().await;
}

/// Prices in `[llm.<id>.prices]` give every call of a priced model its cost from the tokens
/// the provider reports (a model name takes the prices of the longest priced name it starts
/// with); the session's and the turn's cost add up exactly.
#[tokio::test(flavor = "multi_thread")]
async fn priced_models_give_calls_their_cost() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::text("one").usage(1000, 200));
    openai.push(Reply::text("two").usage(3, 1));
    let agents = "[agent.paid]\nmodel = \"gpt-fake\"\nllm = \"fake\"\n";
    let prices = "prices.\"gpt\" = { input = 1.0, output = 1.0 }\n\
                  prices.\"gpt-fake\" = { input = 2.5, output = 10.0 }\n";
    let text = config(&openai, agents).replace("\n\n[agent.paid]", &format!("\n{prices}\n[agent.paid]"));
    let (host, _dir) = host(&text).await;
    let first = host.submit_ok("s-paid", &message_as("paid", "a", "t1")).await;
    let turn = host.wait_turn("s-paid", &first).await;
    // 1000 * 2.5 + 200 * 10 = 4500 dollars per million tokens.
    assert_eq!(turn.usage.cost(), "0.0045", "{turn:?}");
    let second = host.submit_ok("s-paid", &message_as("paid", "b", "t2")).await;
    host.wait_turn("s-paid", &second).await;
    // + 3 * 2.5 + 1 * 10 = 17.5 per million.
    assert_eq!(host.summary("s-paid").await.usage.cost, "0.0045175");
    host.stop().await;
}

/// A worker that spawns its sub-agent under the id of a session that already exists (someone
/// else's) does not reach into it: the delegation fails with the reason, the foreign session
/// gets no turn, and the parent's turn goes on. The worker also echoes `session_id` and
/// `decision_id` in its answers, as many do: that is accepted.
#[tokio::test(flavor = "multi_thread")]
async fn a_spawn_under_a_foreign_sessions_id_fails_the_delegation_and_leaves_it_alone() {
    let openai = FakeOpenAi::start().await;
    // The foreign session's own turn, then the boss: a delegation, then a reply.
    openai.push(Reply::text("I am the foreign session."));
    openai.push(Reply::tool_calls([FakeToolCall::new("call_h", "helper", r#"{"message":"hi"}"#)]));
    openai.push(Reply::text("The helper could not be reached."));
    let worker = FakeWorker::start(None, |request, _| {
        let mut answer = serde_json::to_value(&request.proposed).unwrap();
        let proposed_child = format!("{}-call_h", request.decision_id);
        let text = answer.to_string().replace(&proposed_child, "foreign");
        answer = serde_json::from_str(&text).unwrap();
        answer["session_id"] = json!(request.session_id);
        answer["decision_id"] = json!(request.decision_id);
        FakeAnswer::Json(answer)
    })
    .await;
    let agents = format!(
        "[agent.boss]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\n\
         [[agent.boss.sub_agents]]\nid = \"helper\"\ndescription = \"Helps.\"\n\n\
         [agent.helper]\nmodel = \"gpt-fake\"\nllm = \"fake\"\n",
        worker.url()
    );
    let (host, _dir) = host(&config(&openai, &agents)).await;
    let foreign_turn = host.submit_ok("foreign", &message("helper", "hello")).await;
    host.wait_turn("foreign", &foreign_turn).await;
    let foreign_before = host.summary("foreign").await.last_seq;

    let turn_id = host.submit_ok("s-boss2", &message("boss", "Ask the helper.")).await;
    let turn = host.wait_turn("s-boss2", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    let transcript = transcript(&host.messages("s-boss2").await);
    assert_eq!(transcript.len(), 4, "{transcript:?}");
    assert!(
        transcript[2].starts_with("tool helper/call_h: ") && transcript[2].contains("is not available"),
        "the delegation fails with the reason: {transcript:?}"
    );
    // Nothing reached the foreign session.
    assert_eq!(host.summary("foreign").await.last_seq, foreign_before);
    // The echoed fields were ignored, and named where the answer was recorded.
    let events = host.events("s-boss2", 0).await;
    let resolved: Vec<&Value> =
        events.iter().map(|e| &e.event).filter(|e| e["type"] == "decision_resolved").collect();
    assert!(!resolved.is_empty());
    for event in resolved {
        let mut ignored: Vec<&str> =
            event["ignored_fields"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        ignored.sort_unstable();
        assert_eq!(ignored, ["decision_id", "session_id"], "{event}");
    }
    host.stop().await;
}

/// A per-agent budget ends a turn whose model calls cost more than `max_cost` (priced from the
/// provider's token counts) with `budget_exceeded`.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_past_its_agents_budget_fails_with_budget_exceeded() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::text("an expensive answer").usage(1000, 200));
    let agents = "[agent.thrifty]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nmax_cost = \"0.001\"\n";
    let prices = "prices.\"gpt-fake\" = { input = 2.5, output = 10.0 }\n";
    let text =
        config(&openai, agents).replace("\n\n[agent.thrifty]", &format!("\n{prices}\n[agent.thrifty]"));
    let (host, _dir) = host(&text).await;
    let turn_id = host.submit_ok("s-thrifty", &message("thrifty", "Tell me everything.")).await;
    let turn = host.wait_turn("s-thrifty", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Failed, "{turn:?}");
    assert_eq!(turn.code, Some(ErrorCode::BudgetExceeded), "{turn:?}");
    assert!(turn.error.as_deref().unwrap().starts_with("budget_exceeded"), "{turn:?}");
    host.stop().await;
}

/// A `tool.execute` delivered to the worker is bounded by the tool's own timeout, not by the
/// decision-delivery timeout: a tool that takes longer than a delivery may (but less than its
/// own timeout) runs once and its result is used.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_worker_tool_runs_once_within_its_own_timeout() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::tool_calls([FakeToolCall::new("call_add", "add", r#"{"a":2,"b":3}"#)]));
    openai.push(Reply::text("5."));
    let script = tools_script(calculate);
    let worker = FakeWorker::start(None, move |request, _| match script(request) {
        FakeAnswer::Respond(answer) => {
            FakeAnswer::delayed(Duration::from_millis(1200), FakeAnswer::Respond(answer))
        }
        other => other,
    })
    .await;
    let defaults = r#"
[defaults]
llm = { timeout_secs = 5, max_retries = 1, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }
tool = { timeout_secs = 4, max_retries = 0, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }
decision = { timeout_secs = 0.5, max_retries = 2, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }
"#;
    let config = format!(
        "{defaults}\n[llm.fake]\ntype = \"openai\"\nbase_url = \"{}\"\n\n{}",
        openai.base_url(),
        calc_agent(&worker)
    );
    let (host, _dir) = host(&config).await;
    let turn_id = host.submit_ok("s-slowtool", &message("calc", "2+3?")).await;
    let turn = host.wait_turn("s-slowtool", &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    let executions = worker.records().iter().filter(|r| r.trigger_name() == "tool.execute").count();
    assert_eq!(executions, 1, "the tool ran once: {:?}", worker.trigger_names());
    host.stop().await;
}

/// Persisted before acting: by the time the model receives a call, the commit that claimed it
/// (its `call.dispatched`) is in the store, at the default durability `full` (where a commit
/// returns only once its transaction is fsynced).
#[tokio::test(flavor = "multi_thread")]
async fn a_model_call_is_claimed_durably_before_it_is_made() {
    let openai = FakeOpenAi::start().await;
    openai.push(Reply::text("slowly").delay(Duration::from_millis(600)));
    let agents = "[agent.plain]\nmodel = \"gpt-fake\"\nllm = \"fake\"\n";
    let (host, _dir) = host(&config(&openai, agents)).await;
    host.submit_ok("s-claim", &message("plain", "hi")).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while openai.request_count() == 0 {
        assert!(Instant::now() < deadline, "the model was never called");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The call is in flight (the fake answers after 600 ms): read the store's log.
    let logged = host.app().store().events_after("s-claim", 0, 1000).await.unwrap();
    let names: Vec<&str> = logged.iter().map(|e| e.event.name()).collect();
    assert!(names.contains(&"call.dispatched"), "the claim is committed before the call: {names:?}");
    assert!(!names.contains(&"call.settled"), "the call has not come back yet: {names:?}");
    host.stop().await;
}

/// A worker's state is branch-scoped, and the head holds only the version in force: an edit
/// back to the first turn makes the state written there current again, read back from the log
/// (`state.restored`), so the worker's next decision sees it, not the newest.
#[tokio::test(flavor = "multi_thread")]
async fn an_edit_brings_back_the_state_of_its_branch_from_the_log() {
    let openai = FakeOpenAi::start().await;
    for reply in ["r1", "r2", "r3", "r4"] {
        openai.push(Reply::text(reply));
    }
    let turns = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&turns);
    let worker = FakeWorker::start(None, move |request, _| match &request.trigger {
        Trigger::ClientMessages(_) => {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let state = (n <= 3).then(|| json!({"turn": n, "memory": "x".repeat(4096)}));
            FakeAnswer::Respond(DecisionResponse { state, ..request.proposed.clone() })
        }
        _ => FakeAnswer::Accept,
    })
    .await;
    let agents = format!("[agent.w]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\n", worker.url());
    let (host, _dir) = host(&config(&openai, &agents)).await;
    for text in ["one", "two", "three"] {
        let turn_id = host.submit_ok("s-edit", &message("w", text)).await;
        assert_eq!(host.wait_turn("s-edit", &turn_id).await.status, TurnStatus::Completed);
    }
    let path = host.messages("s-edit").await;
    assert_eq!(transcript(&path).len(), 6);
    let kept: Vec<Value> = path[..2]
        .iter()
        .map(|m| json!({"role": m["role"], "content": m["content"], "id": m["id"]}))
        .collect();
    let mut messages = kept.clone();
    messages.push(json!({"role": "user", "content": "two, again"}));
    let edit = json!({"type": "client.messages", "agent_id": "w", "messages": messages});
    let turn_id = host.submit_ok("s-edit", &edit).await;
    assert_eq!(host.wait_turn("s-edit", &turn_id).await.status, TurnStatus::Completed);
    assert_eq!(
        transcript(&host.messages("s-edit").await),
        ["user: one", "assistant: r1", "user: two, again", "assistant: r4"]
    );
    let last = worker.records().into_iter().rfind(|r| r.trigger_name() == "llm.finished").unwrap();
    assert_eq!(last.request.state["turn"], 1, "the edited branch's state is the first turn's");
    let events = host.events("s-edit", 0).await;
    let restored: Vec<&Value> =
        events.iter().map(|e| &e.event).filter(|e| e["type"] == "state_restored").collect();
    assert_eq!(restored.len(), 1, "{:?}", event_types(&events));
    host.stop().await;
}

/// Claude with thinking and tools (issue 27): each reply's signed thinking block is kept with
/// its message and sent back, unchanged, with the tool results of the turn that called the
/// tool; the strict fake refuses the request otherwise, as Anthropic does. Three tool steps,
/// then the answer; streamed and not; on a model that takes only adaptive thinking (which
/// refuses a thinking budget) and on one that takes only a budget.
#[tokio::test(flavor = "multi_thread")]
async fn claude_with_thinking_runs_a_tool_loop() {
    // (model, streamed, thinking turned on by a worker's llm.call rather than by the
    // `[llm.claude] reasoning` default of an engine-hosted agent)
    for (model, stream, by_worker) in [
        ("claude-opus-4-7", false, true),
        ("claude-opus-4-7", true, true),
        ("claude-sonnet-4-5", false, true),
        ("claude-sonnet-4-5", true, true),
        ("claude-opus-4-7", true, false),
    ] {
        let claude = FakeAnthropic::start().await;
        for step in 1..=3 {
            let call = FakeToolCall::new(format!("call_{step}"), "confirm", r#"{"question":"Go on?"}"#);
            claude.push(Reply::tool_calls([call]));
        }
        claude.push(Reply::text("All three confirmed."));
        // A worker that takes every proposal, its model calls with thinking on.
        let thinking =
            ReasoningConfig { effort: None, max_tokens: Some(1024), exclude: None, enabled: Some(true) };
        let worker = reasoning_worker(thinking, stream).await;
        let (reasoning, worker) = match by_worker {
            true => (String::new(), format!("worker = \"{}\"", worker.url())),
            false => ("reasoning = { effort = \"high\" }".to_owned(), String::new()),
        };
        let config = format!(
            r#"{FAST_DEFAULTS}
[llm.claude]
type = "anthropic"
base_url = "{}"
{reasoning}

[agent.thinker]
model = "{model}"
llm = "claude"
stream = {stream}
{worker}

[[agent.thinker.tools]]
name = "confirm"
description = "Asks the user."
handler = "client"
input = {{ type = "object", properties = {{ question = {{ type = "string" }} }} }}
"#,
            claude.base_url(),
        );
        let (host, _dir) = host(&config).await;
        let session = format!("s-think-{model}-{stream}-{by_worker}");
        let turn_id = host.submit_ok(&session, &message("thinker", "Deploy, step by step.")).await;
        host.answer_client_calls(&session, 3, "yes", PATIENCE).await;
        let turn = host.wait_turn(&session, &turn_id).await;
        assert_eq!(turn.status, TurnStatus::Completed, "{model}, stream {stream}: {turn:?}");
        let first = &claude.requests()[0].body;
        assert_eq!(
            first["thinking"]["type"],
            if model == "claude-opus-4-7" { "adaptive" } else { "enabled" }
        );
        if !by_worker {
            assert_eq!(first["output_config"]["effort"], "high", "the llm's reasoning default");
        }
        // Every request after the first sent each tool-calling reply back led by its signed thinking block.
        let requests = claude.requests();
        assert_eq!(requests.len(), 4);
        for request in &requests[1..] {
            let replies: Vec<&Value> = request.body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "assistant")
                .collect();
            assert!(!replies.is_empty());
            for reply in replies {
                assert_eq!(reply["content"][0]["type"], "thinking", "stream {stream}: {reply}");
                assert!(
                    reply["content"][0]["signature"].as_str().is_some_and(|s| s.starts_with("fake-sig-"))
                );
            }
        }
        // Clients see the thinking as the reply's reasoning, not as provider blocks.
        let chat: Value = host.get_ok(&format!("/v1/sessions/{session}/chat")).await;
        assert!(chat.to_string().contains("Reading the"), "the reasoning shows");
        assert!(!chat.to_string().contains("fake-sig-"), "the signature does not");
        let messages = json!(host.messages(&session).await).to_string();
        assert!(!messages.contains("fake-sig-") && messages.contains("Deploy, step by step."), "{messages}");
        host.stop().await;
    }
}

/// OpenAI's reasoning models through the Responses API (issue 27): each reply's reasoning item
/// (its encrypted content included) is kept with its message and sent back, unchanged and
/// before the function call it led to, with the tool results; the strict fake refuses the
/// request otherwise, as OpenAI does with `store: false`. Three tool steps, then the answer;
/// streamed and not; reasoning asked for by a worker's `llm.call` or by the `[llm.<id>]`
/// default of an engine-hosted agent.
#[tokio::test(flavor = "multi_thread")]
async fn openai_responses_with_reasoning_runs_a_tool_loop() {
    for (stream, by_worker) in [(false, true), (true, true), (false, false), (true, false)] {
        let openai = turnstone_tests::FakeOpenAiResponses::start().await;
        for step in 1..=3 {
            let call = FakeToolCall::new(format!("call_{step}"), "confirm", r#"{"question":"Go on?"}"#);
            openai.push(Reply::tool_calls([call]));
        }
        openai.push(Reply::text("All three confirmed."));
        let medium = ReasoningConfig {
            effort: Some(turnstone_engine::protocol::Effort::Medium),
            max_tokens: None,
            exclude: None,
            enabled: None,
        };
        let worker = reasoning_worker(medium, stream).await;
        let (reasoning, worker) = match by_worker {
            true => (String::new(), format!("worker = \"{}\"", worker.url())),
            false => ("reasoning = { effort = \"high\" }".to_owned(), String::new()),
        };
        let config = format!(
            r#"{FAST_DEFAULTS}
[llm.gpt]
type = "openai-responses"
base_url = "{}"
{reasoning}

[agent.reasoner]
model = "gpt-5"
system = "You deploy carefully."
llm = "gpt"
stream = {stream}
{worker}

[[agent.reasoner.tools]]
name = "confirm"
description = "Asks the user."
handler = "client"
input = {{ type = "object", properties = {{ question = {{ type = "string" }} }} }}
"#,
            openai.base_url(),
        );
        let (host, _dir) = host(&config).await;
        let session = format!("s-responses-{stream}-{by_worker}");
        let turn_id = host.submit_ok(&session, &message("reasoner", "Deploy, step by step.")).await;
        host.answer_client_calls(&session, 3, "yes", PATIENCE).await;
        let turn = host.wait_turn(&session, &turn_id).await;
        assert_eq!(turn.status, TurnStatus::Completed, "stream {stream}, by worker {by_worker}: {turn:?}");
        let requests = openai.requests();
        assert_eq!(requests.len(), 4);
        let first = &requests[0].body;
        assert_eq!(first["reasoning"]["effort"], if by_worker { "medium" } else { "high" });
        assert_eq!(
            (first["store"].clone(), first["instructions"].clone()),
            (json!(false), json!("You deploy carefully."))
        );
        // Every request after the first sent each call back right after the reasoning item
        // that led to it, its encrypted content as the fake sealed it.
        for (n, request) in requests.iter().enumerate().skip(1) {
            let input = request.body["input"].as_array().unwrap();
            let calls: Vec<usize> =
                (0..input.len()).filter(|&i| input[i]["type"] == "function_call").collect();
            assert_eq!(calls.len(), n, "{input:?}");
            for i in calls {
                assert_eq!(input[i - 1]["type"], "reasoning", "stream {stream}: {input:?}");
                assert!(
                    input[i - 1]["encrypted_content"].as_str().is_some_and(|e| e.starts_with("gAAAAfake"))
                );
                assert_eq!(input[i + 1]["type"], "function_call_output");
            }
        }
        // Clients see the reasoning summary as the reply's reasoning, not the reasoning items.
        let chat: Value = host.get_ok(&format!("/v1/sessions/{session}/chat")).await;
        assert!(chat.to_string().contains("Reading the"), "the reasoning shows");
        assert!(!chat.to_string().contains("gAAAAfake"), "the encrypted content does not");
        let messages = json!(host.messages(&session).await).to_string();
        assert!(!messages.contains("gAAAAfake") && messages.contains("Deploy, step by step."), "{messages}");
        host.stop().await;
    }
}

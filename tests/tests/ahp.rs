//! The AHP host (`GET /v1/ahp`) driven by the official Rust client (`ahp` over `ahp-ws`) on a
//! real WebSocket to a local test host. After each scenario the chat the client reduced from
//! the snapshot and every action it received equals `GET /v1/sessions/{id}/chat`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ahp::reducers::{ReduceOutcome, apply_action_to_chat};
use ahp::{Client, ClientConfig, ClientError, SessionSubscription, SubscriptionEvent};
use ahp_types::actions::{
    ActionEnvelope, ChatInputCompletedAction, ChatPendingMessageSetAction, ChatToolCallCompleteAction,
    ChatTurnCancelledAction, ChatTurnStartedAction, StateAction,
};
use ahp_types::commands::{ReconnectResult, SubscribeResult};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    ChatInputResponseKind, ChatState, Message, MessageKind, MessageOrigin, PendingMessageKind, SessionStatus,
    SnapshotState, ToolCallResult, ToolResultContent, ToolResultTextContent,
};
use ahp_ws::WebSocketTransport;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use turnstone_engine::protocol::{Action, DecisionResponse, InterruptAction, Trigger};
use turnstone_engine::session::TurnStatus;
use turnstone_tests::{FakeAnswer, FakeOpenAi, FakeToolCall, FakeWorker, Reply, TestHost};

const PATIENCE: Duration = Duration::from_secs(15);

const FAST_DEFAULTS: &str = r#"
[defaults]
llm = { timeout_secs = 5, max_retries = 1, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }
tool = { timeout_secs = 5, max_retries = 0, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }
decision = { timeout_secs = 5, max_retries = 2, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }
"#;

/// A streaming agent `chat`, an agent `asker` with a client tool, and whatever `more` adds.
fn config(openai: &FakeOpenAi, more: &str) -> String {
    format!(
        r#"{FAST_DEFAULTS}
[llm.fake]
type = "openai"
base_url = "{}"

[agent.chat]
model = "gpt-fake"
stream = true
llm = "fake"

[agent.asker]
model = "gpt-fake"
llm = "fake"

[[agent.asker.tools]]
name = "confirm"
description = "Asks the user."
handler = "client"
input = {{ type = "object", properties = {{ question = {{ type = "string" }} }}, required = ["question"] }}

{more}"#,
        openai.base_url()
    )
}

async fn host(config: &str) -> (TestHost, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(config, dir.path()).await;
    (host, dir)
}

/// Opens a WebSocket to the host's `/v1/ahp` (with `Authorization: Bearer <token>`) and a
/// client on it.
async fn connect(
    host: &TestHost,
    token: Option<&str>,
) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
    let url = format!("{}/v1/ahp", host.url().replacen("http://", "ws://", 1));
    let mut request = url.into_client_request()?;
    if let Some(token) = token {
        request.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let (stream, _) = tokio_tungstenite::connect_async(request).await?;
    // A buffer larger than any scenario's actions: a lagging subscription drops them.
    let config = ClientConfig { default_request_timeout: Some(PATIENCE), subscription_buffer: 1 << 16 };
    Ok(Client::connect(WebSocketTransport::from_stream(stream), config).await.unwrap())
}

/// A client that said hello.
async fn initialized(host: &TestHost, token: Option<&str>, client_id: &str) -> Client {
    let client = connect(host, token).await.unwrap();
    let init = client.initialize(client_id.into(), vec!["1.0.0".into()], vec![]).await.unwrap();
    assert_eq!(init.protocol_version, "1.0.0");
    client
}

fn rpc_code(error: &ClientError) -> i32 {
    match error {
        ClientError::Rpc(e) => e.code,
        other => panic!("not a JSON-RPC error: {other:?}"),
    }
}

/// A chat as the client holds it: the snapshot with every received action reduced in.
struct Mirror {
    session: String,
    chat: ChatState,
    sub: SessionSubscription,
    /// Every envelope received, rejections included.
    seen: Vec<ActionEnvelope>,
    last_seq: u64,
}

impl Mirror {
    async fn subscribe(client: &Client, session: &str) -> Mirror {
        let (result, sub): (SubscribeResult, _) =
            client.subscribe(format!("ahp-chat:/{session}")).await.unwrap();
        let snapshot = result.snapshot.expect("a chat snapshot");
        let SnapshotState::Chat(chat) = snapshot.state else { panic!("not a chat: {:?}", snapshot.state) };
        Mirror {
            session: session.into(),
            chat: *chat,
            sub,
            seen: Vec::new(),
            last_seq: snapshot.from_seq as u64,
        }
    }

    fn apply(&mut self, envelope: ActionEnvelope) {
        if envelope.rejection_reason.is_none() {
            let outcome = apply_action_to_chat(&mut self.chat, &envelope.action);
            assert_eq!(outcome, ReduceOutcome::Applied, "{envelope:?}");
            assert!(
                envelope.server_seq > self.last_seq,
                "serverSeq goes up: {envelope:?} after {}",
                self.last_seq
            );
            self.last_seq = envelope.server_seq;
        }
        self.seen.push(envelope);
    }

    /// Receives actions until the client's chat equals `GET .../chat` (which must come about
    /// within the patience).
    async fn settle(&mut self, host: &TestHost) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let served: ChatState =
                host.get_ok(&format!("/v1/sessions/{}/chat?turns=500", self.session)).await;
            if served == self.chat {
                return;
            }
            if Instant::now() >= deadline {
                assert_eq!(self.chat, served, "the client's chat differs from GET .../chat");
            }
            if let Ok(Some(SubscriptionEvent::Action(envelope))) =
                tokio::time::timeout(Duration::from_millis(200), self.sub.recv()).await
            {
                self.apply(envelope);
            }
        }
    }

    /// Receives actions until `done` holds for an envelope (returned).
    async fn until(&mut self, done: impl Fn(&ActionEnvelope) -> bool) -> ActionEnvelope {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let event = tokio::time::timeout_at(deadline, self.sub.recv()).await.expect("an action in time");
            if let Some(SubscriptionEvent::Action(envelope)) = event {
                let hit = done(&envelope);
                self.apply(envelope.clone());
                if hit {
                    return envelope;
                }
            }
        }
    }

    fn channel(&self) -> String {
        format!("ahp-chat:/{}", self.session)
    }
}

fn user(text: &str) -> Message {
    Message {
        text: text.into(),
        origin: MessageOrigin { kind: MessageKind::User },
        attachments: None,
        model: None,
        agent: None,
        meta: None,
    }
}

/// Session `session` of agent `provider`, created by `client`, and its chat subscribed.
async fn created(client: &Client, session: &str, provider: &str) -> Mirror {
    let _: Value = client
        .request("createSession", json!({"channel": format!("ahp-session:/{session}"), "provider": provider}))
        .await
        .unwrap();
    Mirror::subscribe(client, session).await
}

fn turn_started(turn_id: &str, text: &str) -> StateAction {
    StateAction::ChatTurnStarted(ChatTurnStartedAction {
        turn_id: turn_id.into(),
        started_at: "2026-01-01T00:00:00Z".into(),
        message: user(text),
        queued_message_id: None,
        meta: None,
    })
}

fn kind(envelope: &ActionEnvelope) -> String {
    serde_json::to_value(&envelope.action).unwrap()["type"].as_str().unwrap().to_owned()
}

async fn wait_status(host: &TestHost, session: &str, turn_id: &str, status: TurnStatus) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (code, body) = host.get(&format!("/v1/sessions/{session}/turns/{turn_id}")).await;
        if code == 200 && body["status"] == json!(status) {
            return;
        }
        assert!(Instant::now() < deadline, "turn {turn_id} never became {status:?}: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Initialize (and a version nobody speaks), ping, the agents, create and list a session, a
/// streamed turn echoed with its origin, a turn refused while one is active, a queued message
/// that starts after it, a cancelled turn, unknown methods and malformed params.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_drives_a_chat_over_ahp() {
    let openai = FakeOpenAi::start().await;
    let (host, _dir) = host(&config(&openai, "")).await;

    let stranger = connect(&host, None).await.unwrap();
    let error = stranger.initialize("old".into(), vec!["9.0.0".into()], vec![]).await.unwrap_err();
    assert_eq!(rpc_code(&error), -32005);
    let ClientError::Rpc(e) = &error else { unreachable!() };
    assert_eq!(e.data.as_ref().unwrap()["supportedVersions"], json!(ahp_types::SUPPORTED_PROTOCOL_VERSIONS));

    let client = connect(&host, None).await.unwrap();
    let init =
        client.initialize("client-a".into(), vec!["1.0.0".into()], vec!["ahp-root://".into()]).await.unwrap();
    assert_eq!(init.protocol_version, "1.0.0");
    let SnapshotState::Root(root) = &init.snapshots[0].state else { panic!("{:?}", init.snapshots) };
    let providers: Vec<&str> = root.agents.iter().map(|a| a.provider.as_str()).collect();
    assert_eq!(providers, ["asker", "chat"]);
    client.ping().await.unwrap();
    let mut root_sub = client.attach_subscription("ahp-root://").await;

    let created: Value = client
        .request("createSession", json!({"channel": "ahp-session:/s-a", "provider": "chat"}))
        .await
        .unwrap();
    assert_eq!(created, Value::Null);
    let added = tokio::time::timeout(PATIENCE, root_sub.recv()).await.unwrap();
    let Some(SubscriptionEvent::SessionAdded(added)) = added else { panic!("{added:?}") };
    assert_eq!(
        (added.summary.resource.as_str(), added.summary.provider.as_str()),
        ("ahp-session:/s-a", "chat")
    );
    let again = client
        .request::<_, Value>("createSession", json!({"channel": "ahp-session:/s-a", "provider": "chat"}))
        .await
        .unwrap_err();
    assert_eq!(rpc_code(&again), -32003);
    let unknown = client
        .request::<_, Value>("createSession", json!({"channel": "ahp-session:/s-b", "provider": "nobody"}))
        .await
        .unwrap_err();
    assert_eq!(rpc_code(&unknown), -32002);
    let listed: Value = client.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    let resources: Vec<&str> =
        listed["items"].as_array().unwrap().iter().map(|s| s["resource"].as_str().unwrap()).collect();
    assert_eq!(resources, ["ahp-session:/s-a"]);

    // A session created over HTTP is announced to root subscribers too.
    openai.push(Reply::text("Hello over HTTP."));
    let input = json!({"type": "client.message", "agent_id": "chat", "turn_id": "h-1",
        "message": {"role": "user", "content": "Hi"}});
    host.submit_ok("s-http", &input).await;
    let added = tokio::time::timeout(PATIENCE, root_sub.recv()).await.unwrap();
    let Some(SubscriptionEvent::SessionAdded(added)) = added else { panic!("{added:?}") };
    assert_eq!(added.summary.resource, "ahp-session:/s-http");
    wait_status(&host, "s-http", "h-1", TurnStatus::Completed).await;

    let mut chat = Mirror::subscribe(&client, "s-a").await;
    assert!(chat.chat.turns.is_empty() && chat.chat.active_turn.is_none());

    // A streamed turn: deltas grow the reply, the turn start is the echo of the client's.
    // The stream pauses after its first fragments, so they reach the client before the reply
    // is recorded.
    openai.push(Reply::text("Hello there, my friend.").fragment_chars(4).pause_after(3));
    client.dispatch(chat.channel(), turn_started("turn-1", "Hi")).await.unwrap();
    chat.until(|e| kind(e) == "chat/delta").await;
    openai.release();
    wait_status(&host, "s-a", "turn-1", TurnStatus::Completed).await;
    chat.settle(&host).await;
    let echo = chat.seen.iter().find(|e| kind(e) == "chat/turnStarted").expect("the echo");
    assert_eq!(echo.origin.as_ref().map(|o| o.client_id.as_str()), Some("client-a"), "{echo:?}");
    assert!(chat.seen.iter().any(|e| kind(e) == "chat/delta"), "{:?}", chat.seen);
    assert_eq!(chat.chat.turns[0].message.text, "Hi");

    // A turn while one is active is refused; a queued message starts after it.
    openai.push(Reply::text("Slowly, then.").pause_after(2));
    openai.push(Reply::text("Queued answer."));
    client.dispatch(chat.channel(), turn_started("turn-2", "Take your time")).await.unwrap();
    wait_status(&host, "s-a", "turn-2", TurnStatus::Active).await;
    client.dispatch(chat.channel(), turn_started("turn-3", "Me too")).await.unwrap();
    let refused = chat.until(|e| e.rejection_reason.is_some()).await;
    assert_eq!(kind(&refused), "chat/turnStarted");
    assert!(refused.rejection_reason.as_deref().unwrap().contains("still active"), "{refused:?}");
    assert_eq!(refused.origin.as_ref().unwrap().client_id, "client-a");
    let queued = StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
        kind: PendingMessageKind::Queued,
        id: "turn-4".into(),
        message: user("And then this"),
    });
    client.dispatch(chat.channel(), queued).await.unwrap();
    chat.until(|e| kind(e) == "chat/pendingMessageSet").await;
    assert_eq!(chat.chat.queued_messages.as_ref().map(Vec::len), Some(1));
    openai.release();
    wait_status(&host, "s-a", "turn-4", TurnStatus::Completed).await;
    chat.settle(&host).await;
    let ids: Vec<&str> = chat.chat.turns.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["turn-1", "turn-2", "turn-4"]);
    assert!(chat.chat.queued_messages.is_none());

    // A cancelled turn.
    openai.push(Reply::text("Never finished.").pause_after(1));
    client.dispatch(chat.channel(), turn_started("turn-5", "Stop me")).await.unwrap();
    wait_status(&host, "s-a", "turn-5", TurnStatus::Active).await;
    let cancel = StateAction::ChatTurnCancelled(ChatTurnCancelledAction {
        turn_id: "turn-5".into(),
        duration: 0,
        meta: None,
    });
    client.dispatch(chat.channel(), cancel).await.unwrap();
    wait_status(&host, "s-a", "turn-5", TurnStatus::Cancelled).await;
    openai.release();
    chat.settle(&host).await;
    assert_eq!(serde_json::to_value(chat.chat.turns[3].state).unwrap(), json!("cancelled"));

    // What the host does not know.
    let bogus = client.request::<_, Value>("bogus", json!({"channel": "ahp-root://"})).await.unwrap_err();
    assert_eq!(rpc_code(&bogus), -32601);
    let malformed = client.request::<_, Value>("subscribe", json!({"channel": 3})).await.unwrap_err();
    assert_eq!(rpc_code(&malformed), -32602);
    let ClientError::Rpc(e) = &malformed else { unreachable!() };
    assert!(e.message.contains("channel"), "{e:?}");
    let sourceless = client
        .request::<_, Value>("createChat", json!({"channel": "ahp-session:/s-a", "chat": "ahp-chat:/fork"}))
        .await
        .unwrap_err();
    assert!(
        matches!(&sourceless, ClientError::Rpc(e) if e.code == -32602 && e.message.contains("params.source")),
        "a chat of this host is a fork: {sourceless:?}"
    );
    client.shutdown().await;
    host.stop().await;
}

/// A client tool's call completed by the client, and an interrupt answered as an input request.
#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_and_input_requests_over_ahp() {
    let openai = FakeOpenAi::start().await;
    let worker = FakeWorker::start(None, |request, _| match &request.trigger {
        Trigger::LlmFinished(t)
            if t.message.as_ref().is_some_and(|m| m.content_text() == "Shall I deploy?") =>
        {
            FakeAnswer::Respond(DecisionResponse {
                messages: request.proposed.messages.clone(),
                actions: Some(vec![Action::Interrupt(InterruptAction {
                    interrupt_id: Some("int_approve".into()),
                    reason: "needs approval".into(),
                    payload: None,
                })]),
                ..DecisionResponse::default()
            })
        }
        _ => FakeAnswer::Accept,
    })
    .await;
    let ops = format!("[agent.ops]\nmodel = \"gpt-fake\"\nllm = \"fake\"\nworker = \"{}\"\n", worker.url());
    let (host, _dir) = host(&config(&openai, &ops)).await;
    let client = initialized(&host, None, "client-t").await;

    // The client tool.
    openai.push(Reply::tool_calls([FakeToolCall::new("call_ask", "confirm", r#"{"question":"Deploy?"}"#)]));
    openai.push(Reply::text("Deploying, as you confirmed."));
    let _: Value = client
        .request("createSession", json!({"channel": "ahp-session:/s-tool", "provider": "asker"}))
        .await
        .unwrap();
    let mut chat = Mirror::subscribe(&client, "s-tool").await;
    client.dispatch(chat.channel(), turn_started("t-1", "Deploy it.")).await.unwrap();
    let start = chat.until(|e| kind(e) == "chat/toolCallReady").await;
    let StateAction::ChatToolCallReady(ready) = &start.action else { unreachable!() };
    assert_eq!(ready.tool_call_id, "call_ask");
    let complete = StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
        turn_id: "t-1".into(),
        tool_call_id: "call_ask".into(),
        meta: None,
        result: ToolCallResult {
            success: true,
            past_tense_message: StringOrMarkdown::Plain("Asked".into()),
            content: Some(vec![ToolResultContent::Text(ToolResultTextContent { text: "yes".into() })]),
            structured_content: None,
            error: None,
        },
        requires_result_confirmation: None,
    });
    client.dispatch(chat.channel(), complete).await.unwrap();
    wait_status(&host, "s-tool", "t-1", TurnStatus::Completed).await;
    chat.settle(&host).await;
    let echo = chat.seen.iter().find(|e| kind(e) == "chat/toolCallComplete").unwrap();
    assert_eq!(echo.origin.as_ref().map(|o| o.client_id.as_str()), Some("client-t"));
    let messages = host.messages("s-tool").await;
    assert_eq!(messages[2]["content"], "yes", "{messages:?}");

    // The interrupt.
    openai.push(Reply::text("Shall I deploy?"));
    openai.push(Reply::text("Deployed."));
    let _: Value = client
        .request("createSession", json!({"channel": "ahp-session:/s-int", "provider": "ops"}))
        .await
        .unwrap();
    let mut chat = Mirror::subscribe(&client, "s-int").await;
    client.dispatch(chat.channel(), turn_started("t-2", "Deploy v2.")).await.unwrap();
    chat.until(|e| kind(e) == "chat/inputRequested").await;
    let answer = StateAction::ChatInputCompleted(ChatInputCompletedAction {
        request_id: "int_approve".into(),
        response: ChatInputResponseKind::Accept,
        answers: None,
    });
    client.dispatch(chat.channel(), answer).await.unwrap();
    wait_status(&host, "s-int", "t-2", TurnStatus::Completed).await;
    chat.settle(&host).await;
    let resumed =
        worker.records().into_iter().find(|r| r.trigger_name() == "interrupt.resumed").expect("a resume");
    let Trigger::InterruptResumed(t) = &resumed.request.trigger else { unreachable!() };
    assert_eq!(t.payload, Some(json!({"response": "accept"})));
    client.shutdown().await;
    host.stop().await;
}

/// A client that lost its connection reconnects with the last `serverSeq` it saw and gets the
/// actions it missed, replayed from the log (its chat then equals the host's), and goes on
/// live; a position the log cannot explain gets a fresh snapshot instead.
#[tokio::test(flavor = "multi_thread")]
async fn reconnect_replays_the_missed_actions_from_the_log() {
    let openai = FakeOpenAi::start().await;
    let (host, _dir) = host(&config(&openai, "")).await;
    let client = initialized(&host, None, "client-r").await;
    let mut chat = created(&client, "s-r", "chat").await;
    openai.push(Reply::text("First."));
    client.dispatch(chat.channel(), turn_started("r-1", "One")).await.unwrap();
    wait_status(&host, "s-r", "r-1", TurnStatus::Completed).await;
    chat.settle(&host).await;
    client.shutdown().await;

    // Missed: a turn driven over HTTP while the client is away.
    openai.push(Reply::text("Second, while you were away."));
    let input = json!({"type": "client.message", "agent_id": "chat", "turn_id": "r-2", "message": {"role": "user", "content": "Two"}});
    host.submit_ok("s-r", &input).await;
    wait_status(&host, "s-r", "r-2", TurnStatus::Completed).await;

    let client = connect(&host, None).await.unwrap();
    let result =
        client.reconnect("client-r".into(), chat.last_seq as i64, vec![chat.channel()]).await.unwrap();
    let ReconnectResult::Replay(replay) = result else { panic!("not a replay: {result:?}") };
    assert!(replay.missing.is_empty());
    assert!(!replay.actions.is_empty());
    chat.sub = client.attach_subscription(&chat.channel()).await;
    for envelope in replay.actions {
        chat.apply(envelope);
    }
    chat.settle(&host).await;
    assert_eq!(chat.chat.turns.len(), 2);

    // Live again on the new connection.
    openai.push(Reply::text("Third."));
    client.dispatch(chat.channel(), turn_started("r-3", "Three")).await.unwrap();
    wait_status(&host, "s-r", "r-3", TurnStatus::Completed).await;
    chat.settle(&host).await;
    client.shutdown().await;

    // A position past the log: snapshots.
    let client = connect(&host, None).await.unwrap();
    let result = client
        .reconnect("client-r".into(), i64::MAX / 2, vec![chat.channel(), "ahp-chat:/nobody".into()])
        .await
        .unwrap();
    let ReconnectResult::Snapshot(snapshot) = result else { panic!("not a snapshot: {result:?}") };
    assert_eq!(snapshot.snapshots.len(), 1);
    let SnapshotState::Chat(state) = &snapshot.snapshots[0].state else { panic!() };
    assert_eq!(**state, chat.chat);
    client.shutdown().await;
    host.stop().await;
}

const AUTH_CONFIG: &str = r#"
[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"

[auth]
api_keys_env = "KEYS"
"#;

/// The upgrade is authenticated like the HTTP API, and a client sees only its own sessions.
#[tokio::test(flavor = "multi_thread")]
async fn ahp_is_authenticated_and_scoped_to_the_callers_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start_with_env(AUTH_CONFIG, dir.path(), |name| {
        (name == "KEYS").then(|| "alice:key-alice,bob:key-bob".to_owned())
    })
    .await;
    for token in [None, Some("key-nobody")] {
        let error = connect(&host, token).await.map(|_| ()).unwrap_err();
        let tokio_tungstenite::tungstenite::Error::Http(response) = &error else { panic!("{error:?}") };
        assert_eq!(response.status(), 401, "{token:?}");
    }

    let alice = initialized(&host, Some("key-alice"), "alice-1").await;
    let _: Value = alice
        .request("createSession", json!({"channel": "ahp-session:/s-alice", "provider": "demo"}))
        .await
        .unwrap();
    let mine: Value = alice.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    assert_eq!(mine["items"].as_array().unwrap().len(), 1);

    let bob = initialized(&host, Some("key-bob"), "bob-1").await;
    let theirs: Value = bob.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    assert_eq!(theirs["items"], json!([]));
    for channel in ["ahp-chat:/s-alice", "ahp-session:/s-alice"] {
        let error = bob.subscribe(channel.into()).await.map(|_| ()).unwrap_err();
        assert_eq!(rpc_code(&error), -32001, "{channel}");
    }
    let mut events = bob.events();
    bob.dispatch("ahp-chat:/s-alice".into(), turn_started("b-1", "Mine now")).await.unwrap();
    let event = tokio::time::timeout(PATIENCE, events.recv()).await.unwrap().unwrap();
    let SubscriptionEvent::Action(refused) = event.event else { panic!() };
    assert!(refused.rejection_reason.as_deref().unwrap().contains("no chat"), "{refused:?}");
    let summary = alice.request::<_, Value>("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    assert_eq!(summary["items"].as_array().unwrap().len(), 1);
    let (status, _) = host.with_token("key-alice").get("/v1/sessions/s-alice/turns/b-1").await;
    assert_eq!(status, 404, "bob's turn never started");

    // Only its owner disposes of a session; root subscribers that may see it hear it is gone.
    alice.subscribe("ahp-root://".into()).await.unwrap();
    let mut alice_root = alice.attach_subscription("ahp-root://").await;
    bob.subscribe("ahp-root://".into()).await.unwrap();
    let mut bob_root = bob.attach_subscription("ahp-root://").await;
    let error = bob
        .request::<_, Value>("disposeSession", json!({"channel": "ahp-session:/s-alice"}))
        .await
        .unwrap_err();
    assert_eq!(rpc_code(&error), -32001);
    let disposed: Value =
        alice.request("disposeSession", json!({"channel": "ahp-session:/s-alice"})).await.unwrap();
    assert_eq!(disposed, Value::Null);
    let removed = tokio::time::timeout(PATIENCE, alice_root.recv()).await.unwrap();
    let Some(SubscriptionEvent::SessionRemoved(removed)) = removed else { panic!("{removed:?}") };
    assert_eq!(removed.session, "ahp-session:/s-alice");
    let mine: Value = alice.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    assert_eq!(mine["items"], json!([]));
    let again = alice
        .request::<_, Value>("disposeSession", json!({"channel": "ahp-session:/s-alice"}))
        .await
        .unwrap_err();
    assert_eq!(rpc_code(&again), -32001);
    // Bob heard nothing of alice's session: the next root notification he gets is his own.
    let _: Value = bob
        .request("createSession", json!({"channel": "ahp-session:/s-bob", "provider": "demo"}))
        .await
        .unwrap();
    let next = tokio::time::timeout(PATIENCE, bob_root.recv()).await.unwrap();
    let Some(SubscriptionEvent::SessionAdded(added)) = next else { panic!("{next:?}") };
    assert_eq!(added.summary.resource, "ahp-session:/s-bob");
    alice.shutdown().await;
    bob.shutdown().await;
    host.stop().await;
}

fn confirmed(turn_id: &str, call_id: &str, approved: bool, reason: Option<&str>) -> StateAction {
    StateAction::ChatToolCallConfirmed(ahp_types::actions::ChatToolCallConfirmedAction {
        turn_id: turn_id.into(),
        tool_call_id: call_id.into(),
        meta: None,
        approved,
        confirmed: approved.then_some(ahp_types::state::ToolCallConfirmationReason::UserAction),
        reason: None,
        edited_tool_input: None,
        user_suggestion: None,
        reason_message: reason.map(|r| StringOrMarkdown::Plain(r.into())),
        selected_option_id: None,
    })
}

fn completed_with(turn_id: &str, call_id: &str, text: &str) -> StateAction {
    StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
        turn_id: turn_id.into(),
        tool_call_id: call_id.into(),
        meta: None,
        result: ToolCallResult {
            success: true,
            past_tense_message: StringOrMarkdown::Plain("Done".into()),
            content: Some(vec![ToolResultContent::Text(ToolResultTextContent { text: text.into() })]),
            structured_content: None,
            error: None,
        },
        requires_result_confirmation: None,
    })
}

const GUARDED: &str = r#"
[agent.guard]
model = "gpt-fake"
llm = "fake"

[[agent.guard.tools]]
name = "deploy"
handler = "client"
approval = "always"

[[agent.guard.tools]]
name = "wipe"
handler = "client"
approval = "always"
"#;

/// Tool approval (one call approved, one denied with a reason), a steering message that enters
/// the running turn after its tool's result, and a fork of the chat at a completed turn.
#[tokio::test(flavor = "multi_thread")]
async fn approval_steering_and_forks_over_ahp() {
    let openai = FakeOpenAi::start().await;
    let (host, _dir) = host(&config(&openai, GUARDED)).await;
    let client = initialized(&host, None, "client-g").await;

    // Approve one call, deny the other.
    openai.push(Reply::tool_calls([
        FakeToolCall::new("call_d", "deploy", "{}"),
        FakeToolCall::new("call_w", "wipe", "{}"),
    ]));
    openai.push(Reply::text("Deployed; nothing wiped."));
    let _: Value = client
        .request("createSession", json!({"channel": "ahp-session:/s-g", "provider": "guard"}))
        .await
        .unwrap();
    let mut chat = Mirror::subscribe(&client, "s-g").await;
    client.dispatch(chat.channel(), turn_started("g-1", "Ship it")).await.unwrap();
    chat.until(|e| matches!(&e.action, StateAction::ChatToolCallReady(r) if r.tool_call_id == "call_w"))
        .await;
    let active = chat.chat.active_turn.as_ref().unwrap();
    let waiting = |id: &str| {
        active.response_parts.iter().any(|p| {
            matches!(p, ahp_types::state::ResponsePart::ToolCall(tc)
                if matches!(&tc.tool_call, ahp_types::state::ToolCallState::PendingConfirmation(s) if s.tool_call_id == id))
        })
    };
    assert!(waiting("call_d") && waiting("call_w"), "{:?}", active.response_parts);
    client.dispatch(chat.channel(), confirmed("g-1", "call_d", true, None)).await.unwrap();
    client.dispatch(chat.channel(), confirmed("g-1", "call_w", false, Some("never wipe"))).await.unwrap();
    chat.until(|e| matches!(&e.action, StateAction::ChatToolCallConfirmed(c) if c.tool_call_id == "call_w"))
        .await;
    // Each confirmation's echo carries its origin: the client stops holding it as pending.
    for call in ["call_d", "call_w"] {
        let echo = chat
            .seen
            .iter()
            .find(|e| matches!(&e.action, StateAction::ChatToolCallConfirmed(c) if c.tool_call_id == call))
            .unwrap();
        assert_eq!(echo.origin.as_ref().map(|o| o.client_id.as_str()), Some("client-g"), "{echo:?}");
    }
    client.dispatch(chat.channel(), completed_with("g-1", "call_d", "shipped")).await.unwrap();
    wait_status(&host, "s-g", "g-1", TurnStatus::Completed).await;
    chat.settle(&host).await;
    let turn = &chat.chat.turns[0];
    let state = |id: &str| {
        turn.response_parts
            .iter()
            .find_map(|p| match p {
                ahp_types::state::ResponsePart::ToolCall(tc) => {
                    let v = serde_json::to_value(&tc.tool_call).unwrap();
                    (v["toolCallId"] == id).then_some(v)
                }
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(state("call_d")["status"], "completed");
    assert_eq!(
        (state("call_w")["status"].as_str(), state("call_w")["reason"].as_str()),
        (Some("cancelled"), Some("denied"))
    );
    let told = &openai.requests()[1].body["messages"];
    assert!(told.to_string().contains("the user denied this call of wipe: never wipe"), "{told}");

    // Steer the running turn while it waits on a tool call.
    openai.push(Reply::tool_calls([FakeToolCall::new("call_c", "confirm", r#"{"question":"Go?"}"#)]));
    openai.push(Reply::text("Going, and hello."));
    let _: Value = client
        .request("createSession", json!({"channel": "ahp-session:/s-st", "provider": "asker"}))
        .await
        .unwrap();
    let mut chat = Mirror::subscribe(&client, "s-st").await;
    client.dispatch(chat.channel(), turn_started("st-1", "Go")).await.unwrap();
    chat.until(|e| kind(e) == "chat/toolCallReady").await;
    let steer = StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
        kind: PendingMessageKind::Steering,
        id: "st-2".into(),
        message: user("Also say hello"),
    });
    client.dispatch(chat.channel(), steer).await.unwrap();
    chat.until(|e| kind(e) == "chat/pendingMessageSet").await;
    assert_eq!(chat.chat.steering_message.as_ref().map(|m| m.id.as_str()), Some("st-2"));
    client.dispatch(chat.channel(), completed_with("st-1", "call_c", "yes")).await.unwrap();
    wait_status(&host, "s-st", "st-1", TurnStatus::Completed).await;
    chat.settle(&host).await;
    assert!(chat.chat.steering_message.is_none());
    // The steering message joined the engine's turn, and stays in the transcript as the chat
    // turn it took on.
    let turns: Vec<(&str, &str)> =
        chat.chat.turns.iter().map(|t| (t.id.as_str(), t.message.text.as_str())).collect();
    assert_eq!(turns, [("st-1", "Go"), ("st-2", "Also say hello")]);
    let asked = openai.requests()[3].body["messages"].as_array().unwrap().clone();
    assert_eq!(asked.last().unwrap()["content"], "Also say hello");

    // Fork the chat at its completed turn: a chat of the session with that history.
    let fork = json!({
        "channel": "ahp-session:/s-st",
        "chat": "ahp-chat:/s-st-fork",
        "source": {"kind": "fork", "chat": "ahp-chat:/s-st", "turnId": "st-1"},
    });
    // A subscriber of the session hears of the new chat.
    let (_, mut session_sub): (SubscribeResult, _) =
        client.subscribe("ahp-session:/s-st".into()).await.unwrap();
    let _: Value = client.request("createChat", fork.clone()).await.unwrap();
    let added = loop {
        match tokio::time::timeout(PATIENCE, session_sub.recv()).await.expect("session/chatAdded in time") {
            Some(SubscriptionEvent::Action(envelope)) => {
                if let StateAction::SessionChatAdded(added) = envelope.action {
                    break added;
                }
            }
            Some(_) => {}
            None => panic!("the session subscription ended"),
        }
    };
    assert_eq!(added.summary.resource, "ahp-chat:/s-st-fork");
    let _: Value = client.request("createChat", fork).await.unwrap();
    let (result, _): (SubscribeResult, _) = client.subscribe("ahp-session:/s-st".into()).await.unwrap();
    let SnapshotState::Session(session) = result.snapshot.unwrap().state else { panic!() };
    let chats: Vec<&str> = session.chats.iter().map(|c| c.resource.as_str()).collect();
    assert_eq!(chats, ["ahp-chat:/s-st", "ahp-chat:/s-st-fork"]);
    let mut forked = Mirror::subscribe(&client, "s-st-fork").await;
    let turns: Vec<&str> = forked.chat.turns.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(turns, ["st-1", "st-2"], "the fork starts with its source's turn, all of it");
    assert_eq!(
        serde_json::to_value(&forked.chat.origin).unwrap(),
        json!({"kind": "fork", "chat": "ahp-chat:/s-st", "turnId": "st-1"})
    );
    openai.push(Reply::text("A new direction."));
    client.dispatch(forked.channel(), turn_started("f-1", "Now something else")).await.unwrap();
    wait_status(&host, "s-st-fork", "f-1", TurnStatus::Completed).await;
    forked.settle(&host).await;
    assert_eq!(forked.chat.turns.len(), 3);
    let history = openai.requests()[4].body["messages"].as_array().unwrap().clone();
    assert!(history.iter().any(|m| m["content"] == "Also say hello"), "the fork continues the conversation");
    let bad = json!({
        "channel": "ahp-session:/s-st",
        "chat": "ahp-chat:/s-st-fork2",
        "source": {"kind": "fork", "chat": "ahp-chat:/s-st", "turnId": "nope"},
    });
    let error = client.request::<_, Value>("createChat", bad).await.unwrap_err();
    assert_eq!(rpc_code(&error), -32602, "{error:?}");
    client.shutdown().await;
    host.stop().await;
}

/// Queued messages over AHP: set, reordered and one removed while a turn runs; the others then
/// start in the new order.
#[tokio::test(flavor = "multi_thread")]
async fn queued_messages_are_reordered_and_withdrawn_over_ahp() {
    let openai = FakeOpenAi::start().await;
    let (host, _dir) = host(&config(&openai, "")).await;
    let client = initialized(&host, None, "client-q").await;
    let _: Value = client
        .request("createSession", json!({"channel": "ahp-session:/s-q", "provider": "chat"}))
        .await
        .unwrap();
    let mut chat = Mirror::subscribe(&client, "s-q").await;
    openai.push(Reply::text("First, slowly.").pause_after(1));
    openai.push(Reply::text("Third."));
    openai.push(Reply::text("Second."));
    client.dispatch(chat.channel(), turn_started("q-0", "Go")).await.unwrap();
    wait_status(&host, "s-q", "q-0", TurnStatus::Active).await;
    for id in ["q-1", "q-2", "q-3"] {
        let queued = StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
            kind: PendingMessageKind::Queued,
            id: id.into(),
            message: user(id),
        });
        client.dispatch(chat.channel(), queued).await.unwrap();
        chat.until(|e| matches!(&e.action, StateAction::ChatPendingMessageSet(s) if s.id == id)).await;
    }
    let reorder =
        StateAction::ChatQueuedMessagesReordered(ahp_types::actions::ChatQueuedMessagesReorderedAction {
            order: vec!["q-3".into(), "q-1".into()],
        });
    client.dispatch(chat.channel(), reorder).await.unwrap();
    chat.until(|e| kind(e) == "chat/queuedMessagesReordered").await;
    let remove =
        StateAction::ChatPendingMessageRemoved(ahp_types::actions::ChatPendingMessageRemovedAction {
            kind: PendingMessageKind::Queued,
            id: "q-1".into(),
        });
    client.dispatch(chat.channel(), remove).await.unwrap();
    chat.until(|e| kind(e) == "chat/pendingMessageRemoved").await;
    let ids: Vec<&str> = chat.chat.queued_messages.iter().flatten().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["q-3", "q-2"]);
    let status = |listed: &Value| listed["items"][0]["status"].as_u64();
    let listed: Value = client.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    assert_eq!(status(&listed), Some(u64::from(SessionStatus::InProgress.bits())), "{listed}");
    openai.release();
    wait_status(&host, "s-q", "q-2", TurnStatus::Completed).await;
    chat.settle(&host).await;
    let turns: Vec<&str> = chat.chat.turns.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(turns, ["q-0", "q-3", "q-2"]);
    assert!(chat.chat.queued_messages.is_none());
    let listed: Value = client.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    assert_eq!(status(&listed), Some(u64::from(SessionStatus::Idle.bits())), "{listed}");

    // A second client takes the newest turn only, then fetches the older ones.
    let other = initialized(&host, None, "client-q2").await;
    let subscribed: SubscribeResult =
        other.request("subscribe", json!({"channel": "ahp-chat:/s-q", "view": {"turns": 1}})).await.unwrap();
    let mut sub = other.attach_subscription("ahp-chat:/s-q").await;
    let SnapshotState::Chat(tail) = subscribed.snapshot.unwrap().state else { panic!() };
    assert_eq!(tail.turns.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["q-2"]);
    let cursor = tail.turns_next_cursor.clone().expect("older turns to fetch");
    let _: Value =
        other.request("fetchTurns", json!({"channel": "ahp-chat:/s-q", "cursor": cursor})).await.unwrap();
    let loaded = tokio::time::timeout(PATIENCE, sub.recv()).await.unwrap();
    let Some(SubscriptionEvent::Action(envelope)) = loaded else { panic!("{loaded:?}") };
    let StateAction::ChatTurnsLoaded(older) = envelope.action else { panic!("{envelope:?}") };
    assert_eq!(older.turns.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["q-0", "q-3"]);
    assert_eq!(older.turns_next_cursor, None);
    let bad = other
        .request::<_, Value>("fetchTurns", json!({"channel": "ahp-chat:/s-q", "cursor": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(rpc_code(&bad), -32602);
    other.shutdown().await;
    client.shutdown().await;
    host.stop().await;
}

/// A turn that failed on the model's error says it is resumable, and `chat/turnResume` takes
/// it up again: the same chat turn, active again, goes on from the conversation as it stood
/// (the user's message sent to the model once) and completes.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_turn_is_resumed_over_ahp() {
    let openai = FakeOpenAi::start().await;
    let (host, _dir) = host(&config(&openai, "")).await;
    let client = initialized(&host, None, "client-r").await;
    let mut chat = created(&client, "s-r", "chat").await;
    openai.push(Reply::error(400, "the request could not be served"));
    client.dispatch(chat.channel(), turn_started("r-1", "Hello")).await.unwrap();
    wait_status(&host, "s-r", "r-1", TurnStatus::Failed).await;
    chat.settle(&host).await;
    let failed = chat.chat.turns.last().unwrap();
    let Some(ahp_types::state::ResponsePart::Error(error)) = failed.response_parts.last() else {
        panic!("{failed:?}")
    };
    assert_eq!(error.resumable, Some(true), "{error:?}");

    openai.push(Reply::text("Hello again."));
    let resume =
        StateAction::ChatTurnResume(ahp_types::actions::ChatTurnResumeAction { turn_id: "r-1".into() });
    client.dispatch(chat.channel(), resume).await.unwrap();
    let echo = chat.until(|e| kind(e) == "chat/turnResume").await;
    assert_eq!(echo.origin.map(|o| o.client_id), Some("client-r".to_owned()));
    wait_status(&host, "s-r", "r-1.resume1", TurnStatus::Completed).await;
    chat.settle(&host).await;
    let turns: Vec<(&str, _)> = chat.chat.turns.iter().map(|t| (t.id.as_str(), t.state)).collect();
    assert_eq!(turns, [("r-1", ahp_types::state::TurnState::Complete)]);
    let asked = openai.requests()[1].body["messages"].clone();
    let hellos = asked.as_array().unwrap().iter().filter(|m| m["content"] == "Hello").count();
    assert_eq!(hellos, 1, "{asked}");

    // Only the latest failed turn resumes.
    let again =
        StateAction::ChatTurnResume(ahp_types::actions::ChatTurnResumeAction { turn_id: "r-1".into() });
    client.dispatch(chat.channel(), again).await.unwrap();
    let refused = chat.until(|e| e.rejection_reason.is_some()).await;
    assert!(refused.rejection_reason.unwrap().contains("is not the chat's latest turn failed resumably"));
    client.shutdown().await;
    host.stop().await;
}

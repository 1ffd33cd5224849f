//! The AHP host driven the way VS Code's agent host client drives a remote host: the JSON-RPC
//! frames it sends, in its order, over a real WebSocket to a local `turnstone serve` host. Each
//! frame is written from VS Code's source as `docs/vscode-ahp-client.md` records it (microsoft/vscode,
//! `src/vs/platform/agentHost/`: the client core `common/agentHostProtocolClient.ts` at
//! 218523b3e5ceab4a1551f2384e90c5ad6669fe29, the newest client
//! `browser/agentHostProtocolClient.ts` at 00b8ba12de8e503347652b97f5c4dd9fd5398e5e, the
//! transport `browser/webSocketClientTransport.ts` at 0f225ea05f1fccb551b832693dc9223b6268ee87;
//! the section of that document is named at each step). After each step the chat the client
//! reduced equals `GET /v1/sessions/{id}/chat`. With `TURNSTONE_TEST_BACKEND=topology` the
//! socket goes through API Gateway's WebSocket API in front of the ahp function
//! (`tests/src/topology/websocket.rs`); `scripts/test` runs there the tests that hold on AWS so far.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ahp::reducers::{ReduceOutcome, apply_action_to_chat};
use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::state::{ChatInteractivity, ChatState, SessionInputRequest, SnapshotState};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use turnstone_engine::protocol::{Action, DecisionResponse, InterruptAction, Trigger};
use turnstone_tests::{ApiClient, FakeAnswer, FakeWorker, TestHost};

const PATIENCE: Duration = Duration::from_secs(15);

/// What VS Code's desktop renderer adds to its agent host socket's upgrade (§1): the origin of
/// its Electron page (`vscode-file://vscode-app`, the scheme the workbench is loaded from) and
/// its user agent (Electron's Chromium with `Code/<version>` and `Electron/<version>`).
const VSCODE_UPGRADE_HEADERS: &[(&str, &str)] = &[
    ("origin", "vscode-file://vscode-app"),
    (
        "user-agent",
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Code/1.107.0 \
         Chrome/142.0.7444.175 Electron/39.2.3 Safari/537.36",
    ),
    ("pragma", "no-cache"),
    ("cache-control", "no-cache"),
    ("accept-language", "en-US,en;q=0.9"),
];

/// The scripted model (`/tool <name> <args>` calls a tool), and the demo agent's client tools:
/// `confirm`, and `deploy`, which needs approval.
const CONFIG: &str = r#"
[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"

[[agent.demo.tools]]
name = "confirm"
description = "Ask the user a yes/no question and wait for the answer."
handler = "client"
input = { type = "object", properties = { question = { type = "string" } }, required = ["question"] }

[[agent.demo.tools]]
name = "deploy"
handler = "client"
approval = "always"
input = { type = "object", properties = { target = { type = "string" } } }

[[agent.demo.sub_agents]]
id = "helper"
description = "Helps."

[agent.helper]
model = "scripted"
llm = "s"

[[agent.helper.tools]]
name = "publish"
handler = "client"
approval = "always"
input = { type = "object", properties = { channel = { type = "string" } } }
"#;

/// How VS Code offers itself (§2): every version its registry supports but 0.8.0.
const PROTOCOL_VERSIONS: [&str; 5] = ["0.9.0", "0.7.0", "0.6.0", "0.5.2", "0.5.1"];

/// A VS Code window's agent host client: one socket, one client id, its own `clientSeq`
/// counter (from 1; root configuration always 0, §9), the highest `serverSeq` it saw on any
/// channel (§10), the chats it reduces, and the actions it still holds as pending (§9).
struct VsCode {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    client_id: String,
    next_id: u64,
    next_seq: i64,
    last_seen_server_seq: u64,
    chats: HashMap<String, ChatState>,
    /// The session channels it subscribes to.
    sessions: Vec<String>,
    /// Actions dispatched and not yet echoed: channel, `clientSeq`, action.
    pending: Vec<(String, i64, Value)>,
    /// Every envelope received, in order.
    envelopes: Vec<ActionEnvelope>,
    /// Every other notification received (`root/...`), in order.
    notifications: Vec<Value>,
    /// Whether its `initialize` says it names sessions `ahp-session:/<id>` (the newest
    /// protocol client's `vscode.ahpSessionUris`; an older build's does not).
    ahp_session_uris: bool,
}

impl VsCode {
    /// Opens the socket as `WebSocketClientTransport.connect()` does (§1): `ws://` in front,
    /// the token as the `tkn` query parameter, no subprotocol, no custom headers; and as the
    /// desktop renderer's browser `WebSocket` sends it, with the Electron page's origin and
    /// user agent (§1, "Upgrade headers").
    async fn connect(
        host: &TestHost,
        token: Option<&str>,
    ) -> Result<VsCode, tokio_tungstenite::tungstenite::Error> {
        let mut url = host.ahp_url();
        if let Some(token) = token {
            url.push_str(&format!("?tkn={}", urlencode(token)));
        }
        let mut request = url.into_client_request()?;
        for (name, value) in VSCODE_UPGRADE_HEADERS {
            request.headers_mut().insert(*name, value.parse().unwrap());
        }
        let (socket, _) = tokio_tungstenite::connect_async(request).await?;
        Ok(VsCode {
            socket,
            client_id: "0b4f8a52-5d1c-4c1e-9d3a-6a1f2b7c9e01".to_owned(),
            next_id: 1,
            next_seq: 1,
            last_seen_server_seq: 0,
            chats: HashMap::new(),
            sessions: Vec::new(),
            pending: Vec::new(),
            envelopes: Vec::new(),
            notifications: Vec::new(),
            ahp_session_uris: true,
        })
    }

    /// `initialize` as VS Code sends it (§2), and its result read as VS Code reads it.
    async fn initialize(&mut self) {
        let mut meta =
            json!({"vscode.telemetryLevel": "off", "vscode.clientConnectionKind": "direct_websocket"});
        if self.ahp_session_uris {
            meta["vscode.ahpSessionUris"] = json!(true);
        }
        let init = self
            .request(
                "initialize",
                json!({
                    "channel": "ahp-root://",
                    "protocolVersions": PROTOCOL_VERSIONS,
                    "clientId": self.client_id,
                    "clientInfo": {"name": "vscode-editor-window", "title": "Visual Studio Code"},
                    "_meta": meta,
                    "initialSubscriptions": ["ahp-root://"],
                }),
            )
            .await
            .unwrap();
        assert_eq!(init["protocolVersion"], "0.9.0", "{init}");
        let root =
            init["snapshots"].as_array().unwrap().iter().find(|s| s["resource"] == "ahp-root://").unwrap();
        assert_eq!(root["state"]["agents"][0]["provider"], "demo");
        self.last_seen_server_seq = init["serverSeq"].as_u64().unwrap();
    }

    /// `createSession` with the provider-scheme URI the editor handler builds, the working
    /// directories, the active client and a progress token (§6); then the session and its
    /// default chat are subscribed. The chat's channel.
    async fn create_session(&mut self, session_uri: &str) -> String {
        self.create_session_with_tools(session_uri, json!([])).await
    }

    /// [`VsCode::create_session`] with VS Code's `tools` in its active client.
    async fn create_session_with_tools(&mut self, session_uri: &str, tools: Value) -> String {
        // The provider is the URI's scheme (§6), or the agent an `ahp-session:` URI leaves unsaid.
        let provider = match session_uri.split_once(":/") {
            Some((scheme, _)) if scheme != "ahp-session" => scheme,
            _ => "demo",
        };
        self.request(
            "createSession",
            json!({
                "channel": session_uri,
                "provider": provider,
                "workingDirectories": ["file:///home/ana/project"],
                "activeClient": {"clientId": self.client_id, "tools": tools, "customizations": []},
                "progressToken": "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9",
            }),
        )
        .await
        .unwrap();
        let session = self.subscribe(session_uri).await;
        let chat = session["snapshot"]["state"]["defaultChat"]
            .as_str()
            .expect("defaultChat, which VS Code needs")
            .to_owned();
        self.subscribe(&chat).await;
        chat
    }

    /// `chat/turnStarted` (§7), read until its echo.
    async fn turn(&mut self, chat: &str, turn_id: &str, text: &str) {
        let seq = self.dispatch(chat, turn_started(turn_id, text)).await;
        let echo = self.echoed("the turn's echo", seq).await;
        assert!(echo.rejection_reason.is_none(), "turn {turn_id} refused: {echo:?}");
    }

    async fn send(&mut self, frame: Value) {
        self.socket.send(Message::text(frame.to_string())).await.unwrap();
    }

    /// Sends a request and reads frames until its response: the result, or the error object.
    async fn request(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        let deadline = Instant::now() + PATIENCE;
        loop {
            let frame = self.next_frame(deadline).await.unwrap_or_else(|| panic!("no answer to {method}"));
            if frame.get("id") == Some(&json!(id)) {
                return match frame.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(frame["result"].clone()),
                };
            }
            self.take(frame);
        }
    }

    async fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params})).await;
    }

    /// `dispatchAction` of `action` on `channel` (§7, §9): the next `clientSeq`, held as pending
    /// when the client subscribes to that channel.
    async fn dispatch(&mut self, channel: &str, action: Value) -> i64 {
        let client_seq = self.next_seq;
        self.next_seq += 1;
        if self.chats.contains_key(channel) || self.sessions.iter().any(|s| s == channel) {
            self.pending.push((channel.to_owned(), client_seq, action.clone()));
        }
        self.notify("dispatchAction", json!({"channel": channel, "clientSeq": client_seq, "action": action}))
            .await;
        client_seq
    }

    /// The next frame before `deadline`, as JSON.
    async fn next_frame(&mut self, deadline: Instant) -> Option<Value> {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.socket.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => Some(serde_json::from_str(&text).unwrap()),
            Ok(Some(Ok(Message::Close(frame)))) => panic!("the host closed the socket: {frame:?}"),
            Ok(Some(Ok(_))) => Some(Value::Null),
            Ok(Some(Err(e))) => panic!("the socket failed: {e}"),
            Ok(None) => panic!("the socket ended"),
            Err(_) => None,
        }
    }

    /// Takes a frame that is not a response: an action envelope goes through the reducer of
    /// its chat (`_isRelevantEnvelope`: the channel as a string equals the subscription's), and
    /// its origin releases the pending action it echoes (§9).
    fn take(&mut self, frame: Value) {
        if frame.get("method") != Some(&json!("action")) {
            if frame.get("method").is_some() {
                self.notifications.push(frame);
            }
            return;
        }
        let envelope: ActionEnvelope = serde_json::from_value(frame["params"].clone()).unwrap();
        self.last_seen_server_seq = self.last_seen_server_seq.max(envelope.server_seq);
        if let Some(origin) = &envelope.origin
            && origin.client_id == self.client_id
        {
            self.pending
                .retain(|(channel, seq, _)| !(*channel == envelope.channel && *seq == origin.client_seq));
        }
        if envelope.rejection_reason.is_none()
            && let Some(chat) = self.chats.get_mut(&envelope.channel)
        {
            let outcome = apply_action_to_chat(chat, &envelope.action);
            assert_eq!(outcome, ReduceOutcome::Applied, "{envelope:?}");
        }
        self.envelopes.push(envelope);
    }

    /// Reads frames until `done` holds for the client (or the patience runs out).
    async fn until(&mut self, what: &str, done: impl Fn(&VsCode) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done(self) {
            match self.next_frame(deadline).await {
                Some(frame) => self.take(frame),
                None => panic!("{what}: not within {PATIENCE:?}; envelopes: {:#?}", self.envelopes),
            }
        }
    }

    /// Reads frames until the echo of this client's action `seq` releases it (§9): the echo.
    async fn echoed(&mut self, what: &str, seq: i64) -> ActionEnvelope {
        self.until(what, |v| !v.pending.iter().any(|(_, s, _)| *s == seq)).await;
        let echo =
            self.envelopes.iter().rev().find(|e| e.origin.as_ref().is_some_and(|o| o.client_seq == seq));
        echo.cloned().unwrap_or_else(|| panic!("{what}: no echo of clientSeq {seq}"))
    }

    /// Reads frames until a tool call of `chat`'s active turn waits for confirmation.
    async fn until_confirmation(&mut self, chat: &str) {
        self.until("a call waiting for confirmation", |v| {
            v.chats[chat].active_turn.as_ref().is_some_and(|t| {
                serde_json::to_string(&t.response_parts).unwrap().contains("pending-confirmation")
            })
        })
        .await;
    }

    /// Closes the socket and waits for the host's close frame: its end of the connection is
    /// done then (it let go of the host before it answered).
    async fn hang_up(&mut self) {
        self.socket.close(None).await.unwrap();
        let deadline = Instant::now() + PATIENCE;
        while let Ok(Some(Ok(frame))) =
            tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), self.socket.next()).await
        {
            if matches!(frame, Message::Close(_)) {
                break;
            }
        }
    }

    /// `subscribe` with only `channel` (§5); a chat's snapshot starts its reduced copy.
    async fn subscribe(&mut self, channel: &str) -> Value {
        let result = self.request("subscribe", json!({"channel": channel})).await.unwrap();
        let snapshot = &result["snapshot"];
        assert_eq!(snapshot["resource"], json!(channel), "the snapshot names the channel as subscribed");
        self.last_seen_server_seq = self.last_seen_server_seq.max(snapshot["fromSeq"].as_u64().unwrap());
        let state: SnapshotState = serde_json::from_value(snapshot["state"].clone()).unwrap();
        match state {
            SnapshotState::Chat(chat) => {
                self.chats.insert(channel.to_owned(), *chat);
            }
            SnapshotState::Session(_) => self.sessions.push(channel.to_owned()),
            _ => {}
        }
        result
    }

    /// Back on a new socket after the old one died (§10): `reconnect` as the client core sends
    /// it, without `channel`, with the highest `serverSeq` seen on any channel and every
    /// subscription (root first); a replay's envelopes go through the reducers, a snapshot
    /// resets its chat; then the actions still pending are sent again with their `clientSeq`.
    async fn reconnect(self, host: &TestHost, token: Option<&str>) -> (VsCode, Value) {
        // The same client (its id, counters, chats and pending actions) on a new socket.
        let fresh = VsCode::connect(host, token).await.unwrap();
        let mut vscode = VsCode { socket: fresh.socket, notifications: Vec::new(), ..self };
        let mut subscriptions = vec!["ahp-root://".to_owned()];
        subscriptions.extend(vscode.sessions.iter().cloned());
        subscriptions.extend(vscode.chats.keys().cloned());
        let result = vscode
            .request(
                "reconnect",
                json!({"clientId": vscode.client_id, "lastSeenServerSeq": vscode.last_seen_server_seq,
                       "subscriptions": subscriptions, "_meta": {"vscode.telemetryLevel": "off"}}),
            )
            .await
            .unwrap();
        match result["type"].as_str() {
            Some("replay") => {
                for envelope in result["actions"].as_array().unwrap() {
                    vscode.take(json!({"method": "action", "params": envelope}));
                }
            }
            Some("snapshot") => {
                for snapshot in result["snapshots"].as_array().unwrap() {
                    let channel = snapshot["resource"].as_str().unwrap().to_owned();
                    let from = snapshot["fromSeq"].as_u64().unwrap();
                    vscode.last_seen_server_seq = vscode.last_seen_server_seq.max(from);
                    if let SnapshotState::Chat(chat) =
                        serde_json::from_value(snapshot["state"].clone()).unwrap()
                    {
                        vscode.pending.retain(|(c, ..)| *c != channel);
                        vscode.chats.insert(channel, *chat);
                    }
                }
            }
            other => panic!("not a reconnect result: {other:?} {result}"),
        }
        for (channel, client_seq, action) in vscode.pending.clone() {
            vscode
                .notify(
                    "dispatchAction",
                    json!({"channel": channel, "clientSeq": client_seq, "action": action}),
                )
                .await;
        }
        (vscode, result)
    }

    /// Reads frames until the reduced `channel` equals what the host serves for `session`.
    async fn settle(&mut self, host: &TestHost, token: Option<&str>, channel: &str, session: &str) {
        let api = api(host, token);
        let deadline = Instant::now() + PATIENCE;
        loop {
            let served: ChatState = api.get_ok(&format!("/v1/sessions/{session}/chat?turns=500")).await;
            if self.chats[channel] == served {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the chat VS Code reduced differs:\n{:#?}\nserved:\n{served:#?}",
                self.chats[channel]
            );
            if let Some(frame) = self.next_frame(Instant::now() + Duration::from_millis(200)).await {
                self.take(frame);
            }
        }
    }
}

/// `chat/turnStarted` of a user's message, as VS Code dispatches it (§7).
fn turn_started(turn_id: &str, text: &str) -> Value {
    json!({"type": "chat/turnStarted", "turnId": turn_id, "startedAt": "2026-12-04T10:00:00.000Z",
           "message": {"text": text, "origin": {"kind": "user"}}})
}

/// The HTTP API as `token`'s caller (none: the open host).
fn api(host: &TestHost, token: Option<&str>) -> ApiClient {
    match token {
        Some(token) => host.with_token(token),
        None => (**host).clone(),
    }
}

/// `encodeURIComponent`, as VS Code escapes the token: all but letters, digits and `-_.!~*'()`.
fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'-'
            | b'_'
            | b'.'
            | b'!'
            | b'~'
            | b'*'
            | b'\''
            | b'('
            | b')' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The steps of a VS Code window, from `initialize` to an approved tool call, as `token`'s
/// caller (none: the open host).
async fn a_window_works(host: &TestHost, token: Option<&str>) {
    let mut vscode = VsCode::connect(host, token).await.unwrap();

    // §2: initialize, always the first request.
    vscode.initialize().await;

    // §4: the root configuration, several actions each with clientSeq 0, and notifications
    // that are no AHP method; none is refused, and the socket stays open.
    for config in [
        json!({"telemetryLevel": "off"}),
        json!({"autoApprovePolicyRestricted": false}),
        json!({"trustedUris": []}),
    ] {
        vscode
            .notify(
                "dispatchAction",
                json!({"channel": "ahp-root://", "clientSeq": 0, "action": {"type": "root/configChanged", "config": config}}),
            )
            .await;
    }
    vscode.notify("setClientManagedSettingsPermissions", json!({"permissions": {}})).await;
    // §1: the liveness watchdog's ping.
    vscode.request("ping", json!({"channel": "ahp-root://"})).await.unwrap();

    // §5: the session list comes from listSessions.
    let listed = vscode.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    assert!(listed["items"].is_array(), "{listed}");

    // §6, §7: a session as the editor handler creates it, and a turn echoed with its origin.
    let session_id = "7d1e2f3a-4b5c-4d6e-8f90-a1b2c3d4e5f6";
    let chat = vscode.create_session(&format!("demo:/{session_id}")).await;
    vscode.turn(&chat, "request_1", "Hello there").await;
    completed_as(host, token, session_id, "request_1").await;
    vscode.settle(host, token, &chat, session_id).await;

    // §5, §11: the session list shows the session under VS Code's URI, titled after its first
    // message, and root notifications keep it current (status, title, modifiedAt).
    let session_uri = format!("demo:/{session_id}");
    let listed = vscode.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    let item =
        listed["items"].as_array().unwrap().iter().find(|i| i["resource"] == json!(session_uri)).cloned();
    let item = item.unwrap_or_else(|| panic!("{session_uri} listed: {listed}"));
    assert_eq!(
        (item["provider"].as_str(), item["title"].as_str()),
        (Some("demo"), Some("Hello there")),
        "{item}"
    );
    let changed = |v: &VsCode, field: &str, value: Value| {
        v.notifications.iter().any(|n| {
            n["method"] == "root/sessionSummaryChanged"
                && n["params"]["session"] == json!(session_uri)
                && n["params"]["changes"][field] == value
        })
    };
    vscode
        .until("the summary's title and status", |v| {
            changed(v, "title", json!("Hello there")) && changed(v, "status", json!(1))
        })
        .await;

    // A rename from VS Code's list (§7): echoed with its origin, kept, and told to the list.
    let seq = vscode
        .dispatch(&session_uri, json!({"type": "session/titleChanged", "title": "Deploy review"}))
        .await;
    let echo = vscode.echoed("the rename's echo", seq).await;
    assert!(echo.channel == session_uri && echo.rejection_reason.is_none(), "{echo:?}");
    vscode.until("the renamed summary", |v| changed(v, "title", json!("Deploy review"))).await;
    let session = vscode.request("subscribe", json!({"channel": session_uri})).await.unwrap();
    assert_eq!(session["snapshot"]["state"]["title"], "Deploy review");
    assert!(vscode.chats[&chat].turns.iter().any(|t| t.id == "request_1"), "{:#?}", vscode.chats[&chat]);

    // §8: the demo's `confirm`, a client tool no window offers: VS Code's person is asked (an
    // input request named by the call, with the call's arguments) and the answer is its result.
    vscode.dispatch(&chat, turn_started("request_c", "/tool confirm {\"question\":\"Ship it?\"}")).await;
    let asked = |v: &VsCode| {
        v.chats[&chat].active_turn.as_ref().and_then(|t| {
            t.response_parts.iter().find_map(|p| match p {
                ahp_types::state::ResponsePart::InputRequest(i) if i.response.is_none() => {
                    Some(i.request.clone())
                }
                _ => None,
            })
        })
    };
    vscode.until("confirm's question", |v| asked(v).is_some()).await;
    let request = asked(&vscode).unwrap();
    let question = serde_json::to_value(&request.questions).unwrap();
    assert!(question[0]["message"].as_str().unwrap().contains("Ship it?"), "{question}");
    let seq = vscode
        .dispatch(
            &chat,
            json!({"type": "chat/inputCompleted", "requestId": request.id, "response": "accept",
                   "answers": {"result": {"state": "submitted", "value": {"kind": "text", "value": "yes"}}}}),
        )
        .await;
    assert!(vscode.echoed("the answer's echo", seq).await.rejection_reason.is_none());
    completed_as(host, token, session_id, "request_c").await;
    vscode.settle(host, token, &chat, session_id).await;

    // §8: a tool call that needs approval, confirmed as VS Code does; the confirmation's echo
    // carries its origin (VS Code would re-send it after every reconnect otherwise).
    vscode.dispatch(&chat, turn_started("request_2", "/tool deploy {\"target\":\"prod\"}")).await;
    vscode.until_confirmation(&chat).await;
    // §11: what the chat waits for is the session's too.
    vscode
        .until("the confirmation in the session's inputNeeded", |v| {
            v.envelopes.iter().any(|e| {
                e.channel == session_uri
                    && matches!(&e.action, StateAction::SessionInputNeededSet(set)
                        if matches!(set.request, SessionInputRequest::ToolConfirmation(_)))
            })
        })
        .await;
    let call_id = {
        let parts =
            serde_json::to_value(&vscode.chats[&chat].active_turn.as_ref().unwrap().response_parts).unwrap();
        parts
            .as_array()
            .unwrap()
            .iter()
            .find_map(|p| p["toolCall"]["toolCallId"].as_str().map(str::to_owned))
            .unwrap()
    };
    let seq = vscode
        .dispatch(
            &chat,
            json!({"type": "chat/toolCallConfirmed", "turnId": "request_2", "toolCallId": call_id,
                   "approved": true, "confirmed": "user-action"}),
        )
        .await;
    let echo = vscode.echoed("the confirmation's echo", seq).await;
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
    // §8: `deploy` runs on a client, and this window does not offer it (no client does):
    // VS Code's person is asked for its result, an input request named by the call, in the
    // chat and in the session's inputNeeded; the answer is the call's result.
    vscode
        .until("the input request for deploy's result", |v| {
            v.chats[&chat].active_turn.as_ref().is_some_and(|t| {
                t.response_parts.iter().any(
                    |p| matches!(p, ahp_types::state::ResponsePart::InputRequest(i) if i.request.id == call_id),
                )
            })
        })
        .await;
    vscode
        .until("the request in the session's inputNeeded", |v| {
            v.envelopes.iter().any(|e| {
                matches!(&e.action, StateAction::SessionInputNeededSet(set)
                    if matches!(&set.request, SessionInputRequest::ChatInput(c) if c.request.id == call_id))
            })
        })
        .await;
    let seq = vscode
        .dispatch(
            &chat,
            json!({"type": "chat/inputCompleted", "requestId": call_id, "response": "accept",
                   "answers": {"result": {"state": "submitted", "value": {"kind": "text", "value": "Deployed to prod"}}}}),
        )
        .await;
    let echo = vscode.echoed("the answer's echo", seq).await;
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
    completed_as(host, token, session_id, "request_2").await;
    vscode.settle(host, token, &chat, session_id).await;
    let messages: Value = api(host, token).get_ok(&format!("/v1/sessions/{session_id}/messages")).await;
    let result = messages["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["content"], "Deployed to prod", "{result}");
    // Nothing VS Code sent was refused: the root configuration included.
    let refused: Vec<_> = vscode.envelopes.iter().filter(|e| e.rejection_reason.is_some()).collect();
    assert!(refused.is_empty(), "{refused:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn vs_code_drives_the_open_host() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    a_window_works(&host, None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn vs_code_drives_a_host_with_auth_by_its_tkn_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{CONFIG}\n[auth]\napi_keys_env = \"KEYS\"\n");
    let host = TestHost::start_with_env(&config, dir.path(), |name| {
        (name == "KEYS").then(|| "ana:key/ana+1".to_owned())
    })
    .await;
    // Without the token, or with a wrong one, the upgrade is refused.
    for token in [None, Some("key-nobody")] {
        let error = VsCode::connect(&host, token).await.map(|_| ()).unwrap_err();
        let tokio_tungstenite::tungstenite::Error::Http(response) = &error else { panic!("{error:?}") };
        assert_eq!(response.status(), 401, "{token:?}");
    }
    // A key with characters a URL escapes arrives whole.
    a_window_works(&host, Some("key/ana+1")).await;
}

/// A browser that keeps its token out of the URL offers it as a subprotocol beside `ahp`, and
/// the host selects `ahp` (a browser fails a handshake that selects none of its offers).
#[tokio::test(flavor = "multi_thread")]
async fn the_token_may_be_offered_as_a_subprotocol() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{CONFIG}\n[auth]\napi_keys_env = \"KEYS\"\n");
    let host = TestHost::start_with_env(&config, dir.path(), |name| {
        (name == "KEYS").then(|| "ana:key-ana".to_owned())
    })
    .await;
    let url = host.ahp_url();
    let offer = |protocols: &str| {
        let mut request = url.clone().into_client_request().unwrap();
        request.headers_mut().insert("sec-websocket-protocol", protocols.parse().unwrap());
        request
    };
    let (_, response) = tokio_tungstenite::connect_async(offer("ahp, tkn.key-ana")).await.unwrap();
    assert_eq!(response.headers()["sec-websocket-protocol"], "ahp");
    let error = tokio_tungstenite::connect_async(offer("ahp, tkn.key-bob")).await.map(|_| ()).unwrap_err();
    let tokio_tungstenite::tungstenite::Error::Http(response) = &error else { panic!("{error:?}") };
    assert_eq!(response.status(), 401);
}

/// Turn `turn_id` of session `session` (driven over HTTP, as another window would), until it
/// completed.
async fn turn_over_http(host: &TestHost, session: &str, turn_id: &str, text: &str) {
    let input = json!({"type": "client.message", "agent_id": "demo", "turn_id": turn_id,
                       "message": {"role": "user", "content": text}});
    host.submit_ok(session, &input).await;
    completed_as(host, None, session, turn_id).await;
}

/// Waits until turn `turn_id` of `session` completed (asked as `token`'s caller).
async fn completed_as(host: &TestHost, token: Option<&str>, session: &str, turn_id: &str) {
    let api = api(host, token);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (code, body) = api.get(&format!("/v1/sessions/{session}/turns/{turn_id}")).await;
        if code == 200 && body["status"] == "completed" {
            return;
        }
        assert!(Instant::now() < deadline, "turn {turn_id} never completed: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// §5, §6: each window is told of a session as it named it, since VS Code matches sessions by
/// URI. The newest client names a new session `ahp-session:/<uuid>` (its protocol client's
/// `newAgentHostSessionUri`, for a host that is not VS Code's own) and says so in `initialize`;
/// its editor handler names one `demo:/<uuid>`; an older build (no `vscode.ahpSessionUris`)
/// keys sessions by their scheme. Every listing and root notification spells each so, for
/// each window; a session neither named (driven over HTTP) in each window's own style.
#[tokio::test(flavor = "multi_thread")]
async fn each_window_is_told_of_a_session_as_it_named_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    windows_are_told_as_they_named(&host, None).await;
}

/// The same with a token (the sessions are the token's caller's).
#[tokio::test(flavor = "multi_thread")]
async fn each_window_is_told_of_a_session_as_it_named_it_with_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{CONFIG}\n[auth]\napi_keys_env = \"KEYS\"\n");
    let host = TestHost::start_with_env(&config, dir.path(), |name| {
        (name == "KEYS").then(|| "ana:key-ana".to_owned())
    })
    .await;
    windows_are_told_as_they_named(&host, Some("key-ana")).await;
}

async fn windows_are_told_as_they_named(host: &TestHost, token: Option<&str>) {
    let mut newer = VsCode::connect(host, token).await.unwrap();
    newer.initialize().await;
    let mut older = VsCode::connect(host, token).await.unwrap();
    older.client_id = "5a0c7e13-2b8d-4f61-9e4a-c3d2b1a09f87".to_owned();
    older.ahp_session_uris = false;
    older.initialize().await;
    let (a, b, c) = (
        "3f2a9b1c-0d4e-4f5a-8b6c-7d8e9f0a1b2c",
        "6e5d4c3b-2a19-4807-b6f5-e4d3c2b1a098",
        "c0ffee00-1111-4222-8333-944455566677",
    );
    let chat_a = newer.create_session(&format!("ahp-session:/{a}")).await;
    newer.create_session(&format!("demo:/{b}")).await;
    let input = json!({"type": "client.message", "agent_id": "demo", "turn_id": "c-1",
                       "message": {"role": "user", "content": "Driven elsewhere"}});
    let (code, body) =
        api(host, token).post_raw(&format!("/v1/sessions/{c}/inputs"), input.to_string()).await;
    assert_eq!(code, 202, "{body}");
    completed_as(host, token, c, "c-1").await;
    newer.turn(&chat_a, "request_1", "Named the new way").await;
    completed_as(host, token, a, "request_1").await;

    let told = |v: &VsCode, method: &str, session: &str| {
        v.notifications.iter().any(|n| {
            n["method"] == method
                && (n["params"]["session"] == json!(session)
                    || n["params"]["summary"]["resource"] == json!(session))
        })
    };
    for (window, uris) in [
        (&mut newer, [format!("ahp-session:/{a}"), format!("demo:/{b}"), format!("ahp-session:/{c}")]),
        (&mut older, [format!("demo:/{a}"), format!("demo:/{b}"), format!("demo:/{c}")]),
    ] {
        let [uri_a, uri_b, uri_c] = &uris;
        window
            .until("each session added as the window names it", |v| {
                uris.iter().all(|uri| told(v, "root/sessionAdded", uri))
            })
            .await;
        window.until("a's title changed", |v| told(v, "root/sessionSummaryChanged", uri_a)).await;
        window.until("c's title changed", |v| told(v, "root/sessionSummaryChanged", uri_c)).await;
        // No notification names a session otherwise.
        let named: Vec<&Value> = window
            .notifications
            .iter()
            .filter_map(|n| n["params"].get("session").or_else(|| n["params"]["summary"].get("resource")))
            .filter(|uri| [a, b, c].iter().any(|id| uri.as_str().unwrap().ends_with(id)))
            .collect();
        assert!(named.iter().all(|uri| uris.iter().any(|u| *uri == u)), "{uris:?}: {named:?}");
        let listed = window.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
        let resources: Vec<&str> =
            listed["items"].as_array().unwrap().iter().map(|i| i["resource"].as_str().unwrap()).collect();
        for uri in [uri_a, uri_b, uri_c] {
            assert!(resources.contains(&uri.as_str()), "{uri} listed: {listed}");
        }
        assert!(listed["items"].as_array().unwrap().iter().all(|i| i["provider"] == "demo"), "{listed}");
    }
}

/// §10: a window that was away while turns ran in both of its chats comes back with the
/// highest `serverSeq` it saw on any channel, without `channel` (the client core's params),
/// and gets every action it missed in each chat, each from where that chat stood; then it
/// goes on live. Numbered per chat, the one number read as a position in each chat's log
/// would start a replay in the middle of a turn.
#[tokio::test(flavor = "multi_thread")]
async fn vs_code_reconnects_with_the_highest_server_seq_it_saw() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let mut vscode = VsCode::connect(&host, None).await.unwrap();
    vscode.initialize().await;
    let (a, b) = ("a-5d9e", "b-71c2");
    let chat_a = vscode.create_session(&format!("demo:/{a}")).await;
    let chat_b = vscode.create_session(&format!("demo:/{b}")).await;
    vscode.turn(&chat_a, "a1", "First in A").await;
    completed_as(&host, None, a, "a1").await;
    vscode.settle(&host, None, &chat_a, a).await;
    // B runs longer, so its own numbers would run ahead of A's.
    for turn in ["b1", "b2", "b3"] {
        vscode.turn(&chat_b, turn, "In B").await;
        completed_as(&host, None, b, turn).await;
        vscode.settle(&host, None, &chat_b, b).await;
    }

    vscode.hang_up().await;
    turn_over_http(&host, a, "a2", "While away, in A").await;
    turn_over_http(&host, b, "b4", "While away, in B").await;
    // Meanwhile A gets a sub-agent's chat, and another window renames it.
    turn_over_http(&host, a, "a-sub", "/agent helper Say hi").await;
    let mut other = VsCode::connect(&host, None).await.unwrap();
    other.client_id = "3c9b7e10-2f4d-4a8e-9b61-5d0e7f2a4c88".to_owned();
    other.initialize().await;
    let session_a = format!("demo:/{a}");
    other.subscribe(&session_a).await;
    let seq = other
        .dispatch(&session_a, json!({"type": "session/titleChanged", "title": "Renamed while away"}))
        .await;
    assert!(other.echoed("the rename", seq).await.rejection_reason.is_none());
    other.hang_up().await;

    let (mut vscode, result) = vscode.reconnect(&host, None).await;
    assert_eq!(result["type"], "replay", "{result}");
    assert_eq!(result["missing"], json!([]));
    // The session channel's news it missed comes with the replay (no log holds it).
    let on_a: Vec<&Value> =
        result["actions"].as_array().unwrap().iter().filter(|e| e["channel"] == json!(session_a)).collect();
    let kinds: Vec<&str> = on_a.iter().map(|e| e["action"]["type"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"session/chatAdded"), "{kinds:?}");
    let title = on_a.iter().find(|e| e["action"]["type"] == "session/titleChanged").expect("the title");
    assert_eq!(title["action"]["title"], "Renamed while away");
    for (chat, session, turn) in [(&chat_a, a, "a2"), (&chat_b, b, "b4")] {
        vscode.settle(&host, None, chat, session).await;
        let turns = &vscode.chats[chat.as_str()].turns;
        assert!(turns.iter().any(|t| t.id == turn), "{turn} replayed whole: {turns:#?}");
    }
    let replayed: Vec<u64> =
        result["actions"].as_array().unwrap().iter().map(|e| e["serverSeq"].as_u64().unwrap()).collect();
    assert!(replayed.windows(2).all(|w| w[0] < w[1]), "one growing number: {replayed:?}");

    // Live again, its session list told in its own spelling (a `reconnect` does not say it).
    vscode.turn(&chat_a, "a3", "Back in A").await;
    completed_as(&host, None, a, "a3").await;
    vscode.settle(&host, None, &chat_a, a).await;
    vscode
        .until("the list's news of A", |v| {
            v.notifications.iter().any(|n| {
                n["method"] == "root/sessionSummaryChanged"
                    && n["params"]["session"] == json!(format!("demo:/{a}"))
            })
        })
        .await;

    // An action still pending when the socket drops (§9): echoed in the replay, or sent again
    // with its clientSeq after it; either way the turn runs once and nothing stays pending.
    vscode.dispatch(&chat_a, turn_started("a4", "Sent as the line dropped")).await;
    vscode.hang_up().await;
    let (mut vscode, _) = vscode.reconnect(&host, None).await;
    completed_as(&host, None, a, "a4").await;
    vscode.settle(&host, None, &chat_a, a).await;
    vscode.until("the pending turn's echo", |v| v.pending.is_empty()).await;
    assert_eq!(vscode.chats[&chat_a].turns.iter().filter(|t| t.id == "a4").count(), 1);

    // A restarted host does not know what the window saw: snapshots, and numbers that go on
    // past every one it saw before. (Behind API Gateway no process keeps it: it is in the
    // table, and the harness's restart is a new stack with a new table.)
    if host.is_deployed() {
        return;
    }
    let before = vscode.last_seen_server_seq;
    vscode.hang_up().await;
    host.stop().await;
    let host = TestHost::start(CONFIG, dir.path()).await;
    let (mut vscode, result) = vscode.reconnect(&host, None).await;
    assert_eq!(result["type"], "snapshot", "{result}");
    vscode.settle(&host, None, &chat_b, b).await;
    vscode.turn(&chat_b, "b5", "After the restart").await;
    let echo = vscode.envelopes.last().unwrap();
    assert!(echo.server_seq > before, "{} after {before}", echo.server_seq);
    vscode.settle(&host, None, &chat_b, b).await;
}

/// A tool of VS Code's (§8): offered with its active client (§6, §7), its call contributed by
/// VS Code's client id so VS Code runs it, and answered with `chat/toolCallComplete`. A
/// changed tool list is dispatched as `session/activeClientSet` and echoed with its origin.
#[tokio::test(flavor = "multi_thread")]
async fn vs_code_runs_its_own_tools() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let mut vscode = VsCode::connect(&host, None).await.unwrap();
    vscode.initialize().await;
    let session_id = "c-91aa";
    let session_uri = format!("demo:/{session_id}");
    let read_file = json!({"name": "readFile", "description": "Reads a file of the workspace.",
                           "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}});
    let chat = vscode.create_session_with_tools(&session_uri, json!([read_file])).await;
    let snapshot = vscode.request("subscribe", json!({"channel": session_uri})).await.unwrap();
    let active = &snapshot["snapshot"]["state"]["activeClients"];
    assert_eq!(active[0]["clientId"], json!(vscode.client_id), "{active}");
    assert_eq!(active[0]["tools"][0]["name"], "readFile");

    // VS Code's tools changed: it dispatches its entry again, before the turn (§7).
    let run_tests =
        json!({"name": "runTests", "description": "Runs the tests.", "inputSchema": {"type": "object"}});
    let entry = json!({"clientId": vscode.client_id, "tools": [read_file, run_tests], "customizations": []});
    let seq = vscode
        .dispatch(&session_uri, json!({"type": "session/activeClientSet", "activeClient": entry}))
        .await;
    let echo = vscode.echoed("the active client's echo", seq).await;
    assert!(echo.channel == session_uri && echo.rejection_reason.is_none(), "{echo:?}");
    let snapshot = vscode.request("subscribe", json!({"channel": session_uri})).await.unwrap();
    assert_eq!(snapshot["snapshot"]["state"]["activeClients"][0]["tools"][1]["name"], "runTests");

    vscode.turn(&chat, "request_1", "/tool readFile {\"path\":\"README.md\"}").await;
    vscode
        .until("VS Code's tool call, past streaming", |v| {
            let parts =
                serde_json::to_value(v.chats[&chat].active_turn.as_ref().map(|t| &t.response_parts)).unwrap();
            parts.as_array().is_some_and(|parts| {
                parts.iter().any(|p| {
                    p["toolCall"]["toolName"] == "readFile" && p["toolCall"]["status"] != "streaming"
                })
            })
        })
        .await;
    let parts =
        serde_json::to_value(&vscode.chats[&chat].active_turn.as_ref().unwrap().response_parts).unwrap();
    let call = parts.as_array().unwrap().iter().find(|p| p["toolCall"]["toolName"] == "readFile").unwrap()["toolCall"].clone();
    // HND `_setupToolCallPart`: VS Code runs a call only if it is the contributor.
    assert_eq!(call["contributor"], json!({"kind": "client", "clientId": vscode.client_id}), "{call}");
    let call_id = call["toolCallId"].as_str().unwrap().to_owned();
    // §11: the session mirrors the call as input it waits for, for VS Code's client to run.
    let waiting = |v: &VsCode| {
        v.envelopes.iter().find_map(|e| match &e.action {
            StateAction::SessionInputNeededSet(set) if e.channel == session_uri => match &set.request {
                SessionInputRequest::ToolClientExecution(run) => {
                    Some((run.id.clone(), run.client_id.clone(), run.tool_call.tool_call_id.clone()))
                }
                _ => None,
            },
            _ => None,
        })
    };
    vscode.until("the call in the session's inputNeeded", |v| waiting(v).is_some()).await;
    let (entry, client, waited) = waiting(&vscode).unwrap();
    assert_eq!((client.as_str(), waited.as_str()), (vscode.client_id.as_str(), call_id.as_str()));
    let snapshot = vscode.request("subscribe", json!({"channel": session_uri})).await.unwrap();
    assert_eq!(snapshot["snapshot"]["state"]["inputNeeded"][0]["id"], json!(entry), "{snapshot}");
    let seq = vscode
        .dispatch(
            &chat,
            json!({"type": "chat/toolCallComplete", "turnId": "request_1", "toolCallId": call_id,
                   "result": {"success": true, "pastTenseMessage": "Read README.md",
                              "content": [{"type": "text", "text": "# Turnstone"}]}}),
        )
        .await;
    let echo = vscode.echoed("the result's echo", seq).await;
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (_, turn) = host.get(&format!("/v1/sessions/{session_id}/turns/request_1")).await;
        if turn["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "the turn never completed: {turn}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    vscode.settle(&host, None, &chat, session_id).await;
    vscode
        .until("the entry resolved", |v| {
            v.envelopes
                .iter()
                .any(|e| matches!(&e.action, StateAction::SessionInputNeededRemoved(r) if r.id == entry))
        })
        .await;
    let last = vscode.chats[&chat].turns.last().unwrap();
    assert!(
        serde_json::to_string(&last.response_parts).unwrap().contains("readFile returned: # Turnstone"),
        "{last:#?}"
    );
}

/// A window that offers a tool the agent declares as a client tool (`deploy`, here VS Code's
/// own implementation) runs the agent's calls of it: the call is contributed by that window,
/// so VS Code runs it once approved, and no person is asked for a result.
#[tokio::test(flavor = "multi_thread")]
async fn a_window_offering_an_agents_client_tool_runs_its_calls() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let mut vscode = VsCode::connect(&host, None).await.unwrap();
    vscode.initialize().await;
    let session_id = "d-40c2";
    let deploy = json!({"name": "deploy", "description": "Deploys from this workspace.",
                        "inputSchema": {"type": "object", "properties": {"target": {"type": "string"}}}});
    let chat = vscode.create_session_with_tools(&format!("demo:/{session_id}"), json!([deploy])).await;
    vscode.dispatch(&chat, turn_started("request_1", "/tool deploy {\"target\":\"prod\"}")).await;
    vscode.until_confirmation(&chat).await;
    let call = |v: &VsCode| {
        let parts =
            serde_json::to_value(&v.chats[&chat].active_turn.as_ref().unwrap().response_parts).unwrap();
        parts.as_array().unwrap().iter().find(|p| p["toolCall"]["toolName"] == "deploy").unwrap()["toolCall"]
            .clone()
    };
    let call_id = call(&vscode)["toolCallId"].as_str().unwrap().to_owned();
    vscode
        .dispatch(
            &chat,
            json!({"type": "chat/toolCallConfirmed", "turnId": "request_1", "toolCallId": call_id,
                   "approved": true, "confirmed": "user-action"}),
        )
        .await;
    vscode.until("the call running", |v| call(v)["status"] == "running").await;
    // HND `_setupToolCallPart`: VS Code runs a call only if it is the contributor.
    assert_eq!(call(&vscode)["contributor"], json!({"kind": "client", "clientId": vscode.client_id}));
    let seq = vscode
        .dispatch(
            &chat,
            json!({"type": "chat/toolCallComplete", "turnId": "request_1", "toolCallId": call_id,
                   "result": {"success": true, "pastTenseMessage": "Deployed",
                              "content": [{"type": "text", "text": "deployed build 412"}]}}),
        )
        .await;
    let echo = vscode.echoed("the result's echo", seq).await;
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
    completed_as(&host, None, session_id, "request_1").await;
    vscode.settle(&host, None, &chat, session_id).await;
    let last = vscode.chats[&chat].turns.last().unwrap();
    let parts = serde_json::to_string(&last.response_parts).unwrap();
    assert!(parts.contains("deployed build 412"), "{last:#?}");
    assert!(!parts.contains("inputRequest"), "nobody is asked: {last:#?}");
}

/// §13: what VS Code's newest client may ask of a remote host besides the session flow gets
/// an answer it goes on with: an empty session configuration and no completions for an agent
/// of the host (an unknown provider is -32002), and for what the host does not have (files,
/// terminals, chats apart from their sessions) the protocol's error, saying what is missing.
#[tokio::test(flavor = "multi_thread")]
async fn vs_code_is_answered_what_the_host_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let mut vscode = VsCode::connect(&host, None).await.unwrap();
    vscode.initialize().await;
    let session_uri = "demo:/u-7a10";
    let chat = vscode.create_session(session_uri).await;

    // PICK / CFGSUB: the config chips of a new chat.
    let config = vscode
        .request(
            "resolveSessionConfig",
            json!({"channel": "ahp-root://", "provider": "demo", "workingDirectory": "file:///home/ana/project"}),
        )
        .await
        .unwrap();
    assert_eq!(config, json!({"schema": {"type": "object", "properties": {}}, "values": {}}));
    let unknown = vscode
        .request("resolveSessionConfig", json!({"channel": "ahp-root://", "provider": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(unknown["code"], -32002, "{unknown}");
    let items = vscode
        .request(
            "sessionConfigCompletions",
            json!({"channel": "ahp-root://", "provider": "demo", "property": "model", "query": "g"}),
        )
        .await
        .unwrap();
    assert_eq!(items, json!({"items": []}));
    // HND `provideChatInputCompletions`.
    let completions = vscode
        .request(
            "completions",
            json!({"channel": session_uri, "kind": "userMessage", "text": "/to", "offset": 3}),
        )
        .await
        .unwrap();
    assert_eq!(completions, json!({"items": []}));

    // The `vscode-agent-host` file system: no files here.
    let listed = vscode
        .request("resourceList", json!({"channel": "ahp-root://", "uri": "file:///home/ana/project"}))
        .await
        .unwrap_err();
    assert_eq!(listed["code"], -32008, "{listed}");
    assert!(listed["message"].as_str().unwrap().contains("file:///home/ana/project"), "{listed}");
    let written = vscode
        .request(
            "resourceWrite",
            json!({"channel": "ahp-root://", "uri": "file:///home/ana/project/a.txt", "data": "aGk="}),
        )
        .await
        .unwrap_err();
    assert_eq!(written["code"], -32009, "{written}");
    let terminal = vscode
        .request("createTerminal", json!({"channel": "ahp-root://", "terminal": "ahp-terminal:/t1"}))
        .await
        .unwrap_err();
    assert_eq!(terminal["code"], -32601, "{terminal}");
    assert!(terminal["message"].as_str().unwrap().contains("terminals"), "{terminal}");
    let disposed = vscode.request("disposeChat", json!({"channel": chat})).await.unwrap_err();
    assert_eq!(disposed["code"], -32601, "{disposed}");
    // A method AHP does not define is just unknown.
    let unknown = vscode.request("frobnicate", json!({"channel": "ahp-root://"})).await.unwrap_err();
    assert_eq!(
        (unknown["code"].as_i64(), unknown["message"].as_str()),
        (Some(-32601), Some("unknown method \"frobnicate\""))
    );
    // The connection goes on: the session still runs a turn.
    vscode.turn(&chat, "request_1", "Still here").await;
    completed_as(&host, None, "u-7a10", "request_1").await;
}

/// Older VS Code builds (the editor handler at 00738c8d9c54646044b1f7d4debeb14163086cdb, §7)
/// start a turn without `startedAt` and cancel it without `duration`; both are understood.
#[tokio::test(flavor = "multi_thread")]
async fn an_older_vs_code_builds_turn_actions_are_understood() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let mut vscode = VsCode::connect(&host, None).await.unwrap();
    vscode.initialize().await;
    let chat = vscode.create_session("demo:/old-1").await;
    let seq = vscode
        .dispatch(
            &chat,
            json!({"type": "chat/turnStarted", "turnId": "request_1", "message": {"text": "Hello", "origin": {"kind": "user"}}}),
        )
        .await;
    let echo = vscode.echoed("the turn's echo", seq).await;
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
    completed_as(&host, None, "old-1", "request_1").await;
    vscode.settle(&host, None, &chat, "old-1").await;
    // A turn waiting for a person, cancelled the old way.
    vscode
        .dispatch(
            &chat,
            json!({"type": "chat/turnStarted", "turnId": "request_2",
                   "message": {"text": "/tool deploy {}", "origin": {"kind": "user"}}}),
        )
        .await;
    vscode.until_confirmation(&chat).await;
    let seq = vscode.dispatch(&chat, json!({"type": "chat/turnCancelled", "turnId": "request_2"})).await;
    let echo = vscode.echoed("the cancel's echo", seq).await;
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
    vscode.settle(&host, None, &chat, "old-1").await;
    let refused: Vec<_> = vscode.envelopes.iter().filter(|e| e.rejection_reason.is_some()).collect();
    assert!(refused.is_empty(), "{refused:#?}");
}

/// §7.2: VS Code edits a request by truncating the chat to the turn before it (or to none),
/// then starting the edited turn. The truncation is echoed with its origin, the conversation
/// the agent goes on from is the truncated one, and a truncation the host cannot make is
/// refused with its reason.
#[tokio::test(flavor = "multi_thread")]
async fn vs_code_edits_a_request_by_truncating_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let mut vscode = VsCode::connect(&host, None).await.unwrap();
    vscode.initialize().await;
    let session = "e-40b1";
    let chat = vscode.create_session(&format!("demo:/{session}")).await;
    for (turn, text) in [("e1", "First question"), ("e2", "Second question")] {
        vscode.turn(&chat, turn, text).await;
        completed_as(&host, None, session, turn).await;
        vscode.settle(&host, None, &chat, session).await;
    }
    let user_texts = |messages: Vec<Value>| -> Vec<String> {
        messages
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    };

    // Editing the second request: keep e1, then the edited turn.
    let seq = vscode.dispatch(&chat, json!({"type": "chat/truncated", "turnId": "e1"})).await;
    let echo = vscode.echoed("the truncation's echo", seq).await;
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
    assert_eq!(
        echo.action,
        serde_json::from_value(json!({"type": "chat/truncated", "turnId": "e1"})).unwrap()
    );
    let turns: Vec<&str> = vscode.chats[&chat].turns.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(turns, ["e1"]);
    vscode.settle(&host, None, &chat, session).await;
    vscode.turn(&chat, "e3", "Second question, edited").await;
    completed_as(&host, None, session, "e3").await;
    vscode.settle(&host, None, &chat, session).await;
    let turns: Vec<&str> = vscode.chats[&chat].turns.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(turns, ["e1", "e3"]);
    assert_eq!(
        user_texts(host.messages(session).await),
        ["First question", "Second question, edited"],
        "the agent goes on from the truncated conversation"
    );

    // A turn that is not in the chat any more cannot be kept.
    let seq = vscode.dispatch(&chat, json!({"type": "chat/truncated", "turnId": "e2"})).await;
    let refused = vscode.echoed("the refusal", seq).await;
    let reason = refused.rejection_reason.unwrap_or_default();
    assert!(reason.contains("turn e2 is not a completed turn of this chat"), "{reason}");

    // Editing the first request: nothing is kept.
    let seq = vscode.dispatch(&chat, json!({"type": "chat/truncated"})).await;
    assert!(vscode.echoed("the truncation's echo", seq).await.rejection_reason.is_none());
    assert!(vscode.chats[&chat].turns.is_empty());
    vscode.turn(&chat, "e4", "A fresh start").await;
    completed_as(&host, None, session, "e4").await;
    vscode.settle(&host, None, &chat, session).await;
    assert_eq!(user_texts(host.messages(session).await), ["A fresh start"]);
}

/// A sub-agent's chat is a chat of its parent's session (§11): added to the session's catalog
/// as it is spawned (`session/chatAdded`, spawned by the tool call, read-only), its status
/// kept there (`session/chatUpdated`), never a session of the root's list, and a person's
/// message to it refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_sub_agents_chat_is_a_read_only_chat_of_its_parents_session() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let mut vscode = VsCode::connect(&host, None).await.unwrap();
    vscode.initialize().await;
    let session = "d-77c0";
    let session_uri = format!("demo:/{session}");
    let chat = vscode.create_session(&session_uri).await;
    vscode.turn(&chat, "d1", "/agent helper Say hi").await;
    completed_as(&host, None, session, "d1").await;
    vscode.settle(&host, None, &chat, session).await;

    let added = |v: &VsCode| {
        v.envelopes.iter().find_map(|e| match &e.action {
            StateAction::SessionChatAdded(a) if e.channel == session_uri => Some(a.summary.clone()),
            _ => None,
        })
    };
    vscode.until("the sub-agent's chat in the catalog", |v| added(v).is_some()).await;
    let child = added(&vscode).unwrap();
    let child_id = child.resource.strip_prefix("ahp-chat:/").unwrap().to_owned();
    assert_eq!(child.interactivity, Some(ChatInteractivity::ReadOnly), "{child:?}");
    let spawned_by = serde_json::to_value(&child.origin).unwrap();
    assert_eq!(
        (spawned_by["kind"].as_str(), spawned_by["chat"].as_str()),
        (Some("tool"), Some(chat.as_str()))
    );
    let updated = |v: &VsCode, chat: &str| {
        v.envelopes.iter().any(|e| {
            matches!(&e.action, StateAction::SessionChatUpdated(a) if a.chat == chat && e.channel == session_uri)
        })
    };
    vscode.until("the parent chat's status in the catalog", |v| updated(v, &chat)).await;
    vscode.until("the sub-agent chat's status in the catalog", |v| updated(v, &child.resource)).await;

    // The session's snapshot lists it; the root's list does not.
    let snapshot = vscode.request("subscribe", json!({"channel": session_uri})).await.unwrap();
    let chats: Vec<&str> = snapshot["snapshot"]["state"]["chats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["resource"].as_str().unwrap())
        .collect();
    assert_eq!(chats, [chat.as_str(), child.resource.as_str()]);
    let listed = vscode.request("listSessions", json!({"channel": "ahp-root://"})).await.unwrap();
    let listed: Vec<&str> =
        listed["items"].as_array().unwrap().iter().map(|s| s["resource"].as_str().unwrap()).collect();
    assert_eq!(listed, [session_uri.as_str()], "the sub-agent {child_id} is not a session of the list");

    // Watched, not written to.
    vscode.subscribe(&child.resource).await;
    let seq = vscode.dispatch(&child.resource, turn_started("x1", "Hi helper")).await;
    let refused = vscode.echoed("the refusal", seq).await;
    let reason = refused.rejection_reason.unwrap_or_default();
    assert!(reason.contains("is a sub-agent's chat, read-only"), "{reason}");
    vscode.settle(&host, None, &child.resource, &child_id).await;
    let turns = &vscode.chats[&child.resource].turns;
    assert_eq!(turns.len(), 1, "the delegation's turn only: {turns:#?}");
    assert_eq!(turns[0].message.text, "Say hi");
}

/// What a sub-agent's chat waits for is its parent session's too (§11: `inputNeeded` rolls up
/// the session's chats): a call of the sub-agent's that needs approval is set in the parent
/// session channel's `inputNeeded`, naming the sub-agent's chat, and its snapshot lists it.
#[tokio::test(flavor = "multi_thread")]
async fn a_sub_agents_wait_is_its_parent_sessions_input_needed() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(CONFIG, dir.path()).await;
    let mut vscode = VsCode::connect(&host, None).await.unwrap();
    vscode.initialize().await;
    let session_uri = "demo:/w-3a61";
    let chat = vscode.create_session(session_uri).await;
    vscode.subscribe(session_uri).await;
    vscode.turn(&chat, "w1", "/agent helper /tool publish {\"channel\":\"news\"}").await;
    let child_wait = |v: &VsCode| {
        v.envelopes.iter().find_map(|e| match &e.action {
            StateAction::SessionInputNeededSet(set) if e.channel == session_uri => {
                let request = serde_json::to_value(&set.request).unwrap();
                let in_child =
                    request.to_string().contains("ahp-chat:/") && !request.to_string().contains(&chat);
                in_child.then_some(request)
            }
            _ => None,
        })
    };
    vscode.until("the sub-agent's approval in the session's inputNeeded", |v| child_wait(v).is_some()).await;
    let request = child_wait(&vscode).unwrap();
    assert!(request.to_string().contains("publish"), "{request}");
    let snapshot = vscode.request("subscribe", json!({"channel": session_uri})).await.unwrap();
    let listed = &snapshot["snapshot"]["state"]["inputNeeded"];
    assert!(listed.as_array().unwrap().iter().any(|e| e["id"] == request["id"]), "{snapshot}");
}

/// §8: an input request (a worker's interrupt asking a question) is answered as VS Code
/// answers one: `chat/inputCompleted` with its answers, echoed with its origin; the worker
/// is resumed with them, and the session stops waiting.
#[tokio::test(flavor = "multi_thread")]
async fn vs_code_answers_an_input_request() {
    let asked = Arc::new(AtomicBool::new(false));
    let worker = FakeWorker::start(None, move |request, _| match &request.trigger {
        Trigger::LlmFinished(_) if !asked.swap(true, Ordering::SeqCst) => FakeAnswer::Respond(DecisionResponse {
            messages: request.proposed.messages.clone(),
            actions: Some(vec![Action::Interrupt(InterruptAction {
                interrupt_id: Some("why".into()),
                reason: "Before I go on".into(),
                payload: Some(json!({"questions": [{"kind": "text", "id": "reason", "message": "Why deploy now?"}]})),
            })]),
            ..DecisionResponse::default()
        }),
        _ => FakeAnswer::Accept,
    })
    .await;
    let config =
        format!("{CONFIG}\n[agent.ops]\nmodel = \"scripted\"\nllm = \"s\"\nworker = \"{}\"\n", worker.url());
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(&config, dir.path()).await;
    let mut vscode = VsCode::connect(&host, None).await.unwrap();
    vscode.initialize().await;
    let session = "i-3a1f";
    let session_uri = format!("ops:/{session}");
    let chat = vscode.create_session(&session_uri).await;
    vscode.turn(&chat, "i1", "Deploy").await;
    vscode
        .until("the input request", |v| {
            v.chats[&chat].active_turn.as_ref().is_some_and(|t| {
                t.response_parts.iter().any(|p| matches!(p, ahp_types::state::ResponsePart::InputRequest(_)))
            })
        })
        .await;
    vscode
        .until("the request in the session's inputNeeded", |v| {
            v.envelopes.iter().any(|e| {
                matches!(&e.action, StateAction::SessionInputNeededSet(set)
                    if matches!(set.request, SessionInputRequest::ChatInput(_)))
            })
        })
        .await;
    let seq = vscode
        .dispatch(
            &chat,
            json!({"type": "chat/inputCompleted", "requestId": "why", "response": "accept",
                   "answers": {"reason": {"state": "submitted", "value": {"kind": "text", "value": "The fix is urgent"}}}}),
        )
        .await;
    let echo = vscode.echoed("the answer's echo", seq).await;
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
    completed_as(&host, None, session, "i1").await;
    vscode.settle(&host, None, &chat, session).await;
    vscode
        .until("the request resolved in the session", |v| {
            v.envelopes.iter().any(|e| matches!(&e.action, StateAction::SessionInputNeededRemoved(_)))
        })
        .await;
    let resumed =
        worker.records().into_iter().find(|r| r.trigger_name() == "interrupt.resumed").expect("a resume");
    let Trigger::InterruptResumed(t) = &resumed.request.trigger else { unreachable!() };
    let payload = t.payload.clone().unwrap_or_default();
    assert_eq!(payload["answers"]["reason"]["value"]["value"], "The fix is urgent", "{payload}");
}

/// VS Code never removes its own active-client entry (§7): a window gone for
/// `active_client_grace_secs` leaves the session's active clients (told to its subscribers as
/// `session/activeClientRemoved`), and one that reconnects within it keeps its place.
#[tokio::test(flavor = "multi_thread")]
async fn a_window_gone_for_good_leaves_the_active_clients() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{CONFIG}\n[limits]\nactive_client_grace_secs = 1\n");
    let host = TestHost::start(&config, dir.path()).await;
    let mut window = VsCode::connect(&host, None).await.unwrap();
    window.initialize().await;
    let (gone, back) = ("demo:/g-1c0d", "demo:/g-2e4f");
    window.create_session(gone).await;
    window.create_session(back).await;
    // Another window: its own client id.
    let mut observer = VsCode::connect(&host, None).await.unwrap();
    observer.client_id = "7d2e9c41-3b6a-4f0e-8c15-2a9d4e6f1b33".to_owned();
    observer.initialize().await;
    for session in [gone, back] {
        let snapshot = observer.subscribe(session).await;
        assert_eq!(snapshot["snapshot"]["state"]["activeClients"][0]["clientId"], json!(window.client_id));
    }

    // The window drops and comes back at once: it keeps its place.
    window.hang_up().await;
    let (mut window, _) = window.reconnect(&host, None).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let snapshot = observer.request("subscribe", json!({"channel": back})).await.unwrap();
    assert_eq!(snapshot["snapshot"]["state"]["activeClients"][0]["clientId"], json!(window.client_id));

    // Gone for good: it leaves both sessions.
    let client_id = window.client_id.clone();
    window.hang_up().await;
    let removed = |v: &VsCode, session: &str| {
        v.envelopes.iter().any(|e| {
            e.channel == session
                && matches!(&e.action, StateAction::SessionActiveClientRemoved(r) if r.client_id == client_id)
        })
    };
    observer.until("the window's leaving", |v| removed(v, gone) && removed(v, back)).await;
    let snapshot = observer.request("subscribe", json!({"channel": gone})).await.unwrap();
    assert_eq!(snapshot["snapshot"]["state"]["activeClients"], json!([]), "{snapshot}");
}

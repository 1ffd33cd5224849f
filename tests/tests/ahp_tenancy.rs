//! Who is on an AHP socket, what it may reach, and how much of the host it may hold (issue 23):
//! each against a real local host over a real WebSocket, spoken raw (JSON-RPC text frames) so
//! close codes and HTTP answers to the upgrade are seen as a browser sees them.
//!
//! - `another_owners_session_answers_as_a_missing_one`: `createSession`, `subscribe`,
//!   `dispatchAction`, `createChat` (a fork) and `disposeSession` on bob's session answer alice
//!   exactly as a session that does not exist (before: `createSession` said "already exists").
//! - `a_socket_is_closed_when_its_token_expires`: a JWT socket is closed with 4401 at `exp`,
//!   and the token then opens no socket.
//! - `a_socket_lives_on_with_a_renewed_token`: `authenticate` with a later JWT of the same
//!   caller moves the socket's end to its expiry; another caller's token, or a bad one, is
//!   refused and changes nothing.
//! - `the_token_may_come_as_the_tkn_parameter`: `?tkn=` authenticates the upgrade; a bad one is
//!   401, and the header wins over it.
//! - `a_message_over_the_body_limit_closes_the_socket`: past `[server] max_body_bytes`, 1009.
//! - `sockets_per_caller_are_capped`: the cap+1-th socket is 429 `too_many_sockets`, per
//!   caller, and a closed socket frees its place.
//! - `subscriptions_per_socket_are_capped`: a `subscribe` past the cap is refused, naming it.
//!
//! The same rules behind API Gateway (`tkn` on `$connect`, pushes ending at the token's expiry,
//! the connection closed with `DeleteConnection`) are tested over the DynamoDB registry on moto:
//! `shared/aws/tests/ahp.rs`, `connections_take_tkn_and_end_with_their_token`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ahp_types::actions::{ChatTurnStartedAction, StateAction};
use ahp_types::state::{Message as AhpMessage, MessageKind, MessageOrigin};
use futures_util::{SinkExt, StreamExt};
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use turnstone_tests::TestHost;

const PATIENCE: Duration = Duration::from_secs(15);
const JWT_SECRET: &str = "jwt-secret-for-tests-only-0123456789";

/// A host with client keys for alice and bob, JWTs, a small body limit and small caps.
const CONFIG: &str = r#"
[server]
max_body_bytes = 65536

[llm.s]
type = "scripted"

[agent.demo]
model = "scripted"
llm = "s"

[auth]
api_keys_env = "KEYS"
jwt_secret_env = "JWT"

[limits]
sockets_per_caller = 2
subscriptions_per_socket = 3
"#;

fn env(name: &str) -> Option<String> {
    match name {
        "KEYS" => Some("alice:key-alice,bob:key-bob".to_owned()),
        "JWT" => Some(JWT_SECRET.to_owned()),
        _ => None,
    }
}

async fn host() -> (TestHost, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start_with_env(CONFIG, dir.path(), env).await;
    (host, dir)
}

fn now_secs() -> u64 {
    #[allow(clippy::disallowed_methods)] // a JWT's `exp` is wall-clock time
    let now = SystemTime::now();
    now.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// An HS256 JWT of `sub` expiring at `exp` (Unix seconds).
fn jwt(sub: &str, exp: u64) -> String {
    let claims = json!({"sub": sub, "exp": exp});
    jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes()))
        .unwrap()
}

/// A WebSocket to `/v1/ahp` spoken raw: text frames of JSON-RPC.
struct Socket {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

/// Opens `/v1/ahp?<query>` with `Authorization: Bearer <token>` when given; the upgrade's
/// refusal (an HTTP status) is the error.
async fn open(host: &TestHost, token: Option<&str>, query: &str) -> Result<Socket, tungstenite::Error> {
    let url = format!("{}/v1/ahp{query}", host.url().replacen("http://", "ws://", 1));
    let mut request = url.into_client_request()?;
    if let Some(token) = token {
        request.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let (ws, _) = tokio_tungstenite::connect_async(request).await?;
    Ok(Socket { ws, next_id: 1 })
}

/// The HTTP status and JSON body an upgrade was refused with.
async fn refused(host: &TestHost, token: Option<&str>, query: &str) -> (u16, Value) {
    match open(host, token, query).await {
        Ok(_) => panic!("the upgrade {query:?} was accepted"),
        Err(tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().map(serde_json::from_slice).and_then(Result::ok);
            (response.status().as_u16(), body.unwrap_or(Value::Null))
        }
        Err(other) => panic!("not an HTTP refusal: {other:?}"),
    }
}

/// A socket that said hello.
async fn initialized(host: &TestHost, token: &str) -> Socket {
    let mut socket = open(host, Some(token), "").await.unwrap();
    let init = socket
        .request(
            "initialize",
            json!({"protocolVersions": ["1.0.0"], "clientId": "c", "channel": "ahp-root://"}),
        )
        .await;
    assert!(init.get("result").is_some(), "{init}");
    socket
}

impl Socket {
    async fn send(&mut self, frame: Value) {
        self.ws.send(Message::Text(frame.to_string().into())).await.unwrap();
    }

    /// The next text frame as JSON; `None` when the socket ends first (or nothing comes in
    /// time).
    async fn next(&mut self) -> Option<Value> {
        loop {
            match tokio::time::timeout(PATIENCE, self.ws.next()).await.ok()?? {
                Ok(Message::Text(text)) => return Some(serde_json::from_str(&text).unwrap()),
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Sends a request; its response (with `result` or `error`).
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        loop {
            let frame = self.next().await.unwrap_or_else(|| panic!("no response to {method}"));
            if frame["id"] == json!(id) {
                return frame;
            }
        }
    }

    /// A request that must fail: its error.
    async fn error(&mut self, method: &str, params: Value) -> Value {
        let response = self.request(method, params.clone()).await;
        response.get("error").cloned().unwrap_or_else(|| panic!("{method} {params} succeeded: {response}"))
    }

    /// Waits for the host to close the socket: its close frame (`None`: ended without one).
    async fn closed(&mut self) -> Option<CloseFrame> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match tokio::time::timeout_at(deadline, self.ws.next()).await.expect("the socket closed in time")
            {
                Some(Ok(Message::Close(frame))) => return frame,
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return None,
            }
        }
    }
}

fn turn_started(turn_id: &str, text: &str) -> Value {
    serde_json::to_value(StateAction::ChatTurnStarted(ChatTurnStartedAction {
        turn_id: turn_id.into(),
        started_at: "2026-01-01T00:00:00Z".into(),
        message: AhpMessage {
            text: text.into(),
            origin: MessageOrigin { kind: MessageKind::User },
            attachments: None,
            model: None,
            agent: None,
            meta: None,
        },
        queued_message_id: None,
        meta: None,
    }))
    .unwrap()
}

/// `error` with the session URI in its message replaced by `<uri>`, to compare two answers.
fn shape(error: &Value, uri: &str) -> Value {
    json!({"code": error["code"], "message": error["message"].as_str().unwrap_or_default().replace(uri, "<uri>")})
}

#[tokio::test(flavor = "multi_thread")]
async fn another_owners_session_answers_as_a_missing_one() {
    let (host, _dir) = host().await;
    let mut bob = initialized(&host, "key-bob").await;
    let created =
        bob.request("createSession", json!({"channel": "ahp-session:/b-1", "provider": "demo"})).await;
    assert_eq!(created["result"], Value::Null, "{created}");
    let mut alice = initialized(&host, "key-alice").await;

    // createSession: bob's id is not alice's to learn of; her own existing one is hers.
    let theirs =
        alice.error("createSession", json!({"channel": "ahp-session:/b-1", "provider": "demo"})).await;
    let missing = alice.error("subscribe", json!({"channel": "ahp-session:/nobody"})).await;
    assert_eq!(shape(&theirs, "ahp-session:/b-1"), shape(&missing, "ahp-session:/nobody"), "{theirs}");
    assert_eq!(theirs["code"], -32001);
    let mine =
        alice.request("createSession", json!({"channel": "ahp-session:/a-1", "provider": "demo"})).await;
    assert_eq!(mine["result"], Value::Null, "{mine}");
    let again =
        alice.error("createSession", json!({"channel": "ahp-session:/a-1", "provider": "demo"})).await;
    assert_eq!(again["code"], -32003, "the caller's own session is said to exist: {again}");

    // subscribe, to the session and to its chat.
    for (theirs, missing) in
        [("ahp-session:/b-1", "ahp-session:/nobody"), ("ahp-chat:/b-1", "ahp-chat:/nobody")]
    {
        let a = alice.error("subscribe", json!({"channel": theirs})).await;
        let b = alice.error("subscribe", json!({"channel": missing})).await;
        assert_eq!(shape(&a, theirs), shape(&b, missing), "subscribe {theirs}");
    }

    // dispatchAction: the same rejection for bob's chat as for no chat at all.
    let mut reasons = Vec::new();
    for channel in ["ahp-chat:/b-1", "ahp-chat:/nobody"] {
        let params = json!({"channel": channel, "clientSeq": 1, "action": turn_started("t-1", "Hi")});
        alice.send(json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": params})).await;
        let echo = loop {
            let frame = alice.next().await.expect("the rejection");
            if frame["method"] == "action" {
                break frame;
            }
        };
        let reason =
            echo["params"]["rejectionReason"].as_str().expect("a rejection").replace(channel, "<uri>");
        reasons.push(reason);
    }
    assert_eq!(reasons[0], reasons[1]);
    let (status, _) = host.with_token("key-bob").get("/v1/sessions/b-1/turns/t-1").await;
    assert_eq!(status, 404, "alice's turn never started in bob's session");

    // createChat: a fork of alice's own session into bob's id is refused as for a missing id.
    let alice_http = host.with_token("key-alice");
    let turn = alice_http
        .submit_ok(
            "a-1",
            &json!({"type": "client.message", "agent_id": "demo", "message": {"role": "user", "content": "Hi"}}),
        )
        .await;
    alice_http.wait_turn("a-1", &turn).await;
    let fork = |into: &str| {
        json!({
            "channel": "ahp-session:/a-1",
            "chat": format!("ahp-chat:/{into}"),
            "source": {"kind": "fork", "chat": "ahp-chat:/a-1", "turnId": turn},
        })
    };
    let into_theirs = alice.error("createChat", fork("b-1")).await;
    assert_eq!(shape(&into_theirs, "ahp-chat:/b-1"), shape(&missing, "ahp-session:/nobody"), "{into_theirs}");
    let _ = alice.request("createSession", json!({"channel": "ahp-session:/a-2", "provider": "demo"})).await;
    let into_mine = alice.error("createChat", fork("a-2")).await;
    assert_eq!(into_mine["code"], -32010, "an id of the caller's own is said to be taken: {into_mine}");
    let forked = alice.request("createChat", fork("a-fork")).await;
    assert_eq!(forked["result"], Value::Null, "{forked}");

    // disposeSession, and bob's session is untouched.
    let dispose = alice.error("disposeSession", json!({"channel": "ahp-session:/b-1"})).await;
    let dispose_missing = alice.error("disposeSession", json!({"channel": "ahp-session:/nobody"})).await;
    assert_eq!(shape(&dispose, "ahp-session:/b-1"), shape(&dispose_missing, "ahp-session:/nobody"));
    let (status, summary) = host.with_token("key-bob").get("/v1/sessions/b-1").await;
    assert_eq!(status, 200, "{summary}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_socket_is_closed_when_its_token_expires() {
    let (host, _dir) = host().await;
    let exp = now_secs() + 3;
    let token = jwt("carol", exp);
    let mut socket = initialized(&host, &token).await;
    let listed = socket.request("listSessions", json!({"channel": "ahp-root://"})).await;
    assert_eq!(listed["result"]["items"], json!([]), "{listed}");
    let subscribed = socket.request("subscribe", json!({"channel": "ahp-root://"})).await;
    assert!(subscribed.get("result").is_some(), "{subscribed}");

    let frame = socket.closed().await.expect("a close frame");
    assert_eq!(u16::from(frame.code), 4401, "{frame:?}");
    assert_eq!(frame.reason.as_str(), "token expired");
    assert!(now_secs() >= exp, "closed at the expiry, not before");
    // Nothing more is answered on it.
    let sent = socket
        .ws
        .send(Message::Text(r#"{"jsonrpc":"2.0","id":9,"method":"listSessions","params":{}}"#.into()))
        .await;
    assert!(sent.is_err() || socket.next().await.is_none(), "the socket answers no more");

    // The token opens no socket any more (HTTP's leeway does not stretch a socket's life).
    let (status, body) = refused(&host, Some(&token), "").await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("token_expired")), "{body}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_may_come_as_the_tkn_parameter() {
    let (host, _dir) = host().await;
    let mut socket = open(&host, None, "?tkn=key-alice").await.unwrap();
    let created =
        socket.request("createSession", json!({"channel": "ahp-session:/t-1", "provider": "demo"})).await;
    assert_eq!(created["result"], Value::Null, "{created}");
    let (status, summary) = host.with_token("key-alice").get("/v1/sessions/t-1").await;
    assert_eq!(status, 200, "the session is alice's: {summary}");

    // A JWT, percent-encoded as a browser's URL carries it, authenticates too.
    let token = jwt("carol", now_secs() + 300);
    let mut carol = open(&host, None, &format!("?other=1&tkn={token}")).await.unwrap();
    let listed = carol.request("listSessions", json!({"channel": "ahp-root://"})).await;
    assert_eq!(listed["result"]["items"], json!([]), "carol sees none of alice's: {listed}");

    for query in ["?tkn=key-nobody", "?tkn=", "?token=key-alice"] {
        let (status, body) = refused(&host, None, query).await;
        assert_eq!(status, 401, "{query}: {body}");
    }
    // The header wins: a bad header is not saved by a good tkn, nor a good one spoiled by a bad.
    assert_eq!(refused(&host, Some("key-nobody"), "?tkn=key-alice").await.0, 401);
    let mut bob = open(&host, Some("key-bob"), "?tkn=key-nobody").await.unwrap();
    let listed = bob.request("listSessions", json!({"channel": "ahp-root://"})).await;
    assert_eq!(listed["result"]["items"], json!([]), "bob's view: {listed}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_over_the_body_limit_closes_the_socket() {
    let (host, _dir) = host().await;
    let mut socket = initialized(&host, "key-alice").await;
    // Under the limit (64 KiB), a padded request is answered.
    let padding = "x".repeat(60 * 1024);
    let ping = socket.request("ping", json!({"padding": padding})).await;
    assert_eq!(ping["result"], Value::Null, "{ping}");
    // Over it, the socket is closed with 1009 and the request never answered.
    let padding = "x".repeat(100 * 1024);
    socket.send(json!({"jsonrpc": "2.0", "id": 99, "method": "ping", "params": {"padding": padding}})).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let close = loop {
        match tokio::time::timeout_at(deadline, socket.ws.next()).await.expect("the socket ended in time") {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(Message::Text(text))) => {
                let frame: Value = serde_json::from_str(&text).unwrap();
                assert_ne!(frame["id"], json!(99), "an oversized request was answered: {frame}");
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break None,
        }
    };
    let frame = close.expect("a close frame");
    assert_eq!((u16::from(frame.code), frame.reason.as_str()), (1009, "message too big"), "{frame:?}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sockets_per_caller_are_capped() {
    let (host, _dir) = host().await;
    let first = initialized(&host, "key-alice").await;
    let mut second = open(&host, None, "?tkn=key-alice").await.unwrap();
    let (status, body) = refused(&host, Some("key-alice"), "").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "too_many_sockets", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("limits.sockets_per_caller"), "{body}");
    // The cap is per caller identity: bob, and a JWT named like alice, have their own.
    let _bob = initialized(&host, "key-bob").await;
    let _jwt_alice = initialized(&host, &jwt("alice", now_secs() + 300)).await;

    // A socket that ends frees its place.
    second.ws.close(None).await.unwrap();
    while second.ws.next().await.is_some() {}
    drop(first);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut again = Vec::new();
    while again.len() < 2 {
        match open(&host, Some("key-alice"), "").await {
            Ok(socket) => again.push(socket),
            Err(tungstenite::Error::Http(response)) if response.status() == 429 => {
                assert!(tokio::time::Instant::now() < deadline, "the closed sockets were never released");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(refused(&host, Some("key-alice"), "").await.0, 429, "and the cap holds again");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn subscriptions_per_socket_are_capped() {
    let (host, _dir) = host().await;
    let mut socket = initialized(&host, "key-alice").await;
    for id in ["s-1", "s-2", "s-3"] {
        let created = socket
            .request("createSession", json!({"channel": format!("ahp-session:/{id}"), "provider": "demo"}))
            .await;
        assert_eq!(created["result"], Value::Null, "{created}");
    }
    for channel in ["ahp-root://", "ahp-chat:/s-1", "ahp-session:/s-1"] {
        let subscribed = socket.request("subscribe", json!({"channel": channel})).await;
        assert!(subscribed.get("result").is_some(), "{channel}: {subscribed}");
    }
    let past = socket.error("subscribe", json!({"channel": "ahp-chat:/s-2"})).await;
    assert!(past["message"].as_str().unwrap().contains("subscriptions_per_socket"), "{past}");
    // Subscribing again to a held channel replaces it: no new place taken.
    let again = socket.request("subscribe", json!({"channel": "ahp-chat:/s-1"})).await;
    assert!(again.get("result").is_some(), "{again}");
    // An unsubscribe frees a place.
    socket
        .send(json!({"jsonrpc": "2.0", "method": "unsubscribe", "params": {"channel": "ahp-session:/s-1"}}))
        .await;
    let subscribed = socket.request("subscribe", json!({"channel": "ahp-chat:/s-2"})).await;
    assert!(subscribed.get("result").is_some(), "{subscribed}");
    // `reconnect` and `initialize` are held to the same cap.
    let channels = ["ahp-root://", "ahp-chat:/s-1", "ahp-chat:/s-2", "ahp-chat:/s-3"];
    let reconnect = socket
        .error("reconnect", json!({"channel": "ahp-root://", "clientId": "c", "lastSeenServerSeq": 0, "subscriptions": channels}))
        .await;
    assert!(reconnect["message"].as_str().unwrap().contains("subscriptions_per_socket"), "{reconnect}");
    let mut fresh = open(&host, Some("key-alice"), "").await.unwrap();
    let init = fresh
        .error(
            "initialize",
            json!({"protocolVersions": ["1.0.0"], "clientId": "d", "channel": "ahp-root://", "initialSubscriptions": channels}),
        )
        .await;
    assert!(init["message"].as_str().unwrap().contains("subscriptions_per_socket"), "{init}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_socket_lives_on_with_a_renewed_token() {
    let (host, _dir) = host().await;
    let first_exp = now_secs() + 3;
    let mut socket = initialized(&host, &jwt("carol", first_exp)).await;
    let auth = |token: String| json!({"channel": "ahp-root://", "resource": "turnstone", "token": token});
    // Another caller's token, or one that is no token, is refused.
    let other = socket.request("authenticate", auth(jwt("dave", now_secs() + 60))).await;
    assert_eq!(other["error"]["code"], -32009, "{other}");
    let bad = socket.request("authenticate", auth("not-a-token".to_owned())).await;
    assert_eq!(bad["error"]["code"], -32007, "{bad}");
    // Carol's renewed token: the socket outlives the first one.
    let renewed = socket.request("authenticate", auth(jwt("carol", now_secs() + 60))).await;
    assert_eq!(renewed["result"], json!({}), "{renewed}");
    while now_secs() <= first_exp + 1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let listed = socket.request("listSessions", json!({"channel": "ahp-root://"})).await;
    assert_eq!(listed["result"]["items"], json!([]), "still open past the first token's expiry: {listed}");
}

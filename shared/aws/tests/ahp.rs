//! The `ahp` function on moto: real API Gateway WebSocket events (`$connect`, `$default`,
//! `$disconnect`) through `turnstone_lambda::websocket::handle`, connections and subscriptions
//! in the table, and the Management API played by a fake HTTP server that speaks its wire format
//! (`POST /{stage}/@connections/{id}` with the frame as the body, 410 for a gone connection).
//! A turn run by a separate `dispatch` deployment (its own process state) pushes the chat's
//! actions to the subscriber, and what the subscriber reduces with the official reducers equals
//! `GET /v1/sessions/{id}/chat`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: fail loudly

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ahp::reducers::{ReduceOutcome, apply_action_to_chat};
use ahp_types::actions::{ActionEnvelope, ChatTurnStartedAction, StateAction};
use ahp_types::common::ROOT_RESOURCE_URI;
use ahp_types::state::{ChatState, Message, MessageKind, MessageOrigin, SessionStatus, SnapshotState};
use aws_lambda_events::apigw::ApiGatewayWebsocketProxyRequest;
use aws_lambda_events::sqs::SqsEvent;
use aws_sdk_dynamodb::config::Credentials;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;
use turnstone_aws::management::MAX_MESSAGE;
use turnstone_aws::moto as support;
use turnstone_aws::{Deployment, QueueSettings, Settings, SqsQueue};
use turnstone_runtime::ahp::Gateway;
use turnstone_runtime::queue::Consumer;

const CONFIG: &str = r#"
[llm.s]
type = "scripted"

[agent.helper]
model = "scripted"
llm = "s"
stream = true

[auth]
api_keys_env = "TURNSTONE_API_KEYS"
jwt_secret_env = "TURNSTONE_JWT_SECRET"
"#;
/// The HS256 secret of the deployment's JWTs.
const JWT_SECRET: &str = "a-secret-of-the-tests-that-is-long-enough";
const KEY: &str = "k3y-alice";
/// Another caller's key.
const BOB_KEY: &str = "k3y-bob";

/// The fake Management API: every frame posted, by connection, and the connections that are gone.
#[derive(Default)]
struct Management {
    frames: Mutex<Vec<(String, String)>>,
    gone: Mutex<HashSet<String>>,
    /// Connections closed with `DeleteConnection`.
    closed: Mutex<Vec<String>>,
}

impl Management {
    fn frames_of(&self, connection: &str) -> Vec<Value> {
        let frames = self.frames.lock().unwrap();
        frames
            .iter()
            .filter(|(c, _)| c == connection)
            .map(|(_, f)| serde_json::from_str(f).unwrap())
            .collect()
    }

    fn raw_of(&self, connection: &str) -> Vec<String> {
        let frames = self.frames.lock().unwrap();
        frames.iter().filter(|(c, _)| c == connection).map(|(_, f)| f.clone()).collect()
    }
}

async fn post_to_connection(
    State(management): State<Arc<Management>>,
    Path((_stage, id)): Path<(String, String)>,
    body: Bytes,
) -> (StatusCode, HeaderMap, String) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    if management.gone.lock().unwrap().contains(&id) {
        headers.insert("x-amzn-errortype", "GoneException".parse().unwrap());
        return (StatusCode::GONE, headers, r#"{"message":null}"#.to_owned());
    }
    assert!(body.len() <= MAX_MESSAGE, "a frame of {} bytes is over API Gateway's limit", body.len());
    management.frames.lock().unwrap().push((id, String::from_utf8(body.to_vec()).unwrap()));
    (StatusCode::OK, headers, String::new())
}

/// `DeleteConnection`: `DELETE /{stage}/@connections/{id}` answers 204 with no body, or 410
/// `GoneException` for a connection that is not open (API Gateway Management API reference,
/// DeleteConnection).
async fn delete_connection(
    State(management): State<Arc<Management>>,
    Path((_stage, id)): Path<(String, String)>,
) -> (StatusCode, HeaderMap, String) {
    let mut headers = HeaderMap::new();
    if management.gone.lock().unwrap().contains(&id) {
        headers.insert("content-type", "application/json".parse().unwrap());
        headers.insert("x-amzn-errortype", "GoneException".parse().unwrap());
        return (StatusCode::GONE, headers, r#"{"message":null}"#.to_owned());
    }
    management.gone.lock().unwrap().insert(id.clone());
    management.closed.lock().unwrap().push(id);
    (StatusCode::NO_CONTENT, headers, String::new())
}

/// Serves the fake Management API; its endpoint as the functions are given it (with the stage).
async fn management() -> (Arc<Management>, String) {
    let management = Arc::new(Management::default());
    let router = axum::Router::new()
        .route(
            "/{stage}/@connections/{id}",
            axum::routing::post(post_to_connection).delete(delete_connection),
        )
        .with_state(Arc::clone(&management));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (management, format!("http://{addr}/dev"))
}

fn context(route: &str, event_type: &str, connection: &str) -> Value {
    json!({
        "routeKey": route,
        "eventType": event_type,
        "extendedRequestId": "Ab1CdEfGhIjKlMn=",
        "requestTime": "09/Feb/2025:10:00:00 +0000",
        "messageDirection": "IN",
        "stage": "dev",
        "connectedAt": 1739095200000_i64,
        "requestTimeEpoch": 1739095200123_i64,
        "identity": {"sourceIp": "203.0.113.7", "userAgent": "ahp-test"},
        "requestId": "Ab1CdEfGhIjKlMn=",
        "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
        "connectionId": connection,
        "apiId": "abc123"
    })
}

/// A `$connect` event as API Gateway sends it, with `authorization` on the upgrade.
fn connect_event(connection: &str, authorization: Option<&str>) -> ApiGatewayWebsocketProxyRequest {
    let mut headers = json!({
        "Host": "abc123.execute-api.us-east-1.amazonaws.com",
        "Sec-WebSocket-Extensions": "permessage-deflate; client_max_window_bits",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
        "X-Forwarded-For": "203.0.113.7",
        "X-Forwarded-Port": "443",
        "X-Forwarded-Proto": "https"
    });
    if let Some(authorization) = authorization {
        headers["Authorization"] = json!(authorization);
    }
    let multi: serde_json::Map<String, Value> =
        headers.as_object().unwrap().iter().map(|(k, v)| (k.clone(), json!([v]))).collect();
    serde_json::from_value(json!({
        "headers": headers,
        "multiValueHeaders": multi,
        "requestContext": context("$connect", "CONNECT", connection),
        "isBase64Encoded": false
    }))
    .unwrap()
}

/// A `$default` event carrying one JSON-RPC message.
fn message_event(connection: &str, body: &Value) -> ApiGatewayWebsocketProxyRequest {
    let mut context = context("$default", "MESSAGE", connection);
    context["messageId"] = json!("Ab1CdMsgId=");
    serde_json::from_value(json!({
        "requestContext": context,
        "body": body.to_string(),
        "isBase64Encoded": false
    }))
    .unwrap()
}

fn disconnect_event(connection: &str) -> ApiGatewayWebsocketProxyRequest {
    let mut context = context("$disconnect", "DISCONNECT", connection);
    context["disconnectStatusCode"] = json!(1005);
    context["disconnectReason"] = json!("Client-side close frame status not set");
    serde_json::from_value(json!({
        "headers": {"Host": "abc123.execute-api.us-east-1.amazonaws.com", "x-api-key": "", "X-Forwarded-For": "", "x-restapi": ""},
        "multiValueHeaders": {"Host": ["abc123.execute-api.us-east-1.amazonaws.com"], "x-api-key": [""], "X-Forwarded-For": [""], "x-restapi": [""]},
        "requestContext": context,
        "isBase64Encoded": false
    }))
    .unwrap()
}

/// The deployments of two functions (`ahp` and `dispatch`: each its own process state) on one
/// fresh table and queue, pushing through the fake Management API.
struct World {
    ahp: Deployment,
    gateway: Gateway,
    /// A second `ahp` container: the same table, queue and registry, memory of its own.
    other: (Deployment, Gateway),
    dispatch: Deployment,
    queue: SqsQueue,
    management: Arc<Management>,
    next_id: AtomicU64,
}

impl World {
    async fn new() -> World {
        World::with_config(CONFIG).await
    }

    async fn with_config(config: &str) -> World {
        let sdk = support::config("unused", "unused")
            .loader()
            .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
            .load()
            .await;
        let (store, clients) = support::store_and_clients().await;
        let queue_url =
            SqsQueue::create_queue(&clients.sqs, &support::unique("tq"), &QueueSettings::default())
                .await
                .unwrap();
        let parameter = format!("/{}/config", support::unique("turnstone"));
        aws_sdk_ssm::Client::new(&sdk)
            .put_parameter()
            .name(&parameter)
            .value(config)
            .r#type(aws_sdk_ssm::types::ParameterType::String)
            .send()
            .await
            .unwrap();
        let secret = aws_sdk_secretsmanager::Client::new(&sdk)
            .create_secret()
            .name(support::unique("turnstone-secrets"))
            .secret_string(format!(
                r#"{{"TURNSTONE_API_KEYS": "alice:{KEY},bob:{BOB_KEY}", "TURNSTONE_JWT_SECRET": "{JWT_SECRET}"}}"#
            ))
            .send()
            .await
            .unwrap();
        let (management, endpoint) = management().await;
        let settings = Settings {
            aws: support::config(store.table(), &queue_url),
            config_parameter: Some(parameter),
            config_object: None,
            secrets_arn: secret.arn().map(str::to_owned),
            ahp_endpoint: Some(endpoint),
            schedules: None,
        };
        let ahp = Deployment::open(&settings, &sdk).await.unwrap();
        let dispatch = Deployment::open(&settings, &sdk).await.unwrap();
        let gateway = Gateway::new(Arc::clone(ahp.ahp.as_ref().unwrap()), &ahp.http);
        let other = Deployment::open(&settings, &sdk).await.unwrap();
        let other_gateway = Gateway::new(Arc::clone(other.ahp.as_ref().unwrap()), &other.http);
        let (_, queue) = support::config(store.table(), &queue_url).connect_with(&clients).await.unwrap();
        World {
            ahp,
            gateway,
            other: (other, other_gateway),
            dispatch,
            queue,
            management,
            next_id: AtomicU64::new(1),
        }
    }

    async fn event(&self, event: ApiGatewayWebsocketProxyRequest) -> i64 {
        self.event_on(false, event).await
    }

    /// An event handled by the first container, or with `other` by the second.
    async fn event_on(&self, other: bool, event: ApiGatewayWebsocketProxyRequest) -> i64 {
        let (app, gateway) = match other {
            false => (&self.ahp.engine.app, &self.gateway),
            true => (&self.other.0.engine.app, &self.other.1),
        };
        turnstone_lambda::websocket::handle(app, gateway, event).await.status_code
    }

    /// Sends a request on `connection`; its response.
    async fn request(&self, connection: &str, method: &str, params: Value) -> Value {
        self.request_on(false, connection, method, params).await
    }

    /// Sends a request on `connection` to the first container, or with `other` the second.
    async fn request_on(&self, other: bool, connection: &str, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let before = self.management.frames_of(connection).len();
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        assert_eq!(self.event_on(other, message_event(connection, &body)).await, 200);
        let frames = self.management.frames_of(connection);
        frames[before..]
            .iter()
            .find(|f| f["id"] == json!(id))
            .cloned()
            .unwrap_or_else(|| panic!("no response to {method}: {frames:?}"))
    }

    /// Runs the wake-ups in the queue as the `dispatch` function does, from real SQS records.
    async fn dispatch(&self) {
        let deliveries = self.queue.receive(10, Duration::from_secs(5)).await.unwrap();
        assert!(!deliveries.is_empty(), "a wake-up for the turn");
        let records: Vec<Value> = deliveries
            .iter()
            .enumerate()
            .map(|(i, d)| {
                json!({
                    "messageId": format!("m{i}"),
                    "receiptHandle": "rh",
                    "body": d.wake_up.to_body(),
                    "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1739095200000", "SenderId": "A", "ApproximateFirstReceiveTimestamp": "1739095200000"},
                    "messageAttributes": {},
                    "md5OfBody": "",
                    "eventSource": "aws:sqs",
                    "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:tq",
                    "awsRegion": "us-east-1"
                })
            })
            .collect();
        let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
        let response = turnstone_lambda::sqs::handle_batch(
            &self.dispatch.engine.dispatcher,
            event,
            None,
            None,
            self.dispatch.ahp.as_deref(),
        )
        .await;
        assert!(response.batch_item_failures.is_empty(), "the runs succeed");
        for delivery in &deliveries {
            self.queue.ack(delivery).await.unwrap();
        }
    }

    /// `GET /v1/sessions/{id}/chat` through the `api` function's router.
    async fn chat(&self, session: &str) -> ChatState {
        let router =
            turnstone_lambda::http::api_router(Arc::clone(&self.ahp.engine.app), self.ahp.http.clone());
        let request = axum::http::Request::get(format!("/v1/sessions/{session}/chat"))
            .header("authorization", format!("Bearer {KEY}"))
            .body(axum::body::Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// Starts a turn with `text` through `dispatchAction`, and runs it in the `dispatch` function.
    async fn turn(&self, connection: &str, session: &str, turn_id: &str, text: &str) {
        self.start_turn(connection, session, turn_id, text).await;
        self.dispatch().await;
    }

    /// Starts a turn with `text` through `dispatchAction`.
    async fn start_turn(&self, connection: &str, session: &str, turn_id: &str, text: &str) {
        self.start_turn_on(false, connection, session, turn_id, text).await;
    }

    /// Starts a turn with `text` through `dispatchAction` to the first container, or with
    /// `other` the second.
    async fn start_turn_on(&self, other: bool, connection: &str, session: &str, turn_id: &str, text: &str) {
        let action = StateAction::ChatTurnStarted(ChatTurnStartedAction {
            turn_id: turn_id.into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            message: Message {
                text: text.into(),
                origin: MessageOrigin { kind: MessageKind::User },
                attachments: None,
                model: None,
                agent: None,
                meta: None,
            },
            queued_message_id: None,
            meta: None,
        });
        let params = json!({"channel": format!("ahp-chat:/{session}"), "clientSeq": 1, "action": action});
        self.request_on(other, connection, "dispatchAction", params).await;
    }
}

/// A subscriber's copy of a chat: its snapshot, then every `action` reduced in order.
struct Copy {
    chat: ChatState,
    last_seq: u64,
}

impl Copy {
    fn from_snapshot(snapshot: &Value) -> Copy {
        let state: SnapshotState = serde_json::from_value(snapshot["state"].clone()).unwrap();
        let SnapshotState::Chat(chat) = state else { panic!("not a chat snapshot: {snapshot}") };
        Copy { chat: *chat, last_seq: snapshot["fromSeq"].as_u64().unwrap() }
    }

    fn apply(&mut self, envelope: ActionEnvelope) {
        assert!(envelope.server_seq > self.last_seq, "actions come numbered, in order, once each");
        self.last_seq = envelope.server_seq;
        let outcome = apply_action_to_chat(&mut self.chat, &envelope.action);
        assert!(matches!(outcome, ReduceOutcome::Applied), "{outcome:?} for {:?}", envelope.action);
    }

    /// Reduces every `action` notification among `frames`.
    fn apply_frames(&mut self, frames: &[Value]) -> usize {
        let mut applied = 0;
        for frame in frames.iter().filter(|f| f["method"] == "action") {
            self.apply(serde_json::from_value(frame["params"].clone()).unwrap());
            applied += 1;
        }
        applied
    }
}

fn initialize() -> Value {
    json!({
        "channel": ROOT_RESOURCE_URI,
        "protocolVersions": ahp_types::version::SUPPORTED_PROTOCOL_VERSIONS,
        "clientId": "test-client"
    })
}

#[tokio::test]
async fn a_chat_over_api_gateway_websockets() {
    let world = World::new().await;

    // $connect: refused without a key and with a bad one, recorded with a good one.
    assert_eq!(world.event(connect_event("c-none", None)).await, 401);
    assert_eq!(world.event(connect_event("c-bad", Some("Bearer nope"))).await, 401);
    let registry = Arc::clone(world.ahp.ahp.as_ref().unwrap().registry());
    assert!(registry.connection("c-bad").await.unwrap().is_none(), "a refused connection is not recorded");
    assert_eq!(world.event(connect_event("c1", Some(&format!("Bearer {KEY}")))).await, 200);
    assert!(registry.connection("c1").await.unwrap().is_some());

    // initialize, createSession, subscribe.
    let initialized = world.request("c1", "initialize", initialize()).await;
    assert!(initialized["result"]["protocolVersion"].is_string(), "{initialized}");
    let created = world
        .request("c1", "createSession", json!({"channel": "ahp-session:/s1", "provider": "helper"}))
        .await;
    assert_eq!(created["result"], Value::Null, "{created}");
    let subscribed = world.request("c1", "subscribe", json!({"channel": "ahp-chat:/s1"})).await;
    let mut copy = Copy::from_snapshot(&subscribed["result"]["snapshot"]);
    let seen = world.management.frames_of("c1").len();

    // A turn: started through the ahp function, run by the dispatch function; the actions of
    // both reach the subscriber, numbered, and its copy equals the HTTP API's chat.
    world.turn("c1", "s1", "t1", "hello over websockets").await;
    let frames = world.management.frames_of("c1");
    let applied = copy.apply_frames(&frames[seen..]);
    assert!(applied >= 3, "the turn's actions were pushed: {:?}", &frames[seen..]);
    let chat = world.chat("s1").await;
    assert_eq!(copy.chat, chat, "the subscriber's reduced chat equals GET /v1/sessions/s1/chat");
    let reply = serde_json::to_string(&chat.turns).unwrap();
    assert!(reply.contains("You said: hello over websockets"), "{reply}");

    // A second subscriber whose connection is gone: the push meets 410 and removes it.
    assert_eq!(world.event(connect_event("c2", Some(&format!("Bearer {KEY}")))).await, 200);
    world.request("c2", "subscribe", json!({"channel": "ahp-chat:/s1"})).await;
    world.management.gone.lock().unwrap().insert("c2".to_owned());
    let seen = world.management.frames_of("c1").len();
    world.turn("c1", "s1", "t2", "again").await;
    copy.apply_frames(&world.management.frames_of("c1")[seen..]);
    assert_eq!(copy.chat, world.chat("s1").await);
    assert!(registry.connection("c2").await.unwrap().is_none(), "a 410 connection is removed");
    let subscribers = registry.subscribers(&"s1".into()).await.unwrap();
    assert_eq!(subscribers.iter().map(|s| s.connection_id.as_str()).collect::<Vec<_>>(), ["c1"]);

    // $disconnect removes the connection and its subscriptions.
    assert_eq!(world.event(disconnect_event("c1")).await, 200);
    assert!(registry.connection("c1").await.unwrap().is_none());
    assert!(registry.subscribers(&"s1".into()).await.unwrap().is_empty(), "no subscribers left");
}

#[tokio::test]
async fn an_oversized_replay_is_split_under_the_frame_limit() {
    let world = World::new().await;
    let key = format!("Bearer {KEY}");
    assert_eq!(world.event(connect_event("c1", Some(&key))).await, 200);
    world.request("c1", "initialize", initialize()).await;
    world.request("c1", "createSession", json!({"channel": "ahp-session:/big", "provider": "helper"})).await;
    let subscribed = world.request("c1", "subscribe", json!({"channel": "ahp-chat:/big"})).await;
    let mut copy = Copy::from_snapshot(&subscribed["result"]["snapshot"]);
    assert_eq!(world.event(disconnect_event("c1")).await, 200);

    // Turns of 40 KB messages while the client is away: about 400 KB of actions to replay.
    let driver = "c-driver";
    assert_eq!(world.event(connect_event(driver, Some(&key))).await, 200);
    world.request(driver, "initialize", initialize()).await;
    for n in 0..5 {
        let text = format!("{n}").repeat(40 * 1024);
        world.turn(driver, "big", &format!("t{n}"), &text).await;
    }

    // Back on a new connection: the replay answers with what fits, the rest follows as actions.
    assert_eq!(world.event(connect_event("c3", Some(&key))).await, 200);
    let params = json!({
        "channel": ROOT_RESOURCE_URI,
        "clientId": "test-client",
        "lastSeenServerSeq": copy.last_seq,
        "subscriptions": ["ahp-chat:/big"]
    });
    let reconnected = world.request("c3", "reconnect", params).await;
    let replayed: Vec<ActionEnvelope> = serde_json::from_value(reconnected["result"]["actions"].clone())
        .unwrap_or_else(|_| panic!("{reconnected}"));
    assert!(!replayed.is_empty(), "a replay: {reconnected}");
    for envelope in replayed {
        copy.apply(envelope);
    }
    let frames = world.management.frames_of("c3");
    let followed = copy.apply_frames(&frames);
    assert!(followed > 0, "the replay did not fit in one frame, so actions followed it");
    assert!(world.management.raw_of("c3").iter().all(|f| f.len() <= MAX_MESSAGE));
    assert_eq!(copy.chat, world.chat("big").await, "the replayed copy equals GET .../chat");
}

/// A client back with a session channel among its subscriptions gets what the channel missed
/// in the replay: what it was told there is recorded under the client, so a rename made while
/// it was away comes as `session/titleChanged`.
#[tokio::test]
async fn a_reconnect_replays_what_a_session_channel_missed() {
    let world = World::new().await;
    let key = format!("Bearer {KEY}");
    assert_eq!(world.event(connect_event("c1", Some(&key))).await, 200);
    world.request("c1", "initialize", initialize()).await;
    world.request("c1", "createSession", json!({"channel": "ahp-session:/rs", "provider": "helper"})).await;
    let subscribed = world.request("c1", "subscribe", json!({"channel": "ahp-chat:/rs"})).await;
    let copy = Copy::from_snapshot(&subscribed["result"]["snapshot"]);
    world.request("c1", "subscribe", json!({"channel": "ahp-session:/rs"})).await;
    assert_eq!(world.event(disconnect_event("c1")).await, 200);

    // Renamed while away, by another window.
    assert_eq!(world.event(connect_event("c2", Some(&key))).await, 200);
    world.request("c2", "initialize", initialize()).await;
    let renamed = json!({"type": "session/titleChanged", "title": "Renamed while away"});
    let params = json!({"channel": "ahp-session:/rs", "clientSeq": 1, "action": renamed});
    world.request("c2", "dispatchAction", params).await;

    assert_eq!(world.event(connect_event("c3", Some(&key))).await, 200);
    let params = json!({
        "channel": ROOT_RESOURCE_URI,
        "clientId": "test-client",
        "lastSeenServerSeq": copy.last_seq,
        "subscriptions": ["ahp-chat:/rs", "ahp-session:/rs"]
    });
    let reconnected = world.request("c3", "reconnect", params).await;
    assert_eq!(reconnected["result"]["type"], "replay", "{reconnected}");
    let actions = reconnected["result"]["actions"].as_array().unwrap();
    let renamed: Vec<&Value> = actions.iter().filter(|a| a["channel"] == "ahp-session:/rs").collect();
    assert_eq!(renamed.len(), 1, "{reconnected}");
    assert_eq!(renamed[0]["action"], json!({"type": "session/titleChanged", "title": "Renamed while away"}));
    assert!(renamed[0]["serverSeq"].as_u64().unwrap() > copy.last_seq);
}

/// A client's `lastSeenServerSeq` is the highest number it saw on any chat (VS Code's and the
/// reference client's): a client that was sent actions of two chats and comes back to one of
/// them, with a number last seen on the other, is replayed from where it stood in this one.
#[tokio::test]
async fn a_reconnect_replays_each_chat_from_where_the_client_stood() {
    let world = World::new().await;
    let key = format!("Bearer {KEY}");
    assert_eq!(world.event(connect_event("c1", Some(&key))).await, 200);
    world.request("c1", "initialize", initialize()).await;
    let mut seen = 0;
    let mut a = None;
    for session in ["ma", "mb"] {
        let created = world
            .request(
                "c1",
                "createSession",
                json!({"channel": format!("ahp-session:/{session}"), "provider": "helper"}),
            )
            .await;
        assert_eq!(created["result"], Value::Null, "{created}");
        let subscribed =
            world.request("c1", "subscribe", json!({"channel": format!("ahp-chat:/{session}")})).await;
        seen = seen.max(subscribed["result"]["snapshot"]["fromSeq"].as_u64().unwrap());
        a = a.or_else(|| Some(Copy::from_snapshot(&subscribed["result"]["snapshot"])));
    }
    let mut a = a.unwrap();
    world.turn("c1", "ma", "a1", "First in A").await;
    // B runs longer: its positions run ahead of A's.
    for turn in ["b1", "b2", "b3"] {
        world.turn("c1", "mb", turn, "In B").await;
    }
    let frames = world.management.frames_of("c1");
    seen = frames
        .iter()
        .filter(|f| f["method"] == "action")
        .fold(seen, |m, f| m.max(f["params"]["serverSeq"].as_u64().unwrap()));
    let on_a: Vec<Value> =
        frames.iter().filter(|f| f["params"]["channel"] == "ahp-chat:/ma").cloned().collect();
    a.apply_frames(&on_a);
    assert!(seen > a.last_seq, "the number it comes back with is B's");
    assert_eq!(world.event(disconnect_event("c1")).await, 200);

    // A runs on while the client is away, past B's length.
    assert_eq!(world.event(connect_event("driver", Some(&key))).await, 200);
    let mut driver = initialize();
    driver["clientId"] = json!("driver-client");
    world.request("driver", "initialize", driver).await;
    for turn in ["a2", "a3", "a4", "a5"] {
        world.turn("driver", "ma", turn, "While away").await;
    }

    assert_eq!(world.event(connect_event("c2", Some(&key))).await, 200);
    let params = json!({
        "channel": ROOT_RESOURCE_URI,
        "clientId": "test-client",
        "lastSeenServerSeq": seen,
        "subscriptions": ["ahp-chat:/ma"]
    });
    let reconnected = world.request("c2", "reconnect", params).await;
    assert_eq!(reconnected["result"]["type"], "replay", "{reconnected}");
    let replayed: Vec<ActionEnvelope> =
        serde_json::from_value(reconnected["result"]["actions"].clone()).unwrap();
    let turns: Vec<String> = replayed
        .iter()
        .filter_map(|e| match &e.action {
            StateAction::ChatTurnStarted(started) => Some(started.turn_id.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(turns, ["a2", "a3", "a4", "a5"], "every turn it missed, none it had");
    let mut copy = a;
    for envelope in replayed {
        copy.apply(envelope);
    }
    assert_eq!(copy.chat, world.chat("ma").await, "the replayed copy equals GET .../chat");

    // Another client that only ever had A replays from its own number.
    assert_eq!(world.event(connect_event("one", Some(&key))).await, 200);
    let mut one = initialize();
    one["clientId"] = json!("one-chat-client");
    world.request("one", "initialize", one).await;
    let subscribed = world.request("one", "subscribe", json!({"channel": "ahp-chat:/ma"})).await;
    let mut copy = Copy::from_snapshot(&subscribed["result"]["snapshot"]);
    assert_eq!(world.event(disconnect_event("one")).await, 200);
    world.turn("driver", "ma", "a6", "While the other is away").await;
    assert_eq!(world.event(connect_event("one2", Some(&key))).await, 200);
    let params = json!({
        "channel": ROOT_RESOURCE_URI,
        "clientId": "one-chat-client",
        "lastSeenServerSeq": copy.last_seq,
        "subscriptions": ["ahp-chat:/ma"]
    });
    let reconnected = world.request("one2", "reconnect", params).await;
    assert_eq!(reconnected["result"]["type"], "replay", "{reconnected}");
    let replayed: Vec<ActionEnvelope> =
        serde_json::from_value(reconnected["result"]["actions"].clone()).unwrap();
    assert!(!replayed.is_empty());
    for envelope in replayed {
        copy.apply(envelope);
    }
    assert_eq!(copy.chat, world.chat("ma").await, "the replayed copy equals GET .../chat");
}

/// A client's numbers come from one counter across functions, and each chat's marks keep the
/// order of its pushes: a block that starts before where the chat's last mark ends (another
/// function numbered a later block first: the pushes crossed) takes no number.
#[tokio::test]
async fn a_clients_numbers_keep_each_chats_order() {
    use turnstone_runtime::ahp::registry::ChatMark;
    let world = World::new().await;
    let registry = Arc::clone(world.ahp.ahp.as_ref().unwrap().registry());
    let mark = |before, after| ChatMark { chat: "x".into(), first: 0, last: 1, before: Some(before), after };
    let first = registry.number("k", "w1", 2, 1_000, &[mark(10, 20)]).await.unwrap();
    assert_eq!(first, Some(1_001), "the counter starts at its floor");
    let next = registry.number("k", "w1", 2, 5, &[mark(20, 30)]).await.unwrap();
    assert_eq!(next, Some(1_003), "numbered on");
    assert_eq!(registry.number("k", "w1", 2, 5, &[mark(10, 20)]).await.unwrap(), None, "crossed");
    assert_eq!(
        registry.number("k", "w2", 1, 5, &[mark(10, 20)]).await.unwrap(),
        Some(1_005),
        "its own marks"
    );
    let ledger = registry.client_ledger("k").await.unwrap().unwrap();
    assert_eq!(ledger.last, 1_005);
    let (_, on_w1, previous) = ledger.marks.iter().find(|(c, _, _)| c == "w1").unwrap();
    assert_eq!(
        (on_w1.first, on_w1.last, on_w1.before, on_w1.after, *previous),
        (1_003, 1_004, Some(20), 30, 1_002)
    );
}

/// The `type` of every `action` among `frames`, in order.
fn action_types(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["method"] == "action")
        .map(|f| f["params"]["action"]["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn a_streaming_reply_reaches_a_subscriber_as_deltas_before_its_commit() {
    let world = World::new().await;
    let key = format!("Bearer {KEY}");
    assert_eq!(world.event(connect_event("c1", Some(&key))).await, 200);
    world.request("c1", "initialize", initialize()).await;
    world.request("c1", "createSession", json!({"channel": "ahp-session:/s1", "provider": "helper"})).await;
    let subscribed = world.request("c1", "subscribe", json!({"channel": "ahp-chat:/s1"})).await;
    let mut copy = Copy::from_snapshot(&subscribed["result"]["snapshot"]);
    let seen = world.management.frames_of("c1").len();

    // The scripted model streams `/long` word by word (276 deltas): the dispatch function
    // pushes them in batches before the commit that records the reply.
    world.turn("c1", "s1", "t1", "/long").await;
    let frames = world.management.frames_of("c1")[seen..].to_vec();
    let types = action_types(&frames);
    let created = types.iter().position(|t| t == "chat/responsePart").expect("the reply's part is created");
    let complete = types.iter().position(|t| t == "chat/turnComplete").expect("the turn completes");
    let deltas: Vec<usize> =
        types.iter().enumerate().filter(|(_, t)| *t == "chat/delta").map(|(i, _)| i).collect();
    assert!(deltas.len() >= 2, "the reply streamed in several batches: {types:?}");
    assert!(
        deltas.iter().all(|&i| created < i && i < complete),
        "deltas grow the part before the commit: {types:?}"
    );
    assert!(
        deltas.len() < 276 / 8,
        "deltas are pushed in batches, not one frame per token: {}",
        deltas.len()
    );
    copy.apply_frames(&frames);
    let chat = world.chat("s1").await;
    assert_eq!(copy.chat, chat, "the copy that saw the stream equals GET /v1/sessions/s1/chat");
    assert!(
        serde_json::to_string(&chat.turns).unwrap().contains("of a long answer from the scripted model"),
        "the long reply is recorded"
    );
}

/// A fake OpenAI Chat Completions endpoint that streams `Hello`, ` there`, waits for `gate`,
/// then streams ` friend.` and ends; its base URL.
async fn gated_model(gate: Arc<tokio::sync::Notify>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let gate = Arc::clone(&gate);
            tokio::spawn(async move {
                // The whole request: its headers, then as many bytes as it says it carries.
                let mut request = Vec::new();
                let mut buf = [0u8; 8192];
                loop {
                    let n = socket.read(&mut buf).await.unwrap();
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap())
                            })
                            .unwrap_or(0);
                        if request.len() >= end + 4 + length {
                            break;
                        }
                    }
                    if n == 0 {
                        return;
                    }
                }
                let chunk = |delta: Value, finish: Value| {
                    let body = json!({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                    format!("data: {body}\n\n")
                };
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                socket.write_all(head.as_bytes()).await.unwrap();
                for text in ["Hello", " there"] {
                    socket.write_all(chunk(json!({"content": text}), Value::Null).as_bytes()).await.unwrap();
                    socket.flush().await.unwrap();
                }
                gate.notified().await;
                socket
                    .write_all(chunk(json!({"content": " friend."}), Value::Null).as_bytes())
                    .await
                    .unwrap();
                socket.write_all(chunk(json!({}), json!("stop")).as_bytes()).await.unwrap();
                socket.write_all(b"data: [DONE]\n\n").await.unwrap();
                socket.shutdown().await.unwrap();
            });
        }
    });
    format!("http://{addr}/v1")
}

#[tokio::test]
async fn a_subscriber_that_joins_mid_stream_gets_the_reply_whole() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let base_url = gated_model(Arc::clone(&gate)).await;
    let config = format!(
        "{CONFIG}\n[llm.o]\ntype = \"openai\"\nbase_url = \"{base_url}\"\n\n[agent.streamer]\nmodel = \"m\"\nllm = \"o\"\nstream = true\n"
    );
    let world = World::with_config(&config).await;
    let key = format!("Bearer {KEY}");
    for connection in ["early", "late"] {
        assert_eq!(world.event(connect_event(connection, Some(&key))).await, 200);
        world.request(connection, "initialize", initialize()).await;
    }
    world
        .request("early", "createSession", json!({"channel": "ahp-session:/s", "provider": "streamer"}))
        .await;
    let subscribed = world.request("early", "subscribe", json!({"channel": "ahp-chat:/s"})).await;
    let mut early = Copy::from_snapshot(&subscribed["result"]["snapshot"]);
    let early_seen = world.management.frames_of("early").len();
    world.start_turn("early", "s", "t1", "greet me").await;

    // While the model waits at the gate, `late` subscribes: the reply's part is not in its
    // snapshot (the log does not hold it yet), so it gets no delta of it.
    let (late_snapshot, late_seen) = tokio::join!(world.dispatch(), async {
        let started = std::time::Instant::now();
        while !action_types(&world.management.frames_of("early")[early_seen..])
            .iter()
            .any(|t| t == "chat/responsePart")
        {
            assert!(started.elapsed() < Duration::from_secs(20), "the stream's first delta reached `early`");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let subscribed = world.request("late", "subscribe", json!({"channel": "ahp-chat:/s"})).await;
        let seen = world.management.frames_of("late").len();
        gate.notify_one();
        (subscribed["result"]["snapshot"].clone(), seen)
    })
    .1;
    let mut late = Copy::from_snapshot(&late_snapshot);
    let snapshot_text = serde_json::to_string(&late.chat).unwrap();
    assert!(!snapshot_text.contains("Hello"), "the snapshot shows no streamed text: {snapshot_text}");

    let chat = world.chat("s").await;
    assert!(serde_json::to_string(&chat.turns).unwrap().contains("Hello there friend."), "{chat:?}");

    let early_frames = world.management.frames_of("early")[early_seen..].to_vec();
    let types = action_types(&early_frames);
    let complete = types.iter().position(|t| t == "chat/turnComplete").expect("the turn completes");
    assert!(
        types[..complete].iter().any(|t| t == "chat/delta"),
        "`early` saw the part grow before the commit: {types:?}"
    );
    early.apply_frames(&early_frames);
    assert_eq!(early.chat, chat, "the copy that saw the stream equals GET .../chat");

    let late_frames = world.management.frames_of("late")[late_seen..].to_vec();
    let types = action_types(&late_frames);
    assert!(!types.iter().any(|t| t == "chat/delta"), "no delta for a part `late` never saw: {types:?}");
    assert!(types.iter().any(|t| t == "chat/responsePart"), "the reply came whole: {types:?}");
    late.apply_frames(&late_frames);
    assert_eq!(late.chat, chat, "the copy that joined mid-stream equals GET .../chat");
}

/// The session ids of the `root/sessionAdded` notifications among `frames`.
fn sessions_added(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["method"] == "root/sessionAdded")
        .map(|f| f["params"]["summary"]["resource"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn root_subscribers_hear_of_the_sessions_they_may_read() {
    let world = World::new().await;
    let (alice, bob) = (format!("Bearer {KEY}"), format!("Bearer {BOB_KEY}"));
    // `root-a` subscribes to the root channel in `initialize`, `root-b` (another caller) with
    // `subscribe`; `quiet` (alice) holds no root subscription.
    for (connection, key) in [("root-a", &alice), ("root-b", &bob), ("quiet", &alice), ("creator", &alice)] {
        assert_eq!(world.event(connect_event(connection, Some(key))).await, 200);
    }
    let mut params = initialize();
    params["initialSubscriptions"] = json!([ROOT_RESOURCE_URI]);
    let initialized = world.request("root-a", "initialize", params).await;
    assert!(initialized["result"]["snapshots"][0]["state"]["agents"].is_array(), "{initialized}");
    world.request("root-b", "initialize", initialize()).await;
    let subscribed = world.request("root-b", "subscribe", json!({"channel": ROOT_RESOURCE_URI})).await;
    assert!(subscribed["result"]["snapshot"].is_object(), "{subscribed}");
    world.request("quiet", "initialize", initialize()).await;
    world.request("creator", "initialize", initialize()).await;

    // A session alice creates over AHP, and one she creates over HTTP: `root-a` hears of both,
    // bob's connection of neither.
    let created = world
        .request("creator", "createSession", json!({"channel": "ahp-session:/a1", "provider": "helper"}))
        .await;
    assert_eq!(created["result"], Value::Null, "{created}");
    let router =
        turnstone_lambda::http::api_router(Arc::clone(&world.ahp.engine.app), world.ahp.http.clone());
    let input =
        json!({"type": "client.message", "agent_id": "helper", "message": {"role": "user", "content": "hi"}});
    let request = axum::http::Request::post("/v1/sessions/a2/inputs")
        .header("authorization", &alice)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(input.to_string()))
        .unwrap();
    let response = router.oneshot(request).await.unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    assert_eq!(sessions_added(&world.management.frames_of("root-a")), ["ahp-session:/a1", "ahp-session:/a2"]);
    assert!(
        sessions_added(&world.management.frames_of("root-b")).is_empty(),
        "bob may not read alice's sessions"
    );
    assert!(sessions_added(&world.management.frames_of("quiet")).is_empty(), "not subscribed to the root");

    // Bob's own session reaches bob's root subscriber only.
    world
        .request("root-b", "createSession", json!({"channel": "ahp-session:/b1", "provider": "helper"}))
        .await;
    assert_eq!(sessions_added(&world.management.frames_of("root-b")), ["ahp-session:/b1"]);
    assert_eq!(sessions_added(&world.management.frames_of("root-a")).len(), 2);

    // Alice disposes of a1 (over AHP) and a2 (over HTTP): `root-a` hears both are gone, bob's
    // connection of neither; the table keeps nothing of them that reads.
    let disposed = world.request("creator", "disposeSession", json!({"channel": "ahp-session:/a1"})).await;
    assert_eq!(disposed["result"], Value::Null, "{disposed}");
    let router =
        turnstone_lambda::http::api_router(Arc::clone(&world.ahp.engine.app), world.ahp.http.clone());
    let request = axum::http::Request::delete("/v1/sessions/a2")
        .header("authorization", &alice)
        .body(axum::body::Body::empty())
        .unwrap();
    let response = router.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let removed = |connection: &str| -> Vec<String> {
        world
            .management
            .frames_of(connection)
            .iter()
            .filter(|f| f["method"] == "root/sessionRemoved")
            .map(|f| f["params"]["session"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(removed("root-a"), ["ahp-session:/a1", "ahp-session:/a2"]);
    assert!(removed("root-b").is_empty(), "bob never knew of alice's sessions");
    let store = &world.ahp.engine.app;
    for gone in ["a1", "a2"] {
        assert!(store.store().load(gone).await.unwrap().is_none(), "{gone} is disposed");
    }

    // After `$disconnect` (and after `unsubscribe`), nothing more goes to the connection.
    let registry = Arc::clone(world.ahp.ahp.as_ref().unwrap().registry());
    assert_eq!(registry.root_subscribers().await.unwrap().len(), 2);
    assert_eq!(world.event(disconnect_event("root-a")).await, 200);
    world.request("root-b", "unsubscribe", json!({"channel": ROOT_RESOURCE_URI})).await;
    assert!(registry.root_subscribers().await.unwrap().is_empty(), "no root subscriber left");
    let before = (world.management.frames_of("root-a").len(), world.management.frames_of("root-b").len());
    world
        .request("creator", "createSession", json!({"channel": "ahp-session:/a3", "provider": "helper"}))
        .await;
    world
        .request("root-b", "createSession", json!({"channel": "ahp-session:/b2", "provider": "helper"}))
        .await;
    assert_eq!(world.management.frames_of("root-a").len(), before.0, "no frame after $disconnect");
    assert!(
        sessions_added(&world.management.frames_of("root-b")[before.1..]).is_empty(),
        "none after unsubscribe"
    );
}

/// The `(status, title)` changes of `session` among `frames` (`root/sessionSummaryChanged`).
fn summary_changes(frames: &[Value], session: &str) -> Vec<(Value, Value)> {
    frames
        .iter()
        .filter(|f| f["method"] == "root/sessionSummaryChanged" && f["params"]["session"] == session)
        .map(|f| (f["params"]["changes"]["status"].clone(), f["params"]["changes"]["title"].clone()))
        .collect()
}

/// `root/sessionSummaryChanged` behind API Gateway: the function whose commit starts or ends a
/// turn, or titles the session, tells the root subscribers that may read it (another caller's
/// hears nothing), with `modifiedAt`; the steps between change neither status nor title and
/// are not told.
#[tokio::test]
async fn root_subscribers_hear_a_sessions_status_and_title_change() {
    let world = World::new().await;
    let (alice, bob) = (format!("Bearer {KEY}"), format!("Bearer {BOB_KEY}"));
    for (connection, key) in [("root-a", &alice), ("root-b", &bob), ("creator", &alice)] {
        assert_eq!(world.event(connect_event(connection, Some(key))).await, 200);
        world.request(connection, "initialize", initialize()).await;
    }
    for connection in ["root-a", "root-b"] {
        world.request(connection, "subscribe", json!({"channel": ROOT_RESOURCE_URI})).await;
    }
    world
        .request("creator", "createSession", json!({"channel": "ahp-session:/s1", "provider": "helper"}))
        .await;
    // The turn starts on the `ahp` function; the `dispatch` function runs it to its end.
    world.turn("creator", "s1", "t1", "Plan the trip").await;
    let (idle, running) = (json!(SessionStatus::Idle.bits()), json!(SessionStatus::InProgress.bits()));
    let frames = world.management.frames_of("root-a");
    let changes = summary_changes(&frames, "ahp-session:/s1");
    assert_eq!(
        changes,
        [(running, json!("Plan the trip")), (idle.clone(), json!("Plan the trip"))],
        "the turn's start (by `ahp`, titled by its message) and end (by `dispatch`): {frames:?}"
    );
    let told = frames.iter().filter(|f| f["method"] == "root/sessionSummaryChanged");
    assert!(told.clone().all(|f| f["params"]["changes"]["modifiedAt"].is_string()));
    assert!(
        summary_changes(&world.management.frames_of("root-b"), "ahp-session:/s1").is_empty(),
        "bob may not read it"
    );

    // A rename (`session/titleChanged`) on the other `ahp` container is told with the new title.
    let rename = json!({"type": "session/titleChanged", "title": "Trip to Lisbon"});
    let params = json!({"channel": "ahp-session:/s1", "clientSeq": 2, "action": rename});
    let renamed = world.request_on(true, "creator", "dispatchAction", params).await;
    assert!(renamed.get("error").is_none(), "{renamed}");
    let changes = summary_changes(&world.management.frames_of("root-a"), "ahp-session:/s1");
    assert_eq!(changes.last(), Some(&(idle, json!("Trip to Lisbon"))), "{changes:?}");
}

/// A client that introduces itself as VS Code reads session URIs in its provider spelling
/// (`<agent>:/<id>`) behind API Gateway as on the local host: its connection and root
/// subscription record the spelling, so `listSessions` on any container and the root
/// notifications any function pushes use it; another client keeps `ahp-session:/<id>`.
#[tokio::test]
async fn a_vs_code_connection_reads_provider_scheme_uris_on_every_function() {
    let world = World::new().await;
    let alice = format!("Bearer {KEY}");
    for connection in ["vscode", "plain"] {
        assert_eq!(world.event(connect_event(connection, Some(&alice))).await, 200);
    }
    let mut params = initialize();
    params["clientInfo"] = json!({"name": "vscode-editor-window", "title": "Visual Studio Code"});
    params["initialSubscriptions"] = json!([ROOT_RESOURCE_URI]);
    world.request("vscode", "initialize", params).await;
    world.request("plain", "initialize", initialize()).await;
    world.request("plain", "subscribe", json!({"channel": ROOT_RESOURCE_URI})).await;

    world.request("vscode", "createSession", json!({"channel": "helper:/v1", "provider": "helper"})).await;
    world.turn("vscode", "v1", "t1", "Hello").await;
    let listed =
        world.request_on(true, "vscode", "listSessions", json!({"channel": ROOT_RESOURCE_URI})).await;
    assert_eq!(listed["result"]["items"][0]["resource"], "helper:/v1", "{listed}");
    let plain = world.request_on(true, "plain", "listSessions", json!({"channel": ROOT_RESOURCE_URI})).await;
    assert_eq!(plain["result"]["items"][0]["resource"], "ahp-session:/v1", "{plain}");
    assert_eq!(sessions_added(&world.management.frames_of("vscode")), ["helper:/v1"]);
    assert_eq!(sessions_added(&world.management.frames_of("plain")), ["ahp-session:/v1"]);
    assert_eq!(summary_changes(&world.management.frames_of("vscode"), "helper:/v1").len(), 2);
    assert_eq!(summary_changes(&world.management.frames_of("plain"), "ahp-session:/v1").len(), 2);
}

/// A `$connect` event whose URL carries `query` (`?tkn=...`, where a browser's WebSocket puts
/// its token), with `authorization` on the upgrade if given.
fn connect_with_query(
    connection: &str,
    authorization: Option<&str>,
    query: &[(&str, &str)],
) -> ApiGatewayWebsocketProxyRequest {
    let mut event = serde_json::to_value(connect_event(connection, authorization)).unwrap();
    let single: serde_json::Map<String, Value> =
        query.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    let multi: serde_json::Map<String, Value> =
        query.iter().map(|(k, v)| ((*k).to_owned(), json!([v]))).collect();
    event["queryStringParameters"] = Value::Object(single);
    event["multiValueQueryStringParameters"] = Value::Object(multi);
    serde_json::from_value(event).unwrap()
}

/// `$connect` takes the token from `tkn` when the upgrade has no `Authorization` header; a
/// connection whose token expired (its records carry the expiry, as `$connect` and `subscribe`
/// record a JWT's) is pushed nothing, its messages are refused with -32007, and its records go.
#[tokio::test]
async fn connections_take_tkn_and_end_with_their_token() {
    let world = World::new().await;
    let registry = Arc::clone(world.ahp.ahp.as_ref().unwrap().registry());
    assert_eq!(world.event(connect_with_query("q-bad", None, &[("tkn", "nope")])).await, 401);
    assert_eq!(world.event(connect_with_query("q-both", Some("Bearer nope"), &[("tkn", KEY)])).await, 401);
    assert_eq!(world.event(connect_with_query("q1", None, &[("tkn", KEY)])).await, 200);
    world.request("q1", "initialize", initialize()).await;
    let created = world
        .request("q1", "createSession", json!({"channel": "ahp-session:/s1", "provider": "helper"}))
        .await;
    assert_eq!(created["result"], Value::Null, "{created}");
    world.request("q1", "subscribe", json!({"channel": "ahp-chat:/s1"})).await;
    let record = registry.connection("q1").await.unwrap().unwrap();
    assert_eq!(record.chats, vec![turnstone_engine::ids::SessionId::from("s1")], "{record:?}");
    assert_eq!(
        registry.subscribers(&"s1".into()).await.unwrap()[0].expires_at,
        None,
        "a key does not expire"
    );

    // Alice again, by a token that expired 10 s ago, subscribed to s1's chat and the root.
    #[allow(clippy::disallowed_methods)] // a token's expiry is wall-clock time
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let past = now - 10;
    let turnstone_runtime::auth::Caller::Client { identity, .. } =
        turnstone_runtime::auth::Caller::client(turnstone_runtime::auth::Kind::Client, "alice")
    else {
        unreachable!()
    };
    let expired = turnstone_runtime::auth::Caller::Client { identity, expires_at: Some(past) };
    registry.connect("old", &expired).await.unwrap();
    registry.subscribe("old", &"s1".into(), 0, Some(past), "old-client").await.unwrap();
    registry.subscribe_root("old", &expired, Default::default()).await.unwrap();
    let subscribers = registry.subscribers(&"s1".into()).await.unwrap();
    assert_eq!(subscribers.iter().find(|s| s.connection_id == "old").unwrap().expires_at, Some(past));

    // A turn reaches q1 and nothing reaches `old`, whose records are removed.
    let seen = world.management.frames_of("q1").len();
    world.turn("q1", "s1", "t1", "hello").await;
    assert!(world.management.frames_of("q1").len() > seen, "the turn was pushed to q1");
    assert!(world.management.frames_of("old").is_empty(), "nothing is pushed past the expiry");
    assert!(registry.connection("old").await.unwrap().is_none(), "its records are removed");
    let subscribers = registry.subscribers(&"s1".into()).await.unwrap();
    assert_eq!(subscribers.iter().map(|s| s.connection_id.as_str()).collect::<Vec<_>>(), ["q1"]);
    assert!(registry.root_subscribers().await.unwrap().is_empty());
    assert_eq!(*world.management.closed.lock().unwrap(), ["old"], "API Gateway is told to close it");

    // A message on an expired connection is refused with -32007, and the connection is gone.
    registry.connect("old2", &expired).await.unwrap();
    let refused = world.request("old2", "listSessions", json!({"channel": ROOT_RESOURCE_URI})).await;
    assert_eq!(refused["error"]["code"], -32007, "{refused}");
    assert!(registry.connection("old2").await.unwrap().is_none());
    assert_eq!(*world.management.closed.lock().unwrap(), ["old", "old2"]);
}

/// Active clients behind API Gateway are recorded with the connections: the tools a client
/// set on one function container are offered to the turn it starts on another, every
/// container's snapshot shows the client, and its leaving on one is seen on the other.
#[tokio::test]
async fn active_clients_hold_across_functions() {
    let world = World::new().await;
    assert_eq!(world.event(connect_event("ac1", Some(&format!("Bearer {KEY}")))).await, 200);
    world.request("ac1", "initialize", initialize()).await;
    let tool = json!({"name": "readFile", "description": "Reads a file", "inputSchema": {"type": "object"}});
    let active = json!({"clientId": "test-client", "tools": [tool]});
    let params = json!({"channel": "ahp-session:/ac", "provider": "helper", "activeClient": active});
    let created = world.request("ac1", "createSession", params).await;
    assert_eq!(created["result"], Value::Null, "{created}");

    // The other container has never seen the client.
    let subscribed = world.request_on(true, "ac1", "subscribe", json!({"channel": "ahp-session:/ac"})).await;
    let clients = &subscribed["result"]["snapshot"]["state"]["activeClients"];
    assert_eq!(clients[0]["clientId"], "test-client", "{subscribed}");
    assert_eq!(clients[0]["tools"][0]["name"], "readFile");
    world.start_turn_on(true, "ac1", "ac", "t1", "Read the README.").await;
    let (session, _) = world.ahp.engine.app.load("ac").await.unwrap();
    let turn = session.turn(&"t1".into()).expect("the turn started");
    let offered: Vec<&str> = turn.client_tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(offered, ["readFile"], "the client's tools ride on the turn it started elsewhere");
    assert_eq!(turn.client_id.as_deref(), Some("test-client"));

    // It leaves on the other container; the first one sees it gone.
    let removed = json!({"type": "session/activeClientRemoved", "clientId": "test-client"});
    let params = json!({"channel": "ahp-session:/ac", "clientSeq": 2, "action": removed});
    world.request_on(true, "ac1", "dispatchAction", params).await;
    let subscribed = world.request("ac1", "subscribe", json!({"channel": "ahp-session:/ac"})).await;
    assert_eq!(subscribed["result"]["snapshot"]["state"]["activeClients"], json!([]), "{subscribed}");
}

/// A client whose last connection ends leaves the sessions it is active in after
/// `active_client_grace_secs`, told to their channels' subscribers by the `dispatch` function
/// that the queue wakes then: unless it connected again meanwhile, on any container.
#[tokio::test]
async fn a_client_gone_past_its_grace_leaves_its_sessions() {
    let world = World::with_config(&format!("{CONFIG}\n[limits]\nactive_client_grace_secs = 1\n")).await;
    let bearer = format!("Bearer {KEY}");
    for connection in ["window", "observer"] {
        assert_eq!(world.event(connect_event(connection, Some(&bearer))).await, 200);
    }
    world.request("window", "initialize", initialize()).await;
    let mut observer = initialize();
    observer["clientId"] = json!("observer-client");
    world.request("observer", "initialize", observer).await;
    for session in ["ahp-session:/d1", "ahp-session:/d2"] {
        let active = json!({"clientId": "test-client", "tools": []});
        let params = json!({"channel": session, "provider": "helper", "activeClient": active});
        assert_eq!(world.request("window", "createSession", params).await["result"], Value::Null);
        world.request("observer", "subscribe", json!({"channel": session})).await;
    }
    let left = |session: &str| {
        envelopes_on(&world.management.frames_of("observer"), session)
            .iter()
            .any(|e| e["action"] == json!({"type": "session/activeClientRemoved", "clientId": "test-client"}))
    };

    // Back on another container within the grace: it stays.
    assert_eq!(world.event(disconnect_event("window")).await, 200);
    assert_eq!(world.event_on(true, connect_event("window2", Some(&bearer))).await, 200);
    world.request_on(true, "window2", "initialize", initialize()).await;
    world.dispatch().await;
    assert!(!left("ahp-session:/d1") && !left("ahp-session:/d2"));

    // Gone for good: it leaves both, once the grace is over.
    assert_eq!(world.event_on(true, disconnect_event("window2")).await, 200);
    assert!(!left("ahp-session:/d1"), "not before the grace is over");
    // A batch may hold some of the wake-ups due (the first visit's come late are no-ops).
    for _ in 0..4 {
        world.dispatch().await;
        if left("ahp-session:/d1") && left("ahp-session:/d2") {
            break;
        }
    }
    assert!(left("ahp-session:/d1") && left("ahp-session:/d2"));
    let subscribed = world.request("observer", "subscribe", json!({"channel": "ahp-session:/d2"})).await;
    assert_eq!(subscribed["result"]["snapshot"]["state"]["activeClients"], json!([]), "{subscribed}");
}

/// The `action` envelopes among `frames` on `channel`.
fn envelopes_on(frames: &[Value], channel: &str) -> Vec<Value> {
    frames
        .iter()
        .filter(|f| f["method"] == "action" && f["params"]["channel"] == channel)
        .map(|f| f["params"].clone())
        .collect()
}

/// A session channel behind API Gateway: its subscription is recorded with the channel as the
/// client spelled it, so what a client dispatches there (joining the active clients, leaving,
/// renaming) is echoed with its origin to every subscriber of it, on every function
/// container, and the commits of any function tell it its chat's status; numbered by the
/// client's one counter, with its chats' actions; after `unsubscribe` nothing more comes.
#[tokio::test]
async fn a_session_channel_echoes_what_its_clients_dispatch_across_functions() {
    let world = World::new().await;
    for connection in ["window", "other"] {
        assert_eq!(world.event(connect_event(connection, Some(&format!("Bearer {KEY}")))).await, 200);
    }
    let mut params = initialize();
    params["clientInfo"] = json!({"name": "vscode-editor-window"});
    world.request("window", "initialize", params).await;
    world.request("other", "initialize", initialize()).await;
    world.request("window", "createSession", json!({"channel": "helper:/se", "provider": "helper"})).await;
    world.request("window", "subscribe", json!({"channel": "helper:/se"})).await;
    world.request_on(true, "other", "subscribe", json!({"channel": "ahp-session:/se"})).await;

    // The window joins through the second container; both subscribers hear it.
    let active =
        json!({"type": "session/activeClientSet", "activeClient": {"clientId": "test-client", "tools": []}});
    let params = json!({"channel": "helper:/se", "clientSeq": 1, "action": active});
    let answered = world.request_on(true, "window", "dispatchAction", params).await;
    assert!(answered.get("error").is_none(), "{answered}");
    let mine = envelopes_on(&world.management.frames_of("window"), "helper:/se");
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(mine[0]["action"]["type"], "session/activeClientSet");
    assert_eq!(mine[0]["origin"], json!({"clientId": "test-client", "clientSeq": 1}));
    let theirs = envelopes_on(&world.management.frames_of("other"), "ahp-session:/se");
    assert_eq!(theirs.len(), 1, "spelled as that client subscribed: {theirs:?}");

    // A rename on the first container: echoed once, with its origin, numbered on.
    let rename = json!({"type": "session/titleChanged", "title": "Deploy review"});
    let params = json!({"channel": "helper:/se", "clientSeq": 2, "action": rename});
    world.request("window", "dispatchAction", params).await;
    let mine = envelopes_on(&world.management.frames_of("window"), "helper:/se");
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert_eq!(mine[1]["action"]["title"], "Deploy review");
    assert_eq!(mine[1]["origin"]["clientSeq"], 2);
    // A turn: its chat's status in the catalog as it starts (on `ahp`) and ends (on
    // `dispatch`); the title it keeps is no echo again.
    world.turn("window", "se", "t1", "Hello").await;
    let mine = envelopes_on(&world.management.frames_of("window"), "helper:/se");
    let kinds: Vec<&str> = mine.iter().map(|e| e["action"]["type"].as_str().unwrap_or_default()).collect();
    assert_eq!(
        kinds,
        ["session/activeClientSet", "session/titleChanged", "session/chatUpdated", "session/chatUpdated"],
        "{mine:#?}"
    );
    let statuses: Vec<&Value> = mine[2..].iter().map(|e| &e["action"]["changes"]["status"]).collect();
    assert_eq!(statuses, [&json!(SessionStatus::InProgress.bits()), &json!(SessionStatus::Idle.bits())]);
    // One number for the window, on every channel, whichever function sent it.
    let numbers: Vec<u64> = world
        .management
        .frames_of("window")
        .iter()
        .filter(|f| f["method"] == "action")
        .map(|f| f["params"]["serverSeq"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers.len(), mine.len());
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");

    // Unsubscribed, `other` hears nothing more.
    world.request("other", "unsubscribe", json!({"channel": "ahp-session:/se"})).await;
    let heard = envelopes_on(&world.management.frames_of("other"), "ahp-session:/se").len();
    let left = json!({"type": "session/activeClientRemoved", "clientId": "test-client"});
    let params = json!({"channel": "helper:/se", "clientSeq": 3, "action": left});
    world.request("window", "dispatchAction", params).await;
    assert_eq!(envelopes_on(&world.management.frames_of("window"), "helper:/se").len(), 5);
    assert_eq!(envelopes_on(&world.management.frames_of("other"), "ahp-session:/se").len(), heard);
}

/// An HS256 JWT of `sub` expiring at `exp` (Unix seconds).
fn jwt(sub: &str, exp: u64) -> String {
    let claims = json!({"sub": sub, "exp": exp});
    let key = jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes());
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
}

fn now_secs() -> u64 {
    #[allow(clippy::disallowed_methods)] // a token's expiry is wall-clock time
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// AHP's `authenticate` behind API Gateway, as on the local host: a renewed JWT of the same
/// caller moves the connection's expiry on in every record (its own, its chat and root
/// subscriptions), so pushes and messages go on past the first token's expiry; another
/// caller's token, a bad one and an expired one are refused, and change nothing.
#[tokio::test]
async fn authenticate_renews_a_connections_token_across_functions() {
    let world = World::new().await;
    let registry = Arc::clone(world.ahp.ahp.as_ref().unwrap().registry());
    let soon = now_secs() + 3;
    assert_eq!(world.event(connect_with_query("j1", None, &[("tkn", &jwt("carol", soon))])).await, 200);
    world.request("j1", "initialize", initialize()).await;
    world.request("j1", "createSession", json!({"channel": "ahp-session:/j", "provider": "helper"})).await;
    world.request("j1", "subscribe", json!({"channel": "ahp-chat:/j"})).await;
    world.request("j1", "subscribe", json!({"channel": ROOT_RESOURCE_URI})).await;
    assert_eq!(registry.subscribers(&"j".into()).await.unwrap()[0].expires_at, Some(soon));

    let refused = |answer: &Value, code: i64| {
        assert_eq!(answer["error"]["code"], code, "{answer}");
    };
    let auth = |token: String| json!({"channel": ROOT_RESOURCE_URI, "resource": "turnstone", "token": token});
    refused(&world.request("j1", "authenticate", auth(jwt("dave", now_secs() + 600))).await, -32009);
    refused(&world.request("j1", "authenticate", auth("not-a-token".to_owned())).await, -32007);
    refused(&world.request("j1", "authenticate", auth(jwt("carol", now_secs() - 5))).await, -32007);
    assert_eq!(registry.connection("j1").await.unwrap().unwrap().caller.expires_at(), Some(soon));

    let later = now_secs() + 600;
    let renewed = world.request("j1", "authenticate", auth(jwt("carol", later))).await;
    assert!(renewed.get("error").is_none(), "{renewed}");
    assert_eq!(registry.connection("j1").await.unwrap().unwrap().caller.expires_at(), Some(later));
    assert_eq!(registry.subscribers(&"j".into()).await.unwrap()[0].expires_at, Some(later));
    let root = registry.root_subscribers().await.unwrap();
    assert_eq!(root.iter().find(|r| r.connection_id == "j1").unwrap().caller.expires_at(), Some(later));

    // Past the first token's expiry, the connection is served and pushed to.
    while now_secs() <= soon {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let seen = world.management.frames_of("j1").len();
    world.turn("j1", "j", "t1", "hello").await;
    assert!(world.management.frames_of("j1").len() > seen, "the turn was pushed");
    let listed = world.request("j1", "listSessions", json!({"channel": ROOT_RESOURCE_URI})).await;
    assert!(listed.get("error").is_none(), "{listed}");
    assert!(world.management.closed.lock().unwrap().is_empty());
}

/// `[limits] sockets_per_caller` behind API Gateway: the connections a caller holds are counted
/// in the table (one item each, removed on `$disconnect`), so the cap holds across every
/// function container; `$connect` past it is answered 429.
#[tokio::test(flavor = "multi_thread")]
async fn sockets_per_caller_hold_across_functions() {
    let config = format!("{CONFIG}\n[limits]\nsockets_per_caller = 2\n");
    let world = World::with_config(&config).await;
    let alice = format!("Bearer {KEY}");
    assert_eq!(world.event(connect_event("cap1", Some(&alice))).await, 200);
    assert_eq!(world.event(connect_event("cap2", Some(&alice))).await, 200);
    assert_eq!(world.event(connect_event("cap3", Some(&alice))).await, 429);
    // Another caller's count is its own.
    assert_eq!(world.event(connect_event("bob1", Some(&format!("Bearer {BOB_KEY}")))).await, 200);
    // A closed connection gives its place back.
    assert_eq!(world.event(disconnect_event("cap1")).await, 200);
    assert_eq!(world.event(connect_event("cap4", Some(&alice))).await, 200);
    assert_eq!(world.event(connect_event("cap5", Some(&alice))).await, 429);
}

/// The functions fail closed: without `[auth]` a deployment serves no one (503
/// `auth_not_configured` on the API and on `$connect`, the health check aside), unless the
/// configuration says `[server] allow_anonymous = true`.
#[tokio::test(flavor = "multi_thread")]
async fn without_auth_the_functions_serve_no_one_unless_allowed() {
    let anonymous = CONFIG.split("[auth]").next().unwrap().to_owned();
    let post = |world: &World| {
        let router =
            turnstone_lambda::http::api_router(Arc::clone(&world.ahp.engine.app), world.ahp.http.clone());
        let input = json!({"type": "client.message", "agent_id": "helper", "message": {"role": "user", "content": "hi"}});
        let request = axum::http::Request::post("/v1/sessions/open1/inputs")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(input.to_string()))
            .unwrap();
        async move {
            let response = router.oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            (status, serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null))
        }
    };
    let world = World::with_config(&anonymous).await;
    let (status, body) = post(&world).await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("auth_not_configured")), "{body}");
    let router =
        turnstone_lambda::http::api_router(Arc::clone(&world.ahp.engine.app), world.ahp.http.clone());
    let health =
        router.oneshot(axum::http::Request::get("/healthz").body(axum::body::Body::empty()).unwrap());
    assert_eq!(health.await.unwrap().status(), 200);
    assert_eq!(world.event(connect_event("anon", None)).await, 503);
    assert!(world.ahp.engine.app.session("open1").await.is_err(), "nothing was created");

    // Said so in the configuration: open.
    let world = World::with_config(&format!("[server]\nallow_anonymous = true\n{anonymous}")).await;
    let (status, body) = post(&world).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(world.event(connect_event("anon", None)).await, 200);
}

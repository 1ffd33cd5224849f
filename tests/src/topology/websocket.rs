//! API Gateway's WebSocket API in front of the ahp function, with its Management API: clients
//! connect to `ws://…/{stage}`; each upgrade, message and close becomes the event API Gateway
//! sends (`$connect`, `$default`, `$disconnect`), handed to the function's handler
//! (`turnstone_lambda::websocket::handle`, what `run_ahp` runs) under the function's timeout;
//! the functions answer and push through `POST|DELETE|GET /{stage}/@connections/{id}`, which
//! reaches this API only through the IAM gate (`execute-api:ManageConnections`).
//!
//! Rules, from API Gateway's developer guide:
//! - "Working with routes for WebSocket APIs": `$connect` runs before the connection is open,
//!   and an integration that does not answer 2xx refuses it (the client's upgrade fails with
//!   that status); each message takes the route its `RouteSelectionExpression`
//!   (`$request.body.method`) selects, and `$default` when no route has that key (the template
//!   defines none); `$disconnect` runs once the connection has closed, whoever closed it.
//! - "Use @connections commands in your backend service": `POST` sends its body to the client
//!   as one message, `DELETE` closes the connection, `GET` describes it; for a connection that
//!   is not open (still in `$connect`, or gone) each answers 410 `GoneException`.
//! - "Quotas for WebSocket APIs": a message is at most 128 KB; a bigger one from a client
//!   closes the connection (1009), a bigger `POST` is refused with 413
//!   `PayloadTooLargeException`. Not modelled: the 10-minute idle timeout and the 2-hour
//!   connection limit (no test runs that long).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value as Json, json};
use tokio::sync::mpsc;
use turnstone_aws::moto;
use turnstone_runtime::ahp::Gateway;
use turnstone_runtime::app::App;

use super::ACCOUNT;

/// The largest message, either way.
const MAX_MESSAGE: usize = 128 * 1024;

/// What the Management API hands an open connection.
enum Out {
    Message(String),
    Close,
}

/// The WebSocket API's stage with the ahp function behind every route.
pub struct WebSocketApi {
    pub api_id: String,
    pub stage: String,
    app: Arc<App>,
    gateway: Arc<Gateway>,
    /// The ahp function's timeout.
    timeout: Duration,
    /// The open connections.
    open: Mutex<BTreeMap<String, mpsc::UnboundedSender<Out>>>,
}

impl WebSocketApi {
    pub fn new(
        api_id: String,
        stage: String,
        app: Arc<App>,
        gateway: Arc<Gateway>,
        timeout: Duration,
    ) -> Self {
        WebSocketApi { api_id, stage, app, gateway, timeout, open: Mutex::new(BTreeMap::new()) }
    }

    /// The stage's routes: the upgrade at `/{stage}`, the Management API below it.
    pub fn router(self: Arc<Self>) -> axum::Router {
        axum::Router::new()
            .route("/{stage}", get(upgrade))
            .route("/{stage}/@connections/{id}", get(describe).post(post_to).delete(delete))
            .with_state(self)
    }

    fn open(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, mpsc::UnboundedSender<Out>>> {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The function's answer to one event, or `None` when the invocation failed or timed out.
    async fn invoke(&self, event: Json) -> Option<ApiGatewayProxyResponse> {
        // The stand-in's events are AWS's format: one the function cannot read is this code's bug.
        let request: ApiGatewayWebsocketProxyRequest =
            serde_json::from_value(event).unwrap_or_else(|e| panic!("not a WebSocket event: {e}"));
        let handled = turnstone_lambda::websocket::handle(&self.app, &self.gateway, request);
        match tokio::time::timeout(self.timeout, handled).await {
            Ok(response) => Some(response),
            Err(_) => {
                tracing::warn!("the ahp function timed out");
                None
            }
        }
    }

    /// The `requestContext` of an event of connection `id`.
    fn context(&self, route: &str, event_type: &str, id: &str) -> Json {
        let now = now_ms();
        json!({
            "routeKey": route,
            "eventType": event_type,
            "messageDirection": "IN",
            "stage": self.stage,
            "connectedAt": now,
            "requestTimeEpoch": now,
            "identity": {"sourceIp": "127.0.0.1"},
            "requestId": moto::unique("request"),
            "extendedRequestId": moto::unique("request"),
            "domainName": format!("{}.execute-api.{}.amazonaws.com", self.api_id, super::REGION),
            "connectionId": id,
            "apiId": self.api_id,
            "accountId": ACCOUNT,
        })
    }

    /// `$disconnect` of connection `id`, once it has closed.
    async fn disconnected(&self, id: &str, code: u16, reason: &str) {
        self.open().remove(id);
        let mut context = self.context("$disconnect", "DISCONNECT", id);
        context["disconnectStatusCode"] = json!(code);
        context["disconnectReason"] = json!(reason);
        self.invoke(json!({"requestContext": context, "isBase64Encoded": false})).await;
    }
}

/// The upgrade: `$connect` first; the socket opens only if it answered 2xx.
async fn upgrade(
    State(api): State<Arc<WebSocketApi>>,
    Path(stage): Path<String>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response<Body> {
    if stage != api.stage {
        return status(StatusCode::FORBIDDEN, "Forbidden");
    }
    let id = moto::unique("conn");
    let mut single = serde_json::Map::new();
    let mut multi = serde_json::Map::new();
    for (name, value) in &headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        single.insert(name.as_str().to_owned(), json!(value));
        multi.insert(name.as_str().to_owned(), json!([value]));
    }
    let mut event = json!({
        "headers": single,
        "multiValueHeaders": multi,
        "requestContext": api.context("$connect", "CONNECT", &id),
        "isBase64Encoded": false,
    });
    if !query.is_empty() {
        event["queryStringParameters"] = json!(query);
        event["multiValueQueryStringParameters"] =
            json!(query.iter().map(|(k, v)| (k.clone(), json!([v]))).collect::<serde_json::Map<_, _>>());
    }
    let answered = api.invoke(event).await;
    let code = answered.as_ref().and_then(|r| u16::try_from(r.status_code).ok()).unwrap_or(500);
    if !(200..300).contains(&code) {
        // Refused: the connection never opened, so no `$disconnect` follows.
        return status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), "Forbidden");
    }
    // The subprotocol the integration chose goes into the handshake's answer ("Set up a
    // $connect route that requires a WebSocket subprotocol": the $connect integration returns
    // `Sec-WebSocket-Protocol`, API Gateway answers the upgrade with it).
    let chosen = answered
        .as_ref()
        .and_then(|r| r.headers.get("sec-websocket-protocol"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (tx, rx) = mpsc::unbounded_channel();
    api.open().insert(id.clone(), tx);
    upgrade
        .protocols(chosen)
        .max_message_size(MAX_MESSAGE)
        .on_upgrade(move |socket| connection(api, id, socket, rx))
}

/// One open connection: its messages to `$default`, one at a time, and the Management API's
/// messages and close out; `$disconnect` when it ends.
async fn connection(
    api: Arc<WebSocketApi>,
    id: String,
    socket: WebSocket,
    mut out: mpsc::UnboundedReceiver<Out>,
) {
    let (mut sink, mut stream) = socket.split();
    let writer = tokio::spawn(async move {
        while let Some(next) = out.recv().await {
            match next {
                Out::Message(text) => {
                    if sink.send(Message::Text(text.into())).await.is_err() {
                        return;
                    }
                }
                Out::Close => {
                    let frame = CloseFrame { code: 1000, reason: "".into() };
                    let _ = sink.send(Message::Close(Some(frame))).await;
                    return;
                }
            }
        }
    });
    let (mut code, mut reason) = (1005, "Client-side close frame status not set".to_owned());
    while let Some(received) = stream.next().await {
        let body = match received {
            Ok(Message::Text(text)) => text.to_string(),
            Ok(Message::Binary(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            Ok(Message::Close(frame)) => {
                if let Some(frame) = frame {
                    (code, reason) = (frame.code, frame.reason.to_string());
                }
                break;
            }
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Err(e) => {
                // Among others: a message over 128 KB (axum's limit above).
                (code, reason) = (1009, e.to_string());
                break;
            }
        };
        let mut context = api.context("$default", "MESSAGE", &id);
        context["messageId"] = json!(moto::unique("message"));
        api.invoke(json!({"requestContext": context, "body": body, "isBase64Encoded": false})).await;
    }
    writer.abort();
    api.disconnected(&id, code, &reason).await;
}

/// `GET @connections/{id}`: the connection, if it is open.
async fn describe(
    State(api): State<Arc<WebSocketApi>>,
    Path((_, id)): Path<(String, String)>,
) -> Response<Body> {
    if !api.open().contains_key(&id) {
        return gone();
    }
    json_response(StatusCode::OK, json!({"connectedAt": now_ms(), "identity": {"sourceIp": "127.0.0.1"}}))
}

/// `POST @connections/{id}`: the body, as one message to the client.
async fn post_to(
    State(api): State<Arc<WebSocketApi>>,
    Path((_, id)): Path<(String, String)>,
    body: Bytes,
) -> Response<Body> {
    if body.len() > MAX_MESSAGE {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLargeException", "Payload too large");
    }
    let sent =
        api.open().get(&id).map(|tx| tx.send(Out::Message(String::from_utf8_lossy(&body).into_owned())));
    match sent {
        Some(Ok(())) => status(StatusCode::OK, ""),
        _ => gone(),
    }
}

/// `DELETE @connections/{id}`: closes the connection (its `$disconnect` follows).
async fn delete(
    State(api): State<Arc<WebSocketApi>>,
    Path((_, id)): Path<(String, String)>,
) -> Response<Body> {
    match api.open().remove(&id) {
        Some(tx) => {
            let _ = tx.send(Out::Close);
            status(StatusCode::NO_CONTENT, "")
        }
        None => gone(),
    }
}

fn gone() -> Response<Body> {
    error(StatusCode::GONE, "GoneException", "")
}

fn error(code: StatusCode, kind: &str, message: &str) -> Response<Body> {
    let mut response = json_response(code, json!({"message": message}));
    if let Ok(value) = kind.parse() {
        response.headers_mut().insert("x-amzn-errortype", value);
    }
    response
}

fn json_response(code: StatusCode, body: Json) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
    response
}

fn status(code: StatusCode, text: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(text.to_owned()));
    *response.status_mut() = code;
    response
}

fn now_ms() -> i64 {
    use turnstone_runtime::clock::{Clock, SystemClock};
    SystemClock.now().0
}

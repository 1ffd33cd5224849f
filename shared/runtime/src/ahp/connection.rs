//! One AHP connection: reads the client's JSON-RPC frames in order, answers each request once,
//! and holds the connection's subscriptions (each chat channel runs as its own task that
//! writes into the connection's one outgoing queue, so a response goes out before the actions
//! of the subscription it opened).

use std::collections::HashMap;
use std::sync::Arc;

use ahp_types::actions::{ActionEnvelope, ActionOrigin};
use ahp_types::commands::{
    CreateChatParams, CreateSessionParams, DispatchActionParams, DisposeSessionParams, FetchTurnsParams,
    FetchTurnsResult, Implementation, InitializeParams, InitializeResult, ListSessionsParams,
    ReconnectParams, SubscribeParams, SubscribeResult, UnsubscribeParams,
};
use ahp_types::common::{ROOT_RESOURCE_URI, Uri};
use ahp_types::errors::{UnsupportedProtocolVersionErrorData, ahp_error_codes, json_rpc_error_codes};
use ahp_types::state::Snapshot;
use ahp_types::version::{SUPPORTED_PROTOCOL_VERSIONS, negotiate_protocol_version};
use axum::extract::ws::{Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use turnstone_engine::ids::SessionId;
use turnstone_engine::session::Session;

use super::AhpHost;
use super::channels::{ChatFeed, Control, Live, follow, root_snapshot};
use super::dispatch::dispatch;
use super::reconnect::reconnect;
use super::rpc::{self, Incoming, RpcError};
use super::sessions::{self, internal, not_found, reachable, session_id};
use crate::auth::{Access, Caller};

/// Frames queued for the client before the channels wait for it (back-pressure, not loss).
const OUT_BUFFER: usize = 1024;
/// Commands queued per chat channel.
const CONTROL_BUFFER: usize = 16;

/// Serves one upgraded connection of `caller` until either side ends it.
pub async fn serve(socket: WebSocket, host: Arc<AhpHost>, caller: Caller) {
    let (mut sink, mut stream) = socket.split();
    let (out, mut queued) = mpsc::channel::<String>(OUT_BUFFER);
    let writer = tokio::spawn(async move {
        while let Some(text) = queued.recv().await {
            if sink.send(Message::Text(text.into())).await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });
    let mut connection =
        Connection { host, caller, out, client_id: String::new(), subscriptions: HashMap::new() };
    while let Some(Ok(message)) = stream.next().await {
        let text = match message {
            Message::Text(text) => text,
            Message::Close(_) => break,
            // Pings are answered by the WebSocket layer; AHP speaks text only.
            _ => continue,
        };
        if !connection.handle(text.as_str()).await {
            break;
        }
    }
    drop(connection);
    // The writer ends once every channel task (aborted with the connection) let go.
    let _ = writer.await;
}

/// A channel a URI names, resolved for a caller.
pub(crate) enum Channel {
    Root,
    Session(Box<Session>),
    Chat(SessionId),
}

/// A subscription opened and not yet running.
pub(crate) enum Subscribed {
    Root,
    Session,
    Chat { feed: Box<ChatFeed>, live: Live },
}

/// A subscription the connection holds.
enum Held {
    Root(JoinHandle<()>),
    Session,
    Chat { control: mpsc::Sender<Control>, task: JoinHandle<()> },
}

impl Held {
    fn stop(&self) {
        match self {
            Held::Root(task) | Held::Chat { task, .. } => task.abort(),
            Held::Session => {}
        }
    }
}

/// The channel `uri` names, if `caller` may read it.
pub(crate) async fn resolve(host: &AhpHost, caller: &Caller, uri: &str) -> Result<Channel, RpcError> {
    if uri == ROOT_RESOURCE_URI {
        return Ok(Channel::Root);
    }
    if let Some(id) = session_id(uri, "ahp-session") {
        let session = reachable(host, caller, &id, Access::Read, uri).await?;
        return Ok(Channel::Session(Box::new(session)));
    }
    if let Some(id) = session_id(uri, "ahp-chat") {
        reachable(host, caller, &id, Access::Read, uri).await?;
        return Ok(Channel::Chat(id));
    }
    Err(RpcError::new(ahp_error_codes::NOT_FOUND, format!("no channel {uri} on this host")))
}

/// Opens `channel`: its snapshot (a chat's with at most `turns` turns), and the subscription.
pub(crate) async fn open(
    host: &AhpHost,
    caller: &Caller,
    channel: Channel,
    turns: Option<usize>,
) -> Result<(Snapshot, Subscribed), RpcError> {
    match channel {
        Channel::Root => Ok((root_snapshot(&host.app), Subscribed::Root)),
        Channel::Session(session) => {
            Ok((sessions::snapshot(host, caller, &session).await?, Subscribed::Session))
        }
        Channel::Chat(id) => {
            let live = Live::follow(&host.app, &id).await.map_err(internal)?;
            let mut feed = ChatFeed::open(&host.app, id).await.map_err(internal)?;
            feed.catch_up(&host.app, |_| {}).await.map_err(internal)?;
            feed.skip_running(&host.app).await;
            Ok((feed.snapshot(turns), Subscribed::Chat { feed: Box::new(feed), live }))
        }
    }
}

struct Connection {
    host: Arc<AhpHost>,
    caller: Caller,
    out: mpsc::Sender<String>,
    /// From `initialize` or `reconnect`.
    client_id: String,
    subscriptions: HashMap<Uri, Held>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        for held in self.subscriptions.values() {
            held.stop();
        }
    }
}

/// What a request answers, and the subscriptions to start once the answer is queued.
type Answer = (Value, Vec<(Uri, Subscribed)>);

impl Connection {
    /// Handles one frame; `false` once the client is gone.
    async fn handle(&mut self, text: &str) -> bool {
        match rpc::parse(text) {
            Incoming::Request { id, method, params } => {
                let frame = match self.request(&method, params).await {
                    Ok((result, subscribed)) => {
                        let sent = self.out.send(rpc::success(id, result)).await.is_ok();
                        self.install(subscribed);
                        return sent;
                    }
                    Err(error) => rpc::failure(id, error),
                };
                self.out.send(frame).await.is_ok()
            }
            Incoming::Notification { method, params } => {
                self.notification(&method, params).await;
                !self.out.is_closed()
            }
            Incoming::Invalid { id: Some(id), error } => self.out.send(rpc::failure(id, error)).await.is_ok(),
            Incoming::Invalid { id: None, error } => {
                tracing::debug!(error = %error.message, "an AHP frame that is not JSON-RPC was dropped");
                true
            }
        }
    }

    async fn request(&mut self, method: &str, params: Value) -> Result<Answer, RpcError> {
        let none = |value: Value| Ok((value, Vec::new()));
        match method {
            "initialize" => self.initialize(rpc::params(params)?).await,
            "reconnect" => {
                let params: ReconnectParams = rpc::params(params)?;
                self.client_id = params.client_id.clone();
                self.stop_all();
                let (result, subscribed) = reconnect(&self.host, &self.caller, &params).await?;
                Ok((rpc::to_value(&result)?, subscribed))
            }
            "ping" => none(Value::Null),
            "subscribe" => {
                let params: SubscribeParams = rpc::params(params)?;
                let channel = resolve(&self.host, &self.caller, &params.channel).await?;
                let turns = params.view.and_then(|v| v.turns).and_then(|t| usize::try_from(t).ok());
                let (snapshot, subscribed) = open(&self.host, &self.caller, channel, turns).await?;
                let result = SubscribeResult { snapshot: Some(snapshot) };
                Ok((rpc::to_value(&result)?, vec![(params.channel, subscribed)]))
            }
            "unsubscribe" | "dispatchAction" => {
                // Notifications in AHP; sent as requests they still get their answer.
                self.notification(method, params).await;
                none(Value::Null)
            }
            "listSessions" => {
                let params: ListSessionsParams = rpc::params(params)?;
                none(rpc::to_value(&sessions::list(&self.host, &self.caller, params).await?)?)
            }
            "createSession" => {
                let params: CreateSessionParams = rpc::params(params)?;
                sessions::create(&self.host, &self.caller, params).await?;
                none(Value::Null)
            }
            "disposeSession" => {
                let params: DisposeSessionParams = rpc::params(params)?;
                sessions::dispose(&self.host, &self.caller, &params.channel).await?;
                none(Value::Null)
            }
            "createChat" => {
                let params: CreateChatParams = rpc::params(params)?;
                sessions::create_chat(&self.host, &self.caller, params).await?;
                none(Value::Null)
            }
            "fetchTurns" => {
                let params: FetchTurnsParams = rpc::params(params)?;
                self.fetch_turns(params).await?;
                none(rpc::to_value(&FetchTurnsResult {})?)
            }
            other => Err(RpcError::new(
                json_rpc_error_codes::METHOD_NOT_FOUND,
                format!("unknown method {other:?}"),
            )),
        }
    }

    async fn notification(&mut self, method: &str, params: Value) {
        match method {
            "unsubscribe" => match rpc::params::<UnsubscribeParams>(params) {
                Ok(params) => {
                    if let Some(held) = self.subscriptions.remove(&params.channel) {
                        held.stop();
                    }
                }
                Err(e) => tracing::debug!(error = %e.message, "an AHP unsubscribe was malformed"),
            },
            "dispatchAction" => match rpc::params::<DispatchActionParams>(params) {
                Ok(params) => self.dispatch(params).await,
                Err(e) => tracing::debug!(error = %e.message, "an AHP dispatchAction was malformed"),
            },
            other => tracing::debug!(method = other, "an unknown AHP notification was ignored"),
        }
    }

    async fn initialize(&mut self, params: InitializeParams) -> Result<Answer, RpcError> {
        let version = negotiate_protocol_version(&params.protocol_versions)
            .map_err(|e| RpcError::invalid_params(format!("params.protocolVersions: {e}")))?
            .map(str::to_owned);
        let Some(version) = version else {
            let data = UnsupportedProtocolVersionErrorData {
                supported_versions: SUPPORTED_PROTOCOL_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
            };
            return Err(RpcError::new(
                ahp_error_codes::UNSUPPORTED_PROTOCOL_VERSION,
                format!("none of the protocol versions {:?} is supported", params.protocol_versions),
            )
            .with_data(rpc::to_value(&data)?));
        };
        self.client_id = params.client_id;
        let mut snapshots = Vec::new();
        let mut subscribed = Vec::new();
        for uri in params.initial_subscriptions.unwrap_or_default() {
            // A channel the caller may not read is left out, as if it did not exist.
            let Ok(channel) = resolve(&self.host, &self.caller, &uri).await else { continue };
            let (snapshot, held) = open(&self.host, &self.caller, channel, None).await?;
            snapshots.push(snapshot);
            subscribed.push((uri, held));
        }
        let result = InitializeResult {
            protocol_version: version,
            server_seq: 0,
            server_info: Some(Implementation {
                name: "turnstone".to_owned(),
                version: Some(env!("CARGO_PKG_VERSION").to_owned()),
                title: Some("Turnstone".to_owned()),
            }),
            meta: None,
            snapshots,
            default_directory: None,
            completion_trigger_characters: None,
            terminal_command_prefix: None,
            telemetry: None,
            automations: None,
        };
        Ok((rpc::to_value(&result)?, subscribed))
    }

    async fn fetch_turns(&mut self, params: FetchTurnsParams) -> Result<(), RpcError> {
        let Some(Held::Chat { control, .. }) = self.subscriptions.get(&params.channel) else {
            return Err(RpcError::invalid_params(
                "params.channel: fetchTurns needs a subscribed chat channel",
            ));
        };
        let (reply, answer) = oneshot::channel();
        control
            .send(Control::FetchTurns { cursor: params.cursor, reply })
            .await
            .map_err(|_| not_found(&params.channel))?;
        answer.await.map_err(|_| not_found(&params.channel))?
    }

    /// `dispatchAction`: carried out, or echoed back to this client with its rejection.
    async fn dispatch(&mut self, params: DispatchActionParams) {
        let Err(reason) = dispatch(&self.host, &self.caller, &self.client_id, &params).await else { return };
        let origin = ActionOrigin { client_id: self.client_id.clone(), client_seq: params.client_seq };
        if let Some(Held::Chat { control, .. }) = self.subscriptions.get(&params.channel) {
            let reject = Control::Reject { action: Box::new(params.action), origin, reason };
            // A channel that ended has no client left to tell.
            let _ = control.send(reject).await;
            return;
        }
        // Not subscribed: the rejection still reaches its client, outside any numbering.
        let envelope = ActionEnvelope {
            channel: params.channel,
            action: params.action,
            server_seq: 0,
            origin: Some(origin),
            rejection_reason: Some(reason),
        };
        let _ = self.out.send(rpc::notification("action", &envelope)).await;
    }

    /// Starts the subscriptions a request opened (after its answer is queued).
    fn install(&mut self, subscribed: Vec<(Uri, Subscribed)>) {
        for (uri, subscribed) in subscribed {
            let held = match subscribed {
                Subscribed::Root => Held::Root(tokio::spawn(root_news(
                    Arc::clone(&self.host),
                    self.caller.clone(),
                    self.out.clone(),
                ))),
                Subscribed::Session => Held::Session,
                Subscribed::Chat { feed, live } => {
                    let (control, commands) = mpsc::channel(CONTROL_BUFFER);
                    let task =
                        tokio::spawn(follow(Arc::clone(&self.host), *feed, live, self.out.clone(), commands));
                    Held::Chat { control, task }
                }
            };
            if let Some(old) = self.subscriptions.insert(uri, held) {
                old.stop();
            }
        }
    }

    fn stop_all(&mut self) {
        for (_, held) in self.subscriptions.drain() {
            held.stop();
        }
    }
}

/// The root channel's notifications: `root/sessionAdded` for every session created through
/// this host that the caller may see.
async fn root_news(host: Arc<AhpHost>, caller: Caller, out: mpsc::Sender<String>) {
    let mut added = host.added.subscribe();
    loop {
        let id = match added.recv().await {
            Ok(id) => id,
            // Notifications are ephemeral: a lagging client misses some (AHP never replays them).
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if let Some(frame) = sessions::added(&host, &caller, &id).await
            && out.send(frame).await.is_err()
        {
            return;
        }
    }
}

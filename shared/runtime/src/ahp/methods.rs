//! The JSON-RPC methods of an AHP connection, written once for every transport: the local
//! host's WebSocket ([`super::connection`], subscriptions run in this process) and API
//! Gateway's ([`super::stored`], one message per invocation, subscriptions in the table). A
//! [`Transport`] says how frames leave and where a connection's subscriptions live; the
//! methods say what each request means.

use std::sync::Arc;

use ahp_types::actions::{ActionEnvelope, ActionOrigin, StateAction};
use ahp_types::commands::{
    AuthenticateParams, AuthenticateResult, CreateChatParams, CreateSessionParams, DispatchActionParams,
    DisposeSessionParams, FetchTurnsParams, FetchTurnsResult, Implementation, InitializeParams,
    InitializeResult, ListSessionsParams, ReconnectParams, ReconnectResult, ReconnectSnapshotResult,
    SubscribeParams, SubscribeResult, UnsubscribeParams,
};
use ahp_types::common::{ROOT_RESOURCE_URI, Uri};
use ahp_types::errors::{UnsupportedProtocolVersionErrorData, ahp_error_codes, json_rpc_error_codes};
use ahp_types::state::Snapshot;
use ahp_types::version::{SUPPORTED_PROTOCOL_VERSIONS, negotiate_protocol_version};

use async_trait::async_trait;
use serde_json::Value;
use turnstone_engine::ids::SessionId;
use turnstone_engine::session::Session;

use super::AhpHost;
use super::channels::{ChatFeed, Live, root_snapshot};
use super::dispatch::dispatch;
use super::reconnect::reconnect;
use super::registry::ClientLedger;
use super::rpc::{self, Incoming, RpcError};
use super::sequence::{Ledger, Numbering};
use super::sessions::{self, Spelling, UriStyle, internal, reachable, session_id};
use crate::auth::{Access, Caller};

/// A channel a URI names, resolved for a caller.
pub(crate) enum Channel {
    Root,
    /// A session, named by `uri` as the client spelled it.
    Session {
        session: Box<Session>,
        uri: Uri,
    },
    Chat(SessionId),
}

/// A subscription opened and not yet held by its connection.
pub(crate) enum Subscribed {
    Root,
    /// A session's channel (which carries its active clients' comings and goings).
    Session(SessionId),
    /// A chat at the feed's position; `live` when its session is followed in this process.
    Chat {
        feed: Box<ChatFeed>,
        live: Option<Live>,
    },
}

/// A dispatched action the host refused, to echo to its client with the reason.
pub(crate) struct Refused {
    pub action: StateAction,
    pub origin: ActionOrigin,
    pub reason: String,
}

/// What differs between the transports: how frames leave, and where a connection's client id
/// and subscriptions are kept.
#[async_trait]
pub(crate) trait Transport: Send {
    /// Whether chat subscriptions follow their session in this process ([`Live`]); a
    /// transport whose connection outlives the process has its commits pushed instead.
    fn follows(&self) -> bool;

    /// The largest frame the transport carries, if it has a limit.
    fn max_frame(&self) -> Option<usize>;

    /// The client id from `initialize` or `reconnect` (empty before).
    fn client_id(&self) -> &str;

    /// How many subscriptions the connection holds besides `channel` (a new subscription of
    /// which replaces the one it holds), for `[limits] subscriptions_per_socket`.
    fn subscriptions_besides(&self, channel: &str) -> usize;

    /// Sets the client id (from `initialize` or `reconnect`), making this connection the
    /// client's latest, and how it spells session URIs it did not name (`None`, a `reconnect`:
    /// as its connection before).
    async fn set_client(&mut self, client_id: String, style: Option<UriStyle>) -> Result<(), RpcError>;

    /// How the client is told of sessions ([`Spelling`]).
    async fn spelling(&mut self) -> Spelling;

    /// The client names session `id` `uri` (in `createSession`; a session channel's
    /// subscription is its own record of it).
    fn name_session(&mut self, _id: &SessionId, _uri: &str) {}

    /// The connection's ledger and that of the client's connection before it (set by
    /// [`Transport::set_client_id`]), when the transport numbers from the host's sequence;
    /// `None` when its client's recorded counter numbers them ([`Numbering::Recorded`]).
    fn ledgers(&self) -> Option<(Arc<Ledger>, Option<Arc<Ledger>>)>;

    /// Without ledgers: what the client was sent, as recorded ([`super::ledger`]).
    async fn client_ledger(&mut self) -> Option<ClientLedger> {
        None
    }

    /// Numbers an answer's snapshots and actions (and the frames that follow it) as the
    /// transport numbers what it sends, just before it goes out; an error fails the request.
    /// A transport with ledgers numbered them already.
    async fn number_answer(&mut self, _result: &mut Value, _after: &mut [String]) -> Result<(), RpcError> {
        Ok(())
    }

    /// `authenticate` with `token`: the connection goes on as the caller `token` names, which
    /// must be the one it connected as (a renewed JWT, a later expiry). `Err` when the token
    /// does not do, or the transport keeps the token it connected with.
    async fn renew(&mut self, token: &str) -> Result<(), RpcError>;

    /// Sends one frame; `false` once the client is gone.
    async fn send(&mut self, frame: String) -> bool;

    /// Holds the subscriptions a request opened, once its answer went out (so the answer goes
    /// before the actions of the subscriptions it opened).
    async fn hold(&mut self, subscribed: Vec<(Uri, Subscribed)>);

    /// Drops one subscription (`None`: every one).
    async fn drop_subscription(&mut self, channel: Option<&str>);

    /// `fetchTurns` on a subscribed chat: `chat/turnsLoaded` goes out on the channel.
    async fn fetch_turns(&mut self, channel: &str, cursor: Option<String>) -> Result<(), RpcError>;

    /// Echoes a refused action on the client's subscription of its channel, numbered there;
    /// gives it back when the client holds no such subscription.
    async fn reject(&mut self, channel: &str, refused: Refused) -> Option<Refused>;
}

/// How `transport`'s envelopes and snapshots are numbered.
fn numbering<'a>(host: &'a AhpHost, transport: &dyn Transport) -> Numbering<'a> {
    match transport.ledgers() {
        Some((ledger, previous)) => Numbering::Host { sequence: &host.sequence, ledger, previous },
        None => Numbering::Recorded { ledger: None },
    }
}

/// What a request answers: its result, the subscriptions to hold once the answer went out,
/// and frames that follow the answer (a replay's actions past what one frame holds).
struct Answer {
    result: Value,
    subscribed: Vec<(Uri, Subscribed)>,
    after: Vec<String>,
}

impl Answer {
    fn just(result: Value) -> Self {
        Answer { result, subscribed: Vec::new(), after: Vec::new() }
    }
}

/// Room a response's envelope (`jsonrpc`, `id`) takes besides its result.
const RESPONSE_OVERHEAD: usize = 64;

/// Handles one frame from the client; `false` once the client is gone.
pub(crate) async fn handle(
    host: &AhpHost,
    caller: &Caller,
    transport: &mut dyn Transport,
    text: &str,
) -> bool {
    match rpc::parse(text) {
        Incoming::Request { id, method, params } => {
            // Boxed: the methods' futures are large, and a Lambda handler runs on a small stack.
            let answer = match Box::pin(request(host, caller, transport, &method, params)).await {
                Ok(answer) => answer,
                Err(error) => return transport.send(rpc::failure(id, error)).await,
            };
            let mut answer = answer;
            if let Err(error) = transport.number_answer(&mut answer.result, &mut answer.after).await {
                return transport.send(rpc::failure(id, error)).await;
            }
            let frame = rpc::success(id, answer.result);
            if let Some(max) = transport.max_frame()
                && frame.len() > max
            {
                return transport.send(rpc::failure(id, too_large(frame.len(), max))).await;
            }
            let mut sent = transport.send(frame).await;
            for frame in answer.after {
                sent = sent && transport.send(frame).await;
            }
            transport.hold(answer.subscribed).await;
            sent
        }
        Incoming::Notification { method, params } => {
            Box::pin(notification(host, caller, transport, &method, params)).await;
            true
        }
        Incoming::Invalid { id: Some(id), error } => transport.send(rpc::failure(id, error)).await,
        Incoming::Invalid { id: None, error } => {
            tracing::debug!(error = %error.message, "an AHP frame that is not JSON-RPC was dropped");
            true
        }
    }
}

/// Refuses a request that would leave the connection holding `wanted` subscriptions when that
/// is past `[limits] subscriptions_per_socket`.
fn within_subscription_limit(host: &AhpHost, wanted: usize) -> Result<(), RpcError> {
    let limit = host.app.limits().subscriptions_per_socket;
    if wanted <= limit {
        return Ok(());
    }
    Err(RpcError::new(
        ahp_error_codes::PERMISSION_DENIED,
        format!(
            "a connection holds at most {limit} subscriptions (limits.subscriptions_per_socket); \
             unsubscribe from one first"
        ),
    ))
}

fn too_large(size: usize, max: usize) -> RpcError {
    RpcError::new(
        json_rpc_error_codes::INTERNAL_ERROR,
        format!("the answer ({size} bytes) does not fit in one frame of this transport ({max} bytes)"),
    )
}

async fn request(
    host: &AhpHost,
    caller: &Caller,
    transport: &mut dyn Transport,
    method: &str,
    params: Value,
) -> Result<Answer, RpcError> {
    let just = |value: Value| Ok(Answer::just(value));
    match method {
        "initialize" => initialize(host, caller, transport, rpc::params(params)?).await,
        "reconnect" => {
            let params: ReconnectParams = rpc::params(with_root_channel(params))?;
            within_subscription_limit(host, params.subscriptions.len())?;
            transport.set_client(params.client_id.clone(), None).await?;
            transport.drop_subscription(None).await;
            let numbering = match numbering(host, transport) {
                Numbering::Recorded { .. } => Numbering::Recorded { ledger: transport.client_ledger().await },
                numbering => numbering,
            };
            let (result, subscribed) =
                reconnect(host, caller, &params, transport.follows(), &numbering).await?;
            match result {
                ReconnectResult::Replay(mut replay) => {
                    numbering.envelopes(&mut replay.actions);
                    let after = split_replay(transport.max_frame(), &mut replay.actions);
                    Ok(Answer { result: rpc::to_value(&ReconnectResult::Replay(replay))?, subscribed, after })
                }
                ReconnectResult::Snapshot(result) => {
                    let result = fitting(transport, result.snapshots, &subscribed, None, |mut snapshots| {
                        numbering.snapshots(&mut snapshots);
                        rpc::to_value(&ReconnectResult::Snapshot(ReconnectSnapshotResult { snapshots }))
                    })?;
                    Ok(Answer { result, subscribed, after: Vec::new() })
                }
            }
        }
        "ping" => just(Value::Null),
        "authenticate" => {
            let params: AuthenticateParams = rpc::params(params)?;
            // No token revokes one the client gave before: the connection keeps the one it
            // connected with, which this host never forgets early.
            if !params.token.is_empty() {
                transport.renew(&params.token).await?;
            }
            just(rpc::to_value(&AuthenticateResult {})?)
        }
        "subscribe" => {
            let params: SubscribeParams = rpc::params(params)?;
            within_subscription_limit(host, transport.subscriptions_besides(&params.channel) + 1)?;
            let channel = resolve(host, caller, &params.channel).await?;
            let turns = params.view.and_then(|v| v.turns).and_then(|t| usize::try_from(t).ok());
            let (snapshot, subscribed) =
                open(host, caller, transport.client_id(), channel, transport.follows()).await?;
            let subscribed = vec![(params.channel, subscribed)];
            let numbering = numbering(host, transport);
            let result = fitting(transport, vec![snapshot], &subscribed, turns, |mut snapshots| {
                numbering.snapshots(&mut snapshots);
                rpc::to_value(&SubscribeResult { snapshot: snapshots.pop() })
            })?;
            Ok(Answer { result, subscribed, after: Vec::new() })
        }
        "unsubscribe" | "dispatchAction" => {
            // Notifications in AHP; sent as requests they still get their answer.
            notification(host, caller, transport, method, params).await;
            just(Value::Null)
        }
        "listSessions" => {
            let params: ListSessionsParams = rpc::params(params)?;
            let spelling = transport.spelling().await;
            just(rpc::to_value(&sessions::list(host, caller, &spelling, params).await?)?)
        }
        "createSession" => {
            let params: CreateSessionParams = rpc::params(params)?;
            // Named before it exists: the `root/sessionAdded` it is told spells it so.
            if let Some((id, _)) = sessions::session_of(host, &params.channel) {
                transport.name_session(&id, &params.channel);
            }
            sessions::create(host, caller, transport.client_id(), params).await?;
            just(Value::Null)
        }
        "disposeSession" => {
            let params: DisposeSessionParams = rpc::params(params)?;
            sessions::dispose(host, caller, &params.channel).await?;
            just(Value::Null)
        }
        "createChat" => {
            let params: CreateChatParams = rpc::params(params)?;
            sessions::create_chat(host, caller, params).await?;
            just(Value::Null)
        }
        "fetchTurns" => {
            let params: FetchTurnsParams = rpc::params(params)?;
            transport.fetch_turns(&params.channel, params.cursor).await?;
            just(rpc::to_value(&FetchTurnsResult {})?)
        }
        other => match super::unserved::answer(host, other, params) {
            Some(answer) => answer.map(Answer::just),
            None => Err(RpcError::new(
                json_rpc_error_codes::METHOD_NOT_FOUND,
                format!("unknown method {other:?}"),
            )),
        },
    }
}

/// A dispatched action with the fields older VS Code builds leave out and `ahp-types`
/// requires: a `chat/turnStarted` without `startedAt` started now, a `chat/turnCancelled`
/// without `duration` lasted 0 ms (the host keeps its own times either way).
fn with_older_fields(host: &AhpHost, mut params: Value) -> Value {
    if let Some(action) = params.get_mut("action").and_then(Value::as_object_mut) {
        match action.get("type").and_then(Value::as_str) {
            Some("chat/turnStarted") if !action.contains_key("startedAt") => {
                action.insert("startedAt".to_owned(), Value::String(host.app.now().to_rfc3339()));
            }
            Some("chat/turnCancelled") if !action.contains_key("duration") => {
                action.insert("duration".to_owned(), Value::from(0));
            }
            _ => {}
        }
    }
    params
}

/// Reconnect params with `channel` (`ahp-root://`) when the client left it out, as VS Code's
/// client core does (`ahp-types` requires it).
fn with_root_channel(mut params: Value) -> Value {
    if let Value::Object(fields) = &mut params {
        fields.entry("channel").or_insert_with(|| Value::String(ROOT_RESOURCE_URI.to_owned()));
    }
    params
}

/// The result `answer` makes of `snapshots`, each chat's trimmed to fewer turns (its
/// `turnsNextCursor` naming the rest, for `fetchTurns`) until the response fits in one frame.
/// Chats are taken from the feeds of `subscribed` (in the order of `snapshots`), whole or with
/// at most `turns` turns when the client asked for a tail.
fn fitting(
    transport: &dyn Transport,
    snapshots: Vec<Snapshot>,
    subscribed: &[(Uri, Subscribed)],
    turns: Option<usize>,
    answer: impl Fn(Vec<Snapshot>) -> Result<Value, RpcError>,
) -> Result<Value, RpcError> {
    let feeds: Vec<Option<&ChatFeed>> = subscribed
        .iter()
        .map(|(_, s)| match s {
            Subscribed::Chat { feed, .. } => Some(feed.as_ref()),
            _ => None,
        })
        .collect();
    let most = feeds.iter().flatten().map(|f| f.projection.chat().turns.len()).max().unwrap_or(0);
    let mut limit = turns;
    loop {
        let trimmed = snapshots
            .iter()
            .zip(feeds.iter().chain(std::iter::repeat(&None)))
            .map(|(snapshot, feed)| match (feed, limit) {
                (Some(feed), Some(_)) => feed.snapshot(limit),
                _ => snapshot.clone(),
            })
            .collect();
        let result = answer(trimmed)?;
        let Some(max) = transport.max_frame() else { return Ok(result) };
        let size = serde_json::to_string(&result).map_or(usize::MAX, |s| s.len()) + RESPONSE_OVERHEAD;
        let shown = limit.unwrap_or(most).min(most);
        if size <= max {
            return Ok(result);
        }
        if shown <= 1 {
            return Err(RpcError::new(
                json_rpc_error_codes::INTERNAL_ERROR,
                format!(
                    "the snapshot ({size} bytes with its newest turn alone) does not fit in one frame of this \
                     transport ({max} bytes)"
                ),
            ));
        }
        limit = Some(shown / 2);
    }
}

/// Leaves in `actions` the replayed actions that fit in the response's frame, and returns the
/// rest as `action` notifications, in order (a client applies a replay's actions, then the
/// notifications after it).
fn split_replay(max: Option<usize>, actions: &mut Vec<ActionEnvelope>) -> Vec<String> {
    let Some(max) = max else { return Vec::new() };
    // Room for the result's own fields and the response's envelope.
    let mut used = RESPONSE_OVERHEAD + 64;
    let mut keep = 0;
    for envelope in actions.iter() {
        let size = serde_json::to_string(envelope).map_or(usize::MAX, |s| s.len()) + 1;
        if used.saturating_add(size) > max {
            break;
        }
        used += size;
        keep += 1;
    }
    actions.split_off(keep).iter().map(|envelope| rpc::notification("action", envelope)).collect()
}

async fn notification(
    host: &AhpHost,
    caller: &Caller,
    transport: &mut dyn Transport,
    method: &str,
    params: Value,
) {
    match method {
        "unsubscribe" => match rpc::params::<UnsubscribeParams>(params) {
            Ok(params) => transport.drop_subscription(Some(&params.channel)).await,
            Err(e) => tracing::debug!(error = %e.message, "an AHP unsubscribe was malformed"),
        },
        "dispatchAction" => match rpc::params::<DispatchActionParams>(with_older_fields(host, params)) {
            Ok(params) => dispatch_action(host, caller, transport, params).await,
            Err(e) => tracing::debug!(error = %e.message, "an AHP dispatchAction was malformed"),
        },
        other => tracing::debug!(method = other, "an unknown AHP notification was ignored"),
    }
}

/// `dispatchAction`: carried out, or echoed back to this client with its rejection.
async fn dispatch_action(
    host: &AhpHost,
    caller: &Caller,
    transport: &mut dyn Transport,
    params: DispatchActionParams,
) {
    let client_id = transport.client_id().to_owned();
    // The client's settings: kept, never refused (VS Code sends several, each with clientSeq 0).
    if params.channel == ROOT_RESOURCE_URI
        && let StateAction::RootConfigChanged(action) = &params.action
    {
        host.root_configs.apply(caller, &client_id, action);
        return;
    }
    let Err(reason) = dispatch(host, caller, &client_id, &params).await else { return };
    let origin = ActionOrigin { client_id, client_seq: params.client_seq };
    let refused = Refused { action: params.action, origin, reason };
    let Some(refused) = transport.reject(&params.channel, refused).await else { return };
    // Not subscribed: the rejection still reaches its client, outside any numbering.
    let envelope = ActionEnvelope {
        channel: params.channel,
        action: refused.action,
        server_seq: 0,
        origin: Some(refused.origin),
        rejection_reason: Some(refused.reason),
    };
    transport.send(rpc::notification("action", &envelope)).await;
}

async fn initialize(
    host: &AhpHost,
    caller: &Caller,
    transport: &mut dyn Transport,
    params: InitializeParams,
) -> Result<Answer, RpcError> {
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
    within_subscription_limit(host, params.initial_subscriptions.as_ref().map_or(0, Vec::len))?;
    let style = UriStyle::of(params.client_info.as_ref(), params.meta.as_ref());
    transport.set_client(params.client_id.clone(), Some(style)).await?;
    let mut snapshots = Vec::new();
    let mut subscribed = Vec::new();
    for uri in params.initial_subscriptions.unwrap_or_default() {
        // A channel the caller may not read is left out, as if it did not exist.
        let Ok(channel) = resolve(host, caller, &uri).await else { continue };
        let (snapshot, held) = open(host, caller, &params.client_id, channel, transport.follows()).await?;
        snapshots.push(snapshot);
        subscribed.push((uri, held));
    }
    let numbering = numbering(host, transport);
    let result = fitting(transport, snapshots, &subscribed, None, |mut snapshots| {
        numbering.snapshots(&mut snapshots);
        rpc::to_value(&InitializeResult {
            protocol_version: version.clone(),
            server_seq: i64::try_from(numbering.current()).unwrap_or(i64::MAX),
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
        })
    })?;
    Ok(Answer { result, subscribed, after: Vec::new() })
}

/// The channel `uri` names, if `caller` may read it.
pub(crate) async fn resolve(host: &AhpHost, caller: &Caller, uri: &str) -> Result<Channel, RpcError> {
    if uri == ROOT_RESOURCE_URI {
        return Ok(Channel::Root);
    }
    if let Some((id, _)) = sessions::session_of(host, uri) {
        let session = reachable(host, caller, &id, Access::Read, uri).await?;
        return Ok(Channel::Session { session: Box::new(session), uri: uri.to_owned() });
    }
    if let Some(id) = session_id(uri, "ahp-chat") {
        reachable(host, caller, &id, Access::Read, uri).await?;
        return Ok(Channel::Chat(id));
    }
    Err(RpcError::new(ahp_error_codes::NOT_FOUND, format!("no channel {uri} on this host")))
}

/// Opens `channel`: its snapshot, and the subscription (a chat's followed in this process when
/// `follow`).
/// `client_id` is the connection's client (whose root configuration the root's snapshot shows).
pub(crate) async fn open(
    host: &AhpHost,
    caller: &Caller,
    client_id: &str,
    channel: Channel,
    follow: bool,
) -> Result<(Snapshot, Subscribed), RpcError> {
    match channel {
        Channel::Root => {
            Ok((root_snapshot(&host.app, host.root_configs.of(caller, client_id)), Subscribed::Root))
        }
        Channel::Session { session, uri } => {
            let id = session.id().clone();
            Ok((sessions::snapshot(host, caller, &session, &uri).await?, Subscribed::Session(id)))
        }
        Channel::Chat(id) => {
            // Followed before the log is read, so nothing committed in between is missed.
            let live = match follow {
                true => Some(Live::follow(&host.app, &id).await.map_err(internal)?),
                false => None,
            };
            let mut feed = ChatFeed::open(&host.app, id).await.map_err(internal)?;
            feed.catch_up(&host.app, |_| {}).await.map_err(internal)?;
            feed.skip_running(&host.app).await;
            Ok((feed.snapshot(None), Subscribed::Chat { feed: Box::new(feed), live }))
        }
    }
}

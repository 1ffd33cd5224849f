//! AHP over API Gateway's WebSocket API: a connection whose state is recorded in a
//! [`Registry`] and whose frames leave through [`Frames`], one client message per invocation
//! (`$connect`, `$default`, `$disconnect` routes). The methods are those of the local host
//! ([`super::methods`]); chat subscriptions are recorded with their position, and commits reach
//! them as pushes ([`super::push`]).
//!
//! `$connect` takes the token from the `Authorization` header or, where a browser's
//! `WebSocket` cannot set one, the `tkn` query parameter (the header wins when both are
//! present), with the checks of the HTTP API. A connection whose token expires is done at its
//! expiry: a message on it is answered with -32007 (`AuthRequired`, "the token has expired")
//! and its records are removed (so what it sends next is dropped), and pushes skip it. Before
//! then, AHP's `authenticate` with a renewed token of the same caller moves the expiry on, in
//! every record of the connection.

use std::collections::HashMap;
use std::sync::Arc;

use ahp_types::actions::{
    ActionEnvelope, ActionOrigin, ChatTurnsLoadedAction, SessionTitleChangedAction, StateAction,
};
use ahp_types::common::{ROOT_RESOURCE_URI, Uri};
use ahp_types::errors::ahp_error_codes;
use ahp_types::state::Snapshot;
use async_trait::async_trait;
use serde_json::Value;
use turnstone_engine::ids::SessionId;

use super::methods::{self, Refused, Subscribed, Transport};
use super::position::Position;
use super::push::Pushes;
use super::registry::{ClientLedger, ConnectionRecord, Posted, RegistryError};
use super::rpc::{self, Incoming, RpcError};
use super::sessions::{self, Spelling, UriStyle, internal, session_id};
use super::{expired, turns};
use crate::auth::{AuthError, Authenticator, Caller};

/// Turns a `fetchTurns` loads at most (fewer when they do not fit in a frame).
const TURNS_PER_FETCH: usize = 50;
/// Tries to number an action around pushes that move the chat meanwhile.
const CLAIMS: usize = 4;

/// Why `$connect` is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No valid `Authorization`: API Gateway answers the upgrade with 401.
    #[error(transparent)]
    Unauthorized(#[from] AuthError),
    /// No `[auth]`, and anonymous callers are not allowed (`[server] allow_anonymous`): 503.
    #[error(
        "this deployment has no [auth], so it serves no one: add an [auth] section to its configuration \
         (or [server] allow_anonymous = true to let anyone in)"
    )]
    AuthNotConfigured,
    /// The caller holds `[limits] sockets_per_caller` connections already: 429.
    #[error(
        "this caller has {limit} AHP sockets open, the most allowed (limits.sockets_per_caller); close one first"
    )]
    TooManySockets { limit: usize },
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// The AHP host of connections recorded in a registry.
pub struct Gateway {
    pushes: Arc<Pushes>,
    auth: Option<Arc<Authenticator>>,
    /// Without `[auth]`: refuse every connection (the HTTP API lets nobody in either).
    refuse_anonymous: bool,
}

impl Gateway {
    /// The host over `pushes` (attached to the app), authenticating as the HTTP API of `http`
    /// does: with its `auth`, and without one, letting everyone connect unless it refuses
    /// anonymous callers.
    pub fn new(pushes: Arc<Pushes>, http: &crate::http::HttpConfig) -> Self {
        let refuse_anonymous = http.anonymous == crate::http::Anonymous::Nobody;
        Gateway { pushes, auth: http.auth.clone(), refuse_anonymous }
    }

    /// `$connect`: authenticates the upgrade, as the HTTP API does, by its `Authorization`
    /// header's value or, without one, by `token` (the `tkn` query parameter, as a browser's
    /// `WebSocket` sends it), and records the connection and its caller (with its token's
    /// expiry). A token past its expiry is refused: the connection would end at once.
    pub async fn connect(
        &self,
        connection_id: &str,
        authorization: Option<&str>,
        token: Option<&str>,
    ) -> Result<(), ConnectError> {
        let caller = match &self.auth {
            None if self.refuse_anonymous => return Err(ConnectError::AuthNotConfigured),
            None => Caller::Anyone,
            Some(auth) => auth.authenticate_upgrade(authorization, token)?,
        };
        let limit = self.pushes.host().map(|host| host.app().limits().sockets_per_caller);
        if let (Some(limit), Some(key)) = (limit, caller.key())
            && self.pushes.registry.open_connections(&key).await? >= limit
        {
            return Err(ConnectError::TooManySockets { limit });
        }
        self.pushes.registry.connect(connection_id, &caller).await?;
        Ok(())
    }

    /// `$default`: one JSON-RPC message of connection `connection_id`, answered through the
    /// frames' way out.
    pub async fn message(&self, connection_id: &str, body: &str) -> Result<(), RegistryError> {
        let Some(host) = self.pushes.host() else {
            return Err(RegistryError("the AHP host is not attached to an app".to_owned()));
        };
        let Some(record) = self.pushes.registry.connection(connection_id).await? else {
            // Its record expired or was removed: API Gateway closes such connections soon.
            tracing::debug!(connection_id, "a message of an unknown connection was dropped");
            return Ok(());
        };
        let caller = record.caller.clone();
        if expired(caller.expires_at()) {
            return self.expire(connection_id, body).await;
        }
        let mut connection = Stored {
            pushes: Arc::clone(&self.pushes),
            auth: self.auth.clone(),
            id: connection_id.to_owned(),
            record,
        };
        // What the message tells session channels, heard as the local host's channels hear it.
        let (mut news, mut changed) = (host.active_clients.news(), host.app.sessions_changed());
        Box::pin(methods::handle(host, &caller, &mut connection, body)).await;
        self.tell_sessions(host, &mut news, &mut changed).await;
        Ok(())
    }

    /// Tells session channels' subscribers, in every function container, what handling one
    /// message changed in this one: active clients joining and leaving, and renames, each
    /// echoed with the origin of the client that dispatched it. A Lambda container handles one
    /// message at a time, so what the receivers hold is this message's.
    async fn tell_sessions(
        &self,
        host: &super::AhpHost,
        news: &mut tokio::sync::broadcast::Receiver<super::active_clients::SessionNews>,
        changed: &mut tokio::sync::broadcast::Receiver<crate::app::SessionChanged>,
    ) {
        let mut told = Vec::new();
        while let Ok(news) = news.try_recv() {
            told.push((news.session_id, news.action, news.origin));
        }
        while let Ok(change) = changed.try_recv() {
            let Some(title) = change.title else { continue };
            let action = StateAction::SessionTitleChanged(SessionTitleChangedAction { title });
            // A rename a client dispatched here (its origin remembered): the commit's echo.
            // Forgotten once told, so a later commit with the same title is no echo again.
            if let Some(origin) = host.origins.of(&change.session_id, &action) {
                host.origins.forget(&change.session_id, &action);
                told.push((change.session_id, action, Some(origin)));
            }
        }
        for (session, action, origin) in told {
            if let Err(e) = self.pushes.tell_session(&session, &action, origin.as_ref()).await {
                tracing::warn!(session_id = %session, error = %e, "telling an AHP session channel failed");
            }
        }
    }

    /// A message on a connection whose token expired: a request is answered with -32007, and
    /// the connection is gone (its records removed, so what it sends next is dropped).
    async fn expire(&self, connection_id: &str, body: &str) -> Result<(), RegistryError> {
        if let Incoming::Request { id, .. } = rpc::parse(body) {
            let error = RpcError::new(
                ahp_error_codes::AUTH_REQUIRED,
                "the token has expired; connect again with a valid one",
            );
            self.pushes
                .post(connection_id, &rpc::failure(id, error))
                .await
                .map_err(|e| RegistryError(e.to_string()))?;
        }
        tracing::info!(connection_id, "a message of an AHP connection whose token expired was refused");
        self.pushes.gone(connection_id).await
    }

    /// `$disconnect`: removes the connection and its subscriptions (its client's last: the
    /// client leaves its sessions after the grace, [`super::departure`]).
    pub async fn disconnect(&self, connection_id: &str) -> Result<(), RegistryError> {
        self.pushes.forget(connection_id).await
    }
}

/// One recorded connection, for the message being handled.
struct Stored {
    pushes: Arc<Pushes>,
    /// Checks the tokens `authenticate` brings (none: the open host).
    auth: Option<Arc<Authenticator>>,
    id: String,
    record: ConnectionRecord,
}

impl Stored {
    /// The key its numbers are counted under ([`super::ledger::numbering_key`]).
    fn key(&self) -> String {
        super::ledger::numbering_key(&self.record.client_id, &self.id)
    }

    /// The session of a chat channel this connection subscribed to, and its position there.
    async fn subscription(&self, channel: &str) -> Result<Option<(SessionId, u64)>, RegistryError> {
        let Some(session) = session_id(channel, "ahp-chat") else { return Ok(None) };
        let position = self.pushes.registry.position(&self.id, &session).await?;
        Ok(position.map(|p| (session, p)))
    }

    /// Numbers one non-durable action after the subscription's position, claims that number
    /// and posts the action (a push that moved the position meanwhile is numbered around).
    async fn send_next(
        &self,
        session: &SessionId,
        mut position: u64,
        action: StateAction,
        origin: Option<ActionOrigin>,
        rejection_reason: Option<String>,
    ) -> Result<(), RegistryError> {
        for _ in 0..CLAIMS {
            let Some(server_seq) = Position::decode(position).next() else { return Ok(()) };
            if self.pushes.registry.advance(&self.id, session, server_seq).await? == Some(position) {
                let channel = turnstone_ahp::chat_uri(session);
                let envelope = ActionEnvelope { channel, action, server_seq, origin, rejection_reason };
                let before = HashMap::from([(session.clone(), position)]);
                self.pushes
                    .deliver(&self.id, &self.key(), vec![envelope], &before)
                    .await
                    .map_err(|e| RegistryError(e.to_string()))?;
                return Ok(());
            }
            match self.pushes.registry.position(&self.id, session).await? {
                Some(now) => position = now,
                None => return Ok(()),
            }
        }
        Err(RegistryError(format!("the chat of {session} kept moving; the action was not sent")))
    }
}

#[async_trait]
impl Transport for Stored {
    fn follows(&self) -> bool {
        false
    }

    fn max_frame(&self) -> Option<usize> {
        Some(self.pushes.frames.max_frame())
    }

    fn client_id(&self) -> &str {
        &self.record.client_id
    }

    /// The chats it subscribed to (the root's and the sessions' subscriptions are not counted
    /// here: only chats cost pushes).
    fn subscriptions_besides(&self, channel: &str) -> usize {
        let same = session_id(channel, "ahp-chat");
        self.record.chats.iter().filter(|chat| Some(*chat) != same.as_ref()).count()
    }

    /// Records the client id with the URI style `initialize` set, or takes the one the client
    /// had (a `reconnect` does not say it).
    async fn set_client(&mut self, client_id: String, style: Option<UriStyle>) -> Result<(), RpcError> {
        self.record.uri_style =
            self.pushes.registry.set_client(&self.id, &client_id, style).await.map_err(internal)?;
        self.record.client_id = client_id;
        Ok(())
    }

    async fn client_ledger(&mut self) -> Option<ClientLedger> {
        match self.pushes.registry.client_ledger(&self.key()).await {
            Ok(ledger) => ledger,
            Err(e) => {
                // A reconnect without it answers snapshots.
                tracing::warn!(connection_id = %self.id, error = %e, "an AHP client's ledger could not be read");
                None
            }
        }
    }

    /// Numbers the answer's snapshots, its replayed actions and those that follow it from the
    /// client's counter, recording what a reconnect reads back ([`super::ledger`]).
    async fn number_answer(&mut self, result: &mut Value, after: &mut [String]) -> Result<(), RpcError> {
        let key = self.key();
        let mut snapshots: Vec<Snapshot> = Vec::new();
        let single = result.get("snapshot").is_some_and(Value::is_object);
        if single {
            snapshots.push(serde_json::from_value(result["snapshot"].clone()).map_err(internal)?);
        } else if let Some(many) = result.get("snapshots").filter(|s| s.is_array()) {
            snapshots = serde_json::from_value(many.clone()).map_err(internal)?;
        }
        if !snapshots.is_empty() {
            self.pushes.number_snapshots((&key, &self.id), &mut snapshots).await.map_err(internal)?;
            if single {
                result["snapshot"] = serde_json::to_value(&snapshots[0]).map_err(internal)?;
            } else {
                result["snapshots"] = serde_json::to_value(&snapshots).map_err(internal)?;
            }
        }
        // A replay's actions, then those sent after its answer, numbered as one block.
        let replayed = match result.get("actions").filter(|_| result["type"] == "replay") {
            Some(actions) => {
                serde_json::from_value::<Vec<ActionEnvelope>>(actions.clone()).map_err(internal)?
            }
            None => Vec::new(),
        };
        let mut envelopes = replayed.clone();
        for frame in after.iter() {
            let frame: Value = serde_json::from_str(frame).map_err(internal)?;
            envelopes.push(serde_json::from_value(frame["params"].clone()).map_err(internal)?);
        }
        if envelopes.is_empty() {
            return Ok(());
        }
        self.pushes
            .number_envelopes((&key, &self.id), &mut envelopes, &HashMap::new())
            .await
            .map_err(internal)?;
        let (answered, following) = envelopes.split_at(replayed.len());
        result["actions"] = serde_json::to_value(answered).map_err(internal)?;
        for (frame, envelope) in after.iter_mut().zip(following) {
            *frame = rpc::notification("action", envelope);
        }
        Ok(())
    }

    fn name_session(&mut self, id: &SessionId, uri: &str) {
        self.pushes.creating(&self.id, id, uri);
    }

    /// Its style, and the session channels it subscribed as it spelled them (one read each;
    /// a connection holds few).
    async fn spelling(&mut self) -> Spelling {
        let mut spelling = Spelling::new(self.record.uri_style);
        for session in &self.record.sessions {
            match self.pushes.registry.session_subscribers(session).await {
                Ok(subscribers) => {
                    if let Some(mine) = subscribers.iter().find(|s| s.connection_id == self.id) {
                        spelling.name(session, &mine.channel);
                    }
                }
                Err(e) => {
                    tracing::warn!(connection_id = %self.id, error = %e, "a session channel's spelling could not be read; its style goes");
                }
            }
        }
        spelling
    }

    /// A connection's records carry its token's identity and expiry (its chat and root
    /// subscriptions too): a renewed token of the same caller rewrites them, so every function
    /// reads and pushes by the new expiry.
    async fn renew(&mut self, token: &str) -> Result<(), RpcError> {
        let Some(auth) = &self.auth else { return Ok(()) };
        let renewed = super::renewed_caller(auth, &self.record.caller, token)?;
        self.pushes.registry.renew(&self.id, &renewed).await.map_err(internal)?;
        self.record.caller = renewed;
        Ok(())
    }

    /// Numbered by each chat's log ([`super::push`] numbers pushes from any function so).
    fn ledgers(&self) -> Option<(Arc<super::sequence::Ledger>, Option<Arc<super::sequence::Ledger>>)> {
        None
    }

    async fn send(&mut self, frame: String) -> bool {
        match self.pushes.post(&self.id, &frame).await {
            Ok(Posted::Sent) => true,
            Ok(Posted::Gone) => false,
            Err(e) => {
                tracing::warn!(connection_id = %self.id, error = %e, "an AHP frame could not be posted");
                false
            }
        }
    }

    async fn hold(&mut self, subscribed: Vec<(Uri, Subscribed)>) {
        for (uri, subscribed) in subscribed {
            // The root carries notifications; session channels their news ([`Gateway::message`]).
            let feed = match subscribed {
                Subscribed::Chat { feed, .. } => feed,
                Subscribed::Root => {
                    if let Err(e) = self
                        .pushes
                        .registry
                        .subscribe_root(&self.id, &self.record.caller, self.record.uri_style)
                        .await
                    {
                        tracing::warn!(connection_id = %self.id, error = %e, "an AHP root subscription could not be recorded");
                    }
                    continue;
                }
                Subscribed::Session(session) => {
                    let expires_at = self.record.caller.expires_at();
                    let recorded = self
                        .pushes
                        .registry
                        .subscribe_session(&self.id, &session, uri.as_str(), expires_at, &self.key())
                        .await;
                    if let Err(e) = recorded {
                        tracing::warn!(connection_id = %self.id, error = %e, "an AHP session subscription could not be recorded");
                    }
                    continue;
                }
            };
            let session = feed.session_id.clone();
            let (at, expires_at) = (feed.position.server_seq(), self.record.caller.expires_at());
            let recorded =
                self.pushes.registry.subscribe(&self.id, &session, at, expires_at, &self.key()).await;
            if let Err(e) = recorded {
                tracing::warn!(connection_id = %self.id, error = %e, "an AHP subscription could not be recorded");
                continue;
            }
            self.pushes.offer(&feed).await;
            // A commit between the snapshot's read and the record missed this subscriber:
            // push what the log holds past the snapshot now.
            if let Err(e) = Box::pin(self.pushes.push(&session)).await {
                tracing::warn!(connection_id = %self.id, error = %e, "catching up a new AHP subscription failed");
            }
        }
    }

    async fn drop_subscription(&mut self, channel: Option<&str>) {
        let dropped = match channel {
            Some(ROOT_RESOURCE_URI) => self.pushes.registry.unsubscribe_root(&self.id).await,
            Some(channel) => match session_id(channel, "ahp-chat") {
                Some(session) => self.pushes.registry.unsubscribe(&self.id, &session).await,
                None => match self.pushes.host().and_then(|host| sessions::session_of(host, channel)) {
                    Some((session, _)) => self.pushes.registry.unsubscribe_session(&self.id, &session).await,
                    None => Ok(()),
                },
            },
            None => self.pushes.registry.unsubscribe_all(&self.id).await,
        };
        if let Err(e) = dropped {
            tracing::warn!(connection_id = %self.id, error = %e, "an AHP subscription could not be removed");
        }
    }

    async fn fetch_turns(&mut self, channel: &str, cursor: Option<String>) -> Result<(), RpcError> {
        let Some((session, position)) = self.subscription(channel).await.map_err(internal)? else {
            return Err(RpcError::needs_subscription("fetchTurns"));
        };
        let chat = self.pushes.chat(&session).await.map_err(internal)?;
        let max = self.pushes.frames.max_frame();
        let mut limit = TURNS_PER_FETCH;
        // As many turns as fit in a frame; the cursor names the rest.
        let action = loop {
            let (turns, next) = turns::page(&chat.turns, cursor.as_deref(), limit)
                .map_err(|_| RpcError::invalid_params("params.cursor: not a cursor of this chat"))?;
            let action =
                StateAction::ChatTurnsLoaded(ChatTurnsLoadedAction { turns, turns_next_cursor: next });
            let size = serde_json::to_string(&action).map_or(usize::MAX, |s| s.len()) + channel.len() + 128;
            if size <= max || limit == 1 {
                break action;
            }
            limit /= 2;
        };
        self.send_next(&session, position, action, None, None).await.map_err(internal)
    }

    async fn reject(&mut self, channel: &str, refused: Refused) -> Option<Refused> {
        let subscription = match self.subscription(channel).await {
            Ok(Some(subscription)) => subscription,
            Ok(None) => return Some(refused),
            Err(e) => {
                tracing::warn!(connection_id = %self.id, error = %e, "an AHP subscription could not be read");
                return Some(refused);
            }
        };
        let (session, position) = subscription;
        let Refused { action, origin, reason } = refused;
        if let Err(e) = self.send_next(&session, position, action, Some(origin), Some(reason)).await {
            tracing::warn!(connection_id = %self.id, error = %e, "an AHP rejection could not be sent");
        }
        None
    }
}

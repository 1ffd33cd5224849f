//! The ports of an AHP host whose connections outlive its processes (API Gateway's WebSocket
//! API in front of Lambda functions): where connections and their chat subscriptions are
//! recorded ([`Registry`]), and how a frame reaches a connection ([`Frames`]).
//!
//! A chat subscription is recorded with its position, the `serverSeq` of the last action the
//! connection got on that chat (or of its snapshot): whoever pushes actions first moves the
//! position past them ([`Registry::advance`]), so no action goes to a connection twice.
//!
//! A connection whose caller's token expires carries the expiry in its records (the caller's,
//! and each chat subscription's), so a pusher finds it with the subscribers it reads anyway:
//! past it, the connection is treated as gone (its records are removed, [`Frames::close`]).

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use turnstone_engine::ids::SessionId;
use turnstone_engine::protocol::WorkerIdentity;

pub use super::sessions::UriStyle;
use crate::auth::{AgentScope, Caller};

/// An active client's entry, as a registry records it.
pub use ahp_types::state::SessionActiveClient;

/// How long a connection lives at most (API Gateway closes a WebSocket after 2 hours), and so
/// how long its records are kept (the table's TTL removes them later).
pub const CONNECTION_LIFETIME_SECS: u64 = 2 * 60 * 60;

/// A recorded connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionRecord {
    /// Who authenticated on `$connect`.
    pub caller: Caller,
    /// From `initialize` or `reconnect` (empty before).
    pub client_id: String,
    /// The sessions whose chats it subscribed to.
    pub chats: Vec<SessionId>,
    /// The sessions whose channels it subscribed to.
    pub sessions: Vec<SessionId>,
    /// How its client spells session URIs (from `initialize`).
    pub uri_style: UriStyle,
}

/// A connection subscribed to a chat, and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscriber {
    pub connection_id: String,
    /// Its client's id (whose `serverSeq` numbers what it is sent; empty: none given).
    pub client_id: String,
    /// The `serverSeq` of the last action the connection got on the chat (or of its snapshot).
    pub server_seq: u64,
    /// When the connection's token expires (Unix seconds): nothing is pushed to it from then.
    pub expires_at: Option<u64>,
}

/// A connection subscribed to a session's channel: the channel as its client spelled it
/// (`ahp-session:/X` or `<agent>:/X`; envelopes must carry it so), and its token's expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSubscriber {
    pub connection_id: String,
    pub client_id: String,
    pub channel: String,
    pub expires_at: Option<u64>,
}

/// A connection subscribed to the root channel, and who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootSubscriber {
    pub connection_id: String,
    pub caller: Caller,
    /// How its client spells session URIs.
    pub uri_style: UriStyle,
}

/// A client whose last connection ended (at `at`, epoch milliseconds), and the sessions it
/// is active in: it leaves them after `[limits] active_client_grace_secs` unless it connects
/// again meanwhile ([`Registry::departed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departure {
    pub client_id: String,
    pub at: u64,
    pub sessions: Vec<SessionId>,
}

/// Where one chat's actions fell in a block of numbers a client was sent: its first and last
/// envelope's number (from the block's start when taken, [`Registry::number`]), and the chat's
/// positions before them (`None`: unknown, an answer's) and after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMark {
    pub chat: SessionId,
    pub first: u64,
    pub last: u64,
    pub before: Option<u64>,
    pub after: u64,
}

/// What a client was sent, as recorded: its last number, each chat's latest mark on each of its
/// connections with the last number of the mark before it (0: none), and what its session
/// channels were told, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientLedger {
    pub last: u64,
    pub marks: Vec<(String, ChatMark, u64)>,
    pub told: Vec<Told>,
}

/// One thing a client was sent on a session channel: the session's snapshot, or an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    pub seq: u64,
    /// The connection it was sent on.
    pub connection: String,
    pub session: SessionId,
    pub snapshot: bool,
    /// JSON: a `SessionState`, or a `StateAction`.
    pub body: String,
}

/// A registry could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("connection registry: {0}")]
pub struct RegistryError(pub String);

/// Where connections and their chat subscriptions are recorded.
#[async_trait]
pub trait Registry: Send + Sync + 'static {
    /// Records connection `id` of `caller`, and counts it among the caller's open ones
    /// ([`Registry::open_connections`]).
    async fn connect(&self, id: &str, caller: &Caller) -> Result<(), RegistryError>;

    /// How many connections the caller whose [`Caller::key`] is `caller_key` holds open (for
    /// `[limits] sockets_per_caller`). Read before a connection is recorded, so two `$connect`s
    /// of one caller at the same moment may both pass at the limit.
    async fn open_connections(&self, caller_key: &str) -> Result<usize, RegistryError>;

    /// Connection `id`, if recorded.
    async fn connection(&self, id: &str) -> Result<Option<ConnectionRecord>, RegistryError>;

    /// Records connection `id`'s client (`initialize`, `reconnect`): its id and how it spells
    /// session URIs (`None`: as the client's last connection did, a `reconnect` not saying it);
    /// the client counts the connection among its open ones. Answers the spelling recorded.
    async fn set_client(
        &self,
        id: &str,
        client_id: &str,
        uri_style: Option<UriStyle>,
    ) -> Result<UriStyle, RegistryError>;

    /// Takes `count` numbers of client `client_id`'s `serverSeq` (a counter that starts at
    /// `floor`) for its connection `connection`: the first of them. Records each chat's `marks`
    /// on that connection in the block (their `first` and
    /// `last` counted from the block's start), each replacing the chat's mark before it, which
    /// must not end past where a mark with a known `before` begins: `None` when one does (two
    /// functions' pushes to the client crossed), and nothing is taken.
    async fn number(
        &self,
        client_id: &str,
        connection: &str,
        count: u64,
        floor: u64,
        marks: &[ChatMark],
    ) -> Result<Option<u64>, RegistryError>;

    /// Records what client `client_id` was sent on session `session`'s channel, numbered
    /// `seq`: a snapshot of the session (JSON), or one action (JSON).
    async fn record_told(&self, client_id: &str, told: &Told) -> Result<(), RegistryError>;

    /// What client `client_id` was sent, as recorded (`None`: nothing is).
    async fn client_ledger(&self, client_id: &str) -> Result<Option<ClientLedger>, RegistryError>;

    /// Records that connection `id` goes on as `caller` (the identity it connected as, with a
    /// renewed token's expiry, AHP's `authenticate`): its record, its chat subscriptions'
    /// expiry and its root subscription, so every function reads and pushes by the new one.
    async fn renew(&self, id: &str, caller: &Caller) -> Result<(), RegistryError>;

    /// Session `session`'s active clients (AHP's `activeClients`), in the order they joined.
    async fn active_clients(&self, session: &SessionId) -> Result<Vec<SessionActiveClient>, RegistryError>;

    /// Records `client` as active in `session`, replacing its entry (keeping when it joined);
    /// a session keeps its `most` latest clients.
    async fn set_active_client(
        &self,
        session: &SessionId,
        client: &SessionActiveClient,
        most: usize,
    ) -> Result<(), RegistryError>;

    /// Removes client `client_id` from `session`'s active clients.
    async fn remove_active_client(&self, session: &SessionId, client_id: &str) -> Result<(), RegistryError>;

    /// Removes connection `id` and all its subscriptions (the root channel's too): its
    /// client's departure when that was the client's last open connection.
    async fn disconnect(&self, id: &str) -> Result<Option<Departure>, RegistryError>;

    /// Whether client `client_id` has had no connection since its departure at `at` (no
    /// connection of it is open, and none ended later).
    async fn departed(&self, client_id: &str, at: u64) -> Result<bool, RegistryError>;

    /// Records connection `id`'s subscription to session `session`'s chat at `server_seq`
    /// (replacing one it held), with its caller's expiry ([`Subscriber::expires_at`]).
    async fn subscribe(
        &self,
        id: &str,
        session: &SessionId,
        server_seq: u64,
        expires_at: Option<u64>,
        client_id: &str,
    ) -> Result<(), RegistryError>;

    async fn unsubscribe(&self, id: &str, session: &SessionId) -> Result<(), RegistryError>;

    /// Records connection `id`'s subscription to session `session`'s channel, spelled `channel`
    /// as its client (`client_id`) subscribed (replacing one it held).
    async fn subscribe_session(
        &self,
        id: &str,
        session: &SessionId,
        channel: &str,
        expires_at: Option<u64>,
        client_id: &str,
    ) -> Result<(), RegistryError>;

    async fn unsubscribe_session(&self, id: &str, session: &SessionId) -> Result<(), RegistryError>;

    /// The subscribers of session `session`'s channel: one strongly consistent read.
    async fn session_subscribers(&self, session: &SessionId)
    -> Result<Vec<SessionSubscriber>, RegistryError>;

    /// The subscribers of session `session`'s chat and of its channel: one strongly consistent
    /// read for both (what a commit's push reads).
    async fn watchers(
        &self,
        session: &SessionId,
    ) -> Result<(Vec<Subscriber>, Vec<SessionSubscriber>), RegistryError>;

    /// Records connection `id` of `caller`, whose client spells session URIs `uri_style`, as
    /// subscribed to the root channel.
    async fn subscribe_root(
        &self,
        id: &str,
        caller: &Caller,
        uri_style: UriStyle,
    ) -> Result<(), RegistryError>;

    async fn unsubscribe_root(&self, id: &str) -> Result<(), RegistryError>;

    /// The root channel's subscribers: one strongly consistent read.
    async fn root_subscribers(&self) -> Result<Vec<RootSubscriber>, RegistryError>;

    /// Removes every subscription of connection `id`, the root channel's too (it stays
    /// connected).
    async fn unsubscribe_all(&self, id: &str) -> Result<(), RegistryError>;

    /// Connection `id`'s position on session `session`'s chat, if subscribed (strongly
    /// consistent).
    async fn position(&self, id: &str, session: &SessionId) -> Result<Option<u64>, RegistryError>;

    /// The subscribers of session `session`'s chat: one strongly consistent read, so a
    /// subscription recorded before it is seen.
    async fn subscribers(&self, session: &SessionId) -> Result<Vec<Subscriber>, RegistryError>;

    /// Moves connection `id`'s position on `session`'s chat to `to` if it stands before it:
    /// the position it stood at (the actions after it, through `to`, are the caller's to send),
    /// or `None` when it stands at or past `to` already, or the subscription is gone.
    async fn advance(&self, id: &str, session: &SessionId, to: u64) -> Result<Option<u64>, RegistryError>;

    /// Moves connection `id`'s position on `session`'s chat to `to` if it stands at or before
    /// `at_most` (below `to`): the position it stood at, or `None` (it moved past `at_most`, or
    /// the subscription is gone). A stream claims with it, so a connection that got an action
    /// numbered elsewhere meanwhile is not sent the rest of a part it did not see begin.
    async fn claim(
        &self,
        id: &str,
        session: &SessionId,
        at_most: u64,
        to: u64,
    ) -> Result<Option<u64>, RegistryError>;
}

/// What became of a frame posted to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    Sent,
    /// The connection is closed (API Gateway's 410): its records are removed.
    Gone,
}

/// How frames reach connections (API Gateway's Management API, `PostToConnection`).
#[async_trait]
pub trait Frames: Send + Sync + 'static {
    /// Posts one text frame (a JSON-RPC message) to connection `id`.
    async fn post(&self, id: &str, frame: &str) -> Result<Posted, RegistryError>;

    /// The largest frame a connection takes.
    fn max_frame(&self) -> usize;

    /// Closes connection `id` (API Gateway's `DeleteConnection`), once its records are
    /// removed. By default nothing is done: whatever the connection sends next finds no
    /// record and is dropped, and API Gateway ends it when it idles.
    async fn close(&self, id: &str) -> Result<(), RegistryError> {
        let _ = id;
        Ok(())
    }
}

/// A caller as a registry records it (JSON): who it is, never its credentials.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Recorded {
    Anyone,
    Client {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<BTreeMap<String, String>>,
        /// When its token expires (Unix seconds); pushes stop then.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<u64>,
    },
    Machine {
        name: String,
        /// `None`: every agent.
        agents: Option<Vec<String>>,
    },
    Admin {
        name: String,
    },
}

/// `caller` as JSON, for a connection's record.
pub fn caller_to_json(caller: &Caller) -> String {
    let recorded = match caller {
        Caller::Anyone => Recorded::Anyone,
        Caller::Client { identity, expires_at } => Recorded::Client {
            id: identity.id.clone(),
            metadata: identity.metadata.clone(),
            expires_at: *expires_at,
        },
        Caller::Machine { name, agents } => Recorded::Machine {
            name: name.clone(),
            agents: match agents {
                AgentScope::All => None,
                AgentScope::Only(agents) => Some(agents.clone()),
            },
        },
        Caller::Admin { name } => Recorded::Admin { name: name.clone() },
    };
    // Plain strings and maps serialize infallibly.
    serde_json::to_string(&recorded).unwrap_or_default()
}

/// The caller a connection's record holds.
pub fn caller_from_json(json: &str) -> Result<Caller, RegistryError> {
    let recorded: Recorded = serde_json::from_str(json)
        .map_err(|e| RegistryError(format!("a recorded caller is not readable: {e}")))?;
    Ok(match recorded {
        Recorded::Anyone => Caller::Anyone,
        Recorded::Client { id, metadata, expires_at } => {
            Caller::Client { identity: WorkerIdentity { id, metadata }, expires_at }
        }
        Recorded::Machine { name, agents } => {
            Caller::Machine { name, agents: agents.map_or(AgentScope::All, AgentScope::Only) }
        }
        Recorded::Admin { name } => Caller::Admin { name },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_round_trip() {
        let callers = [
            Caller::Anyone,
            Caller::client(crate::auth::Kind::Client, "alice"),
            Caller::Client {
                identity: WorkerIdentity { id: Some("jwt:carol".to_owned()), metadata: None },
                expires_at: Some(1_900_000_000),
            },
            Caller::Machine { name: "w".to_owned(), agents: AgentScope::Only(vec!["a".to_owned()]) },
            Caller::Machine { name: "w".to_owned(), agents: AgentScope::All },
            Caller::Admin { name: "root".to_owned() },
        ];
        for caller in callers {
            assert_eq!(caller_from_json(&caller_to_json(&caller)).unwrap(), caller);
        }
    }
}

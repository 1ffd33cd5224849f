//! The Agent Host Protocol (AHP) host: `GET /v1/ahp` upgrades to a WebSocket that speaks
//! AHP's JSON-RPC 2.0 in text frames, so an AHP client lists, creates, watches and drives the
//! caller's Turnstone sessions.
//!
//! - A Turnstone agent is an AHP agent (`provider` = the agent id) in the root state.
//! - Session `X` is `ahp-session:/X`, or `<agent>:/X` as VS Code spells it (either is
//!   accepted; a client is answered in its spelling, [`sessions::UriStyle`]); its one chat,
//!   the active path, is `ahp-chat:/X`. Its title comes from its first message, or a rename.
//! - Every chat action comes from [`turnstone_ahp::ChatProjection`], fed the session's durable
//!   events in log order and, live, the model's token deltas: what a subscriber reduces equals
//!   `GET /v1/sessions/X/chat`.
//! - A client's `dispatchAction` becomes an engine input ([`dispatch`]); the engine's events
//!   then come back through the projection, as the echo. An action the engine refuses is echoed
//!   with a `rejectionReason`.
//!
//! # `serverSeq` and the durable log
//!
//! A chat channel's actions have a **position** derived from the session's log, so a position
//! names the same action on every connection and on every host, a restarted one included:
//!
//! `position = e * 2^20 + c`, where `e` is the seq of the last durable event applied and `c`
//! counts the actions sent since it: first the actions event `e` projects to (`1..=n_e`), then
//! whatever went out before event `e + 1` (live token deltas, `chat/turnsLoaded`, rejections;
//! none of them durable). A snapshot taken after event `e` stands at `e * 2^20 + n_e`.
//!
//! A client that stands at position `e * 2^20 + c` of a chat can be brought up to date from
//! the log when its state is a pure function of the log: the host projects events `1..=e`
//! again (their actions unsent), and if `c <= n_e` and no model call was running after event
//! `e` (no delta could have shown part of a reply the log does not hold yet), it sends the
//! actions of event `e` past the `c`-th and those of every later event. Otherwise (deltas or
//! other non-durable actions seen, a model call mid-stream) the answer is fresh snapshots of
//! every subscription. Either way no action is lost.
//!
//! What clients are sent as `serverSeq` differs by transport:
//! - **The local host** numbers every envelope from one counter of the host as it goes out, on
//!   whatever channel ([`sequence`]), since clients reconnect with the highest number they saw
//!   on any channel; a per-connection ledger turns that number back into a position in each
//!   chat, so `reconnect` replays every subscribed chat from its own point.
//! - **Behind API Gateway** every function pushes, so the counter is an item of the client's in
//!   the table, taken in blocks as a batch is posted or answered, and each block's write
//!   records where each chat's actions fell in it ([`ledger`]); `reconnect` reads the marks of
//!   the client's last connection back into a position per chat.
//!
//! The root channel carries no actions here, only notifications (`root/sessionAdded`,
//! `root/sessionRemoved`, `root/sessionSummaryChanged`), which AHP never replays. A session
//! channel carries its active clients' comings and goings ([`active_clients`]), its title, its
//! catalog of chats (`session/chatAdded`, `session/chatUpdated`) and what they wait for
//! (`inputNeeded`); they have no position in a log, so a session snapshot has `fromSeq` 0. A
//! replay brings what each session channel missed ([`session_replay`]): the session as the
//! client held it is in its connection's ledger on the local host, and rebuilt from what its
//! client was told (recorded under the client) behind API Gateway.
//!
//! Origins (`clientId`, `clientSeq`) of accepted client actions are kept in memory
//! ([`origins`]): a replay from the log or another host echoes those actions without one.
//!
//! # Who is on a socket, and for how long
//!
//! The upgrade is authenticated like every request, by `Authorization: Bearer <token>` or,
//! where a client cannot set headers (a browser's `WebSocket`, VS Code's agent host client), by
//! the token as a subprotocol it offers (`Sec-WebSocket-Protocol: ahp, tkn.<token>`; the host
//! selects `ahp` when offered) or in the `tkn` query parameter (`GET /v1/ahp?tkn=<token>`). The
//! same checks apply; the header wins, then the subprotocol. No token is ever logged.
//!
//! A token that expires (a JWT's `exp`) bounds the socket: at its expiry the host closes it
//! with close code **4401** and reason `token expired` ([`CLOSE_TOKEN_EXPIRED`]; AHP and VS
//! Code name no code for it, and 4401 is the private-use range's echo of HTTP 401), and an
//! upgrade with a token already past its `exp` is answered 401.
//! Behind API Gateway the connection's records carry the expiry: pushes to it stop then (its
//! records are removed, as a closed connection's are), and a message on it is answered with
//! -32007 (`AuthRequired`) and ends it.
//!
//! # Bounds
//!
//! A message (and a frame) is at most `[server] max_body_bytes`, the request body limit: a
//! larger one closes the socket with 1009 (message too big). One authenticated caller holds at
//! most `[limits] sockets_per_caller` sockets (the next upgrade is answered 429
//! `too_many_sockets`; the open host's anonymous caller has no cap): counted in memory on the
//! local host, and behind API Gateway in the registry ([`registry::Registry::open_connections`]),
//! so the cap holds across every function. One socket holds at most
//! `[limits] subscriptions_per_socket` subscriptions (a `subscribe` past it is a JSON-RPC error
//! naming the limit).

mod active_clients;
mod channels;
mod connection;
mod departure;
mod dispatch;
mod ledger;
mod methods;
mod origins;
mod position;
mod push;
mod reconnect;
pub mod registry;
mod root_config;
mod rpc;
mod sequence;
mod session_news;
mod session_replay;
mod sessions;
mod stored;
pub(crate) mod turns;
mod unserved;

use std::sync::Arc;

use crate::app::App;
use crate::auth::Caller;
use crate::per_caller::{PerCaller, Slot};

pub use channels::{ProjectError, project_log};
pub use connection::serve;
pub use push::{Pusher, Pushes};
pub use stored::{ConnectError, Gateway};

pub(crate) use crate::auth::{expired, time_left};

/// The caller `authenticate`'s `token` names, when the connection of `current` may go on as
/// it: a valid token, not expired, of the same caller (a renewed JWT, a later expiry).
fn renewed_caller(
    auth: &crate::auth::Authenticator,
    current: &Caller,
    token: &str,
) -> Result<Caller, rpc::RpcError> {
    use ahp_types::errors::ahp_error_codes;
    let required = |why: String| rpc::RpcError::new(ahp_error_codes::AUTH_REQUIRED, why);
    let renewed = auth.authenticate_token(token).map_err(|e| required(format!("params.token: {e}")))?;
    if expired(renewed.expires_at()) {
        return Err(required("params.token: it has expired".to_owned()));
    }
    if renewed.key() != current.key() {
        return Err(rpc::RpcError::new(
            ahp_error_codes::PERMISSION_DENIED,
            "params.token: it names another caller; a connection keeps the identity it connected as \
             (connect again to change it)",
        ));
    }
    Ok(renewed)
}

/// The close code of a socket whose token expired (with reason `token expired`).
pub const CLOSE_TOKEN_EXPIRED: u16 = 4401;
/// The close code of a socket that sent a message over the limit (RFC 6455's "message too big").
pub const CLOSE_TOO_BIG: u16 = 1009;

/// The WebSocket subprotocol the host selects when a client offers it (a browser that offers
/// subprotocols fails a handshake whose answer selects none).
pub const SUBPROTOCOL: &str = "ahp";
/// The prefix of a `Sec-WebSocket-Protocol` value that carries the caller's token:
/// `tkn.<token>`, for a browser that would rather not put it in the URL (`?tkn=`). The token
/// must then be a subprotocol token (RFC 6455: RFC 7230 token characters), as JWTs and keys of
/// letters, digits, `-`, `_` and `.` are.
pub const TOKEN_SUBPROTOCOL_PREFIX: &str = "tkn.";

/// The token among `Sec-WebSocket-Protocol` header values (each a comma-separated list), if
/// one is offered as `tkn.<token>`.
pub fn subprotocol_token<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    values
        .into_iter()
        .flat_map(|value| value.split(','))
        .find_map(|offered| offered.trim().strip_prefix(TOKEN_SUBPROTOCOL_PREFIX))
        .filter(|token| !token.is_empty())
}

/// Whether the client offered [`SUBPROTOCOL`] among `Sec-WebSocket-Protocol` header values.
pub fn offers_subprotocol<'a>(values: impl IntoIterator<Item = &'a str>) -> bool {
    values.into_iter().flat_map(|value| value.split(',')).any(|offered| offered.trim() == SUBPROTOCOL)
}

/// What every AHP connection of one host shares.
pub struct AhpHost {
    app: Arc<App>,
    /// Origins of accepted client actions, for their echoes.
    origins: origins::Origins,
    /// What each client set with `root/configChanged`.
    root_configs: root_config::RootConfigs,
    /// The clients active in each session, and the session channels' news of them.
    active_clients: Arc<active_clients::ActiveClients>,
    /// The host's `serverSeq`, and what each client's last connection was sent.
    sequence: Arc<sequence::Sequence>,
    ledgers: sequence::Ledgers,
    /// The sockets open on this host, per caller identity ([`AhpHost::open_socket`]).
    sockets: PerCaller,
}

impl AhpHost {
    /// The AHP host of `app`.
    pub fn new(app: Arc<App>) -> Arc<Self> {
        let sockets = PerCaller::new(app.limits().sockets_per_caller);
        let sequence = Arc::new(sequence::Sequence::starting_at(app.now()));
        Arc::new(AhpHost {
            app,
            sequence,
            origins: origins::Origins::default(),
            root_configs: root_config::RootConfigs::default(),
            active_clients: Arc::default(),
            ledgers: sequence::Ledgers::default(),
            sockets,
        })
    }

    /// The app behind it.
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Counts a socket `caller` opens against `[limits] sockets_per_caller` until the slot is
    /// dropped (when the socket ends, or when its upgrade never completes); `Err(limit)` when
    /// the caller holds that many already. The open host's anonymous caller is not counted.
    pub fn open_socket(&self, caller: &Caller) -> Result<Slot, usize> {
        self.sockets.acquire(caller).ok_or(self.sockets.limit())
    }
}

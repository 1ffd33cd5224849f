//! The HTTP API under `/v1` (DESIGN.md section 8), as an axum router built from an [`App`].

mod ahp;
mod chat;
mod console;
mod error;
mod open_host;
pub mod openapi;
pub(crate) mod pages;
mod query;
mod redact;
mod sse;

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use serde::Deserialize;
use turnstone_engine::ids::{MessageId, SessionId, TurnId};
use turnstone_engine::protocol::{Action, ClientInput, Message, MessageTree, TreeNode, parse_slice};
use turnstone_engine::session::{Command, Event, Rejection, Session};

pub use crate::api::ApiError;
pub use open_host::{Anonymous, OpenHost};

use crate::api::{
    ActivePath, CancelRequest, Cancelled, CreateSessionRequest, CreatedSession, Disposed, EventPage,
    ForkRequest, Placement, SessionPage, SessionSummary, Settled, Submitted, TreePage, Turn,
};
use crate::app::App;
use crate::auth::{Access, AuthError, Authenticator, Caller, Listing};

use crate::store::SessionFilter;
use query::ApiQuery;

/// Router settings.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Request bodies over this many bytes get 413.
    pub max_body_bytes: usize,
    /// Who may call, and what they may do; `None`: no authentication (every caller may do
    /// everything).
    pub auth: Option<Arc<Authenticator>>,
    /// The longest a turn long-poll (`?wait=`) waits; longer waits are cut to it. Behind API
    /// Gateway, which ends a request at 30 s, it must stay below that.
    pub max_wait: Duration,
    /// Who may call when there is no `[auth]`: the long-running host lets only this machine in
    /// (from its listener, [`OpenHost`]), a Lambda deployment nobody unless `[server]
    /// allow_anonymous` (every route but `/healthz` answers 503).
    pub anonymous: Anonymous,
    /// Whether clients see internal events in full (`[server] expose_internal_events`).
    pub expose_internal_events: bool,
    /// Event streams one authenticated caller may hold open (`[limits] streams_per_caller`).
    pub streams_per_caller: usize,
    /// When an event stream ends (with a `retry:` hint, for the client to reconnect with
    /// `Last-Event-ID`).
    pub stream_ends: StreamEnds,
}

/// When an event stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnds {
    /// When the client leaves (a host of its own).
    Never,
    /// After this long: a function that streams must end its response before its deadline
    /// (the stream function: 900 s).
    After(Duration),
    /// As soon as it has sent what there is, or after this long with nothing to send: behind
    /// a gateway that buffers the whole response (API Gateway's HTTP API), a stream that did
    /// not end would reach its client never, so each response is one long-poll of the log.
    WithNews(Duration),
}

/// The longest a long-poll waits on a host of its own.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// The longest a long-poll waits behind API Gateway (whose HTTP API cuts an integration at
/// 30 s and answers 503).
pub const MAX_WAIT_BEHIND_API_GATEWAY: Duration = Duration::from_secs(25);

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 1 << 20,
            auth: None,
            max_wait: MAX_WAIT,
            anonymous: Anonymous::Everyone,
            expose_internal_events: false,
            streams_per_caller: crate::config::STREAMS_PER_CALLER,
            stream_ends: StreamEnds::Never,
        }
    }
}

#[derive(Clone)]
struct AppState {
    app: Arc<App>,
    config: Arc<HttpConfig>,
    /// What the connections of `GET /v1/ahp` share.
    ahp: Arc<crate::ahp::AhpHost>,
    /// The event streams each caller holds open (`[limits] streams_per_caller`).
    streams: Arc<crate::per_caller::PerCaller>,
}

/// The HTTP API.
pub fn router(app: Arc<App>, config: HttpConfig) -> axum::Router {
    let limit = config.max_body_bytes;
    let anonymous = if config.auth.is_none() { config.anonymous } else { Anonymous::Everyone };
    let ahp = crate::ahp::AhpHost::new(Arc::clone(&app));
    let streams = Arc::new(crate::per_caller::PerCaller::new(config.streams_per_caller));
    let state = AppState { app, config: Arc::new(config), ahp, streams };
    let router =
        routes().into_iter().fold(axum::Router::new(), |router, (path, methods)| router.route(path, methods));
    let router = router
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        // Bodies are read and limited by `body()`; this only stops axum's own 2 MB default.
        .layer(DefaultBodyLimit::max(limit.saturating_add(1)))
        .with_state(state);
    match anonymous {
        Anonymous::Everyone => router,
        Anonymous::ThisMachine(open) => {
            router.layer(axum::middleware::from_fn_with_state(open, open_host::guard))
        }
        Anonymous::Nobody => router.layer(axum::middleware::from_fn(open_host::refuse_all)),
    }
}

/// Every route, by path. The router is built from this list and the OpenAPI document's paths
/// are checked against it ([`route_paths`]), so neither can gain a route the other lacks.
fn routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/v1/sessions", get(list_sessions).post(create)),
        ("/v1/sessions/{id}", get(session_summary).delete(dispose)),
        ("/v1/sessions/{id}/inputs", post(submit)),
        ("/v1/sessions/{id}/messages", get(messages)),
        ("/v1/sessions/{id}/turns/{turn_id}", get(turn)),
        ("/v1/sessions/{id}/events", get(events)),
        ("/v1/sessions/{id}/events/stream", get(sse::stream)),
        ("/v1/sessions/{id}/chat", get(chat::chat)),
        ("/v1/sessions/{id}/calls/settle", post(settle)),
        ("/v1/sessions/{id}/cancel", post(cancel)),
        ("/v1/sessions/{id}/forks", post(fork)),
        ("/v1/ahp", get(ahp::upgrade)),
        ("/v1/openapi.json", get(openapi::serve)),
        ("/healthz", get(|| async { "ok" })),
        ("/", get(console::index)),
        ("/console/app.js", get(console::app_js)),
        ("/console/app.css", get(console::app_css)),
        ("/metrics", get(metrics)),
    ]
}

/// The paths the router answers (with axum's `{param}` syntax, which is OpenAPI's too).
pub fn route_paths() -> Vec<&'static str> {
    routes().into_iter().map(|(path, _)| path).collect()
}

/// The caller, by its bearer token when `[auth]` is configured: 401 without a valid one.
fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let Some(auth) = state.config.auth.as_ref() else { return Ok(Caller::Anyone) };
    let header = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    auth.authenticate(header).map_err(unauthorized)
}

/// 401 for a request whose token was refused (`token_expired` for an expired token).
fn unauthorized(e: AuthError) -> ApiError {
    let code = if e == AuthError::Expired { "token_expired" } else { "unauthorized" };
    ApiError::new(StatusCode::UNAUTHORIZED, code, e.to_string())
}

/// The session `id`, if it exists and `caller` may `access` it; otherwise 404, the same
/// answer as for a session that does not exist, so other callers' ids do not leak.
async fn reachable(state: &AppState, caller: &Caller, id: &str, access: Access) -> Result<Session, ApiError> {
    let session = state.app.session(id).await?;
    if caller.may(access, &session) {
        Ok(session)
    } else {
        Err(crate::error::Error::SessionNotFound(id.to_owned()).into())
    }
}

/// Reads a JSON body of type `T`: 413 past the limit, 422 naming the field when invalid.
fn body<T: serde::de::DeserializeOwned>(
    state: &AppState,
    bytes: &Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = match bytes {
        Ok(bytes) if bytes.len() <= state.config.max_body_bytes => bytes,
        // A body far past the limit is stopped while it is read (`DefaultBodyLimit`); answer
        // that in the API's error shape too, not axum's plain text.
        Ok(_) => return Err(too_large(state)),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(too_large(state));
        }
        Err(rejection) => {
            return Err(ApiError::new(rejection.status(), "invalid_body", rejection.body_text()));
        }
    };
    parse_slice(bytes).map_err(|e| ApiError::invalid(e.path, e.message))
}

/// 413 in the API's error shape.
fn too_large(state: &AppState) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("request body exceeds {} bytes", state.config.max_body_bytes),
    )
}

#[derive(Deserialize)]
struct SubmitQuery {
    #[serde(default)]
    queue: bool,
    #[serde(default)]
    steer: bool,
}

impl SubmitQuery {
    fn placement(&self) -> Result<Placement, ApiError> {
        match (self.queue, self.steer) {
            (false, false) => Ok(Placement::Start),
            (true, false) => Ok(Placement::Queue),
            (false, true) => Ok(Placement::Steer),
            (true, true) => Err(ApiError::invalid("steer", "queue and steer cannot both be true")),
        }
    }
}

async fn submit(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    ApiQuery(query): ApiQuery<SubmitQuery>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = authenticate(&state, &headers)?;
    check_id(&id)?;
    let placement = query.placement()?;
    let input: ClientInput = body(&state, &bytes)?;
    let submitted: Submitted = state.app.submit(&id, input, placement, &caller).await?;
    Ok((StatusCode::ACCEPTED, Json(submitted)).into_response())
}

async fn settle(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = authenticate(&state, &headers)?;
    let action: Action = body(&state, &bytes)?;
    state.app.settle_as(&id, &caller, action).await?;
    Ok((StatusCode::ACCEPTED, Json(Settled { session_id: id })).into_response())
}

async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = authenticate(&state, &headers)?;
    let empty = bytes.as_ref().is_ok_and(Bytes::is_empty);
    let request: CancelRequest = if empty { CancelRequest::default() } else { body(&state, &bytes)? };
    let reason = request.reason.unwrap_or_else(|| "cancelled by the client".to_owned());
    let executed = state.app.command_as(&id, &caller, Access::Drive, Command::Cancel { reason }).await?;
    let turn_id = executed.events.iter().find_map(|e| match e {
        Event::TurnEnded { turn_id, .. } => Some(turn_id.clone()),
        _ => None,
    });
    Ok((StatusCode::ACCEPTED, Json(Cancelled { session_id: id, turn_id })).into_response())
}

/// `POST /v1/sessions/{id}/forks`: a new session continuing this one's conversation through
/// one of its completed turns; 201, or 200 when that very fork exists already.
async fn fork(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = authenticate(&state, &headers)?;
    let request: ForkRequest = body(&state, &bytes)?;
    let fork_id = match request.session_id {
        Some(fork_id) => {
            check_id(fork_id.as_str())?;
            fork_id
        }
        None => mint_session_id("fork"),
    };
    let (forked, created) = state.app.fork(&id, &request.turn_id, &fork_id, &caller).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(forked)).into_response())
}

/// `prefix-<32 hex>`: a session id no one can guess, 128 bits from the OS's randomness.
fn mint_session_id(prefix: &str) -> SessionId {
    let half = || crate::app::random_u64(prefix);
    format!("{prefix}-{:016x}{:016x}", half(), half()).into()
}

/// `POST /v1/sessions`: a new session of an agent, owned by the caller, with no turn yet; 201,
/// or 200 when the caller's own session of that id exists already (a retried create). An id
/// taken by a session the caller may not reach answers 404, as every route does for it.
async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = authenticate(&state, &headers)?;
    let request: CreateSessionRequest = body(&state, &bytes)?;
    let session_id = match request.session_id {
        Some(id) => {
            check_id(&id)?;
            id
        }
        None => mint_session_id("s"),
    };
    let (status, agent_id) = match state.app.create_session(&session_id, &request.agent_id, &caller).await {
        Ok(_) => (StatusCode::CREATED, request.agent_id),
        Err(crate::error::Error::Rejected(Rejection::AlreadyExists(_))) => {
            let existing = reachable(&state, &caller, &session_id, Access::Drive).await?;
            (StatusCode::OK, existing.agent_id().to_owned())
        }
        Err(e) => return Err(e.into()),
    };
    Ok((status, Json(CreatedSession { session_id, agent_id })).into_response())
}

/// Sessions with work due counted for the gauge, at most.
const DUE_COUNTED: usize = 10_000;

/// `GET /metrics`: the host's counters in the Prometheus text format. With `[auth]` on, only
/// an admin key reads them (they name agents and models).
async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let caller = authenticate(&state, &headers)?;
    if !matches!(caller, Caller::Anyone | Caller::Admin { .. }) {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "metrics need an admin key"));
    }
    let due = state.app.store().due(state.app.now(), DUE_COUNTED).await.map_err(crate::error::Error::from)?;
    let text = state.app.metrics().prometheus(due.len());
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
        .into_response())
}

/// `DELETE /v1/sessions/{id}`: the session and its sub-agent sessions are deleted for good.
async fn dispose(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    headers: HeaderMap,
) -> Result<Json<Disposed>, ApiError> {
    let caller = authenticate(&state, &headers)?;
    let disposed = state.app.dispose(&id, &caller).await?;
    Ok(Json(Disposed { session_id: id, disposed }))
}

async fn session_summary(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    headers: HeaderMap,
) -> Result<Json<SessionSummary>, ApiError> {
    let caller = authenticate(&state, &headers)?;
    let session = reachable(&state, &caller, &id, Access::Read).await?;
    Ok(Json(SessionSummary::of(&session)))
}

#[derive(Deserialize)]
struct MessagesQuery {
    #[serde(default)]
    tree: Option<String>,
    /// The last message of the page before.
    #[serde(default)]
    after: Option<MessageId>,
    #[serde(default)]
    limit: Option<usize>,
}

async fn messages(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    ApiQuery(query): ApiQuery<MessagesQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = authenticate(&state, &headers)?;
    let tree = query::flag(query.tree.as_deref(), "tree")?;
    let limit = query.limit.unwrap_or(500).clamp(1, 1000);
    let session = reachable(&state, &caller, &id, Access::Read).await?;
    let after = query.after.as_ref();
    if tree {
        let tree = session.tree();
        // Nodes only ever join the tree, after their parents: a node's place is stable. Only
        // the page's nodes are cloned, not the tree.
        let nodes: Vec<&TreeNode> = tree.nodes().collect();
        let start = match after {
            None => 0,
            Some(after) => {
                1 + nodes.iter().position(|n| &n.message.id == after).ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "unknown_message",
                        format!("no message {after} in this session (?after=)"),
                    )
                })?
            }
        };
        let rest = &nodes[start..];
        let taken = pages::fitting(rest, limit);
        let next_after = (taken < rest.len()).then(|| rest[taken - 1].message.id.clone());
        let page = rest[..taken]
            .iter()
            .map(|n| TreeNode { message: for_client(&n.message), parent_id: n.parent_id.clone() })
            .collect();
        let tree = MessageTree { nodes: page, head_id: tree.head().cloned() };
        return Ok(Json(TreePage { tree, next_after }).into_response());
    }
    let path = session.tree().active_path();
    let start = match after {
        None => 0,
        Some(after) => 1 + path.iter().position(|m| &m.id == after).ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "not_on_active_path",
                format!("message {after} (?after=) is not on the active path: it changed since the page before; read it again from the start"),
            )
        })?,
    };
    let rest = &path[start..];
    let taken = pages::fitting(rest, limit);
    let next_after = (taken < rest.len()).then(|| rest[taken - 1].id.clone());
    let messages = rest[..taken].iter().map(|m| for_client(m)).collect();
    Ok(Json(ActivePath { messages, next_after }).into_response())
}

/// A recorded message as a client reads it: what its provider needs back (signed thinking)
/// stays with the engine, which sends it to the model; its text shows as the reply's
/// reasoning in the chat. A client's view that names the message keeps the recorded node.
fn for_client(message: &Message) -> Message {
    Message { provider_blocks: None, ..message.clone() }
}

#[derive(Deserialize)]
struct TurnQuery {
    #[serde(default)]
    wait: Option<f64>,
}

async fn turn(
    State(state): State<AppState>,
    Path((id, turn_id)): Path<(SessionId, TurnId)>,
    ApiQuery(query): ApiQuery<TurnQuery>,
    headers: HeaderMap,
) -> Result<Json<Turn>, ApiError> {
    let caller = authenticate(&state, &headers)?;
    let max = state.config.max_wait.as_secs_f64();
    let wait = query.wait.unwrap_or(0.0);
    // `NaN` parses as a number but is no length of time (`from_secs_f64` would panic on it),
    // and a negative wait is none either (the document says `minimum: 0`; a long one is cut).
    if wait.is_nan() || wait < 0.0 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("wait must be a number of seconds, 0 or more, not {wait}"),
        )
        .with_param("wait"));
    }
    let wait = Duration::from_secs_f64(wait.clamp(0.0, max));
    let deadline = tokio::time::Instant::now() + wait;
    // Follow before reading, so a commit between the two is not missed.
    let mut progress = state.app.notifier().progress(&id).await?;
    let mut mark = progress.borrow_and_update().mark();
    let mut session = reachable(&state, &caller, &id, Access::Read).await?;
    loop {
        let Some(turn) = state.app.turn_record(&session, &turn_id).await? else {
            return Err(crate::error::Error::TurnNotFound { session_id: id, turn_id }.into());
        };
        if turn.status.is_ended() || tokio::time::Instant::now() >= deadline {
            return Ok(Json(Turn::of(turn)));
        }
        // Look again only when this turn may have ended (or time is up).
        loop {
            match tokio::time::timeout_at(deadline, progress.changed()).await {
                Ok(Ok(())) if progress.borrow().ended_since(mark, &turn.id) => break,
                Ok(Ok(())) => continue,
                Err(_) => break,
                Ok(Err(_)) => return Ok(Json(Turn::of(turn))),
            }
        }
        mark = progress.borrow_and_update().mark();
        // Ended by a commit of this process: its record as that commit left it, no load.
        if let Some(ended) = state.app.ended_turn(&id, &turn.id) {
            return Ok(Json(Turn::of(ended)));
        }
        session = state.app.session(&id).await?;
    }
}

#[derive(Deserialize)]
struct EventsQuery {
    #[serde(default)]
    after: u64,
    #[serde(default)]
    limit: Option<usize>,
}

async fn events(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    ApiQuery(query): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Json<EventPage>, ApiError> {
    let caller = authenticate(&state, &headers)?;
    reachable(&state, &caller, &id, Access::Read).await?;
    let limit = query.limit.unwrap_or(500).clamp(1, 1000);
    let mut events =
        state.app.store().events_after(&id, query.after, limit).await.map_err(crate::error::Error::from)?;
    if !redact::sees_internals(&caller, state.config.expose_internal_events) {
        for logged in &mut events {
            if let std::borrow::Cow::Owned(shown) = redact::for_clients(&logged.event) {
                logged.event = shown;
            }
        }
    }
    events.truncate(pages::fitting(&events, limit));
    let next_after = events.last().map_or(query.after, |e| e.seq);
    Ok(Json(EventPage { events, next_after }))
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

async fn list_sessions(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ListQuery>,
    headers: HeaderMap,
) -> Result<Json<SessionPage>, ApiError> {
    let caller = authenticate(&state, &headers)?;
    // With authentication on, a client lists only its own sessions; an admin any owner's.
    let owner = match caller.listing() {
        Listing::OwnedBy(me) => Some(me),
        Listing::Any => query.owner,
        Listing::Nothing => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "a machine key may only settle calls (POST /v1/sessions/{id}/calls/settle)",
            ));
        }
    };
    let filter = SessionFilter { agent_id: query.agent, owner };
    let limit = query.limit.unwrap_or(50).clamp(1, 500);
    let page = state
        .app
        .store()
        .list_sessions(&filter, query.cursor.as_deref(), limit)
        .await
        .map_err(crate::error::Error::from)?;
    Ok(Json(SessionPage { sessions: page.items, next_cursor: page.next_cursor }))
}

/// Whether `id` is a session id this host accepts: 1-128 characters of A-Z, a-z, 0-9, '-',
/// '_', '.', ':'.
pub(crate) fn valid_session_id(id: &str) -> bool {
    turnstone_engine::ids::is_safe(id)
}

/// Session ids travel in URLs and keys: keep them to a safe alphabet and length.
fn check_id(id: &str) -> Result<(), ApiError> {
    if valid_session_id(id) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_session_id",
            format!("session ids are {}", turnstone_engine::ids::SAFE_ID),
        ))
    }
}

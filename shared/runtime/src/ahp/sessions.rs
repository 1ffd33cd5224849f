//! Sessions on the root channel: `listSessions`, `createSession`, `disposeSession`, the session
//! channel's snapshot and `root/sessionAdded`. A session the caller may not read is not found
//! and not listed, as in the HTTP API: every method answers a session of another owner exactly
//! as one that does not exist (-32001 `no session <uri>`), `createSession` and a fork's
//! `createChat` of such an id included (only a session the caller may read is said to exist
//! already). Session ids are global (one namespace for every owner), so a client whose ids must
//! not be guessed makes them random. A failure inside the host is answered as a generic internal
//! error, its detail logged ([`RpcError::internal`]).

use std::collections::HashMap;

use ahp_types::commands::{
    ChatSource, CreateChatParams, CreateSessionParams, ListSessionsParams, ListSessionsResult,
};
use ahp_types::common::ROOT_RESOURCE_URI;
use ahp_types::errors::ahp_error_codes;
use ahp_types::notifications::{
    PartialSessionSummary, SessionAddedParams, SessionRemovedParams, SessionSummaryChangedParams,
};
use ahp_types::state::{
    ChatState, ChatSummary, SessionLifecycle, SessionState, SessionStatus, SessionSummary, Snapshot,
    SnapshotState,
};
use turnstone_ahp::{chat_uri, session_uri};
use turnstone_engine::ids::{SessionId, TurnId};
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DraftMessage};
use turnstone_engine::session::{Rejection, Session};

use super::AhpHost;
use super::channels::project_log;
use super::rpc::{self, RpcError};
use crate::api::Placement;
use crate::app::{Removed, SessionChanged, chat_of};
use crate::auth::{Access, Caller, Listing};
use crate::error::Error;
use crate::store::SessionFilter;

/// Sessions a `listSessions` page holds unless asked otherwise, and at most.
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 500;

/// The session id in `uri` with `scheme` (`ahp-session:/X`, `ahp-chat:/X`).
pub(crate) fn session_id(uri: &str, scheme: &str) -> Option<SessionId> {
    let id = uri.strip_prefix(scheme)?.strip_prefix(":/")?;
    crate::http::valid_session_id(id).then(|| SessionId::from(id))
}

/// The session a session URI names, and the agent its scheme names if it is not
/// `ahp-session`: `ahp-session:/X`, or VS Code's `<provider>:/X` with the provider one of the
/// host's agents (its session list keys sessions by that scheme, and it keeps the URI as it
/// spelled it).
pub(crate) fn session_of<'a>(host: &AhpHost, uri: &'a str) -> Option<(SessionId, Option<&'a str>)> {
    if let Some(id) = session_id(uri, "ahp-session") {
        return Some((id, None));
    }
    let (scheme, _) = uri.split_once(":/")?;
    let id = host.app.agent(scheme).and_then(|_| session_id(uri, scheme))?;
    Some((id, Some(scheme)))
}

/// How a connection's client spells session URIs it did not name itself: `ahp-session:/X`, or
/// `<agent>:/X` for a VS Code build that keys a session by its URI's scheme (the agent, as its
/// `provider`). Either spelling is accepted from every client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UriStyle {
    #[default]
    AhpSession,
    Provider,
}

/// The `initialize` `_meta` key by which VS Code says it names sessions `ahp-session:/<id>`
/// (`AgentHostSessionUrisCapabilityMetaKey`, docs/vscode-ahp-client.md §2).
const AHP_SESSION_URIS_META: &str = "vscode.ahpSessionUris";

impl UriStyle {
    /// Its name in a record (a connection's, a root subscription's).
    pub fn name(self) -> &'static str {
        match self {
            UriStyle::AhpSession => "ahp-session",
            UriStyle::Provider => "provider",
        }
    }

    /// The style a record names (`ahp-session` for any other name, the default).
    pub fn named(name: &str) -> UriStyle {
        if name == UriStyle::Provider.name() { UriStyle::Provider } else { UriStyle::AhpSession }
    }

    /// The spelling a client that introduced itself as `client_info`, with `meta`, reads best:
    /// a VS Code build that says it names sessions `ahp-session:/<id>` is told them so, an
    /// older one (whose session list takes the provider from the URI's scheme) `<agent>:/<id>`.
    pub fn of(
        client_info: Option<&ahp_types::commands::Implementation>,
        meta: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> UriStyle {
        let ahp_session_uris =
            meta.and_then(|m| m.get(AHP_SESSION_URIS_META)) == Some(&serde_json::Value::Bool(true));
        match client_info {
            Some(info) if info.name.starts_with("vscode") && !ahp_session_uris => UriStyle::Provider,
            _ => UriStyle::AhpSession,
        }
    }

    /// Session `id` of agent `agent_id`, spelled so.
    pub fn uri(self, id: &SessionId, agent_id: &str) -> String {
        match self {
            UriStyle::AhpSession => session_uri(id),
            UriStyle::Provider => format!("{agent_id}:/{id}"),
        }
    }
}

/// Sessions whose names a [`Spelling`] keeps (a client that named more starts over: the
/// sessions it named before are spelled in its style until it names them again).
const NAMED_SESSIONS: usize = 1024;

/// How a client is told of sessions: each one it named itself (the channel of its
/// `createSession`, of a session channel it subscribed) as it spelled it, since AHP clients
/// match sessions by URI as a string; any other in its [`UriStyle`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spelling {
    pub style: UriStyle,
    named: HashMap<SessionId, String>,
}

impl Spelling {
    pub fn new(style: UriStyle) -> Spelling {
        Spelling { style, named: HashMap::new() }
    }

    /// The client named session `id` `uri`.
    pub fn name(&mut self, id: &SessionId, uri: &str) {
        if self.named.len() >= NAMED_SESSIONS && !self.named.contains_key(id) {
            self.named.clear();
        }
        self.named.insert(id.clone(), uri.to_owned());
    }

    /// Keeps the names another spelling of the same client learnt (its connection before).
    pub fn learn(&mut self, other: &Spelling) {
        for (id, uri) in &other.named {
            self.named.entry(id.clone()).or_insert_with(|| uri.clone());
        }
    }

    /// Session `id` of agent `agent_id` as the client names it.
    pub fn uri(&self, id: &SessionId, agent_id: &str) -> String {
        self.named.get(id).cloned().unwrap_or_else(|| self.style.uri(id, agent_id))
    }
}

/// -32001 for `uri`: no such session, or one the caller may not see.
pub(crate) fn not_found(uri: &str) -> RpcError {
    RpcError::new(ahp_error_codes::SESSION_NOT_FOUND, format!("no session {uri}"))
}

/// Session `id` when it exists and `caller` may `access` it.
pub(crate) async fn reachable(
    host: &AhpHost,
    caller: &Caller,
    id: &SessionId,
    access: Access,
    uri: &str,
) -> Result<Session, RpcError> {
    match host.app.session(id).await {
        Ok(session) if caller.may(access, &session) => Ok(session),
        Ok(_) | Err(Error::SessionNotFound(_)) => Err(not_found(uri)),
        Err(e) => Err(internal(e)),
    }
}

/// -32603 with the detail logged, not sent ([`RpcError::internal`]).
pub(crate) fn internal(e: impl std::fmt::Display) -> RpcError {
    RpcError::internal(e)
}

/// An engine error of a request on `uri`, answered as the HTTP API does: a session that does
/// not exist, is not the caller's, or was disposed is not found; the caller's own mistakes and
/// limits are named; a failure of the store or the queue is an internal error.
pub(crate) fn answer(e: Error, uri: &str) -> RpcError {
    match e {
        Error::SessionNotFound(_) | Error::SessionDisposed(_) => not_found(uri),
        // An id taken by a session the caller is not told about.
        Error::Rejected(Rejection::AlreadyExists(_)) => not_found(uri),
        Error::Rejected(rejection) => RpcError::invalid_params(rejection.to_string()),
        Error::Invalid(problem) => RpcError::invalid_params(format!("{}: {}", problem.path, problem.message)),
        Error::TurnNotFound { turn_id, .. } => {
            RpcError::invalid_params(format!("no turn {turn_id} in {uri}"))
        }
        Error::UnknownAgent(agent) => {
            RpcError::new(ahp_error_codes::PROVIDER_NOT_FOUND, format!("no agent {agent:?}"))
        }
        Error::TooManySessions { .. } | Error::SettleForbidden { .. } => {
            RpcError::new(ahp_error_codes::PERMISSION_DENIED, e.to_string())
        }
        Error::Contended(_) => RpcError::new(
            ahp_error_codes::CONFLICT,
            format!("{uri} is busy with concurrent updates; try again"),
        ),
        Error::Store(_) | Error::Queue(_) => internal(e),
    }
}

/// Whether session `id` exists and `caller` may read it: only then is it said to exist.
async fn visible(host: &AhpHost, caller: &Caller, id: &SessionId) -> bool {
    reachable(host, caller, id, Access::Read, "").await.is_ok()
}

/// `listSessions`: the caller's sessions, most recently created first as the store lists them,
/// their URIs spelled as the client names them.
pub(crate) async fn list(
    host: &AhpHost,
    caller: &Caller,
    spelling: &Spelling,
    params: ListSessionsParams,
) -> Result<ListSessionsResult, RpcError> {
    let owner = match caller.listing() {
        Listing::OwnedBy(me) => Some(me),
        Listing::Any => None,
        Listing::Nothing => {
            return Err(RpcError::new(
                ahp_error_codes::PERMISSION_DENIED,
                "a machine key may only settle calls",
            ));
        }
    };
    let limit = params.limit.and_then(|l| usize::try_from(l).ok()).unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let filter = SessionFilter { agent_id: None, owner };
    let page = host.app.store().list_sessions(&filter, params.cursor.as_deref(), limit).await.map_err(
        |e| match e {
            crate::store::StoreError::InvalidCursor => {
                RpcError::invalid_params("params.cursor: not a cursor of this host")
            }
            e => internal(e),
        },
    )?;
    // The listing has neither status nor title: each session's come from its head, read
    // concurrently (a host's cache usually has it). A sub-agent's or a fork's session is a
    // chat of another's catalog, not a session of the root's (a page may come out short).
    let heads = futures_util::future::join_all(page.items.iter().map(|l| head(host, &l.session_id))).await;
    let items = page
        .items
        .iter()
        .zip(heads)
        .filter(|(_, head)| !head.chat_of_another)
        .map(|(listing, head)| {
            let id = SessionId::from(listing.session_id.as_str());
            let times = (listing.created_at.to_rfc3339(), listing.updated_at.to_rfc3339());
            summary(&id, &listing.agent_id, spelling, head.status, head.title, times)
        })
        .collect();
    Ok(ListSessionsResult { next_cursor: page.next_cursor, items })
}

/// What a listed session's head says of it.
struct Head {
    status: u32,
    title: Option<String>,
    /// A chat of another session's catalog (a sub-agent's, a fork's).
    chat_of_another: bool,
}

/// Session `id`'s AHP status and title, from its head; idle and untitled when it cannot be
/// read.
async fn head(host: &AhpHost, id: &str) -> Head {
    match host.app.session(id).await {
        Ok(session) => Head {
            status: status(crate::api::SessionStatus::of(&session)),
            title: session.title().map(str::to_owned),
            chat_of_another: chat_of(&session).is_some(),
        },
        Err(e) => {
            tracing::warn!(session_id = id, error = %e, "a listed session could not be read; shown idle");
            Head { status: SessionStatus::Idle.bits(), title: None, chat_of_another: false }
        }
    }
}

/// A session's AHP status: idle, in progress, or waiting for input (an interrupt, a client
/// tool, an approval).
pub(crate) fn status(status: crate::api::SessionStatus) -> u32 {
    match status {
        crate::api::SessionStatus::Idle => SessionStatus::Idle.bits(),
        crate::api::SessionStatus::Running => SessionStatus::InProgress.bits(),
        crate::api::SessionStatus::Waiting => SessionStatus::InputNeeded.bits(),
    }
}

/// A session's title as AHP shows it: its own, or its agent's name until it has one.
fn title_or(title: Option<String>, agent_id: &str) -> String {
    title.unwrap_or_else(|| agent_id.to_owned())
}

/// `(created_at, modified_at)`.
type Times = (String, String);

fn summary(
    id: &SessionId,
    agent_id: &str,
    spelling: &Spelling,
    status: u32,
    title: Option<String>,
    (created_at, modified_at): Times,
) -> SessionSummary {
    SessionSummary {
        provider: agent_id.to_owned(),
        title: title_or(title, agent_id),
        status,
        activity: None,
        origin: None,
        project: None,
        working_directories: None,
        annotations: None,
        resource: spelling.uri(id, agent_id),
        created_at,
        modified_at,
        changes: None,
        meta: None,
        chats: None,
        default_chat: Some(chat_uri(id)),
    }
}

/// `createSession`: an empty session of agent `provider`, owned by the caller, announced to
/// every root subscriber who may see it; `activeClient`, the entry of client `client_id` (the
/// connection's), makes it the session's first active client.
pub(crate) async fn create(
    host: &AhpHost,
    caller: &Caller,
    client_id: &str,
    params: CreateSessionParams,
) -> Result<(), RpcError> {
    if let Some(active) = &params.active_client
        && active.client_id != client_id
    {
        return Err(RpcError::invalid_params(format!(
            "params.activeClient.clientId: a client joins as itself ({client_id:?}), not as {:?}",
            active.client_id
        )));
    }
    let (id, scheme) = session_of(host, &params.channel).ok_or_else(|| {
        RpcError::invalid_params(
            "params.channel: must be ahp-session:/<id> or <agent id>:/<id>, the id 1-128 characters of A-Z, \
             a-z, 0-9, '-', '_', '.', ':'",
        )
    })?;
    let provider = match (params.provider, scheme) {
        (Some(provider), Some(scheme)) if provider != scheme => {
            return Err(RpcError::invalid_params(format!(
                "params.provider: {provider:?} is not the agent the session URI names ({scheme:?})"
            )));
        }
        (Some(provider), _) => provider,
        (None, Some(scheme)) => scheme.to_owned(),
        (None, None) => return Err(RpcError::invalid_params("params.provider: the agent id is required")),
    };
    if host.app.agent(&provider).is_none() {
        return Err(RpcError::new(ahp_error_codes::PROVIDER_NOT_FOUND, format!("no agent {provider:?}")));
    }
    match host.app.create_session(&id, &provider, caller).await {
        Ok(_) => {
            if let Some(active) = params.active_client {
                host.active_clients.set(&id, active, None).await;
            }
            Ok(())
        }
        // Said to exist only to a caller that may read it (its owner, an admin); to anyone else
        // it is a session they cannot reach, answered as one that does not exist.
        Err(Error::Rejected(Rejection::AlreadyExists(_))) if visible(host, caller, &id).await => {
            Err(RpcError::new(
                ahp_error_codes::SESSION_ALREADY_EXISTS,
                format!("session {} already exists", params.channel),
            ))
        }
        Err(Error::SessionNotFound(_)) if caller.owner().is_none() => {
            Err(RpcError::new(ahp_error_codes::PERMISSION_DENIED, "this caller cannot create sessions"))
        }
        Err(e) => Err(answer(e, &params.channel)),
    }
}

/// `createChat` with a fork source: the new chat is a session of its own that continues the
/// session's default chat through one of its completed turns ([`App::fork`]), listed in the
/// session's catalog of chats; an initial message starts its first turn. A chat of a fresh
/// conversation is a new session (`createSession`), and side chats are not offered.
///
/// [`App::fork`]: crate::app::App::fork
pub(crate) async fn create_chat(
    host: &AhpHost,
    caller: &Caller,
    params: CreateChatParams,
) -> Result<(), RpcError> {
    let (id, _) = session_of(host, &params.channel).ok_or_else(|| not_found(&params.channel))?;
    let session = reachable(host, caller, &id, Access::Drive, &params.channel).await?;
    let fork_id = session_id(&params.chat, "ahp-chat").ok_or_else(|| {
        RpcError::invalid_params("params.chat: must be ahp-chat:/<id>, the id as a session id")
    })?;
    let source = match params.source {
        Some(ChatSource::Fork(source)) => source,
        _ => {
            return Err(RpcError::invalid_params(
                "params.source: this host creates chats as forks (kind \"fork\"); a new conversation \
                 is a new session (createSession)",
            ));
        }
    };
    if source.chat != chat_uri(&id) {
        return Err(RpcError::invalid_params(format!(
            "params.source.chat: forks are made from the session's default chat, {}",
            chat_uri(&id)
        )));
    }
    let turn_id = TurnId::from(source.turn_id.as_str());
    match host.app.fork(&id, &turn_id, &fork_id, caller).await {
        Ok(_) => {}
        // As `createSession`: only a session the caller may read is said to exist.
        Err(Error::Rejected(Rejection::AlreadyExists(_))) if visible(host, caller, &fork_id).await => {
            return Err(RpcError::new(
                ahp_error_codes::ALREADY_EXISTS,
                format!("{} already exists, and is not this fork", params.chat),
            ));
        }
        Err(Error::Rejected(Rejection::AlreadyExists(_)) | Error::SessionDisposed(_)) => {
            return Err(not_found(&params.chat));
        }
        Err(Error::TurnNotFound { .. }) => {
            return Err(RpcError::invalid_params(format!(
                "params.source.turnId: no turn {turn_id} ended in {}",
                source.chat
            )));
        }
        Err(Error::Rejected(Rejection::InvalidInput(problem))) => {
            return Err(RpcError::invalid_params(format!("params.source.turnId: {}", problem.message)));
        }
        Err(Error::SessionNotFound(_)) => return Err(not_found(&params.channel)),
        Err(e) => return Err(answer(e, &params.channel)),
    }
    if let Some(message) = params.initial_message {
        let input = ClientInput::Message(ClientMessageInput {
            agent_id: session.agent_id().to_owned(),
            turn_id: None,
            message: DraftMessage::user(message.text),
            stream: Some(true),
            client: None,
        });
        host.app
            .submit(&fork_id, input, Placement::Start, caller)
            .await
            .map_err(|e| answer(e, &params.chat))?;
    }
    Ok(())
}

/// `disposeSession`: the session and its sub-agent sessions are deleted for good; every root
/// subscriber that may know hears `root/sessionRemoved` for each.
pub(crate) async fn dispose(host: &AhpHost, caller: &Caller, channel: &str) -> Result<(), RpcError> {
    let (id, _) = session_of(host, channel).ok_or_else(|| not_found(channel))?;
    match host.app.dispose(&id, caller).await {
        Ok(_) => Ok(()),
        Err(e) => Err(answer(e, channel)),
    }
}

/// `root/sessionRemoved` for `removed`, if `caller` may see it.
pub(crate) fn removed(caller: &Caller, spelling: &Spelling, removed: &Removed) -> Option<String> {
    caller.listing().shows(removed.owner.as_deref()).then(|| {
        let session = match &removed.agent_id {
            Some(agent_id) => spelling.uri(&removed.session_id, agent_id),
            None => session_uri(&removed.session_id),
        };
        rpc::notification(
            "root/sessionRemoved",
            &SessionRemovedParams { channel: ROOT_RESOURCE_URI.to_owned(), session },
        )
    })
}

/// `root/sessionSummaryChanged` for `changed` (if `caller` may see the session): the fields
/// that differ from `shown`, what this client was last told of the session's status and
/// title (then updated), and `modifiedAt`.
pub(crate) fn summary_changed(
    caller: &Caller,
    spelling: &Spelling,
    changed: &SessionChanged,
    shown: &mut Option<(u32, Option<String>)>,
) -> Option<String> {
    if !caller.listing().shows(changed.owner.as_deref()) || changed.chat_of.is_some() {
        return None;
    }
    let now = (status(changed.status), changed.title.clone());
    let before = shown.replace(now.clone());
    let changes = PartialSessionSummary {
        status: Some(now.0).filter(|s| before.as_ref().is_none_or(|b| b.0 != *s)),
        title: now.1.filter(|t| before.as_ref().is_none_or(|b| b.1.as_ref() != Some(t))),
        modified_at: Some(changed.at.to_rfc3339()),
        ..PartialSessionSummary::default()
    };
    Some(rpc::notification(
        "root/sessionSummaryChanged",
        &SessionSummaryChangedParams {
            channel: ROOT_RESOURCE_URI.to_owned(),
            session: spelling.uri(&changed.session_id, &changed.agent_id),
            changes,
        },
    ))
}

/// The session channel's snapshot: the session with its one chat, its `resource` the URI the
/// client subscribed with (`uri`).
pub(crate) async fn snapshot(
    host: &AhpHost,
    caller: &Caller,
    session: &Session,
    uri: &str,
) -> Result<Snapshot, RpcError> {
    let id = session.id().clone();
    let projection = project_log(&host.app, &id).await.map_err(internal)?;
    let chat = projection.chat();
    // The default chat, then the forks, then the sub-agents' chats, oldest first (those the
    // caller may read; a sub-agent's session exists once its delegation was sent).
    // What any of them waits for is the session's `inputNeeded`.
    let mut chats = vec![chat_summary(chat)];
    let mut input_needed = turnstone_ahp::input_needed(chat);
    let forks = projection.forks().iter().map(|(fork, _)| fork);
    for other in forks.chain(projection.children()) {
        if reachable(host, caller, other, Access::Read, "").await.is_ok() {
            let projected = project_log(&host.app, other).await.map_err(internal)?;
            chats.push(chat_summary(projected.chat()));
            input_needed.extend(turnstone_ahp::input_needed(projected.chat()));
        }
    }
    let state = SessionState {
        provider: session.agent_id().to_owned(),
        title: title_or(session.title().map(str::to_owned), session.agent_id()),
        status: chat.status,
        activity: None,
        origin: None,
        project: None,
        working_directories: None,
        annotations: None,
        lifecycle: SessionLifecycle::Ready,
        creation_error: None,
        server_tools: None,
        active_clients: host.active_clients.of(&id).await,
        chats,
        default_chat: Some(chat_uri(&id)),
        config: None,
        customizations: None,
        changesets: None,
        input_needed: (!input_needed.is_empty()).then_some(input_needed),
        meta: None,
    };
    Ok(Snapshot { resource: uri.to_owned(), state: SnapshotState::Session(Box::new(state)), from_seq: 0 })
}

pub(crate) fn chat_summary(chat: &ChatState) -> ChatSummary {
    ChatSummary {
        resource: chat.resource.clone(),
        title: chat.title.clone(),
        status: chat.status,
        activity: chat.activity.clone(),
        modified_at: chat.modified_at.clone(),
        changes: None,
        origin: chat.origin.clone(),
        movable: None,
        interactivity: chat.interactivity,
        working_directories: None,
    }
}

/// `root/sessionAdded` for session `id`, if `caller` may see it.
pub(crate) async fn added(
    host: &AhpHost,
    caller: &Caller,
    spelling: &Spelling,
    id: &SessionId,
) -> Option<String> {
    let session = host.app.session(id).await.ok().filter(|s| caller.may(Access::Read, s))?;
    if chat_of(&session).is_some() {
        return None;
    }
    Some(added_frame(&session, spelling))
}

/// `root/sessionAdded` for `session` (for a caller that may read it), as it stands.
pub(crate) fn added_frame(session: &Session, spelling: &Spelling) -> String {
    let at = session.created_at().to_rfc3339();
    let status = status(crate::api::SessionStatus::of(session));
    let title = session.title().map(str::to_owned);
    let summary = summary(session.id(), session.agent_id(), spelling, status, title, (at.clone(), at));
    rpc::notification(
        "root/sessionAdded",
        &SessionAddedParams { channel: ROOT_RESOURCE_URI.to_owned(), summary },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    #[test]
    fn engine_errors_answer_as_http_does() {
        let uri = "ahp-session:/s1";
        for gone in [
            Error::SessionNotFound("s1".to_owned()),
            Error::SessionDisposed("s1".to_owned()),
            Error::Rejected(Rejection::AlreadyExists("s1".into())),
        ] {
            assert_eq!(answer(gone, uri), not_found(uri));
        }
        let failed = answer(Error::Store(StoreError::Backend("table sessions-prod: throttled".into())), uri);
        assert_eq!(failed.code, -32603);
        assert!(!failed.message.contains("sessions-prod"), "{}", failed.message);
        let quota = answer(Error::TooManySessions { limit: 3 }, uri);
        assert!(quota.message.contains("limits.sessions_per_owner"), "{}", quota.message);
    }
}

//! The HTTP API's request and response bodies (DESIGN.md section 8), defined once: the router
//! serializes them, and the CLI and the end-to-end tests deserialize them, so the three cannot
//! disagree about a field.
//!
//! Clients read leniently: unknown fields are ignored, so an older client keeps working
//! against a newer server. Event pages are generic over the event type for the same reason: a
//! client that only renders events may read them as JSON values ([`EventPage<Value>`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use turnstone_engine::ids::{CallId, InterruptId, MessageId, SessionId, TurnId};
use turnstone_engine::llm_format::usage::TokenCounts;
use turnstone_engine::protocol::{CallStatus, Message, MessageTree, StreamDelta};
use turnstone_engine::session::{CallRecord, CallSpec, Event, ForkOrigin, ParentLink, Session};
use turnstone_engine::time::Timestamp;

pub use crate::store::{LoggedEvent, SessionListing};
use turnstone_engine::session::TurnRecord;

/// `GET /v1/sessions/{id}/turns/{turn_id}`: a turn's record, and its model usage in one
/// vocabulary whichever provider counted it (the record keeps the providers' own names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct Turn {
    #[serde(flatten)]
    pub record: TurnRecord,
    /// The turn's tokens: input (what was read from or written to the prompt cache included),
    /// output, cache reads and writes, reasoning.
    pub usage_counts: TokenCounts,
}

impl Turn {
    /// The API's view of `record`.
    pub fn of(record: TurnRecord) -> Self {
        let usage_counts = record.usage.counts();
        Turn { record, usage_counts }
    }
}

impl std::ops::Deref for Turn {
    type Target = TurnRecord;

    fn deref(&self) -> &TurnRecord {
        &self.record
    }
}

/// `202` to `POST /v1/sessions/{id}/inputs`: what a submitted client input did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct Submitted {
    pub session_id: SessionId,
    /// The turn the input started, joined or named; none for settles and resumes.
    pub turn_id: Option<TurnId>,
    /// The turn waits behind the active one (`?queue=true`).
    #[serde(default)]
    pub queued: bool,
}

/// Where a submitted turn-starting input goes when a turn is running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Start a turn; refused while one is active.
    #[default]
    Start,
    /// Queue a turn behind the active one (`?queue=true`).
    Queue,
    /// Steer the active turn (`?steer=true`, a `client.message` only): the message enters it
    /// at its next safe point, or starts the next turn if it ends first.
    Steer,
}

/// The body of `POST /v1/sessions`: a new session of an agent, with no turn yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// The agent the session runs.
    pub agent_id: String,
    /// The new session's id; omitted: `s-<32 hex>`, minted from the OS's randomness. Session
    /// ids are global (one namespace for every owner), so an id others must not guess is
    /// best left to the host.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::openapi::new_session_id"))]
    pub session_id: Option<SessionId>,
}

/// `201` (created) or `200` (the caller's own session of that id existed already) to
/// `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct CreatedSession {
    pub session_id: SessionId,
    pub agent_id: String,
}

/// The body of `POST /v1/sessions/{id}/forks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The completed turn the fork's history runs through.
    pub turn_id: TurnId,
    /// The new session's id; omitted: `fork-<32 hex>`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::openapi::new_session_id"))]
    pub session_id: Option<SessionId>,
}

pub use crate::fork::Forked;

/// `202` to `POST /v1/sessions/{id}/calls/settle`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct Settled {
    pub session_id: SessionId,
}

/// The optional body of `POST /v1/sessions/{id}/cancel`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Recorded on the turn and in the synthetic results of its open tool calls.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `202` to `POST /v1/sessions/{id}/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct Cancelled {
    pub session_id: SessionId,
    /// The turn that ended; none when no turn was active.
    pub turn_id: Option<TurnId>,
}

/// `200` to `DELETE /v1/sessions/{id}`: what was disposed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct Disposed {
    pub session_id: SessionId,
    /// The session and the sub-agent sessions it started, parents first.
    pub disposed: Vec<SessionId>,
}

/// `GET /v1/sessions/{id}`: a session at a glance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct SessionSummary {
    pub session_id: SessionId,
    pub agent_id: String,
    /// The identity that created it (`None` without authentication).
    pub owner: Option<String>,
    pub status: SessionStatus,
    pub active_turn: Option<TurnId>,
    /// Turns waiting to start, in arrival order.
    pub queued_turns: Vec<TurnId>,
    pub open_interrupts: Vec<OpenInterrupt>,
    /// Client tool calls waiting for a `tool.result`.
    pub pending_client_calls: Vec<PendingClientCall>,
    /// Tool calls waiting for a person's `tool.approval`.
    #[serde(default)]
    pub awaiting_approval: Vec<PendingClientCall>,
    /// Open calls of the agent's MCP servers' tools, which the engine runs.
    #[serde(default)]
    pub mcp_calls: Vec<McpCall>,
    pub usage: UsageSummary,
    /// The sequence number of the last durable event (resume the event stream after it).
    pub last_seq: u64,
    /// How many messages the session's tree holds, on every branch.
    pub messages: usize,
    pub created_at: Timestamp,
    /// The session that started this one as a sub-agent, and its tool call this one answers.
    #[serde(default)]
    pub parent: Option<ParentLink>,
    /// The session and turn this one was forked from (`POST .../forks`).
    #[serde(default)]
    pub forked_from: Option<ForkOrigin>,
}

/// What a session is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Nothing to do until a client sends something.
    Idle,
    /// Work is under way (a decision, a model or tool call).
    Running,
    /// Waiting for a client: an open interrupt or a client tool call.
    Waiting,
}

/// An interrupt waiting for `interrupt.resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct OpenInterrupt {
    pub id: InterruptId,
    pub reason: String,
    /// What the client needs to answer, as the worker gave it.
    pub payload: Option<Value>,
}

/// A client tool call waiting for `tool.result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct PendingClientCall {
    pub id: CallId,
    pub name: String,
    /// The arguments as the model wrote them (a JSON text).
    pub arguments: String,
    /// The attempt a `tool.result` answers.
    pub attempt: u32,
}

/// An open call of an MCP server's tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct McpCall {
    pub id: CallId,
    /// The name the model called it by, `<server>__<tool>`.
    pub name: String,
    /// The MCP server, as the agent's configuration names it.
    pub server: String,
    /// The tool's own name on that server.
    pub tool: String,
    /// `queued` (waiting for approval or its turn to be sent), `pending` (sent), or
    /// `retry_scheduled`.
    pub status: CallStatus,
    /// The current attempt (0 before the first).
    pub attempt: u32,
    /// Waiting for a person's `tool.approval`.
    pub awaiting_approval: bool,
}

/// A session's model usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct UsageSummary {
    /// Completed model calls.
    pub llm_calls: u64,
    /// Every numeric usage field summed, in the providers' own names (e.g. `prompt_tokens`).
    pub tokens: BTreeMap<String, u64>,
    /// The same tokens in one vocabulary whichever provider counted them: input (what was
    /// read from or written to the prompt cache included), output, cache reads and writes,
    /// reasoning.
    pub counts: TokenCounts,
    /// In dollars, as an exact decimal string.
    pub cost: String,
}

impl SessionStatus {
    /// What `s` is doing: waiting for a client (an open interrupt, a client tool call, a call
    /// awaiting approval), running, or idle.
    pub fn of(s: &Session) -> Self {
        let waits_for_client = !s.interrupts().is_empty()
            || s.calls().iter().any(|c| (c.is_client_tool() && c.is_pending()) || c.awaiting_approval);
        if waits_for_client {
            SessionStatus::Waiting
        } else if s.active_turn_id().is_some() || s.decision().is_some() || !s.calls().is_empty() {
            SessionStatus::Running
        } else {
            SessionStatus::Idle
        }
    }
}

impl SessionSummary {
    /// The summary of `s`.
    pub fn of(s: &Session) -> Self {
        let tool_calls = |wanted: fn(&CallRecord) -> bool| -> Vec<PendingClientCall> {
            s.calls()
                .iter()
                .filter(|c| wanted(c))
                .filter_map(|c| match &c.spec {
                    CallSpec::ToolCall { name, arguments, .. } => Some(PendingClientCall {
                        id: c.id.clone(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                        attempt: c.attempt,
                    }),
                    _ => None,
                })
                .collect()
        };
        let pending_client_calls = tool_calls(|c| c.is_client_tool() && c.is_pending());
        let awaiting_approval = tool_calls(|c| c.awaiting_approval);
        let mcp_calls = s
            .calls()
            .iter()
            .filter(|c| c.is_server_tool())
            .filter_map(|c| {
                let name = c.name()?;
                let source = s.tool_declaration(name, c.turn_id.as_ref())?.mcp?;
                Some(McpCall {
                    id: c.id.clone(),
                    name: name.to_owned(),
                    server: source.server,
                    tool: source.tool,
                    status: c.status,
                    attempt: c.attempt,
                    awaiting_approval: c.awaiting_approval,
                })
            })
            .collect();
        let open_interrupts: Vec<OpenInterrupt> = s
            .interrupts()
            .iter()
            .map(|i| OpenInterrupt { id: i.id.clone(), reason: i.reason.clone(), payload: i.payload.clone() })
            .collect();
        let status = SessionStatus::of(s);
        SessionSummary {
            session_id: s.id().clone(),
            agent_id: s.agent_id().to_owned(),
            owner: s.identity().id,
            status,
            active_turn: s.active_turn_id().cloned(),
            queued_turns: s.queued_turn_ids().to_vec(),
            open_interrupts,
            pending_client_calls,
            awaiting_approval,
            mcp_calls,
            usage: UsageSummary {
                llm_calls: s.usage().llm_calls,
                tokens: s.usage().tokens.clone(),
                counts: s.usage().counts(),
                cost: s.usage().cost(),
            },
            last_seq: s.events_applied(),
            messages: s.tree().len(),
            created_at: s.created_at(),
            parent: s.init().and_then(|init| init.parent.clone()),
            forked_from: s.init().and_then(|init| init.fork.clone()),
        }
    }
}

/// `GET /v1/sessions/{id}/messages`: a page of the active path, root first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ActivePath {
    pub messages: Vec<Message>,
    /// Pass as `?after=` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<MessageId>,
}

/// `GET /v1/sessions/{id}/messages?tree=1`: a page of the message tree's nodes, parents
/// before children, with the head of the active branch: a [`MessageTree`] and `next_after`
/// (the OpenAPI document says so itself, so `MessageTree` stays the protocol's schema).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TreePage {
    #[serde(flatten)]
    pub tree: MessageTree,
    /// Pass as `?after=` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<MessageId>,
}

/// `GET /v1/sessions/{id}/events`: a page of the durable log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
// One page type in the document, whatever the event type a client reads it with.
#[cfg_attr(feature = "openapi", schemars(rename = "EventPage"))]
pub struct EventPage<E = Event> {
    pub events: Vec<LoggedEvent<E>>,
    /// Pass as `?after=` for the next page; equal to the request's when the page is empty.
    pub next_after: u64,
}

/// The data of an `llm.token.delta` event on `GET /v1/sessions/{id}/events/stream`: model
/// output of a running call, live (a preview: the durable events carry the final message).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct TokenDelta {
    pub call_id: CallId,
    pub delta: StreamDelta,
}

/// `GET /v1/sessions`: a page of the caller's sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct SessionPage {
    pub sessions: Vec<SessionListing>,
    /// Pass as `?cursor=` for the next page; none on the last.
    pub next_cursor: Option<String>,
}

/// Every error answer: `{"error": {"code", "message", "param"?}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ErrorDetail {
    /// Stable and machine-readable, e.g. `turn_already_active`.
    pub code: String,
    /// For people.
    pub message: String,
    /// The offending field's path, for invalid requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
}

/// An error answer with its status: what the router returns and what a client gets back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: reqwest::StatusCode,
    pub code: String,
    pub message: String,
    /// The offending field's path, for invalid requests.
    pub param: Option<String>,
}

impl ApiError {
    /// An error with no param.
    pub fn new(status: reqwest::StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError { status, code: code.to_owned(), message: message.into(), param: None }
    }

    /// The same error, naming the offending field.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// 422 for a request body that is not a valid message of its type.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let param = param.into();
        let error = ApiError::new(reqwest::StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message);
        if param.is_empty() { error } else { error.with_param(param) }
    }

    /// The body this error is answered with.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.clone(),
                message: self.message.clone(),
                param: self.param.clone(),
            },
        }
    }

    /// The error a client reads from a non-success answer: from its error body when it has
    /// one, else from the status and the text (a proxy's page, say).
    pub fn from_answer(status: reqwest::StatusCode, body: &[u8]) -> Self {
        if let Ok(ErrorBody { error }) = serde_json::from_slice::<ErrorBody>(body) {
            return ApiError { status, code: error.code, message: error.message, param: error.param };
        }
        let text = crate::net::short_text(&String::from_utf8_lossy(body), 500);
        let message =
            if text.is_empty() { status.canonical_reason().unwrap_or("error").to_owned() } else { text };
        ApiError::new(status, "http_error", message)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(param) = &self.param {
            write!(f, " (at `{param}`)")?;
        }
        write!(f, " [HTTP {}]", self.status.as_u16())
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;

    #[test]
    fn error_answers_read_back_as_sent() {
        let sent = ApiError::invalid("actions[0].type", "unknown action");
        let body = serde_json::to_vec(&sent.body()).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            serde_json::json!({"error": {"code": "invalid_request", "message": "unknown action", "param": "actions[0].type"}})
        );
        assert_eq!(ApiError::from_answer(StatusCode::UNPROCESSABLE_ENTITY, &body), sent);
        assert_eq!(sent.to_string(), "invalid_request: unknown action (at `actions[0].type`) [HTTP 422]");
        // No param: the key is left out.
        let body = serde_json::to_value(ApiError::new(StatusCode::CONFLICT, "c", "m").body()).unwrap();
        assert_eq!(body, serde_json::json!({"error": {"code": "c", "message": "m"}}));
    }

    #[test]
    fn answers_without_an_error_body_still_read() {
        let e = ApiError::from_answer(StatusCode::BAD_GATEWAY, b"upstream down\n");
        assert_eq!(e.to_string(), "http_error: upstream down [HTTP 502]");
        let e = ApiError::from_answer(StatusCode::NOT_FOUND, b"");
        assert_eq!((e.status.as_u16(), e.message.as_str()), (404, "Not Found"));
    }

    #[test]
    fn a_client_reads_event_pages_as_values_or_events() {
        let page = EventPage::<Event> {
            events: vec![LoggedEvent {
                seq: 7,
                event: Event::TurnEnded {
                    turn_id: "t1".into(),
                    status: turnstone_engine::session::TurnStatus::Completed,
                    data: None,
                    error: None,
                    code: None,
                    at: Timestamp(5),
                },
            }],
            next_after: 7,
        };
        let text = serde_json::to_string(&page).unwrap();
        let lenient: EventPage<Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(lenient.events[0].event["type"], "turn_ended");
        let strict: EventPage = serde_json::from_str(&text).unwrap();
        assert_eq!(strict, page);
    }
}

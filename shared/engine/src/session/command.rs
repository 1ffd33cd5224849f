//! Commands: everything that can change a session, and why one may be refused.

use serde::{Deserialize, Serialize};

use super::records::{CallError, SessionInit, TurnOrigin};
use super::request::Transcript;
use crate::ids::{CallId, DecisionId, InterruptId, MessageId, SessionId, TurnId};
use crate::protocol::{
    Action, AgentTool, CallStatus, ClientInput, ClientMessageInput, Compaction, Content, DecisionResponse,
    LlmResponse, Message, ProtocolError,
};

/// Something that asks to change a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// Create the session (the runtime does this on the first input for an agent).
    Create {
        /// Agent, owner, parent and defaults.
        init: Box<SessionInit>,
    },
    /// A client input.
    Submit {
        input: ClientInput,
        /// Queue a new turn behind the active one instead of refusing it.
        #[serde(default)]
        queue: bool,
        /// Who submits it.
        #[serde(default)]
        origin: TurnOrigin,
    },
    /// A client takes back a turn that waits (queued or steering) before it starts.
    Withdraw { turn_id: TurnId },
    /// A person names the session (1 to `MAX_TITLE_CHARS` characters, trimmed).
    Rename { title: String },
    /// A client reorders the queued turns: those of `order` first, in that order, the others
    /// after them as they were (steering turns keep their places).
    Reorder { order: Vec<TurnId> },
    /// A client truncates the conversation: it now reads through recorded message `head`
    /// (`None`: it is empty), and the next message continues from there (AHP's
    /// `chat/truncated`, before the edited message's turn). Refused while a turn runs.
    Rewind { head: Option<MessageId> },
    /// A new session's history, a fork's copy of its source's path: recorded, in order, as
    /// the active path of a session that has no messages yet. Starts no turn.
    Seed { messages: Vec<Message> },
    /// A fork of this session was made: session `into` continues its conversation through
    /// turn `turn_id` (recorded in the log only, for the session's catalog of chats).
    Forked { into: SessionId, turn_id: TurnId },
    /// A client steers the active turn with a message: it enters the turn at its next safe
    /// point, after the pending tool results and before the next model call (see
    /// [`super::records::TurnRecord::steering`]). With no active turn it starts one.
    Steer { input: ClientMessageInput },
    /// The runtime starts delivering the live decision (claims the effect).
    ClaimDecision {
        decision_id: DecisionId,
        /// The delivery attempt it starts.
        attempt: u32,
    },
    /// The worker answered a decision.
    Answer {
        decision_id: DecisionId,
        /// The delivery attempt that got the answer.
        attempt: u32,
        response: Box<DecisionResponse>,
        /// The paths of the fields the worker's answer carried that the protocol does not
        /// know (`session_id`, `actions[1].trace`), ignored by the lenient parse
        /// ([`crate::protocol::parse_response`]); recorded on `decision.resolved`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ignored_fields: Vec<String>,
        /// How much of the conversation the answered request carried: a windowed request's
        /// answer reads from where its messages start ([`Session::answer_base`]).
        #[serde(default, skip_serializing_if = "Transcript::is_whole")]
        transcript: Transcript,
    },
    /// A delivery of a decision failed.
    DeliveryFailed {
        decision_id: DecisionId,
        attempt: u32,
        /// What went wrong (never the worker's body).
        error: String,
        retryable: bool,
    },
    /// The runtime starts an attempt of a server LLM call (claims the effect).
    ClaimLlmCall {
        call_id: CallId,
        /// The attempt it starts.
        attempt: u32,
    },
    /// A server LLM call attempt ended.
    LlmCallFinished {
        call_id: CallId,
        attempt: u32,
        /// The model's response or the failure.
        outcome: Result<LlmResponse, CallError>,
    },
    /// The runtime compacted the model's view of the conversation for the claimed attempt
    /// `attempt` of server model call `call_id`, before sending it: record the marker (a
    /// summary, with the summarizing call's response, or a clearing of tool results) at the
    /// head, which must be the call's anchor. Fenced by the attempt, so a crashed or timed-out
    /// attempt's compaction never lands after the next one's.
    Compact {
        call_id: CallId,
        attempt: u32,
        compaction: Compaction,
        /// The summarizing call's response (its `content` is the summary); `None` for a clearing.
        response: Option<LlmResponse>,
        tokens_before: u64,
        tokens_after: u64,
        /// `threshold` or `refused`.
        reason: String,
    },
    /// The runtime starts an attempt of a server tool call, an MCP tool (claims the effect).
    ClaimToolCall {
        call_id: CallId,
        /// The attempt it starts.
        attempt: u32,
    },
    /// A server tool call attempt ended: the tool's result (text, or parts when it carries
    /// images), or the failure.
    ToolCallFinished { call_id: CallId, attempt: u32, outcome: Result<Content, CallError> },
    /// The tools of the agent's MCP servers as the runtime listed them now: they replace the
    /// MCP tools of the current agent config (a new config version at the head when they
    /// differ), so the next model call offers what the servers offer.
    McpToolsListed { tools: Vec<AgentTool> },
    /// A worker settles a deferred call (`tool.result`, `tool.error`, `llm.result`, `llm.error`
    /// with an `id`), fenced by attempt.
    Settle { action: Action },
    /// A child session's turn ended (routed from the child's outbox).
    SubAgentFinished {
        /// The tool call the delegation answers.
        tool_call_id: CallId,
        /// The child.
        session_id: SessionId,
        ok: bool,
        /// The child's final output, when ok.
        result: Option<String>,
        /// When not ok.
        error: Option<String>,
        /// When not ok: the failure was transient (the child's turn timed out its model call,
        /// was rate limited, or could not reach its worker), so a delegation with retries left
        /// sends the task again.
        #[serde(default)]
        retryable: bool,
        /// The child's turn that ended; a report for another turn than the delegation's
        /// current attempt is ignored. `None`: not fenced (a failure reported by the runtime).
        #[serde(default)]
        turn_id: Option<TurnId>,
    },
    /// End the active turn and void its open work.
    Cancel {
        /// Why, recorded on the turn and in synthetic tool results.
        reason: String,
    },
    /// Time passed: expire deadlines and start due retries.
    Tick,
    /// The runtime delivered an outbox item.
    OutboxDelivered { seq: u64 },
}

/// Why a command was refused. A refused command writes nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Rejection {
    /// The session has not been created.
    #[error("session {0:?} does not exist")]
    NotFound(SessionId),
    /// The session exists already.
    #[error("session {0:?} already exists")]
    AlreadyExists(SessionId),
    /// The input names another agent than the session's.
    #[error("session runs agent {expected:?}; this input is for {given:?}")]
    AgentMismatch {
        /// The session's agent.
        expected: String,
        /// The input's.
        given: String,
    },
    /// A turn is running and the input did not ask to queue.
    #[error("turn {turn_id:?} is still active: wait for it to end, cancel it, or submit with queue")]
    TurnAlreadyActive {
        /// The running turn.
        turn_id: TurnId,
    },
    /// The branch is paused by open interrupts.
    #[error("the branch is paused by interrupt {}: resume it with interrupt.resume first", .interrupt_ids.join(", "))]
    BranchPaused {
        /// The open interrupts pausing it.
        interrupt_ids: Vec<InterruptId>,
    },
    /// No open interrupt has that id.
    #[error("no open interrupt {id:?} (open: {})", if .open.is_empty() { "none".to_owned() } else { .open.join(", ") })]
    UnknownInterrupt {
        /// The id given.
        id: InterruptId,
        /// The open interrupts.
        open: Vec<InterruptId>,
    },
    /// No call has that id.
    #[error("no call {0:?} in this session")]
    UnknownCall(CallId),
    /// The call settled already.
    #[error("call {0:?} has already settled")]
    CallAlreadySettled(CallId),
    /// The call was voided (fork, cancel, failed turn).
    #[error("call {0:?} was voided (its branch was forked or its turn ended)")]
    CallVoided(CallId),
    /// The settle names an attempt that is not the current one.
    #[error("call {id:?} is at attempt {current}, not {attempt}")]
    StaleAttempt {
        id: CallId,
        /// The attempt given.
        attempt: u32,
        /// The current attempt.
        current: u32,
    },
    /// The call has no running attempt to settle.
    #[error("call {id:?} has no running attempt (status {status:?})")]
    CallNotRunning { id: CallId, status: CallStatus },
    /// An approval for a call that is not waiting for one.
    #[error("call {0:?} is not waiting for approval")]
    NotAwaitingApproval(CallId),
    /// The turn does not wait in the queue (it started, ended, or never was).
    #[error("turn {0:?} is not waiting in the queue")]
    NotQueued(TurnId),
    /// The session's queue of waiting turns is full.
    #[error("{queued} turns already wait behind the active one (limits.queued_turns): wait for one to start")]
    QueueFull {
        /// How many wait.
        queued: usize,
    },
    /// A client tried to settle a call that is not a client tool call.
    #[error("call {0:?} is not a client tool call")]
    NotAClientCall(CallId),
    /// Cancel with no active turn.
    #[error("no active turn to cancel")]
    NoActiveTurn,
    /// The input is malformed in a way its type cannot express.
    #[error("{0}")]
    InvalidInput(ProtocolError),
    /// A claim for an effect that is no longer due (another host took it, or it changed).
    #[error("effect no longer due: {0}")]
    StaleClaim(String),
    /// Not a refusal of the command: it moves the head onto versions of the state or agent
    /// config whose values the head let go. Read the events at these log positions and handle
    /// it again with them in [`super::Ctx::recalled`] (the runtime does; a client never sees it).
    #[error("the command needs the versions written by events {0:?}: read them and handle it again")]
    Recall(Vec<u64>),
}

impl Rejection {
    /// A stable machine-readable code, e.g. `turn_already_active`.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::NotFound(_) => "session_not_found",
            Rejection::AlreadyExists(_) => "session_exists",
            Rejection::AgentMismatch { .. } => "agent_mismatch",
            Rejection::TurnAlreadyActive { .. } => "turn_already_active",
            Rejection::BranchPaused { .. } => "branch_paused",
            Rejection::UnknownInterrupt { .. } => "unknown_interrupt",
            Rejection::UnknownCall(_) => "unknown_call",
            Rejection::CallAlreadySettled(_) => "call_already_settled",
            Rejection::CallVoided(_) => "call_voided",
            Rejection::StaleAttempt { .. } => "stale_attempt",
            Rejection::CallNotRunning { .. } => "call_not_running",
            Rejection::NotAClientCall(_) => "not_a_client_call",
            Rejection::NotAwaitingApproval(_) => "not_awaiting_approval",
            Rejection::QueueFull { .. } => "queue_full",
            Rejection::NotQueued(_) => "turn_not_queued",
            Rejection::NoActiveTurn => "no_active_turn",
            Rejection::InvalidInput(_) => "invalid_input",
            Rejection::StaleClaim(_) => "stale_claim",
            Rejection::Recall(_) => "recall",
        }
    }

    /// An invalid-input rejection at `path`.
    pub fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        Rejection::InvalidInput(ProtocolError::new(path, message))
    }
}

//! Events: the facts a session's log is made of. Folding them in order rebuilds the session.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::outbox::OutboxItem;
use super::records::{
    CallError, CallOutcome, CallRecord, Decision, Interrupt, PendingTrigger, Resolver, SessionInit,
    TurnRecord, TurnStatus,
};
use crate::ids::{CallId, DecisionId, InterruptId, MessageId, SessionId, TurnId};
use crate::protocol::{AgentConfig, CompactionKind, DecisionResponse, ErrorCode, LlmResponse, Message};
use crate::time::Timestamp;

/// One fact in a session's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The session came to be.
    SessionCreated {
        session_id: SessionId,
        /// Agent, owner, parent and defaults.
        init: SessionInit,
        at: Timestamp,
    },
    TurnStarted {
        /// Status active.
        turn: TurnRecord,
    },
    /// A turn was queued behind the active one.
    TurnQueued {
        /// Status queued.
        turn: TurnRecord,
    },
    /// A queued turn became active.
    TurnActivated { turn_id: TurnId, at: Timestamp },
    /// A second idempotency id now names an existing turn (a `client.action` joining it).
    TurnAliased {
        /// The new id.
        alias: TurnId,
        /// The turn it names.
        turn_id: TurnId,
    },
    /// The queued (not steering) turns now wait in this order.
    QueueReordered { order: Vec<TurnId> },
    /// The session's title: taken from its first turn's message, or given by a person.
    SessionTitled { title: String },
    /// A fork of this session was made (`Command::Forked`): only the log keeps it.
    Forked {
        /// The fork.
        session_id: SessionId,
        /// The turn its history runs through.
        turn_id: TurnId,
    },
    /// A steering message (a queued turn with `steering`) entered the active turn at its safe
    /// point: its message is recorded on the path just before, and its id now names that turn.
    TurnSteered {
        /// The steering turn, no longer queued.
        turn_id: TurnId,
        /// The active turn it joined.
        into: TurnId,
    },
    TurnEnded {
        turn_id: TurnId,
        status: TurnStatus,
        /// `done`'s data.
        data: Option<Value>,
        /// Why it failed or was cancelled.
        error: Option<String>,
        /// The class of the failure, when it has one (`budget_exceeded`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<ErrorCode>,
        at: Timestamp,
    },
    /// `done` was recorded while interrupts of the turn are open: the turn ends, completed with
    /// `data`, when the last of them is resumed.
    TurnDone {
        turn_id: TurnId,
        /// `done`'s data.
        data: Option<Value>,
    },
    /// News waits for a decision.
    TriggerQueued { trigger: PendingTrigger },
    /// The pending trigger at `queue_index` was dropped: there is nothing to decide.
    TriggerDropped {
        /// Which pending trigger.
        queue_index: usize,
        reason: String,
    },
    /// A decision opened for the pending trigger at `queue_index`.
    DecisionOpened {
        /// The decision (trigger and proposal fixed from here on).
        decision: Decision,
        /// Which pending trigger it consumed.
        queue_index: usize,
    },
    /// A delivery of the live decision started.
    DecisionDispatched {
        decision_id: DecisionId,
        attempt: u32,
        /// When it times out.
        deadline: Option<Timestamp>,
        /// When it happened (absent in logs written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
    },
    /// A delivery failed and another will follow.
    DecisionRetryScheduled {
        decision_id: DecisionId,
        /// The failed attempt.
        attempt: u32,
        error: String,
        /// When the next may start.
        retry_at: Timestamp,
        /// When it happened (absent in logs written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
    },
    /// The live decision was answered.
    DecisionResolved {
        decision_id: DecisionId,
        /// Who answered.
        by: Resolver,
        /// The answer, its `messages` trimmed to the news: the first `omitted_messages` of them
        /// (the recorded conversation they echo) are left out.
        response: DecisionResponse,
        /// How many leading messages of the answer were left out.
        #[serde(default, skip_serializing_if = "is_zero")]
        omitted_messages: usize,
        /// The answer's `state` was left out: the `state.written` that follows holds it (none
        /// follows when it was the current state already), so a worker's memory is logged
        /// once per answer, not twice.
        #[serde(default, skip_serializing_if = "is_false")]
        omitted_state: bool,
        /// The paths of the unknown fields the worker's answer carried, which the lenient
        /// parse ignored (e.g. `session_id`, `actions[1].trace`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ignored_fields: Vec<String>,
        /// When it happened (absent in logs written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
    },
    /// An engine-hosted agent's step: the engine accepted its own proposal for a trigger on the
    /// spot (no worker sees it), so the decision never stays live. What the step did follows as
    /// its own events (`message.recorded`, `call.created`, `turn.ended`, ...); this event keeps
    /// only what they do not say: which decision it was, what it decided on, the news it took
    /// off the queue and the call whose result it consumed. The proposal is not kept: replay
    /// needs only the events that follow, and the engine derives the same proposal from the
    /// trigger. A step whose news arrived in the same command and that consumes no call result
    /// writes no event of its own (see ARCHITECTURE.md, "How a turn flows").
    DecisionAccepted {
        decision_id: DecisionId,
        /// The trigger's wire name (`client.messages`, `llm.finished`, ...).
        trigger: String,
        /// The settled call whose `*.finished` trigger this was: it is reported (leaves the
        /// open calls), as `call.reported` would.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<CallId>,
        /// Which pending trigger it consumed, when the news was queued by an earlier command
        /// (`None`: the news arrived in this command and was never queued).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue_index: Option<usize>,
    },
    /// The live decision failed for good.
    DecisionFailed {
        decision_id: DecisionId,
        error: String,
        /// When it happened (absent in logs written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
    },
    /// The live decision was withdrawn (its turn was cancelled); a late answer is ignored.
    DecisionVoided { decision_id: DecisionId, reason: String },
    /// An action of a response was not carried out.
    ActionIgnored {
        decision_id: DecisionId,
        /// The action's index in `actions`.
        index: usize,
        reason: String,
    },
    /// A message was recorded and became the head.
    MessageRecorded {
        message: Message,
        /// `None`: a root.
        parent_id: Option<MessageId>,
    },
    /// The head moved to a recorded node.
    HeadMoved {
        /// `None`: the empty root.
        head_id: Option<MessageId>,
    },
    /// Agent state was written at the head.
    StateWritten {
        /// The head it was written at.
        anchor: Option<MessageId>,
        value: Value,
    },
    /// Agent config was written at the head.
    AgentWritten {
        /// The head it was written at.
        anchor: Option<MessageId>,
        config: AgentConfig,
    },
    /// A head move made state version `index` current again, whose value the head had let go
    /// (read back from its `state.written`): the head holds it again.
    StateRestored { index: u32, value: Value },
    /// The same for agent config version `index`.
    AgentRestored { index: u32, config: AgentConfig },
    /// A call was created.
    CallCreated {
        /// Status queued.
        call: CallRecord,
    },
    /// An attempt of a call started.
    CallDispatched {
        call_id: CallId,
        attempt: u32,
        /// When it times out.
        deadline: Option<Timestamp>,
        /// When it happened (absent in logs written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
    },
    /// An attempt failed; another follows after backoff.
    CallRetryScheduled {
        call_id: CallId,
        /// The failed attempt.
        attempt: u32,
        error: CallError,
        /// When the next may start.
        retry_at: Timestamp,
        /// When it happened (absent in logs written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
    },
    /// A client approved a call waiting for approval: it starts. (A denial settles it.)
    CallApproved { call_id: CallId },
    /// A call waiting for its retry is ready for its next attempt.
    CallRequeued { call_id: CallId },
    /// A call settled for good.
    CallSettled {
        call_id: CallId,
        /// The attempt that settled it.
        attempt: u32,
        outcome: CallOutcome,
        /// When it happened (absent in logs written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
    },
    /// The model's view of the conversation was compacted before an attempt of a server
    /// model call (`call_id`, at `attempt`, which it was claimed for): the marker `marker_id`
    /// (recorded just before, at the head) now covers the path through its `through`, and the
    /// call reads from the marker.
    ContextCompacted {
        call_id: CallId,
        attempt: u32,
        /// The marker message.
        marker_id: MessageId,
        /// What the marker does.
        kind: CompactionKind,
        /// The last message it covers.
        through: MessageId,
        /// The summarizing model call's response (model, usage, cost; its text is the
        /// marker's content); `None` for a clearing, which calls no model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response: Option<LlmResponse>,
        /// The request's estimated tokens before and after.
        tokens_before: u64,
        tokens_after: u64,
        /// Why: `threshold` (the estimate passed the agent's `compact_at`) or `refused` (the
        /// provider refused the request for its length).
        reason: String,
        at: Timestamp,
    },
    /// A settled call was reported (its `*.finished` decision opened, or the client's view
    /// carried its result): it leaves the session's open calls.
    CallReported { call_id: CallId },
    /// An open call was voided (fork, cancel, failed turn); late results are refused.
    CallVoided { call_id: CallId, reason: String },
    /// An interrupt paused the branch.
    InterruptOpened { interrupt: Interrupt },
    /// An interrupt was resumed.
    InterruptResumed {
        interrupt_id: InterruptId,
        /// The client's answer.
        payload: Option<Value>,
    },
    /// An interrupt was closed without a resume (its turn ended).
    InterruptClosed { interrupt_id: InterruptId },
    /// Work for another session was queued.
    OutboxQueued { seq: u64, item: OutboxItem },
    /// Work for another session was delivered.
    OutboxDelivered { seq: u64 },
    /// Undelivered work for another session was withdrawn (a delegation that failed or was
    /// voided before its child was created: its spawn and message are not delivered).
    OutboxWithdrawn { seq: u64, reason: String },
}

impl Event {
    /// The event's name, e.g. `call.settled`, as golden traces and the log show it.
    /// When it happened, for the events that say (logs written before some of them recorded
    /// it leave it out).
    pub fn at(&self) -> Option<Timestamp> {
        match self {
            Event::SessionCreated { at, .. }
            | Event::TurnActivated { at, .. }
            | Event::TurnEnded { at, .. } => Some(*at),
            Event::TurnStarted { turn } => Some(turn.started_at.unwrap_or(turn.submitted_at)),
            Event::DecisionDispatched { at, .. }
            | Event::DecisionRetryScheduled { at, .. }
            | Event::DecisionResolved { at, .. }
            | Event::DecisionFailed { at, .. }
            | Event::CallDispatched { at, .. }
            | Event::CallRetryScheduled { at, .. }
            | Event::CallSettled { at, .. } => *at,
            Event::ContextCompacted { at, .. } => Some(*at),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Event::SessionCreated { .. } => "session.created",
            Event::TurnStarted { .. } => "turn.started",
            Event::TurnQueued { .. } => "turn.queued",
            Event::TurnActivated { .. } => "turn.activated",
            Event::TurnAliased { .. } => "turn.aliased",
            Event::TurnSteered { .. } => "turn.steered",
            Event::Forked { .. } => "session.forked",
            Event::QueueReordered { .. } => "turn.queue_reordered",
            Event::SessionTitled { .. } => "session.titled",
            Event::TurnEnded { .. } => "turn.ended",
            Event::TurnDone { .. } => "turn.done",
            Event::TriggerQueued { .. } => "trigger.queued",
            Event::TriggerDropped { .. } => "trigger.dropped",
            Event::DecisionOpened { .. } => "decision.opened",
            Event::DecisionDispatched { .. } => "decision.dispatched",
            Event::DecisionRetryScheduled { .. } => "decision.retry_scheduled",
            Event::DecisionResolved { .. } => "decision.resolved",
            Event::DecisionAccepted { .. } => "decision.accepted",
            Event::DecisionFailed { .. } => "decision.failed",
            Event::DecisionVoided { .. } => "decision.voided",
            Event::ActionIgnored { .. } => "action.ignored",
            Event::MessageRecorded { .. } => "message.recorded",
            Event::HeadMoved { .. } => "head.moved",
            Event::StateWritten { .. } => "state.written",
            Event::AgentWritten { .. } => "agent.written",
            Event::StateRestored { .. } => "state.restored",
            Event::AgentRestored { .. } => "agent.restored",
            Event::CallCreated { .. } => "call.created",
            Event::CallDispatched { .. } => "call.dispatched",
            Event::CallRetryScheduled { .. } => "call.retry_scheduled",
            Event::CallApproved { .. } => "call.approved",
            Event::CallRequeued { .. } => "call.requeued",
            Event::CallSettled { .. } => "call.settled",
            Event::ContextCompacted { .. } => "context.compacted",
            Event::CallReported { .. } => "call.reported",
            Event::CallVoided { .. } => "call.voided",
            Event::InterruptOpened { .. } => "interrupt.opened",
            Event::InterruptResumed { .. } => "interrupt.resumed",
            Event::InterruptClosed { .. } => "interrupt.closed",
            Event::OutboxQueued { .. } => "outbox.queued",
            Event::OutboxDelivered { .. } => "outbox.delivered",
            Event::OutboxWithdrawn { .. } => "outbox.withdrawn",
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

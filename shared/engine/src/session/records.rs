//! The records a session keeps: calls, decisions, turns, interrupts, versions, outbox, usage.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::request::Transcript;
use crate::ids::{CallId, DecisionId, InterruptId, MessageId, SessionId, TurnId};
use crate::llm_format::usage::TokenCounts;
use crate::protocol::{
    AgentConfig, AgentTool, CallKind, CallStatus, ClientContext, ContentPart, DecisionResponse, DraftMessage,
    ErrorCode, LlmCallAction, LlmFormat, LlmHandler, LlmResponse, RetryPolicy, ToolHandler, Trigger,
    WorkerIdentity,
};
use crate::time::Timestamp;

/// The engine's default retry policies, per kind of work.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Defaults {
    /// Server and worker LLM calls.
    pub llm: RetryPolicy,
    /// Worker tool calls ("default: no retry").
    pub tool: RetryPolicy,
    /// Client tool calls: a person may take their time, so no timeout by default.
    pub client_tool: RetryPolicy,
    /// Sub-agent delegations.
    pub sub_agent: RetryPolicy,
    /// Delivering a decision to the worker.
    pub decision: RetryPolicy,
}

impl Defaults {
    /// Whether these are the engine's defaults.
    pub fn is_default(&self) -> bool {
        *self == Defaults::default()
    }
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            llm: RetryPolicy {
                timeout_secs: Some(120.0),
                max_retries: 2,
                backoff_base_secs: 1.0,
                backoff_max_secs: 30.0,
            },
            tool: RetryPolicy {
                timeout_secs: Some(300.0),
                max_retries: 0,
                backoff_base_secs: 1.0,
                backoff_max_secs: 30.0,
            },
            client_tool: RetryPolicy::NONE,
            sub_agent: RetryPolicy::NONE,
            decision: RetryPolicy {
                timeout_secs: Some(30.0),
                max_retries: 3,
                backoff_base_secs: 1.0,
                backoff_max_secs: 30.0,
            },
        }
    }
}

/// How a child session is tied to the parent that spawned it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ParentLink {
    /// The parent session.
    pub session_id: SessionId,
    /// The parent's tool call this delegation answers.
    pub tool_call_id: CallId,
}

/// Where a forked session's history comes from: its source session's active path as it was
/// when one of its turns ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ForkOrigin {
    /// The source session.
    pub session_id: SessionId,
    /// The source's turn whose end the history runs through.
    pub turn_id: TurnId,
}

/// What a call is, beyond its lifecycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallSpec {
    ToolCall {
        name: String,
        /// The raw argument string, as the model wrote it (or the action's JSON serialized).
        arguments: String,
        handler: ToolHandler,
    },
    /// A model call; the request is built from the anchor when an attempt starts.
    LlmCall {
        /// The action as given (its omitted fields fill at attempt time).
        action: LlmCallAction,
        handler: LlmHandler,
        stream: bool,
        /// Provider format for worker-run calls.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        format: Option<LlmFormat>,
        /// The system prompt, fixed when the call was requested (none with explicit messages).
        /// Neither it nor the offered tools are copied here when the config they come from is
        /// known for good: a session without a worker keeps its declared config (it never
        /// changes after `session.start`), one with a worker names the version (`agent`). They
        /// are worked out when a request is built, equal to what a copy would hold, and a
        /// call's record (in `call.created`, and in the head while it is open) stays small
        /// whatever the agent's size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        system: Option<String>,
        /// In a session with a worker, whose config can change: the agent config version (its
        /// index among the session's versions, which are kept for good) in force when the call
        /// was requested. Its system prompt and tools are the call's, worked out when a request
        /// is built instead of copied here (records written before hold copies).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<u32>,
    },
    SubAgent {
        /// The child's agent.
        agent_id: String,
        /// The child session.
        session_id: SessionId,
    },
}

/// A call failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallError {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
    /// Whether another attempt may follow (while the policy has retries left).
    pub retryable: bool,
}

impl CallError {
    /// A terminal error with no code.
    pub fn terminal(error: impl Into<String>) -> Self {
        CallError { error: error.into(), code: None, detail: None, retryable: false }
    }

    /// The retryable error of an attempt that ran past its deadline.
    pub fn deadline_exceeded(attempt: u32) -> Self {
        CallError {
            error: format!("attempt {attempt} ran past its deadline"),
            code: Some(ErrorCode::DeadlineExceeded),
            detail: None,
            retryable: true,
        }
    }
}

/// A successful call's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum CallValue {
    /// A tool's result or a sub-agent's output, as text.
    Text(String),
    /// A server tool's result that is more than text (an MCP tool's images): the parts of
    /// the tool message that records it.
    Parts(Vec<ContentPart>),
    /// A model's response.
    Llm(LlmResponse),
}

/// How a call settled.
pub type CallOutcome = Result<CallValue, CallError>;

/// A call and its lifecycle, kept until its `*.finished` trigger is delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub id: CallId,
    pub spec: CallSpec,
    pub status: CallStatus,
    /// The current attempt (0 before the first starts).
    pub attempt: u32,
    /// When the current attempt times out; `None` while no attempt runs, or with no timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
    /// When the next attempt may start; set only while the status is `retry_scheduled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Timestamp>,
    /// The head when the call was requested; a fork that leaves it off the active path voids
    /// the call.
    pub anchor: Option<MessageId>,
    /// `None` for a call made outside any turn (e.g. at `session.start`).
    pub turn_id: Option<TurnId>,
    pub policy: RetryPolicy,
    /// Set once it settled (status completed or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<CallOutcome>,
    /// A call of a tool declared `approval = "always"`: it stays queued, not started, until a
    /// client approves it (`call.approved`) or denies it (settled with the denial).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub awaiting_approval: bool,
}

impl CallRecord {
    /// The wire kind.
    pub fn kind(&self) -> CallKind {
        match self.spec {
            CallSpec::ToolCall { .. } => CallKind::ToolCall,
            CallSpec::LlmCall { .. } => CallKind::LlmCall,
            CallSpec::SubAgent { .. } => CallKind::SubAgent,
        }
    }

    /// Whether it settled (completed or failed).
    pub fn is_settled(&self) -> bool {
        matches!(self.status, CallStatus::Completed | CallStatus::Failed)
    }

    /// Whether an attempt is running.
    pub fn is_pending(&self) -> bool {
        self.status == CallStatus::Pending
    }

    /// Whether `pending_calls` counts it: tool and sub-agent calls only.
    pub fn counts_as_pending(&self) -> bool {
        self.kind() != CallKind::LlmCall
    }

    /// The tool name or sub-agent id this call answers to.
    pub fn name(&self) -> Option<&str> {
        match &self.spec {
            CallSpec::ToolCall { name, .. } => Some(name),
            CallSpec::SubAgent { agent_id, .. } => Some(agent_id),
            CallSpec::LlmCall { .. } => None,
        }
    }

    /// Whether it is a server-run LLM call.
    pub fn is_server_llm(&self) -> bool {
        matches!(self.spec, CallSpec::LlmCall { handler: LlmHandler::Server, .. })
    }

    /// Whether it is a tool call the engine runs (an MCP tool).
    pub fn is_server_tool(&self) -> bool {
        matches!(self.spec, CallSpec::ToolCall { handler: ToolHandler::Server, .. })
    }

    /// Whether the engine runs it (a server LLM call or an MCP tool's call): no worker or
    /// client may settle it.
    pub fn is_engine_run(&self) -> bool {
        self.is_server_llm() || self.is_server_tool()
    }

    /// Whether it is a client tool call.
    pub fn is_client_tool(&self) -> bool {
        matches!(self.spec, CallSpec::ToolCall { handler: ToolHandler::Client, .. })
    }
}

/// Who resolved a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolver {
    /// The engine accepted its own proposal (agent without a worker).
    Engine,
    /// The worker answered.
    Worker,
}

/// The live decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Redeliveries carry the same id.
    pub id: DecisionId,
    /// As materialized when the decision opened; a view kept by reference is spelled out by
    /// [`Decision::wire_trigger`].
    pub trigger: Trigger,
    /// Spelled out by [`Decision::wire_proposal`] when kept by reference.
    pub proposed: DecisionResponse,
    pub turn_id: Option<TurnId>,
    /// Deliveries started (0 for an engine-hosted decision, which is never delivered).
    pub attempts: u32,
    /// When the running delivery times out; `None` while none runs.
    pub deadline: Option<Timestamp>,
    pub in_flight: bool,
    /// The next delivery may not start before this.
    pub retry_at: Option<Timestamp>,
    /// The call the trigger is about (execute and finished triggers): `tool.result` or
    /// `llm.result` without an id answer it.
    pub call_id: Option<CallId>,
    /// When set, the trigger's `client.messages` view is this path followed by its messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_base: Option<PathRef>,
    /// When set, the proposal's messages are this path followed by its messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal_base: Option<PathRef>,
}

/// The recorded path from the root to `head`. Messages are immutable, so the path to a node
/// never changes: a decision keeps the conversation it shows by reference, and what it
/// stores (in its event and in the head) does not grow with the transcript.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathRef {
    /// The last node of the path (`None`: the empty path).
    pub head: Option<MessageId>,
}

impl Decision {
    /// The trigger as the wire shows it (a view kept by reference is spelled out), with the
    /// recorded part of a client's view cut to `transcript` (`new_from` counted in what is left).
    pub fn wire_trigger(&self, tree: &super::Tree, transcript: Transcript) -> Trigger {
        let Trigger::ClientMessages(t) = &self.trigger else { return self.trigger.clone() };
        let mut t = t.clone();
        let before = match &self.view_base {
            Some(base) => {
                let (messages, before) = prefixed(tree, base, &t.messages, transcript);
                t.messages = messages;
                before
            }
            // A view the client spelled out: what precedes the news is recorded.
            None => {
                let before = match transcript {
                    Transcript::Whole => 0,
                    Transcript::Last(n) => t.new_from.saturating_sub(n.get()),
                };
                t.messages.drain(..before);
                before
            }
        };
        t.new_from = t.new_from.saturating_sub(before);
        Trigger::ClientMessages(t)
    }

    /// The proposal as the wire shows it (messages kept by reference spelled out, as far as
    /// `transcript` reaches).
    pub fn wire_proposal(&self, tree: &super::Tree, transcript: Transcript) -> DecisionResponse {
        let mut proposed = self.proposed.clone();
        if let Some(base) = &self.proposal_base {
            let tail = proposed.messages.as_deref().unwrap_or_default();
            proposed.messages = Some(prefixed(tree, base, tail, transcript).0);
        }
        proposed
    }

    /// Whether the engine proposes nothing at all.
    pub fn proposes_nothing(&self) -> bool {
        self.proposed.is_empty() && self.proposal_base.is_none()
    }
}

/// The path to `base` (its end, as `transcript` says) then `tail`; and how many messages of
/// the path were left out.
fn prefixed(
    tree: &super::Tree,
    base: &PathRef,
    tail: &[DraftMessage],
    transcript: Transcript,
) -> (Vec<DraftMessage>, usize) {
    let (path, before) = match transcript {
        Transcript::Whole => (tree.path_to(base.head.as_ref()), 0),
        Transcript::Last(n) => {
            let (end, before) = tree.path_end(base.head.as_ref(), n.get());
            (end.into_iter().map(|node| &node.message).collect(), before)
        }
    };
    let mut messages: Vec<DraftMessage> = Vec::with_capacity(path.len() + tail.len());
    messages.extend(path.into_iter().map(crate::protocol::Message::to_draft));
    messages.extend_from_slice(tail);
    (messages, before)
}

/// News waiting for its decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingTrigger {
    pub source: TriggerSource,
    pub turn_id: Option<TurnId>,
}

/// What a pending trigger will become when its decision opens (materialized then, against
/// the session as it is at that time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TriggerSource {
    /// `session.start`.
    SessionStart,
    /// `client.message`: one message at the head, and the client context it may bring.
    ClientMessage {
        message: DraftMessage,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client: Option<ClientContext>,
    },
    /// `client.messages`: the client's full view.
    ClientMessages {
        /// The view (system messages already dropped).
        messages: Vec<DraftMessage>,
        client: ClientContext,
    },
    /// `client.action`.
    ClientAction {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args: Option<Value>,
    },
    /// `tool.execute` for a worker tool call.
    ToolExecute { call_id: CallId },
    /// `llm.execute` for a worker LLM call.
    LlmExecute { call_id: CallId },
    /// `tool.finished`, `llm.finished` or `sub_agent.finished`, by the call's kind.
    CallFinished { call_id: CallId },
    /// `interrupt.resumed`.
    InterruptResumed {
        interrupt_id: InterruptId,
        /// The client's answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<Value>,
    },
}

impl TriggerSource {
    /// The call this trigger is about, if any.
    pub fn call_id(&self) -> Option<&CallId> {
        match self {
            TriggerSource::ToolExecute { call_id }
            | TriggerSource::LlmExecute { call_id }
            | TriggerSource::CallFinished { call_id } => Some(call_id),
            _ => None,
        }
    }
}

/// Where a turn is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// Waiting for the active turn to end.
    Queued,
    /// Running.
    Active,
    /// Ended by `done`.
    Completed,
    /// Ended by a failure.
    Failed,
    /// Ended by cancel.
    Cancelled,
}

impl TurnStatus {
    /// Whether the turn has ended.
    pub fn is_ended(self) -> bool {
        matches!(self, TurnStatus::Completed | TurnStatus::Failed | TurnStatus::Cancelled)
    }
}

/// Who started a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum TurnOrigin {
    #[default]
    Client,
    /// The parent session, through `message.send`.
    Parent,
}

/// The input that starts a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TurnInput {
    /// `client.message`, with the client context it may bring (an extension).
    Message {
        message: DraftMessage,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client: Option<ClientContext>,
    },
    /// `client.messages`.
    Messages { messages: Vec<DraftMessage>, client: ClientContext },
    /// `client.action`.
    Action {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args: Option<Value>,
    },
}

impl TurnInput {
    /// The text of the user's message it brings: the message, or a view's last user message.
    pub fn user_text(&self) -> Option<String> {
        match self {
            TurnInput::Message { message, .. } => Some(message.content_text()),
            TurnInput::Messages { messages, .. } => messages
                .iter()
                .rev()
                .find(|m| m.role == crate::protocol::Role::User)
                .map(|m| m.content_text()),
            TurnInput::Action { .. } => None,
        }
    }
}

/// A turn: from a client input to `done`, failure or cancel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TurnRecord {
    /// Its idempotency id.
    pub id: TurnId,
    pub status: TurnStatus,
    pub origin: TurnOrigin,
    /// What starts it; kept only while the turn waits in the queue (its trigger carries it
    /// once it starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<TurnInput>,
    /// Client tools the input brought, layered onto the agent's tools for this turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<AgentTool>,
    /// The client that brought them and runs their calls, when the input named it
    /// (`ClientContext::client_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    pub submitted_at: Timestamp,
    /// `None` while queued.
    pub started_at: Option<Timestamp>,
    /// `None` until it ends.
    pub ended_at: Option<Timestamp>,
    /// `done`'s data.
    pub data: Option<Value>,
    /// Why it failed or was cancelled.
    pub error: Option<String>,
    /// The class of the failure, when it has one (`budget_exceeded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// Model usage of the turn's LLM calls.
    pub usage: Usage,
    /// `done` was recorded (its data in `data`) while interrupts of the turn were open: the
    /// turn ends, completed, when the last of them is resumed. Its decisions propose nothing
    /// more meanwhile.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done_pending: bool,
    /// A message sent to steer the active turn: it waits, queued, for that turn's next safe
    /// point (`turn.steered` then merges it into the turn), and starts as a turn of its own if
    /// the turn ends first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub steering: bool,
}

/// What a delegation sent its child: the message of its `message.send` and the turn id of
/// the first attempt. A retry sends the message again as a fresh turn, [`ChildTask::turn_id_for`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildTask {
    pub message: DraftMessage,
    /// The first attempt's turn id in the child (`<decision id>.<action index>`).
    pub turn_id: TurnId,
}

impl ChildTask {
    /// The child's turn id for `attempt` of the delegation: the first attempt's, then
    /// `<first>.retry<n>` for the n-th retry (deterministic, so a redelivery is a no-op).
    pub fn turn_id_for(&self, attempt: u32) -> TurnId {
        if attempt <= 1 {
            return self.turn_id.clone();
        }
        TurnId::new(format!("{}.retry{}", self.turn_id, attempt - 1))
    }
}

/// An open interrupt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interrupt {
    pub id: InterruptId,
    /// Why, for the client.
    pub reason: String,
    /// Anything the client needs to answer.
    pub payload: Option<Value>,
    /// The head it paused (`None`: raised before any message, pauses every branch).
    pub anchor: Option<MessageId>,
    /// Closing the turn closes the interrupt; `None` (raised outside a turn) closes with any.
    pub turn_id: Option<TurnId>,
}

/// A value written on a branch: it applies from `anchor` down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versioned<T> {
    /// The head when it was written.
    pub anchor: Option<MessageId>,
    pub value: T,
}

/// Model usage, accumulated.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Usage {
    /// Completed model calls (successful settles only).
    pub llm_calls: u64,
    /// Every numeric usage field summed, nested fields joined by dots
    /// (e.g. `prompt_tokens`, `completion_tokens_details.reasoning_tokens`).
    pub tokens: BTreeMap<String, u64>,
    /// Cost in pico-dollars (10^-12), summed exactly from the decimal strings. Serialized as
    /// a decimal string: JSON numbers (and serde's buffering of tagged enums) stop at 64 bits.
    #[serde(with = "i128_string")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub cost_picodollars: i128,
}

mod i128_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &i128, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i128, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl Usage {
    /// Adds one model call's usage and cost.
    pub fn add(&mut self, usage: Option<&Value>, cost: Option<&str>) {
        self.llm_calls += 1;
        if let Some(usage) = usage {
            add_numbers(&mut self.tokens, "", usage);
        }
        if let Some(p) = cost.and_then(parse_picodollars) {
            self.cost_picodollars += p;
        }
    }

    /// Input, output, cache and reasoning tokens in one vocabulary, whichever providers
    /// counted them.
    pub fn counts(&self) -> TokenCounts {
        TokenCounts::of_sums(&self.tokens)
    }

    /// The cost as a decimal string of dollars, e.g. `0.0123`.
    pub fn cost(&self) -> String {
        format_picodollars(self.cost_picodollars)
    }
}

fn add_numbers(into: &mut BTreeMap<String, u64>, prefix: &str, value: &Value) {
    match value {
        Value::Number(n) => {
            if let Some(n) = n.as_u64() {
                *into.entry(prefix.to_owned()).or_default() += n;
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                add_numbers(into, &key, v);
            }
        }
        _ => {}
    }
}

/// Parses a decimal dollar string (`"0.0012"`, `"-1"`, `"3."`) into pico-dollars.
pub fn parse_picodollars(text: &str) -> Option<i128> {
    let text = text.trim();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    if !whole.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let whole: i128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let mut frac_digits: String = frac.chars().take(12).collect();
    while frac_digits.len() < 12 {
        frac_digits.push('0');
    }
    let frac: i128 = frac_digits.parse().ok()?;
    let value = whole.checked_mul(1_000_000_000_000)?.checked_add(frac)?;
    Some(if negative { -value } else { value })
}

/// Formats pico-dollars as a decimal dollar string without trailing zeros.
pub fn format_picodollars(p: i128) -> String {
    let sign = if p < 0 { "-" } else { "" };
    let p = p.unsigned_abs();
    let whole = p / 1_000_000_000_000;
    let frac = p % 1_000_000_000_000;
    if frac == 0 {
        return format!("{sign}{whole}");
    }
    let frac = format!("{frac:012}");
    format!("{sign}{whole}.{}", frac.trim_end_matches('0'))
}

/// What a session holds for the agent: declared config and whether a worker answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInit {
    pub agent_id: String,
    /// The owner.
    pub identity: WorkerIdentity,
    /// The agent's declared config, proposed at `session.start`. A session's snapshot leaves
    /// it out (see [`crate::session::Session::restore_declared`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<AgentConfig>,
    /// Whether a worker webhook answers decisions (otherwise the engine accepts proposals).
    pub has_worker: bool,
    /// The parent, for a sub-agent's session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// Ancestor session ids, nearest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ancestry: Vec<SessionId>,
    /// Omitted when they are the engine's defaults (every head carries the init).
    #[serde(default, skip_serializing_if = "Defaults::is_default")]
    pub defaults: Defaults,
    /// The agent's limits on each turn's model use (none: unlimited).
    #[serde(default, skip_serializing_if = "Budget::is_unlimited")]
    pub budget: Budget,
    /// For a fork: the session and turn its history was copied from (`Command::Seed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkOrigin>,
}

/// An agent's limits on what one turn may spend on model calls. A turn whose usage passes one
/// ends as failed with code `budget_exceeded`: checked after each of its model calls settles
/// and before each new one is made (ARCHITECTURE.md, "Decisions where the design was silent").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Budget {
    /// The most a turn's model calls may cost, in pico-dollars (10^-12 dollars, as
    /// [`Usage::cost_picodollars`]; [`parse_picodollars`] reads a dollar string such as
    /// `"0.50"`). Serialized as a decimal string, like the usage's cost.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_i128_string")]
    pub max_cost_picodollars: Option<i128>,
    /// The most model calls a turn may make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_llm_calls: Option<u64>,
}

impl Budget {
    /// Whether it limits nothing.
    pub fn is_unlimited(&self) -> bool {
        self.max_cost_picodollars.is_none() && self.max_llm_calls.is_none()
    }
}

mod opt_i128_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<i128>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i128>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => text.parse().map(Some).map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_sums_exactly() {
        let mut u = Usage::default();
        u.add(None, Some("0.1"));
        u.add(None, Some("0.2"));
        assert_eq!(u.cost(), "0.3");
        assert_eq!(parse_picodollars("abc"), None);
        assert_eq!(parse_picodollars("-1.5"), Some(-1_500_000_000_000));
        assert_eq!(format_picodollars(1), "0.000000000001");
    }

    #[test]
    fn usage_sums_nested_numbers() {
        let mut u = Usage::default();
        let v = serde_json::json!({"prompt_tokens": 3, "details": {"cached": 1}, "model": "x"});
        u.add(Some(&v), None);
        u.add(Some(&v), None);
        assert_eq!(u.tokens.get("prompt_tokens"), Some(&6));
        assert_eq!(u.tokens.get("details.cached"), Some(&2));
        assert_eq!(u.llm_calls, 2);
    }
}

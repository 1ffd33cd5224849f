//! The decision exchange: what the engine sends a worker, and what it answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::action::Action;
use super::agent::{AgentConfig, Handler};
use super::message::{DraftMessage, Message, MessageTree};
use super::trigger::Trigger;
use crate::ids::{CallId, DecisionId, MessageId, SessionId, TurnId};

/// One decision, POSTed to the worker (or accepted by the engine itself).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct DecisionRequest {
    pub session_id: SessionId,
    /// A redelivery carries the same id.
    pub decision_id: DecisionId,
    /// The session's agent.
    pub agent_id: String,
    /// The session owner.
    pub identity: WorkerIdentity,
    pub trigger: Trigger,
    /// What the engine would do; empty when it has no default.
    pub proposed: DecisionResponse,
    /// The agent state, verbatim.
    pub state: Value,
    /// The agent config on this branch; `null` when nothing has set one. Required on the wire.
    // `Nullable`: schemars would take an `Option` as optional; `nullable` requires it.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Nullable<AgentConfig>"))]
    #[serde(deserialize_with = "super::parse::nullable")]
    pub agent: Option<AgentConfig>,
    /// Calls not yet reported back.
    pub calls: Vec<Call>,
    /// Tool and sub-agent calls not yet reported back.
    pub pending_calls: usize,
    /// The active conversation path, root to head.
    pub messages: Vec<Message>,
    /// Every recorded message.
    pub message_tree: MessageTree,
    /// Ancestor session ids, for sub-agents (nearest last).
    pub ancestry: Vec<SessionId>,
    /// Delivery attempts of this decision.
    pub attempts: u32,
    /// When this delivery times out. Required on the wire, may be `null`.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Nullable<String>"))]
    #[serde(deserialize_with = "super::parse::nullable")]
    pub deadline: Option<String>,
    /// The turn's idempotency id. Required on the wire, may be `null`.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Nullable<TurnId>"))]
    #[serde(deserialize_with = "super::parse::nullable")]
    pub turn_id: Option<TurnId>,
}

/// The session owner, without the tenant.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct WorkerIdentity {
    /// The owner's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Owner metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// A call's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    ToolCall,
    LlmCall,
    SubAgent,
}

/// Where a call is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// An attempt is running.
    Pending,
    /// Settled with a result; not yet reported.
    Completed,
    /// Settled with an error; not yet reported.
    Failed,
    /// Waiting for its next attempt.
    RetryScheduled,
    /// Created, waiting for its first attempt to start.
    Queued,
}

/// A call as a decision sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct Call {
    pub id: CallId,
    pub kind: CallKind,
    pub status: CallStatus,
    /// The current attempt (0 before the first starts).
    pub attempt: u32,
    /// When the current attempt times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// The head when the call was requested (`None`: the empty tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<MessageId>,
    /// The tool (tool calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The raw argument string (tool calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<Handler>,
    /// Whether it streams (LLM calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// The child's agent (sub-agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The child session (sub-agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
}

/// What a decision answers: how the conversation now reads, and what to do next.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct DecisionResponse {
    /// Messages to record (reconciled into the tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<DraftMessage>>,
    /// What the engine should do next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actions: Option<Vec<Action>>,
    /// New agent state; omitted or null keeps the current state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    /// New agent config; omitted keeps the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentConfig>,
}

impl DecisionResponse {
    /// Whether this response writes nothing and asks for nothing.
    pub fn is_empty(&self) -> bool {
        self.messages.as_ref().is_none_or(Vec::is_empty)
            && self.actions.as_ref().is_none_or(Vec::is_empty)
            && self.state.is_none()
            && self.agent.is_none()
    }

    /// The actions, empty when none.
    pub fn actions(&self) -> &[Action] {
        self.actions.as_deref().unwrap_or_default()
    }
}

super::parse::objects_only!(DecisionRequest, WorkerIdentity, Call, DecisionResponse);

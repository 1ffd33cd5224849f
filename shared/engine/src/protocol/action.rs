//! Actions: what a decision tells the engine to do next.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::agent::{LlmHandler, RetryPolicy, ToolHandler};
use super::llm::{LlmTool, ReasoningConfig};
use super::message::DraftMessage;
use super::trigger::ErrorCode;
use crate::ids::{CallId, InterruptId, SessionId};

/// One thing a decision asks the engine to do.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type")]
pub enum Action {
    /// Call the model.
    #[serde(rename = "llm.call")]
    LlmCall(LlmCallAction),
    /// Call a tool.
    #[serde(rename = "tool.call")]
    ToolCall(ToolCallAction),
    /// Settle a tool call with its result.
    #[serde(rename = "tool.result")]
    ToolResult(ToolResultAction),
    /// Settle a tool call with an error.
    #[serde(rename = "tool.error")]
    ToolError(CallErrorAction),
    /// Settle a worker LLM call with the model's response.
    #[serde(rename = "llm.result")]
    LlmResult(LlmResultAction),
    /// Settle a worker LLM call with an error.
    #[serde(rename = "llm.error")]
    LlmError(CallErrorAction),
    /// Start a child session for a sub-agent.
    #[serde(rename = "sub_agent.spawn")]
    SubAgentSpawn(SubAgentSpawnAction),
    /// Send a message to a (child) session.
    #[serde(rename = "message.send")]
    MessageSend(MessageSendAction),
    /// Pause the branch until the client resumes.
    #[serde(rename = "interrupt")]
    Interrupt(InterruptAction),
    /// End the turn.
    #[serde(rename = "done")]
    Done(DoneAction),
}

impl Action {
    /// The protocol's name of this action, e.g. `tool.call`.
    pub fn name(&self) -> &'static str {
        match self {
            Action::LlmCall(_) => "llm.call",
            Action::ToolCall(_) => "tool.call",
            Action::ToolResult(_) => "tool.result",
            Action::ToolError(_) => "tool.error",
            Action::LlmResult(_) => "llm.result",
            Action::LlmError(_) => "llm.error",
            Action::SubAgentSpawn(_) => "sub_agent.spawn",
            Action::MessageSend(_) => "message.send",
            Action::Interrupt(_) => "interrupt",
            Action::Done(_) => "done",
        }
    }
}

super::parse::tagged_deserialize! {
    Action, "action", {
        "llm.call" => LlmCallAction => Action::LlmCall,
        "tool.call" => ToolCallAction => Action::ToolCall,
        "tool.result" => ToolResultAction => Action::ToolResult,
        "tool.error" => CallErrorAction => Action::ToolError,
        "llm.result" => LlmResultAction => Action::LlmResult,
        "llm.error" => CallErrorAction => Action::LlmError,
        "sub_agent.spawn" => SubAgentSpawnAction => Action::SubAgentSpawn,
        "message.send" => MessageSendAction => Action::MessageSend,
        "interrupt" => InterruptAction => Action::Interrupt,
        "done" => DoneAction => Action::Done,
    }
}

/// `llm.call`: every field optional; omitted ones fill from the agent config, then defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct LlmCallAction {
    /// Omitted: the engine mints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CallId>,
    /// Omitted: the agent config's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Explicit messages; these suppress system-prompt injection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<DraftMessage>>,
    /// The tools the model sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<LlmTool>>,
    /// Sampling temperature.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "super::number::compact_opt_f64"
    )]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<ReasoningConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Retry policy for this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Where it runs (default server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<LlmHandler>,
}

/// `tool.call`: call a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ToolCallAction {
    /// Omitted: the engine mints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CallId>,
    pub name: String,
    /// The arguments: a JSON value, or the model's raw argument string.
    pub arguments: Value,
    /// Who runs it (default worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<ToolHandler>,
    /// Retry policy (default: no retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
}

/// `tool.result`: a tool call's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ToolResultAction {
    /// Omitted: the answered `tool.execute`'s call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CallId>,
    /// The attempt; omitted: the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    pub result: Value,
}

/// `tool.error` / `llm.error`: a call attempt failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct CallErrorAction {
    /// Omitted: the answered execute trigger's call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CallId>,
    /// The attempt; omitted: the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    pub error: String,
    /// Whether another attempt may follow (default false: terminal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
}

/// `llm.result`: a worker LLM call's response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct LlmResultAction {
    /// Omitted: the answered `llm.execute`'s call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CallId>,
    /// The attempt; omitted: the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// An `LlmResponse`, or provider-native when the `llm.execute` carried a format.
    pub response: Value,
}

/// `sub_agent.spawn`: start a child session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct SubAgentSpawnAction {
    /// The child session.
    pub session_id: SessionId,
    /// The child's agent.
    pub agent_id: String,
    /// The model tool call this delegation answers; it becomes the delegation's call id.
    pub tool_call_id: CallId,
    /// Retry policy for the delegation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
}

/// `message.send`: write a message into another session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct MessageSendAction {
    /// The receiving session: a child of this one.
    pub session_id: SessionId,
    pub message: DraftMessage,
}

/// `interrupt`: pause the branch at the head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct InterruptAction {
    /// Omitted: the engine mints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt_id: Option<InterruptId>,
    /// Why, for the client.
    pub reason: String,
    /// Anything the client needs to answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

/// `done`: end the turn.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct DoneAction {
    /// The turn's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

super::parse::objects_only!(
    LlmCallAction,
    ToolCallAction,
    ToolResultAction,
    CallErrorAction,
    LlmResultAction,
    SubAgentSpawnAction,
    MessageSendAction,
    InterruptAction,
    DoneAction
);

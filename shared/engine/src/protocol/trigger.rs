//! Triggers: the news a decision is about.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::agent::{AgentTool, LlmFormat};
use super::message::DraftMessage;
use crate::ids::{CallId, InterruptId, SessionId};

/// News not yet written into the conversation, delivered in a `DecisionRequest`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
// Every variant's body refuses unknown fields (`NoFields` and the structs); the schema says so.
#[cfg_attr(feature = "schema", schemars(deny_unknown_fields))]
#[serde(tag = "type")]
pub enum Trigger {
    /// The session was created.
    #[serde(rename = "session.start")]
    SessionStart,
    /// The client's full conversation view.
    #[serde(rename = "client.messages")]
    ClientMessages(ClientMessagesTrigger),
    /// A named client action.
    #[serde(rename = "client.action")]
    ClientAction(ClientActionTrigger),
    /// A worker tool call to run.
    #[serde(rename = "tool.execute")]
    ToolExecute(ToolExecuteTrigger),
    /// A tool call settled.
    #[serde(rename = "tool.finished")]
    ToolFinished(ToolFinishedTrigger),
    /// A worker LLM call to run.
    #[serde(rename = "llm.execute")]
    LlmExecute(LlmExecuteTrigger),
    /// An LLM call settled.
    #[serde(rename = "llm.finished")]
    LlmFinished(LlmFinishedTrigger),
    /// A sub-agent's turn ended.
    #[serde(rename = "sub_agent.finished")]
    SubAgentFinished(SubAgentFinishedTrigger),
    /// An open interrupt was resumed.
    #[serde(rename = "interrupt.resumed")]
    InterruptResumed(InterruptResumedTrigger),
}

impl Trigger {
    /// The protocol's name of this trigger, e.g. `tool.execute`.
    pub fn name(&self) -> &'static str {
        match self {
            Trigger::SessionStart => "session.start",
            Trigger::ClientMessages(_) => "client.messages",
            Trigger::ClientAction(_) => "client.action",
            Trigger::ToolExecute(_) => "tool.execute",
            Trigger::ToolFinished(_) => "tool.finished",
            Trigger::LlmExecute(_) => "llm.execute",
            Trigger::LlmFinished(_) => "llm.finished",
            Trigger::SubAgentFinished(_) => "sub_agent.finished",
            Trigger::InterruptResumed(_) => "interrupt.resumed",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

super::parse::tagged_deserialize! {
    Trigger, "trigger", {
        "session.start" => NoFields => |_: NoFields| Trigger::SessionStart,
        "client.messages" => ClientMessagesTrigger => Trigger::ClientMessages,
        "client.action" => ClientActionTrigger => Trigger::ClientAction,
        "tool.execute" => ToolExecuteTrigger => Trigger::ToolExecute,
        "tool.finished" => ToolFinishedTrigger => Trigger::ToolFinished,
        "llm.execute" => LlmExecuteTrigger => Trigger::LlmExecute,
        "llm.finished" => LlmFinishedTrigger => Trigger::LlmFinished,
        "sub_agent.finished" => SubAgentFinishedTrigger => Trigger::SubAgentFinished,
        "interrupt.resumed" => InterruptResumedTrigger => Trigger::InterruptResumed,
    }
}

/// `client.messages`: the client's full view of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ClientMessagesTrigger {
    /// The client's full conversation view.
    pub messages: Vec<DraftMessage>,
    /// Index of the first new message.
    pub new_from: usize,
    /// What the client brought along.
    pub client: ClientContext,
}

/// `client.action`: a named action from the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ClientActionTrigger {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// `tool.execute`: run one attempt of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ToolExecuteTrigger {
    pub id: CallId,
    pub name: String,
    /// The raw argument string.
    pub arguments: String,
    /// The engine's validation of the arguments.
    pub input: ToolInput,
    /// The attempt being run (1-based).
    pub attempt: u32,
    /// When this attempt times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
}

/// `tool.finished`: a tool call settled for good.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ToolFinishedTrigger {
    pub id: CallId,
    pub ok: bool,
    pub name: String,
    /// The result text, when ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The error text, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `llm.execute`: run one attempt of an LLM call on the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct LlmExecuteTrigger {
    pub id: CallId,
    /// An `LlmRequest`, or provider-native when `format` is set.
    pub request: Value,
    /// The provider format of `request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<LlmFormat>,
    pub stream: bool,
    /// The attempt being run (1-based).
    pub attempt: u32,
    /// When this attempt times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
}

/// `llm.finished`: an LLM call settled for good.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct LlmFinishedTrigger {
    pub id: CallId,
    pub ok: bool,
    /// The assistant message, when ok; its id is the call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<DraftMessage>,
    /// Whether the model ran out of tokens.
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
    /// Cost in dollars, a decimal string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<String>,
    /// The error text, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The error class, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// Provider detail of the error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
}

/// `sub_agent.finished`: a delegated session's turn ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct SubAgentFinishedTrigger {
    /// The tool call the delegation answers.
    pub id: CallId,
    /// Whether the child's turn succeeded.
    pub ok: bool,
    /// The child session.
    pub session_id: SessionId,
    /// The child's agent.
    pub agent_id: String,
    /// The child's final output, when ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The error text, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `interrupt.resumed`: the client resumed an open interrupt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct InterruptResumedTrigger {
    pub interrupt_id: InterruptId,
    /// What the client answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

/// The engine's validation of a tool call's arguments.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
// The variants' bodies (`ValidInput`, ...) refuse unknown fields; the schema says so.
#[cfg_attr(feature = "schema", schemars(deny_unknown_fields))]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum ToolInput {
    /// Parsed, and conforms to the tool's input schema.
    Valid {
        /// The parsed arguments.
        value: Value,
    },
    /// Parsed, but violates the schema.
    Invalid {
        /// The parsed arguments.
        value: Value,
        error: String,
    },
    /// Not a JSON object.
    Malformed { error: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidInput {
    value: Value,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InvalidInput {
    value: Value,
    error: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MalformedInput {
    error: String,
}

super::parse::tagged_deserialize! {
    ToolInput, "tool input", tag = "status", {
        "valid" => ValidInput => |i: ValidInput| ToolInput::Valid { value: i.value },
        "invalid" => InvalidInput => |i: InvalidInput| ToolInput::Invalid { value: i.value, error: i.error },
        "malformed" => MalformedInput => |i: MalformedInput| ToolInput::Malformed { error: i.error },
    }
}

/// The class of a call failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The provider failed.
    ProviderError,
    /// The provider throttled the call.
    RateLimited,
    /// The model refused.
    Refused,
    /// A budget ran out.
    BudgetExceeded,
    /// The attempt ran past its deadline.
    DeadlineExceeded,
}

/// What the client brought with a `client.messages` input.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ClientContext {
    /// Client-executed tools, layered onto the proposed config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<AgentTool>>,
    /// Extra context items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Vec<Value>>,
    /// Client-side state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    /// Anything else the client forwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_props: Option<Value>,
    /// The client that brought `tools` and runs their calls (an AHP client id). An extension:
    /// where several clients drive one session, a client tool's call goes to the one that
    /// offered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
}

super::parse::objects_only!(
    ClientMessagesTrigger,
    ClientActionTrigger,
    ToolExecuteTrigger,
    ToolFinishedTrigger,
    LlmExecuteTrigger,
    LlmFinishedTrigger,
    SubAgentFinishedTrigger,
    InterruptResumedTrigger,
    ClientContext
);

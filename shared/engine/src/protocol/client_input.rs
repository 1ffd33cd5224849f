//! Client inputs: what a client submits to a session.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::message::DraftMessage;
use super::trigger::ClientContext;
use crate::ids::{CallId, InterruptId, TurnId};

/// One input from a client.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type")]
pub enum ClientInput {
    /// One new message at the head.
    #[serde(rename = "client.message")]
    Message(ClientMessageInput),
    /// The client's full conversation view.
    #[serde(rename = "client.messages")]
    Messages(ClientMessagesInput),
    /// A named action.
    #[serde(rename = "client.action")]
    Action(ClientActionInput),
    /// Resume an open interrupt.
    #[serde(rename = "interrupt.resume")]
    InterruptResume(InterruptResumeInput),
    /// Settle a client tool call with its result.
    #[serde(rename = "tool.result")]
    ToolResult(ToolResultInput),
    /// Settle a client tool call with an error.
    #[serde(rename = "tool.error")]
    ToolError(ToolErrorInput),
    /// Approve or deny a tool call that waits for approval (an extension of the protocol).
    #[serde(rename = "tool.approval")]
    ToolApproval(ToolApprovalInput),
}

impl ClientInput {
    /// The protocol's name of this input, e.g. `client.message`.
    pub fn name(&self) -> &'static str {
        match self {
            ClientInput::Message(_) => "client.message",
            ClientInput::Messages(_) => "client.messages",
            ClientInput::Action(_) => "client.action",
            ClientInput::InterruptResume(_) => "interrupt.resume",
            ClientInput::ToolResult(_) => "tool.result",
            ClientInput::ToolError(_) => "tool.error",
            ClientInput::ToolApproval(_) => "tool.approval",
        }
    }

    /// The agent the input is for, on inputs that start turns.
    pub fn agent_id(&self) -> Option<&str> {
        match self {
            ClientInput::Message(i) => Some(&i.agent_id),
            ClientInput::Messages(i) => Some(&i.agent_id),
            ClientInput::Action(i) => Some(&i.agent_id),
            _ => None,
        }
    }

    /// The idempotency key, on inputs that start turns.
    pub fn turn_id(&self) -> Option<&TurnId> {
        match self {
            ClientInput::Message(i) => i.turn_id.as_ref(),
            ClientInput::Messages(i) => i.turn_id.as_ref(),
            ClientInput::Action(i) => i.turn_id.as_ref(),
            _ => None,
        }
    }
}

super::parse::tagged_deserialize! {
    ClientInput, "client input", {
        "client.message" => ClientMessageInput => ClientInput::Message,
        "client.messages" => ClientMessagesInput => ClientInput::Messages,
        "client.action" => ClientActionInput => ClientInput::Action,
        "interrupt.resume" => InterruptResumeInput => ClientInput::InterruptResume,
        "tool.result" => ToolResultInput => ClientInput::ToolResult,
        "tool.error" => ToolErrorInput => ClientInput::ToolError,
        "tool.approval" => ToolApprovalInput => ClientInput::ToolApproval,
    }
}

/// `client.message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ClientMessageInput {
    /// The agent that runs the session.
    pub agent_id: String,
    /// Idempotency key of the turn; omitted: the engine mints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    pub message: DraftMessage,
    /// Whether the client wants token streaming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Client tools and context for the turn, as `client.messages` carries them. An
    /// extension: the seed's `client.message` has none, and an AHP client's tools come this
    /// way (ARCHITECTURE.md, "Decisions where the design was silent").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientContext>,
}

/// `client.messages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ClientMessagesInput {
    /// The agent that runs the session.
    pub agent_id: String,
    /// Idempotency key of the turn; omitted: the engine mints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// The client's full conversation view.
    pub messages: Vec<DraftMessage>,
    /// Whether the client wants token streaming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Client tools and context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientContext>,
}

/// `client.action`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ClientActionInput {
    /// The agent that runs the session.
    pub agent_id: String,
    /// Idempotency key of the turn; omitted: the engine mints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// `interrupt.resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct InterruptResumeInput {
    pub interrupt_id: InterruptId,
    /// The answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

/// `tool.result` from the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ToolResultInput {
    /// The client tool call.
    pub id: CallId,
    /// The attempt; omitted: the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// `tool.error` from the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ToolErrorInput {
    /// The client tool call.
    pub id: CallId,
    pub error: String,
    pub retryable: bool,
    /// The attempt; omitted: the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

/// `tool.approval`: a person's verdict on a tool call waiting for approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ToolApprovalInput {
    /// The waiting call.
    pub id: CallId,
    /// Run it (`true`), or answer the model that it was denied (`false`).
    pub approved: bool,
    /// Why, told to the model with a denial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

super::parse::objects_only!(
    ClientMessageInput,
    ClientMessagesInput,
    ClientActionInput,
    InterruptResumeInput,
    ToolResultInput,
    ToolErrorInput,
    ToolApprovalInput
);

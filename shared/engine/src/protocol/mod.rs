//! The decision protocol's wire types (seed 000), exactly as they travel as JSON.
//!
//! Optional fields are omitted when absent; `unknown` fields are `serde_json::Value`; a
//! `T | null` field is required and may be `null`. Parse untrusted documents with [`parse`],
//! [`parse_str`] or [`parse_slice`]: their errors name the path of the offending field, and
//! the strict types refuse unknown fields. A worker's answer is read with [`parse_response`]
//! instead: unknown fields (at any depth) are ignored and their paths returned; unknown
//! variants are still errors.
//!
//! Every struct is read from a JSON object only: each derives with `#[serde(remote = "Self")]`
//! and gets its trait impls from `parse::objects_only!`, which refuses the array form serde's
//! derive would otherwise accept. Whole `f64` values serialize as JSON integers (`number`).

mod action;
mod agent;
mod client_input;
mod decision;
mod llm;
mod message;
mod number;
pub(crate) mod parse;
mod trigger;

pub use action::{
    Action, CallErrorAction, DoneAction, InterruptAction, LlmCallAction, LlmResultAction, MessageSendAction,
    SubAgentSpawnAction, ToolCallAction, ToolResultAction,
};
pub use agent::{
    AgentConfig, AgentTool, Approval, Handler, LlmFormat, LlmHandler, McpToolSource, RetryPolicy, SubAgent,
    ToolHandler,
};
pub use client_input::{
    ClientActionInput, ClientInput, ClientMessageInput, ClientMessagesInput, InterruptResumeInput,
    ToolApprovalInput, ToolErrorInput, ToolResultInput,
};
pub use decision::{Call, CallKind, CallStatus, DecisionRequest, DecisionResponse, WorkerIdentity};
pub use llm::{
    CacheTtl, Effort, LlmRequest, LlmResponse, LlmTool, PromptCache, ReasoningConfig, StreamDelta,
    ThinkingForm, ToolCallDelta,
};
pub use message::{
    AudioData, Compaction, CompactionKind, Content, ContentPart, DraftMessage, FileData, FunctionCall,
    Message, MessageTree, ProviderBlocks, Role, ToolCall, TreeNode, UrlRef,
};
pub use parse::{ProtocolError, parse, parse_response, parse_slice, parse_str};
pub use trigger::{
    ClientActionTrigger, ClientContext, ClientMessagesTrigger, ErrorCode, InterruptResumedTrigger,
    LlmExecuteTrigger, LlmFinishedTrigger, SubAgentFinishedTrigger, ToolExecuteTrigger, ToolFinishedTrigger,
    ToolInput, Trigger,
};

//! The provider-neutral LLM request and response, and streaming deltas.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::message::{DraftMessage, ToolCall};
use crate::ids::CallId;

/// A model call, provider-neutral.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct LlmRequest {
    pub model: String,
    /// The conversation, system prompt first when the agent has one.
    // Shared: a session's transcript keeps each message's draft once, so building a request
    // at turn 1,000 copies pointers, not the conversation.
    pub messages: Vec<Arc<DraftMessage>>,
    /// The tools the model may call.
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
    /// Reasoning settings, where the model offers reasoning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<ReasoningConfig>,
    /// How the provider may cache the request's prefix. Not on the protocol's wire: the
    /// engine sets it on the model calls it runs itself, from the `[llm.<id>]` block.
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub cache: Option<PromptCache>,
    /// How the model takes thinking, where the provider's configuration says so (a model id
    /// that names no Claude version: an alias, a cloud's inference profile); otherwise the
    /// format reads it from the id. Not on the protocol's wire.
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub thinking_form: Option<ThinkingForm>,
}

/// How a Claude model takes thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingForm {
    /// `thinking: {type: "adaptive"}` with `output_config.effort`: Claude 4.6 and later.
    Adaptive,
    /// `thinking: {type: "enabled", budget_tokens}`: the models before 4.6.
    Budget,
}

/// Prompt caching for one model call: where a provider keeps the request's prefix so that
/// the next step of the same conversation reads it back at a tenth of the input price.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptCache {
    /// Shared by the requests of one conversation, so they reach the same cache: OpenAI's
    /// `prompt_cache_key` (the session's id).
    pub key: String,
    /// How long a cached prefix lives after its last use: Anthropic's `cache_control.ttl`.
    pub ttl: CacheTtl,
}

impl PromptCache {
    /// The longest `prompt_cache_key` OpenAI takes.
    pub const MAX_KEY_CHARS: usize = 64;

    /// The key as OpenAI's `prompt_cache_key`: as it is when short enough, else a hash of it
    /// (the key only routes requests to the same cache; a collision costs a miss).
    pub fn openai_key(&self) -> String {
        if self.key.chars().count() <= Self::MAX_KEY_CHARS {
            return self.key.clone();
        }
        let hash = self
            .key
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        format!("turnstone-{hash:016x}")
    }
}

/// The lifetimes Anthropic offers for a cached prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheTtl {
    /// Five minutes, refreshed by every hit (the default, no extra write price).
    #[default]
    FiveMinutes,
    /// One hour (writes cost twice the input price instead of 1.25 times).
    OneHour,
}

impl CacheTtl {
    /// The name in configuration and in Anthropic's `ttl`: `5m`, `1h`.
    pub fn name(self) -> &'static str {
        match self {
            CacheTtl::FiveMinutes => "5m",
            CacheTtl::OneHour => "1h",
        }
    }
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct LlmTool {
    pub name: String,
    pub description: String,
    /// JSON Schema for the arguments; absent: no arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// JSON Schema of the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
}

/// How hard the model should think.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    /// The most.
    Xhigh,
    High,
    Medium,
    Low,
    /// Barely.
    Minimal,
    /// Not at all.
    None,
}

/// Reasoning settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ReasoningConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<Effort>,
    /// Token budget for reasoning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Reason, but leave the reasoning out of the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<bool>,
    /// Turn reasoning on or off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A model's answer, provider-neutral.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct LlmResponse {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool calls requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Why generation stopped: `stop`, `tool_calls`, `length`, `content_filter`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// Token usage, provider-shaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
    /// Cost in dollars, a decimal string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<String>,
    /// Generated images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<super::message::UrlRef>>,
    /// The model's reasoning, where it shows it (an extension of the protocol): recorded so
    /// that a client sees the same reasoning live, as it streams, and afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// What the provider needs back with this reply when it is sent to it again (an extension
    /// of the protocol): recorded with the assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_blocks: Option<Box<super::message::ProviderBlocks>>,
}

impl LlmResponse {
    /// Whether the model stopped because it ran out of tokens.
    pub fn is_truncated(&self) -> bool {
        matches!(self.finish_reason.as_deref(), Some("length" | "max_tokens"))
    }

    /// Whether the model refused (a content filter stopped it).
    pub fn is_refused(&self) -> bool {
        matches!(self.finish_reason.as_deref(), Some("content_filter" | "refusal"))
    }
}

/// One chunk of a streaming model answer.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct StreamDelta {
    /// More text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// More reasoning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Tool call fragments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// Set on the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// A fragment of one tool call in a [`StreamDelta`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self")]
pub struct ToolCallDelta {
    /// The tool call's id; every fragment of one call carries it.
    pub id: CallId,
    /// The tool's name, on the first fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More of the argument string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

super::parse::objects_only!(LlmRequest, LlmTool, ReasoningConfig, LlmResponse, StreamDelta, ToolCallDelta);

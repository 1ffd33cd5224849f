//! How much a model takes, and how an agent's requests are kept within it.
//!
//! [`model_window`] knows each model's context window and largest reply, for the models of the
//! providers Turnstone speaks to, by model-id prefix (the longest matching wins, so dated ids
//! and aliases share their family's row). A model not listed here has a window only when the
//! configuration gives it one (`context_window` in `[llm.<id>]` or `[agent.<id>]`).
//!
//! Figures from the providers' model pages (Anthropic's "Models overview" and each model's
//! page; OpenAI's model pages), as of 2026-12. Where a model offers a larger window behind a
//! beta header, the table gives the window a plain request gets.

use turnstone_engine::llm_format::anthropic::DEFAULT_MAX_TOKENS;
use turnstone_engine::protocol::LlmRequest;
use turnstone_engine::session::ContextLimits;

use crate::config::CompactionConfig;

/// A model's context window and its largest reply, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelWindow {
    pub window: u64,
    pub max_output: u64,
}

const fn w(window: u64, max_output: u64) -> ModelWindow {
    ModelWindow { window, max_output }
}

/// `(model-id prefix, window)`.
const MODELS: &[(&str, ModelWindow)] = &[
    // Anthropic: the Claude 5 family (Fable, Opus, Sonnet, Haiku 5.x) takes 1M and answers up to 128K.
    ("claude-fable-", w(1_000_000, 128_000)),
    ("claude-opus-5", w(1_000_000, 128_000)),
    ("claude-sonnet-5", w(1_000_000, 128_000)),
    ("claude-haiku-5", w(1_000_000, 128_000)),
    // Claude 4.x: 200K (1M for some behind a beta header).
    ("claude-opus-4-6", w(200_000, 128_000)),
    ("claude-opus-4-5", w(200_000, 64_000)),
    ("claude-opus-4", w(200_000, 32_000)),
    ("claude-sonnet-4", w(200_000, 64_000)),
    ("claude-haiku-4-5", w(200_000, 64_000)),
    ("claude-3-7-sonnet", w(200_000, 64_000)),
    ("claude-3-5-haiku", w(200_000, 8_192)),
    // OpenAI.
    ("gpt-5.5", w(1_050_000, 128_000)),
    ("gpt-5.4", w(1_050_000, 128_000)),
    ("gpt-5", w(400_000, 128_000)),
    ("gpt-4.1", w(1_047_576, 32_768)),
    ("gpt-4o", w(128_000, 16_384)),
    ("o3", w(200_000, 100_000)),
    ("o4-mini", w(200_000, 100_000)),
];

/// What an agent's configuration says about context: the window and reply reserve it or its
/// `[llm]` block set, and how it compacts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContextSettings {
    /// `context_window` of the agent, else of its `[llm]` block.
    pub window: Option<u64>,
    /// `max_output_tokens` of the agent, else of its `[llm]` block.
    pub max_output: Option<u64>,
    pub compaction: CompactionConfig,
}

impl ContextSettings {
    /// The limits a request for `model` is kept within: `None` when neither the configuration
    /// nor the table knows the model's window, or compaction is off.
    pub fn limits(&self, model: &str) -> Option<ContextLimits> {
        if !self.compaction.enabled {
            return None;
        }
        let known = model_window(model);
        let window = self.window.or(known.map(|k| k.window))?;
        let max_output = self.max_output.or(known.map(|k| k.max_output)).unwrap_or(DEFAULT_MAX_TOKENS);
        let c = &self.compaction;
        let mut limits = ContextLimits::with_window(window, max_output);
        limits.compact_at = c.at;
        limits.keep_recent = c.keep_recent;
        limits.clear_tool_results = c.clear_tool_results;
        limits.tool_result_max_tokens = c.tool_result_max_tokens;
        if let Some(max) = c.summary_max_tokens {
            limits.summary_max_tokens = max;
        }
        Some(limits)
    }

    /// The reply's reserve of `request`: what it asks for, else the configured largest reply
    /// when one is set, else what Anthropic's format sends by default (the most a request
    /// without `max_completion_tokens` is sent to any provider), never more than the model's
    /// largest reply.
    pub fn reserve(&self, request: &LlmRequest, limits: &ContextLimits) -> u64 {
        let default = self.max_output.unwrap_or(DEFAULT_MAX_TOKENS + thinking_budget(request));
        request.max_completion_tokens.unwrap_or(default).min(limits.max_output.max(default))
    }
}

/// The thinking budget Anthropic's format adds to its default `max_tokens`.
fn thinking_budget(request: &LlmRequest) -> u64 {
    request.reasoning.as_ref().and_then(turnstone_engine::llm_format::anthropic::thinking_budget).unwrap_or(0)
}

/// The window the table gives `model`, if it lists its family.
pub fn model_window(model: &str) -> Option<ModelWindow> {
    MODELS
        .iter()
        .filter(|(prefix, _)| model.starts_with(prefix))
        .max_by_key(|(p, _)| p.len())
        .map(|(_, w)| *w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_names_the_family() {
        assert_eq!(model_window("claude-opus-4-6").unwrap().max_output, 128_000);
        assert_eq!(model_window("claude-opus-4-1-20250805").unwrap().max_output, 32_000);
        assert_eq!(model_window("claude-sonnet-5-5").unwrap().window, 1_000_000);
        assert_eq!(model_window("gpt-5.5-pro").unwrap().window, 1_050_000);
        assert_eq!(model_window("gpt-5-mini").unwrap().window, 400_000);
        assert_eq!(model_window("gpt-4o-2024-08-06").unwrap().window, 128_000);
        assert_eq!(model_window("llama-3"), None);
        assert_eq!(model_window("scripted"), None);
    }
}

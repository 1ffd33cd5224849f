//! A turn's model usage, as AHP reports it.

use ahp_types::common::JsonObject;
use ahp_types::state::UsageInfo;
use serde_json::json;
use turnstone_engine::session::Usage;

/// `usage` (the engine's sum over the turn's successful model calls) as AHP usage. Providers
/// name tokens differently (OpenAI `prompt_tokens`, Anthropic `input_tokens`); the engine keeps
/// their names, so each AHP field reads the names it may have. The call count and the exact
/// cost, which AHP has no field for, travel in `_meta`.
pub(crate) fn usage_info(usage: &Usage, model: Option<&str>) -> UsageInfo {
    let tokens = |names: &[&str]| -> Option<i64> {
        let sum: u64 = names.iter().filter_map(|n| usage.tokens.get(*n)).sum();
        let seen = names.iter().any(|n| usage.tokens.contains_key(*n));
        seen.then(|| i64::try_from(sum).unwrap_or(i64::MAX))
    };
    let mut meta = JsonObject::new();
    meta.insert("llmCalls".into(), json!(usage.llm_calls));
    meta.insert("cost".into(), json!(usage.cost()));
    UsageInfo {
        input_tokens: tokens(&["prompt_tokens", "input_tokens"]),
        output_tokens: tokens(&["completion_tokens", "output_tokens"]),
        model: model.map(str::to_owned),
        cache_read_tokens: tokens(&["prompt_tokens_details.cached_tokens", "cache_read_input_tokens"]),
        meta: Some(meta),
    }
}

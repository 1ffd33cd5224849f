//! A turn's model usage, as AHP reports it.

use ahp_types::common::JsonObject;
use ahp_types::state::UsageInfo;
use serde_json::json;
use turnstone_engine::session::Usage;

/// `usage` (the engine's sum over the turn's successful model calls) as AHP usage, in the
/// engine's one vocabulary of tokens whichever provider counted them (input includes what was
/// read from the cache). The call count, the exact cost and the counts AHP has no field for
/// (cache writes, reasoning) travel in `_meta`.
pub(crate) fn usage_info(usage: &Usage, model: Option<&str>) -> UsageInfo {
    let counts = usage.counts();
    let counted = !counts.is_empty();
    let tokens = |n: u64| counted.then(|| i64::try_from(n).unwrap_or(i64::MAX));
    let mut meta = JsonObject::new();
    meta.insert("llmCalls".into(), json!(usage.llm_calls));
    meta.insert("cost".into(), json!(usage.cost()));
    if counted {
        meta.insert("cacheWriteTokens".into(), json!(counts.cache_write));
        meta.insert("reasoningTokens".into(), json!(counts.reasoning));
    }
    UsageInfo {
        input_tokens: tokens(counts.input),
        output_tokens: tokens(counts.output),
        model: model.map(str::to_owned),
        cache_read_tokens: tokens(counts.cache_read),
        meta: Some(meta),
    }
}

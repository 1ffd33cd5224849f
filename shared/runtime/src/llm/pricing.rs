//! What a model call cost, from per-model prices in the `[llm.<id>]` block, so a session's
//! cost is real for OpenAI and Anthropic (whose answers carry token counts, not money).
//!
//! [`Priced`] wraps a provider: an answer without a `cost` gets one computed from its `usage`
//! and the prices of its model, as an exact decimal string of dollars. The tokens are read in
//! one vocabulary ([`TokenCounts`]): uncached input at `input`, cache reads at `cache_read`,
//! cache writes at `cache_write` (each at `input` when not priced), output (reasoning
//! included) at `output`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use turnstone_engine::llm_format::usage::TokenCounts;
use turnstone_engine::protocol::{LlmRequest, LlmResponse, StreamDelta};
use turnstone_engine::session::format_picodollars;

use super::{ModelProvider, ProviderError};

/// One model's prices, in picodollars (10^-12 $) per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelPrices {
    pub input: i128,
    pub output: i128,
    /// Cached input read back; `input` when not priced.
    pub cache_read: Option<i128>,
    /// Input written to the cache (Anthropic); `input` when not priced.
    pub cache_write: Option<i128>,
}

impl ModelPrices {
    /// Prices given in dollars per million tokens, as the providers publish them.
    pub fn per_million(input: f64, output: f64, cache_read: Option<f64>, cache_write: Option<f64>) -> Self {
        // $ per million tokens = 10^12 / 10^6 picodollars per token per dollar.
        let pico = |dollars: f64| (dollars * 1e6).round() as i128;
        ModelPrices {
            input: pico(input),
            output: pico(output),
            cache_read: cache_read.map(pico),
            cache_write: cache_write.map(pico),
        }
    }

    /// The cost of `usage` (a provider's usage object, in any provider's shape), in
    /// picodollars; `None` when it names no tokens this knows.
    pub fn cost(&self, usage: &Value) -> Option<i128> {
        let counts = TokenCounts::of(usage);
        if counts.is_empty() {
            return None;
        }
        let (read, write) = (self.cache_read.unwrap_or(self.input), self.cache_write.unwrap_or(self.input));
        let tokens = |n: u64| i128::from(n);
        let cached = counts.cache_read + counts.cache_write;
        Some(
            tokens(counts.input.saturating_sub(cached)) * self.input
                + tokens(counts.cache_read) * read
                + tokens(counts.cache_write) * write
                + tokens(counts.output) * self.output,
        )
    }
}

/// A provider whose answers carry their cost.
pub struct Priced {
    inner: Arc<dyn ModelProvider>,
    prices: BTreeMap<String, ModelPrices>,
}

impl Priced {
    /// `inner` with `prices` by model name.
    pub fn new(inner: Arc<dyn ModelProvider>, prices: BTreeMap<String, ModelPrices>) -> Self {
        Priced { inner, prices }
    }

    /// The prices of `model`: its own, or else those of the longest priced name it starts
    /// with (providers answer `gpt-4o-2024-08-06` for `gpt-4o`).
    fn prices_of(&self, model: &str) -> Option<&ModelPrices> {
        self.prices.get(model).or_else(|| {
            self.prices
                .iter()
                .filter(|(name, _)| model.starts_with(name.as_str()))
                .max_by_key(|(n, _)| n.len())
                .map(|(_, p)| p)
        })
    }
}

#[async_trait]
impl ModelProvider for Priced {
    async fn complete(
        &self,
        request: &LlmRequest,
        stream: bool,
        timeout: Option<Duration>,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<LlmResponse, ProviderError> {
        let mut response = self.inner.complete(request, stream, timeout, on_delta).await?;
        if response.cost.is_none()
            && let Some(usage) = &response.usage
            && let Some(prices) = self.prices_of(&response.model).or_else(|| self.prices_of(&request.model))
            && let Some(cost) = prices.cost(usage)
        {
            response.cost = Some(format_picodollars(cost));
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_counts_cached_prompt_tokens_at_the_cache_price() {
        let prices = ModelPrices::per_million(2.5, 10.0, Some(1.25), None);
        let usage = json!({"prompt_tokens": 1000, "completion_tokens": 200,
                           "prompt_tokens_details": {"cached_tokens": 400}});
        // 600 * 2.5 + 400 * 1.25 + 200 * 10 = 1500 + 500 + 2000 = 4000 $/M = 0.004 $
        let cost = prices.cost(&usage).unwrap();
        assert_eq!(format_picodollars(cost), "0.004");
        assert_eq!(prices.cost(&json!({"total": 3})), None);
    }

    #[test]
    fn anthropic_prices_cache_reads_and_writes() {
        let prices = ModelPrices::per_million(3.0, 15.0, Some(0.3), Some(3.75));
        let usage = json!({"input_tokens": 100, "output_tokens": 50,
                           "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200});
        // 100*3 + 1000*0.3 + 200*3.75 + 50*15 = 300 + 300 + 750 + 750 = 2100 $/M
        assert_eq!(format_picodollars(prices.cost(&usage).unwrap()), "0.0021");
        // Without cache prices, cached tokens count as input.
        let plain = ModelPrices::per_million(3.0, 15.0, None, None);
        let usage = json!({"input_tokens": 1, "cache_read_input_tokens": 1, "output_tokens": 0});
        assert_eq!(plain.cost(&usage), Some(6_000_000));
    }

    #[test]
    fn responses_usage_counts_cached_input_within_input() {
        let prices = ModelPrices::per_million(2.0, 8.0, Some(0.5), None);
        let usage = json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 600},
                           "output_tokens": 100, "output_tokens_details": {"reasoning_tokens": 40}});
        // 400*2 + 600*0.5 + 100*8 = 800 + 300 + 800 = 1900 $/M
        assert_eq!(format_picodollars(prices.cost(&usage).unwrap()), "0.0019");
    }
}

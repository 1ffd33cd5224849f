//! What a model call cost, from per-model prices in the `[llm.<id>]` block, so a session's
//! cost is real for OpenAI and Anthropic (whose answers carry token counts, not money).
//!
//! [`Priced`] wraps a provider: an answer without a `cost` gets one computed from its `usage`
//! and the prices of its model, as an exact decimal string of dollars. Token fields by format:
//! - OpenAI: `prompt_tokens` (cached ones included, counted at `cache_read` when priced, as
//!   `prompt_tokens_details.cached_tokens` says), `completion_tokens`;
//! - Anthropic: `input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`,
//!   `output_tokens`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use turnstone_engine::llm_format::LlmFormat;
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

    /// The cost of `usage` (the provider's usage object in `format`), in picodollars; `None`
    /// when it names no tokens this knows.
    pub fn cost(&self, format: LlmFormat, usage: &Value) -> Option<i128> {
        let n = |path: &[&str]| -> i128 {
            let mut v = usage;
            for key in path {
                match v.get(key) {
                    Some(next) => v = next,
                    None => return 0,
                }
            }
            v.as_u64().map_or(0, i128::from)
        };
        let (read, write) = (self.cache_read.unwrap_or(self.input), self.cache_write.unwrap_or(self.input));
        let cost = match format {
            LlmFormat::Openai => {
                let (prompt, output) = (n(&["prompt_tokens"]), n(&["completion_tokens"]));
                if usage.get("prompt_tokens").is_none() && usage.get("completion_tokens").is_none() {
                    return None;
                }
                let cached = n(&["prompt_tokens_details", "cached_tokens"]).min(prompt);
                (prompt - cached) * self.input + cached * read + output * self.output
            }
            LlmFormat::Anthropic => {
                if usage.get("input_tokens").is_none() && usage.get("output_tokens").is_none() {
                    return None;
                }
                n(&["input_tokens"]) * self.input
                    + n(&["cache_read_input_tokens"]) * read
                    + n(&["cache_creation_input_tokens"]) * write
                    + n(&["output_tokens"]) * self.output
            }
        };
        Some(cost)
    }
}

/// A provider whose answers carry their cost.
pub struct Priced {
    inner: Arc<dyn ModelProvider>,
    format: LlmFormat,
    prices: BTreeMap<String, ModelPrices>,
}

impl Priced {
    /// `inner`, speaking `format`, with `prices` by model name.
    pub fn new(
        inner: Arc<dyn ModelProvider>,
        format: LlmFormat,
        prices: BTreeMap<String, ModelPrices>,
    ) -> Self {
        Priced { inner, format, prices }
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
            && let Some(cost) = prices.cost(self.format, usage)
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
        let cost = prices.cost(LlmFormat::Openai, &usage).unwrap();
        assert_eq!(format_picodollars(cost), "0.004");
        assert_eq!(prices.cost(LlmFormat::Openai, &json!({"total": 3})), None);
    }

    #[test]
    fn anthropic_prices_cache_reads_and_writes() {
        let prices = ModelPrices::per_million(3.0, 15.0, Some(0.3), Some(3.75));
        let usage = json!({"input_tokens": 100, "output_tokens": 50,
                           "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200});
        // 100*3 + 1000*0.3 + 200*3.75 + 50*15 = 300 + 300 + 750 + 750 = 2100 $/M
        assert_eq!(format_picodollars(prices.cost(LlmFormat::Anthropic, &usage).unwrap()), "0.0021");
        // Without cache prices, cached tokens count as input.
        let plain = ModelPrices::per_million(3.0, 15.0, None, None);
        let usage = json!({"input_tokens": 1, "cache_read_input_tokens": 1, "output_tokens": 0});
        assert_eq!(plain.cost(LlmFormat::Anthropic, &usage), Some(6_000_000));
    }
}

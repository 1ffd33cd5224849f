//! Token usage in one vocabulary, whichever provider counted it.
//!
//! Each API names its counts differently, and they do not even mean the same things:
//! Anthropic's `input_tokens` leaves out what was read from or written to the cache, OpenAI's
//! `prompt_tokens` (Chat Completions) and `input_tokens` (Responses) include it. A usage object
//! is recognised by its shape, so worker-run calls, whose usage arrives in their format's
//! shape, are counted the same way:
//!
//! - Chat Completions: `prompt_tokens` (`prompt_tokens_details.cached_tokens` of them read from
//!   the cache), `completion_tokens` (`completion_tokens_details.reasoning_tokens`);
//! - Anthropic Messages: `input_tokens` + `cache_read_input_tokens` +
//!   `cache_creation_input_tokens`, `output_tokens` (thinking included, not counted apart);
//! - Responses: `input_tokens` (`input_tokens_details.cached_tokens` of them cached),
//!   `output_tokens` (`output_tokens_details.reasoning_tokens`).

use std::collections::BTreeMap;
use std::ops::AddAssign;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One model call's tokens, or a sum of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TokenCounts {
    /// Input tokens, those read from or written to the cache included.
    pub input: u64,
    /// Output tokens, reasoning included.
    pub output: u64,
    /// Input tokens read from the provider's prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the provider's prompt cache (Anthropic).
    pub cache_write: u64,
    /// Output tokens spent reasoning, where the provider counts them apart.
    pub reasoning: u64,
}

impl TokenCounts {
    /// The counts of a provider's `usage` object; zero where it names none of them.
    pub fn of(usage: &Value) -> Self {
        Self::from_fields(&|path: &str| {
            path.split('.').try_fold(usage, |v, key| v.get(key)).and_then(Value::as_u64).unwrap_or(0)
        })
    }

    /// The counts of usage already summed field by field (dotted names, as
    /// [`crate::session::Usage::tokens`] keeps them): the same, as counting is linear in the
    /// fields, even for a sum over several providers.
    pub fn of_sums(tokens: &BTreeMap<String, u64>) -> Self {
        Self::from_fields(&|path: &str| tokens.get(path).copied().unwrap_or(0))
    }

    /// The three shapes' names are apart but for `input_tokens` and `output_tokens`, which
    /// Anthropic and the Responses API share; Anthropic's cache counts are beside its
    /// `input_tokens` and the Responses API's within, so adding Anthropic's to `input_tokens`
    /// counts both right, alone or summed together.
    fn from_fields(n: &dyn Fn(&str) -> u64) -> Self {
        let (anthropic_read, anthropic_write) =
            (n("cache_read_input_tokens"), n("cache_creation_input_tokens"));
        TokenCounts {
            input: n("prompt_tokens") + n("input_tokens") + anthropic_read + anthropic_write,
            output: n("completion_tokens") + n("output_tokens"),
            cache_read: n("prompt_tokens_details.cached_tokens")
                + anthropic_read
                + n("input_tokens_details.cached_tokens"),
            cache_write: anthropic_write,
            reasoning: n("completion_tokens_details.reasoning_tokens")
                + n("output_tokens_details.reasoning_tokens"),
        }
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        *self == TokenCounts::default()
    }
}

impl AddAssign for TokenCounts {
    fn add_assign(&mut self, other: Self) {
        self.input += other.input;
        self.output += other.output;
        self.cache_read += other.cache_read;
        self.cache_write += other.cache_write;
        self.reasoning += other.reasoning;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_shape_counts_cached_input_as_input() {
        let chat = json!({"prompt_tokens": 1000, "completion_tokens": 50,
            "prompt_tokens_details": {"cached_tokens": 800},
            "completion_tokens_details": {"reasoning_tokens": 20}});
        assert_eq!(
            TokenCounts::of(&chat),
            TokenCounts { input: 1000, output: 50, cache_read: 800, cache_write: 0, reasoning: 20 }
        );
        let anthropic = json!({"input_tokens": 10, "cache_read_input_tokens": 900,
            "cache_creation_input_tokens": 90, "output_tokens": 50});
        assert_eq!(
            TokenCounts::of(&anthropic),
            TokenCounts { input: 1000, output: 50, cache_read: 900, cache_write: 90, reasoning: 0 }
        );
        let responses = json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 700},
            "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 30}, "total_tokens": 1050});
        assert_eq!(
            TokenCounts::of(&responses),
            TokenCounts { input: 1000, output: 50, cache_read: 700, cache_write: 0, reasoning: 30 }
        );
        assert!(TokenCounts::of(&json!({"total": 3})).is_empty());
    }

    #[test]
    fn a_sum_over_providers_counts_each_right() {
        let mut sums = BTreeMap::new();
        let anthropic = json!({"input_tokens": 10, "cache_read_input_tokens": 900, "output_tokens": 5});
        let responses = json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 700}, "output_tokens": 50});
        for usage in [&anthropic, &responses] {
            for (key, n) in [
                ("input_tokens", "/input_tokens"),
                ("cache_read_input_tokens", "/cache_read_input_tokens"),
                ("input_tokens_details.cached_tokens", "/input_tokens_details/cached_tokens"),
                ("output_tokens", "/output_tokens"),
            ] {
                *sums.entry(key.to_owned()).or_default() +=
                    usage.pointer(n).and_then(Value::as_u64).unwrap_or(0);
            }
        }
        let mut each = TokenCounts::of(&anthropic);
        each += TokenCounts::of(&responses);
        assert_eq!(TokenCounts::of_sums(&sums), each);
        assert_eq!(
            each,
            TokenCounts { input: 1910, output: 55, cache_read: 1600, cache_write: 0, reasoning: 0 }
        );
    }

    #[test]
    fn sums_read_like_one_call() {
        let sums: BTreeMap<String, u64> = [
            ("input_tokens", 20),
            ("cache_read_input_tokens", 1800),
            ("cache_creation_input_tokens", 180),
            ("output_tokens", 100),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(
            TokenCounts::of_sums(&sums),
            TokenCounts { input: 2000, output: 100, cache_read: 1800, cache_write: 180, reasoning: 0 }
        );
    }
}

//! The fake model servers' prompt cache: what a request reads from and writes to a provider's
//! cache of prompt prefixes, so a test sees the cache hits the real provider would report.
//!
//! A request is seen as its blocks in the order the provider reads them (Anthropic: tools,
//! then system, then messages, "Prompt caching",
//! https://docs.claude.com/en/docs/build-with-claude/prompt-caching), each with a size in
//! tokens (a quarter of its JSON length: an estimate both runs of a comparison share) and
//! whether it carries a breakpoint. A prefix is named by a hash chained over its blocks, so
//! changing any block changes every prefix after it. What the model is given:
//! - **read**: the longest cached prefix that ends at a breakpoint or at one of the
//!   [`LOOKBACK`] block boundaries before it ("the system automatically checks for cache hits
//!   at all previous content block boundaries (up to approximately 20 blocks before your
//!   explicit breakpoint)");
//! - **write**: each breakpoint's prefix of at least the model's minimum length is cached
//!   ("shorter prompts cannot be cached, even if marked"); the tokens past what was read, up
//!   to the last breakpoint, are written;
//! - the rest is uncached input.
//!
//! Entries do not expire: a test is done well within the shortest TTL.

use std::collections::HashSet;

/// How many block boundaries before a breakpoint are checked for a hit.
pub const LOOKBACK: usize = 20;

/// One block of a request, in the provider's cache order.
#[derive(Debug, Clone)]
pub struct PromptBlock {
    /// Its size in tokens.
    pub tokens: u64,
    /// What identifies its content (its JSON without the breakpoint mark).
    pub key: String,
    /// Whether it ends a prefix the request asks to cache.
    pub breakpoint: bool,
}

/// A request as the cache sees it.
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    /// What every prefix is also keyed by (the model: caches are per model).
    pub scope: String,
    pub blocks: Vec<PromptBlock>,
    /// The shortest prefix the model caches, in tokens.
    pub min_tokens: u64,
}

impl Prompt {
    /// The whole prompt's size in tokens: what the fakes report as the request's input tokens
    /// (cached or not) and hold against a context window.
    pub fn tokens(&self) -> u64 {
        self.blocks.iter().map(|b| b.tokens).sum()
    }
}

/// What one request did with the cache, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheUse {
    /// Input neither read from the cache nor written to it.
    pub uncached: u64,
    pub read: u64,
    pub write: u64,
}

impl CacheUse {
    /// The whole input.
    pub fn input(&self) -> u64 {
        self.uncached + self.read + self.write
    }
}

/// The prefixes cached so far.
#[derive(Debug, Default)]
pub struct PromptCache {
    prefixes: HashSet<u64>,
}

impl PromptCache {
    /// Serves `prompt`: reads the longest cached prefix it may, writes its breakpoints'.
    pub fn serve(&mut self, prompt: &Prompt) -> CacheUse {
        let mut hash = fnv(0xcbf2_9ce4_8422_2325, prompt.scope.as_bytes());
        // `ends[i]`: the hash and size of the prefix ending with block i.
        let mut ends = Vec::with_capacity(prompt.blocks.len());
        let mut total = 0;
        for block in &prompt.blocks {
            hash = fnv(hash ^ 0xff, block.key.as_bytes());
            total += block.tokens;
            ends.push((hash, total));
        }
        let breakpoints: Vec<usize> =
            prompt.blocks.iter().enumerate().filter(|(_, b)| b.breakpoint).map(|(i, _)| i).collect();
        let read = breakpoints
            .iter()
            .flat_map(|&b| (b.saturating_sub(LOOKBACK)..=b).rev())
            .filter(|&i| self.prefixes.contains(&ends[i].0))
            .map(|i| ends[i].1)
            .max()
            .unwrap_or(0);
        let mut written_to = read;
        for &b in &breakpoints {
            let (hash, size) = ends[b];
            if size >= prompt.min_tokens {
                self.prefixes.insert(hash);
                written_to = written_to.max(size);
            }
        }
        let write = written_to - read;
        CacheUse { uncached: total - read - write, read, write }
    }
}

fn fnv(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// A block's JSON text with every object's keys in order, so that two spellings of one
/// block (a string content made a text block, fields inserted in another order) are one key.
pub fn canonical(value: &serde_json::Value) -> String {
    fn sorted(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                serde_json::Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&map[k]))).collect())
            }
            serde_json::Value::Array(items) => serde_json::Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// The size in tokens of a block's JSON text.
pub fn tokens_of(json: &str) -> u64 {
    (json.len() as u64).div_ceil(4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(key: &str, tokens: u64, breakpoint: bool) -> PromptBlock {
        PromptBlock { tokens, key: key.into(), breakpoint }
    }

    #[test]
    fn a_growing_conversation_reads_what_the_last_step_wrote() {
        let mut cache = PromptCache::default();
        let mut prompt = Prompt {
            scope: "m".into(),
            blocks: vec![block("system", 2000, true), block("u1", 100, true)],
            min_tokens: 1024,
        };
        assert_eq!(cache.serve(&prompt), CacheUse { uncached: 0, read: 0, write: 2100 });
        prompt.blocks[1].breakpoint = false;
        prompt.blocks.extend([block("a1", 50, false), block("t1", 50, true)]);
        assert_eq!(cache.serve(&prompt), CacheUse { uncached: 0, read: 2100, write: 100 });
        // A changed system prompt misses everything after it.
        prompt.blocks[0].key = "other system".into();
        assert_eq!(cache.serve(&prompt), CacheUse { uncached: 0, read: 0, write: 2200 });
    }

    #[test]
    fn short_prefixes_and_unmarked_requests_are_not_cached() {
        let mut cache = PromptCache::default();
        let short = Prompt { scope: "m".into(), blocks: vec![block("s", 500, true)], min_tokens: 1024 };
        assert_eq!(cache.serve(&short), CacheUse { uncached: 500, read: 0, write: 0 });
        assert_eq!(cache.serve(&short), CacheUse { uncached: 500, read: 0, write: 0 });
        let unmarked = Prompt { scope: "m".into(), blocks: vec![block("s", 5000, false)], min_tokens: 1024 };
        assert_eq!(cache.serve(&unmarked), CacheUse { uncached: 5000, read: 0, write: 0 });
    }

    #[test]
    fn a_hit_beyond_the_lookback_is_missed() {
        let mut cache = PromptCache::default();
        let mut blocks = vec![block("s", 2000, true)];
        let first = Prompt { scope: "m".into(), blocks: blocks.clone(), min_tokens: 1024 };
        cache.serve(&first);
        blocks[0].breakpoint = false;
        blocks.extend((0..LOOKBACK + 1).map(|i| block(&format!("b{i}"), 10, false)));
        blocks.last_mut().unwrap().breakpoint = true;
        let far = Prompt { scope: "m".into(), blocks, min_tokens: 1024 };
        assert_eq!(cache.serve(&far).read, 0);
    }
}

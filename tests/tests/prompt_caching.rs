//! Prompt caching on by default: a 20-step tool loop of an engine-hosted agent against the
//! strict fakes of Anthropic and of OpenAI's Responses API, whose prompt caches read and write
//! prefixes as the providers' do (`turnstone_tests::fake_prompt_cache`), once with
//! `prompt_cache` left at its default and once `off`. The session's usage (API, in one
//! vocabulary) and cost say what caching saved; the figures are printed.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use turnstone_engine::llm_format::usage::TokenCounts;
use turnstone_engine::session::TurnStatus;
use turnstone_tests::fake_prompt_cache::CacheUse;
use turnstone_tests::{FakeToolCall, ModelFake, Reply, TestHost};

const PATIENCE: Duration = Duration::from_secs(15);
const STEPS: usize = 20;

/// A system prompt above Sonnet 4.5's 1,024-token minimum for a cached prefix.
fn system_prompt() -> String {
    let rule =
        "Answer in one short sentence, confirm every step with the user before going on, and never guess. ";
    rule.repeat(60)
}

/// The usage, cost and the fake's per-request cache use of one 20-step session.
async fn run(provider: ModelFake, prompt_cache: &str) -> (TokenCounts, String, Vec<CacheUse>, Vec<Value>) {
    let fake = &provider.fake;
    for step in 1..=STEPS {
        fake.push(Reply::tool_calls([FakeToolCall::new(
            format!("call_{step}"),
            "confirm",
            format!(r#"{{"question":"Step {step}: go on?"}}"#),
        )]));
    }
    fake.push(Reply::text("All steps confirmed."));
    let config = format!(
        r#"
[defaults]
llm = {{ timeout_secs = 5, max_retries = 0, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }}

[llm.model]
type = "{kind}"
base_url = "{}"
{prompt_cache}
prices."{model}" = {{ input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 }}

[agent.deployer]
model = "{model}"
llm = "model"
system = "{}"

[[agent.deployer.tools]]
name = "confirm"
description = "Asks the user."
handler = "client"
input = {{ type = "object", properties = {{ question = {{ type = "string" }} }} }}
"#,
        provider.base_url,
        system_prompt(),
        kind = provider.kind,
        model = provider.model,
    );
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(&config, dir.path()).await;
    let session = "s-cache";
    let input = json!({"type": "client.message", "agent_id": "deployer",
                       "message": {"role": "user", "content": "Deploy, step by step."}});
    let turn_id = host.submit_ok(session, &input).await;
    host.answer_client_calls(session, STEPS, "yes", PATIENCE).await;
    let turn = host.wait_turn(session, &turn_id).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    let summary = host.summary(session).await;
    assert_eq!(summary.usage.llm_calls, STEPS as u64 + 1);
    assert_eq!(turn.usage_counts, summary.usage.counts, "the turn's usage, the session's only turn");
    let bodies = fake.requests().into_iter().map(|r| r.body).collect();
    let uses = fake.cache_uses();
    host.stop().await;
    (summary.usage.counts, summary.usage.cost, uses, bodies)
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_reads_each_step_back_from_the_cache() {
    let (cached, cached_cost, uses, bodies) = run(ModelFake::anthropic().await, "").await;
    let (uncached, uncached_cost, _, plain) =
        run(ModelFake::anthropic().await, r#"prompt_cache = "off""#).await;

    // Off: no breakpoint is sent and nothing is read from or written to the cache.
    assert!(plain.iter().all(|b| !b.to_string().contains("cache_control")));
    assert_eq!((uncached.cache_read, uncached.cache_write), (0, 0), "{uncached:?}");
    // On: the same input, nearly all of it read back; each step reads the whole prompt the
    // step before it sent, and writes only what is new.
    assert!(bodies.iter().all(|b| b.to_string().matches("cache_control").count() <= 4));
    assert_eq!(cached.input, uncached.input, "the same conversation");
    assert_eq!(uses.len(), STEPS + 1);
    assert_eq!(uses[0].read, 0);
    for (i, pair) in uses.windows(2).enumerate() {
        assert_eq!(pair[1].read, pair[0].input(), "step {} reads the prompt of step {}", i + 2, i + 1);
        assert!(pair[1].write < pair[0].input() / 10, "step {}: {:?}", i + 2, pair[1]);
    }
    assert_eq!(cached.cache_read, uses.iter().map(|u| u.read).sum::<u64>(), "the usage reports the hits");
    assert_eq!(cached.cache_write, uses.iter().map(|u| u.write).sum::<u64>());
    assert!(cached.cache_read * 10 > cached.input * 8, "{cached:?}");
    let dollars = |cost: &str| cost.parse::<f64>().unwrap();
    assert!(dollars(&cached_cost) * 2.0 < dollars(&uncached_cost), "{cached_cost} vs {uncached_cost}");

    eprintln!(
        "{STEPS}-step tool loop, {} model calls: input {} tokens either way; cached: {} read from the cache, \
         {} written, {} uncached, ${cached_cost}; uncached: {} uncached, ${uncached_cost}",
        STEPS + 1,
        cached.input,
        cached.cache_read,
        cached.cache_write,
        cached.input - cached.cache_read - cached.cache_write,
        uncached.input,
    );
}

/// OpenAI caches by itself: each step is sent the session as `prompt_cache_key` (left out
/// when `off`), and reads the prompt of the step before it back from the cache.
#[tokio::test(flavor = "multi_thread")]
async fn openai_responses_reads_each_step_back_from_the_cache() {
    let (cached, _, uses, bodies) = run(ModelFake::responses().await, "").await;
    let (_, _, _, plain) = run(ModelFake::responses().await, r#"prompt_cache = "off""#).await;
    assert!(bodies.iter().all(|b| b["prompt_cache_key"] == "s-cache"), "{}", bodies[0]);
    assert!(plain.iter().all(|b| b.get("prompt_cache_key").is_none()));
    for (i, pair) in uses.windows(2).enumerate() {
        assert_eq!(pair[1].read, pair[0].input(), "step {} reads the prompt of step {}", i + 2, i + 1);
    }
    assert_eq!((cached.cache_read, cached.cache_write), (uses.iter().map(|u| u.read).sum::<u64>(), 0));
    assert!(cached.cache_read * 10 > cached.input * 8, "{cached:?}");
    eprintln!(
        "OpenAI Responses, {STEPS}-step tool loop: input {} tokens, {} of them read from the cache",
        cached.input, cached.cache_read
    );
}

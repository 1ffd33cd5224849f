//! A session that outlives its model's context window (issue 40): `--turns` turns of an
//! engine-hosted agent against the strict Anthropic fake with a `--window`-token window, the
//! engine compacting the conversation's view as it goes. A program that prints figures, never
//! a test.
//!
//! ```text
//! cargo run --release -p turnstone --example context_window -- \
//!     [--turns 1000] [--window 200000] [--at 1,100,500,1000] [--user-tokens 1500] \
//!     [--reply-tokens 500] [--span 20]
//! ```
//!
//! The host is the local one's wiring (`turnstone_tests::TestHost`: a SQLite file in a temp
//! dir, the in-process queue, served over HTTP); the agent's model is `claude-sonnet-4-5` on
//! `turnstone_tests::FakeAnthropic`, which refuses a request past its window as Anthropic does
//! and plays Anthropic's prompt cache (`tests/src/fake_prompt_cache.rs`). Prices per MTok:
//! input 3.0, output 15.0, cache read 0.3, cache write 3.75; prompt caching at its default;
//! compaction at its defaults (at 80% of the window, the newest quarter kept word for word).
//! The agent has no tools, so every compaction is a summary (a model call the fake answers
//! with its default reply, like every turn).
//!
//! Each turn is one user message of about `--user-tokens` tokens as the fake counts them (a
//! quarter of the block's JSON length), different every turn, answered with `--reply-tokens`
//! words (`Reply::filler`, one output token each). For each `--at` turn it prints that turn's
//! model requests (the fake's count of the tokens sent, and what the prompt cache read and
//! wrote), the same over the `--span` turns around it, and so far: compactions by kind (the
//! `context_compacted` events), model calls (the session's `usage.llm_calls`, compaction
//! calls included), dollars (differences of the session's `usage.cost`, `GET
//! /v1/sessions/{id}`) and the cache hit ratio (tokens read from the cache over input tokens,
//! from the session's usage: compaction calls included). Then the cost per turn at turn 100
//! against the last turns (the issue's acceptance: within 1.5x, compaction included), plainly
//! over fixed windows and amortized over compaction cycles (see [`print_acceptance`]).
//!
//! It asserts nothing; it exits non-zero only when a turn does not complete (after printing
//! what it measured up to there).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};
use turnstone_engine::llm_format::usage::TokenCounts;
use turnstone_engine::session::{TurnStatus, parse_picodollars};
use turnstone_runtime::api::{SessionSummary, Submitted};
use turnstone_tests::fake_prompt_cache::{CacheUse, tokens_of};
use turnstone_tests::{FakeAnthropic, Reply, TestHost};
// The binary's allocator (declared in its library), so the host runs as it does in production.
use turnstone as _;

const SESSION: &str = "s-context-window";
const AGENT: &str = "a";
const MODEL: &str = "claude-sonnet-4-5";
/// A turn that takes longer than this fails the run (`TestHost::wait_turn_within` panics).
const PATIENCE: Duration = Duration::from_secs(300);
/// The issue's acceptance: a turn at 1,000 costs at most this many times a turn at 100.
const TARGET: f64 = 1.5;
/// The turn the last turns are compared with.
const REFERENCE_TURN: usize = 100;

#[derive(Debug, Parser)]
#[command(
    about = "Runs one long session through a model's context window (compaction) against the strict Anthropic fake, and prints tokens, calls, dollars and cache hits per turn."
)]
struct Args {
    /// Turns of the session.
    #[arg(long, default_value_t = 1000)]
    turns: usize,
    /// The model's context window in tokens (the fake's and the agent's `context_window`).
    #[arg(long, default_value_t = 200_000)]
    window: u64,
    /// The turns reported.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 100, 500, 1000])]
    at: Vec<usize>,
    /// The size of each user message, in tokens as the fake counts them.
    #[arg(long, default_value_t = 1500)]
    user_tokens: u64,
    /// The size of each reply (and each summary), in words: one output token each.
    #[arg(long, default_value_t = 500)]
    reply_tokens: usize,
    /// How many turns around each reported turn are summed as well (`at-span/2+1 ..= at+span/2`,
    /// moved to stay within the run).
    #[arg(long, default_value_t = 20)]
    span: usize,
}

fn config_toml(base_url: &str, window: u64) -> String {
    format!(
        r#"
[defaults]
llm = {{ timeout_secs = 120, max_retries = 1, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }}

[llm.claude]
type = "anthropic"
base_url = "{base_url}"
prices."{MODEL}" = {{ input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 }}

[agent.{AGENT}]
model = "{MODEL}"
llm = "claude"
system = "You are a careful assistant for a logistics company. Keep every fact, number and name the user gives you, and answer from them."
context_window = {window}
"#
    )
}

// ---------------------------------------------------------------------------------------------
// The user's messages
// ---------------------------------------------------------------------------------------------

const WORDS: &[&str] = &[
    "order",
    "pallet",
    "warehouse",
    "invoice",
    "carrier",
    "route",
    "customs",
    "delivery",
    "depot",
    "truck",
    "container",
    "manifest",
    "shipment",
    "refund",
    "supplier",
    "quote",
    "deadline",
    "dock",
    "crate",
    "ledger",
    "forklift",
    "harbor",
    "freight",
    "parcel",
    "tracking",
    "consignee",
    "broker",
    "tariff",
    "weight",
    "volume",
    "north",
    "south",
    "east",
    "west",
    "morning",
    "evening",
    "urgent",
    "fragile",
    "delayed",
    "confirmed",
    "cancelled",
    "rerouted",
    "priority",
    "standard",
    "express",
    "overnight",
    "insured",
    "damaged",
    "missing",
    "returned",
    "Lisbon",
    "Rotterdam",
    "Hamburg",
    "Gdansk",
    "Valencia",
    "Antwerp",
    "Genoa",
    "Marseille",
    "Dublin",
    "Oslo",
    "Riga",
    "Tallinn",
    "Porto",
    "Bilbao",
];

/// A deterministic generator (splitmix64): every run sends the same messages.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The fake's count of a user message of `text` (one text block of the request).
fn user_block_tokens(text: &str) -> u64 {
    tokens_of(&json!({"role": "user", "type": "text", "text": text}).to_string())
}

/// Turn `n`'s message: facts in varied words and numbers, about `tokens` tokens as the fake
/// counts them.
fn user_text(n: usize, tokens: u64, rng: &mut Rng) -> String {
    let mut text = format!("Turn {n}. Please note these facts and keep them:");
    let target = (tokens as usize).saturating_mul(4).saturating_sub(40);
    while text.len() < target {
        let sentence = format!(
            " The {} {} {} is {} at {} {}-{}, reference {}{:05}.",
            WORDS[rng.below(WORDS.len())],
            WORDS[rng.below(WORDS.len())],
            WORDS[rng.below(WORDS.len())],
            WORDS[rng.below(WORDS.len())],
            WORDS[rng.below(WORDS.len())],
            rng.below(900) + 100,
            rng.below(90) + 10,
            (b'A' + rng.below(26) as u8) as char,
            rng.below(100_000),
        );
        text.push_str(&sentence);
    }
    text
}

// ---------------------------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------------------------

/// The session's usage as its summary gives it.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    llm_calls: u64,
    cost: i128,
    counts: TokenCounts,
}

impl Totals {
    fn of(summary: &SessionSummary) -> anyhow::Result<Self> {
        let cost = parse_picodollars(&summary.usage.cost)
            .with_context(|| format!("the session's cost {:?} is no decimal", summary.usage.cost))?;
        Ok(Totals { llm_calls: summary.usage.llm_calls, cost, counts: summary.usage.counts })
    }

    /// What was added since `before`.
    fn since(&self, before: &Totals) -> Totals {
        let (a, b) = (&self.counts, &before.counts);
        Totals {
            llm_calls: self.llm_calls - before.llm_calls,
            cost: self.cost - before.cost,
            counts: TokenCounts {
                input: a.input - b.input,
                output: a.output - b.output,
                cache_read: a.cache_read - b.cache_read,
                cache_write: a.cache_write - b.cache_write,
                reasoning: a.reasoning - b.reasoning,
            },
        }
    }

    fn add(&mut self, other: &Totals) {
        self.llm_calls += other.llm_calls;
        self.cost += other.cost;
        self.counts.input += other.counts.input;
        self.counts.output += other.counts.output;
        self.counts.cache_read += other.counts.cache_read;
        self.counts.cache_write += other.counts.cache_write;
        self.counts.reasoning += other.counts.reasoning;
    }

    fn hit_ratio(&self) -> f64 {
        ratio(self.counts.cache_read, self.counts.input)
    }
}

/// One `context_compacted` event.
#[derive(Debug, Clone)]
struct Compacted {
    kind: String,
    reason: String,
    tokens_before: u64,
    tokens_after: u64,
    /// The summarizing call's tokens and cost (none for cleared tool results).
    call: Option<(TokenCounts, i128)>,
}

impl Compacted {
    fn of(event: &Value) -> Self {
        let text = |key: &str| event.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let number = |key: &str| event.get(key).and_then(Value::as_u64).unwrap_or(0);
        let call = event.get("response").filter(|r| !r.is_null()).map(|response| {
            let counts = response.get("usage").map(TokenCounts::of).unwrap_or_default();
            let cost = response.get("cost").and_then(Value::as_str).and_then(parse_picodollars).unwrap_or(0);
            (counts, cost)
        });
        Compacted {
            kind: text("kind"),
            reason: text("reason"),
            tokens_before: number("tokens_before"),
            tokens_after: number("tokens_after"),
            call,
        }
    }
}

/// What one turn took.
#[derive(Debug, Clone)]
struct TurnFigures {
    /// The requests the fake answered in the turn, in order: the compactions' summarizing
    /// calls first, the turn's own call last.
    requests: Vec<CacheUse>,
    /// Requests the fake refused (for their length: 400) in the turn.
    refused: usize,
    compactions: Vec<Compacted>,
    /// The session's usage added by the turn.
    usage: Totals,
    /// The turn's own usage (its record's), compaction calls included: a cross-check.
    own_cost: i128,
    /// The session's usage after the turn.
    so_far: Totals,
    wall: Duration,
}

impl TurnFigures {
    /// The turn's own model call's request (the last the fake answered).
    fn main_request(&self) -> Option<&CacheUse> {
        self.requests.last()
    }

    /// The summarizing calls' requests (those before the last).
    fn summary_requests(&self) -> &[CacheUse] {
        &self.requests[..self.requests.len().saturating_sub(1)]
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn dollars(picodollars: i128) -> f64 {
    picodollars as f64 / 1e12
}

/// `n` with thousands separators.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn describe_request(u: &CacheUse) -> String {
    format!(
        "{} tokens (cache read {}, write {}, uncached {})",
        thousands(u.input()),
        thousands(u.read),
        thousands(u.write),
        thousands(u.uncached)
    )
}

/// Compactions by kind, as `2 (2 summary)`.
fn by_kind<'a>(compactions: impl Iterator<Item = &'a Compacted>) -> String {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for c in compactions {
        *kinds.entry(c.kind.as_str()).or_default() += 1;
    }
    let total: usize = kinds.values().sum();
    if total == 0 {
        return "0".to_owned();
    }
    let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    format!("{total} ({})", parts.join(", "))
}

/// The turns `lo..=hi` (1-based) of `span` turns around `at`, within `1..=len`.
fn around(at: usize, span: usize, len: usize) -> (usize, usize) {
    let span = span.clamp(1, len.max(1));
    let lo = at.saturating_sub(span / 2).saturating_add(1).max(1);
    let hi = (lo + span - 1).min(len);
    (hi + 1 - span, hi)
}

/// The turns `lo..=hi` summed.
fn sum(turns: &[TurnFigures], lo: usize, hi: usize) -> Totals {
    let mut total = Totals::default();
    for t in &turns[lo - 1..hi] {
        total.add(&t.usage);
    }
    total
}

/// The turns that compacted (1-based).
fn compaction_turns(turns: &[TurnFigures]) -> Vec<usize> {
    turns.iter().enumerate().filter(|(_, t)| !t.compactions.is_empty()).map(|(i, _)| i + 1).collect()
}

/// The compaction cycle of turn `at`: from the turn that compacted last at or before it to the
/// turn before the next compaction. `None` before the first compaction; for a turn after the
/// last compaction, the last complete cycle (and `false`).
fn cycle(compacted: &[usize], at: usize) -> Option<(usize, usize, bool)> {
    let pairs: Vec<(usize, usize)> = compacted.windows(2).map(|w| (w[0], w[1] - 1)).collect();
    if let Some(&(lo, hi)) = pairs.iter().find(|(lo, hi)| (*lo..=*hi).contains(&at)) {
        return Some((lo, hi, true));
    }
    match pairs.last() {
        Some(&(lo, hi)) if at > hi => Some((lo, hi, false)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------

fn print_turn(args: &Args, turns: &[TurnFigures], at: usize, label: &str) {
    let Some(t) = turns.get(at - 1) else { return };
    println!();
    println!("{label} {at}:");
    // The turn itself.
    let main = t.main_request().map_or_else(|| "none".to_owned(), describe_request);
    let summaries = t.summary_requests();
    let summary_calls = if summaries.is_empty() {
        String::new()
    } else {
        let sizes: Vec<String> = summaries.iter().map(describe_request).collect();
        let cost: i128 = t.compactions.iter().filter_map(|c| c.call.map(|(_, cost)| cost)).sum();
        format!(
            "; before it {} summarizing call(s): {} (${:.4})",
            summaries.len(),
            sizes.join(", "),
            dollars(cost)
        )
    };
    let refused =
        if t.refused > 0 { format!("; {} request(s) refused for length", t.refused) } else { String::new() };
    println!("  this turn: its request {main}{summary_calls}{refused}");
    println!(
        "  this turn: {} model call(s), ${:.4} (compaction included), cache hit {:.1}%, compactions {}, {:.0} ms",
        t.usage.llm_calls,
        dollars(t.usage.cost),
        100.0 * t.usage.hit_ratio(),
        by_kind(t.compactions.iter()),
        t.wall.as_secs_f64() * 1000.0
    );
    // The turns around it.
    let (lo, hi) = around(at, args.span, turns.len());
    if hi > lo {
        let window = &turns[lo - 1..hi];
        let mains: Vec<u64> = window.iter().filter_map(|t| t.main_request().map(CacheUse::input)).collect();
        let total = sum(turns, lo, hi);
        let n = (hi + 1 - lo) as f64;
        let summaries: Vec<u64> =
            window.iter().flat_map(|t| t.summary_requests().iter().map(CacheUse::input)).collect();
        let at_turns: Vec<String> = window
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.compactions.is_empty())
            .map(|(i, _)| (lo + i).to_string())
            .collect();
        println!(
            "  turns {lo}-{hi} ({} turns around it): turn requests {} tokens on average (min {}, max {}); \
             {} summarizing call(s){}; {} model calls; ${:.4} (${:.4}/turn); cache hit {:.1}%; compactions {}{}",
            hi + 1 - lo,
            thousands(mains.iter().sum::<u64>() / mains.len().max(1) as u64),
            thousands(mains.iter().copied().min().unwrap_or(0)),
            thousands(mains.iter().copied().max().unwrap_or(0)),
            summaries.len(),
            if summaries.is_empty() {
                String::new()
            } else {
                let s: Vec<String> = summaries.iter().map(|&s| thousands(s)).collect();
                format!(" of {} tokens", s.join(", "))
            },
            total.llm_calls,
            dollars(total.cost),
            dollars(total.cost) / n,
            100.0 * total.hit_ratio(),
            by_kind(window.iter().flat_map(|t| t.compactions.iter())),
            if at_turns.is_empty() { String::new() } else { format!(" (at turn {})", at_turns.join(", ")) }
        );
    }
    // So far.
    println!(
        "  so far: {} model calls, compactions {}, ${:.4}, cache hit {:.1}% cumulative",
        t.so_far.llm_calls,
        by_kind(turns[..at].iter().flat_map(|t| t.compactions.iter())),
        dollars(t.so_far.cost),
        100.0 * t.so_far.hit_ratio()
    );
    // Its compaction cycle.
    match cycle(&compaction_turns(turns), at) {
        Some((lo, hi, own)) => {
            let total = sum(turns, lo, hi);
            let n = hi + 1 - lo;
            let compaction: i128 =
                turns[lo - 1].compactions.iter().filter_map(|c| c.call.map(|(_, cost)| cost)).sum();
            println!(
                "  {}: turns {lo}-{hi} ({n} turns, compacting at {lo}): ${:.4}, ${:.4}/turn amortized; the \
                 compacting turn ${:.4} (its summarizing call ${:.4}), the other turns ${:.4}/turn",
                if own {
                    "its compaction cycle"
                } else {
                    "after the last compaction; the last complete cycle"
                },
                dollars(total.cost),
                dollars(total.cost) / n as f64,
                dollars(turns[lo - 1].usage.cost),
                dollars(compaction),
                if n > 1 { dollars(total.cost - turns[lo - 1].usage.cost) / (n - 1) as f64 } else { 0.0 }
            );
        }
        None => println!("  compaction cycle: none yet (the conversation still grows toward the threshold)"),
    }
}

fn print_compactions(turns: &[TurnFigures]) {
    println!();
    println!("Compactions ({}):", by_kind(turns.iter().flat_map(|t| t.compactions.iter())));
    let compacted = compaction_turns(turns);
    for (i, &at) in compacted.iter().enumerate() {
        let since =
            if i == 0 { String::new() } else { format!(", {} turns after the last", at - compacted[i - 1]) };
        for c in &turns[at - 1].compactions {
            let call = match &c.call {
                Some((counts, cost)) => format!(
                    "; summarizing call {} tokens in ({} read from the cache), {} out, ${:.4}",
                    thousands(counts.input),
                    thousands(counts.cache_read),
                    thousands(counts.output),
                    dollars(*cost)
                ),
                None => String::new(),
            };
            println!(
                "  turn {at:>5}{since}: {} ({}), estimated {} -> {} tokens{call}",
                c.kind,
                c.reason,
                thousands(c.tokens_before),
                thousands(c.tokens_after)
            );
        }
    }
}

/// The issue's acceptance: the cost of a turn at 1,000 within 1.5x of a turn at 100,
/// compaction included. Two ways:
/// - **fixed windows**: the average over turns 91-110 against the last 20 turns (and the
///   last 10), whatever compactions fall in them: a window that holds a compaction carries
///   all of its cost, one that holds none carries none of it;
/// - **amortized over compaction cycles**: a cycle runs from a turn that compacts (its
///   summarizing call, and its own request, which misses the prompt cache and writes it anew)
///   to the turn before the next compaction, so its average per turn carries one compaction
///   spread over the turns it bought. Turn 100's cycle against the last complete cycle.
fn print_acceptance(turns: &[TurnFigures]) {
    let len = turns.len();
    println!();
    if len < REFERENCE_TURN + 20 {
        println!("Cost per turn against turn {REFERENCE_TURN}: too few turns ({len}) to compare");
        return;
    }
    println!(
        "Cost per turn, turn {len} against turn {REFERENCE_TURN} (the issue's acceptance: within {TARGET}x, compaction included):"
    );
    let verdict = |r: f64| if r <= TARGET { "within" } else { "OVER" };
    let per_turn = |lo: usize, hi: usize| dollars(sum(turns, lo, hi).cost) / (hi + 1 - lo) as f64;
    let compactions_in =
        |lo: usize, hi: usize| turns[lo - 1..hi].iter().map(|t| t.compactions.len()).sum::<usize>();
    let (a_lo, a_hi) = around(REFERENCE_TURN, 20, len);
    let reference = per_turn(a_lo, a_hi);
    println!(
        "  fixed windows: turns {a_lo}-{a_hi}: ${reference:.4}/turn ({} compaction(s) in it)",
        compactions_in(a_lo, a_hi)
    );
    for width in [20, 10] {
        let (lo, hi) = (len.saturating_sub(width) + 1, len);
        if lo <= a_hi {
            continue;
        }
        let last = per_turn(lo, hi);
        let r = if reference > 0.0 { last / reference } else { 0.0 };
        println!(
            "  fixed windows: turns {lo}-{hi}: ${last:.4}/turn ({} compaction(s) in it): {r:.2}x ({} {TARGET}x)",
            compactions_in(lo, hi),
            verdict(r)
        );
    }
    let compacted = compaction_turns(turns);
    match (cycle(&compacted, REFERENCE_TURN), cycle(&compacted, len)) {
        (Some((a_lo, a_hi, _)), Some((b_lo, b_hi, own))) if (a_lo, a_hi) != (b_lo, b_hi) => {
            let (a, b) = (per_turn(a_lo, a_hi), per_turn(b_lo, b_hi));
            let r = if a > 0.0 { b / a } else { 0.0 };
            println!(
                "  amortized over compaction cycles: turn {REFERENCE_TURN}'s cycle, turns {a_lo}-{a_hi}: ${a:.4}/turn; \
                 {} turns {b_lo}-{b_hi}: ${b:.4}/turn: {r:.2}x ({} {TARGET}x)",
                if own { format!("turn {len}'s cycle,") } else { "the last complete cycle,".to_owned() },
                verdict(r)
            );
        }
        _ => println!(
            "  amortized over compaction cycles: not enough compactions ({}) to compare two cycles",
            compacted.len()
        ),
    }
}

fn print_report(args: &Args, turns: &[TurnFigures]) {
    let mut at: Vec<usize> = args.at.iter().copied().filter(|&n| n >= 1 && n <= turns.len()).collect();
    at.sort_unstable();
    at.dedup();
    for &n in &at {
        print_turn(args, turns, n, "Turn");
    }
    if !turns.is_empty() && at.last() != Some(&turns.len()) {
        print_turn(args, turns, turns.len(), "Final: turn");
    }
    let Some(last) = turns.last() else { return };
    print_compactions(turns);
    print_acceptance(turns);
    let largest = turns.iter().flat_map(|t| t.requests.iter().map(CacheUse::input)).max().unwrap_or(0);
    let refused: usize = turns.iter().map(|t| t.refused).sum();
    let own: i128 = turns.iter().map(|t| t.own_cost).sum();
    let wall: Duration = turns.iter().map(|t| t.wall).sum();
    println!();
    println!(
        "Final: {} turns, {} model calls, compactions {}, ${:.4} (${:.4}/turn), cache hit {:.1}% cumulative; largest request \
         {} tokens of the {}-token window; {refused} request(s) refused for length; the turns' own costs sum to the \
         session's: {}; {:.1} s of turns ({:.0} ms/turn)",
        turns.len(),
        last.so_far.llm_calls,
        by_kind(turns.iter().flat_map(|t| t.compactions.iter())),
        dollars(last.so_far.cost),
        dollars(last.so_far.cost) / turns.len() as f64,
        100.0 * last.so_far.hit_ratio(),
        thousands(largest),
        thousands(args.window),
        if own == last.so_far.cost { "yes".to_owned() } else { format!("NO (${:.4})", dollars(own)) },
        wall.as_secs_f64(),
        wall.as_secs_f64() * 1000.0 / turns.len() as f64
    );
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let fake = FakeAnthropic::start().await;
    fake.set_context_window(Some(args.window));
    fake.set_default(Reply::filler(args.reply_tokens));
    let dir =
        tempfile::Builder::new().prefix("turnstone-context-").tempdir().context("creating a temp dir")?;
    let host = TestHost::start(&config_toml(&fake.base_url(), args.window), dir.path()).await;

    let mut rng = Rng(0x5eed_0040);
    let sample = user_text(1, args.user_tokens, &mut Rng(0x5eed_0040));
    println!(
        "{} turns of agent {AGENT:?} ({MODEL}) through a {}-token window (the strict Anthropic fake, SQLite): \
         user messages of about {} tokens as the fake counts them, replies and summaries of {} words; \
         compaction and prompt caching at their defaults. Dollars per MTok: input 3.0, output 15.0, \
         cache read 0.3, cache write 3.75. Cache hit: tokens read from the cache / input tokens.",
        args.turns,
        thousands(args.window),
        thousands(user_block_tokens(&sample)),
        args.reply_tokens
    );

    let mut turns: Vec<TurnFigures> = Vec::with_capacity(args.turns);
    let mut before = Totals::default();
    let mut after_seq = 0;
    let (mut answered, mut sent) = (0, 0);
    let started = Instant::now();
    let mut failure = None;
    for n in 1..=args.turns {
        let text = user_text(n, args.user_tokens, &mut rng);
        let input = json!({"type": "client.message", "agent_id": AGENT, "message": {"role": "user", "content": text}});
        let began = Instant::now();
        let (status, body) = host.submit(SESSION, &input).await;
        if status != 202 {
            failure = Some(format!("turn {n}: the input was answered {status}: {body}"));
            break;
        }
        let submitted: Submitted = serde_json::from_value(body).context("a submit answer")?;
        let turn_id = submitted.turn_id.map(String::from).context("the submit answer names no turn")?;
        let turn = host.wait_turn_within(SESSION, &turn_id, PATIENCE).await;
        let wall = began.elapsed();
        if turn.status != TurnStatus::Completed {
            failure = Some(format!(
                "turn {n} ended {:?}: {}",
                turn.status,
                turn.error.clone().unwrap_or_else(|| "(no error given)".to_owned())
            ));
            break;
        }
        let now = Totals::of(&host.summary(SESSION).await)?;
        let uses = fake.cache_uses();
        let requests = uses[answered.min(uses.len())..].to_vec();
        answered = uses.len();
        let count = fake.request_count();
        let refused = (count - sent).saturating_sub(requests.len());
        sent = count;
        let events = host.events(SESSION, after_seq).await;
        after_seq = events.iter().map(|e| e.seq).max().unwrap_or(after_seq);
        let compactions: Vec<Compacted> = events
            .iter()
            .filter(|e| e.event.get("type").and_then(Value::as_str) == Some("context_compacted"))
            .map(|e| Compacted::of(&e.event))
            .collect();
        turns.push(TurnFigures {
            requests,
            refused,
            compactions,
            usage: now.since(&before),
            own_cost: turn.usage.cost_picodollars,
            so_far: now,
            wall,
        });
        before = now;
        if n.is_multiple_of(50) || n == args.turns {
            let last = turns.last().and_then(TurnFigures::main_request).map_or(0, CacheUse::input);
            eprintln!(
                "  turn {n}/{}: {:.0} s, compactions {}, last request {} tokens, ${:.4} so far",
                args.turns,
                started.elapsed().as_secs_f64(),
                by_kind(turns.iter().flat_map(|t| t.compactions.iter())),
                thousands(last),
                dollars(now.cost)
            );
        }
    }
    print_report(&args, &turns);
    host.stop().await;
    if let Some(failure) = failure {
        bail!("{failure}");
    }
    Ok(())
}

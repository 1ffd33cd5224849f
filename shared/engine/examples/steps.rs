//! Per-step engine time as a session grows: runs one engine-hosted session through `turns`
//! plain turns (a user message, a model reply) with the engine alone (no store, no I/O) and
//! prints the median time of `handle` per step around turn 1, 100, 1,000, ... A program that
//! prints figures, never a test.
//!
//! ```text
//! cargo run --release -p turnstone-engine --features testing --example steps -- [turns]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark: fail loudly

use std::time::{Duration, Instant};

use turnstone_engine::session::{Command, Ctx, handle};
use turnstone_engine::testing::{Driver, reply};
use turnstone_engine::time::Timestamp;

fn main() {
    let turns: usize = std::env::args().nth(1).map_or(1000, |t| t.parse().expect("turns: a number"));
    let mut driver = Driver::create("bench", "agent", None, false, Timestamp(1_796_000_000_000));
    // Median step time per turn, measured on `handle` alone (the driver's own bookkeeping and
    // log are outside the clock).
    let mut per_turn: Vec<Duration> = Vec::with_capacity(turns);
    for turn in 0..turns {
        let mut times = Vec::new();
        let mut step = |driver: &mut Driver, command: Command| {
            let ctx = Ctx::new(driver.now, 0x5eed ^ (turn as u64) << 8 ^ times.len() as u64);
            let started = Instant::now();
            let transition = handle(&driver.session, command.clone(), &ctx).expect("the step is accepted");
            times.push(started.elapsed());
            drop(transition);
            driver.exec(command);
        };
        step(&mut driver, turnstone_engine::testing::message("agent", &format!("question {turn}")));
        let (call_id, attempt) = driver.due_llm().expect("a model call is due");
        step(&mut driver, Command::ClaimLlmCall { call_id: call_id.clone(), attempt });
        step(
            &mut driver,
            Command::LlmCallFinished { call_id, attempt, outcome: Ok(reply(&format!("answer {turn}"))) },
        );
        let version = driver.version + 1;
        driver.committed(version);
        driver.forget_committed();
        times.sort();
        per_turn.push(times[times.len() / 2]);
    }
    println!("per-step engine time (median of a turn's steps, then median over 10 turns), {turns} turns");
    let mut marks = vec![1usize, 10, 100, 1000, 10_000];
    marks.retain(|&m| m <= turns);
    let base = window(&per_turn, 1);
    for mark in marks {
        let t = window(&per_turn, mark);
        println!(
            "  turn {mark:>6}: {:>8.1} us  ({:.2}x turn 1)",
            t.as_secs_f64() * 1e6,
            t.as_secs_f64() / base.as_secs_f64()
        );
    }
}

/// The median over the ten turns ending at `mark` (1-based; the first ten for turn 1).
fn window(per_turn: &[Duration], mark: usize) -> Duration {
    let end = mark.max(10).min(per_turn.len());
    let mut w: Vec<Duration> = per_turn[end.saturating_sub(10)..end].to_vec();
    w.sort();
    w[w.len() / 2]
}

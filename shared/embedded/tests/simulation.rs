//! A deterministic simulation of the runtime: the real `App` and `Dispatcher` (real engine,
//! real commands) over the in-memory or the SQLite store, a queue the scheduler delivers from
//! (late, twice, out of order; lost with the process when it is in-process), a simulated
//! worker and model with seeded faults, and process crashes before and after every commit,
//! send and outbound call. After each run the invariants are checked (see `sim/run.rs`).
//!
//! One seed: `TURNSTONE_RUNTIME_SIM_SEED=<n> cargo test -p turnstone-embedded --test simulation`
//! (`TURNSTONE_RUNTIME_SIM_STEPS`, `TURNSTONE_RUNTIME_SIM_STORE=memory|sqlite`,
//! `TURNSTONE_RUNTIME_SIM_HOST=local|split` to pin the rest); a longer sweep:
//! `TURNSTONE_RUNTIME_SIM_SEEDS=<n>` (`scripts/sim`). A failing seed is printed with its
//! command; keep it in `REGRESSION_SEEDS`.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sim;

use sim::run::{Outcome, run};
use sim::{Backend, Host};

/// Seeds that found real bugs, with the steps they took: 9, a message sent again under the id
/// of a turn the head had forgot was refused while another turn ran (`App::submit`); 746, a
/// model reply with tool calls arriving while its turn's `done` waited for an interrupt left
/// them unanswered on the path for good (the engine's `respond`).
const REGRESSION_SEEDS: &[(u64, usize)] = &[(9, 600), (746, 600)];
/// Seeds and steps of a CI run.
const SEEDS: u64 = 160;
const STEPS: usize = 600;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Prints the command that replays a failing seed.
struct SeedGuard(u64, usize);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "runtime simulation failed with seed {0}: TURNSTONE_RUNTIME_SIM_SEED={0} TURNSTONE_RUNTIME_SIM_STEPS={1} \
                 cargo test -p turnstone-embedded --test simulation",
                self.0, self.1
            );
        }
    }
}

/// The store and host a seed runs on, unless pinned: all four combinations in turn.
fn setup(seed: u64) -> (Backend, Host) {
    let backend = match std::env::var("TURNSTONE_RUNTIME_SIM_STORE").as_deref() {
        Ok("memory") => Backend::Memory,
        Ok("sqlite") => Backend::Sqlite,
        _ if seed.is_multiple_of(2) => Backend::Memory,
        _ => Backend::Sqlite,
    };
    let host = match std::env::var("TURNSTONE_RUNTIME_SIM_HOST").as_deref() {
        Ok("local") => Host::Local,
        Ok("split") => Host::Split,
        _ if (seed / 2).is_multiple_of(2) => Host::Local,
        _ => Host::Split,
    };
    (backend, host)
}

fn run_seed(seed: u64, steps: usize) -> Outcome {
    let _guard = SeedGuard(seed, steps);
    let (backend, host) = setup(seed);
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    // The scheduler polls every future of the simulation itself, within one task: tokio's
    // cooperative budget would make that task's futures wait for a yield that never comes.
    let outcome = runtime.block_on(tokio::task::unconstrained(run(seed, steps, backend, host)));
    if std::env::var("TURNSTONE_RUNTIME_SIM_STATS").is_ok() {
        eprintln!("seed {seed} {backend:?} {host:?}: {outcome:?}");
    }
    outcome
}

#[test]
fn simulation() {
    let steps = env_or("TURNSTONE_RUNTIME_SIM_STEPS", STEPS);
    if let Some(seed) = std::env::var("TURNSTONE_RUNTIME_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        run_seed(seed, steps);
        return;
    }
    for &(seed, steps) in REGRESSION_SEEDS {
        run_seed(seed, steps);
    }
    let (mut faults, mut crashes, mut events) = (0, 0, 0);
    let seeds = env_or("TURNSTONE_RUNTIME_SIM_SEEDS", SEEDS);
    for seed in 0..seeds {
        let outcome = run_seed(seed, steps);
        faults += outcome.faults;
        crashes += outcome.crashes;
        events += outcome.events;
    }
    eprintln!("{seeds} seeds x {steps} steps: {faults} faults, {crashes} crashes, {events} commits");
    assert!(crashes > 0 && faults > 0, "the runs injected no faults: the simulation tests nothing");
}

#[test]
fn a_seed_replays_to_the_same_trace() {
    // One seed of each store and host.
    for seed in [1, 3, 4, 6] {
        let first = run_seed(seed, STEPS);
        let second = run_seed(seed, STEPS);
        assert_eq!(first, second, "seed {seed} ran differently twice");
        assert!(first.events > 0);
    }
}

//! Benchmark of `SqliteStore` commits (DESIGN.md section 12): prints commits/s, p50/p99
//! commit latency, bytes written per commit, and how commits were grouped (transactions and
//! fsyncs per commit) for one session stepped sequentially and for many sessions stepped in
//! parallel tasks, at both durability levels. A program that prints figures, never a test.
//!
//! `cargo run --release -p turnstone-embedded --example store_bench -- [steps] [full|process]`
//! runs, for each durability level (both unless one is named), one session of `steps` steps
//! (default 1000), then 16 and 50 sessions of 100 steps and 1,000 sessions of 10 steps, each
//! session in its own task. Each run gets a fresh database in a temp directory; a summary
//! table ends the output.
//!
//! Read the payload figures with the engine in mind: what a commit carries is the engine's
//! (the head snapshot, the events); the store adds pages, indexes and the WAL.
//!
//! A step is one commit as the dispatcher makes them for an engine-hosted agent: the user's
//! message with the model call's claim, then the model's reply. Sessions are built by the real
//! engine; the engine's own time is measured apart from the commit's.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstone_embedded::{Durability, GroupStats, SqliteOptions, SqliteStore};
use turnstone_runtime::clock::SystemClock;
use turnstone_runtime::conformance::{Commits, Driver, T0};
use turnstone_runtime::store::Store;

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// What one run of steps measured.
#[derive(Default)]
struct Run {
    commits: Vec<Duration>,
    engine: Duration,
}

/// Steps one session `steps` times (two commits per turn), timing each commit.
async fn step_session(store: &dyn Store, id: &str, steps: usize, big_reply: bool) -> Result<(Run, Driver)> {
    let mut run = Run::default();
    let mut d = Driver::create(id, "bench-agent", Some("bench-owner"), false, T0);
    commit(store, &mut d, &mut run).await?;
    let reply =
        if big_reply { "a fairly ordinary answer of a few sentences. ".repeat(8) } else { "ok".into() };
    let mut turn = 0;
    while run.commits.len() < steps {
        let started = Instant::now();
        d.submit(&format!("question number {turn}: what do you make of it?"));
        let call = d.claim_llm();
        run.engine += started.elapsed();
        commit(store, &mut d, &mut run).await?;
        if run.commits.len() >= steps {
            break;
        }
        let started = Instant::now();
        d.finish_llm(call, &reply);
        run.engine += started.elapsed();
        commit(store, &mut d, &mut run).await?;
        turn += 1;
    }
    Ok((run, d))
}

async fn commit(store: &dyn Store, d: &mut Driver, run: &mut Run) -> Result<()> {
    let wake_at = d.wake_at();
    let started = Instant::now();
    d.commit_waking(store, wake_at).await?;
    run.commits.push(started.elapsed());
    // The store keeps the history; the bench does not, so memory figures are the store's.
    d.forget_committed();
    Ok(())
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// A counter of `/proc/self/io` or `/proc/self/status` (0 where there is none).
fn proc_value(file: &str, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let rest = line.strip_prefix(key)?.strip_prefix(':')?;
                rest.split_whitespace().next()?.parse().ok()
            })
        })
        .unwrap_or(0)
}

fn os_written() -> u64 {
    proc_value("/proc/self/io", "wchar")
}

/// What the store counted over one run.
struct Counted {
    payload: u64,
    os_bytes: u64,
    groups: GroupStats,
}

/// The store's counters now, to subtract from later ones.
fn counters(store: &SqliteStore) -> Counted {
    Counted { payload: store.stats().payload_bytes, os_bytes: os_written(), groups: store.group_stats() }
}

fn since(store: &SqliteStore, before: &Counted) -> Counted {
    let now = counters(store);
    Counted {
        payload: now.payload - before.payload,
        os_bytes: now.os_bytes - before.os_bytes,
        groups: GroupStats {
            commits: now.groups.commits - before.groups.commits,
            groups: now.groups.groups - before.groups.groups,
            syncs: now.groups.syncs - before.groups.syncs,
        },
    }
}

/// One line of the summary table.
struct Summary {
    durability: Durability,
    sessions: usize,
    commits_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    commits_per_group: f64,
    syncs_per_commit: f64,
}

fn report(title: &str, store: &SqliteStore, runs: &[Run], wall: Duration, counted: &Counted) -> Summary {
    let (payload, os_bytes) = (counted.payload, counted.os_bytes);
    let mut all: Vec<Duration> = runs.iter().flat_map(|r| r.commits.iter().copied()).collect();
    all.sort();
    let n = all.len().max(1) as f64;
    let engine: Duration = runs.iter().map(|r| r.engine).sum();
    println!("== {title} (durability {})", store.durability());
    println!("  commits           {}", all.len());
    println!(
        "  commits/s (wall)  {:.0}  ({:.2} s, engine included)",
        n / wall.as_secs_f64(),
        wall.as_secs_f64()
    );
    println!(
        "  commit latency    p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms (waiting for the one writer included)",
        percentile(&all, 50).as_secs_f64() * 1e3,
        percentile(&all, 99).as_secs_f64() * 1e3,
        all.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    println!(
        "  engine per step   {:.3} ms (handle + plan, not part of the latency above)",
        engine.as_secs_f64() * 1e3 / n
    );
    let g = counted.groups;
    let commits_per_group = g.commits as f64 / g.groups.max(1) as f64;
    let syncs_per_commit = g.syncs as f64 / g.commits.max(1) as f64;
    println!(
        "  groups            {} transactions for {} commits ({commits_per_group:.2} commits each)",
        g.groups, g.commits
    );
    println!("  fsyncs/commit     {syncs_per_commit:.3} (WAL fsyncs at commit; checkpoints not counted)");
    println!("  payload/commit    {:.0} B (snapshot + events + messages JSON)", payload as f64 / n);
    println!(
        "  written/commit    {:.0} B (bytes handed to write(2): WAL frames and checkpoints)",
        os_bytes as f64 / n
    );
    let db = std::fs::metadata(store.path()).map(|m| m.len()).unwrap_or(0);
    let wal = std::fs::metadata(store.path().with_extension("db-wal")).map(|m| m.len()).unwrap_or(0);
    println!(
        "  files             db {:.1} MiB, wal {:.1} MiB",
        db as f64 / 1048576.0,
        wal as f64 / 1048576.0
    );
    Summary {
        durability: store.durability(),
        sessions: runs.len(),
        commits_per_s: n / wall.as_secs_f64(),
        p50_ms: percentile(&all, 50).as_secs_f64() * 1e3,
        p99_ms: percentile(&all, 99).as_secs_f64() * 1e3,
        commits_per_group,
        syncs_per_commit,
    }
}

fn open(path: &std::path::Path, durability: Durability) -> Result<SqliteStore> {
    let options = SqliteOptions { durability, ..SqliteOptions::default() };
    Ok(SqliteStore::open_with(path, options, Arc::new(SystemClock))?)
}

/// `sessions` sessions of `per_session` steps, each session in its own task.
async fn parallel(
    path: &std::path::Path,
    durability: Durability,
    sessions: usize,
    per_session: usize,
) -> Result<Summary> {
    let store = Arc::new(open(path, durability)?);
    let before = counters(&store);
    let started = Instant::now();
    let tasks: Vec<_> = (0..sessions)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                step_session(store.as_ref(), &format!("bench-par-{i}"), per_session, false)
                    .await
                    .map(|(run, _)| run)
            })
        })
        .collect();
    let mut runs = Vec::new();
    for task in tasks {
        runs.push(task.await??);
    }
    let wall = started.elapsed();
    let counted = since(&store, &before);
    let title = format!("{sessions} sessions x {per_session} steps, parallel tasks");
    Ok(report(&title, &store, &runs, wall, &counted))
}

/// One session stepped sequentially, then a cold load of it.
async fn sequential(path: &std::path::Path, durability: Durability, steps: usize) -> Result<Summary> {
    let store = open(path, durability)?;
    let before = counters(&store);
    let started = Instant::now();
    let (run, driver) = step_session(&store, "bench-seq", steps, true).await?;
    let wall = started.elapsed();
    let counted = since(&store, &before);
    let summary = report(&format!("1 session, {steps} sequential steps"), &store, &[run], wall, &counted);
    let snapshot = serde_json::to_string(&driver.session)?.len();
    println!("  head snapshot     {snapshot} B at the end ({} messages)", driver.session.tree().len());
    let mut loads = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        store.load("bench-seq").await?;
        loads.push(started.elapsed());
    }
    loads.sort();
    println!(
        "  load (cold host)  p50 {:.3} ms for {} messages",
        percentile(&loads, 50).as_secs_f64() * 1e3,
        driver.session.tree().len()
    );
    Ok(summary)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let steps = match args.next() {
        Some(arg) => arg.parse()?,
        None => 1000,
    };
    let levels = match args.next().as_deref() {
        None => vec![Durability::Full, Durability::Process],
        Some("full") => vec![Durability::Full],
        Some("process") => vec![Durability::Process],
        Some(other) => return Err(format!("unknown durability {other:?}: full or process").into()),
    };
    let dir = tempfile::tempdir()?;
    let mut summaries = Vec::new();
    for durability in levels {
        let seq = dir.path().join(format!("sequential-{durability}.db"));
        summaries.push(sequential(&seq, durability, steps).await?);
        for (sessions, per_session) in [(16, 100), (50, 100), (1000, 10)] {
            let path = dir.path().join(format!("parallel-{sessions}-{durability}.db"));
            summaries.push(parallel(&path, durability, sessions, per_session).await?);
        }
    }
    println!("== summary");
    println!("  durability  sessions  commits/s   p50 ms   p99 ms  commits/group  fsyncs/commit");
    for s in &summaries {
        println!(
            "  {:<10}  {:>8}  {:>9.0}  {:>7.3}  {:>7.3}  {:>13.2}  {:>13.3}",
            s.durability.name(),
            s.sessions,
            s.commits_per_s,
            s.p50_ms,
            s.p99_ms,
            s.commits_per_group,
            s.syncs_per_commit
        );
    }
    println!("== process");
    println!(
        "  memory            rss {} KiB, peak {} KiB",
        proc_value("/proc/self/status", "VmRSS"),
        proc_value("/proc/self/status", "VmHWM")
    );
    Ok(())
}

//! Benchmark of the local host (DESIGN.md section 12): the wiring of `turnstone serve` (SQLite
//! store, in-process queue, dispatcher workers, the demo config's agent `demo` on the built-in
//! `scripted` model, no worker), driven by concurrent clients that each run turns one after
//! another. A program that prints figures, never a test.
//!
//! ```text
//! cargo run --release -p turnstone --example bench -- \
//!     [--sessions 1,50,1000] [--turns 300,20,5] [--mode both|inproc|http] [--workers 8] [--sizes]
//! ```
//!
//! Each concurrency level (`--sessions`) runs `--turns` turns per session (one value for all
//! levels or one per level), in two modes: `inproc` calls `App::submit` and waits for the turn
//! to end, with the dispatcher workers running the sessions; `http` serves the real router on
//! 127.0.0.1 (`turnstone_runtime::host::serve`) and drives it with a keep-alive reqwest client
//! (`POST …/inputs`, then `GET …/turns/{id}?wait=30`). Every run gets a fresh data directory.
//!
//! The instruments are decorators, so the host runs unchanged: a `Store` that counts and times
//! loads and commits (a **step** is one successful commit), and a `ModelProvider` that times
//! the model so its time can be taken out of the step. Each client's message starts with its
//! session id, which is how a model call is attributed to its session.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

// A model provider timed, shared with `long_session`.
#[path = "support/timed_model.rs"]
mod timed_model;

use anyhow::{Context, bail};
use async_trait::async_trait;
use clap::{Parser, ValueEnum};
use tokio::sync::watch;
use turnstone_embedded::sqlite::SqliteOptions;
use turnstone_embedded::{Durability, MemoryQueue, SqliteStore, StoreStats};
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DraftMessage, LlmRequest, Role};
use turnstone_engine::session::{Event, TurnStatus};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::api::{ApiError, Placement, Submitted, Turn};
use turnstone_runtime::app::App;
use turnstone_runtime::assemble::{self, Topology};
use turnstone_runtime::auth::Caller;
use turnstone_runtime::clock::SystemClock;
use turnstone_runtime::config::Config;
use turnstone_runtime::pool::Pool;
// The binary's allocator (declared in its library), so the host is measured as it runs.
use timed_model::{OnAnswer, TimedProvider};
use turnstone as _;
use turnstone_runtime::store::{
    Commit, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};

/// The demo config's engine-hosted agent.
const AGENT: &str = "demo";

/// How long an HTTP client long-polls a turn per request.
const TURN_WAIT_SECS: u32 = 30;

/// A turn that takes longer than this fails the run (the engine hangs, or the host is far
/// slower than it should be).
const TURN_DEADLINE: Duration = Duration::from_secs(120);

#[derive(Debug, Parser)]
#[command(about = "Benchmarks the local host with the scripted model (steps/s, latency, bytes, memory).")]
struct Args {
    /// Concurrency levels: how many sessions run at once, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 50, 1000])]
    sessions: Vec<usize>,
    /// Turns per session, one after another: one value for every level, or one per level.
    #[arg(long, value_delimiter = ',', default_values_t = [300, 20, 5])]
    turns: Vec<usize>,
    /// Which modes to run.
    #[arg(long, value_enum, default_value_t = Modes::Both)]
    mode: Modes,
    /// Durability levels of the SQLite store to run each level at (`[server] durability`).
    #[arg(long, value_delimiter = ',', default_values_t = [DurabilityArg::Full, DurabilityArg::Process])]
    durability: Vec<DurabilityArg>,
    /// Dispatcher workers (as `turnstone serve --workers`).
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Instead of turns: what `N` waiting clients cost the host. N sessions each get a turn that
    /// waits (for a client tool), then a child process opens N long-polls (`?wait=60`) and N
    /// event streams on them, and the host's RSS is read before and while they wait.
    #[arg(long)]
    waiters: Option<usize>,
    /// Internal: run as the waiting clients' process against this base URL.
    #[arg(long, hide = true)]
    waiting_clients: Option<String>,
    /// Also serialize every commit to split its bytes into head, events and messages (costs CPU,
    /// which lowers throughput; its time is taken out of the step figures).
    #[arg(long)]
    sizes: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DurabilityArg {
    /// fsync before a commit returns (power-loss durable), the default.
    Full,
    /// Survives a killed process, not a power loss.
    Process,
}

impl std::fmt::Display for DurabilityArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.level().name())
    }
}

impl DurabilityArg {
    fn level(self) -> Durability {
        match self {
            DurabilityArg::Full => Durability::Full,
            DurabilityArg::Process => Durability::Process,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Modes {
    /// `App::submit` and the dispatcher, no HTTP.
    Inproc,
    /// The HTTP API on loopback.
    Http,
    /// Both, in-process first.
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Inproc,
    Http,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Inproc => "inproc",
            Mode::Http => "http",
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere only loses samples; the data is still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Instruments
// ---------------------------------------------------------------------------------------------

/// What the instruments know of one session.
struct SessionProbe {
    /// When the current step started: the end of the session's last commit, or the submit.
    mark: Instant,
    /// Time inside the current step that is not the engine's (the model, `--sizes`).
    excluded: Duration,
    /// When the session's latest load started (in-process: the dispatcher's or an
    /// `App::execute`'s; over HTTP also a long-poll's).
    last_load: Option<Instant>,
    /// Turns ended so far (the in-process clients wait on it).
    ended: watch::Sender<u64>,
}

/// One successful commit.
struct StepSample {
    /// How many turns of its session had ended before it.
    turn: u32,
    /// From the previous commit of the session (or the submit) to the end of this one, model
    /// time excluded.
    step: Duration,
    /// From the start of the load it started from (if any since the step began) to its end.
    execute: Duration,
    /// The `Store::commit` call.
    commit: Duration,
    /// Payload bytes by the store's counters (exact only while one commit runs at a time).
    payload: u64,
    /// `(head, events, messages)` bytes, with `--sizes`.
    sizes: Option<(u64, u64, u64)>,
}

#[derive(Default)]
struct Samples {
    steps: Vec<StepSample>,
    /// `(turn, load time)`.
    loads: Vec<(u32, Duration)>,
    /// Submit to turn end, as the client sees it.
    turns: Vec<Duration>,
    /// The submit call (in-process) or the `POST …/inputs` round trip (HTTP).
    submits: Vec<Duration>,
    /// Model calls.
    model: Vec<Duration>,
    /// Turns that ended other than completed.
    failed_turns: u64,
}

#[derive(Default)]
struct Probe {
    sessions: Mutex<HashMap<String, SessionProbe>>,
    samples: Mutex<Samples>,
    /// Events in successful commits.
    events: AtomicU64,
}

impl Probe {
    /// Starts following a session; the receiver counts its ended turns.
    fn register(&self, session_id: &str) -> watch::Receiver<u64> {
        let (ended, rx) = watch::channel(0);
        let probe = SessionProbe { mark: Instant::now(), excluded: Duration::ZERO, last_load: None, ended };
        lock(&self.sessions).insert(session_id.to_owned(), probe);
        rx
    }

    /// A client is about to submit: a step starts now.
    fn mark(&self, session_id: &str) {
        if let Some(s) = lock(&self.sessions).get_mut(session_id) {
            s.mark = Instant::now();
            s.excluded = Duration::ZERO;
        }
    }

    fn exclude(&self, session_id: &str, took: Duration) {
        if let Some(s) = lock(&self.sessions).get_mut(session_id) {
            s.excluded += took;
        }
    }

    fn loaded(&self, session_id: &str, started: Instant, took: Duration) {
        let turn = {
            let mut sessions = lock(&self.sessions);
            let Some(s) = sessions.get_mut(session_id) else { return };
            s.last_load = Some(started);
            *s.ended.borrow() as u32
        };
        lock(&self.samples).loads.push((turn, took));
    }

    fn committed(
        &self,
        session_id: &str,
        events: &[Event],
        commit: Duration,
        payload: u64,
        sizes: CommitSizes,
    ) {
        let now = Instant::now();
        let (turn, step, execute, failed) = {
            let mut sessions = lock(&self.sessions);
            let Some(s) = sessions.get_mut(session_id) else { return };
            let step = now.saturating_duration_since(s.mark).saturating_sub(s.excluded + sizes.took);
            // Since the load this commit's handling started from, or, when it started from a
            // state the host already held (no load since the step began), the step itself.
            let execute = match s.last_load {
                Some(load) if load > s.mark => now.saturating_duration_since(load).saturating_sub(sizes.took),
                _ => step,
            };
            s.mark = now;
            s.excluded = Duration::ZERO;
            let turn = *s.ended.borrow() as u32;
            let mut ended = 0;
            let mut failed = 0;
            for event in events {
                if let Event::TurnEnded { status, .. } = event {
                    ended += 1;
                    failed += u64::from(*status != TurnStatus::Completed);
                }
            }
            if ended > 0 {
                s.ended.send_modify(|n| *n += ended);
            }
            (turn, step, execute, failed)
        };
        let mut samples = lock(&self.samples);
        samples.failed_turns += failed;
        samples.steps.push(StepSample { turn, step, execute, commit, payload, sizes: sizes.bytes });
    }

    fn model(&self, session_id: Option<&str>, took: Duration) {
        if let Some(id) = session_id {
            self.exclude(id, took);
        }
        lock(&self.samples).model.push(took);
    }

    fn turn(&self, submit: Duration, turn: Duration) {
        let mut samples = lock(&self.samples);
        samples.submits.push(submit);
        samples.turns.push(turn);
    }
}

/// What `--sizes` measured of one commit.
#[derive(Default)]
struct CommitSizes {
    bytes: Option<(u64, u64, u64)>,
    took: Duration,
}

/// Counts the bytes serialized into it.
#[derive(Default)]
struct ByteCount(u64);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The bytes `write` serializes.
fn counted(write: impl FnOnce(&mut ByteCount) -> serde_json::Result<()>) -> u64 {
    let mut count = ByteCount::default();
    // Serializing engine types into a counter does not fail; a failure would only count less.
    let _ = write(&mut count);
    count.0
}

/// `(head, events, messages)` JSON bytes of a commit, as the SQLite store serializes them.
fn commit_sizes(commit: &Commit<'_>) -> CommitSizes {
    let started = Instant::now();
    let head = counted(|w| serde_json::to_writer(w, commit.session));
    let events =
        commit.events.iter().map(|e| counted(|w| serde_json::to_writer(w, e)) + e.name().len() as u64).sum();
    let messages =
        commit.new_messages().iter().map(|(_, node)| counted(|w| serde_json::to_writer(w, node))).sum();
    CommitSizes { bytes: Some((head, events, messages)), took: started.elapsed() }
}

/// The SQLite store, counting and timing what the host asks of it.
struct CountingStore {
    inner: SqliteStore,
    probe: Arc<Probe>,
    sizes: bool,
}

#[async_trait]
impl Store for CountingStore {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        let started = Instant::now();
        let loaded = self.inner.load(session_id).await;
        self.probe.loaded(session_id, started, started.elapsed());
        loaded
    }

    async fn load_since(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Option<(Loaded, Vec<turnstone_engine::protocol::TreeNode>)>, StoreError> {
        let started = Instant::now();
        let loaded = self.inner.load_since(session_id, from).await;
        self.probe.loaded(session_id, started, started.elapsed());
        loaded
    }

    async fn used_ids(
        &self,
        session_id: &str,
        ids: &[turnstone_engine::session::UsedId],
    ) -> Result<Vec<turnstone_engine::session::UsedId>, StoreError> {
        self.inner.used_ids(session_id, ids).await
    }

    async fn commit(
        &self,
        session_id: &str,
        expected_version: u64,
        commit: Commit<'_>,
    ) -> Result<u64, StoreError> {
        let sizes = if self.sizes { commit_sizes(&commit) } else { CommitSizes::default() };
        let events = commit.events;
        let before = self.inner.stats().payload_bytes;
        let started = Instant::now();
        let result = self.inner.commit(session_id, expected_version, commit).await;
        let took = started.elapsed();
        if result.is_ok() {
            self.probe.events.fetch_add(events.len() as u64, Ordering::Relaxed);
            let payload = self.inner.stats().payload_bytes.saturating_sub(before);
            self.probe.committed(session_id, events, took, payload, sizes);
        }
        result
    }

    async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        self.inner.events_after(session_id, after_seq, limit).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        self.inner.list_sessions(filter, cursor, limit).await
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.due(now, limit).await
    }

    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError> {
        self.inner.dispose(session_id).await
    }

    fn exclusive(&self) -> bool {
        self.inner.exclusive()
    }
}

/// The session a bench request belongs to: the first word of its last user message.
fn session_of(request: &LlmRequest) -> Option<String> {
    let text = request.messages.iter().rev().find(|m| m.role == Role::User)?.content_text();
    text.split_whitespace().next().map(str::to_owned)
}

// ---------------------------------------------------------------------------------------------
// Process figures
// ---------------------------------------------------------------------------------------------

/// `/proc/self/io`: bytes through read/write syscalls, and bytes dirtied for the disk.
#[derive(Debug, Clone, Copy, Default)]
struct ProcIo {
    rchar: u64,
    wchar: u64,
    write_bytes: u64,
}

fn proc_io() -> ProcIo {
    let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok()).unwrap_or(0)
    };
    ProcIo { rchar: field("rchar"), wchar: field("wchar"), write_bytes: field("write_bytes") }
}

/// A `kB` field of `/proc/self/status` (e.g. `VmRSS`), in bytes.
fn status_kb(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

fn rss() -> u64 {
    status_kb("VmRSS")
}

/// The process's user + system CPU time so far (/proc/self/stat, in clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which may hold spaces) start after its closing ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

// ---------------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------------

fn input(session_id: &str, n: usize) -> ClientInput {
    ClientInput::Message(ClientMessageInput {
        agent_id: AGENT.to_owned(),
        turn_id: None,
        // The first word names the session (see `session_of`).
        message: DraftMessage::user(format!("{session_id} question {n}: what do you make of it?")),
        stream: None,
        client: None,
    })
}

/// Runs `turns` turns one after another through `App::submit`, each waited for to its end.
async fn inproc_client(
    app: Arc<App>,
    probe: Arc<Probe>,
    session_id: String,
    mut ended: watch::Receiver<u64>,
    turns: usize,
) -> anyhow::Result<()> {
    for n in 0..turns {
        probe.mark(&session_id);
        let started = Instant::now();
        let submitted = app
            .submit(&session_id, input(&session_id, n), Placement::Start, &Caller::Anyone)
            .await
            .with_context(|| format!("submitting turn {n} of {session_id}"))?;
        let submit = started.elapsed();
        if submitted.turn_id.is_none() || submitted.queued {
            bail!("turn {n} of {session_id} did not start: {submitted:?}");
        }
        tokio::time::timeout(TURN_DEADLINE, ended.wait_for(|k| *k > n as u64))
            .await
            .map_err(anyhow::Error::from)
            .and_then(|r| r.map(drop).map_err(anyhow::Error::from))
            .with_context(|| format!("waiting for turn {n} of {session_id}"))?;
        probe.turn(submit, started.elapsed());
    }
    Ok(())
}

/// Runs `turns` turns one after another through the HTTP API: `POST …/inputs`, then long-polls
/// `GET …/turns/{turn_id}?wait=…` until the turn has ended.
async fn http_client(
    http: reqwest::Client,
    base: String,
    probe: Arc<Probe>,
    session_id: String,
    turns: usize,
) -> anyhow::Result<()> {
    let inputs = format!("{base}/v1/sessions/{session_id}/inputs");
    for n in 0..turns {
        let body = serde_json::to_vec(&input(&session_id, n))?;
        probe.mark(&session_id);
        let started = Instant::now();
        let response = http
            .post(&inputs)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .with_context(|| format!("POST {inputs}"))?;
        let status = response.status();
        let answer = response.bytes().await.with_context(|| format!("POST {inputs}: answer"))?;
        let submit = started.elapsed();
        if status != reqwest::StatusCode::ACCEPTED {
            bail!("POST {inputs}: {}", ApiError::from_answer(status, &answer));
        }
        let submitted: Submitted =
            serde_json::from_slice(&answer).with_context(|| format!("POST {inputs}"))?;
        let turn_id = submitted.turn_id.with_context(|| format!("POST {inputs}: no turn_id"))?;
        let url = format!("{base}/v1/sessions/{session_id}/turns/{turn_id}?wait={TURN_WAIT_SECS}");
        loop {
            if started.elapsed() > TURN_DEADLINE {
                bail!("turn {n} of {session_id} did not end within {TURN_DEADLINE:?}");
            }
            let response = http.get(&url).send().await.with_context(|| format!("GET {url}"))?;
            let status = response.status();
            let answer = response.bytes().await.with_context(|| format!("GET {url}: answer"))?;
            if !status.is_success() {
                bail!("GET {url}: {}", ApiError::from_answer(status, &answer));
            }
            let turn: Turn = serde_json::from_slice(&answer).with_context(|| format!("GET {url}"))?;
            if turn.status.is_ended() {
                break;
            }
        }
        probe.turn(submit, started.elapsed());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A run
// ---------------------------------------------------------------------------------------------

/// Everything one run measured.
struct Report {
    mode: Mode,
    durability: Durability,
    /// Transactions the store made (one fsync each at `full`).
    groups: u64,
    /// Events the store wrote.
    events: u64,
    /// CPU time of the whole process (host and clients) during the run.
    cpu: Duration,
    /// Session snapshots serialized during the run (the engine's count).
    snapshots: u64,
    sessions: usize,
    turns_per_session: usize,
    wall: Duration,
    samples: Samples,
    stats: StoreStats,
    io: ProcIo,
    db_bytes: u64,
    rss_before: u64,
    rss_after: u64,
    rss_peak: u64,
}

async fn run(
    mode: Mode,
    durability: Durability,
    sessions: usize,
    turns: usize,
    args: &Args,
) -> anyhow::Result<Report> {
    let dir = tempfile::Builder::new().prefix("turnstone-bench-").tempdir().context("creating a temp dir")?;
    let db = dir.path().join("turnstone.sqlite");
    let store = {
        let db = db.clone();
        let options = SqliteOptions { durability, ..SqliteOptions::default() };
        tokio::task::spawn_blocking(move || SqliteStore::open_with(&db, options, Arc::new(SystemClock)))
            .await??
    };
    let probe = Arc::new(Probe::default());
    let config = Config::demo()?;
    let secrets = config.resolve_secrets(|_| None)?;
    let mut agents = assemble::agents(&config, &secrets)?;
    for agent in agents.values_mut() {
        if let Some(inner) = agent.provider.take() {
            let probe = Arc::clone(&probe);
            let on_answer: OnAnswer =
                Arc::new(move |request, took| probe.model(session_of(request).as_deref(), took));
            agent.provider = Some(Arc::new(TimedProvider { inner, on_answer }));
        }
    }
    let counting = CountingStore { inner: store.clone(), probe: Arc::clone(&probe), sizes: args.sizes };
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(60)));
    let engine = assemble::engine(&config, agents, Arc::new(counting), queue.clone(), Topology::OneProcess)
        .context("building the worker HTTP client")?;
    let app = Arc::clone(&engine.app);
    let ids: Vec<String> = (0..sessions).map(|i| format!("s{i:04}")).collect();
    let receivers: Vec<_> = ids.iter().map(|id| probe.register(id)).collect();

    // The server (HTTP mode) or the dispatcher workers (in-process).
    let mut pool = None;
    let mut server = None;
    let mut base = String::new();
    match mode {
        Mode::Inproc => pool = Some(Pool::spawn(Arc::clone(&engine.dispatcher), queue, args.workers)),
        Mode::Http => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            base = format!("http://{}", listener.local_addr()?);
            let http = assemble::http(&config, &secrets);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let shutdown = async move {
                let _ = stopped.await;
            };
            let serving = tokio::spawn(turnstone_runtime::host::serve(
                engine,
                queue,
                http,
                listener,
                args.workers,
                shutdown,
            ));
            server = Some((stop, serving));
        }
    }
    let http = turnstone_runtime::net::client_builder()
        .pool_max_idle_per_host(usize::MAX)
        .timeout(Duration::from_secs(u64::from(TURN_WAIT_SECS) + 30))
        .build()?;

    // Memory, sampled while the clients run.
    let rss_before = rss();
    let peak = Arc::new(AtomicU64::new(rss_before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(rss(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let stats_before = store.stats();
    let groups_before = store.group_stats();
    let events_before = probe.events.load(Ordering::Relaxed);
    let cpu_before = cpu_time();
    let snapshots_before = turnstone_engine::session::snapshot_serializations();
    let io_before = proc_io();

    let started = Instant::now();
    let clients: Vec<_> = ids
        .iter()
        .cloned()
        .zip(receivers)
        .map(|(id, ended)| match mode {
            Mode::Inproc => {
                tokio::spawn(inproc_client(Arc::clone(&app), Arc::clone(&probe), id, ended, turns))
            }
            Mode::Http => {
                tokio::spawn(http_client(http.clone(), base.clone(), Arc::clone(&probe), id, turns))
            }
        })
        .collect();
    let mut failure = None;
    for client in clients {
        if let Err(e) = client.await.map_err(anyhow::Error::from).and_then(|r| r) {
            failure.get_or_insert(e);
        }
    }
    let wall = started.elapsed();

    let io_after = proc_io();
    let cpu = cpu_time().saturating_sub(cpu_before);
    let snapshots = turnstone_engine::session::snapshot_serializations() - snapshots_before;
    let stats_after = store.stats();
    let groups = store.group_stats().groups - groups_before.groups;
    let events = probe.events.load(Ordering::Relaxed) - events_before;
    let rss_after = rss();
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;
    let rss_peak = peak.load(Ordering::Relaxed).max(rss_after);

    // Tear down: stop the host, then let the workers drain.
    match server {
        Some((stop, serving)) => {
            let _ = stop.send(());
            serving.await??;
        }
        None => {
            if let Some(pool) = pool {
                pool.shutdown().await;
            }
        }
    }
    if let Some(e) = failure {
        return Err(e.context(format!("{} run with {sessions} sessions", mode.name())));
    }
    let db_bytes = file_len(&db) + file_len(&db.with_extension("sqlite-wal"));
    let samples = std::mem::take(&mut *lock(&probe.samples));
    drop(app);
    drop(store);
    dir.close().context("removing the temp dir")?;
    Ok(Report {
        mode,
        durability,
        groups,
        events,
        cpu,
        snapshots,
        sessions,
        turns_per_session: turns,
        wall,
        samples,
        stats: StoreStats {
            commits: stats_after.commits - stats_before.commits,
            conflicts: stats_after.conflicts - stats_before.conflicts,
            payload_bytes: stats_after.payload_bytes - stats_before.payload_bytes,
        },
        io: ProcIo {
            rchar: io_after.rchar.saturating_sub(io_before.rchar),
            wchar: io_after.wchar.saturating_sub(io_before.wchar),
            write_bytes: io_after.write_bytes.saturating_sub(io_before.write_bytes),
        },
        db_bytes,
        rss_before,
        rss_after,
        rss_peak,
    })
}

// ---------------------------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------------------------

/// p50, p99 and max of durations.
#[derive(Debug, Clone, Copy, Default)]
struct Spread {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn spread(mut values: Vec<Duration>) -> Spread {
    if values.is_empty() {
        return Spread::default();
    }
    values.sort_unstable();
    let at = |p: f64| {
        let rank = (p * values.len() as f64).ceil() as usize;
        values[rank.clamp(1, values.len()) - 1]
    };
    Spread { p50: at(0.50), p99: at(0.99), max: values[values.len() - 1] }
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.3}")
    } else if ms < 1000.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}

fn spread3(s: Spread) -> String {
    format!("{}/{}/{}", ms(s.p50), ms(s.p99), ms(s.max))
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

fn per(total: u64, n: u64) -> String {
    if n == 0 { "-".to_owned() } else { format!("{:.0}", total as f64 / n as f64) }
}

impl Report {
    fn steps(&self) -> u64 {
        self.samples.steps.len() as u64
    }

    fn turns(&self) -> u64 {
        self.samples.turns.len() as u64
    }

    fn label(&self) -> String {
        let level = match self.durability {
            Durability::Full => "full",
            Durability::Process => "proc",
        };
        format!("{:<4} {level} {:>4} x {:<4}", self.mode.name(), self.sessions, self.turns_per_session)
    }
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim().to_owned()))
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or_else(|| "?".to_owned(), |kb| format!("{:.1} GiB", kb as f64 / (1024.0 * 1024.0)));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let build = if cfg!(debug_assertions) {
        "DEBUG build: figures are not meaningful, use --release"
    } else {
        "release"
    };
    format!("machine: {cores} cores ({model}), {mem} RAM, Linux {}, {build}", kernel.trim())
}

fn print_tables(reports: &[Report], args: &Args) {
    let mut out = String::new();
    let _ = writeln!(out, "\nThroughput");
    let _ = writeln!(
        out,
        "{:<19} {:>7} {:>7} {:>8} {:>9} {:>8} {:>10} {:>10} {:>9}",
        "run (sess x turns)",
        "turns",
        "steps",
        "wall s",
        "steps/s",
        "turns/s",
        "steps/turn",
        "loads/step",
        "conflicts"
    );
    for r in reports {
        let wall = r.wall.as_secs_f64();
        let loads = r.samples.loads.len() as f64 / r.steps().max(1) as f64;
        let _ = writeln!(
            out,
            "{:<19} {:>7} {:>7} {:>8.2} {:>9.0} {:>8.0} {:>10.2} {:>10.2} {:>9}",
            r.label(),
            r.turns(),
            r.steps(),
            wall,
            r.steps() as f64 / wall,
            r.turns() as f64 / wall,
            r.steps() as f64 / r.turns().max(1) as f64,
            loads,
            r.stats.conflicts,
        );
    }

    let _ = writeln!(out, "\nDurability and cost per turn (CPU: the whole process, host and clients)");
    let _ = writeln!(
        out,
        "{:<19} {:>10} {:>10} {:>11} {:>11} {:>11} {:>12}",
        "run (sess x turns)",
        "fsyncs/turn",
        "commits/tx",
        "events/turn",
        "bytes/turn",
        "snaps/turn",
        "CPU ms/turn"
    );
    for r in reports {
        let turns = r.turns().max(1) as f64;
        let fsyncs = if r.durability == Durability::Full { r.groups as f64 / turns } else { 0.0 };
        let _ = writeln!(
            out,
            "{:<19} {:>10.3} {:>10.1} {:>11.1} {:>11.0} {:>11.1} {:>12.3}",
            r.label(),
            fsyncs,
            r.stats.commits as f64 / r.groups.max(1) as f64,
            r.events as f64 / turns,
            r.stats.payload_bytes as f64 / turns,
            r.snapshots as f64 / turns,
            r.cpu.as_secs_f64() * 1000.0 / turns,
        );
    }
    let _ = writeln!(out, "\nLatency, ms, p50/p99/max");
    let _ = writeln!(
        out,
        "{:<19} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
        "run (sess x turns)",
        "step (excl. model)",
        "execute",
        "store commit",
        "store load",
        "submit",
        "turn (submit->end)"
    );
    for r in reports {
        let s = &r.samples;
        let _ = writeln!(
            out,
            "{:<19} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
            r.label(),
            spread3(spread(s.steps.iter().map(|x| x.step).collect())),
            spread3(spread(s.steps.iter().map(|x| x.execute).collect())),
            spread3(spread(s.steps.iter().map(|x| x.commit).collect())),
            spread3(spread(s.loads.iter().map(|x| x.1).collect())),
            spread3(spread(s.submits.clone())),
            spread3(spread(s.turns.clone())),
        );
    }
    let model: Vec<Duration> = reports.iter().flat_map(|r| r.samples.model.iter().copied()).collect();
    let model_calls = model.len();
    let model = spread(model);
    let _ = writeln!(
        out,
        "(model: {model_calls} scripted calls, p50/p99/max {} ms, taken out of the step figures)",
        spread3(model)
    );

    let _ = writeln!(out, "\nBytes per step and memory");
    let _ = writeln!(
        out,
        "{:<19} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11}",
        "run (sess x turns)", "payload", "wchar", "disk", "rchar", "db B", "db MiB", "RSS MiB", "RSS +MiB"
    );
    for r in reports {
        let n = r.steps();
        let _ = writeln!(
            out,
            "{:<19} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11}",
            r.label(),
            per(r.stats.payload_bytes, n),
            per(r.io.wchar, n),
            per(r.io.write_bytes, n),
            per(r.io.rchar, n),
            per(r.db_bytes, n),
            mib(r.db_bytes),
            format!("{}->{}", mib(r.rss_before), mib(r.rss_after)),
            format!("{:+.1} pk", (r.rss_peak as f64 - r.rss_before as f64) / (1024.0 * 1024.0)),
        );
    }

    if args.sizes {
        let _ = writeln!(out, "\nCommit payload split (--sizes), bytes per step");
        let _ = writeln!(out, "{:<19} {:>9} {:>9} {:>9}", "run (sess x turns)", "head", "events", "messages");
        for r in reports {
            let n = r.steps();
            let sum = |f: fn(&(u64, u64, u64)) -> u64| {
                r.samples.steps.iter().filter_map(|s| s.sizes.as_ref()).map(f).sum::<u64>()
            };
            let _ = writeln!(
                out,
                "{:<19} {:>9} {:>9} {:>9}",
                r.label(),
                per(sum(|s| s.0), n),
                per(sum(|s| s.1), n),
                per(sum(|s| s.2), n)
            );
        }
    }

    // How the cost of a step moves as a session grows (single-session runs: the payload figures
    // are exact only when one commit runs at a time).
    let single: Vec<&Report> =
        reports.iter().filter(|r| r.sessions == 1 && r.turns_per_session >= 10).collect();
    if !single.is_empty() {
        let _ =
            writeln!(out, "\nGrowth within one session: first tenth of its turns vs last tenth (p50s in ms)");
        let _ = writeln!(
            out,
            "{:<19} {:>17} {:>17} {:>17} {:>17} {:>19} {:>17}",
            "run (sess x turns)",
            "step",
            "execute",
            "store load",
            "store commit",
            "payload B/step",
            if args.sizes { "head B/step" } else { "" }
        );
        for r in &single {
            let tenth = (r.turns_per_session / 10).max(1) as u32;
            let last = r.turns_per_session as u32 - tenth;
            let first_steps: Vec<&StepSample> = r.samples.steps.iter().filter(|s| s.turn < tenth).collect();
            let last_steps: Vec<&StepSample> = r.samples.steps.iter().filter(|s| s.turn >= last).collect();
            let p50 = |v: &[&StepSample], f: fn(&StepSample) -> Duration| {
                ms(spread(v.iter().map(|s| f(s)).collect()).p50)
            };
            let loads = |keep: &dyn Fn(u32) -> bool| {
                ms(spread(r.samples.loads.iter().filter(|l| keep(l.0)).map(|l| l.1).collect()).p50)
            };
            let mean = |v: &[&StepSample], f: fn(&StepSample) -> Option<u64>| {
                let vals: Vec<u64> = v.iter().filter_map(|s| f(s)).collect();
                per(vals.iter().sum(), vals.len() as u64)
            };
            let pair = |a: String, b: String| format!("{a} -> {b}");
            let _ = writeln!(
                out,
                "{:<19} {:>17} {:>17} {:>17} {:>17} {:>19} {:>17}",
                r.label(),
                pair(p50(&first_steps, |s| s.step), p50(&last_steps, |s| s.step)),
                pair(p50(&first_steps, |s| s.execute), p50(&last_steps, |s| s.execute)),
                pair(loads(&|t| t < tenth), loads(&|t| t >= last)),
                pair(p50(&first_steps, |s| s.commit), p50(&last_steps, |s| s.commit)),
                pair(mean(&first_steps, |s| Some(s.payload)), mean(&last_steps, |s| Some(s.payload))),
                if args.sizes {
                    pair(
                        mean(&first_steps, |s| s.sizes.map(|z| z.0)),
                        mean(&last_steps, |s| s.sizes.map(|z| z.0)),
                    )
                } else {
                    String::new()
                },
            );
        }
    }
    // Per-step time at given turns of one session (the median over the ten turns around each).
    let marks: Vec<u32> = [1u32, 100, 1000, 10_000]
        .into_iter()
        .filter(|&m| single.iter().any(|r| r.turns_per_session as u32 >= m))
        .collect();
    if !marks.is_empty() {
        let _ =
            writeln!(out, "\nPer-step time at turn N of one session (p50 ms of the steps of turns N-9..N)");
        let mut header = format!("{:<19}", "run (sess x turns)");
        for m in &marks {
            let _ = write!(header, " {:>14}", format!("turn {m}"));
        }
        let _ = writeln!(out, "{header}");
        for r in &single {
            let mut line = format!("{:<19}", r.label());
            for &m in &marks {
                let (from, to) = (m.saturating_sub(10), m);
                let steps: Vec<Duration> = r
                    .samples
                    .steps
                    .iter()
                    .filter(|s| s.turn >= from && s.turn < to)
                    .map(|s| s.step)
                    .collect();
                let cell = if steps.is_empty() { "-".to_owned() } else { ms(spread(steps).p50) };
                let _ = write!(line, " {cell:>14}");
            }
            let _ = writeln!(out, "{line}");
        }
    }
    for line in out.lines() {
        println!("{}", line.trim_end());
    }
}

const EXPLAIN: &str = "
What the figures are
  step        one successful Store::commit made for the session by the host (the submit's
              commit, each claim, each outcome); steps/s and turns/s count over the run's wall
              time, all sessions together. A turn of the demo agent on a plain message is
              `steps/turn` commits.
  loads/step  Store::load calls per commit (the dispatcher, App::execute and, over HTTP, the
              turn long-poll each load the whole session: head and every message).
  conflicts   commits refused with a version conflict (and retried).
  step (excl. model)
              engine overhead per step as the session sees it: from its previous commit (or from
              the client's submit) to the end of this commit, minus the model call's time. It
              holds the queue hand-off to a dispatcher worker, loads, the engine, the commit, and
              with many sessions the wait for a worker and for the single SQLite writer. Over
              HTTP the first step of a turn also holds the client's POST.
  execute     App::execute: from the start of the load the step began with to the end of its
              commit (load, handle, plan, commit); for a step that starts from the state the
              dispatcher already holds (no load), the step itself. Over HTTP a concurrent
              long-poll load can come later, so it may read low there.
  store commit / store load
              the Store calls alone (JSON serialization, waiting for the writer or a reader,
              the SQLite transaction).
  submit      App::submit in-process; the POST …/inputs round trip over HTTP.
  turn        from the submit to the turn's end as the client sees it (in-process: the commit
              with turn.ended; HTTP: the GET …/turns/{id}?wait= answer with the ended turn).
  snaps/turn  session snapshots serialized per turn, by the store's commits and anything else
              (the engine's count; shared/embedded/tests/turn_cost.rs holds a plain turn to 2).
  payload     JSON the store wrote per step: head snapshot + events + new messages (SqliteStore
              counters; --sizes splits it).
  wchar/rchar bytes through write()/read() syscalls of the whole process per step (/proc/self/io):
              in-process that is SQLite's WAL, checkpoints and reads; over HTTP it also holds
              both ends of the loopback traffic.
  disk        bytes the process dirtied for the disk per step (/proc/self/io write_bytes: WAL
              pages and checkpoints, page granular).
  db B        size of the database file and its WAL at the end, per step.
  RSS         resident memory (VmRSS) when the clients start -> when they finish, and the peak
              increase sampled every 20 ms during the run (the allocator keeps freed memory, so
              later runs start higher).
";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(base) = &args.waiting_clients {
        return waiting_clients(base, args.waiters.unwrap_or(0)).await;
    }
    if let Some(n) = args.waiters {
        return waiters(n).await;
    }
    if args.turns.len() != 1 && args.turns.len() != args.sessions.len() {
        bail!("--turns takes one value, or one per --sessions level");
    }
    let modes: &[Mode] = match args.mode {
        Modes::Inproc => &[Mode::Inproc],
        Modes::Http => &[Mode::Http],
        Modes::Both => &[Mode::Inproc, Mode::Http],
    };
    println!("{}", machine());
    println!(
        "host: `turnstone serve` wiring: SqliteStore (WAL; full = synchronous=FULL, group commit; proc = \
         synchronous=NORMAL) in a fresh temp dir per run, \
         MemoryQueue, {} dispatcher workers, tokio multi-thread runtime ({} threads) shared with the clients",
        args.workers,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "agent: `{AGENT}` from the demo config, scripted model, no worker; each session runs its turns one after another"
    );

    let mut reports = Vec::new();
    for (i, &sessions) in args.sessions.iter().enumerate() {
        let turns = args.turns.get(i).or_else(|| args.turns.first()).copied().unwrap_or(1);
        for (&mode, level) in modes.iter().flat_map(|m| args.durability.iter().map(move |d| (m, d.level()))) {
            let report = run(mode, level, sessions.max(1), turns.max(1), &args).await?;
            eprintln!(
                "  {}: {} steps, {} turns in {:.2} s",
                report.label(),
                report.steps(),
                report.turns(),
                report.wall.as_secs_f64()
            );
            if report.samples.failed_turns > 0 {
                eprintln!("  warning: {} turns did not complete", report.samples.failed_turns);
            }
            reports.push(report);
        }
    }
    print_tables(&reports, &args);
    print!("{EXPLAIN}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Waiting clients
// ---------------------------------------------------------------------------------------------

/// The session and turn ids of waiter `i`.
fn waiter_ids(i: usize) -> (String, String) {
    (format!("w{i:05}"), format!("turn-w{i:05}"))
}

/// Measures what `n` waiting clients cost the host: its RSS with the turns open and nobody
/// waiting, then while a separate process holds `n` long-polls and `n` event streams.
async fn waiters(n: usize) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("turnstone-waiters-").tempdir()?;
    let config = Config::demo()?;
    let secrets = config.resolve_secrets(|_| None)?;
    let (store, queue) = turnstone_embedded::open_local(&config, dir.path())?;
    let agents = assemble::agents(&config, &secrets)?;
    let queue = Arc::new(queue);
    let engine = assemble::engine(&config, agents, Arc::new(store), queue.clone(), Topology::OneProcess)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(turnstone_runtime::host::serve(
        engine,
        queue,
        assemble::http(&config, &secrets),
        listener,
        8,
        async move {
            let _ = stopped.await;
        },
    ));
    // Every session's turn waits for its client tool, for good.
    let http = turnstone_runtime::net::client()?;
    for i in 0..n {
        let (session, turn) = waiter_ids(i);
        let input = serde_json::json!({"type": "client.message", "agent_id": AGENT, "turn_id": turn,
            "message": {"role": "user", "content": "/tool confirm {\"question\": \"wait?\"}"}});
        let response = http.post(format!("{base}/v1/sessions/{session}/inputs")).json(&input).send().await?;
        if response.status() != reqwest::StatusCode::ACCEPTED {
            bail!("submit {session}: HTTP {}", response.status());
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = rss();
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .args(["--waiting-clients", &base, "--waiters", &n.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("the child's stdout")?).lines();
    use tokio::io::AsyncBufReadExt as _;
    while let Some(line) = lines.next_line().await? {
        if line == "ready" {
            break;
        }
    }
    // Let the host take every request in.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = rss();
    child.kill().await?;
    println!("{}", machine());
    println!(
        "{n} sessions with a waiting turn: host RSS {:.1} MiB; with {n} long-polls and {n} event streams \
         open on them (clients in another process): {:.1} MiB, +{:.1} MiB ({:.1} KiB per waiting client)",
        idle as f64 / 1048576.0,
        waiting as f64 / 1048576.0,
        waiting.saturating_sub(idle) as f64 / 1048576.0,
        waiting.saturating_sub(idle) as f64 / 1024.0 / (2 * n.max(1)) as f64
    );
    let _ = stop.send(());
    serving.await??;
    Ok(())
}

/// The waiting clients' process: `n` long-polls and `n` event streams, held until killed.
async fn waiting_clients(base: &str, n: usize) -> anyhow::Result<()> {
    let http = turnstone_runtime::net::client_builder().pool_max_idle_per_host(0).build()?;
    let mut held = Vec::new();
    for i in 0..n {
        let (session, turn) = waiter_ids(i);
        let poll = http.get(format!("{base}/v1/sessions/{session}/turns/{turn}?wait=60"));
        held.push(tokio::spawn(async move { poll.send().await.map(drop) }));
        let stream = http.get(format!("{base}/v1/sessions/{session}/events/stream")).send().await?;
        held.push(tokio::spawn(async move {
            let _stream = stream;
            std::future::pending::<reqwest::Result<()>>().await
        }));
    }
    println!("ready");
    std::future::pending::<()>().await;
    Ok(())
}

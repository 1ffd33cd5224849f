//! A session that lives long (issue 25): `--turns` turns of a worker's tool loop, the worker
//! keeping `--state-kb` KB of changing state in the session with every answer, then a wait of
//! `--wait-hours` for a person, on the local host's SQLite store and on the Lambda deployment
//! against moto. A program that prints figures, never a test.
//!
//! ```text
//! cargo run --release -p turnstone --example long_session -- \
//!     [--backends sqlite,dynamodb] [--turns 1000] [--state-kb 12] [--loop-steps 1] \
//!     [--at 1,100,1000] [--window 10] [--wait-hours 24] [--worker-messages N]
//! ```
//!
//! Each turn is a user message the worker answers with a tool loop of `--loop-steps` calls
//! (`aws_cost/worker.rs`): a model call, its `llm.finished` decision, the tool's `tool.execute`
//! and `tool.finished`, then the final model call; every decision's answer writes new state.
//! A **step** is one successful commit. For the windows of `--window` turns ending at each
//! `--at` turn, it prints per step: latency (the turn's wall time over its steps), and on
//! DynamoDB write and read units, requests and dollars per million steps (by `aws_cost`'s meter
//! and prices), and the head's size.
//!
//! - **SQLite**: the wiring of `turnstone serve` (a real SQLite file at `durability = "full"`,
//!   the in-process queue, two dispatcher workers), the worker a real HTTP server.
//! - **DynamoDB**: as `aws_cost` runs the Lambda deployment (an `api` engine per client input,
//!   a `dispatch` engine per SQS batch, warm containers) on a moto server this program starts
//!   with `scripts/moto_indexed` loaded: moto copies the whole table for each item of every
//!   transaction and sorts the whole table for every query, so its time per request grows with
//!   the table, which DynamoDB's does not; that module makes those two costs a real table's
//!   (the answers are moto's own). Latency on moto is still moto's, not DynamoDB's: the report
//!   gives how much of it was spent waiting for moto, and the engine's time beside it.
//!
//! The wait, on DynamoDB: the last turn asks for a client tool (a person's answer) with a
//! timeout of `--wait-hours`; the dispatcher schedules the wake-up with EventBridge Scheduler
//! (moto's), the functions' clock moves on by the wait, and the benchmark does what Scheduler
//! does with a due schedule (sends its input to the queue, deletes it). It prints the dispatch
//! invocations from the moment the session started waiting to the end of the turn. On SQLite a
//! wake-up is a timer of the process, which costs nothing while it waits.

// The functions on moto, the meter and the worker, shared with `aws_cost`.
#[path = "aws_cost/lambda.rs"]
mod lambda;
#[path = "aws_cost/meter.rs"]
mod meter;
#[path = "aws_cost/worker.rs"]
mod worker;
// A model provider timed, shared with `bench`.
#[path = "support/timed_model.rs"]
mod timed_model;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aws_sdk_dynamodb::config::Credentials;
use clap::{Parser, ValueEnum};
use serde_json::json;
use turnstone_aws::schedule::at_expression;
use turnstone_aws::{ManagementFrames, QueueSettings, Scheduler, SqsQueue, moto};
use turnstone_embedded::sqlite::SqliteOptions;
use turnstone_embedded::{Durability, MemoryQueue, SqliteStore};
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DecisionRequest, DraftMessage};
use turnstone_engine::session::TurnStatus;
use turnstone_engine::time::Timestamp;
use turnstone_runtime::api::Placement;
use turnstone_runtime::app::AgentRuntime;
use turnstone_runtime::assemble::{self, Topology};
use turnstone_runtime::auth::Caller;
use turnstone_runtime::clock::{Clock, SystemClock};
use turnstone_runtime::config::Config;
use turnstone_runtime::llm::ModelProvider;
use turnstone_runtime::pool::Pool;
use turnstone_runtime::queue::Queue;
use turnstone_tests::FakeWorker;
// The binary's allocator (declared in its library), so the host is measured as it runs.
use turnstone as _;

use lambda::{Bench, CountingStore, Invocations, POLL, Shared, TURN_DEADLINE};
use meter::{
    DYNAMODB_READ_UNIT, DYNAMODB_WRITE_UNIT, LAMBDA_GB_SECOND, LAMBDA_REQUEST, Meter, SQS_REQUEST, Tally,
};
use timed_model::{OnAnswer, TimedProvider};
use worker::{LOOP_MARK, catalog, toml_value, worker_script};

/// How far turn 1,000 may be from turn 1 (issue 25's goal), per step.
const TARGET_FLAT: f64 = 1.3;

#[derive(Debug, Parser)]
#[command(
    about = "Runs one long session (a worker tool loop with large state, then a day's wait) on SQLite and on DynamoDB (moto)."
)]
struct Args {
    /// Which stores.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["sqlite", "dynamodb"])]
    backends: Vec<Backend>,
    /// Turns of the session.
    #[arg(long, default_value_t = 1000)]
    turns: usize,
    /// KB of state the worker writes with every decision's answer, changed each time.
    #[arg(long, default_value_t = 12)]
    state_kb: usize,
    /// Tool calls of each turn's loop.
    #[arg(long, default_value_t = 1)]
    loop_steps: usize,
    /// The turns reported: each with the `--window` turns that end at it (from turn 1 for the
    /// first ones).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 100, 1000])]
    at: Vec<usize>,
    #[arg(long, default_value_t = 10)]
    window: usize,
    /// The wait for a person after the last turn (DynamoDB), in hours; 0: none.
    #[arg(long, default_value_t = 24)]
    wait_hours: u64,
    /// The agent's `worker_messages`: decision requests carry the last this many messages of
    /// the conversation, not all of it (the protocol's request, when left out).
    #[arg(long)]
    worker_messages: Option<usize>,
    /// Lambda memory in MB, for the duration's cost.
    #[arg(long, default_value_t = 256)]
    lambda_mb: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Backend {
    Sqlite,
    Dynamodb,
}

/// The agent: the worker's tool, and a client tool a person answers (the wait).
const AGENT: &str = "keeper";
const CONFIRM: &str = "confirm_with_customer";

fn config_toml(worker_url: &str, wait_secs: u64, worker_messages: Option<usize>) -> String {
    let catalog = catalog();
    let tool = &catalog[0];
    let mut toml = String::from("[llm.scripted]\ntype = \"scripted\"\n");
    let _ = write!(
        toml,
        "\n[defaults]\nclient_tool = {{ timeout_secs = {}, max_retries = 0, backoff_base_secs = 0, backoff_max_secs = 0 }}\n",
        wait_secs.max(1)
    );
    let _ = write!(
        toml,
        "\n[agent.{AGENT}]\nmodel = \"scripted\"\nllm = \"scripted\"\nsystem = \"You look after a customer's orders.\"\nworker = {}\n",
        toml_value(&json!(worker_url))
    );
    if let Some(n) = worker_messages {
        let _ = writeln!(toml, "worker_messages = {n}");
    }
    let _ = write!(
        toml,
        "\n[[agent.{AGENT}.tools]]\nname = \"{}\"\ndescription = {}\ninput = {}\n",
        tool.name,
        toml_value(&json!(tool.description)),
        toml_value(&tool.input)
    );
    let _ = write!(
        toml,
        "\n[[agent.{AGENT}.tools]]\nname = \"{CONFIRM}\"\ndescription = \"Ask the customer to confirm.\"\ninput = {{ type = \"object\" }}\nhandler = \"client\"\n"
    );
    toml
}

fn message(text: String) -> ClientInput {
    ClientInput::Message(ClientMessageInput {
        agent_id: AGENT.to_owned(),
        turn_id: None,
        message: DraftMessage::user(text),
        stream: None,
        client: None,
    })
}

/// Turn `n`'s input: the tool loop.
fn turn_input(n: usize) -> ClientInput {
    message(format!("{LOOP_MARK} Turn {n}: look through my orders again and tell me what changed."))
}

/// The wait's input: the scripted model calls the client tool, which a person never answers.
fn wait_input() -> ClientInput {
    message(format!("/tool {CONFIRM} {{}}"))
}

/// The time the agents' model spends answering, summed over its calls: the model's own work
/// (the scripted model reads the whole conversation, as a real one does), not the engine's.
#[derive(Debug, Default)]
struct ModelTime {
    nanos: AtomicU64,
}

impl ModelTime {
    fn take(&self) -> Duration {
        Duration::from_nanos(self.nanos.swap(0, Ordering::Relaxed))
    }
}

/// The agents of `config`, their model timed by `spent`.
fn timed_agents(config: &Config, spent: &Arc<ModelTime>) -> anyhow::Result<BTreeMap<String, AgentRuntime>> {
    let secrets = config.resolve_secrets(|_| None)?;
    let mut agents = assemble::agents(config, &secrets)?;
    for agent in agents.values_mut() {
        let spent = Arc::clone(spent);
        let on_answer: OnAnswer = Arc::new(move |_, took| {
            let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            spent.nanos.fetch_add(nanos, Ordering::Relaxed);
        });
        agent.provider = agent
            .provider
            .take()
            .map(|inner| Arc::new(TimedProvider { inner, on_answer }) as Arc<dyn ModelProvider>);
    }
    Ok(agents)
}

/// CPU time the process's threads have spent so far (the first field of each thread's
/// `/proc/self/task/<tid>/schedstat`, in nanoseconds): what the functions, the worker and the
/// model cost the machine, whatever moto's speed. A thread that has ended is not counted; the
/// runtime's threads live as long as the run.
fn cpu_time() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Duration::ZERO };
    let nanos: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

/// What one turn took.
#[derive(Debug, Default, Clone)]
struct TurnFigures {
    wall: Duration,
    /// The process's CPU time in the turn ([`cpu_time`]).
    cpu: Duration,
    /// The program's own polls while waiting for the turn (DynamoDB: [`lambda::HARNESS_POLLS`]).
    polls: u64,
    /// Of `wall`, the model's own time ([`ModelTime`]).
    model: Duration,
    tally: Tally,
    /// The session's head (its snapshot), as JSON, after the turn.
    head_bytes: usize,
    invocations: u64,
    billed_ms: u64,
    sqs_requests: u64,
    /// The largest decision request the worker got in the turn, as JSON (in reported turns).
    request_bytes: usize,
}

/// The decision requests' sizes, taken at the worker in the turns reported (serializing a
/// request again costs time, so not in the others).
#[derive(Debug, Default)]
struct RequestSizes {
    sampling: AtomicBool,
    largest: AtomicUsize,
}

impl RequestSizes {
    fn observe(&self, request: &DecisionRequest) {
        if self.sampling.load(Ordering::Relaxed) {
            self.largest.fetch_max(turnstone_engine::json_len(request), Ordering::Relaxed);
        }
    }

    /// Starts a turn: sampled if `sample`.
    fn start(&self, sample: bool) {
        self.largest.store(0, Ordering::Relaxed);
        self.sampling.store(sample, Ordering::Relaxed);
    }

    fn take(&self) -> usize {
        self.sampling.store(false, Ordering::Relaxed);
        self.largest.swap(0, Ordering::Relaxed)
    }
}

/// Whether turn `n` is in a reported window.
fn reported(args: &Args, n: usize) -> bool {
    args.at
        .iter()
        .any(|&at| if at < args.window { n <= args.window } else { n + args.window > at && n <= at })
}

/// The turns of a window, summed.
fn window(turns: &[TurnFigures], at: usize, width: usize) -> Option<(usize, usize, TurnFigures)> {
    if at == 0 || at > turns.len() {
        return None;
    }
    let (lo, hi) = if at < width { (1, width.min(turns.len())) } else { (at + 1 - width, at) };
    let mut sum = TurnFigures::default();
    for t in &turns[lo - 1..hi] {
        sum.wall += t.wall;
        sum.cpu += t.cpu;
        sum.polls += t.polls;
        sum.model += t.model;
        sum.tally.commits += t.tally.commits;
        sum.tally.waited += t.tally.waited;
        sum.tally.read_halves += t.tally.read_halves;
        for (kind, units) in &t.tally.write_units {
            *sum.tally.write_units.entry(*kind).or_default() += units;
        }
        for (op, n) in &t.tally.dynamodb {
            *sum.tally.dynamodb.entry(op.clone()).or_default() += n;
        }
        for (op, n) in &t.tally.sqs {
            *sum.tally.sqs.entry(op.clone()).or_default() += n;
        }
        for (op, n) in &t.tally.failed {
            *sum.tally.failed.entry(op.clone()).or_default() += n;
        }
        sum.head_bytes = sum.head_bytes.max(t.head_bytes);
        sum.invocations += t.invocations;
        sum.billed_ms += t.billed_ms;
        sum.sqs_requests += t.sqs_requests;
        sum.request_bytes = sum.request_bytes.max(t.request_bytes);
    }
    Some((lo, hi, sum))
}

// ---------------------------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------------------------

async fn run_sqlite(
    args: &Args,
    config: &Config,
    sizes: &RequestSizes,
    model: &Arc<ModelTime>,
) -> anyhow::Result<Vec<TurnFigures>> {
    let dir = tempfile::Builder::new().prefix("turnstone-long-").tempdir().context("creating a temp dir")?;
    let db = dir.path().join("turnstone.sqlite");
    let store = {
        let db = db.clone();
        let options = SqliteOptions { durability: Durability::Full, ..SqliteOptions::default() };
        tokio::task::spawn_blocking(move || SqliteStore::open_with(&db, options, Arc::new(SystemClock)))
            .await??
    };
    let meter = Meter::new(Vec::new(), false);
    let counting = CountingStore { inner: store, meter: Arc::clone(&meter) };
    let agents = timed_agents(config, model)?;
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(60)));
    let engine = assemble::engine(config, agents, Arc::new(counting), queue.clone(), Topology::OneProcess)?;
    let app = Arc::clone(&engine.app);
    let _pool = Pool::spawn(Arc::clone(&engine.dispatcher), queue, 2);
    let session_id = format!("long-sqlite-{}", std::process::id());
    let mut turns = Vec::with_capacity(args.turns);
    let started = Instant::now();
    for n in 1..=args.turns {
        let mut progress = app.notifier().progress(&session_id).await?;
        let mark = progress.borrow().mark();
        meter.start();
        sizes.start(reported(args, n));
        model.take();
        let cpu = cpu_time();
        let began = Instant::now();
        let submitted = app.submit(&session_id, turn_input(n), Placement::Start, &Caller::Anyone).await?;
        let turn_id = submitted.turn_id.context("the input started no turn")?;
        tokio::time::timeout(TURN_DEADLINE, progress.wait_for(|p| p.ended_since(mark, &turn_id)))
            .await
            .with_context(|| format!("turn {n} did not end within {TURN_DEADLINE:?}"))??;
        let wall = began.elapsed();
        let cpu = cpu_time().saturating_sub(cpu);
        let (tally, _) = meter.stop();
        let (session, _) = app.load(&session_id).await?;
        let turn = session.turn(&turn_id).context("the turn is gone")?;
        if turn.status != TurnStatus::Completed {
            bail!("turn {n} ended {:?}: {:?}", turn.status, turn.error);
        }
        turns.push(TurnFigures {
            wall,
            cpu,
            model: model.take(),
            tally,
            head_bytes: turnstone_engine::json_len(&session),
            request_bytes: sizes.take(),
            ..TurnFigures::default()
        });
        progress_line("sqlite", n, args.turns, started);
    }
    let db_bytes = file_len(&db) + file_len(&db.with_extension("sqlite-wal"));
    eprintln!("  sqlite: database {:.1} MiB after {} turns", db_bytes as f64 / (1024.0 * 1024.0), args.turns);
    Ok(turns)
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn progress_line(backend: &str, n: usize, of: usize, started: Instant) {
    if n.is_multiple_of(100) || n == of {
        eprintln!("  {backend}: turn {n}/{of} after {:.0} s", started.elapsed().as_secs_f64());
    }
}

// ---------------------------------------------------------------------------------------------
// DynamoDB
// ---------------------------------------------------------------------------------------------

/// The functions' clock: the system's, moved on by the wait.
#[derive(Debug, Default)]
struct MovedClock {
    offset_ms: AtomicI64,
}

impl Clock for MovedClock {
    fn now(&self) -> Timestamp {
        Timestamp(SystemClock.now().0.saturating_add(self.offset_ms.load(Ordering::Relaxed)))
    }
}

/// What the wait cost.
struct Waited {
    schedules: usize,
    /// Dispatch invocations from the session's first idle moment to the end of the turn.
    invocations: usize,
    /// Of those, while waiting (before the schedule fired).
    before_due: usize,
}

/// The run on moto, and what the wait cost.
async fn run_dynamodb(
    args: &Args,
    config: &Config,
    sizes: &RequestSizes,
    model: &Arc<ModelTime>,
) -> anyhow::Result<(Vec<TurnFigures>, Option<Waited>)> {
    let endpoint = tokio::task::spawn_blocking(moto::endpoint).await?;
    eprintln!("  dynamodb: moto at {endpoint} (scripts/moto_indexed)");
    let plain = moto::clients().await;
    let queue_name = moto::unique("long");
    let settings = QueueSettings { visibility_timeout: Duration::from_secs(60), ..QueueSettings::default() };
    let queue_url = SqsQueue::create_queue(&plain.sqs, &queue_name, &settings).await?;
    let queue_arn = plain
        .sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await?
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn).cloned())
        .context("the queue has no ARN")?;
    let table = moto::unique("long");
    let sdk = moto::config(&table, &queue_name)
        .loader()
        .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
        .load()
        .await;
    let schedules = aws_sdk_scheduler::Client::new(&sdk);
    let group = moto::unique("wake");
    schedules.create_schedule_group().name(&group).send().await?;

    // The meter prices no index writes here (the units of the table's items are the figures).
    let meter = Meter::new(Vec::new(), false);
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(meter.hook()).build(),
    );
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&sdk).interceptor(meter.hook()).build(),
    );
    let clock = Arc::new(MovedClock::default());
    let scheduler =
        Scheduler::new(schedules.clone(), &group, "arn:aws:iam::123456789012:role/wake", &queue_arn)
            .with_clock(Arc::clone(&clock) as Arc<dyn Clock>);
    let queue: Arc<dyn Queue> = Arc::new(SqsQueue::new(sqs, queue_url.clone()).scheduling(scheduler));
    let shared = Shared {
        frames: ManagementFrames::new(&sdk, "http://127.0.0.1:9/unused"),
        no_ahp: false,
        config: config.clone(),
        agents: timed_agents(config, model)?,
        dynamodb,
        source: SqsQueue::new(plain.sqs.clone(), queue_url.clone()),
        plain: plain.clone(),
        queue,
        meter: Arc::clone(&meter),
        clock: Arc::clone(&clock) as Arc<dyn Clock>,
    };
    let bench = shared.cell().await?;
    let mut functions = bench.functions()?;
    let session_id = format!("long-dynamodb-{}", std::process::id());
    let mut turns = Vec::with_capacity(args.turns);
    let started = Instant::now();
    for n in 1..=args.turns {
        let mut invocations = Invocations::default();
        meter.start();
        sizes.start(reported(args, n));
        model.take();
        lambda::HARNESS_POLLS.store(0, Ordering::Relaxed);
        let cpu = cpu_time();
        let began = Instant::now();
        bench.run_turn(&mut functions, false, &session_id, turn_input(n), &mut invocations).await?;
        let wall = began.elapsed();
        let cpu = cpu_time().saturating_sub(cpu);
        let (tally, _) = meter.stop();
        let (session, _) = bench.observer.app.load(&session_id).await?;
        turns.push(TurnFigures {
            wall,
            cpu,
            polls: lambda::HARNESS_POLLS.load(Ordering::Relaxed),
            model: model.take(),
            tally,
            head_bytes: turnstone_engine::json_len(&session),
            invocations: invocations.count(),
            billed_ms: invocations.billed_ms(),
            sqs_requests: invocations.event_source_requests(),
            request_bytes: sizes.take(),
        });
        progress_line("dynamodb", n, args.turns, started);
    }
    let waited = if args.wait_hours == 0 {
        None
    } else {
        Some(
            wait(
                &bench,
                &mut functions,
                &session_id,
                &clock,
                Schedules { client: &schedules, group: &group, sqs: &plain.sqs, queue_url: &queue_url },
                args.wait_hours,
            )
            .await?,
        )
    };
    shared.drop_cell(bench).await?;
    Ok((turns, waited))
}

/// The last turn: the session waits `hours` for a person, and the clock moves on.
/// Where the wake-ups are scheduled, and where Scheduler sends them.
struct Schedules<'a> {
    client: &'a aws_sdk_scheduler::Client,
    group: &'a str,
    sqs: &'a aws_sdk_sqs::Client,
    queue_url: &'a str,
}

async fn wait(
    bench: &Bench,
    functions: &mut lambda::Functions,
    session_id: &str,
    clock: &MovedClock,
    at: Schedules<'_>,
    hours: u64,
) -> anyhow::Result<Waited> {
    let mut invocations = Invocations::default();
    let turn_id = bench.submit(functions, false, session_id, wait_input(), &mut invocations).await?;
    // Run what is queued until the session waits: nothing queued for a poll, one schedule.
    let deadline = Instant::now() + TURN_DEADLINE;
    loop {
        let dispatched = bench.dispatch_once(functions, false, POLL, &mut invocations).await?;
        let waiting = at.client.list_schedules().group_name(at.group).send().await?.schedules().len();
        if !dispatched && waiting > 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("the session did not start waiting within {TURN_DEADLINE:?} ({waiting} schedules)");
        }
    }
    let idle_at = invocations.dispatch.len();
    // A while of doing nothing: no wake-up may come meanwhile.
    for _ in 0..3 {
        bench.dispatch_once(functions, false, POLL, &mut invocations).await?;
    }
    let before_due = invocations.dispatch.len() - idle_at;
    clock.offset_ms.fetch_add(i64::try_from(hours * 3_600_000 + 60_000)?, Ordering::Relaxed);
    // What Scheduler does with a due one-time schedule: send its input to its target, then
    // delete it (`ActionAfterCompletion: DELETE`).
    let listed = at.client.list_schedules().group_name(at.group).send().await?;
    let now = at_expression(clock.now());
    let mut fired = 0;
    for summary in listed.schedules() {
        let name = summary.name().unwrap_or_default();
        let schedule = at.client.get_schedule().group_name(at.group).name(name).send().await?;
        if schedule.schedule_expression().is_none_or(|at| at > now.as_str()) {
            continue;
        }
        let input = schedule.target().and_then(|t| t.input()).unwrap_or_default();
        at.sqs.send_message().queue_url(at.queue_url).message_body(input).send().await?;
        at.client.delete_schedule().group_name(at.group).name(name).send().await?;
        fired += 1;
    }
    bench.finish_turn(functions, false, session_id, &turn_id, &mut invocations).await?;
    Ok(Waited { schedules: fired, invocations: invocations.dispatch.len() - idle_at, before_due })
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn print_report(args: &Args, backend: Backend, turns: &[TurnFigures]) {
    let steps: u64 = turns.iter().map(|t| t.tally.commits).sum();
    println!();
    match backend {
        Backend::Sqlite => println!(
            "SQLite (durability full), {} turns, {steps} steps ({:.1} per turn), {} KB state per answer:",
            turns.len(),
            steps as f64 / turns.len().max(1) as f64,
            args.state_kb
        ),
        Backend::Dynamodb => println!(
            "DynamoDB (moto, the Lambda deployment, warm containers), {} turns, {steps} steps ({:.1} per turn), {} KB state per answer:",
            turns.len(),
            steps as f64 / turns.len().max(1) as f64,
            args.state_kb
        ),
    }
    let mut rows = Vec::new();
    for &at in &args.at {
        let Some((lo, hi, sum)) = window(turns, at, args.window) else { continue };
        let steps = sum.tally.commits.max(1) as f64;
        let latency = ms(sum.wall) / steps;
        let model = ms(sum.model) / steps;
        let cpu = ms(sum.cpu) / steps;
        let waited = ms(sum.tally.waited) / steps;
        // The engine's own, without the model's time (the scripted model reads the whole
        // conversation, as any model does): on SQLite its latency; on moto, whose time per
        // request is moto's (and whose waits overlap), the CPU time it costs.
        let engine = match backend {
            Backend::Sqlite => latency - model,
            Backend::Dynamodb => cpu - model,
        };
        let wu = sum.tally.total_write_units() as f64 / steps;
        let ru = sum.tally.read_units() / steps;
        rows.push((at, latency, wu, engine));
        match backend {
            Backend::Sqlite => println!(
                "  turn {at:>5} (turns {lo}-{hi}): {:.2} ms per step (model {model:.2} ms, engine {engine:.2} ms; CPU {cpu:.2} ms), {:.1} steps per turn, head {} B, decision requests up to {} KB",
                latency,
                steps / (hi + 1 - lo) as f64,
                sum.head_bytes,
                sum.request_bytes / 1024
            ),
            Backend::Dynamodb => {
                let requests = sum.tally.dynamodb.values().sum::<u64>() as f64 / steps;
                let sqs = (sum.tally.sqs.values().sum::<u64>() + sum.sqs_requests) as f64 / steps;
                let invocations = sum.invocations as f64 / steps;
                let gb_s = sum.billed_ms as f64 / 1000.0 * args.lambda_mb as f64 / 1024.0 / steps;
                let dollars = wu * DYNAMODB_WRITE_UNIT
                    + ru * DYNAMODB_READ_UNIT
                    + sqs * SQS_REQUEST
                    + invocations * LAMBDA_REQUEST
                    + gb_s * LAMBDA_GB_SECOND;
                let ops: Vec<String> = sum
                    .tally
                    .dynamodb
                    .iter()
                    .map(|(op, n)| format!("{op} {:.2}", *n as f64 / steps))
                    .collect();
                println!(
                    "  turn {at:>5} (turns {lo}-{hi}): {wu:.1} WU, {ru:.2} RU, {requests:.2} DynamoDB requests ({}), \
                     {sqs:.2} SQS requests, {invocations:.2} invocations, ${:.2}/M steps; \
                     {latency:.1} ms per step ({waited:.1} ms of requests to moto); CPU {cpu:.2} ms per step, of which the model {model:.2} ms (engine {engine:.2} ms), {:.2} polls of the program's own; head {} B, decision requests up to {} KB{}",
                    ops.join(", "),
                    dollars * 1e6,
                    sum.polls as f64 / steps,
                    sum.head_bytes,
                    sum.request_bytes / 1024,
                    if sum.tally.failed.is_empty() {
                        String::new()
                    } else {
                        format!("; FAILED {:?}", sum.tally.failed)
                    }
                );
            }
        }
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && rows.len() > 1
    {
        let ratio = |a: f64, b: f64| if a > 0.0 { b / a } else { 0.0 };
        let latency = ratio(first.1, last.1);
        let engine = ratio(first.3, last.3);
        let verdict = |r: f64| if r <= TARGET_FLAT { "within" } else { "OVER" };
        match backend {
            Backend::Sqlite => println!(
                "  turn {} / turn {}: latency per step {latency:.2}x; the engine's own {engine:.2}x ({} the goal of {TARGET_FLAT}x)",
                last.0,
                first.0,
                verdict(engine)
            ),
            Backend::Dynamodb => {
                let wu = ratio(first.2, last.2);
                println!(
                    "  turn {} / turn {}: write units per step {wu:.2}x ({} {TARGET_FLAT}x); the engine's CPU per step {engine:.2}x ({} {TARGET_FLAT}x); latency per step {latency:.2}x on moto",
                    last.0,
                    first.0,
                    verdict(wu),
                    verdict(engine)
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Unless TURNSTONE_MOTO_ENDPOINT names a server: moto at a real table's costs.
    moto::prefer_indexed();
    run(args).await
}

async fn run(args: Args) -> anyhow::Result<()> {
    let catalog = Arc::new(catalog());
    let script = worker_script(Arc::clone(&catalog), args.loop_steps, args.state_kb);
    let sizes = Arc::new(RequestSizes::default());
    let model = Arc::new(ModelTime::default());
    let observed = Arc::clone(&sizes);
    let worker = FakeWorker::start(None, move |request: &DecisionRequest, delivery| {
        observed.observe(request);
        script(request, delivery)
    })
    .await;
    let config = Config::parse(
        &config_toml(&worker.url(), args.wait_hours * 3600, args.worker_messages),
        "long_session.toml",
    )?;
    let mut backends = args.backends.clone();
    backends.sort_unstable();
    backends.dedup();
    // Each backend's report as soon as it has run.
    for backend in backends {
        let started = Instant::now();
        let (turns, waited) = match backend {
            Backend::Sqlite => (run_sqlite(&args, &config, &sizes, &model).await?, None),
            Backend::Dynamodb => run_dynamodb(&args, &config, &sizes, &model).await?,
        };
        eprintln!("  {backend:?}: {:.0} s", started.elapsed().as_secs_f64());
        print_report(&args, backend, &turns);
        if let Some(waited) = waited {
            println!(
                "  a wait of {} h for a person: {} schedule(s) fired, {} dispatch invocation(s) from the first idle moment to the end of the turn ({} while waiting)",
                args.wait_hours, waited.schedules, waited.invocations, waited.before_due
            );
        }
    }
    drop(worker);
    Ok(())
}

//! What a step costs on AWS (DESIGN.md sections 5 and 12), measured against a real moto
//! server: DynamoDB requests, write and read units, SQS requests, Lambda invocations and bytes
//! written per step, and dollars per million steps at on-demand list prices. A program that
//! prints figures, never a test.
//!
//! ```text
//! cargo run --release -p turnstone --example aws_cost -- \
//!     [--messages 10,100,1000] [--tools 1,20] [--scenarios hosted,worker] [--loop-steps 20] \
//!     [--cache warm,cold] [--lambda-mb 256] [--trace]
//! ```
//!
//! It starts its own moto server (`.venv/bin/moto_server`) unless `TURNSTONE_MOTO_ENDPOINT`
//! names one, and runs the engine as the Lambda deployment does (`Topology::Split`): an `api`
//! engine takes each client input (one `api` invocation: `App::submit`), and a `dispatch`
//! engine is driven as the SQS event source drives the `dispatch` function: a batch received
//! from the real `SqsQueue`, each session in it run once (`Dispatcher::run`, as
//! `turnstone_lambda::sqs::handle_batch` does), the messages deleted; one batch is one
//! `dispatch` invocation. Both engines share one `DynamoStore` and one `SqsQueue`, built from
//! SDK clients that carry a counting interceptor (`aws_cost/meter.rs`); the event source's own
//! receives and deletes go through other clients and are modelled instead (one
//! `ReceiveMessage` and one `DeleteMessageBatch` per invocation).
//!
//! A **step** is one successful commit of the measured session (`Store::commit`, counted by a
//! store decorator). Each cell of the matrix is a fresh session on a fresh table, pre-filled
//! by running real turns (uncounted) until it holds the conversation length, then one measured
//! turn with the engines that ran the pre-fill (`warm`: containers that have seen the session,
//! whose message cache reads only new messages) and one with fresh engines for every
//! invocation (`cold`: a new container each time, which loads the whole conversation).
//!
//! The pre-fill sends up to [`PREFILL_CHUNK`] messages per turn (a `client.messages` input: the
//! conversation so far, by id, and the new messages, which the model then answers): moto
//! deep-copies the whole table for every item of every `TransactWriteItems`, so one-message
//! turns slow down as the table grows (the first 400 of one session took 400 s), and a table
//! per cell keeps the copies small. The measured turns are ordinary one-message turns.

// The unit arithmetic and the interceptor, the functions on moto, and the worker (a crate root
// looks for modules next to it; `long_session` shares them).
#[path = "aws_cost/lambda.rs"]
mod lambda;
#[path = "aws_cost/meter.rs"]
mod meter;
#[path = "aws_cost/worker.rs"]
mod worker;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::types::ProjectionType;
use clap::{Parser, ValueEnum};
use serde_json::json;
use turnstone_aws::{DynamoStore, ManagementFrames, QueueSettings, SqsQueue, moto};
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DraftMessage};
use turnstone_runtime::assemble;
use turnstone_runtime::config::Config;
use turnstone_runtime::queue::Queue;
use turnstone_tests::FakeWorker;

use lambda::{Measured, Shared};
use meter::{
    DYNAMODB_READ_UNIT, DYNAMODB_WRITE_UNIT, Kind, LAMBDA_GB_SECOND, LAMBDA_REQUEST, Meter, SQS_REQUEST,
};
use worker::{LOOP_MARK, ToolSpec, catalog, toml_value, worker_script};

// ---------------------------------------------------------------------------------------------
// Prices
// ---------------------------------------------------------------------------------------------

// The list prices: `aws_cost/meter.rs` (CHECK THEM there before quoting a figure).

/// The design's target for an engine-hosted step, $ per million.
const TARGET_HOSTED_PER_MILLION: f64 = 3.0;
/// How far write units per step may spread across conversation lengths and agent sizes.
const TARGET_FLAT: f64 = 1.5;

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Parser)]
#[command(about = "Measures what a step costs on AWS (DynamoDB, SQS, Lambda), against a moto server.")]
struct Args {
    /// Conversation lengths: messages in the session before the measured turn.
    #[arg(long, value_delimiter = ',', default_values_t = [10, 100, 1000])]
    messages: Vec<usize>,
    /// Agent sizes: how many tools the agent declares (1..=20).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 20])]
    tools: Vec<usize>,
    /// Which scenarios to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["hosted", "worker"])]
    scenarios: Vec<Scenario>,
    /// Which measured turns: with the engines that ran the pre-fill, with fresh ones, or both.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["warm", "cold"])]
    cache: Vec<Cache>,
    /// Tool calls, one after another, in the measured turn of the worker scenario.
    #[arg(long, default_value_t = 20)]
    loop_steps: usize,
    /// KB of agent state the worker writes with every answer, changed each time (0: none): a
    /// worker keeping its working memory in the session (issue 25 measured 12).
    #[arg(long, default_value_t = 0)]
    state_kb: usize,
    /// Engine-hosted turns measured per cell, one after another. The store writes a checkpoint
    /// every 32 commits or so: one 3-step turn would show one or none by chance, 16 turns (48
    /// steps) take it in at its rate. A worker turn is 85 steps, measured once.
    #[arg(long, default_value_t = 16)]
    hosted_turns: usize,
    /// Lambda memory in MB, for the duration's cost.
    #[arg(long, default_value_t = 256)]
    lambda_mb: u64,
    /// Print every request of each measured turn.
    #[arg(long)]
    trace: bool,
    /// Keep each cell's table (to look at its items with other tools, with
    /// TURNSTONE_MOTO_ENDPOINT naming a server that outlives the run); by default it is dropped.
    #[arg(long)]
    keep_tables: bool,
    /// Build the functions without AHP pushes (as before the `ahp` function): by default each
    /// commit reads its session's AHP subscribers, as the deployed `api` and `dispatch` do.
    #[arg(long)]
    no_ahp: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Scenario {
    /// An agent without a worker on the scripted model: a plain message, `You said: ...`.
    Hosted,
    /// An agent with a worker webhook whose turn runs a tool loop of `--loop-steps` calls.
    Worker,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Cache {
    /// The measured turn runs on the engines that ran the pre-fill (warm containers).
    Warm,
    /// Every invocation of the measured turn gets fresh engines (a new container each).
    Cold,
}

impl Cache {
    fn name(self) -> &'static str {
        match self {
            Cache::Warm => "warm",
            Cache::Cold => "cold",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The agents
// ---------------------------------------------------------------------------------------------

const SYSTEM: &str = "You are the customer-support agent of an online running-gear shop. Be brief and \
     friendly. Look things up with your tools before answering; never invent order data. Ask before \
     refunding, cancelling or changing anything.";

/// The agent id of a scenario with `tools` tools.
fn agent_id(scenario: Scenario, tools: usize) -> String {
    match scenario {
        Scenario::Hosted => format!("hosted-{tools}t"),
        Scenario::Worker => format!("worker-{tools}t"),
    }
}

/// The configuration: the scripted model, and an agent per scenario and size. Engine-hosted
/// agents run their tools on the client (they have no worker); worker agents on the worker.
fn config_toml(worker_url: &str, sizes: &[usize], catalog: &[ToolSpec]) -> String {
    let mut toml = String::from("[llm.scripted]\ntype = \"scripted\"\n");
    for scenario in [Scenario::Hosted, Scenario::Worker] {
        for &tools in sizes {
            let id = agent_id(scenario, tools);
            let _ = write!(
                toml,
                "\n[agent.{id}]\nmodel = \"scripted\"\nllm = \"scripted\"\nsystem = {}\n",
                toml_value(&json!(SYSTEM))
            );
            if scenario == Scenario::Worker {
                let _ = writeln!(toml, "worker = {}", toml_value(&json!(worker_url)));
            }
            for tool in catalog.iter().take(tools) {
                let _ = write!(
                    toml,
                    "\n[[agent.{id}.tools]]\nname = \"{}\"\ndescription = {}\ninput = {}\n",
                    tool.name,
                    toml_value(&json!(tool.description)),
                    toml_value(&tool.input)
                );
                if scenario == Scenario::Hosted {
                    toml.push_str("handler = \"client\"\n");
                }
            }
        }
    }
    toml
}

/// A `client.message` input.
fn message(agent: &str, text: String) -> ClientInput {
    ClientInput::Message(ClientMessageInput {
        agent_id: agent.to_owned(),
        turn_id: None,
        message: DraftMessage::user(text),
        stream: None,
        client: None,
    })
}

/// The measured turn's input of a scenario.
fn measured_input(scenario: Scenario, agent: &str) -> ClientInput {
    match scenario {
        Scenario::Hosted => message(
            agent,
            "Hi! I ordered running shoes last week (ord_8f2k1) and the tracking page has not \
             changed in three days. Can you check what is going on?"
                .to_owned(),
        ),
        Scenario::Worker => message(
            agent,
            format!(
                "{LOOP_MARK} Please go through my account: every order, shipment, ticket and \
                 subscription, and tell me if anything needs my attention."
            ),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

/// One row of a table: a measured turn of one cell.
struct Row {
    scenario: Scenario,
    /// The conversation length asked for (the measured turn's `before` may be longer: a cold
    /// turn runs after the warm one).
    target: usize,
    tools: usize,
    cache: Cache,
    measured: Measured,
}

/// How far write units per step spread within groups of rows, worst group first: `(max/min,
/// min, max, what the group has in common)`.
fn spread(rows: &[(&Row, f64)], group: impl Fn(&Row) -> String) -> Option<(f64, f64, f64, String)> {
    let mut groups: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (row, units) in rows {
        let (low, high) = groups.entry(group(row)).or_insert((f64::MAX, 0.0));
        *low = low.min(*units);
        *high = high.max(*units);
    }
    groups
        .into_iter()
        .map(|(name, (low, high))| (if low > 0.0 { high / low } else { f64::INFINITY }, low, high, name))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// What a row costs per step.
struct PerStep {
    steps: f64,
    write_requests: f64,
    read_requests: f64,
    write_units: f64,
    index_units: f64,
    read_units: f64,
    sqs: f64,
    invocations: f64,
    ms_per_invocation: f64,
    bytes: f64,
    dollars_dynamodb: f64,
    dollars_sqs: f64,
    dollars_lambda: f64,
}

impl PerStep {
    fn of(row: &Row, lambda_mb: u64) -> PerStep {
        let m = &row.measured;
        let t = &m.tally;
        let steps = t.commits.max(1) as f64;
        let per = |n: f64| n / steps;
        let write_units = per(t.total_write_units() as f64);
        let read_units = per(t.read_units());
        let sqs = per((t.sqs.values().sum::<u64>() + m.invocations.event_source_requests()) as f64);
        let invocations = per(m.invocations.count() as f64);
        let gb_seconds = per(m.invocations.billed_ms() as f64 / 1000.0 * lambda_mb as f64 / 1024.0);
        PerStep {
            steps: t.commits as f64,
            write_requests: per(t.write_requests() as f64),
            read_requests: per(t.read_requests() as f64),
            write_units,
            index_units: per(t.write_units.get(&Kind::Index).copied().unwrap_or(0) as f64),
            read_units,
            sqs,
            invocations,
            ms_per_invocation: m.invocations.billed_ms() as f64 / m.invocations.count().max(1) as f64,
            bytes: per(t.total_written_bytes() as f64),
            dollars_dynamodb: 1e6 * (write_units * DYNAMODB_WRITE_UNIT + read_units * DYNAMODB_READ_UNIT),
            dollars_sqs: 1e6 * sqs * SQS_REQUEST,
            dollars_lambda: 1e6 * (invocations * LAMBDA_REQUEST + gb_seconds * LAMBDA_GB_SECOND),
        }
    }

    fn dollars(&self) -> f64 {
        self.dollars_dynamodb + self.dollars_sqs + self.dollars_lambda
    }
}

/// The DynamoDB operations reported as columns, with their short names.
const OPS: [(&str, &str); 5] = [
    ("GetItem", "Get"),
    ("Query", "Query"),
    ("BatchGetItem", "BGet"),
    ("TransactWriteItems", "TWI"),
    ("PutItem", "Put"),
];

fn scenario_title(scenario: Scenario, loop_steps: usize) -> String {
    match scenario {
        Scenario::Hosted => {
            "(a) engine-hosted turn: agent without a worker, scripted model, a plain user message \
                             answered `You said: ...`"
                .to_owned()
        }
        Scenario::Worker => format!(
            "(b) worker tool loop: agent with a worker webhook (FakeWorker over HTTP); the turn runs \
             {loop_steps} tool calls one after another, each a model call, its decision, the tool's \
             tool.execute and its tool.finished decision"
        ),
    }
}

fn row_label(row: &Row) -> String {
    format!("{:>5} {:>5} {:>5}", row.measured.before, row.tools, row.cache.name())
}

fn row_name(row: &Row) -> String {
    format!("{} msgs, {} tools, {}", row.measured.before, row.tools, row.cache.name())
}

fn print_report(rows: &[Row], args: &Args) {
    let mut out = String::new();
    let scenarios: Vec<Scenario> = {
        let mut s: Vec<Scenario> = rows.iter().map(|r| r.scenario).collect();
        s.dedup();
        s
    };
    for &scenario in &scenarios {
        let rows: Vec<&Row> = rows.iter().filter(|r| r.scenario == scenario).collect();
        let _ = writeln!(out, "\n{}", scenario_title(scenario, args.loop_steps));
        let _ = writeln!(
            out,
            "{:>5} {:>5} {:>5} {:>5} | {:>5} {:>5} {:>5} {:>5} {:>5} | {:>6} {:>5} {:>6} | {:>5} | {:>5} {:>6} | {:>7} | {:>6} {:>6} {:>6} {:>7}",
            "msgs",
            "tools",
            "cache",
            "steps",
            "Get",
            "Query",
            "BGet",
            "TWI",
            "Put",
            "WU",
            "(idx)",
            "RU",
            "SQS",
            "λ inv",
            "λ ms",
            "bytes",
            "$ DDB",
            "$ SQS",
            "$ λ",
            "$ total"
        );
        let _ = writeln!(
            out,
            "{:>23} | {:^29} | {:^20} | {:>5} | {:^12} | {:>7} | {:^30}",
            "",
            "DynamoDB requests per step",
            "units per step",
            "/step",
            "Lambda",
            "B/step",
            "$ per million steps"
        );
        for row in &rows {
            let p = PerStep::of(row, args.lambda_mb);
            let t = &row.measured.tally;
            let per_op = |op: &str| t.dynamodb.get(op).copied().unwrap_or(0) as f64 / p.steps.max(1.0);
            let _ = writeln!(
                out,
                "{} {:>5} | {:>5.2} {:>5.2} {:>5.2} {:>5.2} {:>5.2} | {:>6.1} {:>5.1} {:>6.1} | {:>5.2} | {:>5.2} {:>6.0} | {:>7.0} | {:>6.2} {:>6.2} {:>6.2} {:>7.2}",
                row_label(row),
                p.steps,
                per_op(OPS[0].0),
                per_op(OPS[1].0),
                per_op(OPS[2].0),
                per_op(OPS[3].0),
                per_op(OPS[4].0),
                p.write_units,
                p.index_units,
                p.read_units,
                p.sqs,
                p.invocations,
                p.ms_per_invocation,
                p.bytes,
                p.dollars_dynamodb,
                p.dollars_sqs,
                p.dollars_lambda,
                p.dollars(),
            );
            let others: Vec<String> = t
                .dynamodb
                .iter()
                .filter(|(op, _)| !OPS.iter().any(|(o, _)| o == op))
                .chain(t.failed.iter())
                .chain(t.unpriced.iter())
                .map(|(op, n)| format!("{op} {n}"))
                .collect();
            if !others.is_empty() {
                let _ = writeln!(out, "{:>23}   also: {}", "", others.join(", "));
            }
        }

        let _ = writeln!(
            out,
            "\nWhere the write units go (per step: units, and bytes written in brackets), and the largest item of each kind"
        );
        let mut header = format!("{:>5} {:>5} {:>5} |", "msgs", "tools", "cache");
        for kind in Kind::ALL {
            let _ = write!(header, " {:>15}", kind.label());
        }
        let _ = writeln!(out, "{header} | head share | largest head, pack, message");
        for row in &rows {
            let t = &row.measured.tally;
            let steps = t.commits.max(1) as f64;
            let mut line = format!("{} |", row_label(row));
            for kind in Kind::ALL {
                let units = t.write_units.get(&kind).copied().unwrap_or(0) as f64 / steps;
                let bytes = t.written_bytes.get(&kind).copied().unwrap_or(0) as f64 / steps;
                let _ = write!(line, " {:>15}", format!("{units:.1} ({bytes:.0})"));
            }
            let largest = |k: Kind| t.largest.get(&k).copied().unwrap_or(0);
            let head = t.write_units.get(&Kind::Head).copied().unwrap_or(0) as f64;
            let _ = writeln!(
                line,
                " | {:>9.0}% | {} B, {} B, {} B",
                100.0 * head / t.total_write_units().max(1) as f64,
                largest(Kind::Head),
                largest(Kind::Events),
                largest(Kind::Messages)
            );
            out.push_str(&line);
        }
        let _ = writeln!(out, "\nWhat the measured turns take");
        for row in &rows {
            let m = &row.measured;
            let t = &m.tally;
            let items: Vec<String> = Kind::ALL
                .iter()
                .filter_map(|k| t.items_written.get(k).map(|n| format!("{n} {}", k.label())))
                .collect();
            let sqs: Vec<String> = t.sqs.iter().map(|(op, n)| format!("{op} {n}")).collect();
            let _ = writeln!(
                out,
                "{}: {} steps, {} -> {} messages; {} api ({} ms) + {} dispatch ({} ms) invocations; \
                 SQS sent: {}; items written: {}; {:.1} RU reading {} B",
                row_name(row),
                t.commits,
                m.before,
                m.after,
                m.invocations.api.len(),
                m.invocations.api.iter().map(Duration::as_millis).sum::<u128>(),
                m.invocations.dispatch.len(),
                m.invocations.dispatch.iter().map(Duration::as_millis).sum::<u128>(),
                if sqs.is_empty() { "none".to_owned() } else { sqs.join(", ") },
                items.join(", "),
                t.read_units(),
                t.read_bytes,
            );
        }
    }

    // The targets.
    let _ = writeln!(out, "\nTargets");
    let per_step: Vec<(&Row, PerStep)> = rows.iter().map(|r| (r, PerStep::of(r, args.lambda_mb))).collect();
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    let worst_writes = per_step.iter().map(|(_, p)| p.write_requests).fold(0.0, f64::max);
    let worst_reads = per_step.iter().map(|(_, p)| p.read_requests).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "- one write request and at most two reads per step: {} (worst row: {worst_writes:.2} write and {worst_reads:.2} read requests per step)",
        verdict(worst_writes <= 1.0 && worst_reads <= 2.0)
    );
    for &scenario in &scenarios {
        let units: Vec<(&Row, f64)> = per_step
            .iter()
            .filter(|(r, _)| r.scenario == scenario)
            .map(|(r, p)| (*r, p.write_units))
            .collect();
        let by_length = spread(&units, |r| format!("{} tools, {}", r.tools, r.cache.name()));
        let by_size = spread(&units, |r| format!("{} msgs, {}", r.target, r.cache.name()));
        let describe = |found: &Option<(f64, f64, f64, String)>| match found {
            Some((ratio, low, high, at)) => format!("{ratio:.2}x ({low:.1} .. {high:.1} at {at})"),
            None => "-".to_owned(),
        };
        let flat =
            |found: &Option<(f64, f64, f64, String)>| found.as_ref().is_none_or(|f| f.0 <= TARGET_FLAT);
        let _ = writeln!(
            out,
            "- write units per step flat in conversation length and agent size (within {TARGET_FLAT}x), {}: {} \
             (in length: {}; in agent size: {})",
            match scenario {
                Scenario::Hosted => "engine-hosted",
                Scenario::Worker => "worker loop",
            },
            verdict(flat(&by_length) && flat(&by_size)),
            describe(&by_length),
            describe(&by_size),
        );
    }
    // Warm containers are the steady state; a container per invocation is reported apart: it
    // reads the whole conversation every time, whatever the store writes.
    for cache in [Cache::Warm, Cache::Cold] {
        let hosted: Vec<f64> = per_step
            .iter()
            .filter(|(r, _)| r.scenario == Scenario::Hosted && r.cache == cache)
            .map(|(_, p)| p.dollars())
            .collect();
        if hosted.is_empty() {
            continue;
        }
        let worst = hosted.iter().copied().fold(0.0, f64::max);
        let best = hosted.iter().copied().fold(f64::MAX, f64::min);
        let _ = writeln!(
            out,
            "- under ${TARGET_HOSTED_PER_MILLION} per million engine-hosted steps, {}: {} (${best:.2} .. ${worst:.2} per million)",
            match cache {
                Cache::Warm => "warm containers",
                Cache::Cold => "a new container for every invocation",
            },
            verdict(worst < TARGET_HOSTED_PER_MILLION)
        );
    }
    let _ = write!(out, "{}", explain(args));
    for line in out.lines() {
        println!("{}", line.trim_end());
    }
    if args.trace {
        for row in rows {
            println!("\nRequests of {:?}, {}", row.scenario, row_name(row));
            for line in &row.measured.trace {
                println!("  {line}");
            }
        }
    }
}

fn explain(args: &Args) -> String {
    format!(
        "
What the figures are
  step      one successful Store::commit of the measured session (a DynamoDB write of the store);
            the columns are totals of the measured turn divided by its steps.
  msgs      messages in the session before the measured turn (pre-filled by running real turns).
  cache     warm: the api and dispatch engines that ran the pre-fill, a store each (a container
            that has seen the session reads only the packs written since); cold: fresh engines
            and stores for every invocation (a new container reads the session's checkpoint,
            messages and the packs after it).
  Get/Query/BGet/TWI/Put
            DynamoDB requests per step by operation, counted by an SDK interceptor as sent.
  WU        write request units per step, from the request bodies: per item 1 per started KB
            of the larger of old and new item, twice inside TransactWriteItems; (idx) the part
            spent on global secondary indexes (an entry added or removed: 1, its keys changed: 2;
            assumed billed at the standard rate, outside the transaction).
  RU        read request units per step from the answers: GetItem and each BatchGetItem item 1
            per started 4 KB (1 for none), a Query page its items' total per 4 KB (at least 1);
            charged on whole items (a projection does not make a read cheaper); eventual: half.
  SQS       SQS requests per step: what the engine sends (SendMessage), plus the event source's
            ReceiveMessage and DeleteMessageBatch per dispatch invocation (modelled). Not per
            step: an event source polls an idle queue too (about 5 pollers x 3 long polls a
            minute: ~0.65 M requests, ~$0.26, a month per queue).
  λ inv     Lambda invocations per step: one `api` per client input, one `dispatch` per batch.
  λ ms      mean wall time per invocation, measured here against moto on loopback, billed per
            started ms at {} MB. moto is no DynamoDB: it deep-copies the whole table for every
            item of a TransactWriteItems, so its times grow with the table; take these as an
            upper bound of the duration part.
  bytes     item bytes written per step (DynamoDB's item size: names plus values).
  $         per million steps, at the prices in examples/aws_cost/meter.rs (check them):
            DynamoDB ${:.3}/M write units, ${:.3}/M read units; SQS ${:.2}/M requests; Lambda
            ${:.2}/M invocations + ${:.7}/GB-s. Client reads (turn long-polls, event streams),
            storage and the sweep are not included.
",
        args.lambda_mb,
        DYNAMODB_WRITE_UNIT * 1e6,
        DYNAMODB_READ_UNIT * 1e6,
        SQS_REQUEST * 1e6,
        LAMBDA_REQUEST * 1e6,
        LAMBDA_GB_SECOND,
    )
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.tools.iter().any(|&t| t == 0 || t > 20) {
        bail!("--tools takes sizes from 1 to 20");
    }
    // Starts `.venv/bin/moto_server` unless TURNSTONE_MOTO_ENDPOINT names a server (and panics,
    // saying how to install moto, when neither is there).
    let endpoint = tokio::task::spawn_blocking(moto::endpoint).await?;
    eprintln!("moto at {endpoint}");
    let queue_name = moto::unique("aws-cost");
    let plain = moto::clients().await;
    let settings = QueueSettings { visibility_timeout: Duration::from_secs(60), ..QueueSettings::default() };
    let queue_url = SqsQueue::create_queue(&plain.sqs, &queue_name, &settings).await?;

    // The table's indexes, as DynamoDB describes them, for the index write units.
    let probe = moto::unique("aws-cost");
    DynamoStore::new(plain.dynamodb.clone(), probe.clone()).create_table().await?;
    let described = plain.dynamodb.describe_table().table_name(&probe).send().await?;
    plain.dynamodb.delete_table().table_name(&probe).send().await?;
    let indexes = described
        .table()
        .map(|t| t.global_secondary_indexes())
        .unwrap_or_default()
        .iter()
        .map(|index| {
            let key = |kind: &str| {
                index
                    .key_schema()
                    .iter()
                    .find(|k| k.key_type().as_str() == kind)
                    .map(|k| k.attribute_name().to_owned())
            };
            let projection = index.projection();
            let projected = match projection.and_then(|p| p.projection_type()) {
                Some(ProjectionType::All) => None,
                _ => Some(projection.map(|p| p.non_key_attributes().to_vec()).unwrap_or_default()),
            };
            meter::Index {
                name: index.index_name().unwrap_or_default().to_owned(),
                hash: key("HASH").unwrap_or_default(),
                range: key("RANGE"),
                projected,
            }
        })
        .collect::<Vec<_>>();
    let meter = Meter::new(indexes.clone(), args.trace);

    // The functions' clients carry the meter.
    let sdk = moto::config(&probe, &queue_name)
        .loader()
        .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
        .load()
        .await;
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(meter.hook()).build(),
    );
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&sdk).interceptor(meter.hook()).build(),
    );
    let queue: Arc<dyn Queue> = Arc::new(SqsQueue::new(sqs, queue_url.clone()));

    let catalog = Arc::new(catalog());
    let worker =
        FakeWorker::start(None, worker_script(Arc::clone(&catalog), args.loop_steps, args.state_kb)).await;
    let mut sizes = args.tools.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let config = Config::parse(&config_toml(&worker.url(), &sizes, &catalog), "aws_cost.toml")?;
    let secrets = config.resolve_secrets(|_| None)?;
    let agents = assemble::agents(&config, &secrets)?;
    let shared = Shared {
        frames: ManagementFrames::new(&sdk, "http://127.0.0.1:9/unused"),
        no_ahp: args.no_ahp,
        config,
        agents,
        dynamodb,
        source: SqsQueue::new(plain.sqs.clone(), queue_url),
        plain,
        queue,
        meter,
        clock: Arc::new(turnstone_runtime::clock::SystemClock),
    };

    println!(
        "Turnstone on AWS, as the Lambda deployment runs it (Topology::Split), against moto {endpoint}: \
         a fresh table per cell ({} indexes: {}), one SQS standard queue",
        indexes.len(),
        indexes.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
    );
    let mut rows = Vec::new();
    let started = Instant::now();
    let mut scenarios = args.scenarios.clone();
    scenarios.sort_unstable();
    scenarios.dedup();
    for &scenario in &scenarios {
        for &tools in &sizes {
            for &target in &args.messages {
                let agent = agent_id(scenario, tools);
                let session_id = format!("{agent}-{target}m-{}", std::process::id());
                let bench = shared.cell().await?;
                let mut functions = bench.functions()?;
                let cell = Instant::now();
                let before = bench.prefill(&mut functions, &session_id, &agent, target).await?;
                eprintln!(
                    "  {session_id}: pre-filled {before} messages in {:.1} s",
                    cell.elapsed().as_secs_f64()
                );
                for &cache in &args.cache {
                    let input = measured_input(scenario, &agent);
                    let turns = if scenario == Scenario::Hosted { args.hosted_turns.max(1) } else { 1 };
                    let cold = cache == Cache::Cold;
                    let measured = bench.measure(&mut functions, cold, &session_id, input, turns).await?;
                    eprintln!(
                        "  {session_id} {}: {} steps, {} -> {} messages",
                        cache.name(),
                        measured.tally.commits,
                        measured.before,
                        measured.after
                    );
                    rows.push(Row { scenario, target, tools, cache, measured });
                }
                if args.keep_tables {
                    eprintln!("  kept table {} for {session_id}", bench.table);
                } else {
                    shared.drop_cell(bench).await?;
                }
            }
        }
    }
    eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
    print_report(&rows, &args);
    drop(worker);
    Ok(())
}

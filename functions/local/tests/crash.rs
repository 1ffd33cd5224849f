//! `kill -9` mid-turn, then restart on the same data directory: the turn completes, every
//! message is there exactly once, and no tool ran twice for one attempt.
//!
//! Each test starts the real `turnstone serve` binary with a config whose agent runs its model
//! on the fake OpenAI server and its tools on the fake worker (both in this test process), with
//! short policies (2 s timeouts, 0.2 s backoffs). The process is killed with SIGKILL while a
//! step is in flight: a `tool.execute` delivery the worker holds, or a model call the model
//! holds. The restarted host finds the session with its sweep, times the lost attempt out at
//! its deadline, retries it by policy, and finishes the turn.
//!
//! The worker behaves as the protocol asks: it records executions by (call id, attempt) and
//! answers a redelivery of the same pair from that record instead of executing again.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstone_engine::protocol::Trigger;
use turnstone_engine::session::TurnStatus;
use turnstone_runtime::api::SessionStatus;
use turnstone_tests::ledger::{
    Execution, Ledger, Rng, assert_survived, calc_config, calc_turn, ledger_worker, scripted_config,
};
use turnstone_tests::{ApiClient, FakeOpenAi, FakeToolCall, FakeWorker, Gate, Reply};

/// How long a step may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(30);

fn config(openai: &FakeOpenAi, worker: &FakeWorker) -> String {
    let llm = format!("type = \"openai\"\nbase_url = \"{}\"", openai.base_url());
    calc_config(&llm, "gpt-fake", worker)
}

/// The two tool calls the model makes.
fn tool_calls() -> Reply {
    Reply::tool_calls([
        FakeToolCall::new("call_add", "add", r#"{"a":20,"b":22}"#),
        FakeToolCall::new("call_up", "upper", r#"{"text":"done"}"#),
    ])
}

/// A running `turnstone serve`; killed (SIGKILL) when dropped.
struct Server {
    child: Child,
    api: ApiClient,
    log: PathBuf,
}

/// Where a test's `turnstone serve` keeps sessions and wake-ups.
#[derive(Debug, Clone)]
enum Backing {
    /// The embedded store and queue, in the data directory.
    Local,
    /// A DynamoDB table and an SQS queue on moto (`--backend aws`), created on first start.
    Aws { table: String, queue: String },
}

impl Backing {
    /// A fresh table and queue on moto, the queue's visibility timeout the template's (960 s):
    /// a wake-up a killed host had received comes back when its lease runs out (60 s,
    /// `turnstone_aws::LEASE`), not after the visibility timeout.
    async fn aws() -> Self {
        use turnstone_aws::moto;
        let (table, queue) = (moto::unique("crash"), moto::unique("crash"));
        let settings = turnstone_aws::QueueSettings {
            max_receive_count: None,
            ..turnstone_aws::QueueSettings::default()
        };
        assert_eq!(settings.visibility_timeout, Duration::from_secs(960), "the template's");
        moto::config(&table, &queue).open(&moto::clients().await, true, &settings).await.expect("moto");
        Backing::Aws { table, queue }
    }
}

impl Server {
    /// Starts `turnstone serve` on a free port and waits until it answers.
    async fn start(config: &Path, data: &Path, log: PathBuf) -> Server {
        Self::start_on(config, data, log, &Backing::Local).await
    }

    /// [`Server::start`] on `backing`.
    async fn start_on(config: &Path, data: &Path, log: PathBuf, backing: &Backing) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_turnstone"));
        command.arg("serve").arg("--config").arg(config).arg("--addr").arg(&addr).arg("--data-dir").arg(data);
        if let Backing::Aws { table, queue } = backing {
            command
                .args(["--backend", "aws", "--endpoint-url", turnstone_aws::moto::endpoint()])
                .args(["--table", table.as_str(), "--queue", queue.as_str()])
                .env("AWS_ACCESS_KEY_ID", "testing")
                .env("AWS_SECRET_ACCESS_KEY", "testing")
                .env("AWS_REGION", "us-east-1");
        }
        let child = command
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start turnstone serve");
        let server = Server { child, api: ApiClient::new(format!("http://{addr}")), log };
        let started = Instant::now();
        loop {
            if let Ok(response) = server.api.http().get(format!("{}/healthz", server.api.url())).send().await
                && response.status().is_success()
            {
                return server;
            }
            assert!(started.elapsed() < PATIENCE, "turnstone serve did not come up:\n{}", server.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL, and reap the process.
    fn kill(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a crash test measured, printed at the end.
struct Timings {
    label: &'static str,
    start: Instant,
    marks: Vec<(&'static str, Duration)>,
}

impl Timings {
    fn new(label: &'static str) -> Self {
        Timings { label, start: Instant::now(), marks: Vec::new() }
    }

    fn mark(&mut self, what: &'static str) {
        self.marks.push((what, self.start.elapsed()));
    }

    fn print(&self) {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{} timings:", self.label).unwrap();
        for (what, at) in &self.marks {
            writeln!(out, "  {at:>10.3?}  {what}").unwrap();
        }
    }
}

/// Checks the completed turn: the transcript holds one user message, one assistant message
/// with both tool calls, exactly one tool message per call (in completion order) with the
/// worker's result, and the final answer; the message tree holds nothing else.
async fn assert_transcript_once(api: &ApiClient, session: &str, ledger: &Ledger) {
    let messages = api.messages(session).await;
    assert_eq!(messages.len(), 5, "{messages:#?}");
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["content"], "Add 20 and 22, and shout done.");
    assert_eq!(messages[1]["role"], "assistant");
    let calls: Vec<&str> =
        messages[1]["tool_calls"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(calls, ["call_add", "call_up"]);
    let mut answered: Vec<&str> = Vec::new();
    for tool in &messages[2..4] {
        assert_eq!(tool["role"], "tool", "{tool}");
        let id = tool["tool_call_id"].as_str().unwrap();
        answered.push(id);
        // The tool message carries the result of an execution of that call.
        let results: Vec<String> = ledger
            .executed
            .values()
            .filter(|e| e.call_id == id)
            .map(|e| match &e.result {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        assert!(results.iter().any(|r| tool["content"] == r.as_str()), "{tool} not in {results:?}");
    }
    answered.sort_unstable();
    assert_eq!(answered, ["call_add", "call_up"], "exactly one tool message per call");
    assert_eq!(messages[4]["role"], "assistant");
    assert_eq!(messages[4]["content"], "42 and DONE.");
    let tree = api.message_tree(session).await;
    assert_eq!(tree["nodes"].as_array().unwrap().len(), 5, "no duplicate or stray messages: {tree:#}");
}

/// Each (call id, attempt) ran at most once (the ledger's keys); a call ran at a later attempt
/// only after the earlier attempt's deadline had passed; every call ran at least once.
fn assert_executions(ledger: &Ledger) {
    for call_id in ["call_add", "call_up"] {
        let runs: Vec<&Execution> = ledger.executed.values().filter(|e| e.call_id == call_id).collect();
        assert!(!runs.is_empty(), "{call_id} never ran");
        for pair in runs.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            let deadline = earlier.deadline.expect("tool attempts have deadlines here");
            assert!(
                later.at >= deadline,
                "{call_id} ran at attempt {} before attempt {}'s deadline passed",
                later.attempt,
                earlier.attempt
            );
        }
    }
}

/// The worker holds the first `tool.execute` (already executed) while the process is killed.
/// After the restart, the claimed delivery times out, the decision and the tool call are
/// retried, the redelivery of the same (call, attempt) is answered from the worker's ledger,
/// and the turn completes.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_tool_execution_then_restart() {
    let mut timings = Timings::new("kill during tool.execute");
    let dir = tempfile::tempdir().unwrap();
    let openai = FakeOpenAi::start().await;
    openai.push(tool_calls());
    openai.set_default(Reply::text("42 and DONE."));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let gate = Gate::new();
    let worker = ledger_worker(ledger.clone(), Some(gate.clone()), false).await;
    let config_file = dir.path().join("turnstone.toml");
    std::fs::write(&config_file, config(&openai, &worker)).unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");

    let first = Server::start(&config_file, &data, log.clone()).await;
    timings.mark("first process up");
    let input = json!({"type": "client.message", "agent_id": "calc", "turn_id": "turn-crash",
        "message": {"role": "user", "content": "Add 20 and 22, and shout done."}});
    let turn_id = first.api.submit_ok("s-crash", &input).await;
    assert_eq!(turn_id, "turn-crash");
    let held = worker.wait_for(PATIENCE, |r| r.trigger_name() == "tool.execute").await;
    timings.mark("first tool.execute held by the worker");
    first.kill();
    timings.mark("killed (SIGKILL)");
    gate.open(); // the held answer goes to a dead connection

    let second = Server::start(&config_file, &data, log.clone()).await;
    timings.mark("restarted");
    let turn = second.api.wait_turn("s-crash", "turn-crash").await;
    timings.mark("turn completed");
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}\n{}", second.log());
    assert_eq!(turn.data, Some(json!("42 and DONE.")));

    let ledger = ledger.lock().unwrap().clone();
    assert_transcript_once(&second.api, "s-crash", &ledger).await;
    assert_executions(&ledger);
    // The held delivery's pair was delivered again after the restart and not executed again.
    let Trigger::ToolExecute(t) = &held.request.trigger else { unreachable!() };
    assert!(ledger.executed.contains_key(&(t.id.clone(), t.attempt)));
    assert_eq!(openai.request_count(), 2, "one model call before the crash, one after the tools");
    let summary = second.api.summary("s-crash").await;
    assert_eq!(summary.status, SessionStatus::Idle);
    assert_eq!(summary.active_turn, None);
    println!(
        "executions: {:?}; answered from the ledger: {:?}",
        ledger.executed.keys().collect::<Vec<_>>(),
        ledger.redelivered
    );
    second.kill();
    timings.print();
}

/// The model holds its first answer while the process is killed. After the restart, the
/// claimed model call times out and is retried; the tools run once each; the turn completes
/// with the assistant's tool-call message recorded once.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_model_call_then_restart() {
    let mut timings = Timings::new("kill during the model call");
    let dir = tempfile::tempdir().unwrap();
    let openai = FakeOpenAi::start().await;
    openai.push(tool_calls().delay(Duration::from_secs(60))); // never answered in time
    openai.push(tool_calls());
    openai.set_default(Reply::text("42 and DONE."));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let worker = ledger_worker(ledger.clone(), None, false).await;
    let config_file = dir.path().join("turnstone.toml");
    std::fs::write(&config_file, config(&openai, &worker)).unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");

    let first = Server::start(&config_file, &data, log.clone()).await;
    timings.mark("first process up");
    let input = json!({"type": "client.message", "agent_id": "calc", "turn_id": "turn-crash",
        "message": {"role": "user", "content": "Add 20 and 22, and shout done."}});
    first.api.submit_ok("s-crash", &input).await;
    let started = Instant::now();
    while openai.request_count() == 0 {
        assert!(started.elapsed() < PATIENCE, "the model was never called:\n{}", first.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    timings.mark("model call held by the model");
    first.kill();
    timings.mark("killed (SIGKILL)");

    let second = Server::start(&config_file, &data, log.clone()).await;
    timings.mark("restarted");
    let turn = second.api.wait_turn("s-crash", "turn-crash").await;
    timings.mark("turn completed");
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}\n{}", second.log());

    let ledger = ledger.lock().unwrap().clone();
    assert_transcript_once(&second.api, "s-crash", &ledger).await;
    assert_executions(&ledger);
    assert_eq!(ledger.executed.len(), 2, "each tool ran once: {:?}", ledger.executed.keys());
    assert!(ledger.redelivered.is_empty());
    assert_eq!(openai.request_count(), 3, "the lost call, its retry, and the call after the tools");
    // The worker saw the model's tool calls once: a single llm.finished with tool calls.
    let finished_with_calls = worker
        .records()
        .iter()
        .filter(|r| matches!(&r.request.trigger, Trigger::LlmFinished(f) if f.message.as_ref().is_some_and(|m| m.tool_calls.is_some())))
        .count();
    assert_eq!(finished_with_calls, 1);
    second.kill();
    timings.print();
}

/// The host is killed while it compacts a session's conversation (issue 40): the summarizing
/// model call is in flight. After the restart the claimed model call passes its deadline and is
/// retried; its retry compacts again (the lost summary was never recorded) and the turn
/// completes. The log holds one compaction, and every message.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_compaction_then_restart() {
    let dir = tempfile::tempdir().unwrap();
    let openai = FakeOpenAi::start().await;
    openai.set_default(Reply::text("Noted. ".repeat(40)));
    let config = |window: &str| {
        format!(
            r#"
[defaults]
llm = {{ timeout_secs = 2, max_retries = 2, backoff_base_secs = 0.2, backoff_max_secs = 0.5 }}

[llm.m]
type = "openai"
base_url = "{}"

[agent.notes]
model = "gpt-fake"
llm = "m"
{window}
"#,
            openai.base_url()
        )
    };
    let config_file = dir.path().join("turnstone.toml");
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");
    let turn = |n: usize| {
        json!({"type": "client.message", "agent_id": "notes", "turn_id": format!("turn-{n}"),
            "message": {"role": "user", "content": format!("Note {n}: {}", "remember this. ".repeat(60))}})
    };
    // Six turns with room to spare, then a window they no longer fit: the next model call
    // compacts first, and the summary it asks for is held by the model.
    std::fs::write(&config_file, config("context_window = 100000")).unwrap();
    let first = Server::start(&config_file, &data, log.clone()).await;
    for n in 0..6 {
        first.api.submit_ok("s-compact", &turn(n)).await;
        let done = first.api.wait_turn("s-compact", &format!("turn-{n}")).await;
        assert_eq!(done.status, TurnStatus::Completed, "{done:?}");
    }
    first.kill();
    std::fs::write(&config_file, config("context_window = 2600\nmax_output_tokens = 256")).unwrap();
    openai.push(Reply::text("lost summary").delay(Duration::from_secs(60)));
    let before = openai.request_count();
    let second = Server::start(&config_file, &data, log.clone()).await;
    second.api.submit_ok("s-compact", &turn(6)).await;
    let started = Instant::now();
    while openai.request_count() == before {
        assert!(started.elapsed() < PATIENCE, "no summary was asked for:\n{}", second.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let held = openai.last_request().body.to_string();
    assert!(held.contains("compact the transcript"), "the held request is the summarizing call: {held}");
    second.kill();

    let third = Server::start(&config_file, &data, log.clone()).await;
    let done = third.api.wait_turn("s-compact", "turn-6").await;
    assert_eq!(done.status, TurnStatus::Completed, "{done:?}\n{}", third.log());
    let events = third.api.events("s-compact", 0).await;
    let compactions: Vec<&Value> =
        events.iter().map(|e| &e.event).filter(|e| e["type"] == "context_compacted").collect();
    assert_eq!(compactions.len(), 1, "one compaction landed: {compactions:?}");
    let messages = third.api.messages("s-compact").await;
    assert_eq!(messages.iter().filter(|m| m["role"] == "user").count(), 7, "every message is there once");
    assert_eq!(messages.iter().filter(|m| m.get("compaction").is_some()).count(), 1);
    assert_eq!(messages.iter().filter(|m| m["role"] == "assistant").count(), 7);
    // The request answered after the restart sent the summary, not the oldest notes.
    let last = openai.last_request().body.to_string();
    assert!(!last.contains("Note 0:"), "the covered notes are not sent again");
    third.kill();
}

/// An MCP tool call is in flight (the Python SDK's server runs `slow`) when the host is killed.
/// After the restart the claimed call passes its deadline: the call may have reached the tool,
/// which does not say repeating it is harmless, so it is not sent again; the model is told it
/// may have run, and the turn finishes. The server's log shows one run.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_an_mcp_tool_call_then_restart() {
    use turnstone_mcp::testing::{HttpServer, Log, free_port};
    let dir = tempfile::tempdir().unwrap();
    let runs = Log::new("crash");
    let port = free_port();
    let _server = HttpServer::python(port, None, Some(&runs.0));
    let config = format!(
        "[llm.scripted]\ntype = \"scripted\"\n\n[agent.demo]\nmodel = \"scripted-1\"\n\n\
         [[agent.demo.mcp]]\nname = \"files\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n\
         approve = \"never\"\ntimeout_secs = 3\n"
    );
    let config_file = dir.path().join("turnstone.toml");
    std::fs::write(&config_file, config).unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");

    let first = Server::start(&config_file, &data, log.clone()).await;
    let input = json!({"type": "client.message", "agent_id": "demo", "turn_id": "turn-mcp",
        "message": {"role": "user", "content": r#"/tool files__slow {"seconds": 2.5, "marker": "once"}"#}});
    first.api.submit_ok("s-mcp", &input).await;
    assert!(runs.wait_for("once", PATIENCE).await, "the tool never ran:\n{}", first.log());
    first.kill();

    let second = Server::start(&config_file, &data, log.clone()).await;
    let turn = second.api.wait_turn("s-mcp", "turn-mcp").await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}\n{}", second.log());
    let messages = second.api.messages("s-mcp").await;
    let tool = messages.iter().find(|m| m["role"] == "tool").expect("the call was answered");
    let answer = tool["content"].as_str().unwrap();
    assert!(answer.contains("may have run") && answer.contains("not sent again"), "{answer}");
    // Long enough for a second run to have logged: the tool ran once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(runs.lines(), ["once"], "{}", second.log());
    second.kill();
}

/// Sessions started before each kill.
const SESSIONS_PER_ROUND: usize = 6;
/// Kills (and restarts) per run.
const KILLS: usize = 3;

/// `kill -9` at random points while many turns run at once (each model call asks for two
/// worker tools), a restart after each, and the invariants checked from outside once every
/// turn is done. `TURNSTONE_KILL_SEED` replays a run.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_at_random_points_across_concurrent_turns() {
    kill_9_at_random_points(Backing::Local).await;
}

/// The same on the AWS backend: DynamoDB and SQS on moto.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_at_random_points_on_the_aws_backend() {
    kill_9_at_random_points(Backing::aws().await).await;
}

async fn kill_9_at_random_points(backing: Backing) {
    let seed = std::env::var("TURNSTONE_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_u64);
    println!(
        "seed {seed} (replay: TURNSTONE_KILL_SEED={seed} cargo test -p turnstone --test crash kill_9_at_random)"
    );
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let worker = ledger_worker(ledger.clone(), None, true).await;
    let config_file = dir.path().join("turnstone.toml");
    std::fs::write(&config_file, scripted_config(&worker)).unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");

    let mut sessions: Vec<(String, u64)> = Vec::new();
    let mut server = Server::start_on(&config_file, &data, log.clone(), &backing).await;
    for round in 0..KILLS {
        for i in 0..SESSIONS_PER_ROUND {
            let n = (round * SESSIONS_PER_ROUND + i) as u64;
            let (session, input) = calc_turn(n);
            server.api.submit_ok(&session, &input).await;
            sessions.push((session, n));
        }
        tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
        server.kill();
        server = Server::start_on(&config_file, &data, log.clone(), &backing).await;
    }
    let executions = assert_survived(&server.api, &sessions, &ledger).await;
    let redelivered = ledger.lock().unwrap().redelivered.len();
    println!(
        "{} turns, {KILLS} kills, {executions} tool executions, {redelivered} redeliveries answered from the ledger",
        sessions.len()
    );
    server.kill();
}

//! The kill tests' worker and invariants, shared by the local host's (`kill -9` of `turnstone
//! serve`, `functions/local/tests/crash.rs`) and the AWS topology's (dispatch invocations
//! killed and throttled, `tests/tests/topology.rs`).
//!
//! The worker behaves as the protocol asks: it records executions by (call id, attempt) and
//! answers a redelivery of the same pair from that record instead of executing again; the
//! invariants are checked from outside, through the HTTP API, once every turn has ended.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use turnstone_engine::ids::CallId;
use turnstone_engine::protocol::Trigger;
use turnstone_engine::session::TurnStatus;
use turnstone_engine::time::Timestamp;
use turnstone_runtime::clock::{Clock, SystemClock};

use crate::{ApiClient, FakeAnswer, FakeWorker, Gate, tool_answer};

/// One tool execution the worker carried out (redeliveries of the same pair excluded).
#[derive(Debug, Clone)]
pub struct Execution {
    pub call_id: CallId,
    pub attempt: u32,
    /// The attempt's deadline, from the trigger.
    pub deadline: Option<Timestamp>,
    /// When the worker received it.
    pub at: Timestamp,
    pub result: Value,
}

/// The worker's memory: what it executed, keyed by (call id, attempt).
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    pub executed: BTreeMap<(CallId, u32), Execution>,
    /// Deliveries answered from the ledger (the same pair delivered again).
    pub redelivered: Vec<(CallId, u32)>,
}

fn execute(name: &str, args: &Value) -> Value {
    match name {
        "add" => json!(args["a"].as_f64().unwrap() + args["b"].as_f64().unwrap()),
        "upper" => json!(args["text"].as_str().unwrap().to_uppercase()),
        other => panic!("unknown tool {other}"),
    }
}

/// A worker that executes tools once per (call id, attempt); with `hold`, the first
/// `tool.execute` it receives is executed at once but answered only when the gate opens; with
/// `pause`, every answer waits up to a quarter second (derived from the decision), so that
/// kills land in the middle of steps.
pub async fn ledger_worker(ledger: Arc<Mutex<Ledger>>, hold: Option<Gate>, pause: bool) -> FakeWorker {
    let first = Arc::new(Mutex::new(true));
    FakeWorker::start(None, move |request, _| {
        let answer = answer(&ledger, &first, hold.as_ref(), request);
        if !pause {
            return answer;
        }
        let wait = request
            .decision_id
            .as_str()
            .bytes()
            .fold(7_u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        FakeAnswer::delayed(Duration::from_millis(wait % 250), answer)
    })
    .await
}

/// The worker's answer to `request` (see [`ledger_worker`]).
fn answer(
    ledger: &Mutex<Ledger>,
    first: &Mutex<bool>,
    hold: Option<&Gate>,
    request: &turnstone_engine::protocol::DecisionRequest,
) -> FakeAnswer {
    match &request.trigger {
        Trigger::ToolExecute(t) if request.proposed.is_empty() => {
            let key = (t.id.clone(), t.attempt);
            let result = {
                let mut ledger = ledger.lock().unwrap();
                if let Some(done) = ledger.executed.get(&key) {
                    let result = done.result.clone();
                    ledger.redelivered.push(key);
                    result
                } else {
                    let value = match &t.input {
                        turnstone_engine::protocol::ToolInput::Valid { value } => value.clone(),
                        other => panic!("invalid input {other:?}"),
                    };
                    let result = execute(&t.name, &value);
                    let execution = Execution {
                        call_id: t.id.clone(),
                        attempt: t.attempt,
                        deadline: t.deadline.as_deref().and_then(Timestamp::parse_rfc3339),
                        at: SystemClock.now(),
                        result: result.clone(),
                    };
                    ledger.executed.insert(key, execution);
                    result
                }
            };
            let answer = FakeAnswer::Respond(tool_answer(Ok(result)));
            let mut first = first.lock().unwrap();
            match hold {
                Some(gate) if *first => {
                    *first = false;
                    FakeAnswer::held(gate, answer)
                }
                _ => answer,
            }
        }
        _ => FakeAnswer::Accept,
    }
}

/// The `calc` agent (tools `add` and `upper`, run by `worker`) on a model of `[llm.m]` (`llm`,
/// its settings), with short policies: 2 s timeouts, 0.2-0.5 s backoffs.
pub fn calc_config(llm: &str, model: &str, worker: &FakeWorker) -> String {
    format!(
        r#"
[defaults]
llm = {{ timeout_secs = 2, max_retries = 2, backoff_base_secs = 0.2, backoff_max_secs = 0.5 }}
tool = {{ timeout_secs = 2, max_retries = 3, backoff_base_secs = 0.2, backoff_max_secs = 0.5 }}
decision = {{ timeout_secs = 2, max_retries = 4, backoff_base_secs = 0.2, backoff_max_secs = 0.5 }}

[llm.m]
{llm}

[agent.calc]
model = "{model}"
llm = "m"
worker = "{}"

[[agent.calc.tools]]
name = "add"
input = {{ type = "object", properties = {{ a = {{ type = "number" }}, b = {{ type = "number" }} }}, required = ["a", "b"] }}

[[agent.calc.tools]]
name = "upper"
input = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}
"#,
        worker.url()
    )
}

/// A small seeded generator, so a failing run can be replayed with its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// A worker agent on the scripted model: `/tool` lines are its tool calls, run by the worker.
pub fn scripted_config(worker: &FakeWorker) -> String {
    calc_config("type = \"scripted\"", "scripted", worker)
}

/// Checks, from outside, what a run of concurrent turns killed at random points left: each
/// accepted input's turn completed once with the right answer; every tool call on each path has
/// exactly one result; each (call, attempt) ran at most once and a call's next attempt ran only
/// after its earlier attempt's deadline; and each session's log replays to what it serves.
pub async fn assert_survived(api: &ApiClient, sessions: &[(String, u64)], ledger: &Mutex<Ledger>) -> usize {
    // A wake-up a dead host or invocation had taken comes back when its lease runs out (60 s).
    for (session, _) in sessions {
        api.wait_turn_within(session, &format!("turn-{session}"), Duration::from_secs(150)).await;
    }
    // Every turn ended: the worker's ledger is complete (and no lock is held across an await,
    // as the worker takes it to answer).
    let ledger = ledger.lock().unwrap().clone();
    for (session, n) in sessions {
        let turn = api.wait_turn(session, &format!("turn-{session}")).await;
        assert_eq!(turn.status, TurnStatus::Completed, "{session}: {turn:?}");
        // One line per tool result, in the order the results came.
        let mut lines: Vec<String> = turn
            .data
            .as_ref()
            .and_then(Value::as_str)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        lines.sort();
        assert_eq!(
            lines,
            [format!("add returned: {}.0", n + 1), format!("upper returned: S{n}")],
            "{session}"
        );
        let messages = api.messages(session).await;
        for message in &messages {
            for call in message["tool_calls"].as_array().into_iter().flatten() {
                let id = call["id"].as_str().unwrap();
                let answers = messages.iter().filter(|m| m["tool_call_id"] == id).count();
                assert_eq!(answers, 1, "{session}: tool call {id} has {answers} results: {messages:#?}");
            }
        }
        let mut replayed = turnstone_engine::session::Session::new(session.as_str());
        for logged in api.events(session, 0).await {
            let event: turnstone_engine::session::Event = serde_json::from_value(logged.event).unwrap();
            replayed.apply(&event);
        }
        let path: Vec<Value> =
            replayed.tree().active_path().into_iter().map(|m| serde_json::to_value(m).unwrap()).collect();
        assert_eq!(path, messages, "{session}: the log replays to the path it serves");
    }
    let mut by_call: BTreeMap<&CallId, Vec<&Execution>> = BTreeMap::new();
    for execution in ledger.executed.values() {
        by_call.entry(&execution.call_id).or_default().push(execution);
    }
    for (call_id, runs) in by_call {
        for pair in runs.windows(2) {
            let deadline = pair[0].deadline.expect("tool attempts have deadlines here");
            assert!(
                pair[1].at >= deadline,
                "{call_id} ran attempt {} before attempt {}'s deadline",
                pair[1].attempt,
                pair[0].attempt
            );
        }
    }
    assert!(ledger.executed.len() >= 2 * sessions.len(), "every tool ran: {:?}", ledger.executed.keys());
    ledger.executed.len()
}

/// The `n`th turn of a run: session `s-<n>`, turn `turn-s-<n>`, the `calc` agent asked for
/// `add(n, 1)` and `upper("s<n>")` in one model call, as [`assert_survived`] expects.
pub fn calc_turn(n: u64) -> (String, Value) {
    let session = format!("s-{n}");
    let text = format!("/tool add {{\"a\": {n}, \"b\": 1}}\n/tool upper {{\"text\": \"s{n}\"}}");
    let input = json!({"type": "client.message", "agent_id": "calc", "turn_id": format!("turn-{session}"),
        "message": {"role": "user", "content": text}});
    (session, input)
}

//! A seeded simulation: random client inputs, worker answers, model results, faults,
//! timeouts and duplicates, across a parent session and its sub-agents. The harness checks
//! the invariants after every step (replay == state, lossless snapshots, one live decision,
//! settle-at-most-once at the current attempt, queued turns start once); this file adds the
//! dangling-tool-call check at every step.
//!
//! Run one seed with `TURNSTONE_SIM_SEED=<n> cargo test -p turnstone-engine --test simulation`;
//! the long sweep with `TURNSTONE_SIM_SEEDS=5000 TURNSTONE_SIM_STEPS=300 cargo test --release -p
//! turnstone-engine --test simulation` (`scripts/sim`). A failing seed is printed; keep it in
//! `REGRESSION_SEEDS` with the steps it took.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::*;
use serde_json::json;
use turnstone_engine::ids::{CallId, IdMinter, InterruptId, SessionId, TurnId};
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;

/// Seeds that once failed, with the steps they took to fail: a late result after `done` left
/// unanswered on the path (828: a tool's; 961: a model reply's tool calls).
const REGRESSION_SEEDS: &[(u64, usize)] = &[(828, 300), (961, 300)];
/// Seeds and steps per seed of a CI run; `TURNSTONE_SIM_SEEDS` and `TURNSTONE_SIM_STEPS` set a
/// longer sweep.
const SEEDS: u64 = 200;
const STEPS: usize = 120;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Rng(IdMinter);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len() as u64) as usize])
    }
}

/// Prints the seed when a simulation panics.
struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("simulation failed with seed {} (TURNSTONE_SIM_SEED={0})", self.0);
        }
    }
}

fn root_agent() -> AgentConfig {
    let mut a = AgentConfig::new("m");
    a.system = Some("be brief".into());
    a.tools = Some(vec![
        AgentTool {
            name: "time".into(),
            description: None,
            input: None,
            output: None,
            handler: None,
            approval: None,
            mcp: None,
        },
        AgentTool {
            name: "weather".into(),
            description: None,
            input: Some(json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})),
            output: Some(json!({"type":"string"})),
            handler: None,
            approval: None,
            mcp: None,
        },
        AgentTool {
            name: "pick".into(),
            description: None,
            input: None,
            output: None,
            handler: Some(ToolHandler::Client),
            approval: None,
            mcp: None,
        },
        AgentTool {
            name: "delete".into(),
            description: None,
            input: None,
            output: None,
            handler: None,
            approval: Some(Approval::Always),
            mcp: None,
        },
        AgentTool {
            name: "files__read".into(),
            description: None,
            input: None,
            output: None,
            handler: Some(ToolHandler::Server),
            approval: None,
            mcp: Some(McpToolSource {
                server: "files".into(),
                tool: "read".into(),
                timeout_secs: 30.0,
                idempotent: false,
            }),
        },
    ]);
    a.sub_agents = Some(vec![SubAgent { id: "helper".into(), description: None }]);
    a
}

fn model_answer(rng: &mut Rng, n: &mut u64) -> Result<LlmResponse, CallError> {
    *n += 1;
    let roll = rng.below(100);
    if roll < 40 {
        return Ok(reply(&format!("answer {n}")));
    }
    if roll < 75 {
        let k = 1 + rng.below(3);
        let calls: Vec<(String, String, String)> = (0..k)
            .map(|i| {
                let (name, args) = match rng.below(8) {
                    0 => ("time", "{}".to_owned()),
                    6 => ("files__read", r#"{"path":"a"}"#.to_owned()),
                    1 => ("weather", r#"{"city":"Oslo"}"#.to_owned()),
                    2 => ("weather", r#"{"town":1}"#.to_owned()),
                    3 => ("pick", "{}".to_owned()),
                    4 => ("helper", r#"{"message":"sub task"}"#.to_owned()),
                    5 => ("delete", "{}".to_owned()),
                    _ => ("nonexistent", "not json".to_owned()),
                };
                (format!("tc{n}_{i}"), name.to_owned(), args)
            })
            .collect();
        let refs: Vec<(&str, &str, &str)> =
            calls.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())).collect();
        return Ok(tool_calls(&refs));
    }
    if roll < 82 {
        let mut r = reply("cut off");
        r.finish_reason = Some("length".into());
        return Ok(r);
    }
    let retryable = roll < 95;
    Err(CallError {
        error: format!("model failure {n}"),
        code: Some(ErrorCode::ProviderError),
        detail: None,
        retryable,
    })
}

/// The worker's answer to a decision.
fn worker_answer(rng: &mut Rng, req: &DecisionRequest) -> Command {
    let decision_id = req.decision_id.clone();
    let attempt = req.attempts;
    let answer = |response: DecisionResponse| Command::Answer {
        decision_id: decision_id.clone(),
        attempt,
        response: Box::new(response),
        ignored_fields: Vec::new(),
        transcript: Default::default(),
    };
    let roll = rng.below(100);
    if roll < 6 {
        return Command::DeliveryFailed { decision_id, attempt, error: "worker 503".into(), retryable: true };
    }
    if roll < 8 {
        return Command::DeliveryFailed {
            decision_id,
            attempt,
            error: "worker 400".into(),
            retryable: false,
        };
    }
    if roll < 10 {
        // Invalid: message.send to a session that is not a child.
        let bad = Action::MessageSend(MessageSendAction {
            session_id: "stranger".into(),
            message: DraftMessage::user("x"),
        });
        return answer(DecisionResponse { actions: Some(vec![bad]), ..Default::default() });
    }
    match &req.trigger {
        Trigger::ToolExecute(t) if !req.proposed.is_empty() => {
            let _ = t;
            answer(req.proposed.clone())
        }
        Trigger::ToolExecute(t) => {
            let action = match rng.below(10) {
                0..=5 => Action::ToolResult(ToolResultAction {
                    id: None,
                    attempt: None,
                    result: json!(format!("{} ok", t.name)),
                }),
                6 => Action::ToolError(CallErrorAction {
                    id: None,
                    attempt: None,
                    error: "flaky".into(),
                    retryable: Some(true),
                    code: None,
                    detail: None,
                }),
                7 => Action::ToolError(CallErrorAction {
                    id: None,
                    attempt: None,
                    error: "broken".into(),
                    retryable: None,
                    code: None,
                    detail: None,
                }),
                _ => return answer(DecisionResponse::default()), // deferred: settled later
            };
            answer(DecisionResponse { actions: Some(vec![action]), ..Default::default() })
        }
        _ if roll < 14 => answer(DecisionResponse::default()),
        _ if roll < 18 => {
            let mut response = req.proposed.clone();
            let interrupt = Action::Interrupt(InterruptAction {
                interrupt_id: None,
                reason: "approve?".into(),
                payload: None,
            });
            response.actions.get_or_insert_with(Vec::new).push(interrupt);
            answer(response)
        }
        _ => {
            // Now and then a delegation with retries (timeouts and retryable child failures).
            let mut response = req.proposed.clone();
            if rng.chance(50) {
                for action in response.actions.iter_mut().flatten() {
                    if let Action::SubAgentSpawn(spawn) = action {
                        spawn.retry = Some(RetryPolicy {
                            timeout_secs: Some(20.0),
                            max_retries: 2,
                            backoff_base_secs: 1.0,
                            backoff_max_secs: 2.0,
                        });
                    }
                }
            }
            answer(response)
        }
    }
}

fn run(seed: u64, steps: usize) {
    let _guard = SeedGuard(seed);
    let mut rng = Rng(IdMinter::new(seed));
    let has_worker = rng.chance(60);
    let mut world = World::default();
    world.sessions.insert("root".into(), harness("root", init("root", Some(root_agent()), has_worker)));
    let mut answers = 0u64;
    let mut pending_duplicate: Option<(SessionId, Command)> = None;
    for _ in 0..steps {
        // Replay an earlier command now and then: at-least-once delivery everywhere.
        if let Some((id, cmd)) = pending_duplicate.take()
            && rng.chance(50)
            && let Some(h) = world.sessions.get_mut(&id)
        {
            let _ = h.try_exec(cmd);
        }
        let ids: Vec<SessionId> = world.sessions.keys().cloned().collect();
        let id = rng.pick(&ids).cloned().unwrap();
        let h = world.sessions.get_mut(&id).unwrap();
        let agent_id = h.session.agent_id().to_owned();
        match rng.below(12) {
            0 | 1 if id == "root" && rng.chance(10) => {
                // Take back a waiting turn, or turn the queue around.
                let waiting: Vec<TurnId> = h.session.queued_turn_ids().to_vec();
                let cmd = if rng.chance(50) {
                    Command::Withdraw {
                        turn_id: rng.pick(&waiting).cloned().unwrap_or_else(|| "t-none".into()),
                    }
                } else {
                    Command::Reorder { order: waiting.into_iter().rev().collect() }
                };
                let _ = h.try_exec(cmd);
            }
            0 | 1 if id == "root" && rng.chance(20) => {
                // Steer the running turn (or start one).
                let input = ClientMessageInput {
                    agent_id,
                    turn_id: None,
                    message: DraftMessage::user("steer"),
                    stream: None,
                    client: None,
                };
                let _ = h.try_exec(Command::Steer { input });
            }
            0 | 1 if id == "root" => {
                let mut cmd = message(&agent_id, "hello");
                if let Command::Submit { queue, .. } = &mut cmd {
                    *queue = rng.chance(30);
                }
                let _ = h.try_exec(cmd);
            }
            2 if id == "root" => {
                // A client view: an edit (fork) at a random point, an echo, or answers.
                let path: Vec<DraftMessage> =
                    h.session.tree().active_path().iter().map(|m| m.to_draft()).collect();
                let cut = rng.below(path.len() as u64 + 1) as usize;
                let mut view = path[..cut].to_vec();
                match rng.below(3) {
                    0 => view.push(DraftMessage::user("edited")),
                    1 => {
                        for c in h.session.calls().iter().filter(|c| c.is_client_tool() && c.is_pending()) {
                            view = path.clone();
                            view.push(DraftMessage::tool_result(c.id.clone(), "pick", "blue"));
                        }
                    }
                    _ => {}
                }
                let _ = h.try_exec(Command::Submit {
                    input: ClientInput::Messages(ClientMessagesInput {
                        agent_id,
                        turn_id: None,
                        messages: view,
                        stream: None,
                        client: None,
                    }),
                    queue: rng.chance(20),
                    origin: TurnOrigin::Client,
                });
            }
            3 => {
                let open: Vec<InterruptId> = h.session.interrupts().iter().map(|i| i.id.clone()).collect();
                let interrupt_id = rng.pick(&open).cloned().unwrap_or_else(|| "unknown".into());
                let _ = h.try_exec(Command::Submit {
                    input: ClientInput::InterruptResume(InterruptResumeInput {
                        interrupt_id,
                        payload: Some(json!(1)),
                    }),
                    queue: false,
                    origin: TurnOrigin::Client,
                });
            }
            4 if rng.chance(30) => {
                let _ = h.try_exec(Command::Cancel { reason: "stop".into() });
            }
            5 if rng.chance(40) => {
                // A person approves or denies a call waiting for approval (now and then one
                // that does not wait).
                let waiting: Vec<CallId> =
                    h.session.calls().iter().filter(|c| c.awaiting_approval).map(|c| c.id.clone()).collect();
                let id_ = rng.pick(&waiting).cloned().unwrap_or_else(|| "tc1_0".into());
                let cmd = Command::Submit {
                    input: ClientInput::ToolApproval(ToolApprovalInput {
                        id: id_,
                        approved: rng.chance(60),
                        reason: Some("no".into()),
                    }),
                    queue: false,
                    origin: TurnOrigin::Client,
                };
                let _ = h.try_exec(cmd.clone());
                pending_duplicate = Some((id.clone(), cmd));
            }
            5 => {
                // Settle something from outside: a client tool, or a deferred worker tool.
                let open: Vec<(CallId, u32, bool)> = h
                    .session
                    .calls()
                    .iter()
                    .filter(|c| c.is_pending() && c.kind() == CallKind::ToolCall)
                    .map(|c| (c.id.clone(), c.attempt, c.is_client_tool()))
                    .collect();
                if let Some((call_id, attempt, client)) = rng.pick(&open).cloned() {
                    let attempt = if rng.chance(15) { Some(attempt + 1) } else { Some(attempt) };
                    let cmd = if client {
                        Command::Submit {
                            input: ClientInput::ToolResult(ToolResultInput {
                                id: call_id,
                                attempt,
                                result: Some(json!("chosen")),
                            }),
                            queue: false,
                            origin: TurnOrigin::Client,
                        }
                    } else {
                        Command::Settle {
                            action: Action::ToolResult(ToolResultAction {
                                id: Some(call_id),
                                attempt,
                                result: json!("late ok"),
                            }),
                        }
                    };
                    let _ = h.try_exec(cmd.clone());
                    pending_duplicate = Some((id.clone(), cmd));
                }
            }
            6 => {
                h.advance(rng.below(200_000));
            }
            _ => {
                // Perform one due effect.
                let plan = h.session.plan(h.now);
                let Some(effect) = rng.pick(&plan.effects).cloned() else {
                    if let Some(wake) = plan.wake_at {
                        h.now = wake;
                    }
                    continue;
                };
                match effect {
                    Effect::Tick => {
                        h.exec(Command::Tick);
                    }
                    Effect::DeliverDecision { decision_id, attempt } => {
                        h.exec(Command::ClaimDecision { decision_id, attempt });
                        let req = h.session.decision_request().unwrap();
                        let cmd = worker_answer(&mut rng, &req);
                        h.exec(cmd.clone());
                        pending_duplicate = Some((id.clone(), cmd));
                    }
                    Effect::RunLlmCall { call_id, attempt } => {
                        h.exec(Command::ClaimLlmCall { call_id: call_id.clone(), attempt });
                        if rng.chance(10) {
                            continue; // the host crashed mid-call: the deadline will time it out
                        }
                        let outcome = model_answer(&mut rng, &mut answers);
                        let cmd = Command::LlmCallFinished { call_id, attempt, outcome };
                        h.exec(cmd.clone());
                        pending_duplicate = Some((id.clone(), cmd));
                    }
                    Effect::RunToolCall { call_id, attempt } => {
                        h.exec(Command::ClaimToolCall { call_id: call_id.clone(), attempt });
                        if rng.chance(10) {
                            continue; // the host crashed mid-call: the deadline settles it
                        }
                        let outcome = match rng.below(5) {
                            0 => Err(CallError { retryable: true, ..CallError::terminal("not sent") }),
                            1 => Err(CallError::terminal("the tool failed")),
                            // A result with an image, recorded as parts.
                            2 => Ok(Content::Parts(vec![
                                ContentPart::Text { text: format!("chart of {call_id}") },
                                ContentPart::ImageUrl {
                                    image_url: UrlRef { url: "data:image/png;base64,AA==".into() },
                                },
                            ])),
                            _ => Ok(format!("contents of {call_id}").into()),
                        };
                        let cmd = Command::ToolCallFinished { call_id, attempt, outcome };
                        h.exec(cmd.clone());
                        pending_duplicate = Some((id.clone(), cmd));
                    }
                    Effect::Route { .. } => {
                        world.route();
                    }
                }
            }
        }
        for h in world.sessions.values() {
            check_no_dangling(h);
        }
    }
    if std::env::var("TURNSTONE_SIM_STATS").is_ok() {
        let mut counts = std::collections::BTreeMap::new();
        for h in world.sessions.values() {
            for e in &h.log {
                *counts.entry(e.name()).or_insert(0u32) += 1;
            }
        }
        eprintln!("seed {seed}: {} sessions {counts:?}", world.sessions.len());
    }
}

/// Outside a turn, every tool call on the active path is answered or still in flight.
fn check_no_dangling(h: &Harness) {
    let session = &h.session;
    if session.active_turn_id().is_some() {
        return;
    }
    for (tool_call_id, name) in session.tree().unanswered_tool_calls() {
        let in_flight = session.call(&tool_call_id).is_some();
        if !in_flight {
            for e in &h.log {
                eprintln!("{}", short(e));
            }
        }
        assert!(
            in_flight,
            "tool call {tool_call_id} ({name}) dangles in session {} with no turn active",
            session.id()
        );
    }
}

#[test]
fn simulation() {
    if let Some(seed) = std::env::var("TURNSTONE_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        run(seed, env_or("TURNSTONE_SIM_STEPS", STEPS));
        return;
    }
    for &(seed, steps) in REGRESSION_SEEDS {
        run(seed, steps);
    }
    for seed in 0..env_or("TURNSTONE_SIM_SEEDS", SEEDS) {
        run(seed, env_or("TURNSTONE_SIM_STEPS", STEPS));
    }
}

fn short(e: &Event) -> String {
    let mut text = format!("{} {}", e.name(), serde_json::to_string(e).unwrap_or_default());
    text.truncate(400);
    text
}

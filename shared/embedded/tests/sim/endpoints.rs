//! The simulated worker and model: they answer as real ones would, with seeded faults (error
//! statuses, hangs past the timeout, malformed answers, slow answers), record every effect
//! they perform (which call or decision, at which attempt) at the moment they perform it, and
//! check that what they are asked to perform was claimed in the store first.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use turnstone_engine::protocol::{
    Action, DecisionRequest, DecisionResponse, InterruptAction, LlmRequest, LlmResponse, StreamDelta,
    ToolResultAction, Trigger, parse_response,
};
use turnstone_engine::testing::{reply, tool_calls};
use turnstone_runtime::llm::{ModelProvider, ProviderError};
use turnstone_runtime::worker::{Answer, Deliver, DeliveryError, WorkerEndpoint};

use super::ports::block;
use super::{Fate, Life, World};

/// Ready once the simulated clock reaches `until` (the scheduler moves it; the deadline is
/// registered so that a drain knows where to move it next).
pub struct SimSleep {
    world: Arc<World>,
    until: i64,
}

impl SimSleep {
    pub fn new(world: &Arc<World>, ms: i64) -> Self {
        let until = world.now() + ms;
        world.sleepers.lock().unwrap().insert(until);
        SimSleep { world: Arc::clone(world), until }
    }
}

impl Future for SimSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.world.now() >= self.until {
            Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// What an endpoint does with one request, beyond answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Misbehaviour {
    None,
    /// A retryable failure (5xx, 429, a provider's overload).
    Retryable,
    /// A final failure (4xx).
    Terminal,
    /// No answer before the attempt's timeout.
    Hang,
    /// An answer that does not parse (an unknown action type, a bad field).
    Malformed,
    /// An answer, late but within the timeout.
    Slow,
    /// An answer that reaches the dispatcher after the attempt's timeout (it came in time, but
    /// the process stalled before acting on it): the session may have moved on.
    Late,
}

fn misbehaviour(world: &World) -> Misbehaviour {
    if !world.chaos() {
        return Misbehaviour::None;
    }
    match world.roll(100) {
        0..=5 => Misbehaviour::Retryable,
        6..=7 => Misbehaviour::Terminal,
        8..=10 => Misbehaviour::Hang,
        11..=13 => Misbehaviour::Malformed,
        14..=20 => Misbehaviour::Slow,
        21..=24 => Misbehaviour::Late,
        _ => Misbehaviour::None,
    }
}

/// Waits out a hang: until the attempt's timeout, or an hour without one.
async fn hang(world: &Arc<World>, timeout: Option<Duration>) {
    let ms = timeout.map_or(3_600_000, |t| t.as_millis() as i64);
    SimSleep::new(world, ms).await;
}

/// A slow answer: up to 5 s, within the timeout.
async fn slow(world: &Arc<World>, timeout: Option<Duration>) {
    let limit = timeout.map_or(5_000, |t| (t.as_millis() as i64 - 1).clamp(1, 5_000));
    let ms = 1 + world.roll(limit as u64) as i64;
    SimSleep::new(world, ms).await;
}

/// A late answer: up to a minute past the timeout (or 10 minutes without one).
async fn late(world: &Arc<World>, timeout: Option<Duration>) {
    let ms = timeout.map_or(600_000, |t| t.as_millis() as i64) + 1 + world.roll(60_000) as i64;
    SimSleep::new(world, ms).await;
}

/// The simulated worker of one process.
pub struct SimWorker {
    pub world: Arc<World>,
    pub life: Arc<Life>,
}

#[async_trait]
impl Deliver for SimWorker {
    async fn deliver(
        &self,
        _endpoint: &WorkerEndpoint,
        request: &DecisionRequest,
        timeout: Option<Duration>,
        _now_unix: i64,
        _on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<Answer, DeliveryError> {
        // Received in the same step as the claim that the dispatcher committed just before:
        // what the store holds now is what the claim wrote. (A pause between a claim and its
        // request is not simulated: the claim could expire in it, which no check here could
        // tell from an unclaimed delivery.)
        let world = &self.world;
        let fate = world.fate("deliver", false);
        if fate == Fate::CrashBefore {
            return self.life.die().await;
        }
        let (session_id, decision_id, attempt) =
            (request.session_id.as_str(), request.decision_id.as_str(), request.attempts);
        // Delivered only once claimed: the stored head has this decision in flight at this attempt.
        let stored = block(world.store().load(session_id)).ok().flatten();
        let claimed = stored
            .as_ref()
            .and_then(|l| l.session.decision())
            .is_some_and(|d| d.id.as_str() == decision_id && d.in_flight && d.attempts == attempt);
        if !claimed {
            world.violation(format!("decision {decision_id} attempt {attempt} delivered without its claim"));
        }
        world.executed(format!("decision {session_id} {decision_id} {attempt}"));
        let behaviour = misbehaviour(world);
        // A worker that answers an error status did not run the tool (it may be delivered
        // again); any other answer, a hang included, means it ran.
        if let Trigger::ToolExecute(t) = &request.trigger
            && !matches!(behaviour, Misbehaviour::Retryable | Misbehaviour::Terminal)
        {
            world.executed(format!("tool {session_id} {} {}", t.id, t.attempt));
        }
        // The request is in flight: others run meanwhile.
        self.life.gate().await;
        let outcome = match behaviour {
            Misbehaviour::Retryable => Err(DeliveryError::Status5xx { status: 503, hint: None }),
            Misbehaviour::Terminal => Err(DeliveryError::Status4xx { status: 400, hint: None }),
            Misbehaviour::Hang => {
                hang(world, timeout).await;
                Err(DeliveryError::Timeout { after: timeout })
            }
            Misbehaviour::Malformed | Misbehaviour::Slow | Misbehaviour::Late | Misbehaviour::None => {
                match behaviour {
                    Misbehaviour::Slow => slow(world, timeout).await,
                    Misbehaviour::Late => late(world, timeout).await,
                    _ => {}
                }
                let body = self.answer(request, behaviour == Misbehaviour::Malformed);
                parse_response(body.as_bytes())
                    .map(Answer::from)
                    .map_err(|e| DeliveryError::InvalidResponse { path: e.path, message: e.message })
            }
        };
        if fate == Fate::CrashAfter {
            return self.life.die().await;
        }
        world.trace(format!("delivered {decision_id} {attempt} {behaviour:?} ok={}", outcome.is_ok()));
        outcome
    }
}

impl SimWorker {
    /// The worker's answer as the JSON body it would send.
    fn answer(&self, request: &DecisionRequest, malformed: bool) -> String {
        let world = &self.world;
        let response = match &request.trigger {
            Trigger::ToolExecute(t) => {
                let action = if world.chaos() && world.roll(10) == 0 {
                    Action::ToolError(turnstone_engine::protocol::CallErrorAction {
                        id: None,
                        attempt: None,
                        error: "flaky".into(),
                        retryable: Some(true),
                        code: None,
                        detail: None,
                    })
                } else {
                    let result = format!("{} ok {} {}", t.name, t.id, t.attempt);
                    world.answered(&t.id, t.attempt, result.clone());
                    Action::ToolResult(ToolResultAction { id: None, attempt: None, result: json!(result) })
                };
                DecisionResponse { actions: Some(vec![action]), ..Default::default() }
            }
            _ => {
                // The engine's proposal; now and then with a pause for a person. (Never an empty
                // answer to a turn's trigger: that leaves the turn to the worker, which would
                // have to act later through the API.)
                let mut response = request.proposed.clone();
                if world.roll(100) < 6 {
                    let interrupt = Action::Interrupt(InterruptAction {
                        interrupt_id: None,
                        reason: "approve?".into(),
                        payload: None,
                    });
                    response.actions.get_or_insert_with(Vec::new).push(interrupt);
                }
                response
            }
        };
        let mut body: Value = serde_json::to_value(&response).unwrap_or_default();
        if let Some(object) = body.as_object_mut() {
            // An echo real workers send: ignored, and recorded.
            object.insert("session_id".into(), json!(request.session_id));
        }
        if malformed {
            let actions = body.get_mut("actions").and_then(Value::as_array_mut);
            match actions {
                Some(actions) if !actions.is_empty() => actions[0]["type"] = json!("tool.cal"),
                _ => body["actions"] = json!([{ "type": "done", "data": { "x": 1 }, "bogus": [1] }, 7]),
            }
        }
        body.to_string()
    }
}

/// The simulated model of one session (one agent per session), in one process.
pub struct SimModel {
    pub world: Arc<World>,
    pub life: Arc<Life>,
    pub session_id: String,
    /// The tools it may call: (name, arguments).
    pub tools: Vec<(&'static str, &'static str)>,
}

#[async_trait]
impl ModelProvider for SimModel {
    async fn complete(
        &self,
        _request: &LlmRequest,
        _stream: bool,
        timeout: Option<Duration>,
        _on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<LlmResponse, ProviderError> {
        // Received in the same step as the claim (see `SimWorker::deliver`).
        let world = &self.world;
        let fate = world.fate("model", false);
        if fate == Fate::CrashBefore {
            return self.life.die().await;
        }
        // Called only once claimed: the stored head has a server model call in flight (one at
        // a time per session); it is the call this request is for.
        let stored = block(world.store().load(&self.session_id)).ok().flatten();
        let call = stored
            .as_ref()
            .and_then(|l| l.session.calls().iter().find(|c| c.is_server_llm() && c.is_pending()).cloned());
        match &call {
            Some(call) => world.executed(format!("llm {} {} {}", self.session_id, call.id, call.attempt)),
            None => world.violation(format!("a model call of {} with no call claimed", self.session_id)),
        }
        self.life.gate().await;
        let behaviour = misbehaviour(world);
        let outcome = match behaviour {
            Misbehaviour::Retryable if world.roll(2) == 0 => Err(ProviderError::rate_limited("429")),
            Misbehaviour::Retryable => Err(ProviderError::retryable("HTTP 529 overloaded")),
            Misbehaviour::Terminal | Misbehaviour::Malformed => Err(ProviderError::terminal("HTTP 400")),
            Misbehaviour::Hang => {
                hang(world, timeout).await;
                Err(ProviderError::deadline_exceeded("the model did not answer in time"))
            }
            Misbehaviour::Slow | Misbehaviour::Late | Misbehaviour::None => {
                match behaviour {
                    Misbehaviour::Slow => slow(world, timeout).await,
                    Misbehaviour::Late => late(world, timeout).await,
                    _ => {}
                }
                let answer = self.answer();
                if let Some(call) = &call {
                    let value = serde_json::to_value(&answer).unwrap_or_default();
                    world.answered(&call.id, call.attempt, super::fingerprint(&value));
                }
                Ok(answer)
            }
        };
        if fate == Fate::CrashAfter {
            return self.life.die().await;
        }
        world.trace(format!("model {} {behaviour:?} ok={}", self.session_id, outcome.is_ok()));
        outcome
    }
}

impl SimModel {
    fn answer(&self) -> LlmResponse {
        let world = &self.world;
        let n = world.next_number();
        if self.tools.is_empty() || world.roll(100) < 55 {
            return reply(&format!("answer {n}"));
        }
        let k = 1 + world.roll(2);
        let calls: Vec<(String, &str, &str)> = (0..k)
            .map(|i| {
                let (name, args) = self.tools[world.roll(self.tools.len() as u64) as usize];
                (format!("tc{n}_{i}"), name, args)
            })
            .collect();
        let refs: Vec<(&str, &str, &str)> = calls.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
        tool_calls(&refs)
    }
}

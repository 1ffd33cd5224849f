//! What is due: derived from the session, never stored as a to-do list.

use super::Session;
use super::outbox::OutboxItem;
use crate::ids::{CallId, DecisionId};
use crate::protocol::CallStatus;
use crate::time::Timestamp;

/// Something the runtime must do for a session.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Deadlines passed or retries came due: handle [`super::Command::Tick`].
    Tick,
    /// Deliver the live decision to the worker (claim it with `ClaimDecision` first).
    DeliverDecision {
        decision_id: DecisionId,
        /// The delivery attempt to start.
        attempt: u32,
    },
    /// Run an attempt of a server LLM call (claim it with `ClaimLlmCall` first).
    RunLlmCall {
        call_id: CallId,
        /// The attempt to start.
        attempt: u32,
    },
    /// Run an attempt of a server tool call, an MCP tool (claim it with `ClaimToolCall`
    /// first). Several run at once.
    RunToolCall {
        call_id: CallId,
        /// The attempt to start.
        attempt: u32,
    },
    /// Deliver work to another session, then acknowledge with `OutboxDelivered`.
    Route {
        /// The outbox sequence number.
        seq: u64,
        item: OutboxItem,
    },
}

/// The effects due now, and when to look again.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Due now.
    pub effects: Vec<Effect>,
    /// The earliest future time something becomes due.
    pub wake_at: Option<Timestamp>,
}

impl Session {
    /// What is due at `now`.
    pub fn plan(&self, now: Timestamp) -> Plan {
        let mut plan = Plan::default();
        let mut timers: Vec<Timestamp> = Vec::new();
        if let Some(d) = &self.decision {
            if d.in_flight {
                timers.extend(d.deadline);
            } else if self.has_worker() {
                match d.retry_at {
                    Some(t) if t > now => plan.wake_at = earliest(plan.wake_at, t),
                    _ => plan
                        .effects
                        .push(Effect::DeliverDecision { decision_id: d.id.clone(), attempt: d.attempts + 1 }),
                }
            }
        }
        for call in &self.calls {
            match call.status {
                CallStatus::Pending => timers.extend(call.deadline),
                CallStatus::RetryScheduled => timers.extend(call.retry_at),
                _ => {}
            }
        }
        if timers.iter().any(|&t| t <= now) {
            plan.effects.push(Effect::Tick);
        }
        for &t in timers.iter().filter(|&&t| t > now) {
            plan.wake_at = earliest(plan.wake_at, t);
        }
        // The engine runs a session's server LLM calls one at a time (rule 27).
        let running = self.calls.iter().any(|c| c.is_server_llm() && c.is_pending());
        if !running
            && let Some(call) =
                self.calls.iter().find(|c| c.is_server_llm() && c.status == CallStatus::Queued)
        {
            plan.effects.push(Effect::RunLlmCall { call_id: call.id.clone(), attempt: call.attempt + 1 });
        }
        for call in self.calls.iter().filter(|c| c.is_server_tool() && c.status == CallStatus::Queued) {
            if !call.awaiting_approval {
                plan.effects
                    .push(Effect::RunToolCall { call_id: call.id.clone(), attempt: call.attempt + 1 });
            }
        }
        for (&seq, item) in &self.outbox {
            plan.effects.push(Effect::Route { seq, item: item.clone() });
        }
        plan
    }
}

fn earliest(current: Option<Timestamp>, t: Timestamp) -> Option<Timestamp> {
    Some(current.map_or(t, |c| c.min(t)))
}

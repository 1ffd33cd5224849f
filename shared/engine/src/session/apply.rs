//! Folding an event into the session. Events are facts: apply never fails and never mints.

use super::event::Event;
use super::outbox::OutboxItem;
use super::records::{CallSpec, ChildTask, TurnStatus};
use super::{CallClosure, Session};
use crate::ids::{CallId, DecisionId, SessionId, TurnId};
use crate::llm_format::usage::TokenCounts;
use crate::protocol::{CallStatus, DraftMessage};

impl Session {
    /// Folds one event in.
    pub fn apply(&mut self, event: &Event) {
        self.events_applied += 1;
        // The snapshot changes: its written size no longer holds.
        self.sizes.snapshot.store(0, std::sync::atomic::Ordering::Relaxed);
        match event {
            Event::SessionCreated { session_id, init, at } => {
                self.id = session_id.clone();
                self.init = Some(std::sync::Arc::new(init.clone()));
                self.sizes.declared.store(0, std::sync::atomic::Ordering::Relaxed);
                self.created_at = *at;
            }
            Event::TurnStarted { turn } => {
                self.active_turn = Some(turn.id.clone());
                self.turns.insert(turn.id.clone(), turn.clone());
            }
            Event::TurnQueued { turn } => {
                self.queued_turns.push(turn.id.clone());
                self.turns.insert(turn.id.clone(), turn.clone());
            }
            Event::TurnActivated { turn_id, at } => {
                self.queued_turns.retain(|t| t != turn_id);
                self.active_turn = Some(turn_id.clone());
                if let Some(turn) = self.turns.get_mut(turn_id) {
                    turn.status = TurnStatus::Active;
                    turn.started_at = Some(*at);
                    turn.input = None;
                }
            }
            Event::TurnAliased { alias, turn_id } => {
                self.turn_aliases.insert(alias.clone(), turn_id.clone());
            }
            Event::SessionTitled { title } => self.title = Some(title.clone()),
            Event::QueueReordered { order } => {
                // The queued turns take the slots queued turns held, in the new order; steering
                // turns keep theirs.
                let mut next = order.iter();
                let turns = &self.turns;
                for slot in self.queued_turns.iter_mut() {
                    if !turns.get(slot).is_some_and(|t| t.steering)
                        && let Some(id) = next.next()
                    {
                        *slot = id.clone();
                    }
                }
            }
            // A fork is the catalog's business: the session itself does not change.
            Event::Forked { .. } => {}
            Event::TurnSteered { turn_id, into } => {
                self.queued_turns.retain(|t| t != turn_id);
                self.turns.remove(turn_id);
                self.turn_aliases.insert(turn_id.clone(), into.clone());
            }
            Event::TurnEnded { turn_id, status, data, error, code, at } => {
                if self.active_turn.as_ref() == Some(turn_id) {
                    self.active_turn = None;
                }
                self.queued_turns.retain(|t| t != turn_id);
                if let Some(turn) = self.turns.get_mut(turn_id) {
                    turn.status = *status;
                    turn.data = data.clone();
                    turn.error = error.clone();
                    turn.code = *code;
                    turn.ended_at = Some(*at);
                    turn.input = None;
                    turn.client_tools = Vec::new();
                    turn.client_id = None;
                    turn.done_pending = false;
                    self.ended_order.push_back(turn_id.clone());
                }
                while self.ended_order.len() > super::RECENT_TURNS {
                    if let Some(old) = self.ended_order.pop_front() {
                        self.turns.remove(&old);
                        self.past_turns.push_back(old);
                        if self.past_turns.len() > super::PAST_TURN_IDS {
                            self.past_turns.pop_front();
                        }
                    }
                }
            }
            Event::TurnDone { turn_id, data } => {
                if let Some(turn) = self.turns.get_mut(turn_id) {
                    turn.data = data.clone();
                    turn.done_pending = true;
                }
            }
            Event::TriggerQueued { trigger } => self.triggers.push(trigger.clone()),
            Event::TriggerDropped { queue_index, .. } => {
                if *queue_index < self.triggers.len() {
                    self.triggers.remove(*queue_index);
                }
            }
            Event::DecisionOpened { decision, queue_index } => {
                if *queue_index < self.triggers.len() {
                    self.triggers.remove(*queue_index);
                }
                self.decision = Some(decision.clone());
            }
            Event::DecisionDispatched { decision_id, attempt, deadline, .. } => {
                if let Some(d) = self.live_decision_mut(decision_id) {
                    d.attempts = *attempt;
                    d.deadline = *deadline;
                    d.in_flight = true;
                    d.retry_at = None;
                }
            }
            Event::DecisionRetryScheduled { decision_id, retry_at, .. } => {
                if let Some(d) = self.live_decision_mut(decision_id) {
                    d.in_flight = false;
                    d.deadline = None;
                    d.retry_at = Some(*retry_at);
                }
            }
            Event::DecisionResolved { decision_id, .. }
            | Event::DecisionFailed { decision_id, .. }
            | Event::DecisionVoided { decision_id, .. } => {
                if self.decision.as_ref().is_some_and(|d| &d.id == decision_id) {
                    self.decision = None;
                }
            }
            Event::DecisionAccepted { call_id, queue_index, .. } => {
                if let Some(index) = queue_index
                    && *index < self.triggers.len()
                {
                    self.triggers.remove(*index);
                }
                if let Some(call_id) = call_id {
                    self.report_call(call_id);
                }
            }
            Event::ActionIgnored { .. } => {}
            Event::MessageRecorded { message, parent_id } => {
                self.tree.record(message.clone(), parent_id.clone())
            }
            Event::HeadMoved { head_id } => self.tree.move_head(head_id.clone()),
            Event::StateWritten { anchor, value } => {
                self.states.push(anchor.clone(), self.events_applied, value.clone())
            }
            Event::AgentWritten { anchor, config } => {
                self.agents.push(anchor.clone(), self.events_applied, config.clone())
            }
            Event::StateRestored { index, value } => self.states.hold(*index, value.clone()),
            Event::AgentRestored { index, config } => self.agents.hold(*index, config.clone()),
            Event::CallCreated { call } => self.calls.push(call.clone()),
            Event::CallDispatched { call_id, attempt, deadline, .. } => {
                if let Some(c) = self.call_mut(call_id) {
                    c.status = CallStatus::Pending;
                    c.attempt = *attempt;
                    c.deadline = *deadline;
                    c.retry_at = None;
                }
            }
            Event::CallRetryScheduled { call_id, retry_at, .. } => {
                if let Some(c) = self.call_mut(call_id) {
                    c.status = CallStatus::RetryScheduled;
                    c.deadline = None;
                    c.retry_at = Some(*retry_at);
                }
            }
            Event::CallApproved { call_id } => {
                if let Some(c) = self.call_mut(call_id) {
                    c.awaiting_approval = false;
                }
            }
            Event::CallRequeued { call_id } => {
                if let Some(c) = self.call_mut(call_id) {
                    c.status = CallStatus::Queued;
                    c.retry_at = None;
                }
            }
            Event::CallSettled { call_id, outcome, .. } => {
                let Some(call) = self.call_mut(call_id) else { return };
                call.status = if outcome.is_ok() { CallStatus::Completed } else { CallStatus::Failed };
                call.awaiting_approval = false;
                call.deadline = None;
                call.retry_at = None;
                call.outcome = Some(outcome.clone());
                if let (Ok(super::records::CallValue::Llm(response)), CallSpec::LlmCall { .. }) =
                    (outcome, &call.spec)
                {
                    let turn_id = call.turn_id.clone();
                    let counts = response.usage.as_ref().map(TokenCounts::of).unwrap_or_default();
                    if call.is_server_llm() {
                        // A small prompt is estimated whole at little cost: the head carries
                        // no measure for it.
                        self.prompt_measure =
                            (counts.input >= super::context::MEASURED_PROMPT_TOKENS).then(|| {
                                super::PromptMeasure {
                                    anchor: call.anchor.clone(),
                                    input_tokens: counts.input,
                                }
                            });
                    }
                    let (usage, cost) = (response.usage.clone(), response.cost.clone());
                    self.usage.add(usage.as_ref(), cost.as_deref());
                    if let Some(turn) = turn_id.and_then(|t| self.turns.get_mut(&t)) {
                        turn.usage.add(usage.as_ref(), cost.as_deref());
                    }
                }
            }
            Event::ContextCompacted { call_id, marker_id, response, .. } => {
                let Some(call) = self.call_mut(call_id) else { return };
                call.anchor = Some(marker_id.clone());
                let turn_id = call.turn_id.clone();
                if let Some(response) = response {
                    let (usage, cost) = (response.usage.as_ref(), response.cost.as_deref());
                    self.usage.add(usage, cost);
                    if let Some(turn) = turn_id.and_then(|t| self.turns.get_mut(&t)) {
                        turn.usage.add(usage, cost);
                    }
                }
            }
            Event::CallReported { call_id } => self.report_call(call_id),
            Event::CallVoided { call_id, .. } => {
                self.triggers.retain(|t| t.source.call_id() != Some(call_id));
                self.close_call(call_id, CallClosure::Voided);
            }
            Event::InterruptOpened { interrupt } => self.interrupts.push(interrupt.clone()),
            Event::InterruptResumed { interrupt_id, .. } | Event::InterruptClosed { interrupt_id } => {
                self.interrupts.retain(|i| &i.id != interrupt_id)
            }
            Event::OutboxQueued { seq, item } => {
                if let OutboxItem::SendMessage { session_id, message, turn_id } = item {
                    self.remember_task(session_id, message, turn_id);
                }
                self.outbox.insert(*seq, item.clone());
                self.next_outbox_seq = self.next_outbox_seq.max(seq + 1);
            }
            Event::OutboxDelivered { seq } | Event::OutboxWithdrawn { seq, .. } => {
                self.outbox.remove(seq);
            }
        }
        // What the head holds of the versions follows from the log, so a replay holds the same.
        self.settle_versions();
    }

    /// The first message sent to a child is its delegation's task (a retry sends it again).
    fn remember_task(&mut self, child: &SessionId, message: &DraftMessage, turn_id: &TurnId) {
        let delegation = self.calls.iter().find(|c| {
            !c.is_settled() && matches!(&c.spec, CallSpec::SubAgent { session_id, .. } if session_id == child)
        });
        if let Some(call) = delegation
            && !self.tasks.contains_key(&call.id)
        {
            let task = ChildTask { message: message.clone(), turn_id: turn_id.clone() };
            self.tasks.insert(call.id.clone(), task);
        }
    }

    /// A settled call was reported: it leaves the open calls.
    fn report_call(&mut self, call_id: &CallId) {
        self.close_call(call_id, CallClosure::Reported);
    }

    /// A call leaves the open calls. The head remembers how (for a clear refusal of a late
    /// settle), except for a server-run LLM call: only the runtime settles one, fenced by its
    /// attempt, so a late result is refused either way, and its id is kept by the store for good
    /// (`UsedId`) against reuse. A plain turn's model call leaves nothing behind in the head.
    fn close_call(&mut self, call_id: &CallId, how: CallClosure) {
        let server_llm = self.call(call_id).is_some_and(|c| c.is_server_llm());
        self.calls.retain(|c| &c.id != call_id);
        self.tasks.remove(call_id);
        if server_llm {
            return;
        }
        self.closed_calls.retain(|(c, _)| c != call_id);
        self.closed_calls.push_back((call_id.clone(), how));
        if self.closed_calls.len() > super::RECENT_CLOSED_CALLS {
            self.closed_calls.pop_front();
        }
    }

    fn live_decision_mut(&mut self, id: &DecisionId) -> Option<&mut super::records::Decision> {
        self.decision.as_mut().filter(|d| &d.id == id)
    }

    fn call_mut(&mut self, id: &CallId) -> Option<&mut super::records::CallRecord> {
        self.calls.iter_mut().find(|c| &c.id == id)
    }
}

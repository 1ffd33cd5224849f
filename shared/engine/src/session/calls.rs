//! Settling calls (fenced by id and attempt), claims of effects, delivery failures, and the
//! passing of time (deadlines and due retries).

use serde_json::Value;

use super::CallClosure;
use super::command::Rejection;
use super::event::Event;
use super::handle::Tx;
use super::outbox::OutboxItem;
use super::records::*;
use crate::ids::{CallId, DecisionId, SessionId, TurnId};
use crate::protocol::*;
use crate::time::Timestamp;

/// What a child reported about the turn a delegation started (see `Command::SubAgentFinished`).
pub(super) struct ChildReport {
    pub ok: bool,
    pub result: Option<String>,
    pub error: Option<String>,
    pub retryable: bool,
    pub turn_id: Option<TurnId>,
}

/// How a refused settle is treated.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Fence {
    /// Refuse the command (an external settle gets a clear error).
    Reject,
    /// Drop it quietly, recording why (a settle inside a decision response).
    Drop,
}

impl Tx {
    // ----- settling calls --------------------------------------------------------------

    /// Settles a call, refusing stale or unknown ones.
    pub(super) fn settle_checked(
        &mut self,
        id: &CallId,
        attempt: Option<u32>,
        outcome: CallOutcome,
    ) -> Result<(), Rejection> {
        self.settle(id, attempt, outcome, Fence::Reject)
    }

    pub(super) fn client_settle(
        &mut self,
        id: &CallId,
        attempt: Option<u32>,
        outcome: CallOutcome,
    ) -> Result<(), Rejection> {
        let call = self.open_call(id)?;
        if !call.is_client_tool() {
            return Err(Rejection::NotAClientCall(id.clone()));
        }
        self.settle(id, attempt, outcome, Fence::Reject)
    }

    pub(super) fn open_call(&self, id: &CallId) -> Result<&CallRecord, Rejection> {
        self.session.call(id).ok_or_else(|| match self.session.closed_call(id) {
            Some(CallClosure::Reported) => Rejection::CallAlreadySettled(id.clone()),
            Some(CallClosure::Voided) => Rejection::CallVoided(id.clone()),
            // Closed so long ago that only the store remembers it.
            None if self.used.has_call(id) => Rejection::CallAlreadySettled(id.clone()),
            None => Rejection::UnknownCall(id.clone()),
        })
    }

    /// Settles the running attempt of a call: a result or terminal error finishes it (and
    /// queues its `*.finished` trigger); a retryable error schedules the next attempt while
    /// retries remain.
    pub(super) fn settle(
        &mut self,
        id: &CallId,
        attempt: Option<u32>,
        outcome: CallOutcome,
        fence: Fence,
    ) -> Result<(), Rejection> {
        let checked = self.open_call(id).and_then(|call| {
            if call.is_settled() {
                return Err(Rejection::CallAlreadySettled(id.clone()));
            }
            // A call waiting for approval has no attempt yet, but may be settled: denied, or
            // answered by a worker or client that decides for itself.
            if !call.is_pending() && !call.awaiting_approval {
                return Err(Rejection::CallNotRunning { id: id.clone(), status: call.status });
            }
            match attempt {
                Some(a) if a != call.attempt => {
                    Err(Rejection::StaleAttempt { id: id.clone(), attempt: a, current: call.attempt })
                }
                _ => Ok(call.clone()),
            }
        });
        let call = match (checked, fence) {
            (Ok(call), _) => call,
            (Err(rejection), Fence::Reject) => return Err(rejection),
            (Err(_), Fence::Drop) => return Ok(()),
        };
        let outcome = self.check_result(&call, outcome);
        match outcome {
            Err(error)
                if error.retryable && !call.awaiting_approval && call.attempt <= call.policy.max_retries =>
            {
                // A timed-out delegation's child may still be running the task: cancel that
                // turn before the retry sends the task again (a child not yet created is not).
                if let CallSpec::SubAgent { session_id, .. } = &call.spec
                    && error.code == Some(ErrorCode::DeadlineExceeded)
                    && !self.spawn_pending(&call.id)
                {
                    let reason = format!("delegation {} attempt {} timed out", call.id, call.attempt);
                    self.outbox(OutboxItem::CancelChild { session_id: session_id.clone(), reason });
                }
                let retry_at = self.backoff(&call.policy, call.attempt);
                self.emit(Event::CallRetryScheduled {
                    call_id: call.id.clone(),
                    attempt: call.attempt,
                    error,
                    retry_at,
                    at: Some(self.now),
                });
            }
            outcome => {
                if let (Err(_), CallSpec::SubAgent { session_id, .. }) = (&outcome, &call.spec) {
                    self.cancel_child(&call.id, session_id, "the delegation failed");
                }
                let used = matches!(outcome, Ok(CallValue::Llm(_)));
                self.emit(Event::CallSettled {
                    call_id: call.id.clone(),
                    attempt: call.attempt,
                    outcome,
                    at: Some(self.now),
                });
                let source = TriggerSource::CallFinished { call_id: call.id.clone() };
                self.emit(Event::TriggerQueued {
                    trigger: PendingTrigger { source, turn_id: call.turn_id.clone() },
                });
                if used {
                    self.check_budget_after_call(call.turn_id.as_ref());
                }
            }
        }
        Ok(())
    }

    /// Whether delegation `call_id`'s child is still to be created (its spawn undelivered).
    fn spawn_pending(&self, call_id: &CallId) -> bool {
        self.session.outbox.values().any(
            |item| matches!(item, OutboxItem::SpawnChild { tool_call_id, .. } if tool_call_id == call_id),
        )
    }

    /// A server tool's result as the call's value: text, or parts when it carries more (an
    /// image). One larger than a message may be (`limits.message_bytes`) fails the call, as a
    /// worker's result that large is refused: it would be recorded as one message.
    pub(super) fn server_tool_value(&self, content: Content) -> CallOutcome {
        if let Err(problem) = self.limits.check_value("the result", &content) {
            return Err(CallError::terminal(problem));
        }
        Ok(match content {
            Content::Text(text) => CallValue::Text(text),
            Content::Parts(parts) => CallValue::Parts(parts),
        })
    }

    /// A tool result that violates the tool's output schema settles as a terminal error.
    pub(super) fn check_result(&self, call: &CallRecord, outcome: CallOutcome) -> CallOutcome {
        let (Ok(CallValue::Text(text)), CallSpec::ToolCall { name, .. }) = (&outcome, &call.spec) else {
            return outcome;
        };
        let Some(schema) = self.session.tool_declaration(name, call.turn_id.as_ref()).and_then(|t| t.output)
        else {
            return outcome;
        };
        let value = serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.clone()));
        match super::tool_input::check_output(&value, &schema) {
            Ok(()) => outcome,
            Err(problem) => Err(CallError::terminal(format!(
                "result of tool {name:?} violates its output schema: {problem}"
            ))),
        }
    }

    pub(super) fn backoff(&mut self, policy: &RetryPolicy, failed_attempt: u32) -> Timestamp {
        let base = policy.backoff_ms(failed_attempt);
        // Up to 10% jitter, from the command's entropy, so retries of many sessions spread.
        let jitter = if base >= 10 { self.ids.next_u64() % (base / 10 + 1) } else { 0 };
        self.now.plus_ms(base + jitter)
    }

    pub(super) fn external_settle(&mut self, action: Action) -> Result<(), Rejection> {
        let checked = match &action {
            Action::ToolResult(a) => {
                self.limits.check_value("the result", &a.result).map_err(|p| ("result", p))
            }
            Action::ToolError(a) => self.limits.check_value("the error", &a.error).map_err(|p| ("error", p)),
            _ => Ok(()),
        };
        checked.map_err(|(path, problem)| Rejection::invalid(path, problem))?;
        let (id, attempt, outcome, want_llm) = match action {
            Action::ToolResult(a) => (a.id, a.attempt, Ok(CallValue::Text(result_text(&a.result))), false),
            Action::ToolError(a) => (a.id.clone(), a.attempt, Err(call_error(&a)), false),
            Action::LlmResult(a) => {
                let id = a.id.clone().ok_or_else(|| Rejection::invalid("id", "required"))?;
                let call = self.open_call(&id)?.clone();
                (Some(id), a.attempt, self.llm_result(&call, &a.response), true)
            }
            Action::LlmError(a) => (a.id.clone(), a.attempt, Err(call_error(&a)), true),
            other => {
                return Err(Rejection::invalid(
                    "type",
                    format!(
                        "{} cannot settle a call (expected tool.result, tool.error, llm.result or llm.error)",
                        other.name()
                    ),
                ));
            }
        };
        let id = id.ok_or_else(|| Rejection::invalid("id", "required"))?;
        let call = self.open_call(&id)?;
        let is_llm = call.kind() == CallKind::LlmCall;
        if is_llm != want_llm {
            let kind = if is_llm {
                "an LLM call: settle it with llm.result or llm.error"
            } else {
                "not an LLM call: settle it with tool.result or tool.error"
            };
            return Err(Rejection::invalid("type", format!("call {id:?} is {kind}")));
        }
        if call.is_engine_run() {
            return Err(Rejection::invalid(
                "id",
                format!("call {id:?} is run by the engine, not the worker"),
            ));
        }
        self.settle(&id, attempt, outcome, Fence::Reject)
    }

    /// Parses an `llm.result` response in the call's format.
    pub(super) fn llm_result(&self, call: &CallRecord, response: &Value) -> CallOutcome {
        let format = match &call.spec {
            CallSpec::LlmCall { format, .. } => *format,
            _ => None,
        };
        let parsed = match format {
            Some(format) => crate::llm_format::response(format, response).map_err(|e| e.to_string()),
            None => parse::<LlmResponse>(response.clone()).map_err(|e| e.to_string()),
        };
        parsed
            .map(CallValue::Llm)
            .map_err(|e| CallError::terminal(format!("invalid llm.result response: {e}")))
    }

    pub(super) fn sub_agent_finished(
        &mut self,
        tool_call_id: &CallId,
        session_id: &SessionId,
        report: ChildReport,
    ) {
        let Some(call) = self.session.call(tool_call_id).filter(|c| {
            matches!(&c.spec, CallSpec::SubAgent { session_id: s, .. } if s == session_id) && c.is_pending()
        }) else {
            // Redelivered, or the delegation was voided: at most once, quietly.
            return;
        };
        // A report from another turn than the current attempt's (a timed-out attempt's turn,
        // cancelled when the task was sent again) does not settle this attempt.
        if let (Some(turn_id), Some(task)) = (&report.turn_id, self.session.tasks.get(tool_call_id))
            && *turn_id != task.turn_id_for(call.attempt)
        {
            return;
        }
        let outcome = if report.ok {
            Ok(CallValue::Text(report.result.unwrap_or_default()))
        } else {
            Err(CallError {
                error: report.error.unwrap_or_else(|| "the sub-agent failed".to_owned()),
                code: None,
                detail: None,
                retryable: report.retryable,
            })
        };
        let _ = self.settle(tool_call_id, None, outcome, Fence::Drop);
    }

    // ----- claims, failures, time ------------------------------------------------------

    pub(super) fn claim_decision(&mut self, decision_id: &DecisionId, attempt: u32) -> Result<(), Rejection> {
        let due = self.session.decision.as_ref().filter(|d| {
            &d.id == decision_id
                && !d.in_flight
                && d.attempts + 1 == attempt
                && d.retry_at.is_none_or(|t| t <= self.now)
                && self.session.has_worker()
        });
        if due.is_none() {
            return Err(Rejection::StaleClaim(format!("decision {decision_id} attempt {attempt}")));
        }
        // An execute decision runs its call inside the delivery: the call's timeout bounds it.
        let deadline = self.session.delivery_timeout_ms().map(|ms| self.now.plus_ms(ms));
        self.emit(Event::DecisionDispatched {
            decision_id: decision_id.clone(),
            attempt,
            deadline,
            at: Some(self.now),
        });
        Ok(())
    }

    pub(super) fn claim_llm_call(&mut self, call_id: &CallId, attempt: u32) -> Result<(), Rejection> {
        let busy = self.session.calls.iter().any(|c| c.is_server_llm() && c.is_pending());
        let call = self.session.call(call_id).filter(|c| {
            c.is_server_llm() && c.status == CallStatus::Queued && c.attempt + 1 == attempt && !busy
        });
        let Some(call) = call else {
            return Err(Rejection::StaleClaim(format!("llm call {call_id} attempt {attempt}")));
        };
        let deadline = call.policy.timeout_ms().map(|ms| self.now.plus_ms(ms));
        self.emit(Event::CallDispatched { call_id: call_id.clone(), attempt, deadline, at: Some(self.now) });
        Ok(())
    }

    /// The runtime starts attempt `attempt` of a server tool call (an MCP tool).
    pub(super) fn claim_tool_call(&mut self, call_id: &CallId, attempt: u32) -> Result<(), Rejection> {
        let call = self.session.call(call_id).filter(|c| {
            c.is_server_tool()
                && c.status == CallStatus::Queued
                && !c.awaiting_approval
                && c.attempt + 1 == attempt
        });
        let Some(call) = call else {
            return Err(Rejection::StaleClaim(format!("tool call {call_id} attempt {attempt}")));
        };
        let deadline = call.policy.timeout_ms().map(|ms| self.now.plus_ms(ms));
        self.emit(Event::CallDispatched { call_id: call_id.clone(), attempt, deadline, at: Some(self.now) });
        Ok(())
    }

    pub(super) fn delivery_failed(
        &mut self,
        decision_id: &DecisionId,
        attempt: u32,
        error: String,
        retryable: bool,
    ) {
        let Some(decision) = self.session.decision.clone() else { return };
        if &decision.id != decision_id || !decision.in_flight || decision.attempts != attempt {
            return;
        }
        let policy = self.session.defaults().decision;
        if retryable && attempt <= policy.max_retries {
            let retry_at = self.backoff(&policy, attempt);
            self.emit(Event::DecisionRetryScheduled {
                decision_id: decision.id,
                attempt,
                error,
                retry_at,
                at: Some(self.now),
            });
        } else {
            let error = if retryable { format!("{error} (after {attempt} attempts)") } else { error };
            self.fail_decision(&decision, error, retryable);
        }
    }

    /// A decision failed for good: the active turn it belongs to ends with the error
    /// (`retryable`: a transient failure, such as a worker that could not be reached).
    pub(super) fn fail_decision(&mut self, decision: &Decision, error: String, retryable: bool) {
        let error = format!("decision {} ({}) failed: {error}", decision.id, decision.trigger.name());
        self.emit(Event::DecisionFailed {
            decision_id: decision.id.clone(),
            error: error.clone(),
            at: Some(self.now),
        });
        let turn_active = decision.turn_id.is_some() && decision.turn_id == self.session.active_turn;
        match (turn_active, &decision.turn_id) {
            (true, Some(turn_id)) => {
                self.end_turn(&turn_id.clone(), TurnStatus::Failed, None, Some(error), retryable)
            }
            _ => {
                if let Some(call_id) = decision.call_id.as_ref().filter(|id| self.session.call(id).is_some())
                {
                    self.void_call(call_id, "its decision failed");
                }
            }
        }
    }

    pub(super) fn tick(&mut self) {
        let now = self.now;
        // An execute decision's delivery is bounded by its call's timeout: the call's own
        // deadline (never later) expires it below, as the call's attempt, not as a delivery.
        if let Some(d) = self.session.decision.clone()
            && d.in_flight
            && d.deadline.is_some_and(|t| t <= now)
            && self.session.executing_call(&d).is_none()
        {
            let error = format!("delivery attempt {} timed out", d.attempts);
            self.delivery_failed(&d.id, d.attempts, error, true);
        }
        let expired: Vec<(CallId, u32)> = self
            .session
            .calls
            .iter()
            .filter(|c| c.is_pending() && c.deadline.is_some_and(|t| t <= now))
            .map(|c| (c.id.clone(), c.attempt))
            .collect();
        for (id, attempt) in expired {
            let error = self.expired_attempt_error(&id, attempt);
            let _ = self.settle(&id, Some(attempt), Err(error), Fence::Drop);
            self.withdraw_execute_decision(&id, attempt);
        }
        let due: Vec<CallRecord> = self
            .session
            .calls
            .iter()
            .filter(|c| c.status == CallStatus::RetryScheduled && c.retry_at.is_some_and(|t| t <= now))
            .cloned()
            .collect();
        for call in due {
            self.emit(Event::CallRequeued { call_id: call.id.clone() });
            self.start_queued_call(&call);
        }
    }

    /// Why attempt `attempt` of call `id` ended at its deadline. A server tool call's host
    /// stopped after claiming it (the host reports its own timeouts before the deadline): the
    /// call may have reached the tool, so it is sent again only when the tool says repeating it
    /// is harmless; any other call's attempt is retried by its policy.
    fn expired_attempt_error(&self, id: &CallId, attempt: u32) -> CallError {
        let Some(CallSpec::ToolCall { name, handler: ToolHandler::Server, .. }) =
            self.session.call(id).map(|c| &c.spec)
        else {
            return CallError::deadline_exceeded(attempt);
        };
        let turn_id = self.session.call(id).and_then(|c| c.turn_id.clone());
        let source = self.session.tool_declaration(name, turn_id.as_ref()).and_then(|t| t.mcp);
        match source {
            Some(source) if source.idempotent => CallError::deadline_exceeded(attempt),
            _ => CallError {
                code: Some(ErrorCode::DeadlineExceeded),
                ..CallError::terminal(format!(
                    "tool {name:?} attempt {attempt}: the host stopped after sending the call, so it may have run; \
                     it is not sent again because the tool does not say repeating it is harmless"
                ))
            },
        }
    }

    /// The live decision delivering attempt `attempt` of call `call_id` to the worker is
    /// withdrawn once that attempt timed out: a retry is a new `tool.execute`/`llm.execute`,
    /// never a redelivery of the old one (which would run the call twice).
    fn withdraw_execute_decision(&mut self, call_id: &CallId, attempt: u32) {
        let Some(d) = self.session.decision.clone() else { return };
        let delivers = match &d.trigger {
            Trigger::ToolExecute(t) => &t.id == call_id && t.attempt == attempt,
            Trigger::LlmExecute(t) => &t.id == call_id && t.attempt == attempt,
            _ => false,
        };
        if delivers {
            let reason = format!("call {call_id} attempt {attempt} ran past its deadline");
            self.emit(Event::DecisionVoided { decision_id: d.id, reason });
        }
    }

    /// Starts what a queued call needs: a worker call gets its execute trigger, a client tool
    /// its attempt (it waits for the client); a server LLM call waits for the runtime's claim.
    pub(super) fn start_queued_call(&mut self, call: &CallRecord) {
        if call.awaiting_approval {
            return;
        }
        let source = match &call.spec {
            CallSpec::ToolCall { handler: ToolHandler::Worker, .. } => {
                TriggerSource::ToolExecute { call_id: call.id.clone() }
            }
            CallSpec::LlmCall { handler: LlmHandler::Worker, .. } => {
                TriggerSource::LlmExecute { call_id: call.id.clone() }
            }
            CallSpec::ToolCall { handler: ToolHandler::Client, .. } | CallSpec::SubAgent { .. } => {
                let deadline = call.policy.timeout_ms().map(|ms| self.now.plus_ms(ms));
                let attempt = call.attempt + 1;
                self.emit(Event::CallDispatched {
                    call_id: call.id.clone(),
                    attempt,
                    deadline,
                    at: Some(self.now),
                });
                // A delegation's retry sends its task again, as a fresh turn of the child.
                if let CallSpec::SubAgent { session_id, .. } = &call.spec
                    && attempt > 1
                    && let Some(task) = self.session.tasks.get(&call.id).cloned()
                {
                    self.outbox(OutboxItem::SendMessage {
                        session_id: session_id.clone(),
                        message: task.message.clone(),
                        turn_id: task.turn_id_for(attempt),
                    });
                }
                return;
            }
            // Server runs wait for the runtime's claim (`Effect::RunLlmCall`, `RunToolCall`).
            CallSpec::LlmCall { handler: LlmHandler::Server, .. }
            | CallSpec::ToolCall { handler: ToolHandler::Server, .. } => return,
        };
        self.emit(Event::TriggerQueued { trigger: PendingTrigger { source, turn_id: call.turn_id.clone() } });
    }
}

/// A tool result as the text a tool message carries: strings verbatim, other JSON serialized.
pub(super) fn result_text(result: &Value) -> String {
    match result {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

pub(super) fn call_error(a: &CallErrorAction) -> CallError {
    CallError {
        error: a.error.clone(),
        code: a.code,
        detail: a.detail.clone(),
        retryable: a.retryable.unwrap_or(false),
    }
}

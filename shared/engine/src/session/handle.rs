//! Handling commands: the transition logic. Works on a draft of the session, applying each
//! event as it is emitted so later steps see earlier ones; a rejection discards the draft.

use serde_json::Value;

use super::command::{Command, Rejection};
use super::event::Event;
use super::records::*;
use super::{CallClosure, Ctx, Session};
use crate::ids::IdMinter;
use crate::protocol::*;
use crate::time::Timestamp;

/// Bounds how many decisions one command may open and resolve in-process (engine-hosted
/// agents accept proposals in a loop); a well-formed session never comes near it.
const MAX_STEPS_PER_COMMAND: usize = 10_000;

/// A transition in progress.
pub(super) struct Tx {
    pub session: Session,
    pub events: Vec<Event>,
    pub ids: IdMinter,
    pub now: Timestamp,
}

/// How a refused settle is treated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fence {
    /// Refuse the command (an external settle gets a clear error).
    Reject,
    /// Drop it quietly, recording why (a settle inside a decision response).
    Drop,
}

impl Tx {
    pub fn new(session: Session, ctx: &Ctx) -> Self {
        Tx { session, events: Vec::new(), ids: IdMinter::new(ctx.seed), now: ctx.now }
    }

    pub fn emit(&mut self, event: Event) {
        self.session.apply(&event);
        self.events.push(event);
    }

    pub fn run(&mut self, command: Command) -> Result<(), Rejection> {
        match command {
            Command::Create { init } => return self.create(*init),
            _ if !self.session.is_created() => return Err(Rejection::NotFound(self.session.id.clone())),
            Command::Submit { input, queue, origin } => self.submit(input, queue, origin)?,
            Command::ClaimDecision { decision_id, attempt } => self.claim_decision(&decision_id, attempt)?,
            Command::Answer { decision_id, attempt: _, response } => {
                // Any attempt's answer resolves the live decision; once resolved, later
                // answers (redeliveries, stragglers) find it no longer live and are no-ops.
                if let Some(decision) = self.session.decision.clone().filter(|d| d.id == decision_id) {
                    self.resolve(&decision, *response, None, Resolver::Worker);
                }
            }
            Command::DeliveryFailed { decision_id, attempt, error, retryable } => {
                self.delivery_failed(&decision_id, attempt, error, retryable)
            }
            Command::ClaimLlmCall { call_id, attempt } => self.claim_llm_call(&call_id, attempt)?,
            Command::LlmCallFinished { call_id, attempt, outcome } => {
                self.settle(&call_id, Some(attempt), outcome.map(CallValue::Llm), Fence::Reject)?
            }
            Command::Settle { action } => self.external_settle(action)?,
            Command::SubAgentFinished { tool_call_id, session_id, ok, result, error } => {
                self.sub_agent_finished(&tool_call_id, &session_id, ok, result, error)
            }
            Command::Cancel { reason } => {
                let turn_id = self.session.active_turn.clone().ok_or(Rejection::NoActiveTurn)?;
                self.end_turn(&turn_id, TurnStatus::Cancelled, None, Some(reason));
            }
            Command::Tick => self.tick(),
            Command::OutboxDelivered { seq } => {
                if self.session.outbox.contains_key(&seq) {
                    self.emit(Event::OutboxDelivered { seq });
                }
            }
        }
        self.pump();
        Ok(())
    }

    // ----- creation and client inputs -------------------------------------------------

    fn create(&mut self, init: SessionInit) -> Result<(), Rejection> {
        if self.session.is_created() {
            return Err(Rejection::AlreadyExists(self.session.id.clone()));
        }
        if let Some(config) = &init.declared {
            config.validate().map_err(|e| Rejection::invalid(format!("agent.{}", e.path), e.message))?;
        }
        let session_id = self.session.id.clone();
        self.emit(Event::SessionCreated { session_id, init, at: self.now });
        self.emit(Event::TriggerQueued {
            trigger: PendingTrigger { source: TriggerSource::SessionStart, turn_id: None },
        });
        self.pump();
        Ok(())
    }

    fn submit(&mut self, input: ClientInput, queue: bool, origin: TurnOrigin) -> Result<(), Rejection> {
        match input {
            ClientInput::InterruptResume(resume) => self.resume(resume),
            ClientInput::ToolResult(r) => {
                let text = r.result.as_ref().map(result_text).unwrap_or_default();
                self.client_settle(&r.id, r.attempt, Ok(CallValue::Text(text)))
            }
            ClientInput::ToolError(e) => {
                let error = CallError { error: e.error, code: None, detail: None, retryable: e.retryable };
                self.client_settle(&e.id, e.attempt, Err(error))
            }
            ClientInput::Message(i) => {
                if i.message.role == Role::System {
                    return Err(Rejection::invalid(
                        "message.role",
                        "system messages belong to the agent config, not the conversation",
                    ));
                }
                let input = TurnInput::Message { message: i.message };
                self.start_turn(&i.agent_id, i.turn_id, input, queue, origin, true)
            }
            ClientInput::Messages(i) => self.submit_view(i, queue, origin),
            ClientInput::Action(i) => {
                self.check_agent(&i.agent_id)?;
                if self.known_turn(i.turn_id.as_deref()) {
                    return Ok(());
                }
                if let Some(active) = self.session.active_turn.clone() {
                    // An action during a turn is news for that turn, not a new turn.
                    if let Some(alias) = i.turn_id {
                        self.emit(Event::TurnAliased { alias, turn_id: active.clone() });
                    }
                    let source = TriggerSource::ClientAction { name: i.name, args: i.args };
                    self.emit(Event::TriggerQueued {
                        trigger: PendingTrigger { source, turn_id: Some(active) },
                    });
                    return Ok(());
                }
                let input = TurnInput::Action { name: i.name, args: i.args };
                self.start_turn(&i.agent_id, i.turn_id, input, queue, origin, false)
            }
        }
    }

    /// `client.messages`: answers to pending client tool calls settle here; the rest is a turn.
    fn submit_view(
        &mut self,
        i: ClientMessagesInput,
        queue: bool,
        origin: TurnOrigin,
    ) -> Result<(), Rejection> {
        self.check_agent(&i.agent_id)?;
        if self.known_turn(i.turn_id.as_deref()) {
            return Ok(());
        }
        let view: Vec<DraftMessage> = i.messages.into_iter().filter(|m| m.role != Role::System).collect();
        let news = &view[self.session.tree.new_from(&view)..];
        let answers: Vec<(String, String)> = news
            .iter()
            .filter(|m| m.role == Role::Tool)
            .filter_map(|m| {
                let id = m.tool_call_id.as_deref()?;
                let call = self.session.call(id)?;
                (call.is_client_tool() && call.is_pending()).then(|| (id.to_owned(), m.content_text()))
            })
            .collect();
        let only_answers = !news.is_empty() && answers.len() == news.len();
        if only_answers && answers.len() == 1 {
            // Fast path: exactly one answer to one pending client call.
            let (call_id, text) = answers[0].clone();
            let turn = self.session.call(&call_id).and_then(|c| c.turn_id.clone());
            self.settle(&call_id, None, Ok(CallValue::Text(text)), Fence::Reject)?;
            if let (Some(alias), Some(turn_id)) = (i.turn_id, turn) {
                self.emit(Event::TurnAliased { alias, turn_id });
            }
            return Ok(());
        }
        // Everything else: settle every answered call silently (the view records the
        // results), then deliver the whole view.
        for (call_id, text) in &answers {
            let attempt = self.session.call(call_id).map(|c| c.attempt);
            self.emit(Event::CallSettled {
                call_id: call_id.clone(),
                attempt: attempt.unwrap_or(1),
                outcome: Ok(CallValue::Text(text.clone())),
            });
            self.emit(Event::CallReported { call_id: call_id.clone() });
        }
        let client = i.client.unwrap_or_default();
        if only_answers && let Some(active) = self.session.active_turn.clone() {
            if let Some(alias) = i.turn_id {
                self.emit(Event::TurnAliased { alias, turn_id: active.clone() });
            }
            let source = TriggerSource::ClientMessages { messages: view, client };
            self.emit(Event::TriggerQueued { trigger: PendingTrigger { source, turn_id: Some(active) } });
            return Ok(());
        }
        let writes_message = !news.is_empty();
        let input = TurnInput::Messages { messages: view, client };
        self.start_turn(&i.agent_id, i.turn_id, input, queue, origin, writes_message)
    }

    fn check_agent(&self, agent_id: &str) -> Result<(), Rejection> {
        if agent_id != self.session.agent_id() {
            return Err(Rejection::AgentMismatch {
                expected: self.session.agent_id().to_owned(),
                given: agent_id.to_owned(),
            });
        }
        Ok(())
    }

    fn known_turn(&self, turn_id: Option<&str>) -> bool {
        turn_id.is_some_and(|t| self.session.knows_turn(t))
    }

    fn start_turn(
        &mut self,
        agent_id: &str,
        turn_id: Option<String>,
        input: TurnInput,
        queue: bool,
        origin: TurnOrigin,
        writes_message: bool,
    ) -> Result<(), Rejection> {
        self.check_agent(agent_id)?;
        if self.known_turn(turn_id.as_deref()) {
            return Ok(());
        }
        let id = turn_id.unwrap_or_else(|| self.ids.mint("turn"));
        let client_tools = match &input {
            TurnInput::Messages { client, .. } => client.tools.clone().unwrap_or_default(),
            _ => Vec::new(),
        };
        let mut turn = TurnRecord {
            id,
            status: TurnStatus::Queued,
            origin,
            input: Some(input),
            client_tools,
            submitted_at: self.now,
            started_at: None,
            ended_at: None,
            data: None,
            error: None,
            usage: Usage::default(),
        };
        if let Some(active) = &self.session.active_turn {
            if !queue {
                return Err(Rejection::TurnAlreadyActive { turn_id: active.clone() });
            }
            self.emit(Event::TurnQueued { turn });
            return Ok(());
        }
        if writes_message && self.session.is_paused() {
            let interrupt_ids = self.session.pausing_interrupts().iter().map(|i| i.id.clone()).collect();
            return Err(Rejection::BranchPaused { interrupt_ids });
        }
        if !self.session.queued_turns.is_empty() {
            // Queued turns start in arrival order: this one waits its place.
            self.emit(Event::TurnQueued { turn });
            return Ok(());
        }
        turn.status = TurnStatus::Active;
        turn.started_at = Some(self.now);
        let Some(source) = turn.input.take().map(turn_source) else { return Ok(()) };
        let turn_id = turn.id.clone();
        self.emit(Event::TurnStarted { turn });
        self.emit(Event::TriggerQueued { trigger: PendingTrigger { source, turn_id: Some(turn_id) } });
        Ok(())
    }

    fn start_next_queued_turn(&mut self) {
        if self.session.active_turn.is_some() || self.session.is_paused() {
            return;
        }
        let Some(turn_id) = self.session.queued_turns.first().cloned() else { return };
        let Some(source) = self.session.turns.get(&turn_id).and_then(|t| t.input.clone()).map(turn_source)
        else {
            return;
        };
        self.emit(Event::TurnActivated { turn_id: turn_id.clone(), at: self.now });
        self.emit(Event::TriggerQueued { trigger: PendingTrigger { source, turn_id: Some(turn_id) } });
    }

    fn resume(&mut self, resume: InterruptResumeInput) -> Result<(), Rejection> {
        let Some(interrupt) = self.session.interrupts.iter().find(|i| i.id == resume.interrupt_id).cloned()
        else {
            return Err(Rejection::UnknownInterrupt {
                id: resume.interrupt_id,
                open: self.session.interrupts.iter().map(|i| i.id.clone()).collect(),
            });
        };
        self.emit(Event::InterruptResumed {
            interrupt_id: interrupt.id.clone(),
            payload: resume.payload.clone(),
        });
        let source = TriggerSource::InterruptResumed { interrupt_id: interrupt.id, payload: resume.payload };
        self.emit(Event::TriggerQueued { trigger: PendingTrigger { source, turn_id: interrupt.turn_id } });
        Ok(())
    }

    // ----- settling calls --------------------------------------------------------------

    /// Settles a call, refusing stale or unknown ones.
    pub(super) fn settle_checked(
        &mut self,
        id: &str,
        attempt: Option<u32>,
        outcome: CallOutcome,
    ) -> Result<(), Rejection> {
        self.settle(id, attempt, outcome, Fence::Reject)
    }

    fn client_settle(
        &mut self,
        id: &str,
        attempt: Option<u32>,
        outcome: CallOutcome,
    ) -> Result<(), Rejection> {
        let call = self.open_call(id)?;
        if !call.is_client_tool() {
            return Err(Rejection::NotAClientCall(id.to_owned()));
        }
        self.settle(id, attempt, outcome, Fence::Reject)
    }

    fn open_call(&self, id: &str) -> Result<&CallRecord, Rejection> {
        self.session.call(id).ok_or_else(|| match self.session.closed_calls.get(id) {
            Some(CallClosure::Reported) => Rejection::CallAlreadySettled(id.to_owned()),
            Some(CallClosure::Voided) => Rejection::CallVoided(id.to_owned()),
            None => Rejection::UnknownCall(id.to_owned()),
        })
    }

    /// Settles the running attempt of a call: a result or terminal error finishes it (and
    /// queues its `*.finished` trigger); a retryable error schedules the next attempt while
    /// retries remain.
    fn settle(
        &mut self,
        id: &str,
        attempt: Option<u32>,
        outcome: CallOutcome,
        fence: Fence,
    ) -> Result<(), Rejection> {
        let checked = self.open_call(id).and_then(|call| {
            if call.is_settled() {
                return Err(Rejection::CallAlreadySettled(id.to_owned()));
            }
            if !call.is_pending() {
                return Err(Rejection::CallNotRunning { id: id.to_owned(), status: call.status });
            }
            match attempt {
                Some(a) if a != call.attempt => {
                    Err(Rejection::StaleAttempt { id: id.to_owned(), attempt: a, current: call.attempt })
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
                if error.retryable
                    && call.attempt <= call.policy.max_retries
                    && call.kind() != CallKind::SubAgent =>
            {
                let retry_at = self.backoff(&call.policy, call.attempt);
                self.emit(Event::CallRetryScheduled {
                    call_id: call.id.clone(),
                    attempt: call.attempt,
                    error,
                    retry_at,
                });
            }
            outcome => {
                if let (Err(_), CallSpec::SubAgent { session_id, .. }) = (&outcome, &call.spec) {
                    let reason = "the delegation failed".to_owned();
                    self.outbox(OutboxItem::CancelChild { session_id: session_id.clone(), reason });
                }
                self.emit(Event::CallSettled { call_id: call.id.clone(), attempt: call.attempt, outcome });
                let source = TriggerSource::CallFinished { call_id: call.id.clone() };
                self.emit(Event::TriggerQueued {
                    trigger: PendingTrigger { source, turn_id: call.turn_id.clone() },
                });
            }
        }
        Ok(())
    }

    /// A tool result that violates the tool's output schema settles as a terminal error.
    fn check_result(&self, call: &CallRecord, outcome: CallOutcome) -> CallOutcome {
        let (Ok(CallValue::Text(text)), CallSpec::ToolCall { name, .. }) = (&outcome, &call.spec) else {
            return outcome;
        };
        let Some(schema) =
            self.session.tool_declaration(name, call.turn_id.as_deref()).and_then(|t| t.output)
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

    fn backoff(&mut self, policy: &RetryPolicy, failed_attempt: u32) -> Timestamp {
        let base = policy.backoff_ms(failed_attempt);
        // Up to 10% jitter, from the command's entropy, so retries of many sessions spread.
        let jitter = if base >= 10 { self.ids.next_u64() % (base / 10 + 1) } else { 0 };
        self.now.plus_ms(base + jitter)
    }

    fn external_settle(&mut self, action: Action) -> Result<(), Rejection> {
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
        if call.is_server_llm() {
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

    fn sub_agent_finished(
        &mut self,
        tool_call_id: &str,
        session_id: &str,
        ok: bool,
        result: Option<String>,
        error: Option<String>,
    ) {
        let matches = self.session.call(tool_call_id).is_some_and(|c| {
            matches!(&c.spec, CallSpec::SubAgent { session_id: s, .. } if s == session_id) && c.is_pending()
        });
        if !matches {
            // Redelivered, or the delegation was voided: at most once, quietly.
            return;
        }
        let outcome = if ok {
            Ok(CallValue::Text(result.unwrap_or_default()))
        } else {
            Err(CallError::terminal(error.unwrap_or_else(|| "the sub-agent failed".to_owned())))
        };
        let _ = self.settle(tool_call_id, None, outcome, Fence::Drop);
    }

    // ----- claims, failures, time ------------------------------------------------------

    fn claim_decision(&mut self, decision_id: &str, attempt: u32) -> Result<(), Rejection> {
        let due = self.session.decision.as_ref().filter(|d| {
            d.id == decision_id
                && !d.in_flight
                && d.attempts + 1 == attempt
                && d.retry_at.is_none_or(|t| t <= self.now)
                && self.session.has_worker()
        });
        if due.is_none() {
            return Err(Rejection::StaleClaim(format!("decision {decision_id} attempt {attempt}")));
        }
        let deadline = self.session.defaults().decision.timeout_ms().map(|ms| self.now.plus_ms(ms));
        self.emit(Event::DecisionDispatched { decision_id: decision_id.to_owned(), attempt, deadline });
        Ok(())
    }

    fn claim_llm_call(&mut self, call_id: &str, attempt: u32) -> Result<(), Rejection> {
        let busy = self.session.calls.iter().any(|c| c.is_server_llm() && c.is_pending());
        let call = self.session.call(call_id).filter(|c| {
            c.is_server_llm() && c.status == CallStatus::Queued && c.attempt + 1 == attempt && !busy
        });
        let Some(call) = call else {
            return Err(Rejection::StaleClaim(format!("llm call {call_id} attempt {attempt}")));
        };
        let deadline = call.policy.timeout_ms().map(|ms| self.now.plus_ms(ms));
        self.emit(Event::CallDispatched { call_id: call_id.to_owned(), attempt, deadline });
        Ok(())
    }

    fn delivery_failed(&mut self, decision_id: &str, attempt: u32, error: String, retryable: bool) {
        let Some(decision) = self.session.decision.clone() else { return };
        if decision.id != decision_id || !decision.in_flight || decision.attempts != attempt {
            return;
        }
        let policy = self.session.defaults().decision;
        if retryable && attempt <= policy.max_retries {
            let retry_at = self.backoff(&policy, attempt);
            self.emit(Event::DecisionRetryScheduled { decision_id: decision.id, attempt, error, retry_at });
        } else {
            let error = if retryable { format!("{error} (after {attempt} attempts)") } else { error };
            self.fail_decision(&decision, error);
        }
    }

    /// A decision failed for good: the active turn it belongs to ends with the error.
    pub(super) fn fail_decision(&mut self, decision: &Decision, error: String) {
        let error = format!("decision {} ({}) failed: {error}", decision.id, decision.trigger.name());
        self.emit(Event::DecisionFailed { decision_id: decision.id.clone(), error: error.clone() });
        let turn_active = decision.turn_id.is_some() && decision.turn_id == self.session.active_turn;
        match (turn_active, &decision.turn_id) {
            (true, Some(turn_id)) => self.end_turn(&turn_id.clone(), TurnStatus::Failed, None, Some(error)),
            _ => {
                if let Some(call_id) =
                    decision.call_id.as_deref().filter(|id| self.session.call(id).is_some())
                {
                    self.void_call(call_id, "its decision failed");
                }
            }
        }
    }

    fn tick(&mut self) {
        let now = self.now;
        if let Some(d) = self.session.decision.clone()
            && d.in_flight
            && d.deadline.is_some_and(|t| t <= now)
        {
            let error = format!("delivery attempt {} timed out", d.attempts);
            self.delivery_failed(&d.id, d.attempts, error, true);
        }
        let expired: Vec<(String, u32)> = self
            .session
            .calls
            .iter()
            .filter(|c| c.is_pending() && c.deadline.is_some_and(|t| t <= now))
            .map(|c| (c.id.clone(), c.attempt))
            .collect();
        for (id, attempt) in expired {
            let _ = self.settle(&id, Some(attempt), Err(CallError::deadline_exceeded(attempt)), Fence::Drop);
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

    /// Starts what a queued call needs: a worker call gets its execute trigger, a client tool
    /// its attempt (it waits for the client); a server LLM call waits for the runtime's claim.
    pub(super) fn start_queued_call(&mut self, call: &CallRecord) {
        let source = match &call.spec {
            CallSpec::ToolCall { handler: ToolHandler::Worker, .. } => {
                TriggerSource::ToolExecute { call_id: call.id.clone() }
            }
            CallSpec::LlmCall { handler: LlmHandler::Worker, .. } => {
                TriggerSource::LlmExecute { call_id: call.id.clone() }
            }
            CallSpec::ToolCall { handler: ToolHandler::Client, .. } | CallSpec::SubAgent { .. } => {
                let deadline = call.policy.timeout_ms().map(|ms| self.now.plus_ms(ms));
                self.emit(Event::CallDispatched {
                    call_id: call.id.clone(),
                    attempt: call.attempt + 1,
                    deadline,
                });
                return;
            }
            CallSpec::LlmCall { handler: LlmHandler::Server, .. } => return,
        };
        self.emit(Event::TriggerQueued { trigger: PendingTrigger { source, turn_id: call.turn_id.clone() } });
    }

    // ----- turns ending ----------------------------------------------------------------

    /// Ends a turn. A failed or cancelled turn voids the session's open work and answers
    /// every tool call left unanswered on the active path, so the transcript stays valid.
    pub(super) fn end_turn(
        &mut self,
        turn_id: &str,
        status: TurnStatus,
        data: Option<Value>,
        error: Option<String>,
    ) {
        if status != TurnStatus::Completed {
            let reason = error.clone().unwrap_or_else(|| "the turn ended".to_owned());
            self.close_open_work(turn_id, &reason, status);
        }
        self.emit(Event::TurnEnded {
            turn_id: turn_id.to_owned(),
            status,
            data: data.clone(),
            error: error.clone(),
            at: self.now,
        });
        let turn = self.session.turns.get(turn_id).cloned();
        if let (Some(parent), Some(turn)) = (self.session.init.as_ref().and_then(|i| i.parent.clone()), turn)
            && turn.origin == TurnOrigin::Parent
        {
            let ok = status == TurnStatus::Completed;
            let result = ok.then(|| self.final_output(data.as_ref()));
            self.outbox(OutboxItem::NotifyParent {
                session_id: parent.session_id,
                tool_call_id: parent.tool_call_id,
                child_session_id: self.session.id.clone(),
                agent_id: self.session.agent_id().to_owned(),
                ok,
                result,
                error: if ok { None } else { error },
            });
        }
        self.start_next_queued_turn();
    }

    /// A turn's final output as text: `done`'s data, else the last assistant message.
    fn final_output(&self, data: Option<&Value>) -> String {
        match data {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Null) | None => self
                .session
                .tree
                .active_path()
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant)
                .map(|m| m.content_text())
                .unwrap_or_default(),
            Some(other) => other.to_string(),
        }
    }

    fn close_open_work(&mut self, turn_id: &str, reason: &str, status: TurnStatus) {
        if let Some(d) = self.session.decision.clone() {
            self.emit(Event::DecisionVoided { decision_id: d.id, reason: reason.to_owned() });
        }
        let open: Vec<String> = self.session.calls.iter().map(|c| c.id.clone()).collect();
        for id in open {
            self.void_call(&id, reason);
        }
        let interrupts: Vec<String> = self
            .session
            .interrupts
            .iter()
            .filter(|i| i.turn_id.as_deref() == Some(turn_id) || i.turn_id.is_none())
            .map(|i| i.id.clone())
            .collect();
        for interrupt_id in interrupts {
            self.emit(Event::InterruptClosed { interrupt_id });
        }
        let word = if status == TurnStatus::Cancelled { "cancelled" } else { "failed" };
        for (tool_call_id, name) in self.session.tree.unanswered_tool_calls() {
            let id = self.ids.mint("msg");
            let text = format!("error: the turn {word} before this tool call finished: {reason}");
            let message = DraftMessage::tool_result(tool_call_id, name, text).into_message(id);
            let parent_id = self.session.tree.head().map(str::to_owned);
            self.emit(Event::MessageRecorded { message, parent_id });
        }
    }

    pub(super) fn void_call(&mut self, call_id: &str, reason: &str) {
        let Some(call) = self.session.call(call_id).cloned() else { return };
        self.emit(Event::CallVoided { call_id: call_id.to_owned(), reason: reason.to_owned() });
        if !call.is_settled()
            && let CallSpec::SubAgent { session_id, .. } = call.spec
        {
            self.outbox(OutboxItem::CancelChild { session_id, reason: reason.to_owned() });
        }
    }

    pub(super) fn outbox(&mut self, item: OutboxItem) {
        let seq = self.session.next_outbox_seq;
        self.emit(Event::OutboxQueued { seq, item });
    }

    // ----- decisions -------------------------------------------------------------------

    /// Opens decisions while none is live and news waits; an agent without a worker has its
    /// proposals accepted on the spot, so one command can run many engine-hosted steps.
    fn pump(&mut self) {
        for _ in 0..MAX_STEPS_PER_COMMAND {
            self.start_next_queued_turn();
            if self.session.decision.is_some() {
                return;
            }
            let Some(index) = self.next_trigger_index() else { return };
            self.open_decision(index);
        }
    }

    /// The pending trigger to open next: the oldest, or, while the branch is paused, the
    /// oldest resume (everything else waits until the branch is resumed).
    fn next_trigger_index(&self) -> Option<usize> {
        if self.session.is_paused() {
            return self
                .session
                .triggers
                .iter()
                .position(|t| matches!(t.source, TriggerSource::InterruptResumed { .. }));
        }
        (!self.session.triggers.is_empty()).then_some(0)
    }

    fn open_decision(&mut self, index: usize) {
        let pending = self.session.triggers[index].clone();
        let (trigger, call_id, view_base) = match self.materialize(&pending.source) {
            Ok(materialized) => materialized,
            Err(reason) => {
                self.emit(Event::TriggerDropped { queue_index: index, reason });
                return;
            }
        };
        if matches!(pending.source, TriggerSource::CallFinished { .. })
            && let Some(id) = &call_id
        {
            self.emit(Event::CallReported { call_id: id.clone() });
        }
        let decision_id = self.ids.mint("dec");
        let (proposed, proposal_base) = super::propose::propose(
            &self.session,
            &trigger,
            view_base.as_ref(),
            pending.turn_id.as_deref(),
            &decision_id,
        );
        let mut decision = new_decision(decision_id, trigger, proposed, &pending, call_id.clone());
        decision.view_base = view_base;
        decision.proposal_base = proposal_base;
        self.emit(Event::DecisionOpened { decision: decision.clone(), queue_index: index });
        if let (TriggerSource::ToolExecute { .. } | TriggerSource::LlmExecute { .. }, Some(id)) =
            (&pending.source, &call_id)
            && let Some(call) = self.session.call(id).cloned()
        {
            let attempt = call.attempt + 1;
            let deadline = call.policy.timeout_ms().map(|ms| self.now.plus_ms(ms));
            self.emit(Event::CallDispatched { call_id: id.clone(), attempt, deadline });
        }
        if !self.session.has_worker() {
            if decision.proposes_nothing() && needs_worker(&decision.trigger) {
                let error = format!(
                    "agent {:?} has no worker, and nothing else can answer {}",
                    self.session.agent_id(),
                    describe(&decision.trigger)
                );
                self.fail_decision(&decision, error);
            } else {
                let (proposed, base) = (decision.proposed.clone(), decision.proposal_base.clone());
                self.resolve(&decision, proposed, base, Resolver::Engine);
            }
        }
    }
}

fn new_decision(
    id: String,
    trigger: Trigger,
    proposed: DecisionResponse,
    pending: &PendingTrigger,
    call_id: Option<String>,
) -> Decision {
    Decision {
        id,
        trigger,
        proposed,
        turn_id: pending.turn_id.clone(),
        attempts: 0,
        deadline: None,
        in_flight: false,
        retry_at: None,
        call_id,
        view_base: None,
        proposal_base: None,
    }
}

impl Tx {
    /// Builds the wire trigger for pending news, against the session as it is now.
    /// `Err` says why there is nothing to decide (the call it was about is gone, or its
    /// request cannot be put in the worker's format, which fails the call).
    fn materialize(&mut self, source: &TriggerSource) -> Result<Materialized, String> {
        let s = &self.session;
        let gone = |id: &str| format!("call {id} is no longer open");
        Ok(match source {
            TriggerSource::SessionStart => (Trigger::SessionStart, None, None),
            TriggerSource::ClientMessage { message } => {
                // The view is the active path plus the message: kept by reference to the path.
                let head = s.tree.head().map(str::to_owned);
                let new_from = s.tree.path_ids_to(head.as_deref()).len();
                let client = ClientContext::default();
                let t = ClientMessagesTrigger { messages: vec![message.clone()], new_from, client };
                (Trigger::ClientMessages(t), None, Some(PathRef { head }))
            }
            TriggerSource::ClientMessages { messages, client } => {
                let new_from = s.tree.new_from(messages);
                let t =
                    ClientMessagesTrigger { messages: messages.clone(), new_from, client: client.clone() };
                (Trigger::ClientMessages(t), None, None)
            }
            TriggerSource::ClientAction { name, args } => (
                Trigger::ClientAction(ClientActionTrigger { name: name.clone(), args: args.clone() }),
                None,
                None,
            ),
            TriggerSource::ToolExecute { call_id } => {
                let call = s
                    .call(call_id)
                    .filter(|c| c.status == CallStatus::Queued)
                    .ok_or_else(|| gone(call_id))?;
                let CallSpec::ToolCall { name, arguments, .. } = &call.spec else {
                    return Err(gone(call_id));
                };
                let declaration = s.tool_declaration(name, call.turn_id.as_deref());
                let input = match &declaration {
                    Some(tool) => super::tool_input::validate_arguments(arguments, tool.input.as_ref()),
                    None => super::tool_input::validate_arguments(arguments, None),
                };
                let attempt = call.attempt + 1;
                let deadline = call.policy.timeout_ms().map(|ms| self.now.plus_ms(ms).to_rfc3339());
                let t = ToolExecuteTrigger {
                    id: call_id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                    input,
                    attempt,
                    deadline,
                };
                (Trigger::ToolExecute(t), Some(call_id.clone()), None)
            }
            TriggerSource::LlmExecute { call_id } => {
                let call = s
                    .call(call_id)
                    .filter(|c| c.status == CallStatus::Queued)
                    .ok_or_else(|| gone(call_id))?;
                let CallSpec::LlmCall { stream, format, .. } = &call.spec else { return Err(gone(call_id)) };
                let request = s.llm_request(call).ok_or_else(|| gone(call_id))?;
                let converted = match format {
                    Some(format) => crate::llm_format::request(*format, &request, *stream),
                    None => serde_json::to_value(&request)
                        .map_err(|e| crate::llm_format::FormatError::new("", e.to_string())),
                };
                let request = match converted {
                    Ok(request) => request,
                    Err(e) => {
                        let call = call.clone();
                        let error = format!("the request cannot be sent in the {format:?} format: {e}");
                        self.emit(Event::CallDispatched {
                            call_id: call.id.clone(),
                            attempt: call.attempt + 1,
                            deadline: None,
                        });
                        let _ =
                            self.settle(&call.id, None, Err(CallError::terminal(error.clone())), Fence::Drop);
                        return Err(error);
                    }
                };
                let attempt = call.attempt + 1;
                let deadline = call.policy.timeout_ms().map(|ms| self.now.plus_ms(ms).to_rfc3339());
                let t = LlmExecuteTrigger {
                    id: call_id.clone(),
                    request,
                    format: *format,
                    stream: *stream,
                    attempt,
                    deadline,
                };
                (Trigger::LlmExecute(t), Some(call_id.clone()), None)
            }
            TriggerSource::CallFinished { call_id } => {
                let call = s.call(call_id).filter(|c| c.is_settled()).ok_or_else(|| gone(call_id))?;
                (finished_trigger(call).ok_or_else(|| gone(call_id))?, Some(call_id.clone()), None)
            }
            TriggerSource::InterruptResumed { interrupt_id, payload } => {
                let t =
                    InterruptResumedTrigger { interrupt_id: interrupt_id.clone(), payload: payload.clone() };
                (Trigger::InterruptResumed(t), None, None)
            }
        })
    }
}

/// A materialized trigger: the wire trigger, the call it is about, and the path its view is
/// kept by reference to.
type Materialized = (Trigger, Option<String>, Option<PathRef>);

/// The `*.finished` trigger of a settled call.
fn finished_trigger(call: &CallRecord) -> Option<Trigger> {
    let outcome = call.outcome.as_ref()?;
    Some(match (&call.spec, outcome) {
        (CallSpec::ToolCall { name, .. }, outcome) => Trigger::ToolFinished(ToolFinishedTrigger {
            id: call.id.clone(),
            ok: outcome.is_ok(),
            name: name.clone(),
            result: outcome.as_ref().ok().map(CallValue::text),
            error: outcome.as_ref().err().map(|e| e.error.clone()),
        }),
        (CallSpec::SubAgent { agent_id, session_id }, outcome) => {
            Trigger::SubAgentFinished(SubAgentFinishedTrigger {
                id: call.id.clone(),
                ok: outcome.is_ok(),
                session_id: session_id.clone(),
                agent_id: agent_id.clone(),
                result: outcome.as_ref().ok().map(CallValue::text),
                error: outcome.as_ref().err().map(|e| e.error.clone()),
            })
        }
        (CallSpec::LlmCall { .. }, Ok(CallValue::Llm(response))) => {
            Trigger::LlmFinished(LlmFinishedTrigger {
                id: call.id.clone(),
                ok: true,
                message: Some(assistant_message(&call.id, response)),
                truncated: response.is_truncated(),
                usage: response.usage.clone(),
                cost: response.cost.clone(),
                error: None,
                code: response.is_refused().then_some(ErrorCode::Refused),
                detail: None,
            })
        }
        (CallSpec::LlmCall { .. }, Ok(CallValue::Text(text))) => {
            // Cannot arise (LLM calls settle with responses); report it as a failure.
            Trigger::LlmFinished(LlmFinishedTrigger {
                id: call.id.clone(),
                ok: false,
                message: None,
                truncated: false,
                usage: None,
                cost: None,
                error: Some(format!("an LLM call settled with text instead of a response: {text}")),
                code: Some(ErrorCode::ProviderError),
                detail: None,
            })
        }
        (CallSpec::LlmCall { .. }, Err(e)) => Trigger::LlmFinished(LlmFinishedTrigger {
            id: call.id.clone(),
            ok: false,
            message: None,
            truncated: false,
            usage: None,
            cost: None,
            error: Some(e.error.clone()),
            code: e.code,
            detail: e.detail.clone(),
        }),
    })
}

/// The assistant message an LLM response records; its id is the call's (rule 20).
pub(super) fn assistant_message(call_id: &str, response: &LlmResponse) -> DraftMessage {
    DraftMessage {
        id: Some(call_id.to_owned()),
        role: Role::Assistant,
        content: response.content.clone().map(Content::Text),
        tool_calls: response.tool_calls.clone().filter(|t| !t.is_empty()),
        tool_call_id: None,
        name: None,
    }
}

impl CallValue {
    /// The value as text (a model response's content).
    pub fn text(&self) -> String {
        match self {
            CallValue::Text(text) => text.clone(),
            CallValue::Llm(response) => response.content.clone().unwrap_or_default(),
        }
    }
}

fn turn_source(input: TurnInput) -> TriggerSource {
    match input {
        TurnInput::Message { message } => TriggerSource::ClientMessage { message },
        TurnInput::Messages { messages, client } => TriggerSource::ClientMessages { messages, client },
        TurnInput::Action { name, args } => TriggerSource::ClientAction { name, args },
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

/// Triggers only a worker can answer: an engine-hosted agent fails them when the proposal is empty.
fn needs_worker(trigger: &Trigger) -> bool {
    matches!(trigger, Trigger::ToolExecute(_) | Trigger::LlmExecute(_) | Trigger::ClientAction(_))
}

fn describe(trigger: &Trigger) -> String {
    match trigger {
        Trigger::ToolExecute(t) => format!("tool.execute for tool {:?}", t.name),
        Trigger::LlmExecute(_) => "llm.execute (an LLM call with handler worker)".to_owned(),
        Trigger::ClientAction(a) => format!("client.action {:?}", a.name),
        other => other.name().to_owned(),
    }
}

//! Opening decisions: the next pending trigger becomes the live decision, materialized
//! against the session as it is now, with the engine's proposal; an agent without a worker
//! has the proposal accepted on the spot.

use super::calls::Fence;
use super::event::Event;
use super::handle::Tx;
use super::records::*;
use crate::ids::{CallId, DecisionId, MessageId};
use crate::protocol::*;

use super::handle::MAX_STEPS_PER_COMMAND;

impl Tx {
    // ----- decisions -------------------------------------------------------------------

    /// Opens decisions while none is live and news waits; an agent without a worker has its
    /// proposals accepted on the spot, so one command can run many engine-hosted steps.
    pub(super) fn pump(&mut self) {
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
    pub(super) fn next_trigger_index(&self) -> Option<usize> {
        if self.session.is_paused() {
            return self
                .session
                .triggers
                .iter()
                .position(|t| matches!(t.source, TriggerSource::InterruptResumed { .. }));
        }
        (!self.session.triggers.is_empty()).then_some(0)
    }

    pub(super) fn open_decision(&mut self, index: usize) {
        let pending = self.session.triggers[index].clone();
        let (trigger, call_id, view_base) = match self.materialize(&pending.source) {
            Ok(materialized) => materialized,
            Err(reason) => {
                self.emit(Event::TriggerDropped { queue_index: index, reason });
                return;
            }
        };
        // The call whose result this trigger reports (a `*.finished` trigger).
        let mut reported =
            matches!(pending.source, TriggerSource::CallFinished { .. }).then(|| call_id.clone()).flatten();
        let decision_id = self.ids.decision_id();
        let (mut proposed, mut proposal_base) = super::propose::propose(
            &self.session,
            &trigger,
            view_base.as_ref(),
            pending.turn_id.as_ref(),
            &decision_id,
            reported.as_ref(),
        );
        // A late result, its turn over (rule 28): the engine records it itself, so the active
        // path never holds a tool call without its result while a worker looks at the decision
        // (or answers it without the message); the decision still opens, proposing nothing more.
        let late = reported.is_some()
            && self.session.has_worker()
            && matches!(trigger, Trigger::ToolFinished(_) | Trigger::SubAgentFinished(_))
            && (pending.turn_id.is_none() || pending.turn_id != self.session.active_turn);
        if late && let Some(messages) = proposed.messages.take() {
            if let Some(id) = reported.take() {
                self.emit(Event::CallReported { call_id: id });
            }
            let news = DecisionResponse { messages: Some(messages), ..DecisionResponse::default() };
            if let Some(reconciled) = self.reconcile_response(&news, proposal_base.as_ref()) {
                self.record_messages(reconciled);
            }
            proposal_base = None;
        }
        let mut decision = new_decision(decision_id, trigger, proposed, &pending, call_id.clone());
        decision.view_base = view_base;
        decision.proposal_base = proposal_base;
        // An engine-hosted agent accepts its own proposal on the spot, unless only a worker
        // could answer the trigger or the proposal is invalid (both fail the decision below).
        let engine_answers = !decision.proposes_nothing() || !needs_worker(&decision.trigger);
        if !self.session.has_worker()
            && engine_answers
            && self.validate_response(&decision, &decision.proposed).is_ok()
        {
            self.accept_step(index, &pending, decision, reported);
            return;
        }
        if let Some(id) = &reported {
            self.emit(Event::CallReported { call_id: id.clone() });
        }
        self.emit(Event::DecisionOpened { decision: decision.clone(), queue_index: index });
        if let (TriggerSource::ToolExecute { .. } | TriggerSource::LlmExecute { .. }, Some(id)) =
            (&pending.source, &call_id)
            && let Some(call) = self.session.call(id).cloned()
        {
            let attempt = call.attempt + 1;
            let deadline = call.policy.timeout_ms().map(|ms| self.now.plus_ms(ms));
            self.emit(Event::CallDispatched { call_id: id.clone(), attempt, deadline, at: Some(self.now) });
        }
        if !self.session.has_worker() {
            if decision.proposes_nothing() && needs_worker(&decision.trigger) {
                let error = format!(
                    "agent {:?} has no worker, and nothing else can answer {}",
                    self.session.agent_id(),
                    describe(&decision.trigger)
                );
                self.fail_decision(&decision, error, false);
            } else {
                // An invalid proposal: resolving it fails the decision, naming the problem.
                let (proposed, base) = (decision.proposed.clone(), decision.proposal_base.clone());
                self.resolve(&decision, proposed, base, Resolver::Engine, Vec::new());
            }
        }
    }

    /// An engine-hosted step: the engine accepts its own (valid) proposal for the pending
    /// trigger at `index` on the spot, and the decision is never live. Its bookkeeping is one
    /// event, `decision.accepted`, and only when it has something to say: news that arrived in
    /// this very command (the last event written is its `trigger.queued`) is taken back instead
    /// of queued and consumed, and a step that consumes no call result and no earlier news is
    /// recorded by what it does alone (the turn's message, its model call).
    fn accept_step(
        &mut self,
        index: usize,
        pending: &PendingTrigger,
        decision: Decision,
        reported: Option<CallId>,
    ) {
        let queued_now = index + 1 == self.session.triggers.len()
            && matches!(self.events.last(), Some(Event::TriggerQueued { trigger }) if trigger == pending);
        if queued_now {
            // Taken back: the trigger.queued was the last event and only pushed the trigger.
            self.events.pop();
            self.session.triggers.pop();
            self.session.events_applied -= 1;
        }
        if queued_now && reported.is_none() {
            self.unrecorded_step = Some(decision.id.clone());
        } else {
            self.emit(Event::DecisionAccepted {
                decision_id: decision.id.clone(),
                trigger: decision.trigger.name().to_owned(),
                call_id: reported,
                queue_index: (!queued_now).then_some(index),
            });
        }
        let (proposed, base) = (decision.proposed.clone(), decision.proposal_base.clone());
        self.accept(&decision, proposed, base);
        self.unrecorded_step = None;
    }
}

fn new_decision(
    id: DecisionId,
    trigger: Trigger,
    proposed: DecisionResponse,
    pending: &PendingTrigger,
    call_id: Option<CallId>,
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
    pub(super) fn materialize(&mut self, source: &TriggerSource) -> Result<Materialized, String> {
        let s = &self.session;
        let gone = |id: &CallId| format!("call {id} is no longer open");
        Ok(match source {
            TriggerSource::SessionStart => (Trigger::SessionStart, None, None),
            TriggerSource::ClientMessage { message, client } => {
                // The view is the active path plus the message: kept by reference to the path.
                let head = s.tree.head().cloned();
                let new_from = s.tree.path_len(head.as_ref());
                let client = client.clone().unwrap_or_default();
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
                let declaration = s.tool_declaration(name, call.turn_id.as_ref());
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
                            at: Some(self.now),
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
type Materialized = (Trigger, Option<CallId>, Option<PathRef>);

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
        (CallSpec::LlmCall { .. }, Ok(value @ (CallValue::Text(_) | CallValue::Parts(_)))) => {
            // Cannot arise (LLM calls settle with responses); report it as a failure.
            Trigger::LlmFinished(LlmFinishedTrigger {
                id: call.id.clone(),
                ok: false,
                message: None,
                truncated: false,
                usage: None,
                cost: None,
                error: Some(format!("an LLM call settled with text instead of a response: {}", value.text())),
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

/// The assistant message an LLM response records; its id is the call's (rule 20). Text
/// alone is a string; with images the content is parts: the text (when there is any), then
/// one `image_url` part per image, in order.
pub(super) fn assistant_message(call_id: &CallId, response: &LlmResponse) -> DraftMessage {
    let images = response.images.as_deref().unwrap_or_default();
    let content = if images.is_empty() {
        response.content.clone().map(Content::Text)
    } else {
        let text = response.content.iter().filter(|t| !t.is_empty());
        let parts = text
            .map(|t| ContentPart::Text { text: t.clone() })
            .chain(images.iter().map(|image| ContentPart::ImageUrl { image_url: image.clone() }))
            .collect();
        Some(Content::Parts(parts))
    };
    DraftMessage {
        id: Some(MessageId::new(call_id.as_str())),
        role: Role::Assistant,
        content,
        tool_calls: response.tool_calls.clone().filter(|t| !t.is_empty()),
        tool_call_id: None,
        name: None,
        provider_blocks: response.provider_blocks.clone(),
    }
}

impl CallValue {
    /// The value as text (a model response's content; a result's text parts, with each
    /// other part named where it stood, `[image]`).
    pub fn text(&self) -> String {
        match self {
            CallValue::Text(text) => text.clone(),
            CallValue::Parts(parts) => parts.iter().map(ContentPart::summary).collect::<Vec<_>>().join("\n"),
            CallValue::Llm(response) => response.content.clone().unwrap_or_default(),
        }
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

//! Carrying out a decision's response: reconcile its messages, write state and config,
//! then run its actions in order.

use serde_json::Value;

use super::calls::{call_error, result_text};
use super::event::Event;
use super::handle::Tx;
use super::outbox::OutboxItem;
use super::records::*;
use crate::ids::{CallId, MessageId, SessionId, TurnId};
use crate::protocol::*;

/// The result of a tool call whose results a fork or edit left behind.
const ABANDONED: &str = "error: no result: the conversation continued from an earlier point without it";
/// The result of a tool call recorded after its turn ended, which nothing will run.
const NOT_RUN: &str = "error: not run: its turn had ended";

/// What a server tool call's deadline adds to its MCP server's timeout: the host reports its
/// own timeouts within it, so the deadline passes only when the host stopped.
const SERVER_TOOL_REPORT_SECS: f64 = 10.0;

impl Tx {
    /// Resolves the live decision with `response`, whose messages follow the path `base`
    /// when given (a proposal kept by reference, or a windowed request's answer). An invalid
    /// response fails the decision (and its turn) before anything of it is written. `ignored_fields` are the paths of unknown
    /// fields the worker's answer carried (recorded, never acted on).
    pub(super) fn resolve(
        &mut self,
        decision: &Decision,
        mut response: DecisionResponse,
        base: Option<PathRef>,
        by: Resolver,
        ignored_fields: Vec<String>,
    ) {
        if let Err(problem) = self.validate_response(decision, &response) {
            let who = if by == Resolver::Worker { "invalid_response" } else { "invalid proposal" };
            self.fail_decision(decision, format!("{who}: {problem}"), false);
            return;
        }
        let reconciled = self.reconcile_response(&response, base.as_ref());
        // The event keeps the response without the conversation it echoes (the messages up
        // to the news are recorded already, and the news follows as `message.recorded`) and
        // without its state (`state.written` follows with it).
        let omitted_messages = match (&reconciled, &mut response.messages) {
            (Some(r), Some(messages)) if base.is_none() || by == Resolver::Worker => {
                messages.drain(..r.new_from.min(messages.len()));
                r.new_from
            }
            _ => 0,
        };
        let mut logged = response.clone();
        let omitted_state = logged.state.take().is_some();
        self.emit(Event::DecisionResolved {
            decision_id: decision.id.clone(),
            by,
            response: logged,
            omitted_messages,
            omitted_state,
            ignored_fields,
            at: Some(self.now),
        });
        self.carry_out(decision, response, reconciled);
    }

    /// Carries out the engine's own proposal for an engine-hosted step (already checked with
    /// [`Tx::validate_response`]); the step's `decision.accepted`, if it needs one, is written.
    pub(super) fn accept(&mut self, decision: &Decision, response: DecisionResponse, base: Option<PathRef>) {
        let reconciled = self.reconcile_response(&response, base.as_ref());
        self.carry_out(decision, response, reconciled);
    }

    /// What reconciling a response's messages (following the path `base`) would write.
    pub(super) fn reconcile_response(
        &mut self,
        response: &DecisionResponse,
        base: Option<&PathRef>,
    ) -> Option<super::tree::Reconciled> {
        let start = base.and_then(|b| b.head.as_ref());
        response
            .messages
            .as_deref()
            .filter(|m| !m.is_empty())
            .map(|m| self.session.tree.reconcile_from(start, m, &mut self.ids))
    }

    /// Carries out a resolved response: its messages, state, config, then its actions in order.
    fn carry_out(
        &mut self,
        decision: &Decision,
        response: DecisionResponse,
        reconciled: Option<super::tree::Reconciled>,
    ) {
        if let Some(reconciled) = reconciled {
            self.record_messages(reconciled);
        }
        if let Some(state) = response.state
            && state != self.session.current_state()
        {
            let anchor = self.session.tree.head().cloned();
            self.emit(Event::StateWritten { anchor, value: state });
        }
        if let Some(config) =
            response.agent.map(|c| self.session.unlayered_agent(decision.turn_id.as_ref(), c))
            && Some(&config) != self.session.current_agent()
        {
            let anchor = self.session.tree.head().cloned();
            self.emit(Event::AgentWritten { anchor, config });
        }
        let actions = response.actions.unwrap_or_default();
        let turn = decision.turn_id.clone().filter(|t| self.session.active_turn.as_ref() == Some(t));
        for (index, action) in actions.iter().enumerate() {
            if let Some(failed) = turn
                .as_ref()
                .and_then(|t| self.session.turns.get(t))
                .filter(|t| t.status == TurnStatus::Failed)
            {
                // The turn failed on the way (a budget ran out): the rest is not carried out.
                let reason = format!("its turn failed: {}", failed.error.clone().unwrap_or_default());
                self.ignore_action(decision, index, reason);
                continue;
            }
            // `done` followed by an `interrupt` waits for it like one raised before it.
            let interrupt_follows = actions[index + 1..].iter().any(|a| matches!(a, Action::Interrupt(_)));
            if let Err(reason) = self.run_action(decision, index, action, interrupt_follows) {
                self.ignore_action(decision, index, reason);
            }
        }
        if let Some(turn_id) = &decision.turn_id {
            // A `done` that waited for an interrupt that was not opened after all.
            self.complete_if_done(turn_id);
        }
        self.end_turn_after_failed_model_call(decision, actions.is_empty());
        // Nor will anything run one recorded for a turn that is over while another runs, or
        // whose `done` waits for its interrupts: the late reply's tool calls would stay
        // unanswered on the path for good (found by the runtime simulation, seed 746).
        let turn_over = decision.turn_id.as_ref().is_some_and(|t| {
            Some(t) != self.session.active_turn.as_ref()
                || self.session.active_turn().is_some_and(|a| a.done_pending)
        });
        if self.session.active_turn.is_none() || turn_over {
            // Outside a turn nothing will run a tool call the response recorded (a late model
            // reply after `done`): answer it, so the path stays valid for strict model APIs.
            let head = self.session.tree.head().cloned();
            self.answer_unanswered_tool_calls(head, NOT_RUN);
        }
    }

    /// Records that action `index` of `decision` was not carried out. An engine-hosted step
    /// that wrote no `decision.accepted` (nothing for it to say) writes it first, so the
    /// decision the event names is in the log.
    fn ignore_action(&mut self, decision: &Decision, index: usize, reason: String) {
        if self.unrecorded_step.as_ref() == Some(&decision.id) {
            self.unrecorded_step = None;
            self.emit(Event::DecisionAccepted {
                decision_id: decision.id.clone(),
                trigger: decision.trigger.name().to_owned(),
                call_id: None,
                queue_index: None,
            });
        }
        self.emit(Event::ActionIgnored { decision_id: decision.id.clone(), index, reason });
    }

    /// A failed, truncated or refused model call whose decision asks for nothing more ends the
    /// turn with that error (rule 13: the proposal records nothing and does nothing).
    fn end_turn_after_failed_model_call(&mut self, decision: &Decision, no_actions: bool) {
        let Trigger::LlmFinished(finished) = &decision.trigger else { return };
        let failed = !finished.ok || finished.truncated || finished.code == Some(ErrorCode::Refused);
        let Some(turn_id) = decision.turn_id.clone() else { return };
        if !failed || !no_actions || self.session.active_turn.as_ref() != Some(&turn_id) {
            return;
        }
        let error = if !finished.ok {
            let code = finished
                .code
                .map(|c| {
                    format!(" ({})", serde_json::to_value(c).unwrap_or_default().as_str().unwrap_or_default())
                })
                .unwrap_or_default();
            format!("model call {} failed{code}: {}", finished.id, finished.error.clone().unwrap_or_default())
        } else if finished.truncated {
            format!("model call {} was truncated: the output hit the token limit", finished.id)
        } else {
            format!("model call {} was refused", finished.id)
        };
        // Transient: the call ran out of time or was rate limited (after its own retries).
        let transient = matches!(finished.code, Some(ErrorCode::RateLimited | ErrorCode::DeadlineExceeded));
        self.end_turn(&turn_id, TurnStatus::Failed, None, Some(error), !finished.ok && transient);
    }

    /// Checks what the types cannot, so an invalid response writes nothing.
    pub(super) fn validate_response(
        &self,
        decision: &Decision,
        response: &DecisionResponse,
    ) -> Result<(), ProtocolError> {
        if let Some(config) = &response.agent {
            config.validate().map_err(|e| ProtocolError::new(format!("agent.{}", e.path), e.message))?;
        }
        let limits = &self.limits;
        if let Some(messages) = &response.messages {
            limits.check_messages("messages", messages).map_err(|(path, p)| ProtocolError::new(path, p))?;
        }
        if let Some(state) = &response.state {
            limits.check_state(state).map_err(|p| ProtocolError::new("state", p))?;
        }
        let agent = response.agent.as_ref().or(self.session.current_agent());
        // Children spawned by earlier actions of this response, with their tool calls.
        let mut spawned: Vec<(&SessionId, &CallId)> = Vec::new();
        for (i, action) in response.actions().iter().enumerate() {
            let at =
                |field: &str, message: String| ProtocolError::new(format!("actions[{i}].{field}"), message);
            match action {
                Action::LlmCall(a) => {
                    if a.model.is_none() && agent.is_none() {
                        return Err(at(
                            "model",
                            "required: the session has no agent config to take it from".into(),
                        ));
                    }
                    if let Some(policy) = &a.retry {
                        policy.validate().map_err(|e| at(&format!("retry.{}", e.path), e.message))?;
                    }
                }
                Action::ToolCall(a) => {
                    if let Some(policy) = &a.retry {
                        policy.validate().map_err(|e| at(&format!("retry.{}", e.path), e.message))?;
                    }
                }
                Action::ToolResult(ToolResultAction { id, .. })
                | Action::ToolError(CallErrorAction { id, .. })
                | Action::LlmResult(LlmResultAction { id, .. })
                | Action::LlmError(CallErrorAction { id, .. }) => {
                    match action {
                        Action::ToolResult(a) => {
                            limits.check_value("the result", &a.result).map_err(|p| at("result", p))?
                        }
                        Action::ToolError(a) => {
                            limits.check_value("the error", &a.error).map_err(|p| at("error", p))?
                        }
                        _ => {}
                    }
                    if id.is_none() && decision.call_id.is_none() {
                        return Err(at(
                            "id",
                            format!(
                                "required: the trigger ({}) is not an execute trigger",
                                decision.trigger.name()
                            ),
                        ));
                    }
                }
                Action::MessageSend(a) => {
                    limits.check_message(&a.message).map_err(|p| at("message.content", p))?;
                    // A child: spawned by an earlier response (its delegation not yet reported)
                    // or by an earlier action of this one. A delegation that settled meanwhile
                    // (its report still queued) is a child the worker could not know was done:
                    // the send is ignored (`action.ignored`), not an invalid response.
                    let open = self.session.calls.iter().any(|c| {
                        matches!(&c.spec, CallSpec::SubAgent { session_id, .. } if *session_id == a.session_id)
                    });
                    if !open && !spawned.iter().any(|(s, _)| **s == a.session_id) {
                        return Err(at(
                            "session_id",
                            format!(
                                "{:?} is not a child of this session: message.send reaches only a session \
                                 spawned by an earlier sub_agent.spawn of this session (delegation not yet reported) \
                                 or an earlier action of this response",
                                a.session_id
                            ),
                        ));
                    }
                }
                Action::SubAgentSpawn(a) => {
                    if !crate::ids::is_safe(a.session_id.as_str()) {
                        return Err(at("session_id", format!("must be {}", crate::ids::SAFE_ID)));
                    }
                    // Only an agent the config in force declares: a worker cannot start
                    // sessions of agents it was not given.
                    let declared = agent.and_then(|config| config.sub_agents.as_deref()).unwrap_or_default();
                    if !declared.iter().any(|sub| sub.id == a.agent_id) {
                        let names: Vec<&str> = declared.iter().map(|sub| sub.id.as_str()).collect();
                        return Err(at(
                            "agent_id",
                            format!(
                                "{:?} is not one of this agent's sub_agents ({})",
                                a.agent_id,
                                if names.is_empty() {
                                    "it declares none".to_owned()
                                } else {
                                    names.join(", ")
                                }
                            ),
                        ));
                    }
                    let depth = self.session.ancestry().len() + 1;
                    if depth > limits.sub_agent_depth {
                        return Err(at(
                            "agent_id",
                            format!(
                                "a sub-agent here would nest {depth} deep, over the limit of {} \
                                 (limits.sub_agent_depth)",
                                limits.sub_agent_depth
                            ),
                        ));
                    }
                    let open = self
                        .session
                        .calls
                        .iter()
                        .filter(|c| !c.is_settled() && matches!(c.spec, CallSpec::SubAgent { .. }))
                        .count();
                    let delegations = open + spawned.len() + 1;
                    if delegations > limits.sub_agent_fanout {
                        return Err(at(
                            "agent_id",
                            format!(
                                "{delegations} delegations would be open at once, over the limit of {} \
                                 (limits.sub_agent_fanout)",
                                limits.sub_agent_fanout
                            ),
                        ));
                    }
                    if a.session_id == self.session.id || self.session.ancestry().contains(&a.session_id) {
                        return Err(at(
                            "session_id",
                            format!(
                                "{:?} is this session or one of its ancestors, which cannot be a sub-agent",
                                a.session_id
                            ),
                        ));
                    }
                    let earlier =
                        spawned.iter().find(|(s, _)| **s == a.session_id).map(|(_, c)| (*c).clone());
                    let other = earlier.or_else(|| {
                        self.session.calls.iter().find_map(|c| match &c.spec {
                            CallSpec::SubAgent { session_id, .. } if *session_id == a.session_id => {
                                Some(c.id.clone())
                            }
                            _ => None,
                        })
                    });
                    if let Some(other) = other.filter(|c| *c != a.tool_call_id) {
                        return Err(at(
                            "session_id",
                            format!(
                                "{:?} is already the child of delegation {other:?}: each delegation \
                                 needs its own session",
                                a.session_id
                            ),
                        ));
                    }
                    if let Some(policy) = &a.retry {
                        policy.validate().map_err(|e| at(&format!("retry.{}", e.path), e.message))?;
                    }
                    spawned.push((&a.session_id, &a.tool_call_id));
                }
                Action::Interrupt(a) => {
                    limits.check_value("the payload", &a.payload).map_err(|p| at("payload", p))?;
                }
                Action::Done(_) => {}
            }
        }
        Ok(())
    }

    /// Reconciles `messages` into the tree; open calls anchored off the new active path are
    /// voided (a fork voids the work below the fork point).
    pub(super) fn record_messages(&mut self, reconciled: super::tree::Reconciled) {
        if reconciled.is_noop(&self.session.tree) {
            return;
        }
        let writes = !reconciled.new_nodes.is_empty();
        let mut cursor = reconciled.new_nodes.first().and_then(|(_, parent)| parent.clone());
        for (message, _) in reconciled.new_nodes {
            if message.role != Role::Tool {
                cursor = self.answer_abandoned_tool_calls(cursor);
            }
            let id = message.id.clone();
            self.emit(Event::MessageRecorded { message, parent_id: cursor });
            cursor = Some(id);
        }
        if !writes {
            self.emit(Event::HeadMoved { head_id: reconciled.head });
        }
        self.void_off_path_calls();
    }

    /// Voids the open calls anchored off the active path (a fork voids the work below the
    /// fork point).
    pub(super) fn void_off_path_calls(&mut self) {
        let off_path: Vec<CallId> = self
            .session
            .calls
            .iter()
            .filter(|c| !c.is_settled() && !self.session.tree.is_on_active_path(c.anchor.as_ref()))
            .map(|c| c.id.clone())
            .collect();
        for id in off_path {
            self.void_call(&id, "its branch was forked");
        }
    }

    /// Before news is written under `parent`, answers the tool calls on its path that have no
    /// result there and are no longer in flight (a fork or edit that dropped their results),
    /// so the transcript stays valid for strict model APIs. Returns the new parent.
    fn answer_abandoned_tool_calls(&mut self, parent: Option<MessageId>) -> Option<MessageId> {
        self.answer_unanswered_tool_calls(parent, ABANDONED)
    }

    /// Answers with `text` the tool calls on the path to `parent` that have no result there and
    /// are not in flight. Returns the new parent.
    fn answer_unanswered_tool_calls(&mut self, parent: Option<MessageId>, text: &str) -> Option<MessageId> {
        let mut cursor = parent;
        for (tool_call_id, name) in self.session.tree.unanswered_tool_calls_at(cursor.as_ref()) {
            if self.session.call(&tool_call_id).is_some() {
                continue;
            }
            let message =
                DraftMessage::tool_result(tool_call_id, name, text).into_message(self.ids.message_id());
            let id = message.id.clone();
            self.emit(Event::MessageRecorded { message, parent_id: cursor });
            cursor = Some(id);
        }
        cursor
    }

    /// Runs one action; `Err` says why it was not carried out.
    fn run_action(
        &mut self,
        decision: &Decision,
        index: usize,
        action: &Action,
        interrupt_follows: bool,
    ) -> Result<(), String> {
        let anchor = self.session.tree.head().cloned();
        let turn_id = decision.turn_id.clone();
        match action {
            Action::LlmCall(a) => {
                let id = a.id.clone().unwrap_or_else(|| self.ids.llm_call_id());
                self.check_fresh(&id)?;
                self.check_budget_before_call(turn_id.as_ref())?;
                // The model is about to read the path: steering messages join it now (a call
                // with messages of its own reads none of the path).
                let anchor = if a.messages.is_none() {
                    self.take_steering(turn_id.as_ref());
                    self.session.tree.head().cloned()
                } else {
                    anchor
                };
                let call = self.llm_call_record(id, a, anchor, turn_id)?;
                self.create_call(call);
            }
            Action::ToolCall(a) => {
                let id = a.id.clone().unwrap_or_else(|| self.ids.tool_call_id());
                self.check_fresh(&id)?;
                let declared = self.session.tool_declaration(&a.name, turn_id.as_ref());
                let handler = a.handler.or(declared.as_ref().and_then(|t| t.handler)).unwrap_or_default();
                if handler == ToolHandler::Server && declared.as_ref().and_then(|t| t.mcp.as_ref()).is_none()
                {
                    return Err(format!(
                        "tool {:?} has handler \"server\" but is no tool of the agent's MCP servers",
                        a.name
                    ));
                }
                let defaults = self.session.defaults();
                let agent_retry = self.session.current_agent().and_then(|c| c.retry);
                let policy = a.retry.unwrap_or(match handler {
                    ToolHandler::Client => defaults.client_tool,
                    ToolHandler::Worker => agent_retry.unwrap_or(defaults.tool),
                    // The agent's retries (a call that never reached its server is tried
                    // again), bounded by the server's timeout plus the time the host takes to
                    // report: the deadline is for a host that stopped, not a slow server.
                    ToolHandler::Server => RetryPolicy {
                        timeout_secs: declared
                            .as_ref()
                            .and_then(|t| t.mcp.as_ref())
                            .map(|m| m.timeout_secs + SERVER_TOOL_REPORT_SECS),
                        ..agent_retry.unwrap_or(defaults.llm)
                    },
                });
                let arguments = match &a.arguments {
                    Value::String(raw) => raw.clone(),
                    other => other.to_string(),
                };
                let spec = CallSpec::ToolCall { name: a.name.clone(), arguments, handler };
                let awaiting_approval = declared.as_ref().is_some_and(AgentTool::needs_approval);
                self.create_call(CallRecord {
                    awaiting_approval,
                    ..new_call(id, spec, anchor, turn_id, policy)
                });
            }
            Action::ToolResult(a) => {
                let id = self.answered_call(decision, a.id.as_ref());
                self.settle_in_response(
                    &id,
                    answered_attempt(decision, &id, a.attempt),
                    Ok(CallValue::Text(result_text(&a.result))),
                    false,
                )?;
            }
            Action::ToolError(a) => {
                let id = self.answered_call(decision, a.id.as_ref());
                self.settle_in_response(
                    &id,
                    answered_attempt(decision, &id, a.attempt),
                    Err(call_error(a)),
                    false,
                )?;
            }
            Action::LlmResult(a) => {
                let id = self.answered_call(decision, a.id.as_ref());
                let call = self.session.call(&id).cloned().ok_or_else(|| format!("no open call {id:?}"))?;
                let outcome = self.llm_result(&call, &a.response);
                self.settle_in_response(&id, answered_attempt(decision, &id, a.attempt), outcome, true)?;
            }
            Action::LlmError(a) => {
                let id = self.answered_call(decision, a.id.as_ref());
                self.settle_in_response(
                    &id,
                    answered_attempt(decision, &id, a.attempt),
                    Err(call_error(a)),
                    true,
                )?;
            }
            Action::SubAgentSpawn(a) => {
                self.check_fresh(&a.tool_call_id)?;
                let policy = a.retry.unwrap_or(self.session.defaults().sub_agent);
                let spec =
                    CallSpec::SubAgent { agent_id: a.agent_id.clone(), session_id: a.session_id.clone() };
                self.create_call(new_call(a.tool_call_id.clone(), spec, anchor, turn_id, policy));
                let mut ancestry = self.session.ancestry();
                ancestry.push(self.session.id.clone());
                self.outbox(OutboxItem::SpawnChild {
                    session_id: a.session_id.clone(),
                    agent_id: a.agent_id.clone(),
                    tool_call_id: a.tool_call_id.clone(),
                    ancestry,
                    identity: self.session.identity(),
                });
            }
            Action::MessageSend(a) => {
                let open = self.session.calls.iter().any(|c| {
                    !c.is_settled() && matches!(&c.spec, CallSpec::SubAgent { session_id, .. } if *session_id == a.session_id)
                });
                if !open {
                    return Err(format!("sub-agent session {:?} has no open delegation", a.session_id));
                }
                self.outbox(OutboxItem::SendMessage {
                    session_id: a.session_id.clone(),
                    message: a.message.clone(),
                    turn_id: TurnId::new(format!("{}.{index}", decision.id)),
                });
            }
            Action::Interrupt(a) => {
                let id = a.interrupt_id.clone().unwrap_or_else(|| self.ids.interrupt_id());
                if self.session.interrupts.iter().any(|i| i.id == id) {
                    return Err(format!("interrupt {id:?} is already open"));
                }
                let interrupt =
                    Interrupt { id, reason: a.reason.clone(), payload: a.payload.clone(), anchor, turn_id };
                self.emit(Event::InterruptOpened { interrupt });
            }
            Action::Done(a) => {
                let active = self.session.active_turn.clone();
                match turn_id {
                    // With interrupts of the turn open, the turn waits for them: `done` takes
                    // effect when the last is resumed.
                    Some(t)
                        if active.as_ref() == Some(&t)
                            && (interrupt_follows || self.turn_has_open_interrupts(&t)) =>
                    {
                        self.emit(Event::TurnDone { turn_id: t, data: a.data.clone() });
                    }
                    Some(t) if active.as_ref() == Some(&t) => {
                        self.end_turn(&t, TurnStatus::Completed, a.data.clone(), None, false);
                    }
                    _ => return Err("no active turn to end: this decision is outside its turn".into()),
                }
            }
        }
        Ok(())
    }

    fn check_fresh(&self, id: &CallId) -> Result<(), String> {
        if self.session.call_id_used(id) || self.used.has_call(id) {
            return Err(format!("call id {id:?} is already used: the call is not made again"));
        }
        Ok(())
    }

    /// The call a settle action answers: its `id`, else the execute trigger's call.
    fn answered_call(&self, decision: &Decision, id: Option<&CallId>) -> CallId {
        id.cloned().or_else(|| decision.call_id.clone()).unwrap_or_default()
    }

    fn settle_in_response(
        &mut self,
        id: &CallId,
        attempt: Option<u32>,
        outcome: CallOutcome,
        want_llm: bool,
    ) -> Result<(), String> {
        let call = self.session.call(id).ok_or_else(|| format!("no open call {id:?}"))?;
        if (call.kind() == CallKind::LlmCall) != want_llm {
            return Err(format!("call {id:?} is of kind {:?}", call.kind()));
        }
        if call.is_engine_run() {
            return Err(format!("call {id:?} is run by the engine, not the worker"));
        }
        self.settle_checked(id, attempt, outcome).map_err(|r| r.to_string())
    }

    fn llm_call_record(
        &self,
        id: CallId,
        a: &LlmCallAction,
        anchor: Option<MessageId>,
        turn_id: Option<TurnId>,
    ) -> Result<CallRecord, String> {
        let agent = self.session.current_agent();
        // The call's id is the record's own; the action keeps what it was given.
        let mut action = a.clone();
        action.model = a.model.clone().or(agent.map(|c| c.model.clone()));
        if action.model.is_none() {
            return Err("no model: the action names none and the session has no agent config".into());
        }
        // A session without a worker keeps its declared config for good, one with a worker every
        // version it wrote: its calls refer to the config instead of copying the system prompt
        // and the tools (see `CallSpec::LlmCall`).
        let from_agent = !self.session.has_worker();
        let version = if from_agent { None } else { self.session.current_agent_version() };
        let refers = from_agent || version.is_some();
        if action.tools.is_none() && !refers {
            action.tools = self.session.offered_tools(turn_id.as_ref());
        }
        let handler = a.handler.or(agent.and_then(|c| c.handler)).unwrap_or_default();
        let stream = a.stream.or(agent.and_then(|c| c.stream)).unwrap_or(false);
        let format = if handler == LlmHandler::Worker { agent.and_then(|c| c.format) } else { None };
        let system = if a.messages.is_some() || refers { None } else { agent.and_then(|c| c.system.clone()) };
        let policy = a.retry.or(agent.and_then(|c| c.retry)).unwrap_or(self.session.defaults().llm);
        let spec = CallSpec::LlmCall { action, handler, stream, format, system, agent: version };
        Ok(new_call(id, spec, anchor, turn_id, policy))
    }

    fn create_call(&mut self, call: CallRecord) {
        self.emit(Event::CallCreated { call: call.clone() });
        self.start_queued_call(&call);
    }
}

fn new_call(
    id: CallId,
    spec: CallSpec,
    anchor: Option<MessageId>,
    turn_id: Option<TurnId>,
    policy: RetryPolicy,
) -> CallRecord {
    CallRecord {
        id,
        spec,
        status: CallStatus::Queued,
        attempt: 0,
        deadline: None,
        retry_at: None,
        anchor,
        turn_id,
        policy,
        outcome: None,
        awaiting_approval: false,
    }
}

/// The attempt a settle action answers: its `attempt`, else, for the execute trigger's own
/// call, the attempt that trigger delivered (so a late answer to an old attempt is fenced).
fn answered_attempt(decision: &Decision, id: &CallId, attempt: Option<u32>) -> Option<u32> {
    attempt.or_else(|| match &decision.trigger {
        Trigger::ToolExecute(t) if &t.id == id => Some(t.attempt),
        Trigger::LlmExecute(t) if &t.id == id => Some(t.attempt),
        _ => None,
    })
}

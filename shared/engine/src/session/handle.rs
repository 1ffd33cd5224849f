//! Handling commands: the transition in progress, client inputs, and turns starting and
//! ending. A transition works on a draft of the session, applying each event as it is emitted
//! so later steps see earlier ones; a rejection discards the draft. Settles, claims and time
//! are in `calls.rs`, opening decisions in `decide.rs`, carrying out responses in `respond.rs`.

use serde_json::Value;

use super::calls::{ChildReport, Fence, result_text};
use super::command::{Command, Rejection};
use super::event::Event;
use super::outbox::OutboxItem;
use super::records::*;
use super::used::UsedIds;
use super::{Ctx, Session};
use crate::ids::{CallId, IdMinter, InterruptId, MessageId, SessionId, TurnId};
use crate::protocol::*;
use crate::time::Timestamp;

/// Bounds how many decisions one command may open and resolve in-process (engine-hosted
/// agents accept proposals in a loop); a well-formed session never comes near it.
pub(super) const MAX_STEPS_PER_COMMAND: usize = 10_000;

/// A transition in progress.
pub(super) struct Tx {
    pub session: Session,
    pub events: Vec<Event>,
    pub ids: IdMinter,
    pub now: Timestamp,
    /// Ids the store remembers that the head forgot (see [`super::used`]).
    pub used: UsedIds,
    /// The engine-hosted step being carried out when it wrote no `decision.accepted` (see
    /// `Tx::accept_step`); written after all if an event comes to name the decision.
    pub unrecorded_step: Option<crate::ids::DecisionId>,
    pub limits: super::Limits,
    /// Version values the store read back for this command.
    pub recalled: super::Recalled,
    /// Log positions of versions this command needs that neither the head nor `recalled`
    /// holds: the command is refused with [`Rejection::Recall`] and handled again.
    pub recall: Vec<u64>,
}

impl Tx {
    pub fn new(session: Session, ctx: &Ctx) -> Self {
        Tx {
            session,
            events: Vec::new(),
            ids: IdMinter::new(ctx.seed),
            now: ctx.now,
            used: ctx.used.clone(),
            unrecorded_step: None,
            limits: ctx.limits,
            recalled: ctx.recalled.clone(),
            recall: Vec::new(),
        }
    }

    pub fn emit(&mut self, event: Event) {
        let moves_head = matches!(event, Event::MessageRecorded { .. } | Event::HeadMoved { .. });
        self.session.apply(&event);
        self.events.push(event);
        if moves_head {
            self.restore_versions();
        }
    }

    /// After a head move: the current versions whose values the head let go are restored
    /// from what the store read back, or asked for.
    fn restore_versions(&mut self) {
        for (kind, index, seq) in self.session.missing_versions() {
            let restored = match kind {
                super::VersionKind::State => {
                    self.recalled.state(seq).map(|value| Event::StateRestored { index, value: value.clone() })
                }
                super::VersionKind::Agent => self
                    .recalled
                    .agent(seq)
                    .map(|config| Event::AgentRestored { index, config: config.clone() }),
            };
            match restored {
                Some(event) => self.emit(event),
                None if !self.recall.contains(&seq) => self.recall.push(seq),
                None => {}
            }
        }
    }

    /// The agent's MCP tools are now `tools`: the current config's MCP tools are replaced (its
    /// other tools kept, first), written as a config version when that changes anything. A
    /// session with no config (a worker's, before it wrote one) has no tools to replace.
    fn mcp_tools_listed(&mut self, tools: Vec<AgentTool>) {
        let Some(current) = self.session.current_agent() else { return };
        let listed: Vec<AgentTool> =
            current.tools().iter().filter(|t| t.mcp.is_none()).cloned().chain(tools).collect();
        if listed == current.tools() {
            return;
        }
        let mut config = current.clone();
        config.tools = (!listed.is_empty()).then_some(listed);
        // A listed name that another tool or a sub-agent already has: the config would be
        // refused as a worker's would; the session keeps the tools it has.
        if config.validate().is_err() {
            return;
        }
        let anchor = self.session.tree.head().cloned();
        self.emit(Event::AgentWritten { anchor, config });
    }

    pub fn run(&mut self, command: Command) -> Result<(), Rejection> {
        match command {
            Command::Create { init } => return self.create(*init),
            _ if !self.session.is_created() => return Err(Rejection::NotFound(self.session.id.clone())),
            Command::Submit { input, queue, origin } => self.submit(input, queue, origin)?,
            Command::Steer { input } => self.steer(input)?,
            Command::Seed { messages } => self.seed(messages)?,
            Command::Withdraw { turn_id } => self.withdraw(&turn_id)?,
            Command::Rename { title } => self.rename(&title)?,
            Command::Rewind { head } => self.rewind(head)?,
            Command::Reorder { order } => self.reorder(order)?,
            Command::McpToolsListed { tools } => self.mcp_tools_listed(tools),
            Command::Forked { into, turn_id } => {
                self.emit(Event::Forked { session_id: into, turn_id });
            }
            Command::ClaimDecision { decision_id, attempt } => self.claim_decision(&decision_id, attempt)?,
            Command::Answer { decision_id, attempt: _, response, ignored_fields, transcript } => {
                // Any attempt's answer resolves the live decision; once resolved, later
                // answers (redeliveries, stragglers) find it no longer live and are no-ops.
                if let Some(decision) = self.session.decision.clone().filter(|d| d.id == decision_id) {
                    let base = self.session.answer_base(&response, transcript);
                    self.resolve(&decision, *response, base, Resolver::Worker, ignored_fields);
                }
            }
            Command::DeliveryFailed { decision_id, attempt, error, retryable } => {
                self.delivery_failed(&decision_id, attempt, error, retryable)
            }
            Command::ClaimLlmCall { call_id, attempt } => self.claim_llm_call(&call_id, attempt)?,
            Command::LlmCallFinished { call_id, attempt, outcome } => {
                self.settle(&call_id, Some(attempt), outcome.map(CallValue::Llm), Fence::Reject)?
            }
            Command::Compact {
                call_id,
                attempt,
                compaction,
                response,
                tokens_before,
                tokens_after,
                reason,
            } => {
                self.compact(&call_id, attempt, compaction, response, (tokens_before, tokens_after), reason)?
            }
            Command::ClaimToolCall { call_id, attempt } => self.claim_tool_call(&call_id, attempt)?,
            Command::ToolCallFinished { call_id, attempt, outcome } => {
                let outcome = outcome.and_then(|content| self.server_tool_value(content));
                self.settle(&call_id, Some(attempt), outcome, Fence::Reject)?
            }
            Command::Settle { action } => self.external_settle(action)?,
            Command::SubAgentFinished { tool_call_id, session_id, ok, result, error, retryable, turn_id } => {
                let report = ChildReport { ok, result, error, retryable, turn_id };
                self.sub_agent_finished(&tool_call_id, &session_id, report)
            }
            Command::Cancel { reason } => {
                let turn_id = self.session.active_turn.clone().ok_or(Rejection::NoActiveTurn)?;
                self.end_turn(&turn_id, TurnStatus::Cancelled, None, Some(reason), false);
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

    pub(super) fn create(&mut self, init: SessionInit) -> Result<(), Rejection> {
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

    pub(super) fn submit(
        &mut self,
        input: ClientInput,
        queue: bool,
        origin: TurnOrigin,
    ) -> Result<(), Rejection> {
        check_turn_id(input.turn_id())?;
        self.check_input_limits(&input)?;
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
                let input = TurnInput::Message { message: i.message, client: i.client };
                self.start_turn(&i.agent_id, i.turn_id, input, queue, origin, true)
            }
            ClientInput::Messages(i) => self.submit_view(i, queue, origin),
            ClientInput::ToolApproval(a) => self.approve(a),
            ClientInput::Action(i) => {
                self.check_agent(&i.agent_id)?;
                if self.known_turn(i.turn_id.as_ref()) {
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
    pub(super) fn submit_view(
        &mut self,
        i: ClientMessagesInput,
        queue: bool,
        origin: TurnOrigin,
    ) -> Result<(), Rejection> {
        self.check_agent(&i.agent_id)?;
        if self.known_turn(i.turn_id.as_ref()) {
            return Ok(());
        }
        let view: Vec<DraftMessage> = i.messages.into_iter().filter(|m| m.role != Role::System).collect();
        let news = &view[self.session.tree.new_from(&view)..];
        let answers: Vec<(CallId, String)> = news
            .iter()
            .filter(|m| m.role == Role::Tool)
            .filter_map(|m| {
                let id = m.tool_call_id.as_ref()?;
                let call = self.session.call(id)?;
                (call.is_client_tool() && call.is_pending()).then(|| (id.clone(), m.content_text()))
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
                at: Some(self.now),
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

    pub(super) fn check_agent(&self, agent_id: &str) -> Result<(), Rejection> {
        if agent_id != self.session.agent_id() {
            return Err(Rejection::AgentMismatch {
                expected: self.session.agent_id().to_owned(),
                given: agent_id.to_owned(),
            });
        }
        Ok(())
    }

    pub(super) fn known_turn(&self, turn_id: Option<&TurnId>) -> bool {
        turn_id.is_some_and(|t| self.session.knows_turn(t) || self.used.has_turn(t))
    }

    pub(super) fn start_turn(
        &mut self,
        agent_id: &str,
        turn_id: Option<TurnId>,
        input: TurnInput,
        queue: bool,
        origin: TurnOrigin,
        writes_message: bool,
    ) -> Result<(), Rejection> {
        self.check_agent(agent_id)?;
        if self.known_turn(turn_id.as_ref()) {
            return Ok(());
        }
        let id = turn_id.unwrap_or_else(|| self.ids.turn_id());
        // A session without a title takes one from the first turn's message.
        let title =
            self.session.title.is_none().then(|| input.user_text().and_then(|t| title_from(&t))).flatten();
        let mut turn = self.queued_turn(id, input, origin);
        if let Some(active) = &self.session.active_turn {
            if !queue {
                return Err(Rejection::TurnAlreadyActive { turn_id: active.clone() });
            }
            self.check_queue()?;
            self.name(title);
            self.emit(Event::TurnQueued { turn });
            return Ok(());
        }
        if writes_message && self.session.is_paused() {
            let interrupt_ids = self.session.pausing_interrupts().iter().map(|i| i.id.clone()).collect();
            return Err(Rejection::BranchPaused { interrupt_ids });
        }
        if !self.session.queued_turns.is_empty() {
            // Queued turns start in arrival order: this one waits its place.
            self.check_queue()?;
            self.name(title);
            self.emit(Event::TurnQueued { turn });
            return Ok(());
        }
        turn.status = TurnStatus::Active;
        turn.started_at = Some(self.now);
        let Some(source) = turn.input.take().map(turn_source) else { return Ok(()) };
        let turn_id = turn.id.clone();
        // Before the turn's events, which a step right after them folds into fewer.
        self.name(title);
        self.emit(Event::TurnStarted { turn });
        self.emit(Event::TriggerQueued { trigger: PendingTrigger { source, turn_id: Some(turn_id) } });
        Ok(())
    }

    /// Gives the session `title`, if there is one.
    fn name(&mut self, title: Option<String>) {
        if let Some(title) = title {
            self.emit(Event::SessionTitled { title });
        }
    }

    /// `Command::Rename`: the session's title, as a person chose it.
    fn rename(&mut self, title: &str) -> Result<(), Rejection> {
        let title = title.trim();
        if title.is_empty() || title.chars().count() > MAX_TITLE_CHARS {
            return Err(Rejection::invalid("title", format!("a title is 1 to {MAX_TITLE_CHARS} characters")));
        }
        if self.session.title.as_deref() != Some(title) {
            self.emit(Event::SessionTitled { title: title.to_owned() });
        }
        Ok(())
    }

    /// `Command::Rewind`: the head moves back to a recorded message. The move is recorded even
    /// where the head already is: it is the client's truncation, which its chat shows.
    fn rewind(&mut self, head: Option<MessageId>) -> Result<(), Rejection> {
        if let Some(turn_id) = self.session.active_turn.clone() {
            return Err(Rejection::TurnAlreadyActive { turn_id });
        }
        if let Some(id) = head.as_ref().filter(|id| !self.session.tree.contains(id)) {
            return Err(Rejection::invalid("head", format!("no message {id} in this session")));
        }
        self.emit(Event::HeadMoved { head_id: head });
        self.void_off_path_calls();
        Ok(())
    }

    /// Room for one more waiting turn.
    fn check_queue(&self) -> Result<(), Rejection> {
        let queued = self.session.queued_turns.len();
        if queued >= self.limits.queued_turns {
            return Err(Rejection::QueueFull { queued });
        }
        Ok(())
    }

    /// A client's input within the session's limits on sizes and counts.
    fn check_input_limits(&self, input: &ClientInput) -> Result<(), Rejection> {
        let limits = &self.limits;
        fn at(path: &'static str) -> impl Fn(String) -> Rejection {
            move |problem| Rejection::invalid(path, problem)
        }
        match input {
            ClientInput::Message(i) => limits.check_message(&i.message).map_err(at("message.content")),
            ClientInput::Messages(i) => {
                if i.messages.len() > limits.messages_per_input {
                    return Err(Rejection::invalid(
                        "messages",
                        format!(
                            "{} messages, over the limit of {} (limits.messages_per_input)",
                            i.messages.len(),
                            limits.messages_per_input
                        ),
                    ));
                }
                limits
                    .check_messages("messages", &i.messages)
                    .map_err(|(path, p)| Rejection::invalid(path, p))
            }
            ClientInput::Action(i) => limits.check_value("the action's args", &i.args).map_err(at("args")),
            ClientInput::InterruptResume(i) => {
                limits.check_value("the payload", &i.payload).map_err(at("payload"))
            }
            ClientInput::ToolResult(r) => limits.check_value("the result", &r.result).map_err(at("result")),
            ClientInput::ToolError(e) => limits.check_value("the error", &e.error).map_err(at("error")),
            ClientInput::ToolApproval(a) => limits.check_value("the reason", &a.reason).map_err(at("reason")),
        }
    }

    /// A turn of `input`, queued (until it starts).
    fn queued_turn(&self, id: TurnId, input: TurnInput, origin: TurnOrigin) -> TurnRecord {
        let client = match &input {
            TurnInput::Messages { client, .. } | TurnInput::Message { client: Some(client), .. } => {
                Some(client)
            }
            _ => None,
        };
        let client_tools = client.and_then(|c| c.tools.clone()).unwrap_or_default();
        let client_id = client.and_then(|c| c.client_id.clone());
        TurnRecord {
            id,
            status: TurnStatus::Queued,
            origin,
            input: Some(input),
            client_tools,
            client_id,
            submitted_at: self.now,
            started_at: None,
            ended_at: None,
            data: None,
            error: None,
            code: None,
            usage: Usage::default(),
            done_pending: false,
            steering: false,
        }
    }

    /// `Command::Withdraw`: a waiting turn ends, cancelled, before it started.
    fn withdraw(&mut self, turn_id: &TurnId) -> Result<(), Rejection> {
        if !self.session.queued_turns.contains(turn_id) {
            return Err(Rejection::NotQueued(turn_id.clone()));
        }
        self.emit(Event::TurnEnded {
            turn_id: turn_id.clone(),
            status: TurnStatus::Cancelled,
            data: None,
            error: Some("withdrawn by the client before it started".to_owned()),
            code: None,
            at: self.now,
        });
        Ok(())
    }

    /// `Command::Reorder`: the queued turns of `order` first, the others after as they were.
    fn reorder(&mut self, order: Vec<TurnId>) -> Result<(), Rejection> {
        let queued: Vec<TurnId> = self
            .session
            .queued_turns
            .iter()
            .filter(|t| !self.session.turns.get(*t).is_some_and(|t| t.steering))
            .cloned()
            .collect();
        let mut next: Vec<TurnId> = Vec::with_capacity(queued.len());
        for (i, id) in order.into_iter().enumerate() {
            if !queued.contains(&id) {
                return Err(Rejection::invalid(
                    format!("order[{i}]"),
                    format!("{id:?} is not a queued turn"),
                ));
            }
            if !next.contains(&id) {
                next.push(id);
            }
        }
        let rest: Vec<TurnId> = queued.iter().filter(|t| !next.contains(t)).cloned().collect();
        next.extend(rest);
        if next != queued {
            self.emit(Event::QueueReordered { order: next });
        }
        Ok(())
    }

    /// `Command::Seed`: a new session's history becomes its path.
    fn seed(&mut self, messages: Vec<Message>) -> Result<(), Rejection> {
        if !self.session.tree.is_empty() || self.session.active_turn.is_some() {
            return Err(Rejection::invalid("messages", "only a session with no messages yet can be seeded"));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(i) = messages.iter().position(|m| !seen.insert(&m.id)) {
            return Err(Rejection::invalid(
                format!("messages[{i}].id"),
                format!("{:?} appears twice", messages[i].id),
            ));
        }
        let mut parent = None;
        for message in messages {
            let id = message.id.clone();
            self.emit(Event::MessageRecorded { message, parent_id: parent });
            parent = Some(id);
        }
        Ok(())
    }

    /// `Command::Steer`: with a turn active, the message waits as a steering turn for the
    /// turn's next safe point ([`Tx::take_steering`]); without one it starts a turn.
    pub(super) fn steer(&mut self, i: ClientMessageInput) -> Result<(), Rejection> {
        if self.session.active_turn.is_none() {
            return self.submit(ClientInput::Message(i), false, TurnOrigin::Client);
        }
        if i.message.role != Role::User {
            return Err(Rejection::invalid("message.role", "a steering message must be the user's"));
        }
        check_turn_id(i.turn_id.as_ref())?;
        self.limits.check_message(&i.message).map_err(|p| Rejection::invalid("message.content", p))?;
        self.check_agent(&i.agent_id)?;
        if self.known_turn(i.turn_id.as_ref()) {
            return Ok(());
        }
        self.check_queue()?;
        let id = i.turn_id.unwrap_or_else(|| self.ids.turn_id());
        let input = TurnInput::Message { message: i.message, client: i.client };
        let turn = TurnRecord { steering: true, ..self.queued_turn(id, input, TurnOrigin::Client) };
        self.emit(Event::TurnQueued { turn });
        Ok(())
    }

    /// At a safe point of active turn `turn_id` (a model call is about to be made, and no tool
    /// call on the path waits for its result), the steering messages sent meanwhile join the
    /// path, in the order they came, and their turns join the active one.
    pub(super) fn take_steering(&mut self, turn_id: Option<&TurnId>) {
        let Some(active) = self.session.active_turn.clone().filter(|a| Some(a) == turn_id) else { return };
        let head = self.session.tree.head().cloned();
        if !self.session.tree.unanswered_tool_calls_at(head.as_ref()).is_empty() {
            return;
        }
        let steering: Vec<(TurnId, DraftMessage)> = self
            .session
            .queued_turns
            .iter()
            .filter_map(|t| self.session.turns.get(t))
            .filter(|t| t.steering)
            .filter_map(|t| match &t.input {
                Some(TurnInput::Message { message, .. }) => Some((t.id.clone(), message.clone())),
                _ => None,
            })
            .collect();
        let mut parent = head;
        for (turn_id, message) in steering {
            let message = message.into_message(self.ids.message_id());
            let id = message.id.clone();
            self.emit(Event::MessageRecorded { message, parent_id: parent });
            self.emit(Event::TurnSteered { turn_id, into: active.clone() });
            parent = Some(id);
        }
    }

    /// `tool.approval`: an approved call starts; a denied one settles with the denial, which
    /// the model is told as the call's result.
    pub(super) fn approve(&mut self, a: ToolApprovalInput) -> Result<(), Rejection> {
        let call = self.open_call(&a.id)?.clone();
        if !call.awaiting_approval {
            return Err(Rejection::NotAwaitingApproval(a.id));
        }
        if a.approved {
            self.emit(Event::CallApproved { call_id: call.id.clone() });
            let call = CallRecord { awaiting_approval: false, ..call };
            self.start_queued_call(&call);
            return Ok(());
        }
        let name = call.name().unwrap_or_default();
        let because = a.reason.map(|r| format!(": {r}")).unwrap_or_default();
        let denial = CallError::terminal(format!("the user denied this call of {name}{because}"));
        self.settle(&call.id, None, Err(denial), Fence::Reject)
    }

    pub(super) fn start_next_queued_turn(&mut self) {
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

    pub(super) fn resume(&mut self, resume: InterruptResumeInput) -> Result<(), Rejection> {
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
        let turn_id = interrupt.turn_id;
        self.emit(Event::TriggerQueued { trigger: PendingTrigger { source, turn_id: turn_id.clone() } });
        // A `done` that waited for the turn's interrupts takes effect with the last resume.
        if let Some(turn_id) = turn_id {
            self.complete_if_done(&turn_id);
        }
        Ok(())
    }

    /// Ends active turn `turn_id`, completed, if its `done` waits and no interrupt of the turn
    /// is open any more.
    pub(super) fn complete_if_done(&mut self, turn_id: &TurnId) {
        if self.session.active_turn.as_ref() == Some(turn_id)
            && let Some(turn) = self.session.turns.get(turn_id).filter(|t| t.done_pending)
            && !self.turn_has_open_interrupts(turn_id)
        {
            let data = turn.data.clone();
            self.end_turn(turn_id, TurnStatus::Completed, data, None, false);
        }
    }

    /// Whether interrupts raised in turn `turn_id` are still open.
    pub(super) fn turn_has_open_interrupts(&self, turn_id: &TurnId) -> bool {
        self.session.interrupts.iter().any(|i| i.turn_id.as_ref() == Some(turn_id))
    }

    // ----- turns ending ----------------------------------------------------------------

    /// Ends a turn. A failed or cancelled turn voids the session's open work and answers
    /// every tool call left unanswered on the active path, so the transcript stays valid.
    /// `retryable`: a failure is transient (a parent's delegation with retries left sends its
    /// task again).
    pub(super) fn end_turn(
        &mut self,
        turn_id: &TurnId,
        status: TurnStatus,
        data: Option<Value>,
        error: Option<String>,
        retryable: bool,
    ) {
        self.end_turn_coded(turn_id, status, data, error, None, retryable);
    }

    /// [`Tx::end_turn`] with the failure's class.
    pub(super) fn end_turn_coded(
        &mut self,
        turn_id: &TurnId,
        status: TurnStatus,
        data: Option<Value>,
        error: Option<String>,
        code: Option<ErrorCode>,
        retryable: bool,
    ) {
        if status != TurnStatus::Completed {
            let reason = error.clone().unwrap_or_else(|| "the turn ended".to_owned());
            self.close_open_work(turn_id, &reason, status);
        }
        self.emit(Event::TurnEnded {
            turn_id: turn_id.clone(),
            status,
            data: data.clone(),
            error: error.clone(),
            code,
            at: self.now,
        });
        let turn = self.session.turns.get(turn_id).cloned();
        if let (Some(parent), Some(turn)) = (self.session.parent().cloned(), turn)
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
                retryable: !ok && status == TurnStatus::Failed && retryable,
                turn_id: Some(turn_id.clone()),
            });
        }
        self.start_next_queued_turn();
    }

    /// A turn's final output as text: `done`'s data, else the last assistant message.
    pub(super) fn final_output(&self, data: Option<&Value>) -> String {
        match data {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Null) | None => self
                .session
                .tree
                .path_back(self.session.tree.head())
                .find(|m| m.role == Role::Assistant)
                .map(|m| m.content_text())
                .unwrap_or_default(),
            Some(other) => other.to_string(),
        }
    }

    pub(super) fn close_open_work(&mut self, turn_id: &TurnId, reason: &str, status: TurnStatus) {
        if let Some(d) = self.session.decision.clone() {
            self.emit(Event::DecisionVoided { decision_id: d.id, reason: reason.to_owned() });
        }
        let open: Vec<CallId> = self.session.calls.iter().map(|c| c.id.clone()).collect();
        for id in open {
            self.void_call(&id, reason);
        }
        let interrupts: Vec<InterruptId> = self
            .session
            .interrupts
            .iter()
            .filter(|i| i.turn_id.as_ref() == Some(turn_id) || i.turn_id.is_none())
            .map(|i| i.id.clone())
            .collect();
        for interrupt_id in interrupts {
            self.emit(Event::InterruptClosed { interrupt_id });
        }
        let word = if status == TurnStatus::Cancelled { "cancelled" } else { "failed" };
        for (tool_call_id, name) in self.session.tree.unanswered_tool_calls() {
            let id = self.ids.message_id();
            let text = format!("error: the turn {word} before this tool call finished: {reason}");
            let message = DraftMessage::tool_result(tool_call_id, name, text).into_message(id);
            let parent_id = self.session.tree.head().cloned();
            self.emit(Event::MessageRecorded { message, parent_id });
        }
    }

    pub(super) fn void_call(&mut self, call_id: &CallId, reason: &str) {
        let Some(call) = self.session.call(call_id).cloned() else { return };
        self.emit(Event::CallVoided { call_id: call_id.clone(), reason: reason.to_owned() });
        if !call.is_settled()
            && let CallSpec::SubAgent { session_id, .. } = call.spec
        {
            self.cancel_child(call_id, &session_id, reason);
        }
    }

    /// Stops the child of delegation `call_id`: a child not yet created (its spawn still in
    /// the outbox) is never created, its spawn and messages withdrawn (so a session that
    /// turns out not to be ours is never touched); a created one is cancelled.
    pub(super) fn cancel_child(&mut self, call_id: &CallId, child: &SessionId, reason: &str) {
        let unspawned = self.session.outbox.values().any(|item| {
            matches!(item, OutboxItem::SpawnChild { session_id, tool_call_id, .. }
                if session_id == child && tool_call_id == call_id)
        });
        if !unspawned {
            self.outbox(OutboxItem::CancelChild { session_id: child.clone(), reason: reason.to_owned() });
            return;
        }
        let withdrawn: Vec<u64> = self
            .session
            .outbox
            .iter()
            .filter(|(_, item)| {
                matches!(item, OutboxItem::SpawnChild { session_id, .. } | OutboxItem::SendMessage { session_id, .. }
                    if session_id == child)
            })
            .map(|(seq, _)| *seq)
            .collect();
        for seq in withdrawn {
            let reason = format!("the delegation {call_id} ended before its child was created: {reason}");
            self.emit(Event::OutboxWithdrawn { seq, reason });
        }
    }

    // ----- budgets ---------------------------------------------------------------------

    /// After an LLM call of the active turn `turn_id` settled: a turn whose usage now passes
    /// its budget (cost above `max_cost`, more calls than `max_llm_calls`) fails with
    /// `budget_exceeded`, voiding its open work (the settled call with it: its response is not
    /// recorded). Returns whether it did.
    pub(super) fn check_budget_after_call(&mut self, turn_id: Option<&TurnId>) -> bool {
        let Some((turn, budget)) = self.budgeted_turn(turn_id) else { return false };
        let usage = &turn.usage;
        let problem = match (budget.max_cost_picodollars, budget.max_llm_calls) {
            (Some(max), _) if usage.cost_picodollars > max => Some(format!(
                "the turn's model calls cost ${}, past its max_cost of ${}",
                usage.cost(),
                format_picodollars(max)
            )),
            (_, Some(max)) if usage.llm_calls > max => {
                Some(format!("the turn made {} model calls, past its max_llm_calls {max}", usage.llm_calls))
            }
            _ => None,
        };
        let Some(problem) = problem else { return false };
        self.fail_over_budget(&turn.id, problem);
        true
    }

    /// Before an LLM call of the active turn `turn_id` is made: when the call would pass the
    /// turn's budget (its calls made and still open already reach `max_llm_calls`, or its cost
    /// has reached `max_cost`), the turn fails with `budget_exceeded` instead and the call is
    /// not made. `Err` says why.
    pub(super) fn check_budget_before_call(&mut self, turn_id: Option<&TurnId>) -> Result<(), String> {
        let Some((turn, budget)) = self.budgeted_turn(turn_id) else { return Ok(()) };
        let open = self
            .session
            .calls
            .iter()
            .filter(|c| {
                c.kind() == CallKind::LlmCall && !c.is_settled() && c.turn_id.as_ref() == Some(&turn.id)
            })
            .count() as u64;
        let calls = turn.usage.llm_calls + open;
        let problem = match (budget.max_cost_picodollars, budget.max_llm_calls) {
            (_, Some(max)) if calls >= max => Some(format!(
                "the turn has {calls} model calls made or under way (max_llm_calls {max}): another is not started"
            )),
            (Some(max), _) if turn.usage.cost_picodollars >= max => Some(format!(
                "the turn's model calls cost ${}, all of its max_cost of ${}: another is not started",
                turn.usage.cost(),
                format_picodollars(max)
            )),
            _ => None,
        };
        let Some(problem) = problem else { return Ok(()) };
        self.fail_over_budget(&turn.id, problem.clone());
        Err(format!("budget_exceeded: {problem}"))
    }

    /// The active turn `turn_id` names, with the session's budget, when one limits it.
    fn budgeted_turn(&self, turn_id: Option<&TurnId>) -> Option<(TurnRecord, Budget)> {
        let budget = self.session.init.as_ref().map(|i| i.budget).filter(|b| !b.is_unlimited())?;
        let turn_id = turn_id.filter(|t| self.session.active_turn.as_ref() == Some(*t))?;
        Some((self.session.turns.get(turn_id)?.clone(), budget))
    }

    fn fail_over_budget(&mut self, turn_id: &TurnId, problem: String) {
        let error = format!("budget_exceeded: {problem}");
        self.end_turn_coded(
            turn_id,
            TurnStatus::Failed,
            None,
            Some(error),
            Some(ErrorCode::BudgetExceeded),
            false,
        );
    }

    pub(super) fn outbox(&mut self, item: OutboxItem) {
        let seq = self.session.next_outbox_seq;
        self.emit(Event::OutboxQueued { seq, item });
    }
}

fn turn_source(input: TurnInput) -> TriggerSource {
    match input {
        TurnInput::Message { message, client } => TriggerSource::ClientMessage { message, client },
        TurnInput::Messages { messages, client } => TriggerSource::ClientMessages { messages, client },
        TurnInput::Action { name, args } => TriggerSource::ClientAction { name, args },
    }
}

/// A client's turn id names its turn in URLs (`/turns/{turn_id}`): it keeps to the safe
/// alphabet of ids.
fn check_turn_id(turn_id: Option<&TurnId>) -> Result<(), Rejection> {
    match turn_id {
        Some(id) if !crate::ids::is_safe(id.as_str()) => Err(Rejection::invalid(
            "turn_id",
            format!("{id:?} is not a turn id: use {}", crate::ids::SAFE_ID),
        )),
        _ => Ok(()),
    }
}

/// The most characters a title a person gives may have.
pub const MAX_TITLE_CHARS: usize = 200;
/// The most characters of a title taken from a message.
const DERIVED_TITLE_CHARS: usize = 80;

/// A title from a user's `text`: its first line that says something, spaces collapsed, cut to
/// [`DERIVED_TITLE_CHARS`] characters (ending with `…` when cut).
pub fn title_from(text: &str) -> Option<String> {
    let line =
        text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).find(|l| !l.is_empty())?;
    if line.chars().count() <= DERIVED_TITLE_CHARS {
        return Some(line);
    }
    let cut: String = line.chars().take(DERIVED_TITLE_CHARS - 1).collect();
    Some(format!("{}…", cut.trim_end()))
}

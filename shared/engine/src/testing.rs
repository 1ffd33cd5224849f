//! Test support (feature `testing`): [`Driver`] runs one session through the engine as the
//! runtime's dispatcher would (submit, claim and finish LLM calls, deliver and answer
//! decisions), keeping the event log and which events are not yet committed, and checking the
//! engine's invariants after every step when asked to. The engine's own tests and the runtime's
//! store conformance suite both drive sessions with it; the builders below make the inputs
//! they share.

// Test support: a refused command or a broken invariant must fail the calling test loudly,
// with the values in view, so this module panics where the engine never does.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::ids::{CallId, DecisionId, SessionId, TurnId};
use crate::protocol::{
    Action, AgentConfig, ClientInput, ClientMessageInput, DecisionRequest, DecisionResponse, DraftMessage,
    LlmResponse, Role, ToolApprovalInput, ToolCall, ToolResultInput, WorkerIdentity,
};
use crate::session::{
    Budget, CallError, Command, Ctx, Defaults, Effect, Event, Limits, Rejection, Session, SessionInit,
    TurnOrigin, TurnRecord, handle,
};
use crate::time::Timestamp;

/// One session driven through the engine, with its log.
///
/// Each command gets a fresh seed (the previous plus one) and the driver's clock; the clock then
/// moves on by the driver's step (none unless set). A checked driver asserts the invariants of
/// [`check_invariants`] after every command, which replays the whole log: keep it for short
/// sessions.
#[derive(Debug, Clone)]
pub struct Driver {
    /// The session after every handled command.
    pub session: Session,
    /// Every event so far, committed or not (minus what [`Driver::forget_committed`] dropped).
    pub log: Vec<Event>,
    /// The engine's clock for the next command.
    pub now: Timestamp,
    /// The head version the next commit names (0: not yet stored); the engine never reads it,
    /// a store's test keeps it with [`Driver::committed`].
    pub version: u64,
    seed: u64,
    clock_step_ms: u64,
    checked: bool,
    /// How many events at the end of `log` are not yet committed.
    uncommitted: usize,
    /// The limits every command runs with (the engine's defaults unless a test sets them).
    pub limits: Limits,
}

impl Driver {
    /// A driver of the not yet created session `session_id` at `now`: seed 1, a clock that
    /// moves only by [`Driver::advance`], invariants checked.
    pub fn new(session_id: impl Into<SessionId>, now: Timestamp) -> Self {
        Driver {
            session: Session::new(session_id),
            log: Vec::new(),
            now,
            version: 0,
            seed: 1,
            clock_step_ms: 0,
            checked: true,
            uncommitted: 0,
            limits: Limits::default(),
        }
    }

    /// [`Driver::new`], then `Create` with `init`.
    pub fn created(session_id: impl Into<SessionId>, init: SessionInit, now: Timestamp) -> Self {
        let mut driver = Driver::new(session_id, now);
        driver.exec(Command::Create { init: Box::new(init) });
        driver
    }

    /// Creates session `session_id` of agent `agent_id` (declared model `test-model`) at `now`,
    /// engine-hosted or with a worker, owned by `owner` (with metadata `plan` and `name`). Its
    /// seeds start from a hash of the id, so sessions mint distinct ids; the clock moves 1 s
    /// after each command; invariants are not checked (stores' suites run long sessions).
    pub fn create(
        session_id: &str,
        agent_id: &str,
        owner: Option<&str>,
        has_worker: bool,
        now: Timestamp,
    ) -> Self {
        let seed = session_id
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
        let mut driver = Driver::new(session_id, now).with_seed(seed).with_clock_step(1_000).unchecked();
        let metadata = owner.map(|o| {
            BTreeMap::from([("plan".to_owned(), "pro".to_owned()), ("name".to_owned(), o.to_owned())])
        });
        let mut init = init(agent_id, Some(AgentConfig::new("test-model")), has_worker);
        init.identity = WorkerIdentity { id: owner.map(str::to_owned), metadata };
        driver.exec(Command::Create { init: init.into() });
        driver
    }

    /// The next command's seed is `seed + 1`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// After each handled command the clock moves on by `ms`.
    pub fn with_clock_step(mut self, ms: u64) -> Self {
        self.clock_step_ms = ms;
        self
    }

    /// Skips the invariant checks.
    pub fn unchecked(mut self) -> Self {
        self.checked = false;
        self
    }

    /// Moves the clock on by `ms`.
    pub fn advance(&mut self, ms: u64) {
        self.now = self.now.plus_ms(ms);
    }

    /// Handles `command`: its events are applied and logged (and the invariants checked), or
    /// the rejection is returned (and nothing changes).
    pub fn try_exec(&mut self, command: Command) -> Result<Vec<Event>, Rejection> {
        self.seed = self.seed.wrapping_add(1);
        let mut ctx = Ctx { limits: self.limits, ..Ctx::new(self.now, self.seed) };
        // Versions the head let go are read back from the log, as a store does.
        let transition = loop {
            match handle(&self.session, command.clone(), &ctx) {
                Err(Rejection::Recall(seqs)) if seqs.iter().any(|&seq| !ctx.recalled.has(seq)) => {
                    for seq in seqs {
                        let event = self.log.get(seq as usize - 1).expect("a recalled event is logged");
                        ctx.recalled.insert(seq, event);
                    }
                }
                handled => break handled?,
            }
        };
        self.session = transition.session;
        self.log.extend(transition.events.iter().cloned());
        self.uncommitted += transition.events.len();
        self.now = self.now.plus_ms(self.clock_step_ms);
        if self.checked {
            check_invariants(&self.session, &self.log);
        }
        Ok(transition.events)
    }

    /// [`Driver::try_exec`]; panics if the engine refuses the command.
    pub fn exec(&mut self, command: Command) -> Vec<Event> {
        let shown = format!("{command:?}");
        self.try_exec(command).unwrap_or_else(|rejection| panic!("the engine refused {shown}: {rejection}"))
    }

    /// Submits a user message starting a turn (refused while one is active).
    pub fn submit(&mut self, text: &str) -> Vec<Event> {
        let agent_id = self.session.agent_id().to_owned();
        self.exec(message(&agent_id, text))
    }

    /// The server LLM call due now, and the attempt to start.
    pub fn due_llm(&self) -> Option<(CallId, u32)> {
        self.session.plan(self.now).effects.into_iter().find_map(|e| match e {
            Effect::RunLlmCall { call_id, attempt } => Some((call_id, attempt)),
            _ => None,
        })
    }

    /// Claims the due server LLM call, as the dispatcher does before calling the model.
    pub fn claim_llm(&mut self) -> (CallId, u32) {
        let Some((call_id, attempt)) = self.due_llm() else {
            panic!("no LLM call due: {:?}", self.session.plan(self.now))
        };
        self.exec(Command::ClaimLlmCall { call_id: call_id.clone(), attempt });
        (call_id, attempt)
    }

    /// Finishes a claimed LLM call with a plain text reply from `test-model` (12 prompt and 7
    /// completion tokens, cost 0.0012).
    pub fn finish_llm(&mut self, (call_id, attempt): (CallId, u32), text: &str) -> Vec<Event> {
        let mut response = reply(text);
        response.model = "test-model".into();
        response.usage = Some(serde_json::json!({"prompt_tokens": 12, "completion_tokens": 7}));
        response.cost = Some("0.0012".into());
        self.exec(Command::LlmCallFinished { call_id, attempt, outcome: Ok(response) })
    }

    /// Claims the due server LLM call and finishes it with `outcome`; returns the events of both.
    pub fn settle_llm(&mut self, outcome: Result<LlmResponse, CallError>) -> Vec<Event> {
        let before = self.log.len();
        let (call_id, attempt) = self.claim_llm();
        self.exec(Command::LlmCallFinished { call_id, attempt, outcome });
        self.log[before..].to_vec()
    }

    /// [`Driver::settle_llm`] with the model's `response`.
    pub fn run_llm(&mut self, response: LlmResponse) -> Vec<Event> {
        self.settle_llm(Ok(response))
    }

    /// [`Driver::settle_llm`] with a failure.
    pub fn fail_llm(&mut self, error: CallError) -> Vec<Event> {
        self.settle_llm(Err(error))
    }

    /// A whole engine-hosted turn: the user's message and the model's reply.
    pub fn turn(&mut self, user: &str, assistant: &str) {
        self.submit(user);
        let call = self.claim_llm();
        self.finish_llm(call, assistant);
    }

    /// The delivery of the live decision due now, and its attempt.
    pub fn due_decision(&self) -> Option<(DecisionId, u32)> {
        self.session.plan(self.now).effects.into_iter().find_map(|e| match e {
            Effect::DeliverDecision { decision_id, attempt } => Some((decision_id, attempt)),
            _ => None,
        })
    }

    /// Claims the live decision's delivery (a session with a worker).
    pub fn claim_decision(&mut self) {
        let Some((decision_id, attempt)) = self.due_decision() else {
            panic!("no decision due: {:?}", self.session.plan(self.now))
        };
        self.exec(Command::ClaimDecision { decision_id, attempt });
    }

    /// Claims the live decision's delivery and returns the request the worker would get.
    pub fn deliver(&mut self) -> DecisionRequest {
        self.claim_decision();
        self.session.decision_request().expect("a live decision")
    }

    /// Delivers the live decision and answers it with `response`.
    pub fn answer(&mut self, response: DecisionResponse) -> (DecisionRequest, Vec<Event>) {
        self.answer_with(|_| response)
    }

    /// Delivers the live decision and accepts its proposal, as a compliant worker would.
    pub fn accept(&mut self) -> (DecisionRequest, Vec<Event>) {
        self.answer_with(|request| request.proposed.clone())
    }

    /// Delivers the live decision and answers it with its proposal's messages and `actions`.
    pub fn answer_with_proposal_messages(&mut self, actions: Vec<Action>) -> (DecisionRequest, Vec<Event>) {
        self.answer_with(|request| DecisionResponse {
            messages: request.proposed.messages.clone(),
            actions: Some(actions),
            ..DecisionResponse::default()
        })
    }

    /// Delivers the live decision and answers it with what `respond` makes of the request.
    fn answer_with(
        &mut self,
        respond: impl FnOnce(&DecisionRequest) -> DecisionResponse,
    ) -> (DecisionRequest, Vec<Event>) {
        let request = self.deliver();
        let events = self.exec(Command::Answer {
            decision_id: request.decision_id.clone(),
            attempt: request.attempts,
            response: Box::new(respond(&request)),
            ignored_fields: Vec::new(),
            transcript: Default::default(),
        });
        (request, events)
    }

    /// The turn submitted last (of those the head holds).
    pub fn last_turn(&self) -> &TurnRecord {
        self.session.turns().max_by_key(|t| (t.submitted_at, t.started_at)).expect("a turn")
    }

    /// The active path as `Role:text` lines.
    pub fn path_texts(&self) -> Vec<String> {
        self.session
            .tree()
            .active_path()
            .iter()
            .map(|m| format!("{:?}:{}", m.role, m.content_text()))
            .collect()
    }

    /// When the session next has timed work, per the engine's plan.
    pub fn wake_at(&self) -> Option<Timestamp> {
        self.session.plan(self.now).wake_at
    }

    /// The events not yet committed.
    pub fn uncommitted(&self) -> &[Event] {
        &self.log[self.log.len() - self.uncommitted..]
    }

    /// Records that the uncommitted events were committed as head version `version`.
    pub fn committed(&mut self, version: u64) {
        self.version = version;
        self.uncommitted = 0;
    }

    /// Drops the committed events from `log` (the store has them), to keep a long run small.
    /// The invariant checks need the whole log, so a checked driver stops checking.
    pub fn forget_committed(&mut self) {
        let committed = self.log.len() - self.uncommitted;
        self.log.drain(..committed);
        self.checked = false;
    }
}

/// The init of an engine-hosted (or worker) session of `agent_id`, owned by `owner-1`, with
/// the engine's default policies.
pub fn init(agent_id: &str, declared: Option<AgentConfig>, has_worker: bool) -> SessionInit {
    SessionInit {
        agent_id: agent_id.to_owned(),
        identity: WorkerIdentity { id: Some("owner-1".into()), metadata: None },
        declared,
        has_worker,
        parent: None,
        ancestry: Vec::new(),
        defaults: Defaults::default(),
        budget: Budget::default(),
        fork: None,
    }
}

/// A model's text reply from model `m` (10 prompt and 5 completion tokens, cost 0.001).
pub fn reply(text: &str) -> LlmResponse {
    LlmResponse {
        model: "m".into(),
        content: Some(text.into()),
        tool_calls: None,
        finish_reason: Some("stop".into()),
        usage: Some(serde_json::json!({"prompt_tokens": 10, "completion_tokens": 5})),
        cost: Some("0.001".into()),
        images: None,
        reasoning: None,
        provider_blocks: None,
    }
}

/// A model's reply asking for tool calls `(id, name, arguments)`.
pub fn tool_calls(calls: &[(&str, &str, &str)]) -> LlmResponse {
    LlmResponse {
        model: "m".into(),
        content: None,
        tool_calls: Some(
            calls.iter().map(|(id, name, args)| ToolCall::function(*id, *name, *args)).collect(),
        ),
        finish_reason: Some("tool_calls".into()),
        usage: None,
        cost: None,
        images: None,
        reasoning: None,
        provider_blocks: None,
    }
}

/// A client's `client.message` for `agent_id`, starting a turn (not queued).
pub fn message(agent_id: &str, text: &str) -> Command {
    turn_message(agent_id, None, text)
}

/// A client's `client.message` for `agent_id`, starting turn `turn_id` (minted when `None`).
pub fn turn_message(agent_id: &str, turn_id: Option<&str>, text: &str) -> Command {
    Command::Submit {
        input: ClientInput::Message(ClientMessageInput {
            agent_id: agent_id.into(),
            turn_id: turn_id.map(Into::into),
            message: DraftMessage::user(text),
            stream: None,
            client: None,
        }),
        queue: false,
        origin: TurnOrigin::Client,
    }
}

/// A client's `client.message` for `agent_id` steering the active turn, as turn `turn_id`.
pub fn steer(agent_id: &str, text: &str, turn_id: &str) -> Command {
    Command::Steer {
        input: ClientMessageInput {
            agent_id: agent_id.into(),
            turn_id: Some(turn_id.into()),
            message: DraftMessage::user(text),
            stream: None,
            client: None,
        },
    }
}

/// A client's `tool.approval` of call `id`.
pub fn approval(id: &str, approved: bool, reason: Option<&str>) -> Command {
    client_input(ClientInput::ToolApproval(ToolApprovalInput {
        id: id.into(),
        approved,
        reason: reason.map(str::to_owned),
    }))
}

/// A client's `tool.result` for its call `id` (the current attempt).
pub fn client_result(id: &str, result: &str) -> Command {
    client_input(ClientInput::ToolResult(ToolResultInput {
        id: id.into(),
        attempt: None,
        result: Some(serde_json::Value::String(result.into())),
    }))
}

/// `input` from a client, not queued.
fn client_input(input: ClientInput) -> Command {
    Command::Submit { input, queue: false, origin: TurnOrigin::Client }
}

/// The events' names, e.g. `call.settled`.
pub fn names(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::name).collect()
}

/// Asserts the engine's invariants of `session` and its whole `log`: replay rebuilds the
/// session, a snapshot round trip is lossless, a call settles at most once and only at its
/// current attempt, at most one decision is live, a tool call on the active path is answered
/// at most once, and a turn starts at most once.
pub fn check_invariants(session: &Session, log: &[Event]) {
    let replayed = Session::replay(session.id().clone(), log);
    assert_eq!(&replayed, session, "replay must rebuild the identical session");
    let json = serde_json::to_string(session).expect("serialize");
    let mut back: Session = serde_json::from_str(&json).expect("deserialize");
    assert!(back.declared().is_none(), "the snapshot leaves the declared config out");
    back.restore_messages(session.tree().nodes().cloned().collect());
    back.restore_declared(session.declared().cloned());
    back.restore_versions(session.version_entries()).expect("the version entries fit the snapshot");
    assert_eq!(&back, session, "snapshot round trip must be lossless");
    assert!(session.missing_versions().is_empty(), "the head holds its current versions between commands");
    let mut settled = HashSet::new();
    for e in log {
        if let Event::CallSettled { call_id, .. } = e {
            assert!(settled.insert(call_id.clone()), "call {call_id} settled twice");
        }
    }
    let mut live: Option<DecisionId> = None;
    for e in log {
        match e {
            Event::DecisionOpened { decision, .. } => {
                assert!(live.is_none(), "decision {} opened while {live:?} was live", decision.id);
                live = Some(decision.id.clone());
            }
            Event::DecisionResolved { decision_id, .. }
            | Event::DecisionFailed { decision_id, .. }
            | Event::DecisionVoided { decision_id, .. }
                if live.as_ref() == Some(decision_id) =>
            {
                live = None;
            }
            _ => {}
        }
    }
    assert_eq!(live.as_ref(), session.decision().map(|d| &d.id));
    let mut attempts: HashMap<CallId, u32> = HashMap::new();
    for e in log {
        match e {
            Event::CallDispatched { call_id, attempt, .. } => {
                attempts.insert(call_id.clone(), *attempt);
            }
            // A call settled before it started (denied while it waited for approval) settles
            // at attempt 0.
            Event::CallCreated { call } => {
                attempts.insert(call.id.clone(), call.attempt);
            }
            Event::CallSettled { call_id, attempt, .. }
            | Event::CallRetryScheduled { call_id, attempt, .. } => {
                assert_eq!(attempts.get(call_id), Some(attempt), "call {call_id} settled at a stale attempt");
            }
            _ => {}
        }
    }
    let path = session.tree().active_path();
    for m in &path {
        for tc in m.tool_calls() {
            let answers = path
                .iter()
                .filter(|a| a.role == Role::Tool && a.tool_call_id.as_ref() == Some(&tc.id))
                .count();
            assert!(answers <= 1, "tool call {} answered {answers} times", tc.id);
        }
    }
    let mut started: HashSet<TurnId> = HashSet::new();
    for e in log {
        let id = match e {
            Event::TurnStarted { turn } => Some(&turn.id),
            Event::TurnActivated { turn_id, .. } => Some(turn_id),
            _ => None,
        };
        if let Some(id) = id {
            assert!(started.insert(id.clone()), "turn {id} started twice");
        }
    }
}

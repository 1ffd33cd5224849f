//! A test harness: drives one session through the engine as the runtime would, checking the
//! invariants after every step.
#![allow(dead_code)]
// Test support: a failed expectation here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use turnstone_engine::protocol::*;
use turnstone_engine::session::*;
use turnstone_engine::time::Timestamp;

pub const T0: i64 = 1_796_000_000_000;

/// One session under test, with its full event log.
pub struct Harness {
    pub session: Session,
    pub log: Vec<Event>,
    pub now: Timestamp,
    pub seed: u64,
}

pub fn agent(model: &str) -> AgentConfig {
    AgentConfig::new(model)
}

pub fn init(agent_id: &str, declared: Option<AgentConfig>, has_worker: bool) -> SessionInit {
    SessionInit {
        agent_id: agent_id.to_owned(),
        identity: WorkerIdentity { id: Some("owner-1".into()), metadata: None },
        declared,
        has_worker,
        parent: None,
        ancestry: Vec::new(),
        defaults: Defaults::default(),
    }
}

pub fn reply(text: &str) -> LlmResponse {
    LlmResponse {
        model: "m".into(),
        content: Some(text.into()),
        tool_calls: None,
        finish_reason: Some("stop".into()),
        usage: Some(serde_json::json!({"prompt_tokens": 10, "completion_tokens": 5})),
        cost: Some("0.001".into()),
        images: None,
    }
}

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
    }
}

pub fn message(agent_id: &str, text: &str) -> Command {
    Command::Submit {
        input: ClientInput::Message(ClientMessageInput {
            agent_id: agent_id.into(),
            turn_id: None,
            message: DraftMessage::user(text),
            stream: None,
        }),
        queue: false,
        origin: TurnOrigin::Client,
    }
}

pub fn names(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::name).collect()
}

impl Harness {
    pub fn new(id: &str, init: SessionInit) -> Self {
        let mut h = Harness { session: Session::new(id), log: Vec::new(), now: Timestamp(T0), seed: 1 };
        h.exec(Command::Create { init: Box::new(init) }).expect("create");
        h
    }

    pub fn advance(&mut self, ms: u64) {
        self.now = self.now.plus_ms(ms);
    }

    /// Handles a command, applies and logs its events, and checks the invariants.
    pub fn exec(&mut self, command: Command) -> Result<Vec<Event>, Rejection> {
        self.seed += 1;
        let ctx = Ctx { now: self.now, seed: self.seed };
        let before = self.session.clone();
        let result = handle(&self.session, command, &ctx);
        match result {
            Ok(t) => {
                self.log.extend(t.events.iter().cloned());
                self.session = t.session;
                check_invariants(&self.session, &self.log);
                Ok(t.events)
            }
            Err(r) => {
                assert_eq!(before, self.session, "a rejection must write nothing");
                Err(r)
            }
        }
    }

    pub fn ok(&mut self, command: Command) -> Vec<Event> {
        match self.exec(command) {
            Ok(events) => events,
            Err(r) => panic!("unexpected rejection: {r}"),
        }
    }

    /// Runs every due effect the runtime would, with `llm` answering server LLM calls and
    /// `worker` answering decisions; returns the events.
    pub fn run_llm(&mut self, response: LlmResponse) -> Vec<Event> {
        let plan = self.session.plan(self.now);
        let (call_id, attempt) = plan
            .effects
            .iter()
            .find_map(|e| match e {
                Effect::RunLlmCall { call_id, attempt } => Some((call_id.clone(), *attempt)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no llm call due: {plan:?}"));
        let mut events = self.ok(Command::ClaimLlmCall { call_id: call_id.clone(), attempt });
        events.extend(self.ok(Command::LlmCallFinished { call_id, attempt, outcome: Ok(response) }));
        events
    }

    /// Fails the due server LLM call attempt.
    pub fn fail_llm(&mut self, error: CallError) -> Vec<Event> {
        let (call_id, attempt) = self.due_llm().expect("no llm call due");
        let mut events = self.ok(Command::ClaimLlmCall { call_id: call_id.clone(), attempt });
        events.extend(self.ok(Command::LlmCallFinished { call_id, attempt, outcome: Err(error) }));
        events
    }

    pub fn due_llm(&self) -> Option<(String, u32)> {
        self.session.plan(self.now).effects.iter().find_map(|e| match e {
            Effect::RunLlmCall { call_id, attempt } => Some((call_id.clone(), *attempt)),
            _ => None,
        })
    }

    /// Claims delivery of the live decision and returns the request the worker would get.
    pub fn deliver(&mut self) -> DecisionRequest {
        let plan = self.session.plan(self.now);
        let (decision_id, attempt) = plan
            .effects
            .iter()
            .find_map(|e| match e {
                Effect::DeliverDecision { decision_id, attempt } => Some((decision_id.clone(), *attempt)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no decision due: {plan:?}"));
        self.ok(Command::ClaimDecision { decision_id, attempt });
        self.session.decision_request().expect("live decision")
    }

    /// Delivers the live decision and answers it with `response`.
    pub fn answer(&mut self, response: DecisionResponse) -> (DecisionRequest, Vec<Event>) {
        let request = self.deliver();
        let events = self.ok(Command::Answer {
            decision_id: request.decision_id.clone(),
            attempt: request.attempts,
            response: Box::new(response),
        });
        (request, events)
    }

    /// Delivers the live decision and accepts its proposal, as a compliant worker would.
    pub fn accept(&mut self) -> (DecisionRequest, Vec<Event>) {
        let request = self.deliver();
        let response = request.proposed.clone();
        let events = self.ok(Command::Answer {
            decision_id: request.decision_id.clone(),
            attempt: request.attempts,
            response: Box::new(response),
        });
        (request, events)
    }

    pub fn turn(&self) -> Option<&TurnRecord> {
        self.session.active_turn.as_deref().and_then(|t| self.session.turns.get(t))
    }

    pub fn last_turn(&self) -> &TurnRecord {
        self.session.turns.values().max_by_key(|t| (t.submitted_at, t.started_at)).expect("a turn")
    }

    pub fn path_texts(&self) -> Vec<String> {
        self.session.tree.active_path().iter().map(|m| format!("{:?}:{}", m.role, m.content_text())).collect()
    }
}

/// The invariants of DESIGN.md section 4, checked after every step.
pub fn check_invariants(session: &Session, log: &[Event]) {
    // Replay equals state.
    let replayed = Session::replay(session.id.clone(), log);
    assert_eq!(&replayed, session, "replay must rebuild the identical session");
    // Snapshot round trip is lossless.
    let json = serde_json::to_string(session).expect("serialize");
    let mut back: Session = serde_json::from_str(&json).expect("deserialize");
    back.tree.restore(session.tree.nodes().cloned().collect());
    assert_eq!(&back, session, "snapshot round trip must be lossless");
    // A call settles at most once, at its current attempt.
    let mut settled = std::collections::HashSet::new();
    for e in log {
        if let Event::CallSettled { call_id, .. } = e {
            assert!(settled.insert(call_id.clone()), "call {call_id} settled twice");
        }
    }
    // At most one live decision: each decision.opened is closed before the next opens.
    let mut live: Option<String> = None;
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
    assert_eq!(live.as_ref(), session.decision.as_ref().map(|d| &d.id));
    // A call settles only at its current attempt.
    let mut attempts = std::collections::HashMap::new();
    for e in log {
        match e {
            Event::CallDispatched { call_id, attempt, .. } => {
                attempts.insert(call_id.clone(), *attempt);
            }
            Event::CallSettled { call_id, attempt, .. }
            | Event::CallRetryScheduled { call_id, attempt, .. } => {
                assert_eq!(attempts.get(call_id), Some(attempt), "call {call_id} settled at a stale attempt");
            }
            _ => {}
        }
    }
    // Every tool call on the active path is answered at most once.
    let path = session.tree.active_path();
    for m in &path {
        for tc in m.tool_calls() {
            let answers = path
                .iter()
                .filter(|a| a.role == Role::Tool && a.tool_call_id.as_deref() == Some(&tc.id))
                .count();
            assert!(answers <= 1, "tool call {} answered {answers} times", tc.id);
        }
    }
    // A queued turn starts exactly once.
    let mut started = std::collections::HashSet::new();
    for e in log {
        let id = match e {
            Event::TurnStarted { turn } => Some(turn.id.clone()),
            Event::TurnActivated { turn_id, .. } => Some(turn_id.clone()),
            _ => None,
        };
        if let Some(id) = id {
            assert!(started.insert(id.clone()), "turn {id} started twice");
        }
    }
}

/// Routes outbox items between sessions as the runtime would.
#[derive(Default)]
pub struct World {
    /// Agent configs by agent id (default: a plain agent on model `m`).
    pub configs: std::collections::BTreeMap<String, AgentConfig>,
    pub sessions: std::collections::BTreeMap<String, Harness>,
}

impl World {
    pub fn route(&mut self) -> Vec<String> {
        let mut routed = Vec::new();
        loop {
            let mut work = Vec::new();
            for (id, h) in &self.sessions {
                for e in h.session.plan(h.now).effects {
                    if let Effect::Route { seq, item } = e {
                        work.push((id.clone(), seq, item));
                    }
                }
            }
            if work.is_empty() {
                return routed;
            }
            for (from, seq, item) in work {
                routed.push(format!(
                    "{from}:{}",
                    serde_json::to_value(&item).unwrap()["type"].as_str().unwrap()
                ));
                match item {
                    OutboxItem::SpawnChild { session_id, agent_id, tool_call_id, ancestry, identity } => {
                        let config = self.configs.get(&agent_id).cloned().unwrap_or_else(|| agent("m"));
                        let mut i = init(&agent_id, Some(config), false);
                        i.identity = identity;
                        i.ancestry = ancestry;
                        i.parent = Some(ParentLink { session_id: from.clone(), tool_call_id });
                        self.sessions.insert(session_id.clone(), Harness::new(&session_id, i));
                    }
                    OutboxItem::SendMessage { session_id, message, turn_id } => {
                        let child = self.sessions.get_mut(&session_id).expect("child");
                        let agent_id = child.session.agent_id().to_owned();
                        child.ok(Command::Submit {
                            input: ClientInput::Message(ClientMessageInput {
                                agent_id,
                                turn_id: Some(turn_id),
                                message,
                                stream: None,
                            }),
                            queue: true,
                            origin: TurnOrigin::Parent,
                        });
                    }
                    OutboxItem::CancelChild { session_id, reason } => {
                        let child = self.sessions.get_mut(&session_id).expect("child");
                        let _ = child.exec(Command::Cancel { reason });
                    }
                    OutboxItem::NotifyParent {
                        session_id,
                        tool_call_id,
                        child_session_id,
                        ok,
                        result,
                        error,
                        ..
                    } => {
                        let parent = self.sessions.get_mut(&session_id).expect("parent");
                        parent.ok(Command::SubAgentFinished {
                            tool_call_id,
                            session_id: child_session_id,
                            ok,
                            result,
                            error,
                        });
                    }
                }
                self.sessions.get_mut(&from).unwrap().ok(Command::OutboxDelivered { seq });
            }
        }
    }
}

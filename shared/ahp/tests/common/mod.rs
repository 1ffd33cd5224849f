//! Test support: drive sessions with the engine's `Driver`, project their logs, and look
//! into the chat.
#![allow(dead_code, unused_imports)]
// Test support: a failed expectation here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ahp::reducers::{ReduceOutcome, apply_action_to_chat};
use ahp_types::state::{
    ChatState, ResponsePart, ToolCallCompletedState, ToolCallResponsePart, ToolCallState, Turn,
};
pub use turnstone_ahp::{ChatProjection, StateAction, chat_from_log};
use turnstone_engine::protocol::{AgentConfig, AgentTool, ToolHandler};
use turnstone_engine::session::{Command, Effect, Event, Route, SessionInit, route};
pub use turnstone_engine::testing::{
    Driver, approval, client_result, init, message, reply, steer, tool_calls,
};
use turnstone_engine::time::Timestamp;

pub const T0: i64 = 1_796_000_000_000;

/// A created session `id` at [`T0`], its invariants checked after every step.
pub fn harness(id: &str, init: SessionInit) -> Driver {
    Driver::created(id, init, Timestamp(T0))
}

/// A projection fed events one by one, keeping every action it returned, and checking that
/// those actions alone rebuild its chat from the snapshot taken after `session.created`.
pub struct Projected {
    pub projection: ChatProjection,
    pub actions: Vec<StateAction>,
    /// The chat after `session.created`: the snapshot a client would start from.
    start: Option<ChatState>,
    fed: usize,
}

impl Projected {
    pub fn new(id: &str) -> Self {
        Self::of(ChatProjection::new(id))
    }

    /// Feeds `projection` from its start.
    pub fn of(projection: ChatProjection) -> Self {
        Projected { projection, actions: Vec::new(), start: None, fed: 0 }
    }

    /// Feeds the events of `log` not yet fed.
    pub fn catch_up(&mut self, log: &[Event]) -> Vec<StateAction> {
        let mut out = Vec::new();
        for event in &log[self.fed..] {
            let actions = self.projection.apply(event).unwrap_or_else(|e| panic!("{}: {e}", event.name()));
            // What is said not to show in a chat never does (pushes skip such commits).
            assert!(
                turnstone_ahp::shows_in_chat(event) || actions.is_empty(),
                "{} showed {actions:?}",
                event.name()
            );
            if self.start.is_none() {
                assert!(actions.is_empty(), "session.created shows no action");
                self.start = Some(self.projection.chat().clone());
            }
            out.extend(actions);
        }
        self.fed = log.len();
        self.actions.extend(out.iter().cloned());
        out
    }

    /// Feeds a live delta.
    pub fn delta(
        &mut self,
        call_id: &str,
        delta: &turnstone_engine::protocol::StreamDelta,
    ) -> Vec<StateAction> {
        let actions = self.projection.delta(&call_id.into(), delta).unwrap();
        self.actions.extend(actions.iter().cloned());
        actions
    }

    pub fn chat(&self) -> &ChatState {
        self.projection.chat()
    }

    /// Every action kept, reduced again from the snapshot, is applied and rebuilds the chat.
    pub fn check_actions(&self) {
        let mut chat = self.start.clone().expect("session.created was fed");
        for action in &self.actions {
            assert_eq!(apply_action_to_chat(&mut chat, action), ReduceOutcome::Applied, "{action:?}");
        }
        assert_eq!(&chat, self.chat(), "the actions rebuild the projected chat");
    }
}

/// Projects the whole log of `driver`, checks the actions, and that [`chat_from_log`] agrees.
pub fn project(driver: &Driver) -> Projected {
    let id = driver.session.id().to_string();
    let mut p = Projected::new(&id);
    p.catch_up(&driver.log);
    p.check_actions();
    assert_eq!(&chat_from_log(id.as_str(), &driver.log).unwrap(), p.chat());
    p
}

/// The wire types of `actions`, e.g. `chat/turnStarted`.
pub fn types(actions: &[StateAction]) -> Vec<String> {
    actions.iter().map(|a| serde_json::to_value(a).unwrap()["type"].as_str().unwrap().to_owned()).collect()
}

/// The kinds of a turn's parts, with their text or tool state: `markdown:hi`,
/// `toolCall:c1:completed`.
pub fn part_kinds(parts: &[ResponsePart]) -> Vec<String> {
    parts
        .iter()
        .map(|part| match part {
            ResponsePart::Markdown(m) => format!("markdown:{}", m.content),
            ResponsePart::Reasoning(r) => format!("reasoning:{}", r.content),
            ResponsePart::ToolCall(tc) => {
                let v = serde_json::to_value(&tc.tool_call).unwrap();
                format!("toolCall:{}:{}", v["toolCallId"].as_str().unwrap(), v["status"].as_str().unwrap())
            }
            ResponsePart::InputRequest(i) => format!("inputRequest:{}", i.request.id),
            ResponsePart::Error(e) => format!("error:{}", e.error.message),
            other => format!("{other:?}"),
        })
        .collect()
}

/// The tool call part `id` of `parts`.
pub fn tool_call<'a>(parts: &'a [ResponsePart], id: &str) -> &'a ToolCallState {
    parts
        .iter()
        .find_map(|part| match part {
            ResponsePart::ToolCall(tc) => {
                let ToolCallResponsePart { tool_call } = tc.as_ref();
                let v = serde_json::to_value(tool_call).unwrap();
                (v["toolCallId"] == id).then_some(tool_call)
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool call {id} in {parts:?}"))
}

/// The completed state of tool call `id`.
pub fn completed<'a>(parts: &'a [ResponsePart], id: &str) -> &'a ToolCallCompletedState {
    match tool_call(parts, id) {
        ToolCallState::Completed(c) => c,
        other => panic!("tool call {id} is not completed: {other:?}"),
    }
}

/// The only (last) completed turn.
pub fn last_turn(chat: &ChatState) -> &Turn {
    chat.turns.last().expect("a completed turn")
}

/// An agent on model `m` with tools `weather` (worker) and `pick` (client).
pub fn agent_with_tools() -> AgentConfig {
    let mut a = AgentConfig::new("m");
    a.tools = Some(vec![
        AgentTool {
            name: "weather".into(),
            description: None,
            input: None,
            output: None,
            handler: None,
            approval: None,
            mcp: None,
        },
        AgentTool {
            name: "pick".into(),
            description: None,
            input: None,
            output: None,
            handler: Some(ToolHandler::Client),
            approval: None,
            mcp: None,
        },
    ]);
    a
}

/// The child session parent `p`'s model call just delegated to (a sub-agent declaring
/// `config`), created and given its message as the runtime routes them: its turn runs,
/// unanswered.
pub fn delegated(p: &mut Driver, config: AgentConfig) -> Driver {
    let parent_id = p.session.id().clone();
    let routes = |p: &Driver| {
        p.session
            .plan(p.now)
            .effects
            .into_iter()
            .filter_map(|e| match e {
                Effect::Route { seq, item } => Some((seq, item)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let mut child = None;
    // The spawn comes first; each delivery's follow-up routes after it.
    let mut pending = routes(p);
    pending.truncate(1);
    while let Some((seq, item)) = pending.pop() {
        match route(&parent_id, item) {
            Route::Spawn(spawn) => {
                let create = spawn.command(init(&spawn.agent_id, Some(config.clone()), false));
                let mut c = Driver::new(spawn.session_id.clone(), Timestamp(T0));
                c.exec(create);
                child = Some(c);
            }
            Route::Send(send) => {
                let c = child.as_mut().expect("spawned first");
                let agent_id = c.session.agent_id().to_owned();
                c.exec(send.command(agent_id));
            }
            Route::Deliver { .. } => panic!("nothing to deliver yet"),
        }
        p.exec(Command::OutboxDelivered { seq });
        pending.extend(routes(p));
    }
    child.expect("a child")
}

//! Test support shared by the engine's integration tests: the `testing` driver, and [`World`],
//! which routes outbox items between sessions as the runtime would.
#![allow(dead_code)]
// Test support: a failed expectation here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use turnstone_engine::ids::SessionId;
use turnstone_engine::protocol::*;
use turnstone_engine::session::*;
#[allow(unused_imports)]
pub use turnstone_engine::testing::{
    Driver, approval, client_result, init, message, names, reply, steer, tool_calls, turn_message,
};
use turnstone_engine::time::Timestamp;

pub const T0: i64 = 1_796_000_000_000;

/// One session under test.
pub type Harness = Driver;

/// A created session `id` at [`T0`], its invariants checked after every step.
pub fn harness(id: &str, init: SessionInit) -> Driver {
    Driver::created(id, init, Timestamp(T0))
}

pub fn agent(model: &str) -> AgentConfig {
    AgentConfig::new(model)
}

/// A tool the client runs, with no schema.
pub fn client_tool(name: &str) -> AgentTool {
    AgentTool {
        name: name.into(),
        description: None,
        input: None,
        output: None,
        handler: Some(ToolHandler::Client),
        approval: None,
        mcp: None,
    }
}

/// Sessions that deliver their outbox items to each other through [`route`].
#[derive(Default)]
pub struct World {
    /// Agent configs by agent id (default: a plain agent on model `m`).
    pub configs: BTreeMap<String, AgentConfig>,
    pub sessions: BTreeMap<SessionId, Harness>,
}

impl World {
    /// Delivers every outbox item until none is left; returns `sender:item type` for each.
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
                match route(&from, item) {
                    Route::Spawn(spawn) => {
                        let config = self.configs.get(&spawn.agent_id).cloned().unwrap_or_else(|| agent("m"));
                        let create = spawn.command(init(&spawn.agent_id, Some(config), false));
                        let mut child = Driver::new(spawn.session_id.clone(), Timestamp(T0));
                        child.exec(create);
                        self.sessions.insert(spawn.session_id, child);
                    }
                    Route::Send(send) => {
                        let child = self.sessions.get_mut(&send.session_id).expect("child");
                        let agent_id = child.session.agent_id().to_owned();
                        child.exec(send.command(agent_id));
                    }
                    Route::Deliver { target, command: command @ Command::Cancel { .. } } => {
                        let child = self.sessions.get_mut(&target).expect("child");
                        let _ = child.try_exec(command);
                    }
                    Route::Deliver { target, command } => {
                        self.sessions.get_mut(&target).expect("parent").exec(command);
                    }
                }
                self.sessions.get_mut(&from).unwrap().exec(Command::OutboxDelivered { seq });
            }
        }
    }
}

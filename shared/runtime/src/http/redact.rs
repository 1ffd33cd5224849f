//! What a session's log shows its end users. The log holds the agent's internals too: the
//! state its worker keeps (`state.written`, a decision's `state`), and the agent's system
//! prompt and tool definitions (the declared config at `session.created`, `agent.written`, a
//! decision's `agent`, a worker model call's request). A client reading `GET .../events` or the
//! event stream sees them left out unless `[server] expose_internal_events = true`; admins
//! always see them. What is left out is emptied in place (`null` state, no `system`, no
//! `tools`), so every event keeps its shape and still parses as the event it is.

use std::borrow::Cow;

use serde_json::Value;
use turnstone_engine::protocol::{AgentConfig, DecisionResponse, Role, Trigger};
use turnstone_engine::session::{CallSpec, Event};

use crate::auth::Caller;

/// Whether `caller` sees the log's internals: admins always, the open host's caller (this
/// machine's developer) and everyone with `expose_internal_events`.
pub fn sees_internals(caller: &Caller, expose_internal_events: bool) -> bool {
    expose_internal_events || matches!(caller, Caller::Admin { .. } | Caller::Anyone)
}

/// `event` as an end user sees it: unchanged unless it carries internals.
pub fn for_clients(event: &Event) -> Cow<'_, Event> {
    let mut event = match event {
        Event::SessionCreated { init, .. } if init.declared.is_some() => event.clone(),
        Event::StateWritten { value, .. } | Event::StateRestored { value, .. } if !value.is_null() => {
            event.clone()
        }
        Event::AgentWritten { .. }
        | Event::AgentRestored { .. }
        | Event::DecisionOpened { .. }
        | Event::DecisionResolved { .. } => event.clone(),
        Event::CallCreated { call } if matches!(call.spec, CallSpec::LlmCall { .. }) => event.clone(),
        _ => return Cow::Borrowed(event),
    };
    match &mut event {
        Event::SessionCreated { init, .. } => init.declared = None,
        Event::StateWritten { value, .. } | Event::StateRestored { value, .. } => *value = Value::Null,
        Event::AgentWritten { config, .. } | Event::AgentRestored { config, .. } => hide_config(config),
        Event::DecisionOpened { decision, .. } => {
            hide_response(&mut decision.proposed);
            if let Trigger::LlmExecute(trigger) = &mut decision.trigger {
                hide_request(&mut trigger.request);
            }
        }
        Event::DecisionResolved { response, .. } => hide_response(response),
        Event::CallCreated { call } => {
            if let CallSpec::LlmCall { action, .. } = &mut call.spec {
                action.tools = None;
                if let Some(messages) = &mut action.messages {
                    messages.retain(|m| m.role != Role::System);
                }
            }
        }
        _ => {}
    }
    Cow::Owned(event)
}

fn hide_config(config: &mut AgentConfig) {
    config.system = None;
    config.tools = None;
}

fn hide_response(response: &mut DecisionResponse) {
    response.state = None;
    if let Some(config) = &mut response.agent {
        hide_config(config);
    }
}

/// A worker model call's request, in any format: no system prompt, instructions or tools.
fn hide_request(request: &mut Value) {
    let Some(fields) = request.as_object_mut() else { return };
    for field in ["system", "instructions", "tools", "tool_choice"] {
        fields.remove(field);
    }
    if let Some(Value::Array(messages)) = fields.get_mut("messages") {
        messages.retain(|m| !matches!(m["role"].as_str(), Some("system" | "developer")));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_request_loses_its_instructions_in_every_format() {
        let mut openai = json!({
            "model": "m",
            "messages": [{"role": "system", "content": "secret"}, {"role": "developer", "content": "x"}, {"role": "user", "content": "hi"}],
            "tools": [{"type": "function"}],
        });
        hide_request(&mut openai);
        assert_eq!(openai, json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        let mut anthropic = json!({"model": "m", "system": "secret", "messages": [], "tools": []});
        hide_request(&mut anthropic);
        assert_eq!(anthropic, json!({"model": "m", "messages": []}));
    }

    #[test]
    fn state_and_config_are_emptied_in_place() {
        let state = Event::StateWritten { anchor: None, value: json!({"secret": 1}) };
        assert_eq!(
            for_clients(&state).into_owned(),
            Event::StateWritten { anchor: None, value: Value::Null }
        );
        let mut config = AgentConfig::new("m");
        config.system = Some("You are secret.".into());
        let written = Event::AgentWritten { anchor: None, config };
        let Event::AgentWritten { config, .. } = for_clients(&written).into_owned() else { unreachable!() };
        assert_eq!(config, AgentConfig::new("m"));
        let restored = Event::StateRestored { index: 0, value: json!({"secret": 1}) };
        assert_eq!(
            for_clients(&restored).into_owned(),
            Event::StateRestored { index: 0, value: Value::Null }
        );
        let mut config = AgentConfig::new("m");
        config.system = Some("You are secret.".into());
        let restored = Event::AgentRestored { index: 0, config };
        let Event::AgentRestored { config, .. } = for_clients(&restored).into_owned() else { unreachable!() };
        assert_eq!(config, AgentConfig::new("m"));
        // Others pass as they are, uncopied.
        let other = Event::HeadMoved { head_id: None };
        assert!(matches!(for_clients(&other), Cow::Borrowed(_)));
    }
}

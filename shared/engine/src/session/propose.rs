//! The engine's proposal for each trigger: what it would do if the worker agrees (and what it
//! does for an agent without a worker).

use serde_json::Value;

use super::Session;
use super::records::{CallValue, PathRef};
use crate::ids::{CallId, DecisionId, SessionId, TurnId};
use crate::protocol::*;

/// The proposal for `trigger` in decision `decision_id`, delivered within `turn_id`, and the
/// path its messages follow (kept by reference: see [`PathRef`]). `view_base` is the path a
/// `client.messages` trigger's view follows. `reported`: the call whose result the trigger
/// reports, which no longer counts as pending.
pub(super) fn propose(
    s: &Session,
    trigger: &Trigger,
    view_base: Option<&PathRef>,
    turn_id: Option<&TurnId>,
    decision_id: &DecisionId,
    reported: Option<&CallId>,
) -> (DecisionResponse, Option<PathRef>) {
    let pending = s.calls.iter().filter(|c| c.counts_as_pending() && Some(&c.id) != reported).count();
    let response = proposal(s, trigger, turn_id, decision_id, pending);
    let base = match trigger {
        Trigger::ClientMessages(_) => view_base.cloned(),
        _ if response.messages.is_some() => Some(PathRef { head: s.tree.head().cloned() }),
        _ => None,
    };
    (response, base)
}

/// The proposal's response; its messages follow the base path of [`propose`].
fn proposal(
    s: &Session,
    trigger: &Trigger,
    turn_id: Option<&TurnId>,
    decision_id: &DecisionId,
    pending: usize,
) -> DecisionResponse {
    // Outside its turn (a late result after `done`), news is recorded but starts no model call.
    // A turn whose `done` waits for its interrupts proposes nothing more either.
    let in_turn = turn_id.is_some()
        && turn_id == s.active_turn.as_ref()
        && !s.active_turn().is_some_and(|t| t.done_pending);
    match trigger {
        Trigger::SessionStart => DecisionResponse {
            agent: s.init.as_ref().and_then(|i| i.declared.clone()),
            ..DecisionResponse::default()
        },
        // The turn's client tools are layered onto the proposed config (rule 11).
        Trigger::ClientMessages(t) => DecisionResponse {
            messages: Some(t.messages.clone()),
            actions: in_turn.then(|| vec![llm_call()]),
            agent: s.layered_agent(turn_id).filter(|_| in_turn && !s.client_tools(turn_id).is_empty()),
            ..DecisionResponse::default()
        },
        Trigger::ClientAction(_) | Trigger::LlmExecute(_) => DecisionResponse::default(),
        Trigger::ToolExecute(t) => match (s.tool_declaration(&t.name, turn_id), &t.input) {
            (None, _) => tool_error(format!("unknown tool: {}", t.name)),
            (Some(_), ToolInput::Valid { .. }) => DecisionResponse::default(),
            (Some(_), ToolInput::Invalid { error, .. }) => {
                tool_error(format!("invalid arguments for tool {}: {error}", t.name))
            }
            (Some(_), ToolInput::Malformed { error }) => {
                tool_error(format!("malformed arguments for tool {}: {error}", t.name))
            }
        },
        Trigger::ToolFinished(t) => {
            // The trigger carries a result's text; one with parts (an MCP tool's image) is
            // recorded with them, from the call.
            let content = match s.call(&t.id).and_then(|c| c.outcome.as_ref()) {
                Some(Ok(CallValue::Parts(parts))) => Content::Parts(parts.clone()),
                _ => Content::Text(t.result.clone().or_else(|| t.error.clone()).unwrap_or_default()),
            };
            tool_message(in_turn && pending == 0, &t.id, &t.name, content)
        }
        Trigger::SubAgentFinished(t) => {
            let text = t.result.clone().or_else(|| t.error.clone()).unwrap_or_default();
            tool_message(in_turn && pending == 0, &t.id, &t.agent_id, Content::Text(text))
        }
        Trigger::LlmFinished(t) => {
            let usable = t.ok && !t.truncated && t.code != Some(ErrorCode::Refused);
            let Some(message) = t.message.clone().filter(|_| usable) else {
                // Failed, truncated or refused: record nothing; the turn ends with the error.
                return DecisionResponse::default();
            };
            let tool_calls = message.tool_calls.clone().unwrap_or_default();
            let content = message.content.as_ref().map(Content::text);
            let messages = vec![message];
            let actions = if !in_turn {
                Vec::new()
            } else if tool_calls.is_empty() {
                vec![Action::Done(DoneAction { data: content.map(Value::String) })]
            } else {
                tool_calls.iter().flat_map(|call| call_actions(s, turn_id, decision_id, call)).collect()
            };
            DecisionResponse {
                messages: Some(messages),
                actions: Some(actions),
                ..DecisionResponse::default()
            }
        }
        // Resumed: call the model again, unless results of the step are still to come (they
        // call it when the last one arrives).
        Trigger::InterruptResumed(_) => DecisionResponse {
            actions: (in_turn && pending == 0).then(|| vec![llm_call()]),
            ..DecisionResponse::default()
        },
    }
}

/// The actions for one model tool call: a tool call, or a delegation to a sub-agent.
fn call_actions(
    s: &Session,
    turn_id: Option<&TurnId>,
    decision_id: &DecisionId,
    call: &ToolCall,
) -> Vec<Action> {
    let name = &call.function.name;
    if s.is_sub_agent(name) {
        let session_id = SessionId::new(format!("{decision_id}-{}", call.id));
        let task = serde_json::from_str::<Value>(&call.function.arguments)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| call.function.arguments.clone());
        return vec![
            Action::SubAgentSpawn(SubAgentSpawnAction {
                session_id: session_id.clone(),
                agent_id: name.clone(),
                tool_call_id: call.id.clone(),
                retry: None,
            }),
            Action::MessageSend(MessageSendAction { session_id, message: DraftMessage::user(task) }),
        ];
    }
    let handler = s.tool_declaration(name, turn_id).and_then(|t| t.handler);
    vec![Action::ToolCall(ToolCallAction {
        id: Some(call.id.clone()),
        name: name.clone(),
        arguments: Value::String(call.function.arguments.clone()),
        handler,
        retry: None,
    })]
}

/// Record the tool message; call the model again (`call_model`) once nothing else of the step
/// is pending.
fn tool_message(call_model: bool, call_id: &CallId, name: &str, content: Content) -> DecisionResponse {
    let messages = vec![DraftMessage::tool_result(call_id.clone(), name, content)];
    let actions = call_model.then(|| vec![llm_call()]);
    DecisionResponse { messages: Some(messages), actions, ..DecisionResponse::default() }
}

fn llm_call() -> Action {
    Action::LlmCall(LlmCallAction::default())
}

fn tool_error(error: String) -> DecisionResponse {
    DecisionResponse {
        actions: Some(vec![Action::ToolError(CallErrorAction {
            id: None,
            attempt: None,
            error,
            retryable: Some(false),
            code: None,
            detail: None,
        })]),
        ..DecisionResponse::default()
    }
}

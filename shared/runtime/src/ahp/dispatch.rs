//! `dispatchAction`: a client action on a chat channel becomes an engine input. The engine's
//! events then come back through the projection as the action's echo (with the client's
//! origin, [`super::origins`]); an action the host or the engine refuses is answered with a
//! `rejectionReason` (`Err` here), and nothing is written.

use ahp_types::actions::{
    ActionOrigin, ChatInputCompletedAction, ChatPendingMessageSetAction, ChatToolCallCompleteAction,
    ChatToolCallConfirmedAction, ChatTruncatedAction, ChatTurnStartedAction, StateAction,
};
use ahp_types::commands::DispatchActionParams;
use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputResponseKind, PendingMessageKind, ToolResultContent,
};
use serde_json::{Value, json};
use turnstone_ahp::ChatProjection;
use turnstone_engine::ids::{CallId, SessionId};
use turnstone_engine::protocol::{ClientInput, ToolHandler, parse};
use turnstone_engine::session::{CallSpec, Command, Session};

use super::AhpHost;
use super::channels::project_log;
use super::rpc::RpcError;
use super::sessions::{reachable, session_id, session_of};
use crate::api::Placement;
use crate::auth::{Access, Caller};
use crate::error::Error;

/// Why a dispatched action was refused: its `rejectionReason`.
pub(crate) type Refusal = String;

/// Carries out `params.action`, dispatched by client `client_id` as `caller`.
pub(crate) async fn dispatch(
    host: &AhpHost,
    caller: &Caller,
    client_id: &str,
    params: &DispatchActionParams,
) -> Result<(), Refusal> {
    let channel = params.channel.as_str();
    let origin = ActionOrigin { client_id: client_id.to_owned(), client_seq: params.client_seq };
    if let Some((id, _)) = session_of(host, channel) {
        return session_action(host, caller, &id, channel, &params.action, origin).await;
    }
    let id =
        session_id(channel, "ahp-chat").ok_or_else(|| format!("{channel} is not a chat of this host"))?;
    let session = reachable(host, caller, &id, Access::Drive, channel)
        .await
        .map_err(|_| format!("no chat {channel}"))?;
    let action = &params.action;
    let writes_message = matches!(
        action,
        StateAction::ChatTurnStarted(_)
            | StateAction::ChatPendingMessageSet(_)
            | StateAction::ChatTruncated(_)
    );
    if writes_message && session.init().is_some_and(|i| i.parent.is_some()) {
        return Err(format!(
            "{channel} is a sub-agent's chat, read-only: the agent that delegated to it writes its messages"
        ));
    }
    let run = async {
        match action {
            StateAction::ChatTurnStarted(a) => start_turn(host, caller, client_id, &session, a).await,
            StateAction::ChatTurnCancelled(a) => {
                // The chat's running turn may be a steering message's, which names the
                // engine's turn it joined.
                let named = session.turn(&a.turn_id.as_str().into()).map(|t| &t.id);
                if named.is_none() || named != session.active_turn_id() {
                    return Err(format!("turn {} is not the active turn", a.turn_id));
                }
                let cancel = Command::Cancel { reason: "cancelled by the client".to_owned() };
                host.app.command_as(&id, caller, Access::Drive, cancel).await.map(|_| ()).map_err(refusal)
            }
            StateAction::ChatInputCompleted(a) => {
                let input = match tool_answer(&session, a)? {
                    Some(input) => input,
                    None => resume(a),
                };
                submit(host, caller, &id, input, Placement::Start).await
            }
            StateAction::ChatToolCallComplete(a) => complete_tool(host, caller, &session, a).await,
            StateAction::ChatPendingMessageSet(a) => pend(host, caller, client_id, &session, a).await,
            StateAction::ChatToolCallConfirmed(a) => confirm(host, caller, &session, a).await,
            StateAction::ChatPendingMessageRemoved(a) => {
                let withdraw = Command::Withdraw { turn_id: a.id.as_str().into() };
                host.app.command_as(&id, caller, Access::Drive, withdraw).await.map(|_| ()).map_err(refusal)
            }
            StateAction::ChatTruncated(a) => truncate(host, caller, &session, a).await,
            StateAction::ChatTurnResume(a) => {
                resume_turn(host, caller, client_id, &session, &a.turn_id).await
            }
            StateAction::ChatQueuedMessagesReordered(a) => {
                let reorder = Command::Reorder { order: a.order.iter().map(|t| t.as_str().into()).collect() };
                host.app.command_as(&id, caller, Access::Drive, reorder).await.map(|_| ()).map_err(refusal)
            }
            other => {
                Err(format!("{} is not an action a client may dispatch to this host", action_type(other)))
            }
        }
    };
    // Remembered before the engine runs it: its echo may reach another connection first.
    host.origins.remember(&id, action, origin);
    let outcome = run.await;
    if outcome.is_err() {
        host.origins.forget(&id, action);
    }
    outcome
}

/// An action on a session channel: a client joins the session's active clients or leaves
/// them ([`super::active_clients`]), each client with its own entry only, or renames the
/// session (`session/titleChanged`, a durable `Command::Rename`). The change is echoed to the
/// session channel's subscribers.
async fn session_action(
    host: &AhpHost,
    caller: &Caller,
    id: &SessionId,
    channel: &str,
    action: &StateAction,
    origin: ActionOrigin,
) -> Result<(), Refusal> {
    reachable(host, caller, id, Access::Drive, channel).await.map_err(|_| format!("no session {channel}"))?;
    match action {
        StateAction::SessionActiveClientSet(a) => {
            if a.active_client.client_id != origin.client_id {
                return Err(format!(
                    "a client sets its own active entry only (this is client {:?}, not {:?})",
                    origin.client_id, a.active_client.client_id
                ));
            }
            host.active_clients.set(id, a.active_client.clone(), Some(origin)).await;
            Ok(())
        }
        StateAction::SessionActiveClientRemoved(a) => {
            if a.client_id != origin.client_id {
                return Err(format!(
                    "a client removes its own active entry only (this is client {:?}, not {:?})",
                    origin.client_id, a.client_id
                ));
            }
            let client_id = a.client_id.clone();
            host.active_clients.remove(id, &client_id, Some(origin)).await;
            Ok(())
        }
        StateAction::SessionTitleChanged(a) => {
            // Its echo is the title the commit sets, as every subscriber hears it.
            host.origins.remember(id, action, origin);
            let rename = Command::Rename { title: a.title.clone() };
            let renamed = host.app.command_as(id, caller, Access::Drive, rename).await;
            renamed.map(drop).map_err(|e| {
                host.origins.forget(id, action);
                refusal(e)
            })
        }
        other => Err(format!("{} is not an action a client may dispatch to this host", action_type(other))),
    }
}

/// `chat/toolCallConfirmed` of a call waiting for approval: `tool.approval`, a denial with
/// its reason message (or its reason) told to the model.
async fn confirm(
    host: &AhpHost,
    caller: &Caller,
    session: &Session,
    action: &ChatToolCallConfirmedAction,
) -> Result<(), Refusal> {
    let call_id = CallId::from(action.tool_call_id.as_str());
    if !session.call(&call_id).is_some_and(|c| c.awaiting_approval) {
        return Err(format!("tool call {call_id} of this chat is not waiting for confirmation"));
    }
    let reason = action
        .reason_message
        .as_ref()
        .map(|m| m.as_text().to_owned())
        .or_else(|| action.reason.as_ref().and_then(|r| json!(r).as_str().map(str::to_owned)));
    let input =
        json!({"type": "tool.approval", "id": call_id, "approved": action.approved, "reason": reason});
    submit(host, caller, session.id(), input, Placement::Start).await
}

/// `chat/turnStarted`: a `client.message` with the client's turn id (the session's agent
/// runs it), offering the tools of the client that started it when it is active in the
/// session. A turn already active refuses it.
async fn start_turn(
    host: &AhpHost,
    caller: &Caller,
    client_id: &str,
    session: &Session,
    action: &ChatTurnStartedAction,
) -> Result<(), Refusal> {
    let input = message(host, client_id, session, &action.turn_id, &action.message.text).await;
    submit(host, caller, session.id(), input, Placement::Start).await
}

/// `chat/truncated`: the conversation is rewound to where the kept turn ended
/// (`Command::Rewind`), and the client's next `chat/turnStarted` continues from there: an edit
/// of the turns it dropped. Refused while a turn runs (the client cancels it first).
async fn truncate(
    host: &AhpHost,
    caller: &Caller,
    session: &Session,
    action: &ChatTruncatedAction,
) -> Result<(), Refusal> {
    let chat = idle_chat(host, session, "cancel it before truncating the chat").await?;
    let head = chat.truncation_head(action.turn_id.as_deref())?;
    let rewind = Command::Rewind { head };
    host.app.command_as(session.id(), caller, Access::Drive, rewind).await.map(drop).map_err(refusal)
}

/// `session`'s chat as its log makes it, when no turn runs (`otherwise` says what to do then).
async fn idle_chat(host: &AhpHost, session: &Session, otherwise: &str) -> Result<ChatProjection, Refusal> {
    if let Some(turn_id) = session.active_turn_id() {
        return Err(format!("turn {turn_id} is running: {otherwise}"));
    }
    project_log(&host.app, session.id()).await.map_err(|e| RpcError::internal(e).message)
}

/// `chat/turnResume` of the chat's latest turn, failed resumably: a new engine turn
/// (`<turn>.resume<n>`, shown as the resumed turn) that goes on from the conversation as it
/// stands (`client.messages` with no message: nothing new, the agent continues), or sends
/// the turn's message again when it never reached the conversation.
async fn resume_turn(
    host: &AhpHost,
    caller: &Caller,
    client_id: &str,
    session: &Session,
    turn_id: &str,
) -> Result<(), Refusal> {
    let chat = idle_chat(host, session, "a failed turn resumes once it ended").await?;
    let resumption = chat.resumption(turn_id)?;
    let input = match &resumption.message {
        Some(text) => message(host, client_id, session, &resumption.turn_id, text).await,
        None => {
            let input = json!({
                "type": "client.messages",
                "agent_id": session.agent_id(),
                "turn_id": resumption.turn_id,
                "messages": [],
                "stream": true,
            });
            with_client(host, client_id, session, input).await
        }
    };
    submit(host, caller, session.id(), input, Placement::Start).await
}

/// `chat/pendingMessageSet`: of kind `queued`, a turn queued behind the active one (started
/// at once when none is); of kind `steering`, a message for the running turn's next safe
/// point. Either way its id is the pending message's.
async fn pend(
    host: &AhpHost,
    caller: &Caller,
    client_id: &str,
    session: &Session,
    action: &ChatPendingMessageSetAction,
) -> Result<(), Refusal> {
    let placement = match action.kind {
        PendingMessageKind::Queued => Placement::Queue,
        PendingMessageKind::Steering => Placement::Steer,
    };
    let input = message(host, client_id, session, &action.id, &action.message.text).await;
    submit(host, caller, session.id(), input, placement).await
}

/// The `client.message` of a turn client `client_id` starts, with its tools when it is an
/// active client of the session.
async fn message(host: &AhpHost, client_id: &str, session: &Session, turn_id: &str, text: &str) -> Value {
    let input = json!({
        "type": "client.message",
        "agent_id": session.agent_id(),
        "turn_id": turn_id,
        "message": {"role": "user", "content": text},
        "stream": true,
    });
    with_client(host, client_id, session, input).await
}

/// A turn's `input` with the tools of client `client_id`, when it is an active client of the
/// session.
async fn with_client(host: &AhpHost, client_id: &str, session: &Session, mut input: Value) -> Value {
    if let Some(client) = host.active_clients.context(session.id(), client_id).await {
        input["client"] = json!(client);
    }
    input
}

/// `chat/inputCompleted`: `interrupt.resume` with `{"response", "answers"}`, the payload the
/// projection reads back as the request's completion.
fn resume(action: &ChatInputCompletedAction) -> Value {
    let mut payload = json!({ "response": action.response });
    if let Some(answers) = &action.answers {
        payload["answers"] = json!(answers);
    }
    json!({"type": "interrupt.resume", "interrupt_id": action.request_id, "payload": payload})
}

/// `chat/inputCompleted` of the input request a client tool's call no client runs asks a
/// person (its id is the call's, [`turnstone_ahp::TOOL_RESULT_QUESTION`] its question):
/// `tool.result` with the answer, or `tool.error` when the person declined. `None` when the
/// request is not such a call's (an interrupt's).
fn tool_answer(session: &Session, action: &ChatInputCompletedAction) -> Result<Option<Value>, Refusal> {
    let call_id = CallId::from(action.request_id.as_str());
    let asked = session.call(&call_id).is_some_and(|c| {
        c.is_pending() && matches!(&c.spec, CallSpec::ToolCall { handler: ToolHandler::Client, .. })
    });
    if !asked {
        return Ok(None);
    }
    if action.response != ChatInputResponseKind::Accept {
        let error = format!("the person asked for the result declined ({})", json!(action.response));
        return Ok(Some(json!({"type": "tool.error", "id": call_id, "error": error, "retryable": false})));
    }
    let question = turnstone_ahp::TOOL_RESULT_QUESTION;
    let value = match action.answers.as_ref().and_then(|a| a.get(question)) {
        Some(ChatInputAnswer::Submitted(answered)) => match &answered.value {
            ChatInputAnswerValue::Text(text) => json!(text.value),
            other => serde_json::to_value(other).map_err(|e| e.to_string())?["value"].clone(),
        },
        _ => {
            return Err(format!(
                "answers.{question}: the result of tool call {call_id}, submitted, is required"
            ));
        }
    };
    Ok(Some(json!({"type": "tool.result", "id": call_id, "result": value})))
}

/// `chat/toolCallComplete` of a client tool's call: `tool.result` with its text, or
/// `tool.error` with its error's message.
async fn complete_tool(
    host: &AhpHost,
    caller: &Caller,
    session: &Session,
    action: &ChatToolCallCompleteAction,
) -> Result<(), Refusal> {
    let call_id = CallId::from(action.tool_call_id.as_str());
    let client_call = session
        .call(&call_id)
        .is_some_and(|c| matches!(&c.spec, CallSpec::ToolCall { handler: ToolHandler::Client, .. }));
    if !client_call {
        return Err(format!("tool call {call_id} is not a client tool's call of this chat"));
    }
    let result = &action.result;
    let text = result
        .content
        .iter()
        .flatten()
        .filter_map(|c| match c {
            ToolResultContent::Text(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let input = if result.success {
        let value = match (&result.structured_content, text.is_empty()) {
            (Some(structured), true) => json!(structured),
            _ => json!(text),
        };
        json!({"type": "tool.result", "id": call_id, "result": value})
    } else {
        let message = result
            .error
            .as_ref()
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or(if text.is_empty() { result.past_tense_message.as_text().to_owned() } else { text });
        json!({"type": "tool.error", "id": call_id, "error": message, "retryable": false})
    };
    submit(host, caller, session.id(), input, Placement::Start).await
}

/// Submits `input` (JSON of a `ClientInput`) to session `id`.
async fn submit(
    host: &AhpHost,
    caller: &Caller,
    id: &SessionId,
    input: Value,
    placement: Placement,
) -> Result<(), Refusal> {
    let input: ClientInput =
        parse(input).map_err(|e| format!("invalid action: {}: {}", e.path, e.message))?;
    host.app.submit(id, input, placement, caller).await.map(|_| ()).map_err(refusal)
}

/// The engine's reason, in its words (the session is the caller's own: it was reachable); a
/// failure inside the host is told as an internal error, its detail logged.
fn refusal(e: Error) -> Refusal {
    match e {
        Error::SessionNotFound(id) | Error::SessionDisposed(id) => format!("no session {id}"),
        Error::Store(_) | Error::Queue(_) => RpcError::internal(e).message,
        e => e.to_string(),
    }
}

/// An action's wire type, e.g. `chat/delta`.
fn action_type(action: &StateAction) -> String {
    serde_json::to_value(action)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "this action".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    #[test]
    fn a_store_failure_is_not_told_to_the_client() {
        let failed = Error::Store(StoreError::Backend("disk I/O error at /var/lib/turnstone/s.db".into()));
        let reason = refusal(failed);
        assert!(reason.starts_with("internal error (ref "), "{reason}");
        assert!(!reason.contains("/var/lib"), "{reason}");
        assert_eq!(refusal(Error::SessionNotFound("s1".to_owned())), "no session s1");
    }
}

//! What a chat waits for, as entries of its session's `inputNeeded`: AHP mirrors each chat's
//! open requests into the session, so a client subscribed to the session alone finds them
//! (and answers them with the ordinary chat action on the entry's chat).

use ahp_types::state::{
    ChatState, ResponsePart, SessionChatInputRequest, SessionInputRequest, SessionToolClientExecutionRequest,
    SessionToolConfirmationRequest, ToolCallConfirmationState, ToolCallContributor, ToolCallState,
};

/// The entries `chat` contributes to its session's `inputNeeded`, in the order its active
/// turn shows them: an input request without a response, a tool call waiting for
/// confirmation, a tool call running on a client. Each entry's id is the chat's URI and the
/// request's (or call's) id, unique within the session.
pub fn input_needed(chat: &ChatState) -> Vec<SessionInputRequest> {
    let Some(turn) = &chat.active_turn else { return Vec::new() };
    turn.response_parts.iter().filter_map(|part| entry(&chat.resource, &turn.id, part)).collect()
}

/// An entry's id (opaque to clients).
fn entry_id(chat: &str, of: &str) -> String {
    format!("{chat}#{of}")
}

fn entry(chat: &str, turn_id: &str, part: &ResponsePart) -> Option<SessionInputRequest> {
    let confirmation = |id: &str, tool_call: ToolCallConfirmationState| {
        SessionInputRequest::ToolConfirmation(SessionToolConfirmationRequest {
            id: entry_id(chat, id),
            chat: chat.to_owned(),
            turn_id: turn_id.to_owned(),
            tool_call,
        })
    };
    match part {
        ResponsePart::InputRequest(input) if input.response.is_none() => {
            Some(SessionInputRequest::ChatInput(SessionChatInputRequest {
                id: entry_id(chat, &input.request.id),
                chat: chat.to_owned(),
                request: input.request.clone(),
            }))
        }
        ResponsePart::ToolCall(call) => match &call.tool_call {
            ToolCallState::PendingConfirmation(state) => Some(confirmation(
                &state.tool_call_id,
                ToolCallConfirmationState::PendingConfirmation(state.clone()),
            )),
            ToolCallState::PendingResultConfirmation(state) => Some(confirmation(
                &state.tool_call_id,
                ToolCallConfirmationState::PendingResultConfirmation(state.clone()),
            )),
            ToolCallState::Running(state) => match &state.contributor {
                Some(ToolCallContributor::Client(client)) => {
                    Some(SessionInputRequest::ToolClientExecution(SessionToolClientExecutionRequest {
                        id: entry_id(chat, &state.tool_call_id),
                        chat: chat.to_owned(),
                        turn_id: turn_id.to_owned(),
                        client_id: client.client_id.clone(),
                        tool_call: state.clone(),
                    }))
                }
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// The id of `entry` and the chat it lives in.
pub fn entry_key(entry: &SessionInputRequest) -> Option<(&str, &str)> {
    match entry {
        SessionInputRequest::ChatInput(e) => Some((&e.id, &e.chat)),
        SessionInputRequest::ToolConfirmation(e) => Some((&e.id, &e.chat)),
        SessionInputRequest::ToolClientExecution(e) => Some((&e.id, &e.chat)),
        SessionInputRequest::ToolAuthentication(e) => Some((&e.id, &e.chat)),
        SessionInputRequest::Unknown(_) => None,
    }
}

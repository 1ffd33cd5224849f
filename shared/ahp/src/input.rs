//! Interrupts as input requests.
//!
//! An interrupt's payload is free-form JSON. When it carries `questions` (AHP's question
//! shapes) they are asked; otherwise the request is a bare accept/decline. A resume completes
//! the request: its payload may say how (`response`: `accept`, `decline`, `cancel`; accept when
//! absent) and carry `answers` keyed by question id, in AHP's answer shapes. This is the
//! convention an AHP front door must follow when it turns `chat/inputCompleted` into a resume.
//!
//! A client tool's call that no AHP client runs (an agent's own `handler = "client"` tool the
//! driving client does not offer) is asked of a person the same way: an input request whose
//! id is the call's and whose one text question ([`TOOL_RESULT_QUESTION`]) takes the result.
//! Its completion is the call's settling, whoever settled it (that answer, or any HTTP client).

use std::collections::HashMap;

use ahp_types::StateAction;
use ahp_types::actions::{ChatInputCompletedAction, ChatInputRequestedAction};
use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputAnswered, ChatInputQuestion, ChatInputRequest,
    ChatInputResponseKind, ChatInputTextAnswerValue, ChatInputTextQuestion,
};
use serde_json::Value;
use turnstone_engine::ids::{CallId, InterruptId};
use turnstone_engine::session::{CallOutcome, CallValue, Interrupt};

/// `chat/inputRequested` for `interrupt`.
pub(crate) fn requested(interrupt: &Interrupt) -> StateAction {
    let payload = interrupt.payload.as_ref();
    let questions = field::<Vec<ChatInputQuestion>>(payload, "questions");
    let url = payload.and_then(|p| p.get("url")).and_then(Value::as_str).map(str::to_owned);
    StateAction::ChatInputRequested(ChatInputRequestedAction {
        request: ChatInputRequest {
            id: interrupt.id.to_string(),
            message: Some(interrupt.reason.clone()),
            url,
            questions,
            answers: None,
        },
    })
}

/// `chat/inputCompleted` for the resume of `interrupt_id` with `payload`.
pub(crate) fn completed(interrupt_id: &InterruptId, payload: Option<&Value>) -> StateAction {
    StateAction::ChatInputCompleted(ChatInputCompletedAction {
        request_id: interrupt_id.to_string(),
        response: field(payload, "response").unwrap_or(ChatInputResponseKind::Accept),
        answers: field::<HashMap<String, ChatInputAnswer>>(payload, "answers"),
    })
}

/// The id of the one question of a client tool call's input request: its answer is the result.
pub const TOOL_RESULT_QUESTION: &str = "result";

/// `chat/inputRequested` asking a person for the result of client tool call `call_id` (tool
/// `name`, described as `description`, called with `arguments`).
pub(crate) fn tool_requested(
    call_id: &CallId,
    name: &str,
    description: Option<&str>,
    arguments: &str,
) -> StateAction {
    let asks = match description.filter(|d| !d.is_empty()) {
        Some(description) => {
            format!("The agent calls {name} ({description}), which runs on a client; no client here runs it.")
        }
        None => format!("The agent calls {name}, which runs on a client; no client here runs it."),
    };
    StateAction::ChatInputRequested(ChatInputRequestedAction {
        request: ChatInputRequest {
            id: call_id.to_string(),
            message: Some(asks),
            url: None,
            questions: Some(vec![ChatInputQuestion::Text(ChatInputTextQuestion {
                id: TOOL_RESULT_QUESTION.to_owned(),
                title: Some(name.to_owned()),
                message: format!("Its result, for the arguments {arguments}:"),
                required: Some(true),
                format: None,
                min: None,
                max: None,
                default_value: None,
            })]),
            answers: None,
        },
    })
}

/// `chat/inputCompleted` of client tool call `call_id`'s request, settled with `outcome`
/// (`None`: the call was cancelled): accepted with its result as the answer, or declined.
pub(crate) fn tool_completed(call_id: &CallId, outcome: Option<&CallOutcome>) -> StateAction {
    let (response, answers) = match outcome {
        Some(Ok(value)) => {
            // A client tool's result is text; parts (a server tool's) are not asked of anyone.
            let text = match value {
                CallValue::Text(text) => text.clone(),
                CallValue::Parts(_) => String::new(),
                CallValue::Llm(response) => response.content.clone().unwrap_or_default(),
            };
            let answer = ChatInputAnswer::Submitted(ChatInputAnswered {
                value: ChatInputAnswerValue::Text(ChatInputTextAnswerValue { value: text }),
            });
            (ChatInputResponseKind::Accept, Some(HashMap::from([(TOOL_RESULT_QUESTION.to_owned(), answer)])))
        }
        Some(Err(_)) => (ChatInputResponseKind::Decline, None),
        None => (ChatInputResponseKind::Cancel, None),
    };
    StateAction::ChatInputCompleted(ChatInputCompletedAction {
        request_id: call_id.to_string(),
        response,
        answers,
    })
}

/// `payload.<name>` read as `T`; `None` when absent or of another shape (the payload is the
/// agent's to shape: what does not fit AHP is left out rather than refused).
fn field<T: serde::de::DeserializeOwned>(payload: Option<&Value>, name: &str) -> Option<T> {
    let value = payload?.get(name)?;
    serde_json::from_value(value.clone()).ok()
}

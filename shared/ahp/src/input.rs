//! Interrupts as input requests.
//!
//! An interrupt's payload is free-form JSON. When it carries `questions` (AHP's question
//! shapes) they are asked; otherwise the request is a bare accept/decline. A resume completes
//! the request: its payload may say how (`response`: `accept`, `decline`, `cancel`; accept when
//! absent) and carry `answers` keyed by question id, in AHP's answer shapes. This is the
//! convention an AHP front door must follow when it turns `chat/inputCompleted` into a resume.

use std::collections::HashMap;

use ahp_types::StateAction;
use ahp_types::actions::{ChatInputCompletedAction, ChatInputRequestedAction};
use ahp_types::state::{ChatInputAnswer, ChatInputQuestion, ChatInputRequest, ChatInputResponseKind};
use serde_json::Value;
use turnstone_engine::ids::InterruptId;
use turnstone_engine::session::Interrupt;

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

/// `payload.<name>` read as `T`; `None` when absent or of another shape (the payload is the
/// agent's to shape: what does not fit AHP is left out rather than refused).
fn field<T: serde::de::DeserializeOwned>(payload: Option<&Value>, name: &str) -> Option<T> {
    let value = payload?.get(name)?;
    serde_json::from_value(value.clone()).ok()
}

//! The tool call lifecycle's actions: streaming, running, completed or cancelled.

use ahp_types::StateAction;
use ahp_types::actions::{
    ChatToolCallCompleteAction, ChatToolCallConfirmedAction, ChatToolCallContentChangedAction,
    ChatToolCallDeltaAction, ChatToolCallReadyAction, ChatToolCallStartAction,
};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    ToolCallCancellationReason, ToolCallConfirmationReason, ToolCallContributor, ToolCallResult, ToolInput,
    ToolResultContent, ToolResultEmbeddedResourceContent, ToolResultSubagentContent, ToolResultTextContent,
};
use serde_json::json;
use turnstone_engine::ids::CallId;
use turnstone_engine::protocol::ContentPart;
use turnstone_engine::session::{CallOutcome, CallRecord, CallSpec, CallValue};

use crate::uri::chat_uri;

/// `chat/toolCallStart`: the part appears, streaming. A client tool names its client here:
/// AHP fixes who runs a call at its start.
pub(crate) fn start(
    turn_id: &str,
    call_id: &CallId,
    name: &str,
    contributor: Option<ToolCallContributor>,
) -> StateAction {
    StateAction::ChatToolCallStart(ChatToolCallStartAction {
        turn_id: turn_id.to_owned(),
        tool_call_id: call_id.to_string(),
        meta: None,
        tool_name: name.to_owned(),
        display_name: name.to_owned(),
        intention: None,
        contributor,
    })
}

/// `chat/toolCallDelta`: more of the arguments.
pub(crate) fn arguments(turn_id: &str, call_id: &CallId, more: &str) -> StateAction {
    StateAction::ChatToolCallDelta(ChatToolCallDeltaAction {
        turn_id: turn_id.to_owned(),
        tool_call_id: call_id.to_string(),
        meta: None,
        content: Some(more.to_owned()),
        invocation_message: None,
    })
}

/// How a call the engine made is confirmed for running: a call of a tool that needs approval
/// is not (`None`: its part waits in `pending-confirmation`); any other runs unconfirmed.
pub(crate) fn confirmation(call: &CallRecord) -> Option<ToolCallConfirmationReason> {
    (!call.awaiting_approval).then_some(ToolCallConfirmationReason::NotNeeded)
}

/// `chat/toolCallReady`: the arguments are final; with `confirmed` the call runs.
pub(crate) fn ready(
    turn_id: &str,
    call_id: &CallId,
    name: &str,
    input: Option<&str>,
    confirmed: Option<ToolCallConfirmationReason>,
) -> StateAction {
    StateAction::ChatToolCallReady(ChatToolCallReadyAction {
        turn_id: turn_id.to_owned(),
        tool_call_id: call_id.to_string(),
        meta: None,
        contributor: None,
        intention: None,
        invocation_message: invocation(name),
        tool_input: input.map(|i| ToolInput::Inline(i.to_owned())),
        confirmation_title: None,
        risk_assessment: None,
        edits: None,
        editable: None,
        confirmed,
        options: None,
    })
}

/// A sub-agent's call shows the child's chat while it runs (`chat/toolCallContentChanged`).
pub(crate) fn show_child(turn_id: &str, call_id: &CallId, spec: &CallSpec) -> Option<StateAction> {
    let child = subagent(spec)?;
    Some(StateAction::ChatToolCallContentChanged(ChatToolCallContentChangedAction {
        turn_id: turn_id.to_owned(),
        tool_call_id: call_id.to_string(),
        meta: None,
        content: vec![child],
    }))
}

/// `chat/toolCallComplete` with the call's outcome.
pub(crate) fn complete(
    turn_id: &str,
    call_id: &CallId,
    spec: &CallSpec,
    outcome: &CallOutcome,
) -> StateAction {
    StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
        turn_id: turn_id.to_owned(),
        tool_call_id: call_id.to_string(),
        meta: None,
        result: result(spec, outcome),
        requires_result_confirmation: None,
    })
}

/// `chat/toolCallComplete` for a call the engine never made, answered by a tool message.
pub(crate) fn answered(turn_id: &str, call_id: &CallId, name: &str, text: String) -> StateAction {
    StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
        turn_id: turn_id.to_owned(),
        tool_call_id: call_id.to_string(),
        meta: None,
        result: ToolCallResult {
            success: true,
            past_tense_message: StringOrMarkdown::Plain(format!("Ran {name}")),
            content: Some(vec![ToolResultContent::Text(ToolResultTextContent { text })]),
            structured_content: None,
            error: None,
        },
        requires_result_confirmation: None,
    })
}

/// `chat/toolCallConfirmed` for a call waiting in `pending-confirmation`: approved (by a
/// person, or by whoever answered it without asking), or declined with `reason`.
pub(crate) fn confirmed(
    turn_id: &str,
    call_id: &CallId,
    verdict: Result<ToolCallConfirmationReason, (ToolCallCancellationReason, String)>,
) -> StateAction {
    let (approved, confirmed, reason, reason_message) = match verdict {
        Ok(confirmed) => (true, Some(confirmed), None, None),
        Err((reason, message)) => (false, None, Some(reason), Some(StringOrMarkdown::Plain(message))),
    };
    StateAction::ChatToolCallConfirmed(ChatToolCallConfirmedAction {
        turn_id: turn_id.to_owned(),
        tool_call_id: call_id.to_string(),
        meta: None,
        approved,
        confirmed,
        reason,
        edited_tool_input: None,
        user_suggestion: None,
        reason_message,
        selected_option_id: None,
    })
}

/// The actions that cancel a call with `reason`. AHP cancels a call only as a declined
/// confirmation, so a streaming or running part is first sent back to `pending-confirmation`
/// (`chat/toolCallReady` without `confirmed`, which the protocol allows from both states) and
/// then declined as `skipped`: it never ran to its end.
pub(crate) fn cancel(
    turn_id: &str,
    call_id: &CallId,
    name: &str,
    reason: &str,
    waiting: bool,
) -> Vec<StateAction> {
    let back = (!waiting).then(|| ready(turn_id, call_id, name, None, None));
    let declined = confirmed(turn_id, call_id, Err((ToolCallCancellationReason::Skipped, reason.to_owned())));
    back.into_iter().chain([declined]).collect()
}

/// The name a call shows: the tool's, or the sub-agent's.
pub(crate) fn name(spec: &CallSpec) -> Option<&str> {
    match spec {
        CallSpec::ToolCall { name, .. } => Some(name),
        CallSpec::SubAgent { agent_id, .. } => Some(agent_id),
        CallSpec::LlmCall { .. } => None,
    }
}

fn invocation(name: &str) -> StringOrMarkdown {
    StringOrMarkdown::Plain(format!("Running {name}"))
}

fn text_content(text: String) -> ToolResultContent {
    ToolResultContent::Text(ToolResultTextContent { text })
}

/// A result part as AHP shows it: a base64 data-URL image as embedded data, anything else as
/// its text.
fn part_content(part: &ContentPart) -> ToolResultContent {
    if let ContentPart::ImageUrl { image_url } = part
        && let Some((content_type, data)) =
            image_url.url.strip_prefix("data:").and_then(|rest| rest.split_once(";base64,"))
    {
        return ToolResultContent::EmbeddedResource(ToolResultEmbeddedResourceContent {
            data: data.to_owned(),
            content_type: content_type.to_owned(),
        });
    }
    text_content(part.summary())
}

fn result(spec: &CallSpec, outcome: &CallOutcome) -> ToolCallResult {
    let name = name(spec).unwrap_or_default();
    let mut content: Vec<ToolResultContent> = subagent(spec).into_iter().collect();
    match outcome {
        Ok(value) => {
            match value {
                CallValue::Text(text) => content.push(text_content(text.clone())),
                CallValue::Parts(parts) => content.extend(parts.iter().map(part_content)),
                CallValue::Llm(response) => {
                    content.push(text_content(response.content.clone().unwrap_or_default()))
                }
            }
            ToolCallResult {
                success: true,
                past_tense_message: StringOrMarkdown::Plain(format!("Ran {name}")),
                content: Some(content),
                structured_content: None,
                error: None,
            }
        }
        Err(error) => ToolCallResult {
            success: false,
            past_tense_message: StringOrMarkdown::Plain(format!("{name} failed")),
            content: (!content.is_empty()).then_some(content),
            structured_content: None,
            error: Some(json!({ "message": error.error, "code": error.code })),
        },
    }
}

/// The block naming a sub-agent's child chat.
fn subagent(spec: &CallSpec) -> Option<ToolResultContent> {
    let CallSpec::SubAgent { agent_id, session_id } = spec else { return None };
    Some(ToolResultContent::Subagent(ToolResultSubagentContent {
        resource: chat_uri(session_id),
        title: agent_id.clone(),
        agent_name: Some(agent_id.clone()),
        description: None,
    }))
}

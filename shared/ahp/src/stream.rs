//! Live, non-durable deltas of a running model call, shown in the open turn.
//!
//! Text grows the call's markdown part, reasoning its reasoning part, argument fragments its
//! streaming tool calls. Part ids come from the call and its attempt ([`crate::parts`]), so the
//! durable reply that follows finds the parts and shows only what they lack.

use ahp_types::StateAction;
use ahp_types::actions::{ChatDeltaAction, ChatReasoningAction, ChatResponsePartAction};
use ahp_types::state::{ReasoningResponsePart, ResponsePart};
use turnstone_engine::ids::CallId;
use turnstone_engine::protocol::StreamDelta;
use turnstone_engine::session::CallSpec;

use crate::error::ProjectionError;
use crate::parts;
use crate::projection::ChatProjection;
use crate::turn::ToolPart;

impl ChatProjection {
    /// Projects one delta of model call `call_id` while it runs: the chat actions it means,
    /// already reduced into the chat. A delta of a call the projection does not know as a
    /// running model call of the open turn (it arrived before the call's events or after its
    /// settle: deltas race the log) shows nothing.
    pub fn delta(
        &mut self,
        call_id: &CallId,
        delta: &StreamDelta,
    ) -> Result<Vec<StateAction>, ProjectionError> {
        self.projecting = "stream delta";
        let projected = self.stream(call_id, delta);
        self.finish(projected)
    }

    fn stream(&mut self, call_id: &CallId, delta: &StreamDelta) -> Result<(), ProjectionError> {
        let Some(call) = self.session.call(call_id) else { return Ok(()) };
        if !call.is_pending() || !matches!(call.spec, CallSpec::LlmCall { .. }) {
            return Ok(());
        }
        let attempt = call.attempt;
        let turn_id = call.turn_id.clone();
        let Some(turn_id) = self.open(turn_id.as_ref())? else { return Ok(()) };
        if let Some(more) = delta.reasoning.as_deref().filter(|r| !r.is_empty()) {
            self.reason(&turn_id, parts::reasoning_id(call_id, attempt), more)?;
        }
        if let Some(more) = delta.text.as_deref().filter(|t| !t.is_empty()) {
            self.write(&turn_id, parts::text_id(call_id, attempt), more)?;
        }
        for fragment in delta.tool_calls.iter().flatten() {
            let part = self.open_turn().and_then(|t| t.tools.get(&fragment.id).cloned());
            match part {
                None => {
                    self.start_tool(&turn_id, &fragment.id, fragment.name.as_deref().unwrap_or_default())?;
                    if let Some(turn) = self.open_turn() {
                        turn.streamed_tools.insert(fragment.id.clone(), (call_id.clone(), attempt));
                    }
                }
                Some(ToolPart::Streaming { .. }) => {}
                // The call already runs (its durable events overtook the stream).
                Some(ToolPart::PendingConfirmation | ToolPart::Running | ToolPart::Closed) => continue,
            }
            if let Some(more) = fragment.arguments.as_deref().filter(|a| !a.is_empty()) {
                self.stream_arguments(&turn_id, &fragment.id, more)?;
            }
        }
        Ok(())
    }

    /// Grows markdown part `id` by `more`, creating it with `more` first.
    fn write(&mut self, turn_id: &str, id: String, more: &str) -> Result<(), ProjectionError> {
        let shown = self.open_turn().and_then(|t| t.texts.get(&id).cloned());
        let Some(mut shown) = shown else { return self.text_part(turn_id, id, more.to_owned()) };
        self.emit(text_delta(turn_id, &id, more))?;
        shown.push_str(more);
        if let Some(turn) = self.open_turn() {
            turn.texts.insert(id, shown);
        }
        Ok(())
    }

    /// Grows reasoning part `id` by `more`, creating it with `more` first.
    pub(crate) fn reason(&mut self, turn_id: &str, id: String, more: &str) -> Result<(), ProjectionError> {
        let shown = self.open_turn().and_then(|t| t.reasonings.get(&id).cloned());
        let action = if shown.is_some() {
            StateAction::ChatReasoning(ChatReasoningAction {
                turn_id: turn_id.to_owned(),
                part_id: id.clone(),
                content: more.to_owned(),
                meta: None,
            })
        } else {
            StateAction::ChatResponsePart(ChatResponsePartAction {
                turn_id: turn_id.to_owned(),
                part: ResponsePart::Reasoning(ReasoningResponsePart {
                    id: id.clone(),
                    content: more.to_owned(),
                }),
                meta: None,
            })
        };
        self.emit(action)?;
        if let Some(turn) = self.open_turn() {
            turn.reasonings.insert(id, shown.unwrap_or_default() + more);
        }
        Ok(())
    }
}

/// `chat/delta`: `more` text for markdown part `part_id`.
pub(crate) fn text_delta(turn_id: &str, part_id: &str, more: &str) -> StateAction {
    StateAction::ChatDelta(ChatDeltaAction {
        turn_id: turn_id.to_owned(),
        part_id: part_id.to_owned(),
        content: more.to_owned(),
        meta: None,
    })
}

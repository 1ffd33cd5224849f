//! A compaction of the model's view of the conversation, shown in the turn it happened in.
//!
//! The engine records it as its marker message (a system message whose content is the summary,
//! or a short sentence for a clearing) and then `context.compacted`, in one commit. The part is
//! shown at `context.compacted`, which carries the figures; the marker's text is read from the
//! conversation the events so far make, so a replay shows exactly what the live chat did.
//!
//! The part is a `systemNotification`: AHP's part for what the agent harness (not the model)
//! says, visible to both the agent and the user for the transcript's continuity, which is what
//! a compaction marker is (the summary is what the model reads from then on). A markdown part
//! would read as the assistant's own reply, and a reasoning part as its thinking about this
//! reply; neither is true of it. A notification has no id, so no delta can grow it, and a failed
//! attempt's withdrawal keeps it (the marker stays in the log).

use ahp_types::StateAction;
use ahp_types::actions::{ChatResponsePartAction, ChatUsageAction};
use ahp_types::common::{JsonObject, StringOrMarkdown};
use ahp_types::state::{ResponsePart, SystemNotificationResponsePart};
use serde_json::json;
use turnstone_engine::protocol::CompactionKind;
use turnstone_engine::session::Event;

use crate::error::ProjectionError;
use crate::projection::ChatProjection;
use crate::usage;

impl ChatProjection {
    /// `context.compacted`: a notification in the turn of the model call it was made for, then
    /// the turn's usage with the summarizing call's (the engine counts it in the turn's usage).
    pub(crate) fn compacted(&mut self, event: &Event) -> Result<(), ProjectionError> {
        let Event::ContextCompacted {
            call_id,
            marker_id,
            kind,
            through,
            response,
            tokens_before,
            tokens_after,
            reason,
            ..
        } = event
        else {
            return Ok(());
        };
        let turn_id = self.session.call(call_id).and_then(|c| c.turn_id.clone());
        let Some(shown) = self.open(turn_id.as_ref())? else { return Ok(()) };
        let summary =
            self.session.tree().get(marker_id).map(|n| n.message.content_text()).unwrap_or_default();
        let mut meta = JsonObject::new();
        meta.insert(
            "turnstoneCompaction".into(),
            json!({
                "kind": kind,
                "markerId": marker_id,
                "through": through,
                "tokensBefore": tokens_before,
                "tokensAfter": tokens_after,
                "reason": reason,
            }),
        );
        self.emit(StateAction::ChatResponsePart(ChatResponsePartAction {
            turn_id: shown.clone(),
            part: ResponsePart::SystemNotification(SystemNotificationResponsePart {
                content: StringOrMarkdown::Markdown {
                    markdown: notice(*kind, &summary, *tokens_before, *tokens_after, reason),
                },
                meta: Some(meta),
            }),
            meta: None,
        }))?;
        let Some(response) = response else { return Ok(()) };
        let Some(turn) = self.open_turn() else { return Ok(()) };
        turn.usage.add(response.usage.as_ref(), response.cost.as_deref());
        let usage = usage::usage_info(&turn.usage, turn.model.as_deref());
        self.emit(StateAction::ChatUsage(ChatUsageAction { turn_id: shown, usage, meta: None }))
    }
}

/// What the notification says: the figures, then the summary itself (a clearing has no text of
/// its own worth showing: the marker's sentence names message ids).
fn notice(kind: CompactionKind, summary: &str, before: u64, after: u64, reason: &str) -> String {
    let figures = format!("about {} → {} tokens", grouped(before), grouped(after));
    // `refused`: the provider turned the request down for its length; `threshold` is the usual
    // case and needs no word.
    let why = if reason == "refused" { " after the provider refused the request as too long" } else { "" };
    match kind {
        CompactionKind::Summary => format!(
            "**Context compacted**{why} ({figures}). The model reads this summary in place of the \
             conversation before it:\n\n{summary}"
        ),
        CompactionKind::ClearedToolResults => format!(
            "**Tool results cleared** from the model's view{why} ({figures}). Earlier tool results \
             are sent to the model as short stubs; the conversation keeps them whole."
        ),
    }
}

/// `n` with its thousands grouped: `12,345`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_grouped_and_a_refusal_says_so() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(12_345_678), "12,345,678");
        let text = notice(CompactionKind::Summary, "S", 12_000, 3_000, "threshold");
        assert!(text.starts_with("**Context compacted** (about 12,000 → 3,000 tokens)"), "{text}");
        assert!(text.ends_with("\n\nS"), "{text}");
        let text = notice(CompactionKind::ClearedToolResults, "[ids]", 9, 8, "refused");
        assert!(text.contains("after the provider refused") && !text.contains("[ids]"), "{text}");
    }
}

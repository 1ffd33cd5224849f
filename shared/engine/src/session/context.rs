//! The model's view of a long conversation: what an engine-built model request sends, how
//! many tokens it is estimated to take, and the compaction that keeps it within the model's
//! context window.
//!
//! The conversation itself never changes: compaction records a marker message (a system
//! message with [`Compaction`] set) at the head, and every request built for a path through
//! that marker sends, instead of the messages the marker covers, its summary (kind `summary`)
//! or those messages with their tool results' bodies stubbed (kind `cleared_tool_results`).
//! Markers are nodes of the tree, so forks, edits and replays see the same view everywhere.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Session;
use super::records::CallRecord;
use crate::ids::MessageId;
use crate::protocol::{
    Compaction, CompactionKind, Content, ContentPart, DraftMessage, LlmRequest, Role, TreeNode,
};

/// How much a model takes, and how the engine keeps its requests within it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContextLimits {
    /// The model's context window in tokens: the prompt and the reply together.
    pub window: u64,
    /// The reply's reserve when a request names no `max_completion_tokens`.
    pub max_output: u64,
    /// Compact when the estimated prompt plus the reply's reserve passes this share of the
    /// window (0 < x <= 1).
    pub compact_at: f64,
    /// How much of the window the recent messages kept word for word after a compaction may
    /// take (0 < x < 1); the rest of the path is summarized or cleared.
    pub keep_recent: f64,
    /// Try clearing old tool results' bodies (no model call) before summarizing.
    pub clear_tool_results: bool,
    /// The most one tool result may take in a model's view, in tokens (the log keeps it whole).
    pub tool_result_max_tokens: Option<u64>,
    /// The longest summary asked for, in tokens.
    pub summary_max_tokens: u64,
}

impl ContextLimits {
    /// A window of `window` tokens with the engine's defaults for the rest.
    pub fn with_window(window: u64, max_output: u64) -> Self {
        ContextLimits {
            window,
            max_output,
            compact_at: 0.8,
            keep_recent: 0.25,
            clear_tool_results: true,
            tool_result_max_tokens: None,
            summary_max_tokens: (window / 20).clamp(1_024, 8_192),
        }
    }

    /// The same limits for a smaller `window` (one a provider's refusal revealed): the summary
    /// shrinks with it, so that a summary and the newest messages still fit.
    pub fn narrowed(&self, window: u64) -> Self {
        let window = window.min(self.window);
        ContextLimits {
            window,
            summary_max_tokens: self.summary_max_tokens.min((window / 20).max(256)),
            ..*self
        }
    }

    /// The prompt tokens past which a request with reply reserve `reserve` is compacted.
    pub fn threshold(&self, reserve: u64) -> u64 {
        ((self.window as f64 * self.compact_at) as u64).saturating_sub(reserve)
    }
}

/// Tokens estimated for `bytes` of a request's JSON, erring high: real tokenizers take about
/// four bytes of English or code per token and at least three of anything but rare scripts.
pub fn tokens_for_bytes(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(3)
}

/// What an image, file, audio or video part is counted as: Anthropic counts an image at most
/// about 1,600 tokens (a 1.15 megapixel image), OpenAI's high detail at most 1,105 for 768x2048.
const MEDIA_TOKENS: u64 = 1_600;

/// The estimated tokens of one message in a request.
pub fn message_tokens(message: &DraftMessage) -> u64 {
    let media = match &message.content {
        Some(Content::Parts(parts)) => {
            parts.iter().filter(|p| !matches!(p, ContentPart::Text { .. })).count()
        }
        _ => 0,
    } as u64;
    // Media bytes (base64) are not what a model counts; the rest is JSON, overhead included.
    let text_bytes = match &message.content {
        Some(Content::Parts(parts)) if media > 0 => {
            let text: usize = parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text { text } => text.len(),
                    _ => 0,
                })
                .sum();
            text + crate::json_len(&message.tool_calls) + 64
        }
        _ => crate::json_len(message),
    };
    tokens_for_bytes(text_bytes) + media * MEDIA_TOKENS + 4
}

/// The prompts from which on the head keeps what the provider counted ([`PromptMeasure`]):
/// a smaller one is estimated from its bytes, which costs little, and a short session's head
/// stays as small as it was.
pub const MEASURED_PROMPT_TOKENS: u64 = 8_192;

/// What the provider reported for the prompt of the last model call that completed: the
/// base of the next request's estimate while the view has only grown since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptMeasure {
    /// The call's anchor: its prompt was the view of the path to here.
    #[serde(rename = "at")]
    pub anchor: Option<MessageId>,
    /// The prompt's input tokens as the provider counted them (cached ones included).
    #[serde(rename = "tokens")]
    pub input_tokens: u64,
}

/// How a request's messages are turned into a model's view.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ViewOptions {
    /// The most one tool result may take, in tokens.
    pub tool_result_max_tokens: Option<u64>,
}

impl From<&ContextLimits> for ViewOptions {
    fn from(limits: &ContextLimits) -> Self {
        ViewOptions { tool_result_max_tokens: limits.tool_result_max_tokens }
    }
}

/// A compaction the engine should make before a model call, worked out by
/// [`Session::plan_compaction`].
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPlan {
    /// What the marker will do and the last message it covers.
    pub compaction: Compaction,
    /// For a summary: the summary in force so far (its text is summarized again, with the
    /// messages after it).
    pub previous_summary: Option<String>,
    /// For a summary: the messages to summarize, after the previous summary's.
    pub summarized: Vec<Arc<DraftMessage>>,
    /// The request's estimated tokens before and after (a summary counted at its most).
    pub tokens_before: u64,
    pub tokens_after: u64,
}

/// Why a request cannot be made to fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    /// The least the request can take: the system prompt, tools and the newest messages.
    pub tokens: u64,
    pub window: u64,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request does not fit the model's context window even compacted: the system prompt, \
             tools, the newest message and the reply's reserve take about {} tokens of its {}",
            self.tokens, self.window
        )
    }
}

/// A node of a path: its index in the tree, the node and its shared draft.
type PathNode<'a> = (usize, &'a TreeNode, Arc<DraftMessage>);

/// The sentence that introduces a summary in a model's view.
pub const SUMMARY_PREFACE: &str =
    "[The earlier part of this conversation was compacted to fit the context window. Summary:]";

/// The default instructions of a summarizing call.
pub const DEFAULT_SUMMARY_PROMPT: &str = "You compact the transcript of an AI agent's conversation so that the agent can \
carry on from your summary alone. Write a faithful, dense summary in the conversation's language: the user's goals and \
instructions (verbatim where wording matters), decisions made and why, facts learned, files, identifiers, numbers and \
results produced by tools, what was tried and failed, open questions, and the work in progress with its next steps. \
Keep earlier summaries' content that still matters. Do not address the user and do not invent anything.";

/// The stub a cleared tool result is sent as.
fn cleared_stub(len: usize) -> String {
    format!("[tool result cleared from the context to save space: {len} bytes]")
}

impl Session {
    /// The messages an engine-built request sends for the path root..`anchor`: markers in
    /// force applied (a summary instead of what it covers, cleared tool results as stubs),
    /// markers themselves left out, and each tool result cut to `options`' cap.
    pub fn model_view(&self, anchor: Option<&MessageId>, options: &ViewOptions) -> Vec<Arc<DraftMessage>> {
        let (summary, part) = self.view_part(anchor);
        let cleared = self.cleared_depth(anchor);
        let mut view: Vec<Arc<DraftMessage>> = Vec::with_capacity(part.len() + 1);
        for (index, node, draft) in part {
            if node.message.compaction.is_some() {
                continue;
            }
            view.push(self.viewed(index, node, draft, cleared, options));
        }
        if let Some(summary) = summary {
            let preface = format!("{SUMMARY_PREFACE}\n\n{summary}");
            match view.first() {
                // Providers want turns to alternate: the summary opens the first user turn.
                Some(first) if first.role == Role::User => {
                    let mut parts = vec![ContentPart::Text { text: preface }];
                    match &first.content {
                        Some(Content::Text(text)) => parts.push(ContentPart::Text { text: text.clone() }),
                        Some(Content::Parts(more)) => parts.extend(more.iter().cloned()),
                        None => {}
                    }
                    let merged = DraftMessage { content: Some(Content::Parts(parts)), ..(**first).clone() };
                    view[0] = Arc::new(merged);
                }
                _ => view.insert(0, Arc::new(DraftMessage::user(preface))),
            }
        }
        view
    }

    /// The summary in force at `anchor` (its text) and the path's nodes after what it covers.
    fn view_part(&self, anchor: Option<&MessageId>) -> (Option<String>, Vec<PathNode<'_>>) {
        let marks = self.tree.marks_at(anchor);
        let summary = marks.summary.and_then(|i| self.tree.node_at(i));
        let through = summary.and_then(|n| n.message.compaction.as_ref()).map(|c| c.through.clone());
        let text = summary.map(|n| n.message.content_text());
        (text, self.tree.path_after(anchor, through.as_ref()))
    }

    /// The depth through which tool results are cleared at `anchor`.
    fn cleared_depth(&self, anchor: Option<&MessageId>) -> Option<u32> {
        let marker = self.tree.marks_at(anchor).cleared.and_then(|i| self.tree.node_at(i))?;
        let through = &marker.message.compaction.as_ref()?.through;
        self.tree.index_of(through).and_then(|i| self.tree.depth_at(i))
    }

    /// Whether the node at `index` is at or above depth `cleared`, on a path that clears tool
    /// results through there.
    fn is_cleared(&self, index: usize, cleared: Option<u32>) -> bool {
        cleared.is_some_and(|d| self.tree.depth_at(index).is_some_and(|at| at <= d))
    }

    /// One node as a view sends it.
    fn viewed(
        &self,
        index: usize,
        node: &TreeNode,
        draft: Arc<DraftMessage>,
        cleared: Option<u32>,
        options: &ViewOptions,
    ) -> Arc<DraftMessage> {
        if node.message.role != Role::Tool {
            return draft;
        }
        let len = draft.content.as_ref().map_or(0, |c| c.text().len());
        if self.is_cleared(index, cleared) {
            return Arc::new(DraftMessage {
                content: Some(Content::Text(cleared_stub(len))),
                ..(*draft).clone()
            });
        }
        match options.tool_result_max_tokens {
            Some(max) if tokens_for_bytes(len) > max => {
                let text = draft.content.as_ref().map(Content::text).unwrap_or_default();
                let keep = (max as usize).saturating_mul(3);
                let cut = truncate_middle(&text, keep);
                Arc::new(DraftMessage { content: Some(Content::Text(cut)), ..(*draft).clone() })
            }
            _ => draft,
        }
    }

    /// The estimated prompt tokens of `request`, an engine-built request of `call` (its
    /// messages are the model view of the call's anchor): what the provider reported for the
    /// last completed call's prompt, when this view only grew from that one, plus an estimate
    /// of what is new (that call's reply included); otherwise an estimate of the whole.
    pub fn prompt_estimate(&self, call: &CallRecord, request: &LlmRequest, options: &ViewOptions) -> u64 {
        let fixed = tokens_for_bytes(crate::json_len(&request.tools));
        let whole = || fixed + request.messages.iter().map(|m| message_tokens(m)).sum::<u64>();
        let Some(measure) = &self.prompt_measure else { return whole() };
        let anchor = call.anchor.as_ref();
        let same_view = self.tree.marks_at(measure.anchor.as_ref()) == self.tree.marks_at(anchor)
            && self.tree.is_ancestor_or_self(measure.anchor.as_ref(), anchor);
        if !same_view || measure.input_tokens == 0 {
            return whole();
        }
        let cleared = self.cleared_depth(anchor);
        let new: u64 = self
            .tree
            .path_after(anchor, measure.anchor.as_ref())
            .into_iter()
            .filter(|(_, node, _)| node.message.compaction.is_none())
            .map(|(i, node, draft)| message_tokens(&self.viewed(i, node, draft, cleared, options)))
            .sum();
        measure.input_tokens + new
    }

    /// The compaction that brings `call`'s request (`estimate` tokens of the view, `fixed` of
    /// them its system prompt and tools) under `limits`: clearing old tool results when that
    /// is enough and allowed, otherwise a summary of the oldest part of the path, keeping the
    /// newest messages (at least the last) word for word. Never splits a tool call from its
    /// results: what is kept starts at a user or assistant message. `Ok(None)`: there is
    /// nothing to compact (the path after the last marker is one exchange).
    pub fn plan_compaction(
        &self,
        call: &CallRecord,
        limits: &ContextLimits,
        reserve: u64,
        fixed: u64,
        estimate: u64,
    ) -> Result<Option<CompactionPlan>, TooLarge> {
        let anchor = call.anchor.as_ref();
        let options = ViewOptions::from(limits);
        let (previous_summary, part) = self.view_part(anchor);
        let cleared = self.cleared_depth(anchor);
        let part: Vec<PathNode<'_>> =
            part.into_iter().filter(|(_, n, _)| n.message.compaction.is_none()).collect();
        let viewed: Vec<Arc<DraftMessage>> =
            part.iter().map(|(i, n, d)| self.viewed(*i, n, Arc::clone(d), cleared, &options)).collect();
        let tokens: Vec<u64> = viewed.iter().map(|m| message_tokens(m)).collect();
        let minimum =
            |keep_from: usize| fixed + limits.summary_max_tokens + tokens[keep_from..].iter().sum::<u64>();
        // Cuts: keep part[k..] for k in 1..len where part[k] is no tool result.
        let cuts: Vec<usize> = (1..part.len()).filter(|&k| part[k].1.message.role != Role::Tool).collect();
        let Some(&last_cut) = cuts.last() else {
            let least = fixed + tokens.iter().sum::<u64>() + reserve;
            return if least > limits.window {
                Err(TooLarge { tokens: least, window: limits.window })
            } else {
                Ok(None)
            };
        };
        let keep_budget = (limits.window as f64 * limits.keep_recent) as u64;
        // Whole exchanges kept where they fit (a cut before a user message), else any cut.
        let fits = |k: &usize| tokens[*k..].iter().sum::<u64>() <= keep_budget;
        let cut = cuts
            .iter()
            .copied()
            .filter(|&k| part[k].1.message.role == Role::User)
            .find(fits)
            .or_else(|| cuts.iter().copied().find(fits))
            .unwrap_or(last_cut);
        let threshold = limits.threshold(reserve);
        // Clearing: the tool results before the cut are sent as stubs; worth it alone when
        // the request then fits under the threshold.
        if limits.clear_tool_results {
            let stub_saving: u64 = part[..cut]
                .iter()
                .zip(&tokens)
                .filter(|((i, n, _), _)| n.message.role == Role::Tool && !self.is_cleared(*i, cleared))
                .map(|((_, n, _), t)| {
                    let len = n.message.content.as_ref().map_or(0, |c| c.text().len());
                    t.saturating_sub(message_tokens(&DraftMessage::tool_result("", "", cleared_stub(len))))
                })
                .sum();
            let after = estimate.saturating_sub(stub_saving);
            if stub_saving > 0 && after <= threshold {
                let through = part[cut - 1].1.message.id.clone();
                return Ok(Some(CompactionPlan {
                    compaction: Compaction { kind: CompactionKind::ClearedToolResults, through },
                    previous_summary: None,
                    summarized: Vec::new(),
                    tokens_before: estimate,
                    tokens_after: after,
                }));
            }
        }
        // What is kept must fit beside the summary; else keep only the last exchange.
        let cut = if minimum(cut) + reserve > limits.window { last_cut } else { cut };
        let after = minimum(cut);
        if after + reserve > limits.window {
            return Err(TooLarge { tokens: after + reserve, window: limits.window });
        }
        let through = part[cut - 1].1.message.id.clone();
        let summarized = viewed[..cut].to_vec();
        Ok(Some(CompactionPlan {
            compaction: Compaction { kind: CompactionKind::Summary, through },
            previous_summary,
            summarized,
            tokens_before: estimate,
            tokens_after: after,
        }))
    }

    /// The tokens a request of `call` would take for its system prompt and tools alone.
    pub fn fixed_tokens(request: &LlmRequest) -> u64 {
        let system: usize = request
            .messages
            .iter()
            .take_while(|m| m.role == Role::System)
            .map(|m| crate::json_len(&**m))
            .sum();
        tokens_for_bytes(system + crate::json_len(&request.tools))
    }
}

impl CompactionPlan {
    /// The summarizing model call: `prompt` (the agent's, or [`DEFAULT_SUMMARY_PROMPT`]) as
    /// the system prompt, and one user message holding the previous summary and the messages
    /// to summarize as a transcript, cut to `input_tokens` (each message shortened evenly, so
    /// one huge message cannot crowd out the rest).
    pub fn summary_request(
        &self,
        model: &str,
        prompt: Option<&str>,
        input_tokens: u64,
        max_tokens: u64,
    ) -> LlmRequest {
        let mut entries: Vec<String> = Vec::new();
        if let Some(previous) = &self.previous_summary {
            entries.push(format!("Summary of the conversation before this part:\n{previous}"));
        }
        entries.extend(self.summarized.iter().map(|m| transcript_entry(m)));
        let budget = (input_tokens as usize).saturating_mul(3).saturating_sub(1_024);
        let cap = even_cap(&entries.iter().map(String::len).collect::<Vec<_>>(), budget);
        let transcript: Vec<String> = entries.iter().map(|e| truncate_middle(e, cap)).collect();
        let user = format!(
            "Here is the part of the conversation to compact, oldest first:\n\n{}\n\n\
             Write the summary now. Answer with the summary only.",
            transcript.join("\n\n")
        );
        let system = prompt.unwrap_or(DEFAULT_SUMMARY_PROMPT);
        LlmRequest {
            model: model.to_owned(),
            messages: vec![
                Arc::new(DraftMessage::text(Role::System, system)),
                Arc::new(DraftMessage::user(user)),
            ],
            tools: None,
            temperature: None,
            max_completion_tokens: Some(max_tokens),
            reasoning: None,
            cache: None,
            thinking_form: None,
        }
    }
}

/// One message of a transcript to summarize, as text.
fn transcript_entry(m: &DraftMessage) -> String {
    let text = match &m.content {
        Some(Content::Parts(parts)) => parts
            .iter()
            .map(|p| match p {
                ContentPart::Text { text } => text.clone(),
                ContentPart::ImageUrl { .. } => "[image]".to_owned(),
                ContentPart::File { .. } => "[file]".to_owned(),
                ContentPart::InputAudio { .. } => "[audio]".to_owned(),
                ContentPart::VideoUrl { .. } => "[video]".to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Some(Content::Text(text)) => text.clone(),
        None => String::new(),
    };
    let mut entry = match m.role {
        Role::User => format!("USER: {text}"),
        Role::Assistant => format!("ASSISTANT: {text}"),
        Role::Tool => format!("TOOL RESULT ({}): {text}", m.name.as_deref().unwrap_or("tool")),
        Role::System => format!("SYSTEM: {text}"),
    };
    for call in m.tool_calls.as_deref().unwrap_or_default() {
        entry.push_str(&format!("\n[called {} with {}]", call.function.name, call.function.arguments));
    }
    entry
}

/// The largest length `cap` such that the lengths cut to it sum to at most `budget`.
fn even_cap(lengths: &[usize], budget: usize) -> usize {
    if lengths.iter().sum::<usize>() <= budget {
        return usize::MAX;
    }
    let (mut low, mut high) = (0usize, lengths.iter().copied().max().unwrap_or(0));
    while low < high {
        let mid = (low + high).div_ceil(2);
        if lengths.iter().map(|&l| l.min(mid)).sum::<usize>() <= budget { low = mid } else { high = mid - 1 }
    }
    low.max(200)
}

/// `text` cut to about `max` bytes, its middle left out and said so.
pub fn truncate_middle(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let keep = max.saturating_sub(80) / 2;
    let head_end = floor_char(text, keep);
    let tail_start = ceil_char(text, text.len() - keep);
    format!(
        "{}\n[... {} bytes left out to fit the context window ...]\n{}",
        &text[..head_end],
        tail_start - head_end,
        &text[tail_start..]
    )
}

fn floor_char(text: &str, mut at: usize) -> usize {
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_char(text: &str, mut at: usize) -> usize {
    while at < text.len() && !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

impl super::handle::Tx {
    /// `Command::Compact`: the marker is recorded at the head, which is the call's anchor, and
    /// the call reads from it; fenced by the call's claimed attempt.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compact(
        &mut self,
        call_id: &crate::ids::CallId,
        attempt: u32,
        compaction: Compaction,
        response: Option<crate::protocol::LlmResponse>,
        tokens: (u64, u64),
        reason: String,
    ) -> Result<(), super::Rejection> {
        let call = self
            .session
            .call(call_id)
            .filter(|c| c.is_server_llm() && c.is_pending() && c.attempt == attempt)
            .ok_or_else(|| super::Rejection::StaleClaim(format!("llm call {call_id} attempt {attempt}")))?;
        let anchor = call.anchor.clone();
        let tree = &self.session.tree;
        if tree.head() != anchor.as_ref() {
            return Err(super::Rejection::invalid(
                "call_id",
                "the conversation moved on since the call was requested: its view is not compacted",
            ));
        }
        let covered = tree.marks_at(anchor.as_ref()).summary.and_then(|i| tree.node_at(i));
        let after = covered.and_then(|n| n.message.compaction.as_ref()).map(|c| c.through.clone());
        let on_path = tree.is_ancestor_or_self(Some(&compaction.through), anchor.as_ref())
            && after.as_ref().is_none_or(|a| {
                a != &compaction.through && tree.is_ancestor_or_self(Some(a), Some(&compaction.through))
            });
        if !on_path {
            return Err(super::Rejection::invalid(
                "compaction.through",
                format!(
                    "{} is not a message of the call's path after the summary in force",
                    compaction.through
                ),
            ));
        }
        let text = match (&compaction.kind, &response) {
            (CompactionKind::Summary, Some(r)) => {
                r.content.clone().filter(|t| !t.trim().is_empty()).ok_or_else(|| {
                    super::Rejection::invalid("response.content", "a summary's response must carry its text")
                })?
            }
            (CompactionKind::Summary, None) => {
                return Err(super::Rejection::invalid(
                    "response",
                    "a summary needs the summarizing call's response",
                ));
            }
            (CompactionKind::ClearedToolResults, _) => {
                format!("[tool results through {} are sent to the model as stubs]", compaction.through)
            }
        };
        let marker_id = self.ids.message_id();
        let marker = crate::protocol::Message {
            id: marker_id.clone(),
            role: Role::System,
            content: Some(Content::Text(text)),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            provider_blocks: None,
            compaction: Some(Box::new(compaction.clone())),
        };
        self.emit(super::Event::MessageRecorded { message: marker, parent_id: anchor });
        self.emit(super::Event::ContextCompacted {
            call_id: call_id.clone(),
            attempt,
            marker_id,
            kind: compaction.kind,
            through: compaction.through,
            response,
            tokens_before: tokens.0,
            tokens_after: tokens.1,
            reason,
            at: self.now,
        });
        Ok(())
    }
}

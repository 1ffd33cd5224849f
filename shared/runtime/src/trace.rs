//! Traces: every turn, decision delivery, model call and tool call is a `tracing` span whose
//! OpenTelemetry identity (trace id, span id, parent span id) is derived from durable facts,
//! so the spans of one turn join one trace whichever process, wake-up or restart runs them.
//!
//! - A turn's trace id is the first 16 bytes of SHA-256 over its session id and turn id; the
//!   turn's own span id the first 8 bytes of another digest of the same ids. The `turn` span is
//!   emitted once, by the commit that ends the turn ([`turn_ended`]), with the turn's real start
//!   and end times (fields [`START_FIELD`] and [`END_FIELD`]).
//! - A unit of work in a turn (`decision.deliver`, `llm.call`, `tool.call`) is a child span
//!   whose id is derived from its kind, its id (decision or call) and its attempt: a retry in a
//!   later wake-up is in the same trace, with another span id. Work outside any turn starts a
//!   trace of its own, from its decision or call id.
//! - While a unit of work runs, its context is the task's current one ([`scope`]); the worker
//!   client and the model providers put it on their requests as a W3C `traceparent` header
//!   ([`traceparent`], the one place that writes it), so a worker's own spans join the turn's.
//!
//! Only `tracing` is needed here: the spans carry their identity as fields (`trace_id`,
//! `span_id`, `parent_id`, lowercase hex), and an exporter (`turnstone-telemetry`) turns the
//! spans of target [`TARGET`] into OpenTelemetry spans with exactly those ids. Without one the
//! spans cost next to nothing, and the header is sent all the same.

use std::fmt;
use std::future::Future;

use reqwest::header::HeaderValue;
use sha2::{Digest, Sha256};
use tracing::Span;
use tracing::field::Empty;
use turnstone_engine::session::{Event, Session, TurnStatus};
use turnstone_engine::time::Timestamp;

/// The target of every span of a trace: what an exporter keeps.
pub const TARGET: &str = "turnstone::trace";
/// The W3C Trace Context header.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// A field giving a span's start time (Unix nanoseconds) when it is not the span's creation.
pub const START_FIELD: &str = "start_unix_nanos";
/// A field giving a span's end time (Unix nanoseconds) when it is not the span's close.
pub const END_FIELD: &str = "end_unix_nanos";

/// A 16-byte trace id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// A span's place in its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanContext {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// `None` for a trace's root span.
    pub parent_id: Option<SpanId>,
}

/// SHA-256 over `parts`, each prefixed with its length so that no two lists of parts collide.
fn digest(parts: &[&str]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize().into()
}

fn trace_id(parts: &[&str]) -> TraceId {
    let mut id = [0; 16];
    id.copy_from_slice(&digest(parts)[..16]);
    // An all-zero id is invalid (W3C); a digest that starts with 16 zero bytes is only
    // theoretical, but costs one line.
    if id == [0; 16] {
        id[15] = 1;
    }
    TraceId(id)
}

fn span_id(parts: &[&str]) -> SpanId {
    let mut id = [0; 8];
    id.copy_from_slice(&digest(parts)[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    SpanId(id)
}

impl SpanContext {
    /// The root of a turn's trace: the `turn` span.
    pub fn turn(session_id: &str, turn_id: &str) -> SpanContext {
        SpanContext {
            trace_id: trace_id(&["turnstone.trace", session_id, turn_id]),
            span_id: span_id(&["turnstone.span", "turn", session_id, turn_id]),
            parent_id: None,
        }
    }

    /// A child of this span: one attempt (`attempt`) of the work `kind` named `id`.
    pub fn child(&self, kind: &str, id: &str, attempt: u32) -> SpanContext {
        let attempt = attempt.to_string();
        let trace = self.trace_id.to_string();
        SpanContext {
            trace_id: self.trace_id,
            span_id: span_id(&["turnstone.span", kind, &trace, id, &attempt]),
            parent_id: Some(self.span_id),
        }
    }

    /// One attempt of the work `kind` named `id` (a decision or call id) of a session: a child
    /// of its turn's span, or outside any turn the root of a trace of its own (the same for
    /// every attempt of that work).
    pub fn work(session_id: &str, turn_id: Option<&str>, kind: &str, id: &str, attempt: u32) -> SpanContext {
        match turn_id {
            Some(turn_id) => SpanContext::turn(session_id, turn_id).child(kind, id, attempt),
            None => {
                let root = SpanContext {
                    trace_id: trace_id(&["turnstone.trace", session_id, kind, id]),
                    span_id: SpanId([0; 8]),
                    parent_id: None,
                };
                SpanContext { parent_id: None, ..root.child(kind, id, attempt) }
            }
        }
    }

    /// The W3C `traceparent` value naming this span as the parent: `00-<trace>-<span>-01`
    /// (version 0, sampled).
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }
}

tokio::task_local! {
    /// The span whose work the task is doing.
    static CURRENT: SpanContext;
}

/// Runs `work` with `context` as the task's current span (what [`traceparent`] names).
pub async fn scope<F: Future>(context: SpanContext, work: F) -> F::Output {
    CURRENT.scope(context, work).await
}

/// The task's current span, inside [`scope`].
pub fn current() -> Option<SpanContext> {
    CURRENT.try_with(|c| *c).ok()
}

/// The `traceparent` header value for an outbound request made by the current work (`None`
/// outside any): what the worker client and the model providers send.
pub fn traceparent() -> Option<HeaderValue> {
    // Lowercase hex and dashes: always a valid header value.
    current().and_then(|c| HeaderValue::from_str(&c.traceparent()).ok())
}

/// What a span is about: its session, turn and agent.
#[derive(Debug, Clone, Copy)]
pub struct About<'a> {
    pub session_id: &'a str,
    pub turn_id: Option<&'a str>,
    pub agent_id: &'a str,
}

/// A `decision.deliver` span: one delivery attempt of a decision to the worker.
pub fn deliver_span(
    context: &SpanContext,
    about: About<'_>,
    decision_id: &str,
    attempt: u32,
    trigger: &str,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        "decision.deliver",
        trace_id = %context.trace_id,
        span_id = %context.span_id,
        parent_id = context.parent_id.map(|p| p.to_string()),
        session_id = about.session_id,
        turn_id = about.turn_id,
        agent_id = about.agent_id,
        decision_id,
        attempt,
        trigger,
        outcome = Empty,
        error.code = Empty,
        error.message = Empty,
    )
}

/// An `llm.call` span: one attempt of a model call (by a provider, or a worker's `llm.execute`).
pub fn llm_call_span(
    context: &SpanContext,
    about: About<'_>,
    call_id: &str,
    attempt: u32,
    model: &str,
    provider: &str,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        "llm.call",
        trace_id = %context.trace_id,
        span_id = %context.span_id,
        parent_id = context.parent_id.map(|p| p.to_string()),
        session_id = about.session_id,
        turn_id = about.turn_id,
        agent_id = about.agent_id,
        call_id,
        attempt,
        model,
        provider,
        outcome = Empty,
        error.code = Empty,
        error.message = Empty,
    )
}

/// A `tool.call` span: one attempt of a tool call the engine delivers (`tool.execute`).
pub fn tool_call_span(
    context: &SpanContext,
    about: About<'_>,
    call_id: &str,
    attempt: u32,
    tool: &str,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        "tool.call",
        trace_id = %context.trace_id,
        span_id = %context.span_id,
        parent_id = context.parent_id.map(|p| p.to_string()),
        session_id = about.session_id,
        turn_id = about.turn_id,
        agent_id = about.agent_id,
        call_id,
        attempt,
        tool,
        outcome = Empty,
        error.code = Empty,
        error.message = Empty,
    )
}

/// Records a span's outcome: `ok`, or `error` with its class (`code`) and message.
pub fn record_outcome(span: &Span, outcome: Result<(), (&str, &str)>) {
    match outcome {
        Ok(()) => {
            span.record("outcome", "ok");
        }
        Err((code, message)) => {
            span.record("outcome", "error");
            span.record("error.code", code);
            span.record("error.message", message);
        }
    }
}

/// Emits the `turn` span of every turn that `events`, just committed to `session`, ended: from
/// the turn's start (its submission, for a turn that never started) to its end, with its status
/// (a failed turn is an error, with its code when it has one). Each turn ends in exactly one
/// commit, so its span is emitted once, by whichever process made that commit.
pub fn turn_ended(session: &Session, events: &[Event], now: Timestamp) {
    for event in events {
        let Event::TurnEnded { turn_id, status, error, .. } = event else { continue };
        let record = session.turn(turn_id);
        let start = record.map_or(now, |t| t.started_at.unwrap_or(t.submitted_at));
        let end = record.and_then(|t| t.ended_at).unwrap_or(now);
        let context = SpanContext::turn(session.id(), turn_id);
        let status_name = match status {
            TurnStatus::Queued => "queued",
            TurnStatus::Active => "active",
            TurnStatus::Completed => "completed",
            TurnStatus::Failed => "failed",
            TurnStatus::Cancelled => "cancelled",
        };
        let span = tracing::info_span!(
            target: TARGET,
            "turn",
            trace_id = %context.trace_id,
            span_id = %context.span_id,
            session_id = %session.id(),
            turn_id = %turn_id,
            agent_id = session.agent_id(),
            status = status_name,
            start_unix_nanos = unix_nanos(start),
            end_unix_nanos = unix_nanos(end),
            outcome = Empty,
            error.code = Empty,
            error.message = Empty,
        );
        if *status == TurnStatus::Failed {
            let code = record
                .and_then(|t| t.code)
                .and_then(|c| serde_json::to_value(c).ok())
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| "failed".to_owned());
            record_outcome(&span, Err((&code, error.as_deref().unwrap_or(""))));
        } else {
            // Completed, or cancelled by a client: not an error of the turn.
            record_outcome(&span, Ok(()));
        }
        // The span closes here: it is complete, its times given by its fields.
        drop(span);
    }
}

fn unix_nanos(at: Timestamp) -> i64 {
    at.0.saturating_mul(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_derived_from_durable_facts() {
        let a = SpanContext::turn("s-1", "turn_1");
        assert_eq!(a, SpanContext::turn("s-1", "turn_1"), "the same turn, the same ids");
        assert_ne!(a.trace_id, SpanContext::turn("s-1", "turn_2").trace_id);
        assert_ne!(a.trace_id, SpanContext::turn("s-2", "turn_1").trace_id);
        // Length-prefixed parts: moving a character between ids changes the digest.
        assert_ne!(a.trace_id, SpanContext::turn("s-1t", "urn_1").trace_id);

        let first = SpanContext::work("s-1", Some("turn_1"), "decision.deliver", "dec_1", 1);
        let retry = SpanContext::work("s-1", Some("turn_1"), "decision.deliver", "dec_1", 2);
        assert_eq!((first.trace_id, first.parent_id), (a.trace_id, Some(a.span_id)));
        assert_eq!((retry.trace_id, retry.parent_id), (a.trace_id, Some(a.span_id)));
        assert_ne!(first.span_id, retry.span_id, "each attempt is its own span");

        let lone = SpanContext::work("s-1", None, "llm.call", "llm_1", 1);
        let lone_retry = SpanContext::work("s-1", None, "llm.call", "llm_1", 2);
        assert_eq!(lone.parent_id, None);
        assert_eq!(lone.trace_id, lone_retry.trace_id, "work outside a turn: one trace per work");
        assert_ne!(lone.span_id, lone_retry.span_id);
    }

    #[test]
    fn traceparent_is_the_w3c_format() {
        let c = SpanContext { trace_id: TraceId([0xab; 16]), span_id: SpanId([0x01; 8]), parent_id: None };
        assert_eq!(c.traceparent(), format!("00-{}-{}-01", "ab".repeat(16), "01".repeat(8)));
    }

    #[tokio::test]
    async fn the_header_names_the_current_work_only_inside_its_scope() {
        assert!(traceparent().is_none());
        let c = SpanContext::turn("s", "t").child("llm.call", "llm_1", 1);
        let inside = scope(c, async { traceparent() }).await;
        assert_eq!(inside.unwrap().to_str().unwrap(), c.traceparent());
        assert!(traceparent().is_none());
    }
}

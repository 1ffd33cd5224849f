//! Why a decision delivery failed, and whether it may be tried again (PROTOCOL-NOTES rule 31).
//!
//! Errors never carry the worker's response body: an unparseable answer names the field and
//! what is wrong there, with any literal copied from the document redacted; an error status
//! carries at most a short, sanitized message the worker put in a JSON `error.message` field.

use std::fmt;
use std::time::Duration;

use turnstone_engine::protocol::ProtocolError;

use crate::net::short_text;

/// The longest hint kept from an error status body, in characters.
pub(crate) const HINT_CHARS: usize = 200;
/// The longest `decision.error` message kept, in characters.
pub(crate) const WORKER_MESSAGE_CHARS: usize = 2000;
/// The longest parse error message or path kept, in characters.
const PARSE_MESSAGE_CHARS: usize = 300;
/// The longest literal from a document that a parse error may keep (a field name, a tag).
const KEPT_LITERAL_CHARS: usize = 40;

/// Why delivering a decision to a worker failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// The worker refused the request with a 4xx status: final.
    #[error("worker answered HTTP {status}{}", Hint(.hint))]
    Status4xx {
        status: u16,
        /// A short, sanitized message from the worker's JSON error body, if it had one.
        hint: Option<String>,
    },
    /// The worker failed with a 5xx status: retried.
    #[error("worker answered HTTP {status}{}", Hint(.hint))]
    Status5xx {
        status: u16,
        /// A short, sanitized message from the worker's JSON error body, if it had one.
        hint: Option<String>,
    },
    /// The worker answered a status that is neither success nor error (1xx, 3xx; redirects are
    /// not followed): final.
    #[error("worker answered unexpected HTTP {status}")]
    UnexpectedStatus { status: u16 },
    /// The attempt (request and whole response, stream included) outlived its timeout: retried.
    #[error("worker did not answer within {}", Limit(.after))]
    Timeout {
        /// The attempt's limit, when it is known.
        after: Option<Duration>,
    },
    /// No response arrived: the connection was refused or reset, TLS failed...: retried.
    #[error("could not reach worker: {message}")]
    Connection {
        /// What went wrong.
        message: String,
    },
    /// The response broke off before it was complete: retried.
    #[error("worker response broke off: {message}")]
    BrokenStream {
        /// What went wrong.
        message: String,
    },
    /// The response is not a valid answer: final. Names the field, never quotes the body.
    #[error("invalid worker response{}: {message}", At(.path))]
    InvalidResponse {
        /// The offending field's path, e.g. `actions[0].type`; empty for the body as a whole.
        path: String,
        /// What is wrong there.
        message: String,
    },
    /// The worker reported an error in its event stream (`decision.error`).
    #[error("worker error: {message}")]
    WorkerError {
        /// The worker's message (sanitized and shortened).
        message: String,
        /// Whether the worker asked for another attempt.
        retryable: bool,
    },
    /// The request could not be built (a bad URL or id, an empty secret): final.
    #[error("invalid worker request: {message}")]
    InvalidRequest {
        /// What is wrong.
        message: String,
    },
}

impl DeliveryError {
    /// Whether another attempt may succeed; the one place delivery retry decisions come from.
    pub fn is_retryable(&self) -> bool {
        match self {
            DeliveryError::Status5xx { .. }
            | DeliveryError::Timeout { .. }
            | DeliveryError::Connection { .. }
            | DeliveryError::BrokenStream { .. } => true,
            DeliveryError::WorkerError { retryable, .. } => *retryable,
            // 408 and 429 say "not now", not "never": a worker shedding load is retried.
            DeliveryError::Status4xx { status, .. } => matches!(status, 408 | 429),
            DeliveryError::UnexpectedStatus { .. }
            | DeliveryError::InvalidResponse { .. }
            | DeliveryError::InvalidRequest { .. } => false,
        }
    }

    /// A stable machine-readable code for this kind of failure.
    pub fn code(&self) -> &'static str {
        match self {
            DeliveryError::Status4xx { .. } => "worker_status_4xx",
            DeliveryError::Status5xx { .. } => "worker_status_5xx",
            DeliveryError::UnexpectedStatus { .. } => "worker_status_unexpected",
            DeliveryError::Timeout { .. } => "timeout",
            DeliveryError::Connection { .. } => "connection_failed",
            DeliveryError::BrokenStream { .. } => "broken_stream",
            DeliveryError::InvalidResponse { .. } => "invalid_response",
            DeliveryError::WorkerError { .. } => "worker_error",
            DeliveryError::InvalidRequest { .. } => "invalid_request",
        }
    }

    /// An unparseable document, with literals copied from it redacted.
    pub(crate) fn invalid(err: ProtocolError) -> Self {
        DeliveryError::InvalidResponse {
            path: short_text(&err.path, PARSE_MESSAGE_CHARS),
            message: short_text(&redact_literals(&err.message), PARSE_MESSAGE_CHARS),
        }
    }

    /// An unparseable event of an event stream: [`DeliveryError::invalid`], saying which event.
    pub(crate) fn invalid_event(event: &str, err: ProtocolError) -> Self {
        match DeliveryError::invalid(err) {
            DeliveryError::InvalidResponse { path, message } => {
                DeliveryError::InvalidResponse { path, message: format!("in {event} event: {message}") }
            }
            other => other,
        }
    }

    /// A response that is wrong as a whole.
    pub(crate) fn invalid_body(message: impl Into<String>) -> Self {
        DeliveryError::InvalidResponse { path: String::new(), message: message.into() }
    }
}

struct Hint<'a>(&'a Option<String>);

impl fmt::Display for Hint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(hint) => write!(f, ": {hint}"),
            None => Ok(()),
        }
    }
}

struct Limit<'a>(&'a Option<Duration>);

impl fmt::Display for Limit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(limit) => write!(f, "{} ms", limit.as_millis()),
            None => f.write_str("its time limit"),
        }
    }
}

struct At<'a>(&'a str);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() { Ok(()) } else { write!(f, " at {}", self.0) }
    }
}

/// The hint worth showing from an error status body: a JSON `error.message`, `error` string or
/// `message`, shortened; nothing for any other body.
pub(crate) fn status_hint(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let text = match value.get("error") {
        Some(serde_json::Value::String(text)) => text,
        Some(error) => error.get("message")?.as_str()?,
        None => value.get("message")?.as_str()?,
    };
    Some(short_text(text, HINT_CHARS)).filter(|hint| !hint.is_empty())
}

/// Redacts the literals a parse error message copies from the document.
///
/// serde and the protocol's parser quote what they found as `"..."` (strings, Rust debug
/// syntax) or `` `...` `` (numbers, field names, variants). A literal is kept only when it is
/// short and looks like a name (letters, digits, `_ . - :`), which keeps field names, type
/// tags and the expected alternatives, and it is never kept after `string `, where serde shows a
/// string value of the wrong type. Everything else becomes `…`.
pub(crate) fn redact_literals(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        let (before, from_quote) = rest.split_at(open);
        out.push_str(before);
        let quote = if from_quote.starts_with('"') { '"' } else { '`' };
        let body = from_quote.get(1..).unwrap_or_default();
        let end = if quote == '"' { closing_double_quote(body) } else { body.find('`') };
        let (literal, after) = match end {
            Some(end) => (body.get(..end).unwrap_or_default(), body.get(end + 1..).unwrap_or_default()),
            None => (body, ""),
        };
        let is_string_value = before.ends_with("string ");
        let keep = !is_string_value
            && !literal.is_empty()
            && literal.chars().count() <= KEPT_LITERAL_CHARS
            && literal.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':'));
        out.push(quote);
        out.push_str(if keep { literal } else { "…" });
        out.push(quote);
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The index of the `"` ending a Rust debug string whose opening quote was just before `text`.
fn closing_double_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_keeps_names_and_drops_values() {
        assert_eq!(
            redact_literals("invalid type: string \"my secret text\", expected a sequence"),
            "invalid type: string \"…\", expected a sequence"
        );
        assert_eq!(
            redact_literals("invalid type: string \"token\", expected a sequence"),
            "invalid type: string \"…\", expected a sequence"
        );
        assert_eq!(
            redact_literals("invalid type: string \"with \\\"quotes\\\" inside\", expected u32"),
            "invalid type: string \"…\", expected u32"
        );
        assert_eq!(
            redact_literals("unknown field `modle`, expected one of `model`, `system`"),
            "unknown field `modle`, expected one of `model`, `system`"
        );
        assert_eq!(
            redact_literals("unknown variant `a long value with spaces`, expected `user`"),
            "unknown variant `…`, expected `user`"
        );
        assert_eq!(
            redact_literals("unknown action \"tool.cal\" (expected one of: llm.call, tool.call)"),
            "unknown action \"tool.cal\" (expected one of: llm.call, tool.call)"
        );
        assert_eq!(redact_literals("unterminated \"abc def"), "unterminated \"…\"");
        assert_eq!(redact_literals("expected value"), "expected value");
    }

    #[test]
    fn hints_come_only_from_json_messages() {
        assert_eq!(status_hint(br#"{"error":{"message":"bad\nthing"}}"#).as_deref(), Some("bad thing"));
        assert_eq!(status_hint(br#"{"error":"nope"}"#).as_deref(), Some("nope"));
        assert_eq!(status_hint(br#"{"message":"m"}"#).as_deref(), Some("m"));
        assert_eq!(status_hint(b"<html>secret page</html>"), None);
        assert_eq!(status_hint(br#"{"error":{"code":"x"}}"#), None);
        let long = format!(r#"{{"error":{{"message":"{}"}}}}"#, "x".repeat(500));
        let hint = status_hint(long.as_bytes()).unwrap();
        assert_eq!(hint.chars().count(), HINT_CHARS + 1);
        assert!(hint.ends_with('…'));
    }

    #[test]
    fn retryability_and_codes() {
        let cases = [
            (DeliveryError::Status4xx { status: 400, hint: None }, false, "worker_status_4xx"),
            (DeliveryError::Status4xx { status: 429, hint: None }, true, "worker_status_4xx"),
            (DeliveryError::Status4xx { status: 408, hint: None }, true, "worker_status_4xx"),
            (DeliveryError::Status5xx { status: 503, hint: None }, true, "worker_status_5xx"),
            (DeliveryError::UnexpectedStatus { status: 302 }, false, "worker_status_unexpected"),
            (DeliveryError::Timeout { after: None }, true, "timeout"),
            (DeliveryError::Connection { message: String::new() }, true, "connection_failed"),
            (DeliveryError::BrokenStream { message: String::new() }, true, "broken_stream"),
            (DeliveryError::invalid_body("x"), false, "invalid_response"),
            (DeliveryError::WorkerError { message: String::new(), retryable: true }, true, "worker_error"),
            (DeliveryError::WorkerError { message: String::new(), retryable: false }, false, "worker_error"),
            (DeliveryError::InvalidRequest { message: String::new() }, false, "invalid_request"),
        ];
        for (err, retryable, code) in cases {
            assert_eq!(err.is_retryable(), retryable, "{err:?}");
            assert_eq!(err.code(), code);
        }
    }
}

//! Why a model call failed, in the protocol's [`ErrorCode`] classes, and whether to try again.
//!
//! | failure | code | retryable |
//! |---|---|---|
//! | HTTP 429 (or a stream error event of type `rate_limit_error` / `rate_limit_exceeded`) | `rate_limited` | yes |
//! | HTTP 408, 5xx (529 "overloaded" included), a connection that fails, a stream broken before its end | `provider_error` | yes |
//! | any other 4xx | `provider_error` | no |
//! | the attempt outlives its timeout | `deadline_exceeded` | yes |
//! | a body that is not the provider's format | `provider_error` | no |
//!
//! Messages carry the status and at most [`PROVIDER_MESSAGE_CHARS`] characters of the
//! provider's own `error.message`, with control characters flattened and the API key redacted
//! should the provider echo it; never the request or the rest of the response body. `detail`
//! holds `{provider, status?, type?, retry_after_secs?}` for whoever wants to act on it.

use serde_json::{Map, Value, json};
use turnstone_engine::llm_format::FormatError;
use turnstone_engine::protocol::ErrorCode;
use turnstone_engine::session::CallError;

use crate::net::{error_chain, short_text};

/// The longest provider-supplied error text kept in a message, in characters.
pub const PROVIDER_MESSAGE_CHARS: usize = 300;

/// A failed model call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ProviderError {
    /// What went wrong, for people; never holds the API key.
    pub message: String,
    pub code: ErrorCode,
    /// Whether another attempt may succeed.
    pub retryable: bool,
    /// Machine-readable facts: `provider`, `status`, the provider's error `type`, `retry_after_secs`.
    pub detail: Option<Value>,
}

impl ProviderError {
    /// An error of class `code`.
    pub fn new(code: ErrorCode, retryable: bool, message: impl Into<String>) -> Self {
        ProviderError { message: message.into(), code, retryable, detail: None }
    }

    /// A throttled call (`rate_limited`, retryable).
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::RateLimited, true, message)
    }

    /// A transient provider failure (`provider_error`, retryable).
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ProviderError, true, message)
    }

    /// A final provider failure (`provider_error`, not retryable).
    pub fn terminal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ProviderError, false, message)
    }

    /// An attempt that outlived its timeout (`deadline_exceeded`, retryable).
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::DeadlineExceeded, true, message)
    }

    /// The same error with `detail` set.
    pub fn with_detail(mut self, detail: Value) -> Self {
        self.detail = Some(detail);
        self
    }

    /// Whether another attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The engine's record of this failure.
    pub fn into_call_error(self) -> CallError {
        CallError {
            error: self.message,
            code: Some(self.code),
            detail: self.detail,
            retryable: self.retryable,
        }
    }
}

impl From<ProviderError> for CallError {
    fn from(err: ProviderError) -> Self {
        err.into_call_error()
    }
}

/// Builds errors for one provider, redacting its API key from anything the provider says.
#[derive(Clone, Copy)]
pub(crate) struct Classifier<'a> {
    /// The provider's name in messages: `openai`, `anthropic`.
    pub provider: &'static str,
    /// The API key, never to appear in a message.
    pub secret: Option<&'a str>,
}

impl Classifier<'_> {
    fn detail(&self) -> Map<String, Value> {
        let mut detail = Map::new();
        detail.insert("provider".into(), json!(self.provider));
        detail
    }

    /// An error status with its (possibly empty, possibly non-JSON) body.
    pub fn status(&self, status: u16, body: &[u8], retry_after: Option<u64>) -> ProviderError {
        let parsed = serde_json::from_slice::<Value>(body).ok();
        let (text, kind) = parsed.as_ref().map(error_fields).unwrap_or_default();
        let mut message = format!("{} answered HTTP {status}", self.provider);
        if let Some(text) = text {
            message.push_str(": ");
            message.push_str(&self.provider_text(&text));
        }
        let mut detail = self.detail();
        detail.insert("status".into(), json!(status));
        if let Some(kind) = &kind {
            detail.insert("type".into(), json!(short_text(kind, 100)));
        }
        if let Some(secs) = retry_after {
            detail.insert("retry_after_secs".into(), json!(secs));
        }
        let (code, retryable) = match status {
            429 => (ErrorCode::RateLimited, true),
            408 | 500..=599 => (ErrorCode::ProviderError, true),
            _ => (ErrorCode::ProviderError, false),
        };
        ProviderError::new(code, retryable, message).with_detail(Value::Object(detail))
    }

    /// An error the provider reported inside a successful response (a stream `error` event, or
    /// an `{"error": ...}` body under status 200). Retryable unless its type says the request
    /// itself is wrong.
    pub fn reported(&self, document: &Value) -> ProviderError {
        let (text, kind) = error_fields(document);
        let numeric = document.get("error").and_then(|e| e.get("code")).and_then(Value::as_u64);
        let mut message = format!("{} reported an error", self.provider);
        if let Some(text) = text {
            message.push_str(": ");
            message.push_str(&self.provider_text(&text));
        }
        let mut detail = self.detail();
        if let Some(kind) = &kind {
            detail.insert("type".into(), json!(short_text(kind, 100)));
        }
        if let Some(code) = numeric {
            detail.insert("status".into(), json!(code));
        }
        let (code, retryable) = match (kind.as_deref(), numeric) {
            (Some("rate_limit_error" | "rate_limit_exceeded" | "rate_limited"), _) | (_, Some(429)) => {
                (ErrorCode::RateLimited, true)
            }
            (
                Some(
                    "invalid_request_error"
                    | "authentication_error"
                    | "permission_error"
                    | "not_found_error"
                    | "request_too_large"
                    | "invalid_api_key"
                    | "context_length_exceeded",
                ),
                _,
            ) => (ErrorCode::ProviderError, false),
            (_, Some(code)) if (400..500).contains(&code) && code != 408 => (ErrorCode::ProviderError, false),
            _ => (ErrorCode::ProviderError, true),
        };
        ProviderError::new(code, retryable, message).with_detail(Value::Object(detail))
    }

    /// A body or event that is not the provider's format: final, names where.
    pub fn invalid(&self, err: &FormatError) -> ProviderError {
        let at =
            if err.path.is_empty() { String::new() } else { format!(" at {}", short_text(&err.path, 200)) };
        ProviderError::terminal(format!(
            "{} sent an invalid response{at}: {}",
            self.provider,
            self.provider_text(&err.message)
        ))
        .with_detail(Value::Object(self.detail()))
    }

    /// A response that is wrong as a whole (not JSON, not UTF-8, too large...): final.
    pub fn invalid_body(&self, what: &str) -> ProviderError {
        ProviderError::terminal(format!("{} sent an invalid response: {what}", self.provider))
            .with_detail(Value::Object(self.detail()))
    }

    /// No response: the connection failed. Retryable.
    pub fn connection(&self, err: &reqwest::Error) -> ProviderError {
        ProviderError::retryable(format!("could not reach {}: {}", self.provider, clean(&error_chain(err))))
            .with_detail(Value::Object(self.detail()))
    }

    /// A response that broke off before its end. Retryable.
    pub fn broken(&self, what: &str) -> ProviderError {
        ProviderError::retryable(format!("{} response broke off: {}", self.provider, clean(what)))
            .with_detail(Value::Object(self.detail()))
    }

    /// The attempt outlived `after`. Retryable.
    pub fn timeout(&self, after: Option<std::time::Duration>) -> ProviderError {
        let message = match after {
            Some(limit) => format!("{} did not answer within {}", self.provider, seconds(limit)),
            None => format!("{} did not answer in time", self.provider),
        };
        ProviderError::deadline_exceeded(message).with_detail(Value::Object(self.detail()))
    }

    /// A request that cannot be built (a conversation the format cannot carry...): final.
    pub fn request(&self, what: &str) -> ProviderError {
        ProviderError::terminal(format!("cannot build the {} request: {}", self.provider, clean(what)))
            .with_detail(Value::Object(self.detail()))
    }

    /// Provider-supplied text made safe to keep: one line, the key redacted, shortened.
    fn provider_text(&self, text: &str) -> String {
        let redacted = match self.secret.filter(|s| !s.is_empty()) {
            Some(secret) => text.replace(secret, "[redacted]"),
            None => text.to_owned(),
        };
        clean(&redacted)
    }
}

/// Text made safe to keep in a message: one line, shortened.
fn clean(text: &str) -> String {
    short_text(text, PROVIDER_MESSAGE_CHARS)
}

/// `error.message` (or a string `error`) and `error.type` (or `error.code`) of an error document.
fn error_fields(document: &Value) -> (Option<String>, Option<String>) {
    match document.get("error") {
        Some(Value::String(text)) => (Some(text.clone()), None),
        Some(Value::Object(error)) => {
            let text = error.get("message").and_then(Value::as_str).map(str::to_owned);
            let kind = error
                .get("type")
                .and_then(Value::as_str)
                .or_else(|| error.get("code").and_then(Value::as_str))
                .filter(|k| !k.is_empty())
                .map(str::to_owned);
            (text, kind)
        }
        _ => (None, None),
    }
}

fn seconds(limit: std::time::Duration) -> String {
    let ms = limit.as_millis();
    if ms.is_multiple_of(1000) { format!("{}s", ms / 1000) } else { format!("{:.3}s", limit.as_secs_f64()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Classifier<'static> = Classifier { provider: "openai", secret: Some("sk-secret-123") };

    #[test]
    fn statuses_map_to_classes() {
        let e = C.status(429, b"{\"error\":{\"message\":\"slow down\",\"type\":\"requests\"}}", Some(3));
        assert_eq!((e.code, e.retryable), (ErrorCode::RateLimited, true));
        assert_eq!(e.message, "openai answered HTTP 429: slow down");
        assert_eq!(
            e.detail,
            Some(json!({"provider": "openai", "status": 429, "type": "requests", "retry_after_secs": 3}))
        );
        for status in [408, 500, 502, 503, 529] {
            let e = C.status(status, b"", None);
            assert_eq!((e.code, e.retryable), (ErrorCode::ProviderError, true), "{status}");
        }
        for status in [400, 401, 403, 404, 413, 422] {
            let e = C.status(status, b"not json", None);
            assert_eq!((e.code, e.retryable), (ErrorCode::ProviderError, false), "{status}");
            assert_eq!(e.message, format!("openai answered HTTP {status}"));
        }
    }

    #[test]
    fn provider_text_is_cleaned_shortened_and_redacted() {
        let long = format!("bad key sk-secret-123\nline two {}", "x".repeat(1000));
        let body = json!({"error": {"message": long}}).to_string();
        let e = C.status(401, body.as_bytes(), None);
        assert!(!e.message.contains("sk-secret-123"));
        assert!(e.message.contains("bad key [redacted] line two"));
        assert!(e.message.chars().count() <= "openai answered HTTP 401: ".len() + PROVIDER_MESSAGE_CHARS + 1);
    }

    #[test]
    fn reported_errors() {
        let e =
            C.reported(&json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}));
        assert_eq!((e.code, e.retryable), (ErrorCode::ProviderError, true));
        assert_eq!(e.message, "openai reported an error: busy");
        let e = C.reported(&json!({"error": {"type": "rate_limit_error", "message": "slow"}}));
        assert_eq!((e.code, e.retryable), (ErrorCode::RateLimited, true));
        let e = C.reported(&json!({"error": {"type": "invalid_request_error", "message": "no"}}));
        assert!(!e.retryable);
        let e = C.reported(&json!({"error": {"code": 400, "message": "no"}}));
        assert!(!e.retryable);
        let e = C.reported(&json!({"error": {"code": 502, "message": "upstream"}}));
        assert!(e.retryable);
    }

    #[test]
    fn into_call_error_keeps_everything() {
        let e = ProviderError::rate_limited("x").with_detail(json!({"a": 1}));
        let c = e.clone().into_call_error();
        assert_eq!(c.error, "x");
        assert_eq!(c.code, Some(ErrorCode::RateLimited));
        assert_eq!(c.detail, Some(json!({"a": 1})));
        assert!(c.retryable);
        assert_eq!(CallError::from(e), c);
    }
}

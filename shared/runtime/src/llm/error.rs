//! Why a model call failed, in the protocol's [`ErrorCode`] classes, and whether to try again.
//!
//! | failure | code | retryable |
//! |---|---|---|
//! | HTTP 429 (or a stream error event of type `rate_limit_error` / `rate_limit_exceeded`) | `rate_limited` | yes |
//! | HTTP 408, 5xx (529 "overloaded" included), a connection that fails, a stream broken before its end | `provider_error` | yes |
//! | the request does not fit the model's context window (see below) | `provider_error` | no |
//! | any other 4xx | `provider_error` | no |
//! | the attempt outlives its timeout | `deadline_exceeded` | yes |
//! | a body that is not the provider's format | `provider_error` | no |
//!
//! Messages carry the status and at most [`PROVIDER_MESSAGE_CHARS`] characters of the
//! provider's own `error.message`, with control characters flattened and the API key redacted
//! should the provider echo it; never the request or the rest of the response body. `detail`
//! holds `{provider, status?, type?, retry_after_secs?, context_overflow?}` for whoever wants to
//! act on it.
//!
//! A refusal for length, as an error status or reported in a stream, is recognised
//! ([`ProviderError::context_overflow`]) by what each provider sends:
//! - Anthropic (HTTP 400, "HTTP errors", https://docs.claude.com/en/api/errors): an
//!   `invalid_request_error` whose message starts with `prompt is too long` (`prompt is too
//!   long: 208310 tokens > 200000 maximum`, quoted in
//!   https://github.com/anthropics/claude-code/issues/12186) or says the input and `max_tokens`
//!   `exceed context limit` (``input length and `max_tokens` exceed context limit: 178959 +
//!   64000 > 200000, decrease input length or `max_tokens` and try again``, quoted in
//!   https://github.com/docker/docker-agent/issues/569). Its 413 `request_too_large` is a limit
//!   on the request's bytes, answered before any token is counted (same page), and is not one.
//!   A stream's `error` event carries the same `error` object.
//! - OpenAI, Chat Completions and Responses: `error.code` `context_length_exceeded`, with
//!   `type` `invalid_request_error` under HTTP 400, the code alone in a Responses stream's
//!   `error` event or `response.failed`. Chat Completions says `This model's maximum context
//!   length is 128000 tokens. However, your messages resulted in 204308 tokens. ...` or `...
//!   However, you requested 4268 tokens (4012 in the messages, 256 in the completion). ...`
//!   (quoted in https://github.com/ChatGPTNextWeb/NextChat/issues/625 and
//!   https://github.com/conghaonet/hao_chatgpt/issues/4); Responses says `Your input exceeds the
//!   context window of this model. Please adjust your input and try again.`, no count
//!   (https://github.com/openai/codex/issues/20866).
//!
//! The counts are read from the message where it states them.

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
    /// Machine-readable facts: `provider`, `status`, the provider's error `type`,
    /// `retry_after_secs`, `context_overflow`.
    pub detail: Option<Value>,
    /// Set when the provider refused the request for not fitting the model's context window.
    pub context_overflow: Option<ContextOverflow>,
}

/// A request the provider refused because it does not fit the model's context window, with the
/// counts its message states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextOverflow {
    /// The request's size in tokens as the provider counted it: the prompt, plus the output
    /// asked for when the provider counted that too (Anthropic's `A + B > M`, OpenAI's
    /// `you requested N tokens`). `None` when not stated (OpenAI Responses).
    pub tokens: Option<u64>,
    /// The model's context window in tokens, when stated.
    pub window: Option<u64>,
}

impl ContextOverflow {
    /// The overflow as `detail` carries it: `{"tokens": n | null, "window": m | null}`.
    fn to_json(self) -> Value {
        json!({"tokens": self.tokens, "window": self.window})
    }
}

impl ProviderError {
    /// An error of class `code`.
    pub fn new(code: ErrorCode, retryable: bool, message: impl Into<String>) -> Self {
        ProviderError { message: message.into(), code, retryable, detail: None, context_overflow: None }
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

    /// The same error marked as a refusal for not fitting the context window.
    pub fn with_context_overflow(mut self, overflow: ContextOverflow) -> Self {
        self.context_overflow = Some(overflow);
        self
    }

    /// Whether the provider refused the request for not fitting the model's context window, and
    /// the counts it stated.
    pub fn context_overflow(&self) -> Option<ContextOverflow> {
        self.context_overflow
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
        let overflow = parsed.as_ref().and_then(context_overflow);
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
            _ if overflow.is_some() => (ErrorCode::ProviderError, false),
            429 => (ErrorCode::RateLimited, true),
            408 | 500..=599 => (ErrorCode::ProviderError, true),
            _ => (ErrorCode::ProviderError, false),
        };
        Self::finish(ProviderError::new(code, retryable, message), detail, overflow)
    }

    /// `error` with `detail`, and marked as a context overflow when it is one.
    fn finish(
        error: ProviderError,
        mut detail: Map<String, Value>,
        overflow: Option<ContextOverflow>,
    ) -> ProviderError {
        match overflow {
            Some(overflow) => {
                detail.insert("context_overflow".into(), overflow.to_json());
                error.with_detail(Value::Object(detail)).with_context_overflow(overflow)
            }
            None => error.with_detail(Value::Object(detail)),
        }
    }

    /// An error the provider reported inside a successful response (a stream `error` event, or
    /// an `{"error": ...}` body under status 200). Retryable unless its type says the request
    /// itself is wrong.
    pub fn reported(&self, document: &Value) -> ProviderError {
        let (text, kind) = error_fields(document);
        let numeric = document.get("error").and_then(|e| e.get("code")).and_then(Value::as_u64);
        let overflow = context_overflow(document);
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
            _ if overflow.is_some() => (ErrorCode::ProviderError, false),
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
        Self::finish(ProviderError::new(code, retryable, message), detail, overflow)
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

/// Whether an error document (`{"error": {type?, code?, message?}}`) refuses the request for
/// not fitting the model's context window, with the counts its message states.
fn context_overflow(document: &Value) -> Option<ContextOverflow> {
    let error = document.get("error")?.as_object()?;
    let field = |name: &str| error.get(name).and_then(Value::as_str);
    let text = field("message").unwrap_or_default().to_ascii_lowercase();
    // OpenAI (Chat Completions and Responses, statuses and stream errors alike).
    if field("code") == Some("context_length_exceeded") || field("type") == Some("context_length_exceeded") {
        let window = number_after(&text, "maximum context length is");
        let tokens = number_after(&text, "resulted in").or_else(|| number_after(&text, "you requested"));
        return Some(ContextOverflow { tokens, window });
    }
    // Anthropic.
    if field("type") != Some("invalid_request_error") {
        return None;
    }
    if text.starts_with("prompt is too long") {
        let tokens = number_after(&text, "prompt is too long:");
        let window = number_after(&text, ">");
        return Some(ContextOverflow { tokens, window });
    }
    let at = text.find("exceed context limit")?;
    // `...: A + B > M, ...`: the input and the output asked for, against the window.
    let counts = &text[at..];
    let input = number_after(counts, ":");
    let output = number_after(counts, "+");
    let tokens = input.zip(output).and_then(|(a, b)| a.checked_add(b));
    Some(ContextOverflow { tokens, window: number_after(counts, ">") })
}

/// The whole number that follows the first `marker` in `text` (spaces skipped; digit groups may
/// be separated by commas), if one does.
fn number_after(text: &str, marker: &str) -> Option<u64> {
    let rest = text[text.find(marker)? + marker.len()..].trim_start();
    let digits: String =
        rest.chars().take_while(|c| c.is_ascii_digit() || *c == ',').filter(char::is_ascii_digit).collect();
    digits.parse().ok()
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

    const ANTHROPIC: Classifier<'static> = Classifier { provider: "anthropic", secret: None };

    fn overflow(tokens: Option<u64>, window: Option<u64>) -> Option<ContextOverflow> {
        Some(ContextOverflow { tokens, window })
    }

    /// A context overflow: final, `provider_error`, its counts in `detail`.
    fn assert_overflow(e: &ProviderError, expected: Option<ContextOverflow>) {
        assert_eq!(e.context_overflow(), expected, "{e:?}");
        assert_eq!((e.code, e.retryable), (ErrorCode::ProviderError, false), "{e:?}");
        let stated = expected.unwrap();
        let detail = e.detail.as_ref().unwrap();
        assert_eq!(detail["context_overflow"], json!({"tokens": stated.tokens, "window": stated.window}));
    }

    #[test]
    fn anthropic_prompt_too_long_is_a_context_overflow() {
        let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 42402 tokens > 40000 maximum"}}"#;
        let e = ANTHROPIC.status(400, body, None);
        assert_overflow(&e, overflow(Some(42402), Some(40000)));
        assert_eq!(
            e.message,
            "anthropic answered HTTP 400: prompt is too long: 42402 tokens > 40000 maximum"
        );
        assert_eq!(
            e.detail,
            Some(json!({"provider": "anthropic", "status": 400, "type": "invalid_request_error",
                        "context_overflow": {"tokens": 42402, "window": 40000}}))
        );
        // The same refusal as a stream's error event.
        let event = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "prompt is too long: 208310 tokens > 200000 maximum"}});
        assert_overflow(&ANTHROPIC.reported(&event), overflow(Some(208310), Some(200000)));
    }

    #[test]
    fn anthropic_input_and_max_tokens_past_the_limit_is_a_context_overflow() {
        let message = "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input \
                       length or `max_tokens` and try again";
        let body = json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
        let e = ANTHROPIC.status(400, body.to_string().as_bytes(), None);
        assert_overflow(&e, overflow(Some(188240 + 21333), Some(200000)));
        assert_overflow(&ANTHROPIC.reported(&body), overflow(Some(209573), Some(200000)));
    }

    #[test]
    fn anthropic_byte_limits_and_other_refusals_are_not_context_overflows() {
        let too_large = br#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}"#;
        let e = ANTHROPIC.status(413, too_large, None);
        assert_eq!(e.context_overflow(), None);
        assert_eq!((e.code, e.retryable), (ErrorCode::ProviderError, false));
        assert_eq!(e.detail.as_ref().unwrap().get("context_overflow"), None);
        let max_tokens = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 10000 > 4096, which is the maximum allowed number of output tokens for claude-3-5-sonnet-20240620"}}"#;
        assert_eq!(ANTHROPIC.status(400, max_tokens, None).context_overflow(), None);
        // The words alone, under another type, are not Anthropic's refusal.
        let other =
            json!({"error": {"type": "api_error", "message": "prompt is too long: 5 tokens > 4 maximum"}});
        let e = ANTHROPIC.reported(&other);
        assert_eq!(e.context_overflow(), None);
        assert!(e.retryable);
    }

    #[test]
    fn openai_chat_completions_context_length_exceeded() {
        let body = json!({"error": {
            "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in \
                        130000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        let e = C.status(400, body.to_string().as_bytes(), None);
        assert_overflow(&e, overflow(Some(130000), Some(128000)));
        assert_eq!(e.detail.as_ref().unwrap()["type"], "invalid_request_error");
        // With the completion asked for: the whole request counts.
        let body = json!({"error": {
            "message": "This model's maximum context length is 128000 tokens. However, you requested 135000 tokens \
                        (130000 in the messages, 5000 in the completion). Please reduce the length of the messages \
                        or completion.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        assert_overflow(
            &C.status(400, body.to_string().as_bytes(), None),
            overflow(Some(135000), Some(128000)),
        );
        // With functions.
        let body = json!({"error": {
            "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in \
                        202868 tokens (202767 in the messages, 101 in the functions). Please reduce the length of \
                        the messages or functions.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        assert_overflow(&C.reported(&body), overflow(Some(202868), Some(128000)));
        // Another 400 is not one.
        let other = br#"{"error":{"message":"Invalid value","type":"invalid_request_error","param":null,"code":null}}"#;
        assert_eq!(C.status(400, other, None).context_overflow(), None);
    }

    #[test]
    fn openai_responses_context_length_exceeded_states_no_counts() {
        let message =
            "Your input exceeds the context window of this model. Please adjust your input and try again.";
        let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": "input",
                                    "code": "context_length_exceeded"}});
        let e = C.status(400, body.to_string().as_bytes(), None);
        assert_overflow(&e, overflow(None, None));
        assert_eq!(e.detail.as_ref().unwrap()["context_overflow"], json!({"tokens": null, "window": null}));
        // A stream's `error` event and a `response.failed`, as the Responses client hands them on.
        let reported = json!({"error": {"code": "context_length_exceeded", "message": message}});
        let e = C.reported(&reported);
        assert_overflow(&e, overflow(None, None));
        assert_eq!(e.message, format!("openai reported an error: {message}"));
    }

    #[test]
    fn counts_are_read_leniently() {
        assert_eq!(number_after("limit is 128,000 tokens", "limit is"), Some(128000));
        assert_eq!(number_after("no number here", "here"), None);
        assert_eq!(number_after("absent", "marker"), None);
        let text = json!({"error": {"type": "invalid_request_error", "message": "Prompt is too long"}});
        assert_eq!(context_overflow(&text), overflow(None, None));
        assert_eq!(context_overflow(&json!({"error": "prompt is too long"})), None);
        assert_eq!(ProviderError::terminal("x").context_overflow(), None);
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

//! OpenAI's Responses API, where its reasoning models keep their reasoning between steps.
//!
//! POST `{base_url}/responses` with `Authorization: Bearer <key>` (left out without a key),
//! the body of [`llm_format::openai_responses::request`] (stateless: `store: false`, the
//! encrypted reasoning asked for and sent back); the answer is read by
//! [`llm_format::openai_responses::response`] or, streamed, event by event through
//! [`llm_format::openai_responses::StreamAccumulator`] until `response.completed` (or
//! `response.incomplete`): the stream has no `[DONE]`. A stream's `error` and
//! `response.failed` events are the provider's reported errors (`stream_error`).
//!
//! [`llm_format::openai_responses::request`]: turnstone_engine::llm_format::openai_responses::request
//! [`llm_format::openai_responses::response`]: turnstone_engine::llm_format::openai_responses::response
//! [`llm_format::openai_responses::StreamAccumulator`]: turnstone_engine::llm_format::openai_responses::StreamAccumulator

use serde_json::{Value, json};
use turnstone_engine::llm_format::LlmFormat;

use super::ProviderSetupError;
use super::provider::{HttpProvider, Wire};

/// The OpenAI Responses wire format.
#[derive(Debug, Clone, Copy)]
pub struct OpenaiResponses;

impl Wire for OpenaiResponses {
    const PROVIDER: &'static str = "openai-responses";
    const TYPE_NAME: &'static str = "OpenAiResponsesProvider";
    const FORMAT: LlmFormat = LlmFormat::OpenaiResponses;
}

/// A model served over OpenAI's Responses API.
pub type OpenAiResponsesProvider = HttpProvider<OpenaiResponses>;

impl HttpProvider<OpenaiResponses> {
    /// OpenAI's own API.
    pub const DEFAULT_BASE_URL: &'static str = super::OpenAiProvider::DEFAULT_BASE_URL;

    /// A provider at `base_url` (e.g. `<https://api.openai.com/v1`>), sending `api_key` as a
    /// bearer token when there is one; uses the shared [`super::http_client`].
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self, ProviderSetupError> {
        Self::bearer(base_url, "/responses", api_key)
    }
}

/// The events that end a Responses stream with an answer.
pub(crate) fn ends_stream(kind: &str) -> bool {
    matches!(kind, "response.completed" | "response.incomplete")
}

/// The error document (`{"error": {code, message}}`) of a stream event that reports one: an
/// `error` event (`{type: "error", code, message}`) or `response.failed` (its response's
/// `error`), so the caller classifies it like an error body (a rate limit or a server error
/// may go better another time).
pub(crate) fn stream_error(kind: &str, data: &Value) -> Option<Value> {
    match kind {
        "error" => Some(json!({ "error": {
            "code": data.get("code").cloned().unwrap_or(Value::Null),
            "message": data.get("message").cloned().unwrap_or(Value::Null),
        }})),
        "response.failed" => {
            let error = data.pointer("/response/error").filter(|e| !e.is_null()).cloned();
            Some(json!({ "error": error.unwrap_or_else(|| json!({ "message": "the response failed" })) }))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_errors_become_error_documents() {
        let event =
            json!({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": null});
        assert_eq!(
            stream_error("error", &event),
            Some(json!({"error": {"code": "rate_limit_exceeded", "message": "slow down"}}))
        );
        let failed = json!({"type": "response.failed", "response": {"status": "failed",
            "error": {"code": "server_error", "message": "boom"}}});
        assert_eq!(
            stream_error("response.failed", &failed),
            Some(json!({"error": {"code": "server_error", "message": "boom"}}))
        );
        assert_eq!(stream_error("response.output_text.delta", &json!({})), None);
        assert!(ends_stream("response.completed") && ends_stream("response.incomplete"));
        assert!(!ends_stream("response.failed"));
    }
}

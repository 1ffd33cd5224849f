//! One model call over HTTP, shared by the HTTP providers: POST the body, read
//! a JSON answer or an event stream as it arrives, classify every failure.
//!
//! The answer is read by its `Content-Type`, not by what was asked: a server that ignores
//! `stream: true` and answers JSON still works (its answer is forwarded as one delta), and an
//! event stream is read as one whatever the request said. A stream ends at its end marker
//! (OpenAI's `data: [DONE]`, Anthropic's `message_stop`, the Responses API's
//! `response.completed` or `response.incomplete`); one that stops before it, or before the
//! provider's accumulator saw a finish, broke off and is retryable.

use std::time::Duration;

use reqwest::Response;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use serde_json::Value;
use turnstone_engine::llm_format::{self, LlmFormat, StreamAccumulator};
use turnstone_engine::protocol::{LlmResponse, StreamDelta, ToolCallDelta};

use super::error::{Classifier, ProviderError};
use crate::net::{self, SseStream, SseStreamError};

/// The largest JSON body or single stream event read from a provider (32 MiB).
pub(crate) const MAX_BODY_BYTES: usize = 32 << 20;
/// How much of an error status body is read to find the provider's message.
const ERROR_BODY_BYTES: usize = 64 << 10;
/// How long to wait for the rest of a body after its end marker, so the connection can be reused.
const DRAIN_AFTER_END: Duration = Duration::from_millis(100);

/// Where and how one provider is called.
pub(crate) struct Endpoint<'a> {
    /// Names the provider in errors and builds them.
    pub classifier: Classifier<'a>,
    pub format: LlmFormat,
    pub url: &'a reqwest::Url,
    /// Authentication and extra headers.
    pub headers: &'a HeaderMap,
}

/// Performs one call: `body` is the provider request; `stream` only picks the `Accept` header
/// and whether a JSON answer is forwarded as a delta. `timeout` bounds the whole attempt.
pub(crate) async fn call(
    client: &reqwest::Client,
    endpoint: &Endpoint<'_>,
    body: &Value,
    stream: bool,
    timeout: Option<Duration>,
    on_delta: &mut (dyn FnMut(StreamDelta) + Send),
) -> Result<LlmResponse, ProviderError> {
    let c = endpoint.classifier;
    let body = serde_json::to_vec(body).map_err(|e| c.request(&e.to_string()))?;
    let accept = if stream { "text/event-stream" } else { "application/json" };
    let mut request = client
        .post(endpoint.url.clone())
        .headers(endpoint.headers.clone())
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(ACCEPT, HeaderValue::from_static(accept))
        .body(body);
    // The model call's span, so a provider (or a proxy in front of one) can join the trace.
    if let Some(traceparent) = crate::trace::traceparent() {
        request = request.header(crate::trace::TRACEPARENT_HEADER, traceparent);
    }
    let attempt = exchange(request, endpoint, stream, on_delta);
    let outcome = match timeout {
        Some(limit) => {
            tokio::time::timeout(limit, attempt).await.unwrap_or_else(|_| Err(c.timeout(Some(limit))))
        }
        None => attempt.await,
    };
    if let Err(err) = &outcome {
        tracing::debug!(provider = c.provider, code = ?err.code, retryable = err.retryable, error = %err, "model call failed");
    }
    outcome
}

async fn exchange(
    request: reqwest::RequestBuilder,
    endpoint: &Endpoint<'_>,
    stream: bool,
    on_delta: &mut (dyn FnMut(StreamDelta) + Send),
) -> Result<LlmResponse, ProviderError> {
    let c = endpoint.classifier;
    let response = request
        .send()
        .await
        .map_err(|e| if e.is_builder() { c.request("invalid request") } else { c.connection(&e) })?;
    let status = response.status();
    tracing::debug!(provider = c.provider, status = status.as_u16(), "model provider responded");
    if !status.is_success() {
        let retry_after = retry_after_secs(response.headers());
        let body = net::read_limited(response, ERROR_BODY_BYTES).await.unwrap_or_default();
        return Err(c.status(status.as_u16(), &body, retry_after));
    }
    if is_event_stream(&response) {
        return read_stream(response, endpoint, on_delta).await;
    }
    if response.content_length().is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return Err(c.invalid_body(&format!("the body is larger than {MAX_BODY_BYTES} bytes")));
    }
    let body = net::read_limited(response, MAX_BODY_BYTES).await.map_err(|e| body_error(c, &e))?;
    if body.len() > MAX_BODY_BYTES {
        return Err(c.invalid_body(&format!("the body is larger than {MAX_BODY_BYTES} bytes")));
    }
    let document: Value =
        serde_json::from_slice(&body).map_err(|e| c.invalid_body(&format!("the body is not JSON: {e}")))?;
    if has_error(&document) {
        return Err(c.reported(&document));
    }
    let answer = llm_format::response(endpoint.format, &document).map_err(|e| c.invalid(&e))?;
    if stream {
        let delta = whole_delta(&answer);
        if delta != StreamDelta::default() {
            on_delta(delta);
        }
    }
    Ok(answer)
}

/// Reads an event stream as it arrives, forwarding each delta, until the format's end marker.
async fn read_stream(
    response: Response,
    endpoint: &Endpoint<'_>,
    on_delta: &mut (dyn FnMut(StreamDelta) + Send),
) -> Result<LlmResponse, ProviderError> {
    let c = endpoint.classifier;
    let mut accumulator = StreamAccumulator::new(endpoint.format);
    let mut stream = SseStream::new(response, MAX_BODY_BYTES);
    let mut ended = false;
    let mut seen = 0_usize;
    while let Some(event) = stream.next().await {
        let event = event.map_err(|e| match e {
            SseStreamError::Body(e) => body_error(c, &e),
            SseStreamError::Sse(e) => c.invalid_body(&e.to_string()),
        })?;
        seen += 1;
        if endpoint.format == LlmFormat::Openai && event.data.trim() == "[DONE]" {
            ended = true;
            break;
        }
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|e| c.invalid_body(&format!("stream event {seen} is not JSON: {e}")))?;
        if has_error(&data) {
            return Err(c.reported(&data));
        }
        let name = if event.event == "message" { "" } else { event.event.as_str() };
        let kind =
            if name.is_empty() { data.get("type").and_then(Value::as_str).unwrap_or("") } else { name };
        let responses = endpoint.format == LlmFormat::OpenaiResponses;
        if responses && let Some(report) = super::openai_responses::stream_error(kind, &data) {
            return Err(c.reported(&report));
        }
        if let Some(delta) = accumulator.push(name, &data).map_err(|e| c.invalid(&e))? {
            on_delta(delta);
        }
        if (endpoint.format == LlmFormat::Anthropic && kind == "message_stop")
            || (responses && super::openai_responses::ends_stream(kind))
        {
            ended = true;
            break;
        }
    }
    if ended {
        // Read whatever follows the end marker for a moment, so a finished body frees its
        // connection for reuse.
        let _ = tokio::time::timeout(DRAIN_AFTER_END, stream.drain(ERROR_BODY_BYTES)).await;
    }
    match accumulator.finish() {
        Ok(answer) => Ok(answer),
        Err(err) if !ended => Err(c.broken(&err.message)),
        Err(err) => Err(c.invalid(&err)),
    }
}

/// A complete answer as the one delta a streaming caller gets when the server did not stream.
fn whole_delta(answer: &LlmResponse) -> StreamDelta {
    StreamDelta {
        text: answer.content.clone(),
        reasoning: None,
        tool_calls: answer.tool_calls.as_ref().map(|calls| {
            calls
                .iter()
                .map(|call| ToolCallDelta {
                    id: call.id.clone(),
                    name: Some(call.function.name.clone()),
                    arguments: Some(call.function.arguments.clone()),
                })
                .collect()
        }),
        finish_reason: answer.finish_reason.clone(),
    }
}

/// Whether a document is an error report (`{"error": {...}}`, Anthropic's `{"type": "error", ...}`).
fn has_error(document: &Value) -> bool {
    document.get("error").is_some_and(|e| !e.is_null())
}

fn is_event_stream(response: &Response) -> bool {
    response.headers().get(CONTENT_TYPE).is_some_and(|value| {
        let value = String::from_utf8_lossy(value.as_bytes());
        value.split(';').next().unwrap_or_default().trim().eq_ignore_ascii_case("text/event-stream")
    })
}

/// `Retry-After` in whole seconds, when it is given as a number of seconds.
fn retry_after_secs(headers: &HeaderMap) -> Option<u64> {
    headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()
}

fn body_error(c: Classifier<'_>, err: &reqwest::Error) -> ProviderError {
    if err.is_timeout() { c.timeout(None) } else { c.broken(&net::error_chain(err)) }
}

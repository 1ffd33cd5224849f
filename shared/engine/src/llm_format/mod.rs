//! Provider wire formats (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages) <->
//! the neutral LlmRequest/LlmResponse.
//!
//! Pure conversions, no I/O: the engine uses them for worker-run LLM calls with a `format`
//! (the `llm.execute` trigger carries a provider-native request, the worker's `llm.result` a
//! provider-native response), and the runtime's HTTP model providers use them to talk to the
//! providers themselves.
//!
//! Each format module offers the same three pieces:
//!
//! - `request(&LlmRequest, stream)`: the provider's request body. OpenAI's cannot fail (the
//!   protocol's messages are OpenAI-shaped); Anthropic's fails on content it cannot carry
//!   (audio, video, non-PDF files, system messages after the start) rather than dropping it,
//!   and the Responses API's likewise (audio, video).
//! - `response(&Value)`: a complete (non-streaming) provider response body as an [`LlmResponse`].
//! - `StreamAccumulator`: fed one parsed stream event at a time, it returns the
//!   [`StreamDelta`] to forward and, at the end, assembles the
//!   whole [`LlmResponse`]. The caller does the SSE framing (and OpenAI's `[DONE]`; a
//!   Responses stream ends at `response.completed` or `response.incomplete`).
//!
//! Reasoning is streamed as deltas and kept in [`LlmResponse::reasoning`]; what a provider
//! requires back (signed thinking, encrypted reasoning items) in its
//! [`LlmResponse::provider_blocks`]. Token usage passes through in the provider's own shape
//! ([`usage::TokenCounts`] reads any of them). A provider error body (`{"error": ...}`) or
//! stream `error` event becomes a [`FormatError`] at path `error`.
//!
//! [`request`], [`response`] and [`StreamAccumulator`] here dispatch on [`LlmFormat`].

use serde_json::Value;

use crate::protocol::{LlmRequest, LlmResponse, StreamDelta};

pub use crate::protocol::LlmFormat;

pub mod anthropic;
mod json;
pub mod openai;
pub mod openai_responses;
pub mod usage;

/// A provider document (or a request) that cannot be converted; `path` names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.display())]
pub struct FormatError {
    /// Where the problem is, e.g. `choices[0].message.tool_calls[1].function.name`; empty for the whole document.
    pub path: String,
    pub message: String,
}

impl FormatError {
    /// An error at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FormatError { path: path.into(), message: message.into() }
    }

    fn display(&self) -> String {
        if self.path.is_empty() { self.message.clone() } else { format!("{}: {}", self.path, self.message) }
    }
}

/// The request body for `req` in `format`; `stream` asks for a streamed answer.
pub fn request(format: LlmFormat, req: &LlmRequest, stream: bool) -> Result<Value, FormatError> {
    match format {
        LlmFormat::Openai => Ok(openai::request(req, stream)),
        LlmFormat::Anthropic => anthropic::request(req, stream),
        LlmFormat::OpenaiResponses => openai_responses::request(req, stream),
    }
}

/// A complete (non-streaming) response body in `format` as an [`LlmResponse`].
pub fn response(format: LlmFormat, body: &Value) -> Result<LlmResponse, FormatError> {
    match format {
        LlmFormat::Openai => openai::response(body),
        LlmFormat::Anthropic => anthropic::response(body),
        LlmFormat::OpenaiResponses => openai_responses::response(body),
    }
}

/// A stream accumulator for any format.
#[derive(Debug, Clone)]
pub enum StreamAccumulator {
    /// OpenAI `chat.completion.chunk`s.
    Openai(openai::StreamAccumulator),
    /// Anthropic message stream events.
    Anthropic(anthropic::StreamAccumulator),
    /// OpenAI response stream events.
    OpenaiResponses(openai_responses::StreamAccumulator),
}

impl StreamAccumulator {
    /// An empty accumulator for `format`.
    pub fn new(format: LlmFormat) -> Self {
        match format {
            LlmFormat::Openai => StreamAccumulator::Openai(openai::StreamAccumulator::new()),
            LlmFormat::Anthropic => StreamAccumulator::Anthropic(anthropic::StreamAccumulator::new()),
            LlmFormat::OpenaiResponses => {
                StreamAccumulator::OpenaiResponses(openai_responses::StreamAccumulator::new())
            }
        }
    }

    /// Takes one SSE event (its `event:` name, empty when none, and parsed `data:`); OpenAI ignores the name.
    pub fn push(&mut self, event: &str, data: &Value) -> Result<Option<StreamDelta>, FormatError> {
        match self {
            StreamAccumulator::Openai(acc) => acc.push(data),
            StreamAccumulator::Anthropic(acc) => acc.push(event, data),
            StreamAccumulator::OpenaiResponses(acc) => acc.push(event, data),
        }
    }

    /// The complete response, once the stream has ended.
    pub fn finish(self) -> Result<LlmResponse, FormatError> {
        match self {
            StreamAccumulator::Openai(acc) => acc.finish(),
            StreamAccumulator::Anthropic(acc) => acc.finish(),
            StreamAccumulator::OpenaiResponses(acc) => acc.finish(),
        }
    }
}

//! OpenAI Chat Completions (and compatible servers: vLLM, Ollama, llama.cpp, OpenRouter, ...).
//!
//! POST `{base_url}/chat/completions` with `Authorization: Bearer <key>` (left out without a
//! key, for local servers), the body of [`llm_format::openai::request`] (without
//! `prompt_cache_key` for a server other than OpenAI's own); the answer is read by
//! [`llm_format::openai::response`] or, streamed, chunk by chunk through
//! [`llm_format::openai::StreamAccumulator`] until `data: [DONE]`.
//!
//! [`llm_format::openai::request`]: turnstone_engine::llm_format::openai::request
//! [`llm_format::openai::response`]: turnstone_engine::llm_format::openai::response
//! [`llm_format::openai::StreamAccumulator`]: turnstone_engine::llm_format::openai::StreamAccumulator

use turnstone_engine::llm_format::LlmFormat;

use super::ProviderSetupError;
use super::provider::{HttpProvider, Wire};

/// The OpenAI Chat Completions wire format.
#[derive(Debug, Clone, Copy)]
pub struct Openai;

impl Wire for Openai {
    const PROVIDER: &'static str = "openai";
    const TYPE_NAME: &'static str = "OpenAiProvider";
    const FORMAT: LlmFormat = LlmFormat::Openai;
}

/// A model served over the OpenAI Chat Completions API.
pub type OpenAiProvider = HttpProvider<Openai>;

/// The host of OpenAI's own API.
const OPENAI_HOST: &str = "api.openai.com";

impl HttpProvider<Openai> {
    /// OpenAI's own API.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";

    /// A provider at `base_url` (e.g. `https://api.openai.com/v1`), sending `api_key` as a
    /// bearer token when there is one; uses the shared [`super::http_client`].
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self, ProviderSetupError> {
        let provider = Self::bearer(base_url, "/chat/completions", api_key)?;
        // `prompt_cache_key` is OpenAI's own: a compatible server (Mistral's, Groq's, ...) may
        // refuse a field it does not know, so only OpenAI's API is sent it.
        let official = provider.host() == Some(OPENAI_HOST);
        Ok(if official { provider } else { provider.leaving_out(&["prompt_cache_key"]) })
    }
}

//! OpenAI Chat Completions (and compatible servers: vLLM, Ollama, llama.cpp, OpenRouter, ...).
//!
//! POST `{base_url}/chat/completions` with `Authorization: Bearer <key>` (left out without a
//! key, for local servers), the body of [`llm_format::openai::request`]; the answer is read by
//! [`llm_format::openai::response`] or, streamed, chunk by chunk through
//! [`llm_format::openai::StreamAccumulator`] until `data: [DONE]`.
//!
//! [`llm_format::openai::request`]: turnstone_engine::llm_format::openai::request
//! [`llm_format::openai::response`]: turnstone_engine::llm_format::openai::response
//! [`llm_format::openai::StreamAccumulator`]: turnstone_engine::llm_format::openai::StreamAccumulator

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, HeaderMap};
use turnstone_engine::llm_format::{self, LlmFormat};
use turnstone_engine::protocol::{LlmRequest, LlmResponse, StreamDelta};

use super::error::{Classifier, ProviderError};
use super::http::{self, Endpoint};
use super::{ModelProvider, ProviderSetupError, endpoint_url, http_client, set_header, usable_key};

/// A model served over the OpenAI Chat Completions API.
#[derive(Clone)]
pub struct OpenAiProvider {
    client: reqwest::Client,
    url: reqwest::Url,
    api_key: Option<String>,
    headers: HeaderMap,
}

impl OpenAiProvider {
    /// OpenAI's own API.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";

    /// A provider at `base_url` (e.g. `https://api.openai.com/v1`), sending `api_key` as a
    /// bearer token when there is one; uses the shared [`http_client`].
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self, ProviderSetupError> {
        let url = endpoint_url(base_url, "/chat/completions")?;
        let api_key = usable_key(api_key);
        let mut headers = HeaderMap::new();
        if let Some(key) = &api_key {
            set_header(&mut headers, AUTHORIZATION.as_str(), &format!("Bearer {key}"), true)?;
        }
        Ok(OpenAiProvider { client: http_client()?, url, api_key, headers })
    }

    /// The same provider on another HTTP client (which should keep `tcp_nodelay(true)`).
    pub fn with_client(mut self, client: reqwest::Client) -> Self {
        self.client = client;
        self
    }

    /// The same provider sending one more header on every request (e.g. `OpenAI-Organization`,
    /// or `api-key` for Azure); the value is treated as secret.
    pub fn with_header(mut self, name: &str, value: &str) -> Result<Self, ProviderSetupError> {
        set_header(&mut self.headers, name, value, true)?;
        Ok(self)
    }

    /// The endpoint requests go to.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("url", &self.url.as_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    async fn complete(
        &self,
        request: &LlmRequest,
        stream: bool,
        timeout: Option<Duration>,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<LlmResponse, ProviderError> {
        let body = llm_format::openai::request(request, stream);
        let endpoint = Endpoint {
            classifier: Classifier { provider: "openai", secret: self.api_key.as_deref() },
            format: LlmFormat::Openai,
            url: &self.url,
            headers: &self.headers,
        };
        http::call(&self.client, &endpoint, &body, stream, timeout, on_delta).await
    }
}

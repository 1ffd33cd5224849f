//! Anthropic Messages.
//!
//! POST `{base_url}/v1/messages` (a base URL already ending in `/v1` is taken as meaning the
//! same) with `x-api-key` (left out without a key, for proxies that add it) and
//! `anthropic-version: 2023-06-01`, the body of [`llm_format::anthropic::request`] (which
//! fails, terminally, on content Anthropic cannot carry); the answer is read by
//! [`llm_format::anthropic::response`] or, streamed, event by event through
//! [`llm_format::anthropic::StreamAccumulator`] until `message_stop`.
//!
//! [`llm_format::anthropic::request`]: turnstone_engine::llm_format::anthropic::request
//! [`llm_format::anthropic::response`]: turnstone_engine::llm_format::anthropic::response
//! [`llm_format::anthropic::StreamAccumulator`]: turnstone_engine::llm_format::anthropic::StreamAccumulator

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::HeaderMap;
use turnstone_engine::llm_format::{self, LlmFormat};
use turnstone_engine::protocol::{LlmRequest, LlmResponse, StreamDelta};

use super::error::{Classifier, ProviderError};
use super::http::{self, Endpoint};
use super::{ModelProvider, ProviderSetupError, endpoint_url, http_client, set_header, usable_key};

/// The `anthropic-version` header sent with every request.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A model served over the Anthropic Messages API.
#[derive(Clone)]
pub struct AnthropicProvider {
    client: reqwest::Client,
    url: reqwest::Url,
    api_key: Option<String>,
    headers: HeaderMap,
}

impl AnthropicProvider {
    /// Anthropic's own API.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";

    /// A provider at `base_url` (e.g. `https://api.anthropic.com`), sending `api_key` as
    /// `x-api-key` when there is one; uses the shared [`http_client`].
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self, ProviderSetupError> {
        let base = base_url.trim().trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        let url = endpoint_url(base, "/v1/messages")?;
        let api_key = usable_key(api_key);
        let mut headers = HeaderMap::new();
        set_header(&mut headers, "anthropic-version", ANTHROPIC_VERSION, false)?;
        if let Some(key) = &api_key {
            set_header(&mut headers, "x-api-key", key, true)?;
        }
        Ok(AnthropicProvider { client: http_client()?, url, api_key, headers })
    }

    /// The same provider on another HTTP client (which should keep `tcp_nodelay(true)`).
    pub fn with_client(mut self, client: reqwest::Client) -> Self {
        self.client = client;
        self
    }

    /// The same provider sending one more header on every request (e.g. `anthropic-beta`); the
    /// value is treated as secret.
    pub fn with_header(mut self, name: &str, value: &str) -> Result<Self, ProviderSetupError> {
        set_header(&mut self.headers, name, value, true)?;
        Ok(self)
    }

    /// The endpoint requests go to.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }
}

impl fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("url", &self.url.as_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
    async fn complete(
        &self,
        request: &LlmRequest,
        stream: bool,
        timeout: Option<Duration>,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<LlmResponse, ProviderError> {
        let classifier = Classifier { provider: "anthropic", secret: self.api_key.as_deref() };
        let body = llm_format::anthropic::request(request, stream)
            .map_err(|e| classifier.request(&e.to_string()))?;
        let endpoint =
            Endpoint { classifier, format: LlmFormat::Anthropic, url: &self.url, headers: &self.headers };
        http::call(&self.client, &endpoint, &body, stream, timeout, on_delta).await
    }
}

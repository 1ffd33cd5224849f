//! A model behind an HTTP API: the client, endpoint, key and headers every HTTP provider has,
//! generic over its wire format ([`Wire`]); [`super::OpenAiProvider`] and
//! [`super::AnthropicProvider`] are this type for their formats.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::HeaderMap;
use turnstone_engine::llm_format::{self, LlmFormat};
use turnstone_engine::protocol::{LlmRequest, LlmResponse, StreamDelta};

use super::error::{Classifier, ProviderError};
use super::http::{self, Endpoint};
use super::{ModelProvider, ProviderSetupError, http_client, set_header};

/// A provider wire format.
pub trait Wire: Send + Sync + 'static {
    /// The provider's name in errors (`openai`, `anthropic`).
    const PROVIDER: &'static str;
    /// The type's name in `Debug` output.
    const TYPE_NAME: &'static str;
    /// The body format.
    const FORMAT: LlmFormat;

    /// Headers a request needs for what its body asks (Anthropic's betas).
    fn request_headers(_body: &serde_json::Value) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }
}

/// A model served over an HTTP API in wire format `W`.
pub struct HttpProvider<W> {
    client: reqwest::Client,
    url: reqwest::Url,
    api_key: Option<String>,
    headers: HeaderMap,
    wire: PhantomData<W>,
}

impl<W> Clone for HttpProvider<W> {
    fn clone(&self) -> Self {
        HttpProvider {
            client: self.client.clone(),
            url: self.url.clone(),
            api_key: self.api_key.clone(),
            headers: self.headers.clone(),
            wire: PhantomData,
        }
    }
}

impl<W: Wire> HttpProvider<W> {
    /// A provider at `url` with `api_key` (kept to redact it from errors) and `headers`
    /// (authentication included); uses the shared [`http_client`].
    pub(super) fn from_parts(
        url: reqwest::Url,
        api_key: Option<String>,
        headers: HeaderMap,
    ) -> Result<Self, ProviderSetupError> {
        Ok(HttpProvider { client: http_client()?, url, api_key, headers, wire: PhantomData })
    }

    /// The same provider on another HTTP client (which should keep `tcp_nodelay(true)`).
    pub fn with_client(mut self, client: reqwest::Client) -> Self {
        self.client = client;
        self
    }

    /// The same provider sending one more header on every request (e.g. `OpenAI-Organization`,
    /// `api-key` for Azure, `anthropic-beta`); the value is treated as secret.
    pub fn with_header(mut self, name: &str, value: &str) -> Result<Self, ProviderSetupError> {
        set_header(&mut self.headers, name, value, true)?;
        Ok(self)
    }

    /// The endpoint requests go to.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }
}

impl<W: Wire> fmt::Debug for HttpProvider<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(W::TYPE_NAME)
            .field("url", &self.url.as_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[async_trait]
impl<W: Wire> ModelProvider for HttpProvider<W> {
    async fn complete(
        &self,
        request: &LlmRequest,
        stream: bool,
        timeout: Option<Duration>,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<LlmResponse, ProviderError> {
        let classifier = Classifier { provider: W::PROVIDER, secret: self.api_key.as_deref() };
        // A request the format cannot carry fails, terminally, before anything is sent.
        let body = llm_format::request(W::FORMAT, request, stream)
            .map_err(|e| classifier.request(&e.to_string()))?;
        let extra = W::request_headers(&body);
        let mut headers = std::borrow::Cow::Borrowed(&self.headers);
        for (name, value) in extra {
            set_header(headers.to_mut(), name, value, false)
                .map_err(|e| classifier.request(&e.to_string()))?;
        }
        let endpoint = Endpoint { classifier, format: W::FORMAT, url: &self.url, headers: &headers };
        http::call(&self.client, &endpoint, &body, stream, timeout, on_delta).await
    }

    fn name(&self) -> &'static str {
        W::PROVIDER
    }
}

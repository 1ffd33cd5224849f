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
    /// Body fields left out for this server: the format's extensions a compatible server may
    /// refuse as unknown (OpenAI's `prompt_cache_key`, to servers other than OpenAI's own).
    left_out: &'static [&'static str],
    wire: PhantomData<W>,
}

impl<W> Clone for HttpProvider<W> {
    fn clone(&self) -> Self {
        HttpProvider {
            client: self.client.clone(),
            url: self.url.clone(),
            api_key: self.api_key.clone(),
            headers: self.headers.clone(),
            left_out: self.left_out,
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
        Ok(HttpProvider { client: http_client()?, url, api_key, headers, left_out: &[], wire: PhantomData })
    }

    /// A provider at `base_url` plus `path`, sending `api_key` (when there is a usable one)
    /// as a bearer token, as OpenAI's APIs take it.
    pub(super) fn bearer(
        base_url: &str,
        path: &str,
        api_key: Option<String>,
    ) -> Result<Self, ProviderSetupError> {
        let url = super::endpoint_url(base_url, path)?;
        let api_key = super::usable_key(api_key);
        let mut headers = HeaderMap::new();
        if let Some(key) = &api_key {
            set_header(
                &mut headers,
                reqwest::header::AUTHORIZATION.as_str(),
                &format!("Bearer {key}"),
                true,
            )?;
        }
        Self::from_parts(url, api_key, headers)
    }

    /// The same provider leaving `fields` out of every request body.
    pub(super) fn leaving_out(mut self, fields: &'static [&'static str]) -> Self {
        self.left_out = fields;
        self
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

    /// The endpoint's host.
    pub(super) fn host(&self) -> Option<&str> {
        self.url.host_str()
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
        let mut body = llm_format::request(W::FORMAT, request, stream)
            .map_err(|e| classifier.request(&e.to_string()))?;
        if let Some(fields) = body.as_object_mut() {
            for field in self.left_out {
                fields.remove(*field);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::super::OpenAiProvider;

    /// `prompt_cache_key` goes to OpenAI's own API only: a compatible server may refuse a
    /// field it does not know.
    #[test]
    fn only_openais_own_api_is_sent_the_cache_key() {
        let official = OpenAiProvider::new("https://api.openai.com/v1", None).unwrap();
        assert!(official.left_out.is_empty());
        let local = OpenAiProvider::new("http://localhost:11434/v1", None).unwrap();
        assert_eq!(local.left_out, ["prompt_cache_key"]);
    }
}

//! Anthropic Messages.
//!
//! POST `{base_url}/v1/messages` (a base URL already ending in `/v1` is taken as meaning the
//! same) with `x-api-key` (left out without a key, for proxies that add it) and
//! `anthropic-version: 2023-06-01` (and `anthropic-beta` where the body needs one,
//! [`llm_format::anthropic::beta_header`]), the body of [`llm_format::anthropic::request`] (which
//! fails, terminally, on content Anthropic cannot carry); the answer is read by
//! [`llm_format::anthropic::response`] or, streamed, event by event through
//! [`llm_format::anthropic::StreamAccumulator`] until `message_stop`.
//!
//! [`llm_format::anthropic::request`]: turnstone_engine::llm_format::anthropic::request
//! [`llm_format::anthropic::beta_header`]: turnstone_engine::llm_format::anthropic::beta_header
//! [`llm_format::anthropic::response`]: turnstone_engine::llm_format::anthropic::response
//! [`llm_format::anthropic::StreamAccumulator`]: turnstone_engine::llm_format::anthropic::StreamAccumulator

use reqwest::header::HeaderMap;
use turnstone_engine::llm_format::{LlmFormat, anthropic};

use super::provider::{HttpProvider, Wire};
use super::{ProviderSetupError, endpoint_url, set_header, usable_key};

/// The `anthropic-version` header sent with every request.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The Anthropic Messages wire format.
#[derive(Debug, Clone, Copy)]
pub struct Anthropic;

impl Wire for Anthropic {
    const PROVIDER: &'static str = "anthropic";
    const TYPE_NAME: &'static str = "AnthropicProvider";
    const FORMAT: LlmFormat = LlmFormat::Anthropic;

    fn request_headers(body: &serde_json::Value) -> Vec<(&'static str, &'static str)> {
        anthropic::beta_header(body).map(|beta| ("anthropic-beta", beta)).into_iter().collect()
    }
}

/// A model served over the Anthropic Messages API.
pub type AnthropicProvider = HttpProvider<Anthropic>;

impl HttpProvider<Anthropic> {
    /// Anthropic's own API.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";

    /// A provider at `base_url` (e.g. `https://api.anthropic.com`), sending `api_key` as
    /// `x-api-key` when there is one; uses the shared [`super::http_client`].
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
        Self::from_parts(url, api_key, headers)
    }
}

//! Model providers: the LLM calls the engine runs itself (`handler: server`, DESIGN.md section 7).
//!
//! A [`ModelProvider`] takes the protocol's neutral [`LlmRequest`] and returns its neutral
//! [`LlmResponse`], passing streamed [`StreamDelta`]s to a callback as they arrive. One
//! [`complete`](ModelProvider::complete) call is one attempt: the attempt counter, backoff and
//! deadlines belong to the caller, which learns from [`ProviderError::is_retryable`] whether
//! to try again (the classes are listed in [`error`]).
//!
//! - [`OpenAiProvider`]: OpenAI Chat Completions and compatible servers.
//! - [`OpenAiResponsesProvider`]: OpenAI's Responses API (reasoning kept between steps).
//! - [`AnthropicProvider`]: Anthropic Messages.
//! - [`ScriptedProvider`]: a deterministic built-in model for demos and tests, no network.
//!
//! [`provider_for`] builds one from a config `[llm.<id>]` block's `type`, `base_url` and key.
//! The HTTP providers share one `reqwest` client ([`http_client`]) with the settings of
//! [`crate::net::client_builder`] (no overall timeout: the caller's per-attempt timeout bounds
//! each call, stream included). Wire formats come from [`turnstone_engine::llm_format`]; event
//! streams are parsed with [`crate::net::SseStream`].

pub mod anthropic;
pub mod context;
pub mod error;
mod http;
pub mod openai;
pub mod openai_responses;
pub mod pricing;
pub mod provider;
pub mod scripted;

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use turnstone_engine::protocol::{LlmRequest, LlmResponse, StreamDelta};

pub use anthropic::AnthropicProvider;
pub use context::{ContextSettings, ModelWindow, model_window};
pub use error::{ContextOverflow, ProviderError};
pub use openai::OpenAiProvider;
pub use openai_responses::OpenAiResponsesProvider;
pub use provider::HttpProvider;
pub use scripted::ScriptedProvider;

/// A model the engine can call.
#[async_trait]
pub trait ModelProvider: Send + Sync {
    /// Runs one attempt of `request`; with `stream` the answer is streamed and each delta passed
    /// to `on_delta` as it arrives. `timeout` bounds the whole attempt, stream included.
    async fn complete(
        &self,
        request: &LlmRequest,
        stream: bool,
        timeout: Option<Duration>,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<LlmResponse, ProviderError>;

    /// The provider's name in traces (`openai`, `openai-responses`, `anthropic`, `scripted`).
    fn name(&self) -> &'static str {
        "unknown"
    }
}

/// The kinds of provider, by their config `type` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// `openai`: OpenAI Chat Completions or a compatible server.
    Openai,
    /// `openai-responses`: OpenAI's Responses API.
    OpenaiResponses,
    /// `anthropic`: Anthropic Messages.
    Anthropic,
    /// `scripted`: the deterministic built-in model.
    Scripted,
}

impl ProviderKind {
    /// The config `type` name.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::OpenaiResponses => "openai-responses",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Scripted => "scripted",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProviderKind {
    type Err = ProviderSetupError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "openai" => Ok(ProviderKind::Openai),
            "openai-responses" => Ok(ProviderKind::OpenaiResponses),
            "anthropic" => Ok(ProviderKind::Anthropic),
            "scripted" => Ok(ProviderKind::Scripted),
            other => Err(ProviderSetupError::UnknownKind(crate::net::short_text(other, 60))),
        }
    }
}

/// Why a provider cannot be set up (a configuration problem, found at start).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderSetupError {
    /// The `type` names no provider.
    #[error(
        "unknown model provider type {0:?} (expected openai, openai-responses, anthropic or scripted; \
         worker-run calls need no provider)"
    )]
    UnknownKind(String),
    /// The base URL is not an http(s) URL.
    #[error("invalid model provider base URL: {0}")]
    InvalidUrl(String),
    /// A header name or value (the API key included) cannot be sent; the value is not shown.
    #[error("invalid model provider header {0}")]
    InvalidHeader(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client for model providers: {0}")]
    HttpClient(String),
}

/// The provider of `kind` at `base_url` (`None`: the provider's public API) with `api_key`
/// (`None` or empty: none sent); the scripted model ignores both.
pub fn provider_for(
    kind: ProviderKind,
    base_url: Option<&str>,
    api_key: Option<String>,
) -> Result<Arc<dyn ModelProvider>, ProviderSetupError> {
    Ok(match kind {
        ProviderKind::Openai => {
            Arc::new(OpenAiProvider::new(base_url.unwrap_or(OpenAiProvider::DEFAULT_BASE_URL), api_key)?)
        }
        ProviderKind::OpenaiResponses => Arc::new(OpenAiResponsesProvider::new(
            base_url.unwrap_or(OpenAiResponsesProvider::DEFAULT_BASE_URL),
            api_key,
        )?),
        ProviderKind::Anthropic => Arc::new(AnthropicProvider::new(
            base_url.unwrap_or(AnthropicProvider::DEFAULT_BASE_URL),
            api_key,
        )?),
        ProviderKind::Scripted => Arc::new(ScriptedProvider::new()),
    })
}

/// The process-wide HTTP client of the model providers, built on first use.
///
/// Connections are pooled per host and belong to the Tokio runtime that opened them; a host
/// running several runtimes should give each provider its own client (`with_client`).
pub fn http_client() -> Result<reqwest::Client, ProviderSetupError> {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    if let Some(client) = CLIENT.get() {
        return Ok(client.clone());
    }
    let client = crate::net::client().map_err(|e| ProviderSetupError::HttpClient(e.to_string()))?;
    Ok(CLIENT.get_or_init(|| client).clone())
}

/// `base` (an http(s) URL, trailing slashes ignored) with `path` appended.
fn endpoint_url(base: &str, path: &str) -> Result<reqwest::Url, ProviderSetupError> {
    let joined = format!("{}{path}", base.trim().trim_end_matches('/'));
    let url = reqwest::Url::parse(&joined).map_err(|e| ProviderSetupError::InvalidUrl(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ProviderSetupError::InvalidUrl(format!(
            "scheme {:?} is not http or https",
            url.scheme()
        )));
    }
    Ok(url)
}

/// Sets header `name` to the secret or plain `value` in `headers`.
fn set_header(
    headers: &mut HeaderMap,
    name: &str,
    value: &str,
    sensitive: bool,
) -> Result<(), ProviderSetupError> {
    let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        ProviderSetupError::InvalidHeader(format!("name {:?}", crate::net::short_text(name, 60)))
    })?;
    let mut value = HeaderValue::from_str(value).map_err(|_| {
        ProviderSetupError::InvalidHeader(format!("{header}: the value is not a valid header value"))
    })?;
    value.set_sensitive(sensitive);
    headers.insert(header, value);
    Ok(())
}

/// An API key worth sending: present and not empty.
fn usable_key(api_key: Option<String>) -> Option<String> {
    api_key.filter(|key| !key.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_by_config_name() {
        for kind in [
            ProviderKind::Openai,
            ProviderKind::OpenaiResponses,
            ProviderKind::Anthropic,
            ProviderKind::Scripted,
        ] {
            assert_eq!(kind.name().parse::<ProviderKind>(), Ok(kind));
        }
        assert!(matches!("worker".parse::<ProviderKind>(), Err(ProviderSetupError::UnknownKind(_))));
    }

    #[test]
    fn urls_are_checked() {
        assert_eq!(
            endpoint_url("http://h:1/v1/", "/chat/completions").map(|u| u.to_string()),
            Ok("http://h:1/v1/chat/completions".to_owned())
        );
        assert!(endpoint_url("ftp://h", "/x").is_err());
        assert!(endpoint_url("not a url", "/x").is_err());
    }

    #[test]
    fn header_errors_hide_values() {
        let mut headers = HeaderMap::new();
        let err = set_header(&mut headers, "x-api-key", "bad\nsecret", true).unwrap_err();
        assert!(!err.to_string().contains("secret"));
        assert!(set_header(&mut headers, "bad name", "v", false).is_err());
    }
}

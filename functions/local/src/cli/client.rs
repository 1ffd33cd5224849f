//! A client of the server's HTTP API (`/v1`).
//!
//! Answers are read leniently as `serde_json::Value`, so the CLI keeps working when the server
//! adds fields; inputs are built with the engine's `ClientInput`. An error answer
//! (`{"error": {"code", "message", "param"?}}`) becomes an [`ApiError`].

use std::fmt;
use std::time::Duration;

use anyhow::Context as _;
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use serde_json::Value;
use turnstone_engine::protocol::ClientInput;

use super::Global;
use super::sse::SseStream;

/// An error answer from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// The error's code, e.g. `turn_already_active`.
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// The offending parameter, if any.
    pub param: Option<String>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(param) = &self.param {
            write!(f, " (at `{param}`)")?;
        }
        write!(f, " [HTTP {}]", self.status)
    }
}

impl std::error::Error for ApiError {}

/// The answer to a submitted input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The session.
    pub session_id: String,
    /// The turn the input started or joined, if any.
    pub turn_id: Option<String>,
    /// Whether the turn waits behind the active one.
    pub queued: bool,
}

/// A connection to one server.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    api_key: Option<String>,
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:8787`).
    pub fn new(base: &str, api_key: Option<String>) -> anyhow::Result<Self> {
        let base = Url::parse(base).with_context(|| format!("bad server URL `{base}`"))?;
        if base.cannot_be_a_base() {
            anyhow::bail!("bad server URL `{base}`: not an http(s) URL");
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("turnstone-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Client { http, base, api_key })
    }

    /// The client the global options describe.
    pub fn from_global(global: &Global) -> anyhow::Result<Self> {
        Client::new(&global.url, global.api_key.clone())
    }

    /// The URL of `/v1/<segments...>`, each segment percent-encoded.
    fn url(&self, segments: &[&str]) -> anyhow::Result<Url> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("bad server URL `{}`", self.base))?
            .pop_if_empty()
            .push("v1")
            .extend(segments);
        Ok(url)
    }

    fn request(&self, method: Method, segments: &[&str]) -> anyhow::Result<RequestBuilder> {
        let request = self.http.request(method, self.url(segments)?);
        Ok(match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        })
    }

    /// Sends `request`; a non-success status becomes an [`ApiError`].
    async fn send(request: RequestBuilder) -> anyhow::Result<Response> {
        let response = request.send().await.context("cannot reach the server")?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.text().await.unwrap_or_default();
        Err(api_error(status, &body).into())
    }

    async fn json(request: RequestBuilder) -> anyhow::Result<Value> {
        let response = Self::send(request).await?;
        response.json().await.context("the server's answer is not JSON")
    }

    /// The session's summary; `None` when there is no such session.
    pub async fn summary(&self, session: &str) -> anyhow::Result<Option<Value>> {
        match Self::json(self.request(Method::GET, &["sessions", session])?).await {
            Ok(summary) => Ok(Some(summary)),
            Err(e) if e.downcast_ref::<ApiError>().is_some_and(|e| e.status == 404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The sequence number of the session's last event; 0 for a session that does not exist yet.
    pub async fn last_seq(&self, session: &str) -> anyhow::Result<u64> {
        Ok(self.summary(session).await?.and_then(|s| s.get("last_seq").and_then(Value::as_u64)).unwrap_or(0))
    }

    /// Submits an input; with `queue`, a turn-starting input waits behind an active turn.
    pub async fn post_input(
        &self,
        session: &str,
        input: &ClientInput,
        queue: bool,
    ) -> anyhow::Result<Accepted> {
        let mut request = self.request(Method::POST, &["sessions", session, "inputs"])?.json(input);
        if queue {
            request = request.query(&[("queue", "true")]);
        }
        let answer = Self::json(request).await?;
        Ok(Accepted {
            session_id: str_field(&answer, "session_id").unwrap_or(session).to_owned(),
            turn_id: str_field(&answer, "turn_id").map(str::to_owned),
            queued: answer.get("queued").and_then(Value::as_bool).unwrap_or(false),
        })
    }

    /// Up to `limit` durable events after `after`, as `(seq, event)`.
    pub async fn events(&self, session: &str, after: u64, limit: u32) -> anyhow::Result<Vec<(u64, Value)>> {
        let request = self
            .request(Method::GET, &["sessions", session, "events"])?
            .query(&[("after", after.to_string()), ("limit", limit.to_string())]);
        let answer = Self::json(request).await?;
        let events = answer.get("events").and_then(Value::as_array).cloned().unwrap_or_default();
        events
            .into_iter()
            .map(|mut entry| {
                let seq = entry.get("seq").and_then(Value::as_u64).context("an event without a seq")?;
                Ok((seq, entry.get_mut("event").map(Value::take).unwrap_or(Value::Null)))
            })
            .collect()
    }

    /// One page of sessions: the entries and the cursor of the next page.
    pub async fn sessions(
        &self,
        agent: Option<&str>,
        limit: usize,
        cursor: Option<&str>,
    ) -> anyhow::Result<(Vec<Value>, Option<String>)> {
        let mut query = vec![("limit", limit.to_string())];
        query.extend(agent.map(|a| ("agent", a.to_owned())));
        query.extend(cursor.map(|c| ("cursor", c.to_owned())));
        let answer = Self::json(self.request(Method::GET, &["sessions"])?.query(&query)).await?;
        let sessions = answer.get("sessions").and_then(Value::as_array).cloned().unwrap_or_default();
        Ok((sessions, str_field(&answer, "next_cursor").map(str::to_owned)))
    }

    /// The session's event stream from after `after`. `resume` also sends `Last-Event-ID`, as a
    /// reconnecting client does.
    pub async fn stream(&self, session: &str, after: u64, resume: bool) -> anyhow::Result<SseStream> {
        let mut request = self
            .request(Method::GET, &["sessions", session, "events", "stream"])?
            .query(&[("after", after.to_string())])
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if resume {
            request = request.header("Last-Event-ID", after.to_string());
        }
        Ok(SseStream::new(Self::send(request).await?))
    }
}

/// A string field of a JSON object.
pub fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// The error a non-success answer stands for, from its error envelope when it has one.
fn api_error(status: StatusCode, body: &str) -> ApiError {
    let envelope: Option<Value> = serde_json::from_str(body).ok();
    let error = envelope.as_ref().and_then(|e| e.get("error"));
    let field = |key| error.and_then(|e| str_field(e, key)).map(str::to_owned);
    let fallback = || {
        let text = body.trim();
        if text.is_empty() {
            status.canonical_reason().unwrap_or("error").to_owned()
        } else {
            text.to_owned()
        }
    };
    ApiError {
        status: status.as_u16(),
        code: field("code").unwrap_or_else(|| "http_error".to_owned()),
        message: field("message").unwrap_or_else(fallback),
        param: field("param"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstone_engine::protocol::{ClientMessageInput, DraftMessage};

    #[test]
    fn error_envelopes_become_api_errors() {
        let e = api_error(
            StatusCode::CONFLICT,
            r#"{"error":{"code":"turn_already_active","message":"a turn is running","param":"turn_id"}}"#,
        );
        assert_eq!(e.to_string(), "turn_already_active: a turn is running (at `turn_id`) [HTTP 409]");
        let e = api_error(StatusCode::BAD_GATEWAY, "upstream down");
        assert_eq!(e.to_string(), "http_error: upstream down [HTTP 502]");
        let e = api_error(StatusCode::NOT_FOUND, "");
        assert_eq!((e.status, e.message.as_str()), (404, "Not Found"));
    }

    #[test]
    fn urls_encode_session_ids_and_keep_a_base_path() {
        let client = Client::new("http://h:1/prefix/", None).unwrap();
        let url = client.url(&["sessions", "a b/c", "inputs"]).unwrap();
        assert_eq!(url.as_str(), "http://h:1/prefix/v1/sessions/a%20b%2Fc/inputs");
        assert!(Client::new("not a url", None).is_err());
    }

    #[test]
    fn a_client_message_serializes_as_the_protocol_says() {
        let input = ClientInput::Message(ClientMessageInput {
            agent_id: "demo".into(),
            turn_id: None,
            message: DraftMessage::user("hi"),
            stream: None,
        });
        assert_eq!(
            serde_json::to_value(&input).unwrap(),
            serde_json::json!({"type":"client.message","agent_id":"demo","message":{"role":"user","content":"hi"}})
        );
    }
}

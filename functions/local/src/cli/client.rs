//! A client of the server's HTTP API (`/v1`), reading the answers as the shared
//! [`turnstone_runtime::api`] types (unknown fields are ignored, so a newer server is fine).
//! Events are read as JSON values, to render kinds this CLI does not know yet. An error answer
//! becomes an [`ApiError`].

use anyhow::Context as _;
use reqwest::{Method, RequestBuilder, Response, Url};
use serde::de::DeserializeOwned;
use serde_json::Value;
use turnstone_engine::protocol::ClientInput;
use turnstone_runtime::api::{
    EventPage, LoggedEvent, SessionListing, SessionPage, SessionSummary, Submitted, Turn,
};
use turnstone_runtime::net::{self, SseStream};

pub use turnstone_runtime::api::ApiError;

use super::Global;

/// The largest event the CLI reads off the event stream.
const MAX_EVENT_BYTES: usize = 32 << 20;

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
        let http = net::client_builder()
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
        let body = response.bytes().await.unwrap_or_default();
        Err(ApiError::from_answer(status, &body).into())
    }

    async fn json<T: DeserializeOwned>(request: RequestBuilder) -> anyhow::Result<T> {
        let response = Self::send(request).await?;
        let body = response.bytes().await.context("cannot read the server's answer")?;
        serde_json::from_slice(&body).context("the server's answer is not what the API says")
    }

    /// The session's summary; `None` when there is no such session.
    pub async fn summary(&self, session: &str) -> anyhow::Result<Option<SessionSummary>> {
        match Self::json(self.request(Method::GET, &["sessions", session])?).await {
            Ok(summary) => Ok(Some(summary)),
            Err(e) if e.downcast_ref::<ApiError>().is_some_and(|e| e.status == 404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The sequence number of the session's last event; 0 for a session that does not exist yet.
    pub async fn last_seq(&self, session: &str) -> anyhow::Result<u64> {
        Ok(self.summary(session).await?.map_or(0, |s| s.last_seq))
    }

    /// Submits an input; with `queue`, a turn-starting input waits behind an active turn.
    pub async fn post_input(
        &self,
        session: &str,
        input: &ClientInput,
        queue: bool,
    ) -> anyhow::Result<Submitted> {
        let mut request = self.request(Method::POST, &["sessions", session, "inputs"])?.json(input);
        if queue {
            request = request.query(&[("queue", "true")]);
        }
        Self::json(request).await
    }

    /// Up to `limit` durable events after `after`.
    pub async fn events(
        &self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> anyhow::Result<Vec<LoggedEvent<Value>>> {
        let request = self
            .request(Method::GET, &["sessions", session, "events"])?
            .query(&[("after", after.to_string()), ("limit", limit.to_string())]);
        let page: EventPage<Value> = Self::json(request).await?;
        Ok(page.events)
    }

    /// One page of sessions: the entries and the cursor of the next page.
    pub async fn sessions(
        &self,
        agent: Option<&str>,
        limit: usize,
        cursor: Option<&str>,
    ) -> anyhow::Result<(Vec<SessionListing>, Option<String>)> {
        let mut query = vec![("limit", limit.to_string())];
        query.extend(agent.map(|a| ("agent", a.to_owned())));
        query.extend(cursor.map(|c| ("cursor", c.to_owned())));
        let page: SessionPage = Self::json(self.request(Method::GET, &["sessions"])?.query(&query)).await?;
        Ok((page.sessions, page.next_cursor))
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
        Ok(SseStream::new(Self::send(request).await?, MAX_EVENT_BYTES))
    }
}

impl Client {
    /// `GET /healthz`.
    pub async fn healthz(&self) -> anyhow::Result<()> {
        let mut url = self.base.clone();
        url.set_path("/healthz");
        Self::send(self.http.get(url)).await.map(drop)
    }

    /// `POST /v1/sessions`: a new session of `agent`, its id minted by the server.
    pub async fn create_session(&self, agent: &str) -> anyhow::Result<String> {
        let request =
            self.request(Method::POST, &["sessions"])?.json(&serde_json::json!({ "agent_id": agent }));
        let created: Value = Self::json(request).await?;
        str_field(&created, "session_id")
            .map(str::to_owned)
            .context("the server's answer to POST /v1/sessions has no session_id")
    }

    /// A turn's record, long-polling up to `wait_secs` for it to end.
    pub async fn turn(&self, session: &str, turn_id: &str, wait_secs: u32) -> anyhow::Result<Turn> {
        let request = self
            .request(Method::GET, &["sessions", session, "turns", turn_id])?
            .query(&[("wait", wait_secs.to_string())]);
        Self::json(request).await
    }

    /// `DELETE /v1/sessions/{id}`: disposes the session (and its sub-agents).
    pub async fn dispose(&self, session: &str) -> anyhow::Result<()> {
        Self::send(self.request(Method::DELETE, &["sessions", session])?).await.map(drop)
    }
}

/// A string field of a JSON object.
pub fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstone_engine::protocol::{ClientMessageInput, DraftMessage};

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
            client: None,
        });
        assert_eq!(
            serde_json::to_value(&input).unwrap(),
            serde_json::json!({"type":"client.message","agent_id":"demo","message":{"role":"user","content":"hi"}})
        );
    }
}

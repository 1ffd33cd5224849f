//! Streamable HTTP on the workspace's reqwest 0.12: rmcp's `StreamableHttpClient` for a small
//! newtype, instead of rmcp's own implementation, which needs reqwest 0.13.
//!
//! rmcp's transport worker does the protocol (sessions, the GET stream, re-initializing after a
//! 404); this file only sends the HTTP requests it asks for. It is also where a failure first
//! shows whether the request reached the server: [`HttpError`] keeps that apart, and
//! `error.rs` reads it.

use std::{collections::HashMap, sync::Arc};

use futures_util::{StreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue, StatusCode, header};
use rmcp::{
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::{
        common::http_header::{
            EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_SESSION_ID, JSON_MIME_TYPE,
        },
        streamable_http_client::{
            SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        },
    },
};
use sse_stream::{Sse, SseStream};

/// How much of an error response's body is kept for the message.
const ERROR_BODY_LIMIT: usize = 4096;

/// A failed HTTP exchange, told apart by whether the server may have received the request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// No connection was made (refused, DNS, TLS handshake): nothing was sent.
    #[error("{0}")]
    Connect(reqwest::Error),
    /// The exchange failed after the connection was made: the request may have been read.
    #[error("{0}")]
    Exchange(reqwest::Error),
    /// The server answered with this status (and, for a message, the start of the body).
    #[error("answered {status}")]
    Status { status: StatusCode, body: String },
}

impl From<reqwest::Error> for HttpError {
    fn from(error: reqwest::Error) -> Self {
        // reqwest flags every failure to establish the connection (refused, unreachable, DNS,
        // TLS handshake) as a connect error; anything later is the exchange's.
        if error.is_connect() { HttpError::Connect(error) } else { HttpError::Exchange(error) }
    }
}

type Error = StreamableHttpError<HttpError>;

fn failed(error: reqwest::Error) -> Error {
    StreamableHttpError::Client(error.into())
}

/// The HTTP client of one MCP server's connection.
#[derive(Clone)]
pub(crate) struct HttpClient(reqwest::Client);

impl HttpClient {
    pub(crate) fn new() -> Result<Self, reqwest::Error> {
        reqwest::Client::builder()
            // A pooled connection may belong to a server that has since restarted: a request
            // sent on it then fails after "sending", which would read as maybe-delivered. A
            // fresh connection per request fails as a connect error instead, and the loopback
            // or keep-alive cost is small next to a tool call.
            .pool_max_idle_per_host(0)
            // A redirect of a POST may turn it into a GET without its message; refuse them.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map(HttpClient)
    }

    fn request(
        &self,
        method: reqwest::Method,
        uri: &str,
        session_id: Option<&str>,
        auth_token: Option<String>,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .0
            .request(method, uri)
            .header(header::ACCEPT, format!("{EVENT_STREAM_MIME_TYPE}, {JSON_MIME_TYPE}"))
            .headers(headers.into_iter().collect());
        if let Some(session_id) = session_id {
            request = request.header(HEADER_SESSION_ID, session_id);
        }
        if let Some(token) = auth_token {
            request = request.bearer_auth(token);
        }
        request
    }
}

/// The start of an error response's body, for the message.
async fn error_body(response: reqwest::Response) -> String {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(Ok(chunk)) = chunks.next().await {
        body.extend_from_slice(&chunk);
        if body.len() >= ERROR_BODY_LIMIT {
            body.truncate(ERROR_BODY_LIMIT);
            break;
        }
    }
    String::from_utf8_lossy(&body).trim().to_owned()
}

fn content_type(response: &reqwest::Response) -> Option<String> {
    response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn is(content_type: Option<&str>, mime: &str) -> bool {
    content_type.is_some_and(|ct| ct.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case(mime)))
}

fn sse(response: reqwest::Response) -> BoxStream<'static, Result<Sse, SseError>> {
    SseStream::from_bytes_stream(response.bytes_stream()).boxed()
}

impl StreamableHttpClient for HttpClient {
    type Error = HttpError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let response = self
            .request(reqwest::Method::POST, &uri, session_id.as_deref(), auth_token, headers)
            .json(&message)
            .send()
            .await
            .map_err(failed)?;
        let status = response.status();
        // A notification or response is answered 202 Accepted with no body.
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        // Spec "Transports", Streamable HTTP, session management: a 404 to a request carrying
        // Mcp-Session-Id means the session is gone and the request was not processed; rmcp's
        // worker then initializes a new session and sends the request again, once.
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::SessionExpired);
        }
        let session =
            response.headers().get(HEADER_SESSION_ID).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let content_type = content_type(&response);
        let awaits_nothing = !matches!(message, ClientJsonRpcMessage::Request(_));
        if !status.is_success() {
            let body = error_body(response).await;
            // A JSON-RPC error in an error status is still the server's answer to the request.
            if is(content_type.as_deref(), JSON_MIME_TYPE)
                && let Ok(error @ ServerJsonRpcMessage::Error(_)) = serde_json::from_str(&body)
            {
                return Ok(StreamableHttpPostResponse::Json(error, session));
            }
            return Err(StreamableHttpError::Client(HttpError::Status { status, body }));
        }
        if is(content_type.as_deref(), EVENT_STREAM_MIME_TYPE) {
            return Ok(StreamableHttpPostResponse::Sse(sse(response), session));
        }
        if is(content_type.as_deref(), JSON_MIME_TYPE) {
            let body = response.bytes().await.map_err(failed)?;
            return match serde_json::from_slice(&body) {
                Ok(message) => Ok(StreamableHttpPostResponse::Json(message, session)),
                // Nothing was awaited: whatever the body is, the message was taken.
                Err(_) if awaits_nothing => Ok(StreamableHttpPostResponse::Accepted),
                Err(error) => Err(StreamableHttpError::Deserialize(error)),
            };
        }
        if awaits_nothing {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        Err(StreamableHttpError::UnexpectedContentType(content_type))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_token: Option<String>,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        let response = self
            .request(reqwest::Method::DELETE, &uri, Some(&session_id), auth_token, headers)
            .send()
            .await
            .map_err(failed)?;
        let status = response.status();
        // 405: the server does not let clients end sessions (spec "Transports"); nothing to do.
        if status.is_success() || status == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        let body = error_body(response).await;
        Err(StreamableHttpError::Client(HttpError::Status { status, body }))
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_token: Option<String>,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Error> {
        let mut request =
            self.request(reqwest::Method::GET, &uri, session_id.as_deref(), auth_token, headers);
        if let Some(id) = last_event_id {
            request = request.header(HEADER_LAST_EVENT_ID, id);
        }
        let response = request.send().await.map_err(failed)?;
        let status = response.status();
        // 405: the server offers no stream for messages outside requests (spec "Transports").
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if !status.is_success() {
            let body = error_body(response).await;
            return Err(StreamableHttpError::Client(HttpError::Status { status, body }));
        }
        let content_type = content_type(&response);
        if !is(content_type.as_deref(), EVENT_STREAM_MIME_TYPE) {
            return Err(StreamableHttpError::UnexpectedContentType(content_type));
        }
        Ok(sse(response))
    }
}

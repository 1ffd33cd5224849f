//! Why a request to a server failed, and whether it may have reached the tool.
//!
//! The engine must never run a tool twice without knowing it: a failed tools/call that provably
//! never reached the server may be sent again, one that may have reached it may not (silently),
//! and one the server answered is an outcome. [`Delivery`] says which; each mapping below from
//! rmcp's errors states the rule it rests on.

use std::{error::Error as StdError, time::Duration};

use rmcp::{
    ServiceError,
    model::{ErrorCode, ErrorData},
    service::ClientInitializeError,
    transport::{DynamicTransportError, streamable_http_client::StreamableHttpError},
};

use crate::http::HttpError;

/// Whether a failed request may have reached the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The request provably never reached the tool: sending it again cannot run it twice.
    NotSent,
    /// The request may have reached the tool and the outcome is unknown.
    MaybeSent,
    /// The server answered with a JSON-RPC error: a definite outcome, and not a run to success.
    Answered,
}

/// A failed request to an MCP server. Its message names the server and the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    #[error("MCP server \"{server}\" is not configured")]
    NotConfigured { server: String },
    /// No connection: refused, DNS, TLS, or the command could not be started.
    #[error("MCP server \"{server}\": {reason} ({target})")]
    Connect { server: String, target: String, reason: String },
    /// An HTTP status that is not the protocol's (401, 403, 5xx, …).
    #[error("MCP server \"{server}\" answered {}{}", status_text(*status), detail(body))]
    Status { server: String, status: u16, body: String, delivery: Delivery },
    #[error("MCP server \"{server}\" sent a malformed message: {reason}")]
    Malformed { server: String, reason: String, delivery: Delivery },
    /// The session could not be set up (initialize failed), or expired and could not be renewed.
    #[error("MCP server \"{server}\" refused the session: {reason}")]
    Session { server: String, reason: String },
    #[error("MCP server \"{server}\": {method} timed out after {}", seconds(*after))]
    Timeout { server: String, method: &'static str, after: Duration, delivery: Delivery },
    /// The connection broke (dropped, child process died) with no answer.
    #[error("MCP server \"{server}\": connection lost during {method}: {reason}")]
    Disconnected { server: String, method: &'static str, reason: String, delivery: Delivery },
    #[error("MCP server \"{server}\" has no tool \"{tool}\"")]
    NoTool { server: String, tool: String },
    /// Any other JSON-RPC error the server answered with.
    #[error("MCP server \"{server}\" answered {method} with error {code}: {message}")]
    Rejected { server: String, method: &'static str, code: i32, message: String },
}

impl McpError {
    /// Whether the request may have reached the tool.
    pub fn delivery(&self) -> Delivery {
        match self {
            McpError::NotConfigured { .. } | McpError::Connect { .. } | McpError::Session { .. } => {
                Delivery::NotSent
            }
            McpError::Status { delivery, .. }
            | McpError::Malformed { delivery, .. }
            | McpError::Timeout { delivery, .. }
            | McpError::Disconnected { delivery, .. } => *delivery,
            McpError::NoTool { .. } | McpError::Rejected { .. } => Delivery::Answered,
        }
    }

    /// The name of the server the request was for.
    pub fn server(&self) -> &str {
        match self {
            McpError::NotConfigured { server }
            | McpError::Connect { server, .. }
            | McpError::Status { server, .. }
            | McpError::Malformed { server, .. }
            | McpError::Session { server, .. }
            | McpError::Timeout { server, .. }
            | McpError::Disconnected { server, .. }
            | McpError::NoTool { server, .. }
            | McpError::Rejected { server, .. } => server,
        }
    }

    /// Whether the connection is worth keeping after this error: only when the server answered,
    /// or is merely slow. Any other failure may have left the session or the process broken.
    pub(crate) fn keeps_connection(&self) -> bool {
        matches!(self, McpError::NoTool { .. } | McpError::Rejected { .. } | McpError::Timeout { .. })
    }
}

fn status_text(status: u16) -> String {
    match http::StatusCode::from_u16(status) {
        Ok(status) => status.to_string(),
        Err(_) => status.to_string(),
    }
}

fn detail(body: &str) -> String {
    if body.is_empty() { String::new() } else { format!(": {body}") }
}

fn seconds(duration: Duration) -> String {
    let s = duration.as_secs_f64();
    if s.fract() == 0.0 { format!("{s:.0} s") } else { format!("{s} s") }
}

/// An error and its sources, as one line.
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        // reqwest and hyper repeat their source in their own message at times.
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// What a failed connection attempt says, short for the common case.
fn connect_reason(error: &reqwest::Error) -> String {
    let mut source: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return "connection refused".to_owned();
        }
        source = cause.source();
    }
    format!("cannot connect: {}", chain(error))
}

/// Where in a request's life a failure happened, which bounds what it can have reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Opening the connection: initialize and notifications/initialized. The request itself has
    /// not been written, so nothing this stage does can reach the tool.
    Opening,
    /// Handing the request to rmcp's service loop, which had already stopped.
    Handing,
    /// The request was given to the transport.
    Sent,
}

/// The request a failure belongs to, for the message and the classification.
pub(crate) struct Context<'a> {
    pub server: &'a str,
    pub target: &'a str,
    pub method: &'static str,
    /// The tool, for tools/call.
    pub tool: Option<&'a str>,
    pub stage: Stage,
}

impl Context<'_> {
    /// MaybeSent once the request was written, NotSent before.
    fn unknown(&self) -> Delivery {
        match self.stage {
            Stage::Sent => Delivery::MaybeSent,
            Stage::Opening | Stage::Handing => Delivery::NotSent,
        }
    }

    fn disconnected(&self, reason: String) -> McpError {
        McpError::Disconnected {
            server: self.server.to_owned(),
            method: self.method,
            reason,
            delivery: self.unknown(),
        }
    }

    fn malformed(&self, reason: String) -> McpError {
        McpError::Malformed { server: self.server.to_owned(), reason, delivery: self.unknown() }
    }

    fn session(&self, reason: String) -> McpError {
        McpError::Session { server: self.server.to_owned(), reason }
    }

    /// A failure while opening the connection. All of them are NotSent: the request waits for
    /// the session, so it was never written (spec "Lifecycle": the client sends no request but
    /// pings before initialization is complete).
    pub(crate) fn initialize(&self, error: ClientInitializeError) -> McpError {
        match error {
            ClientInitializeError::TransportError { error, .. } => self.transport(error),
            ClientInitializeError::JsonRpcError(data) => self.session(data.message.into_owned()),
            // The stdio child exited, or closed its stdout, before answering.
            ClientInitializeError::ConnectionClosed(reason) => {
                self.session(format!("the connection closed during initialize ({reason})"))
            }
            other => self.session(other.to_string()),
        }
    }

    /// A failure of a request on an open connection.
    pub(crate) fn service(&self, error: ServiceError) -> McpError {
        match error {
            ServiceError::McpError(data) => self.answered(data),
            ServiceError::TransportSend(error) => self.transport(error),
            // rmcp's service loop ended with the request pending (a stdio child that died, a
            // connection that closed): written or not, it had no answer.
            ServiceError::TransportClosed => {
                self.disconnected("the connection closed before the answer".to_owned())
            }
            // Spec "Cancellation": rmcp has sent notifications/cancelled for the request, which
            // the server may or may not have started; its outcome is unknown.
            ServiceError::Timeout { timeout } => McpError::Timeout {
                server: self.server.to_owned(),
                method: self.method,
                after: timeout,
                delivery: self.unknown(),
            },
            ServiceError::UnexpectedResponse => {
                self.malformed(format!("an unexpected result to {}", self.method))
            }
            other => self.disconnected(other.to_string()),
        }
    }

    /// A JSON-RPC error answer: the server handled the request and said no (Answered).
    fn answered(&self, data: ErrorData) -> McpError {
        // rmcp's HTTP worker fails requests still waiting on a stream when it replaces the
        // session, with an error of its own making: the server never answered those.
        if data.code == ErrorCode::INTERNAL_ERROR && data.message.contains("session was re-initialized") {
            return self.disconnected(data.message.into_owned());
        }
        // Spec "Tools", error handling: an unknown tool is a protocol error, -32602 (invalid
        // params) with a message such as "Unknown tool: x"; the code alone also covers invalid
        // arguments, so the message must name the tool and say it is missing.
        if let Some(tool) = self.tool
            && data.code == ErrorCode::INVALID_PARAMS
        {
            let message = data.message.to_lowercase();
            if message.contains(&tool.to_lowercase())
                && (message.contains("unknown") || message.contains("not found"))
            {
                return McpError::NoTool { server: self.server.to_owned(), tool: tool.to_owned() };
            }
        }
        McpError::Rejected {
            server: self.server.to_owned(),
            method: self.method,
            code: data.code.0,
            message: data.message.into_owned(),
        }
    }

    fn transport(&self, error: DynamicTransportError) -> McpError {
        match error.error.downcast_ref::<StreamableHttpError<HttpError>>() {
            Some(http) => self.http(http),
            // The stdio transport's errors are I/O errors writing to the child's stdin. A
            // failed write may have been partly read: unknown once the request was written.
            None => self.disconnected(chain(error.error.as_ref())),
        }
    }

    fn http(&self, error: &StreamableHttpError<HttpError>) -> McpError {
        let server = self.server.to_owned();
        match error {
            // No connection was made, so no byte of the request left (spec "Transports": each
            // message is its own POST, and `http.rs` opens a new connection for each).
            StreamableHttpError::Client(HttpError::Connect(e)) => {
                McpError::Connect { server, target: self.target.to_owned(), reason: connect_reason(e) }
            }
            StreamableHttpError::Client(HttpError::Exchange(e)) => self.disconnected(chain(e)),
            StreamableHttpError::Client(HttpError::Status { status, body }) => McpError::Status {
                server,
                status: status.as_u16(),
                body: body.clone(),
                // Spec "Authorization": the server validates the token on every request and
                // answers 401 (invalid or missing) or 403 (insufficient scope) instead of
                // handling it, so the tool never saw it.
                delivery: if *status == http::StatusCode::UNAUTHORIZED
                    || *status == http::StatusCode::FORBIDDEN
                {
                    Delivery::NotSent
                } else {
                    self.unknown()
                },
            },
            StreamableHttpError::AuthRequired(_) | StreamableHttpError::InsufficientScope(_) => {
                McpError::Status {
                    server,
                    status: if matches!(error, StreamableHttpError::AuthRequired(_)) { 401 } else { 403 },
                    body: String::new(),
                    delivery: Delivery::NotSent,
                }
            }
            StreamableHttpError::HttpStatus(e) => {
                McpError::Status { server, status: e.status, body: String::new(), delivery: self.unknown() }
            }
            // Spec "Transports", session management: a 404 to a request with Mcp-Session-Id
            // means the server did not process it. rmcp re-initialized and sent it again, once;
            // this is that one re-send answered 404 again (or a request whose renewal failed).
            StreamableHttpError::SessionExpired => {
                self.session("the session expired (HTTP 404) and was not renewed".to_owned())
            }
            // The 404 meant not processed, and renewing the session failed before the re-send.
            StreamableHttpError::ReinitializationFailed(data) => self.session(format!(
                "the session expired (HTTP 404) and a new one was refused: {}",
                data.message
            )),
            StreamableHttpError::Deserialize(_)
            | StreamableHttpError::UnexpectedContentType(_)
            | StreamableHttpError::UnexpectedServerResponse(_)
            | StreamableHttpError::ResponseBodyTooLarge { .. }
            | StreamableHttpError::Sse(_) => self.malformed(error.to_string()),
            // The rest: the worker stopped, or gave up waiting (SessionRecoveryTimeout says
            // itself that the server may have processed the POST).
            other => self.disconnected(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(stage: Stage) -> Context<'static> {
        Context {
            server: "files",
            target: "http://127.0.0.1:9100/mcp",
            method: "tools/call",
            tool: Some("write_file"),
            stage,
        }
    }

    #[test]
    fn display_names_the_server_and_the_reason() {
        let timeout = McpError::Timeout {
            server: "files".into(),
            method: "tools/call",
            after: Duration::from_secs(60),
            delivery: Delivery::MaybeSent,
        };
        assert_eq!(timeout.to_string(), r#"MCP server "files": tools/call timed out after 60 s"#);
        let status = McpError::Status {
            server: "files".into(),
            status: 401,
            body: String::new(),
            delivery: Delivery::NotSent,
        };
        assert_eq!(status.to_string(), r#"MCP server "files" answered 401 Unauthorized"#);
        assert_eq!(status.server(), "files");
    }

    #[test]
    fn an_unknown_tool_is_answered() {
        let error = context(Stage::Sent).service(ServiceError::McpError(ErrorData::new(
            ErrorCode::INVALID_PARAMS,
            "Unknown tool: write_file",
            None,
        )));
        assert!(matches!(error, McpError::NoTool { .. }), "{error:?}");
        assert_eq!(error.delivery(), Delivery::Answered);
        assert_eq!(error.to_string(), r#"MCP server "files" has no tool "write_file""#);
    }

    #[test]
    fn invalid_arguments_are_answered_but_are_not_a_missing_tool() {
        let error = context(Stage::Sent).service(ServiceError::McpError(ErrorData::new(
            ErrorCode::INVALID_PARAMS,
            "missing field `path`",
            None,
        )));
        assert!(matches!(error, McpError::Rejected { code: -32602, .. }));
        assert_eq!(error.delivery(), Delivery::Answered);
    }

    #[test]
    fn rmcps_own_error_for_a_replaced_session_is_not_an_answer() {
        let error = context(Stage::Sent).service(ServiceError::McpError(ErrorData::internal_error(
            "streamable HTTP session was re-initialized before the response arrived",
            None,
        )));
        assert_eq!(error.delivery(), Delivery::MaybeSent);
    }

    #[test]
    fn a_closed_connection_is_maybe_sent_only_once_the_request_was_written() {
        let sent = context(Stage::Sent).service(ServiceError::TransportClosed);
        assert_eq!(sent.delivery(), Delivery::MaybeSent);
        let handed = context(Stage::Handing).service(ServiceError::TransportClosed);
        assert_eq!(handed.delivery(), Delivery::NotSent);
    }

    #[test]
    fn a_timeout_is_maybe_sent() {
        let error =
            context(Stage::Sent).service(ServiceError::Timeout { timeout: Duration::from_millis(1500) });
        assert_eq!(error.delivery(), Delivery::MaybeSent);
        assert!(error.to_string().ends_with("timed out after 1.5 s"));
    }

    fn http_error(stage: Stage, error: StreamableHttpError<HttpError>) -> McpError {
        context(stage).http(&error)
    }

    #[test]
    fn http_statuses() {
        let status = |code: u16| {
            StreamableHttpError::Client(HttpError::Status {
                status: http::StatusCode::from_u16(code).unwrap(),
                body: "no".into(),
            })
        };
        assert_eq!(http_error(Stage::Sent, status(401)).delivery(), Delivery::NotSent);
        assert_eq!(http_error(Stage::Sent, status(403)).delivery(), Delivery::NotSent);
        assert_eq!(http_error(Stage::Sent, status(502)).delivery(), Delivery::MaybeSent);
        assert_eq!(http_error(Stage::Opening, status(502)).delivery(), Delivery::NotSent);
        assert_eq!(
            http_error(Stage::Sent, status(500)).to_string(),
            r#"MCP server "files" answered 500 Internal Server Error: no"#
        );
    }

    #[test]
    fn an_expired_session_not_renewed_is_not_sent() {
        let error = http_error(Stage::Sent, StreamableHttpError::SessionExpired);
        assert_eq!(error.delivery(), Delivery::NotSent);
        let error = http_error(
            Stage::Sent,
            StreamableHttpError::ReinitializationFailed(ErrorData::internal_error("no", None)),
        );
        assert_eq!(error.delivery(), Delivery::NotSent);
        let error = http_error(Stage::Sent, StreamableHttpError::SessionRecoveryTimeout);
        assert_eq!(error.delivery(), Delivery::MaybeSent);
    }

    #[test]
    fn a_malformed_answer_is_maybe_sent() {
        let json = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let error = http_error(Stage::Sent, StreamableHttpError::Deserialize(json));
        assert!(matches!(error, McpError::Malformed { .. }));
        assert_eq!(error.delivery(), Delivery::MaybeSent);
        assert!(error.to_string().starts_with(r#"MCP server "files" sent a malformed message: "#));
    }

    #[tokio::test]
    async fn a_refused_connection_is_not_sent() {
        // A port nothing listens on: bind one, note it, let it go.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let refused =
            reqwest::Client::new().post(format!("http://127.0.0.1:{port}/mcp")).send().await.unwrap_err();
        let error = http_error(Stage::Sent, StreamableHttpError::Client(refused.into()));
        assert_eq!(error.delivery(), Delivery::NotSent);
        assert_eq!(
            error.to_string(),
            r#"MCP server "files": connection refused (http://127.0.0.1:9100/mcp)"#
        );
    }
}

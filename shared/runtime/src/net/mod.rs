//! Outbound HTTP, written once for every caller: the worker webhook client, the model
//! providers, the CLI and the tests.
//!
//! - [`client_builder`]: the one set of connection settings (`TCP_NODELAY`, a 10 s connect
//!   timeout, keep-alive, no redirects, a `turnstone/<version>` user agent). There is no
//!   overall timeout: each caller bounds its own attempt, a stream included.
//! - [`read_limited`]: a body read up to a limit, so a hostile or broken peer cannot make us
//!   buffer without end.
//! - [`error_chain`]: a transport error as one line that never names the URL (which may carry
//!   credentials).
//! - [`short_text`]: text from a peer made safe to put in an error message or a log line.
//! - [`sse`]: the `text/event-stream` parser, and [`SseStream`] reading one off a response.

pub mod sse;

use std::time::Duration;

use futures_util::StreamExt;

pub use sse::{SseError, SseEvent, SseParser, SseStream, SseStreamError};

/// How long establishing a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an idle connection is kept (both TCP keep-alive and the pool).
const IDLE: Duration = Duration::from_secs(60);

/// The settings every outbound client shares. Callers may add to it (a user agent of their own)
/// before `build()`.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_keepalive(IDLE)
        .pool_idle_timeout(IDLE)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("turnstone/", env!("CARGO_PKG_VERSION")))
}

/// A client with [`client_builder`]'s settings.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    client_builder().build()
}

/// Reads a body, stopping once more than `limit` bytes arrived: the result is then longer than
/// `limit` (so the caller can tell), and the rest is never read.
pub async fn read_limited(response: reqwest::Response, limit: usize) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        body.extend_from_slice(&chunk?);
        if body.len() > limit {
            break;
        }
    }
    Ok(body)
}

/// A transport error and its causes on one line: what kind of failure it was, then each cause
/// once. reqwest's own text is left out because it names the URL.
pub fn error_chain(err: &reqwest::Error) -> String {
    let mut message = kind_of(err).to_owned();
    let mut current = std::error::Error::source(err);
    while let Some(cause) = current {
        let text = cause.to_string();
        // Some errors repeat their source in their own text; say each thing once.
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        current = cause.source();
    }
    short_text(&message, 500)
}

fn kind_of(err: &reqwest::Error) -> &'static str {
    if err.is_connect() {
        "connection failed"
    } else if err.is_timeout() {
        "timed out"
    } else if err.is_body() || err.is_decode() {
        "reading the response failed"
    } else if err.is_builder() {
        "invalid request"
    } else if err.is_request() {
        "sending the request failed"
    } else {
        "request failed"
    }
}

/// `text` on one line, trimmed, without control characters, cut to `max_chars` characters
/// (marked with `…` when cut).
pub fn short_text(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars.saturating_mul(4)));
    for (count, c) in text.trim().chars().enumerate() {
        if count == max_chars {
            out.push('\u{2026}');
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_cuts_on_characters_and_flattens() {
        assert_eq!(short_text("h\u{e9}llo", 2), "h\u{e9}\u{2026}");
        assert_eq!(short_text("hi", 2), "hi");
        assert_eq!(short_text("  a\nb\tc  ", 10), "a b c");
        assert_eq!(short_text("", 3), "");
    }

    #[tokio::test]
    async fn error_chain_names_the_failure_not_the_url() {
        // Nothing listens on port 9 of loopback (discard): the connection is refused.
        let err = client()
            .unwrap()
            .get("http://user:secret@127.0.0.1:9/private?token=abc")
            .send()
            .await
            .unwrap_err();
        let text = error_chain(&err);
        assert!(text.starts_with("connection failed"), "{text}");
        assert!(
            !text.contains("secret") && !text.contains("token") && !text.contains("127.0.0.1:9"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn read_limited_stops_past_the_limit() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "x".repeat(100_000) }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let url = format!("http://{addr}/");
        let whole = read_limited(client().unwrap().get(&url).send().await.unwrap(), 1 << 20).await.unwrap();
        assert_eq!(whole.len(), 100_000);
        let cut = read_limited(client().unwrap().get(&url).send().await.unwrap(), 10).await.unwrap();
        assert!(cut.len() > 10 && cut.len() < 100_000, "{}", cut.len());
    }
}

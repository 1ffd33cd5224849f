//! The open host (no `[auth]`) is for this machine only. Every caller may do everything there,
//! so what keeps other machines and web pages out is checked on every request:
//! - the `Host` header names a loopback host or the address the host listens on, else 421: a
//!   page on another name whose DNS was rebound to 127.0.0.1 sends its own name (a host that
//!   listens on every address, which `serve` does only with `allow_anonymous`, takes any name);
//! - a WebSocket upgrade or a state-changing request (any method but GET, HEAD, OPTIONS)
//!   whose `Origin` is present and is not this host's own origin is refused with 403: a page
//!   of another site sends its origin, and browsers neither let it set nor drop that header
//!   (VS Code's desktop origin, which no web page can send, may open a socket);
//! - a request with a body says `Content-Type: application/json`, else 415: a cross-site
//!   form (`text/plain`, `application/x-www-form-urlencoded`, `multipart/form-data`) is sent
//!   with no preflight, but cannot set that type without one.
//!
//! With `[auth]` none of this applies: a browser page cannot attach the bearer token.
//!
//! A deployment reached from the internet (the Lambda functions) fails closed instead: with
//! no `[auth]` and no `[server] allow_anonymous = true`, [`refuse_all`] answers every request
//! but the health check 503 `auth_not_configured`.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::ApiError;

/// Who may call a host that has no `[auth]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Anonymous {
    /// Everyone, with no checks (a host the caller builds for itself, or `allow_anonymous` on
    /// Lambda).
    #[default]
    Everyone,
    /// This machine only: the long-running host, from its listener ([`OpenHost`]).
    ThisMachine(OpenHost),
    /// Nobody: a deployment reached from the internet without `allow_anonymous`
    /// ([`refuse_all`]).
    Nobody,
}

/// Where the open host listens, which its `Host` header may name besides loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenHost {
    pub addr: SocketAddr,
}

/// The middleware: refuses what [`OpenHost`] does not let in, before any route runs.
pub(super) async fn guard(State(open): State<OpenHost>, request: Request, next: Next) -> Response {
    match open.check(request.method(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

/// The middleware of a deployment that may not serve without `[auth]`: everything but
/// `/healthz` is refused, saying what to configure.
pub(super) async fn refuse_all(request: Request, next: Next) -> Response {
    if request.uri().path() == "/healthz" {
        return next.run(request).await;
    }
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "auth_not_configured",
        "this deployment has no [auth], so it serves no one: add an [auth] section to its \
         configuration (or [server] allow_anonymous = true to let anyone in)",
    )
    .into_response()
}

impl OpenHost {
    fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !self.serves(host) {
            return Err(ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected_request",
                format!(
                    "this host has no [auth] and answers only requests for a loopback name or {} \
                     (Host: {host:?})",
                    self.addr.ip()
                ),
            ));
        }
        let upgrade = headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        let changes_state = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        if (upgrade || changes_state)
            && let Some(origin) = headers.get(header::ORIGIN)
        {
            let origin = origin.to_str().unwrap_or("");
            if !(same_origin(origin, host) || (upgrade && origin == VSCODE_DESKTOP_ORIGIN)) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "cross_origin",
                    format!(
                        "this host has no [auth]: it takes requests from its own pages only, \
                         not from origin {origin:?}"
                    ),
                ));
            }
        }
        if has_body(headers) && !is_json(headers) {
            let given = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("none");
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("request bodies are JSON: send Content-Type: application/json (got {given})"),
            ));
        }
        Ok(())
    }

    /// Whether `host` (a `Host` header: a name or an address, maybe with a port) is a
    /// loopback name or this host's own address. A host listening on every address (only with
    /// `allow_anonymous`) is for whoever reaches it, by any name.
    fn serves(&self, host: &str) -> bool {
        if self.addr.ip().is_unspecified() {
            return !host.is_empty();
        }
        let name = host_name(host);
        if name.eq_ignore_ascii_case("localhost") || name.to_ascii_lowercase().ends_with(".localhost") {
            return true;
        }
        match name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip == self.addr.ip(),
            Err(_) => false,
        }
    }
}

/// The name part of a `Host` value: `[::1]:8787` is `[::1]`, `localhost:8787` is `localhost`.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.rsplit_once(':').map_or(
        host,
        |(name, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) { name } else { host }
        },
    )
}

/// The origin VS Code's desktop renderer sends on every request it makes, its agent host
/// client's WebSocket included: the workbench is an Electron page loaded from the
/// `vscode-file` scheme (`vscode-file://vscode-app/.../workbench.html`). No web page can carry
/// it (a browser sends the page's own scheme and host, and neither lets a script set the
/// header), so letting it open a socket keeps the open host closed to web pages. Only for
/// WebSocket upgrades: VS Code talks to an agent host over its socket alone.
const VSCODE_DESKTOP_ORIGIN: &str = "vscode-file://vscode-app";

/// Whether `origin` (`scheme://host[:port]`, or `null`) is the origin of a page this host
/// served under `host`.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else { return false };
    matches!(scheme, "http" | "https") && !host.is_empty() && authority.eq_ignore_ascii_case(host)
}

/// Whether the request carries a body (a non-zero length, or a chunked one).
fn has_body(headers: &HeaderMap) -> bool {
    let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
    match length {
        Some(length) => length.trim() != "0",
        None => headers.contains_key(header::TRANSFER_ENCODING),
    }
}

/// Whether the body is declared JSON: `application/json` or a `+json` type, any parameters.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn hosts_origins_and_types() {
        let open = OpenHost { addr: "192.168.1.5:8787".parse().unwrap() };
        let code = |method: Method, pairs: &[(&'static str, &str)]| {
            open.check(&method, &headers(pairs)).err().map(|e| e.status.as_u16())
        };
        for host in [
            "127.0.0.1:8787",
            "localhost",
            "LOCALHOST:1",
            "app.localhost:80",
            "[::1]:8787",
            "127.8.9.1",
            "192.168.1.5:8787",
        ] {
            assert_eq!(code(Method::GET, &[("host", host)]), None, "{host}");
        }
        for host in ["evil.example", "evil.example:8787", "10.0.0.1:8787", "localhost.evil.example", ""] {
            assert_eq!(code(Method::GET, &[("host", host)]), Some(421), "{host}");
        }
        let local = ("host", "127.0.0.1:8787");
        let json = ("content-type", "application/json; charset=utf-8");
        let body = ("content-length", "2");
        assert_eq!(code(Method::POST, &[local, json, body, ("origin", "http://127.0.0.1:8787")]), None);
        assert_eq!(code(Method::POST, &[local, json, body, ("origin", "http://evil.example")]), Some(403));
        assert_eq!(code(Method::POST, &[local, json, body, ("origin", "null")]), Some(403));
        assert_eq!(code(Method::POST, &[local, json, body, ("origin", "http://127.0.0.1:9999")]), Some(403));
        assert_eq!(code(Method::DELETE, &[local, ("origin", "http://evil.example")]), Some(403));
        // A page of another site may read nothing it could not read anyway, but may not upgrade.
        assert_eq!(code(Method::GET, &[local, ("origin", "http://evil.example")]), None);
        // VS Code's desktop renderer opens its agent host socket from its own scheme; nothing
        // else of it, and no look-alike, gets through.
        let vscode = ("origin", "vscode-file://vscode-app");
        assert_eq!(code(Method::GET, &[local, vscode, ("upgrade", "websocket")]), None);
        assert_eq!(code(Method::POST, &[local, json, body, vscode]), Some(403));
        for other in ["vscode-file://vscode-app.evil.example", "vscode-webview://abc", "https://vscode-app"] {
            assert_eq!(
                code(Method::GET, &[local, ("origin", other), ("upgrade", "websocket")]),
                Some(403),
                "{other}"
            );
        }
        let rebound = ("host", "evil.example:8787");
        assert_eq!(code(Method::GET, &[rebound, vscode, ("upgrade", "websocket")]), Some(421));
        assert_eq!(
            code(Method::GET, &[local, ("origin", "http://evil.example"), ("upgrade", "websocket")]),
            Some(403)
        );
        assert_eq!(code(Method::POST, &[local, body, ("content-type", "text/plain")]), Some(415));
        assert_eq!(code(Method::POST, &[local, body]), Some(415));
        assert_eq!(code(Method::POST, &[local, ("transfer-encoding", "chunked")]), Some(415));
        assert_eq!(
            code(Method::POST, &[local, body, ("content-type", "application/merge-patch+json")]),
            None
        );
        // Listening on every address (allow_anonymous): any name, but still no other site.
        let everywhere = OpenHost { addr: "0.0.0.0:8787".parse().unwrap() };
        assert!(everywhere.check(&Method::GET, &headers(&[("host", "box.lan:8787")])).is_ok());
        let cross = headers(&[("host", "box.lan:8787"), ("origin", "http://evil.example")]);
        assert_eq!(everywhere.check(&Method::DELETE, &cross).err().map(|e| e.status.as_u16()), Some(403));
        // An empty POST (a cancel) needs no type.
        assert_eq!(code(Method::POST, &[local, ("content-length", "0")]), None);
        assert_eq!(code(Method::POST, &[local]), None);
    }
}

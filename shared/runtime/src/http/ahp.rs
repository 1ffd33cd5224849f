//! `GET /v1/ahp`: the Agent Host Protocol over a WebSocket ([`crate::ahp`]). The upgrade is
//! authenticated like every request, by its `Authorization` header or, where a client cannot
//! set one (a browser's `WebSocket`, VS Code's agent host client), by the token offered as a
//! subprotocol (`tkn.<token>`) or in the `tkn` query parameter (the header wins, then the
//! subprotocol; [`crate::ahp`] has the rules): without a valid token it is
//! answered 401 and never upgraded, as it is with a token already past its expiry (the socket
//! would be closed at once). A caller holding `[limits] sockets_per_caller` sockets already is
//! answered 429 `too_many_sockets`. Messages and frames are bounded by `[server]
//! max_body_bytes`, as request bodies are.

use std::sync::Arc;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, unauthorized};
use crate::auth::Caller;

/// The query parameter a browser's WebSocket carries its token in.
const TOKEN_PARAMETER: &str = "tkn";

pub(super) async fn upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let caller = caller(&state, &headers, query.as_deref())?;
    let upgrade = upgrade.map_err(|rejection| {
        ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "websocket_required",
            format!("GET /v1/ahp speaks the Agent Host Protocol over a WebSocket: {}", rejection.body_text()),
        )
    })?;
    let slot = state.ahp.open_socket(&caller).map_err(|limit| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_sockets",
            format!(
                "this caller has {limit} AHP sockets open, the most allowed (limits.sockets_per_caller); \
                 close one first"
            ),
        )
    })?;
    let max = state.config.max_body_bytes;
    let host = Arc::clone(&state.ahp);
    let auth = state.config.auth.clone();
    // `ahp` is selected when the client offers it (the token's subprotocol never is).
    let upgrade = upgrade.max_message_size(max).max_frame_size(max).protocols([crate::ahp::SUBPROTOCOL]);
    Ok(upgrade
        .on_upgrade(move |socket| async move {
            // Counted until the socket ends (or, if the upgrade fails, until this is dropped).
            let _slot = slot;
            crate::ahp::serve(socket, host, caller, auth).await;
        })
        .into_response())
}

/// The caller of the upgrade: by its `Authorization` header as every request's, or without
/// one by the token offered as a subprotocol, or else by the `tkn` query parameter, with the
/// same checks.
fn caller(state: &AppState, headers: &HeaderMap, query: Option<&str>) -> Result<Caller, ApiError> {
    let protocols =
        headers.get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL).iter().filter_map(|v| v.to_str().ok());
    let token = match crate::ahp::subprotocol_token(protocols) {
        Some(token) => Some(std::borrow::Cow::Borrowed(token)),
        None => query.and_then(|query| {
            form_urlencoded::parse(query.as_bytes()).find(|(name, _)| name == TOKEN_PARAMETER).map(|(_, v)| v)
        }),
    };
    let Some(auth) = state.config.auth.as_ref() else { return Ok(Caller::Anyone) };
    // A header that is not text is one with no valid token, not an absent one.
    let header = headers.get(axum::http::header::AUTHORIZATION).map(|v| v.to_str().unwrap_or(""));
    auth.authenticate_upgrade(header, token.as_deref()).map_err(unauthorized)
}

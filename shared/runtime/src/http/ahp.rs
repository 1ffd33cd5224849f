//! `GET /v1/ahp`: the Agent Host Protocol over a WebSocket ([`crate::ahp`]). The upgrade is
//! authenticated like every request: without a valid `Authorization` it is answered 401 and
//! never upgraded.

use std::sync::Arc;

use axum::extract::State;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, authenticate};

pub(super) async fn upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let caller = authenticate(&state, &headers)?;
    let upgrade = upgrade.map_err(|rejection| {
        ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "websocket_required",
            format!("GET /v1/ahp speaks the Agent Host Protocol over a WebSocket: {}", rejection.body_text()),
        )
    })?;
    let host = Arc::clone(&state.ahp);
    Ok(upgrade.on_upgrade(move |socket| crate::ahp::serve(socket, host, caller)).into_response())
}

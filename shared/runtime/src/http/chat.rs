//! `GET /v1/sessions/{id}/chat`: the session as an Agent Host Protocol chat (its default chat,
//! the active path), the `ChatState` a client that reduced every action of it holds, its turns
//! paged newest first.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use turnstone_ahp::ChatState;
use turnstone_engine::ids::SessionId;

use super::query::ApiQuery;
use super::{AppState, authenticate, reachable};
use crate::ahp::ProjectError;
use crate::ahp::turns;
use crate::api::ApiError;
use crate::auth::Access;

/// Turns a page holds unless asked otherwise, and at most.
const DEFAULT_TURNS: usize = 50;
const MAX_TURNS: usize = 500;

#[derive(Deserialize)]
pub(super) struct ChatQuery {
    /// How many turns (the newest, or the newest before `cursor`).
    #[serde(default)]
    turns: Option<usize>,
    /// A page's `turnsNextCursor`: the turns before it.
    #[serde(default)]
    cursor: Option<String>,
}

pub(super) async fn chat(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    ApiQuery(query): ApiQuery<ChatQuery>,
    headers: HeaderMap,
) -> Result<Json<ChatState>, ApiError> {
    let caller = authenticate(&state, &headers)?;
    reachable(&state, &caller, &id, Access::Read).await?;
    let limit = query.turns.unwrap_or(DEFAULT_TURNS).clamp(1, MAX_TURNS);
    // The chat is the projection of the whole log.
    let projection = crate::ahp::project_log(&state.app, &id).await.map_err(|e| match e {
        ProjectError::Store(e) => ApiError::from(e),
        e => {
            tracing::error!(session_id = %id, error = %e, "the chat projection failed");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("session {id}: {e}"))
        }
    })?;
    let chat =
        turns::tail_within_a_page(projection.chat(), query.cursor.as_deref(), limit).map_err(|_| {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_cursor", "invalid cursor").with_param("cursor")
        })?;
    Ok(Json(chat))
}

//! `GET /v1/sessions/{id}/chat`: the session as an Agent Host Protocol chat (its default chat,
//! the active path), the `ChatState` a client that reduced every action of it holds, its turns
//! paged newest first.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use turnstone_ahp::{ChatProjection, ChatState};
use turnstone_engine::ids::SessionId;

use super::{AppState, authenticate, reachable};
use crate::api::ApiError;
use crate::auth::Access;

/// Turns a page holds unless asked otherwise, and at most.
const DEFAULT_TURNS: usize = 50;
const MAX_TURNS: usize = 500;
/// Events read from the store at a time while the chat is projected.
const EVENTS_PER_READ: usize = 1000;

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
    Query(query): Query<ChatQuery>,
    headers: HeaderMap,
) -> Result<Json<ChatState>, ApiError> {
    let caller = authenticate(&state, &headers)?;
    reachable(&state, &caller, &id, Access::Read).await?;
    let limit = query.turns.unwrap_or(DEFAULT_TURNS).clamp(1, MAX_TURNS);
    // The chat is the projection of the whole log.
    let mut projection = ChatProjection::new(id.clone());
    let mut after = 0;
    loop {
        let page = state
            .app
            .store()
            .events_after(&id, after, EVENTS_PER_READ)
            .await
            .map_err(crate::error::Error::from)?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        for logged in &page {
            projection.apply(&logged.event).map_err(|e| {
                tracing::error!(session_id = %id, seq = logged.seq, error = %e, "the chat projection failed");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("session {id}: {e}"))
            })?;
        }
    }
    let mut chat = projection.chat().clone();
    let end = match query.cursor.as_deref() {
        None => chat.turns.len(),
        Some(cursor) => parse_cursor(cursor).filter(|end| *end <= chat.turns.len()).ok_or_else(|| {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_cursor", "invalid cursor").with_param("cursor")
        })?,
    };
    let start = end.saturating_sub(limit);
    chat.turns.truncate(end);
    chat.turns.drain(..start);
    chat.turns_next_cursor = (start > 0).then(|| format!("{CURSOR_PREFIX}{start}"));
    Ok(Json(chat))
}

/// Cursors name a position in the chat's turns, which only grow at the end.
const CURSOR_PREFIX: &str = "turns-before.";

fn parse_cursor(cursor: &str) -> Option<usize> {
    cursor.strip_prefix(CURSOR_PREFIX)?.parse().ok()
}

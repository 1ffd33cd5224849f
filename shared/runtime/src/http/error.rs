//! One error shape for every route ([`ApiError`], answered as `{"error": {"code", "message",
//! "param"?}}` with its status), and the one conversion from the runtime's errors to it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use turnstone_engine::session::Rejection;

use crate::api::ApiError;
use crate::error::Error;
use crate::store::StoreError;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match e {
            Error::Rejected(r) => rejection(r),
            Error::SessionNotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "session_not_found", e.to_string())
            }
            Error::SessionDisposed(_) => {
                ApiError::new(StatusCode::CONFLICT, "session_disposed", e.to_string())
            }
            Error::TurnNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "turn_not_found", e.to_string())
            }
            Error::UnknownAgent(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_agent", e.to_string()).with_param("agent_id")
            }
            Error::Invalid(p) => ApiError::invalid(p.path, p.message),
            Error::Store(StoreError::InvalidCursor) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_cursor", "invalid cursor")
                    .with_param("cursor")
            }
            Error::TooManySessions { .. } => {
                ApiError::new(StatusCode::CONFLICT, "too_many_sessions", e.to_string())
            }
            Error::SettleForbidden { .. } => {
                ApiError::new(StatusCode::FORBIDDEN, "settle_forbidden", e.to_string()).with_param("id")
            }
            Error::Contended(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "contended", e.to_string()),
            Error::Store(_) | Error::Queue(_) => {
                tracing::error!(error = %e, "backend failure");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the service is temporarily unavailable",
                )
            }
        }
    }
}

fn rejection(r: Rejection) -> ApiError {
    let status = match &r {
        Rejection::NotFound(_) | Rejection::UnknownCall(_) | Rejection::UnknownInterrupt { .. } => {
            StatusCode::NOT_FOUND
        }
        Rejection::InvalidInput(p) => return ApiError::invalid(p.path.clone(), p.message.clone()),
        Rejection::AgentMismatch { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        // The app answers it itself (it reads the versions and handles the command again);
        // reaching a client is a fault of this service.
        Rejection::Recall(_) => {
            tracing::error!(rejection = %r, "a version recall reached a client");
            StatusCode::INTERNAL_SERVER_ERROR
        }
        _ => StatusCode::CONFLICT,
    };
    let error = ApiError::new(status, r.code(), r.to_string());
    if matches!(r, Rejection::AgentMismatch { .. }) { error.with_param("agent_id") } else { error }
}

//! One error shape for every route: `{"error": {"code", "message", "param"?}}` with its status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use turnstone_engine::session::Rejection;

use crate::error::Error;
use crate::store::StoreError;

/// An error as the HTTP API reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable code.
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// The offending field's path, for invalid requests.
    pub param: Option<String>,
}

impl ApiError {
    /// An error with no param.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError { status, code: code.to_owned(), message: message.into(), param: None }
    }

    /// 422 for a request body that is not a valid message of its type.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let param = param.into();
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "invalid_request".to_owned(),
            message: message.into(),
            param: (!param.is_empty()).then_some(param),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(param) = self.param {
            error["param"] = json!(param);
        }
        (self.status, axum::Json(json!({ "error": error }))).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match e {
            Error::Rejected(r) => rejection(r),
            Error::SessionNotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "session_not_found", e.to_string())
            }
            Error::TurnNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "turn_not_found", e.to_string())
            }
            Error::UnknownAgent(_) => {
                let mut a = ApiError::new(StatusCode::NOT_FOUND, "unknown_agent", e.to_string());
                a.param = Some("agent_id".to_owned());
                a
            }
            Error::Invalid(p) => ApiError::invalid(p.path, p.message),
            Error::Store(StoreError::InvalidCursor) => {
                let mut a = ApiError::new(StatusCode::BAD_REQUEST, "invalid_cursor", "invalid cursor");
                a.param = Some("cursor".to_owned());
                a
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
        _ => StatusCode::CONFLICT,
    };
    let mut error = ApiError::new(status, r.code(), r.to_string());
    if matches!(r, Rejection::AgentMismatch { .. }) {
        error.param = Some("agent_id".to_owned());
    }
    error
}

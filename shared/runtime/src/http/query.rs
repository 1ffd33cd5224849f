//! Query strings read the way bodies are: a bad one is a 400 in the API's error shape, naming
//! the parameter (`?limit=abc`: `"param": "limit"`), not axum's plain-text rejection.

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::api::ApiError;

/// A route's query parameters, `T`.
pub(crate) struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let params = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(params).map(ApiQuery).map_err(|e| {
            let param = e.path().to_string();
            let error = ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.inner().to_string());
            if param.is_empty() || param == "." { error } else { error.with_param(param) }
        })
    }
}

/// A yes/no query parameter: `1`/`true` or `0`/`false`; absent is no.
pub(crate) fn flag(value: Option<&str>, name: &str) -> Result<bool, ApiError> {
    match value {
        None | Some("0" | "false") => Ok(false),
        Some("1" | "true") => Ok(true),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("{other:?} is not a yes or no: use 1, true, 0 or false"),
        )
        .with_param(name)),
    }
}

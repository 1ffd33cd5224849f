//! `GET /v1/openapi.json`: the HTTP API's OpenAPI 3.1 document.
//!
//! The host serves the committed file (`openapi.json` at the repository root) as it is, so a
//! normal build carries no schema generator; the generator ([`crate::openapi`], feature
//! `openapi`) and a test that fails when the file differs from its output keep the file true.

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

/// The committed document's text.
pub const DOCUMENT: &str = include_str!("../../../../openapi.json");

pub(super) async fn serve() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], DOCUMENT)
}

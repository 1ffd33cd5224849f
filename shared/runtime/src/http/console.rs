//! The web console: `GET /` and its two assets, embedded in the binary so every host (the
//! local one and the Lambda API function) serves it with no separate server. It calls only the
//! public HTTP API, so it is open even with `[auth]` on (it asks for the key when the API
//! answers 401): the files hold no data.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;

const INDEX: &str = include_str!("../../console/index.html");
const APP_JS: &str = include_str!("../../console/app.js");
const APP_CSS: &str = include_str!("../../console/app.css");

/// Revalidate each load: a new host version brings new files under the same names.
const NO_CACHE: &str = "no-cache";

pub(super) async fn index() -> impl IntoResponse {
    ([(CONTENT_TYPE, "text/html; charset=utf-8"), (CACHE_CONTROL, NO_CACHE)], INDEX)
}

pub(super) async fn app_js() -> impl IntoResponse {
    ([(CONTENT_TYPE, "text/javascript; charset=utf-8"), (CACHE_CONTROL, NO_CACHE)], APP_JS)
}

pub(super) async fn app_css() -> impl IntoResponse {
    ([(CONTENT_TYPE, "text/css; charset=utf-8"), (CACHE_CONTROL, NO_CACHE)], APP_CSS)
}

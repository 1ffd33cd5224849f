//! The web console: `GET /` and its two assets, embedded in the binary so every host (the
//! local one and the Lambda API function) serves it with no separate server. It calls only the
//! public HTTP API, so it is open even with `[auth]` on (it asks for the key when the API
//! answers 401): the files hold no data.

use axum::http::HeaderName;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::response::IntoResponse;

const INDEX: &str = include_str!("../../console/index.html");
const APP_JS: &str = include_str!("../../console/app.js");
const APP_CSS: &str = include_str!("../../console/app.css");

/// Revalidate each load: a new host version brings new files under the same names.
const NO_CACHE: &str = "no-cache";

/// The page runs only its own script and style and talks only to its own host: no inline
/// script, no other origin, no framing (clickjacking an approval button), no plugins. Styles
/// the script sets go through the CSSOM (`el.style`), which `style-src 'self'` allows.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Sent with every console file: the policy above, no MIME sniffing (a JSON answer is never
/// run as script), no framing for browsers without `frame-ancestors`, and no URL (which holds
/// session ids) in the `Referer` of links followed away.
fn headers(content_type: &'static str) -> [(HeaderName, &'static str); 6] {
    [
        (CONTENT_TYPE, content_type),
        (CACHE_CONTROL, NO_CACHE),
        (CONTENT_SECURITY_POLICY, CSP),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (X_FRAME_OPTIONS, "DENY"),
        (REFERRER_POLICY, "no-referrer"),
    ]
}

pub(super) async fn index() -> impl IntoResponse {
    (headers("text/html; charset=utf-8"), INDEX)
}

pub(super) async fn app_js() -> impl IntoResponse {
    (headers("text/javascript; charset=utf-8"), APP_JS)
}

pub(super) async fn app_css() -> impl IntoResponse {
    (headers("text/css; charset=utf-8"), APP_CSS)
}

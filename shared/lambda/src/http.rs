//! The HTTP functions: the runtime's router, unchanged, behind Lambda's HTTP events.

use std::sync::Arc;
use std::time::Duration;

use axum::middleware::Next;

use turnstone_runtime::app::App;
use turnstone_runtime::http::{HttpConfig, MAX_WAIT_BEHIND_API_GATEWAY, StreamEnds, router};

/// The router of the `api` function: long-polls end before API Gateway's 30 s limit would
/// answer 503 for them, and so do event streams, each as soon as it has news (API Gateway
/// hands a response on only once it is whole; the stream function's URL streams).
/// A request's commits push to AHP subscribers, and its metrics are written, before its answer
/// goes out: the process may freeze once the invocation ends.
pub fn api_router(app: Arc<App>, http: HttpConfig) -> axum::Router {
    let max_wait = http.max_wait.min(MAX_WAIT_BEHIND_API_GATEWAY);
    let invoked = Arc::clone(&app);
    let stream_ends = StreamEnds::WithNews(max_wait);
    router(app, HttpConfig { max_wait, stream_ends, ..http }).layer(axum::middleware::from_fn(
        move |request, next: Next| {
            let app = Arc::clone(&invoked);
            async move {
                let response = next.run(request).await;
                app.notifier().flush().await;
                crate::emit_metrics(&app);
                response
            }
        },
    ))
}

/// Runs the `api` function: each API Gateway HTTP API (payload 2.0) request through the
/// router.
pub async fn run_api(app: Arc<App>, http: HttpConfig) -> Result<(), lambda_http::Error> {
    lambda_http::run(api_router(app, http)).await
}

/// How long one event stream of the `stream` function lasts: under its 900 s timeout
/// (`infra/template.yaml`), with time to spare for the client's last frames, so a stream ends
/// with a `retry:` hint and the client reconnects, instead of ending as a Lambda timeout.
pub const MAX_STREAM_ON_LAMBDA: Duration = Duration::from_secs(840);

/// The router of the `stream` function: its event streams end before its deadline.
pub fn stream_router(app: Arc<App>, http: HttpConfig) -> axum::Router {
    router(app, HttpConfig { stream_ends: StreamEnds::After(MAX_STREAM_ON_LAMBDA), ..http })
}

/// Runs the `stream` function: each Function URL request through the router, the response
/// streamed as it is written (the SSE log of a session, live).
pub async fn run_stream(app: Arc<App>, http: HttpConfig) -> Result<(), lambda_http::Error> {
    lambda_http::run_with_streaming_response(stream_router(app, http)).await
}

//! The stack's two HTTP fronts as they invoke their functions: API Gateway's HTTP API (the
//! api function, buffered) and the stream function's Function URL (response streaming). Each
//! request becomes the event AWS sends (payload format 2.0), is handed to the function's
//! router through `lambda_http`'s own adapters (what `lambda_http::run` and
//! `run_with_streaming_response` wrap round the router in the functions' `main.rs`), under
//! the function's timeout, and its answer is read back as AWS reads it.
//!
//! Sources of the rules, all in AWS's documentation:
//! - API Gateway developer guide, "Create AWS Lambda proxy integrations for HTTP APIs": the
//!   2.0 event (header names in lower case, repeated headers joined with commas, `Cookie`
//!   headers moved to `cookies`) and the 2.0 response (`statusCode`, `headers`, `cookies`, each
//!   a `set-cookie`, `body`, `isBase64Encoded`).
//! - "Routes for HTTP APIs": a greedy `{proxy+}` catches every path below it but not `/`; a
//!   request no route matches is answered 404 `{"message":"Not Found"}`.
//! - "Quotas for HTTP APIs": an integration times out after 30 s, a request payload is at most
//!   10 MB. A timed-out integration is answered 503 `{"message":"Service Unavailable"}`; a
//!   function error (a function that times out is one) 500 `{"message":"Internal Server Error"}`.
//! - Lambda developer guide, "Lambda quotas": a synchronous invocation's request and response
//!   are each at most 6 MB (Lambda's error names 6,291,556 bytes); "Lambda function URLs": the
//!   Function URL's event is the 2.0 format with route `$default`; "Response streaming": the
//!   response head (status, headers, cookies) goes out first, then the body as it is written,
//!   and a function that reaches its timeout ends its response where it is.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::StreamExt;
use lambda_http::request::LambdaRequest;
use lambda_http::{Adapter, Context, LambdaEvent, StreamAdapter};
use serde_json::{Map, Value as Json, json};
use turnstone_aws::moto;

use super::template::Route;
use super::{ACCOUNT, REGION};

/// API Gateway's HTTP API: an integration is cut after 30 s.
pub const INTEGRATION_TIMEOUT: Duration = Duration::from_secs(30);
/// API Gateway's HTTP API: the largest request payload.
const MAX_API_REQUEST: usize = 10 << 20;
/// Lambda: the largest request or response of a synchronous invocation.
pub const MAX_SYNC_PAYLOAD: usize = 6_291_556;

/// A function behind a front: its router and the limits of its invocations.
#[derive(Clone)]
pub struct Function {
    /// Its name (`turnstone-<stage>-api`).
    pub name: String,
    /// Its timeout: the deadline of each invocation.
    pub timeout: Duration,
    pub router: axum::Router,
}

impl Function {
    /// The context Lambda gives an invocation: its id, deadline and function.
    fn context(&self) -> Context {
        let mut context = Context::default();
        context.request_id = moto::unique("invocation");
        context.deadline = u64::try_from(now_ms()).unwrap_or(0)
            + u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        context.invoked_function_arn = format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:{}", self.name);
        context
    }
}

/// The HTTP API's `$default` stage: its routes, each to its function.
pub struct HttpApi {
    pub api_id: String,
    pub routes: Vec<(Route, Function)>,
}

impl HttpApi {
    /// The route API Gateway picks for `method` and `path`: an exact path before a greedy one,
    /// a method before `ANY`.
    fn route(&self, method: &str, path: &str) -> Option<Matched<'_>> {
        let mut best: Option<(u8, Matched<'_>)> = None;
        for (route, function) in &self.routes {
            if route.method != "ANY" && route.method != method {
                continue;
            }
            let (rank, variable) = if route.path == path {
                (0, None)
            } else if let Some((prefix, name)) = greedy(&route.path)
                && let Some(rest) = path.strip_prefix(prefix)
                && !rest.is_empty()
            {
                (2, Some((name.to_owned(), rest.to_owned())))
            } else {
                continue;
            };
            let rank = rank + u8::from(route.method == "ANY");
            if best.as_ref().is_none_or(|(r, _)| rank < *r) {
                best = Some((rank, Matched { route, function, variable }));
            }
        }
        best.map(|(_, matched)| matched)
    }

    /// One request, as the HTTP API answers it.
    pub async fn invoke(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let Some(Matched { route, function, variable }) = self.route(parts.method.as_str(), parts.uri.path())
        else {
            return message(StatusCode::NOT_FOUND, "Not Found");
        };
        let Ok(body) = axum::body::to_bytes(body, MAX_API_REQUEST).await else {
            return message(StatusCode::PAYLOAD_TOO_LARGE, "Request Entity Too Large");
        };
        let mut event = event_v2(&parts, &body, &route.key(), &self.api_id);
        if let Some((name, value)) = variable {
            event["pathParameters"] = json!({ name: value });
        }
        let Some(event) = within_sync_payload(event) else {
            return message(StatusCode::PAYLOAD_TOO_LARGE, "Request Entity Too Large");
        };
        // As for the stream function below: the adapter is called here, its future awaited.
        let invocation = {
            let mut adapter = Adapter::from(function.router.clone());
            lambda_http::Service::call(&mut adapter, LambdaEvent::new(event, function.context()))
        };
        let Ok(Ok::<_, Infallible>(answer)) =
            tokio::time::timeout(function.timeout.min(INTEGRATION_TIMEOUT), invocation).await
        else {
            return if function.timeout < INTEGRATION_TIMEOUT {
                tracing::warn!(function = %function.name, "the function timed out");
                message(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error")
            } else {
                message(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable")
            };
        };
        let answer = serde_json::to_vec(&answer).expect("a Lambda response serializes");
        if answer.len() > MAX_SYNC_PAYLOAD {
            tracing::warn!(function = %function.name, bytes = answer.len(), "the function's response is over Lambda's limit");
            return message(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error");
        }
        response_v2(&answer)
    }
}

/// The route a request takes, its function, and its greedy path variable's name and value.
struct Matched<'a> {
    route: &'a Route,
    function: &'a Function,
    variable: Option<(String, String)>,
}

/// `/v1/{proxy+}` as `("/v1/", "proxy")`.
fn greedy(path: &str) -> Option<(&str, &str)> {
    let (prefix, variable) = path.rsplit_once('{')?;
    Some((prefix, variable.strip_suffix("+}")?))
}

/// A Function URL in `RESPONSE_STREAM` mode with `AuthType: NONE`.
pub struct StreamingUrl {
    /// The URL id (the host name's first label).
    pub url_id: String,
    pub function: Function,
}

impl StreamingUrl {
    /// One request: the response head once the function has written it, then its body as it
    /// comes, cut where it is when the invocation reaches its timeout.
    pub async fn invoke(&self, request: Request<Body>) -> Response<Body> {
        let deadline = tokio::time::Instant::now() + self.function.timeout;
        let (parts, body) = request.into_parts();
        let Ok(body) = axum::body::to_bytes(body, MAX_SYNC_PAYLOAD).await else {
            return message(StatusCode::PAYLOAD_TOO_LARGE, "Request Entity Too Large");
        };
        let Some(event) = within_sync_payload(event_v2(&parts, &body, "$default", &self.url_id)) else {
            return message(StatusCode::PAYLOAD_TOO_LARGE, "Request Entity Too Large");
        };
        let function = &self.function;
        // The adapter is not `Send` (it names the body type by reference), its future is: it is
        // called here and not held across an await. A router is always ready (axum), so no
        // `poll_ready` is owed first.
        let invocation = {
            let mut adapter = StreamAdapter::from(function.router.clone());
            lambda_http::Service::call(&mut adapter, LambdaEvent::new(event, function.context()))
        };
        let Ok(Ok::<_, Infallible>(streamed)) = tokio::time::timeout_at(deadline, invocation).await else {
            // A function error before the response began (Function URLs answer those 502).
            return message(StatusCode::BAD_GATEWAY, "Internal Server Error");
        };
        let prelude = streamed.metadata_prelude;
        let mut response = Response::new(Body::from_stream(until(deadline, streamed.stream)));
        *response.status_mut() = prelude.status_code;
        *response.headers_mut() = prelude.headers;
        for cookie in prelude.cookies {
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().append(axum::http::header::SET_COOKIE, value);
            }
        }
        response
    }
}

/// `body` until `deadline`, where it ends as a broken response (not a clean end: the client
/// must see that the function was stopped).
fn until<S, D, E>(
    deadline: tokio::time::Instant,
    body: S,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send
where
    S: futures_util::Stream<Item = Result<D, E>> + Send + 'static,
    D: Into<Bytes>,
    E: std::fmt::Debug,
{
    let cut = Box::pin(tokio::time::sleep_until(deadline));
    futures_util::stream::unfold(Some((Box::pin(body), cut)), |state| async move {
        let (mut body, mut cut) = state?;
        tokio::select! {
            item = body.next() => {
                let item = item?.map(Into::into).map_err(|e| std::io::Error::other(format!("{e:?}")));
                Some((item, Some((body, cut))))
            }
            () = &mut cut => Some((Err(std::io::Error::other("the function timed out")), None)),
        }
    })
}

/// The event as Lambda would hand it to the function, if it is within Lambda's payload limit.
fn within_sync_payload(event: Json) -> Option<LambdaRequest> {
    let size = serde_json::to_vec(&event).map(|e| e.len()).unwrap_or(usize::MAX);
    if size > MAX_SYNC_PAYLOAD {
        return None;
    }
    // The stand-in's events are AWS's format: one `lambda_http` cannot read is this code's bug.
    Some(
        serde_json::from_value(event)
            .unwrap_or_else(|e| panic!("lambda_http cannot read the 2.0 event: {e}")),
    )
}

/// The payload format 2.0 event of a request (the `time` display string is left out: only
/// `timeEpoch` is read by anything).
fn event_v2(parts: &Parts, body: &[u8], route_key: &str, api_id: &str) -> Json {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    let mut cookies = Vec::new();
    for (name, value) in &parts.headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        if name == axum::http::header::COOKIE {
            cookies.extend(value.split(';').map(str::trim).filter(|c| !c.is_empty()).map(str::to_owned));
            continue;
        }
        headers.entry(name.as_str().to_owned()).and_modify(|v| *v = format!("{v},{value}")).or_insert(value);
    }
    let domain = headers
        .get("host")
        .cloned()
        .unwrap_or_else(|| format!("{api_id}.execute-api.{REGION}.amazonaws.com"));
    headers.insert("x-forwarded-for".into(), "127.0.0.1".into());
    headers.insert("x-forwarded-proto".into(), "https".into());
    let raw_query = parts.uri.query().unwrap_or("");
    let mut parameters: BTreeMap<String, String> = BTreeMap::new();
    if let Ok(url) = reqwest::Url::parse(&format!("https://x/?{raw_query}")) {
        for (k, v) in url.query_pairs() {
            parameters
                .entry(k.into_owned())
                .and_modify(|p| *p = format!("{p},{v}"))
                .or_insert(v.into_owned());
        }
    }
    let now = now_ms();
    let mut event = json!({
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": parts.uri.path(),
        "rawQueryString": raw_query,
        "headers": headers,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": api_id,
            "domainName": domain,
            "domainPrefix": api_id,
            "http": {
                "method": parts.method.as_str(),
                "path": parts.uri.path(),
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": headers.get("user-agent").cloned().unwrap_or_default(),
            },
            "requestId": moto::unique("request"),
            "routeKey": route_key,
            "stage": "$default",
            "timeEpoch": now,
        },
        "isBase64Encoded": false,
    });
    if !cookies.is_empty() {
        event["cookies"] = json!(cookies);
    }
    if !parameters.is_empty() {
        event["queryStringParameters"] = json!(parameters);
    }
    if !body.is_empty() {
        match std::str::from_utf8(body) {
            Ok(text) => event["body"] = json!(text),
            Err(_) => {
                event["body"] = json!(BASE64.encode(body));
                event["isBase64Encoded"] = json!(true);
            }
        }
    }
    event
}

/// The HTTP response API Gateway makes of a 2.0 response.
fn response_v2(answer: &[u8]) -> Response<Body> {
    let Ok(Json::Object(answer)) = serde_json::from_slice::<Json>(answer) else {
        return message(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error");
    };
    let status = answer
        .get("statusCode")
        .and_then(Json::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok());
    let Some(status) = status else {
        return message(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error");
    };
    let text = answer.get("body").and_then(Json::as_str).unwrap_or("");
    let body = if answer.get("isBase64Encoded").and_then(Json::as_bool) == Some(true) {
        match BASE64.decode(text) {
            Ok(bytes) => bytes,
            Err(_) => return message(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error"),
        }
    } else {
        text.as_bytes().to_vec()
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in answer.get("headers").and_then(Json::as_object).unwrap_or(&Map::new()) {
        if let (Ok(name), Some(Ok(value))) =
            (HeaderName::try_from(name.as_str()), value.as_str().map(HeaderValue::from_str))
        {
            headers.insert(name, value);
        }
    }
    for cookie in answer.get("cookies").and_then(Json::as_array).into_iter().flatten() {
        if let Some(Ok(value)) = cookie.as_str().map(HeaderValue::from_str) {
            headers.append(axum::http::header::SET_COOKIE, value);
        }
    }
    response
}

/// An answer of API Gateway's own: `{"message": ...}`.
fn message(status: StatusCode, text: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(json!({ "message": text }).to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn now_ms() -> i64 {
    use turnstone_runtime::clock::{Clock, SystemClock};
    SystemClock.now().0
}

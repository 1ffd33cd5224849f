//! The `ahp` function: the Agent Host Protocol behind API Gateway's WebSocket API. Each
//! invocation is one event of one connection: `$connect` (the upgrade, authenticated by its
//! `Authorization` header or, without one, by the token a browser's WebSocket offers as a
//! subprotocol, `tkn.<token>`, or carries in the `tkn` query parameter; refused with 401, and
//! answered with `Sec-WebSocket-Protocol: ahp` when the client offered `ahp`, as API Gateway
//! needs to complete such a handshake), `$default` (one JSON-RPC message, answered through the
//! Management API) or `$disconnect`.

use std::sync::Arc;

use aws_lambda_events::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use aws_lambda_events::encodings::Body;
use turnstone_runtime::ahp::{ConnectError, Gateway, offers_subprotocol, subprotocol_token};
use turnstone_runtime::app::App;

/// Handles one WebSocket event; pushes its commits set off are done before it returns.
pub async fn handle(
    app: &App,
    gateway: &Gateway,
    request: ApiGatewayWebsocketProxyRequest,
) -> ApiGatewayProxyResponse {
    let context = &request.request_context;
    let Some(connection_id) = context.connection_id.as_deref() else {
        return answer(400, "not a WebSocket event: no requestContext.connectionId");
    };
    let route = context.route_key.as_deref().unwrap_or("$default");
    let response = match route {
        "$connect" => {
            let (authorization, token) = credentials(&request);
            match gateway.connect(connection_id, authorization, token).await {
                Ok(()) if offers_subprotocol(protocols(&request)) => {
                    let mut response = answer(200, "");
                    response.headers.insert(
                        "sec-websocket-protocol",
                        aws_lambda_events::http::HeaderValue::from_static(
                            turnstone_runtime::ahp::SUBPROTOCOL,
                        ),
                    );
                    response
                }
                Ok(()) => answer(200, ""),
                Err(ConnectError::Unauthorized(e)) => answer(401, &e.to_string()),
                Err(e @ ConnectError::TooManySockets { .. }) => answer(429, &e.to_string()),
                Err(e @ ConnectError::AuthNotConfigured) => answer(503, &e.to_string()),
                Err(e) => {
                    tracing::error!(connection_id, error = %e, "an AHP connection could not be recorded");
                    answer(500, "the connection could not be recorded")
                }
            }
        }
        "$disconnect" => match gateway.disconnect(connection_id).await {
            Ok(()) => answer(200, ""),
            Err(e) => {
                tracing::warn!(connection_id, error = %e, "an AHP connection's records could not be removed");
                answer(500, "")
            }
        },
        _ => {
            let body = request.body.as_deref().unwrap_or_default();
            match gateway.message(connection_id, body).await {
                Ok(()) => answer(200, ""),
                Err(e) => {
                    tracing::error!(connection_id, error = %e, "an AHP message could not be handled");
                    answer(500, "")
                }
            }
        }
    };
    app.notifier().flush().await;
    response
}

/// The upgrade's `Authorization` header and its token offered as a subprotocol or, without
/// one, in the `tkn` query parameter (the gateway prefers the header when both are there).
fn credentials(request: &ApiGatewayWebsocketProxyRequest) -> (Option<&str>, Option<&str>) {
    let authorization = request.headers.get("authorization").and_then(|v| v.to_str().ok());
    let token =
        subprotocol_token(protocols(request)).or_else(|| request.query_string_parameters.first("tkn"));
    (authorization, token)
}

/// The upgrade's `Sec-WebSocket-Protocol` values.
fn protocols(request: &ApiGatewayWebsocketProxyRequest) -> impl Iterator<Item = &str> {
    request.headers.get_all("sec-websocket-protocol").iter().filter_map(|v| v.to_str().ok())
}

fn answer(status: i64, body: &str) -> ApiGatewayProxyResponse {
    // Non-exhaustive: built from its default.
    let mut response = ApiGatewayProxyResponse::default();
    response.status_code = status;
    if !body.is_empty() {
        response.body = Some(Body::Text(body.to_owned()));
    }
    response
}

/// Runs the `ahp` function.
pub async fn run_ahp(app: Arc<App>, gateway: Arc<Gateway>) -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(lambda_runtime::service_fn(
        move |event: lambda_runtime::LambdaEvent<ApiGatewayWebsocketProxyRequest>| {
            let (app, gateway) = (Arc::clone(&app), Arc::clone(&gateway));
            async move {
                let response = handle(&app, &gateway, event.payload).await;
                crate::emit_metrics(&app);
                Ok::<_, lambda_runtime::Error>(response)
            }
        },
    ))
    .await
}

#[cfg(test)]
mod tests {
    // Test code: a failed unwrap is a failed test.
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A `$connect` event as API Gateway sends it, with `query` (`tkn=...`) on the upgrade's URL.
    fn connect(authorization: Option<&str>, query: &[(&str, &str)]) -> ApiGatewayWebsocketProxyRequest {
        let mut headers = serde_json::json!({"Host": "abc123.execute-api.us-east-1.amazonaws.com"});
        if let Some(authorization) = authorization {
            headers["Authorization"] = serde_json::json!(authorization);
        }
        let single: serde_json::Map<String, serde_json::Value> =
            query.iter().map(|(k, v)| ((*k).to_owned(), serde_json::json!(v))).collect();
        let multi: serde_json::Map<String, serde_json::Value> =
            query.iter().map(|(k, v)| ((*k).to_owned(), serde_json::json!([v]))).collect();
        serde_json::from_value(serde_json::json!({
            "headers": headers,
            "queryStringParameters": single,
            "multiValueQueryStringParameters": multi,
            "requestContext": {
                "routeKey": "$connect",
                "eventType": "CONNECT",
                "extendedRequestId": "Ab1CdEfGhIjKlMn=",
                "requestTime": "09/Feb/2025:10:00:00 +0000",
                "messageDirection": "IN",
                "stage": "dev",
                "connectedAt": 1739095200000_i64,
                "requestTimeEpoch": 1739095200123_i64,
                "identity": {"sourceIp": "203.0.113.7", "userAgent": "ahp-test"},
                "requestId": "Ab1CdEfGhIjKlMn=",
                "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
                "connectionId": "c1",
                "apiId": "abc123"
            },
            "isBase64Encoded": false
        }))
        .unwrap()
    }

    #[test]
    fn the_token_comes_from_the_header_or_the_tkn_parameter() {
        assert_eq!(credentials(&connect(Some("Bearer k1"), &[])), (Some("Bearer k1"), None));
        assert_eq!(credentials(&connect(None, &[("tkn", "k2")])), (None, Some("k2")));
        assert_eq!(
            credentials(&connect(Some("Bearer k1"), &[("tkn", "k2")])),
            (Some("Bearer k1"), Some("k2"))
        );
        assert_eq!(credentials(&connect(None, &[("other", "x")])), (None, None));
    }

    #[test]
    fn the_token_may_come_as_a_subprotocol_and_ahp_is_selected() {
        let mut request = connect(None, &[("tkn", "k2")]);
        request.headers.insert("sec-websocket-protocol", "ahp, tkn.k3".parse().unwrap());
        // The subprotocol's token before the query's.
        assert_eq!(credentials(&request), (None, Some("k3")));
        assert!(offers_subprotocol(protocols(&request)));
        let mut without = connect(None, &[]);
        without.headers.insert("sec-websocket-protocol", "tkn.k3".parse().unwrap());
        assert_eq!(credentials(&without), (None, Some("k3")));
        assert!(!offers_subprotocol(protocols(&without)), "only ahp is ever selected, never the token");
    }
}

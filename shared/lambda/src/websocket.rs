//! The `ahp` function: the Agent Host Protocol behind API Gateway's WebSocket API. Each
//! invocation is one event of one connection: `$connect` (the upgrade, authenticated by its
//! `Authorization` header; refused with 401), `$default` (one JSON-RPC message, answered through
//! the Management API) or `$disconnect`.

use std::sync::Arc;

use aws_lambda_events::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use aws_lambda_events::encodings::Body;
use turnstone_runtime::ahp::{ConnectError, Gateway};
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
            let authorization = request.headers.get("authorization").and_then(|v| v.to_str().ok());
            match gateway.connect(connection_id, authorization).await {
                Ok(()) => answer(200, ""),
                Err(ConnectError::Unauthorized(e)) => answer(401, &e.to_string()),
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

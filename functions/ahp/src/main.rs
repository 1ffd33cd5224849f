//! The `ahp` Lambda function: the Agent Host Protocol behind API Gateway's WebSocket API
//! (`$connect`, `$default`, `$disconnect`), connections and subscriptions recorded in the
//! table, frames out through the Management API.

use std::sync::Arc;

use turnstone_runtime::ahp::Gateway;

#[tokio::main]
async fn main() -> Result<(), turnstone_lambda::Error> {
    let started = turnstone_lambda::init_logging();
    let deployment = turnstone_aws::Deployment::from_env().await?;
    let Some(pushes) = deployment.ahp else {
        return Err(format!(
            "{} is not set (the template sets it)",
            turnstone_aws::deployment::AHP_ENDPOINT_VAR
        )
        .into());
    };
    let gateway = Arc::new(Gateway::new(pushes, &deployment.http));
    turnstone_lambda::ready(started);
    turnstone_lambda::websocket::run_ahp(deployment.engine.app, gateway).await
}

//! The `api` Lambda function: Turnstone's HTTP API behind API Gateway (client inputs, reads,
//! settles, cancels, long-polls), over DynamoDB and SQS.

#[tokio::main]
async fn main() -> Result<(), turnstone_lambda::Error> {
    let started = turnstone_lambda::init_logging();
    let deployment = turnstone_aws::Deployment::from_env().await?;
    turnstone_lambda::ready(started);
    turnstone_lambda::http::run_api(deployment.engine.app, deployment.http).await
}

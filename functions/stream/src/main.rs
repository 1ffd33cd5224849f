//! The `stream` Lambda function: a session's log as Server-Sent Events through a Function URL
//! with response streaming, following DynamoDB for what the dispatcher commits.

#[tokio::main]
async fn main() -> Result<(), turnstone_lambda::Error> {
    let started = turnstone_lambda::init_logging();
    let deployment = turnstone_aws::Deployment::from_env().await?;
    turnstone_lambda::ready(started);
    turnstone_lambda::http::run_stream(deployment.engine.app, deployment.http).await
}

//! The `sweep` Lambda function: on its schedule, enqueues the sessions whose wake time passed
//! (a lost wake-up, or a wait longer than SQS can delay).

#[tokio::main]
async fn main() -> Result<(), turnstone_lambda::Error> {
    let started = turnstone_lambda::init_logging();
    let deployment = turnstone_aws::Deployment::from_env().await?;
    turnstone_lambda::ready(started);
    turnstone_lambda::schedule::run_sweep(deployment.engine.dispatcher).await
}

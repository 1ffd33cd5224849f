//! The `dispatch` Lambda function: runs the sessions that a batch of SQS wake-ups names
//! (model calls, worker deliveries, timers, sub-agents), reporting failed records alone.

#[tokio::main]
async fn main() -> Result<(), turnstone_lambda::Error> {
    let started = turnstone_lambda::init_logging();
    let deployment = turnstone_aws::Deployment::from_env().await?;
    turnstone_lambda::ready(started);
    turnstone_lambda::sqs::run_dispatch(deployment.engine.dispatcher, deployment.queue, deployment.ahp).await
}

//! Turnstone's AWS adapters (DESIGN.md section 2): [`DynamoStore`], the `Store` port on one
//! DynamoDB table, and [`SqsQueue`], the `Queue` and `Consumer` ports on an SQS standard queue,
//! and what a Lambda function builds from its environment ([`Deployment`]).
//!
//! - `config`: where to connect, and the SDK clients from the usual AWS environment.
//! - `items`: the single-table layout (keys, attributes); `commit`: what one commit writes;
//!   `chunks`: payloads too large for one item; `table`: the indexes, creating the table;
//!   `batch`: reads by key; `store`: the port itself.
//! - `queue`: the SQS queue; `schedule`: wake-ups beyond its 15-minute delay, as EventBridge
//!   Scheduler one-time schedules.
//! - `connections`: AHP WebSocket connections and their chat subscriptions in the table;
//!   `management`: frames to them through API Gateway's Management API.
//! - `deployment`: what a Lambda function builds at init (settings, configuration from SSM,
//!   secrets from Secrets Manager, the engine on the table and the queue).

mod batch;
mod chunks;
mod commit;
pub mod config;
pub mod connections;
pub mod deployment;
mod error;
mod items;
pub mod management;
#[cfg(feature = "moto")]
pub mod moto;
pub mod queue;
pub mod schedule;
pub mod store;
pub mod table;

pub use config::{AwsClients, AwsConfig, DEFAULT_QUEUE, DEFAULT_TABLE};
pub use connections::DynamoRegistry;
pub use deployment::{Deployment, DeploymentError, Settings};
pub use error::AwsError;
pub use management::ManagementFrames;
pub use queue::{LEASE, QueueSettings, SqsQueue};
pub use schedule::Scheduler;
pub use store::DynamoStore;

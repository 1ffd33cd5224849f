//! Where the AWS adapters connect: the table, the queue, and the SDK clients built from the
//! usual AWS environment (credentials and region from the environment, the profile, or the
//! instance/Lambda role), with an endpoint override for a local stand-in such as moto.

use aws_config::{BehaviorVersion, ConfigLoader, Region, SdkConfig};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

use turnstone_runtime::config::AwsBackend;

use crate::error::AwsError;
use crate::queue::{QueueSettings, SqsQueue, is_url};
use crate::store::DynamoStore;

/// The table's and the wake-up queue's default names (those of `[server.aws]`).
pub use turnstone_runtime::config::{DEFAULT_AWS_QUEUE as DEFAULT_QUEUE, DEFAULT_AWS_TABLE as DEFAULT_TABLE};

/// How to reach the table and the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsConfig {
    /// Sends every request there instead of AWS (e.g. `http://127.0.0.1:5000` for moto).
    pub endpoint_url: Option<String>,
    /// The region; `None`: from the environment (`AWS_REGION`) or the profile.
    pub region: Option<String>,
    /// The DynamoDB table's name.
    pub table: String,
    /// The SQS queue's name or URL.
    pub queue: String,
}

impl Default for AwsConfig {
    fn default() -> Self {
        AwsConfig {
            endpoint_url: None,
            region: None,
            table: DEFAULT_TABLE.to_owned(),
            queue: DEFAULT_QUEUE.to_owned(),
        }
    }
}

/// The SDK clients the adapters use.
#[derive(Debug, Clone)]
pub struct AwsClients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
}

impl AwsClients {
    /// Clients from a loaded SDK configuration.
    pub fn new(sdk: &SdkConfig) -> Self {
        AwsClients { dynamodb: aws_sdk_dynamodb::Client::new(sdk), sqs: aws_sdk_sqs::Client::new(sdk) }
    }
}

impl From<&AwsBackend> for AwsConfig {
    fn from(backend: &AwsBackend) -> Self {
        AwsConfig {
            endpoint_url: backend.endpoint_url.clone(),
            region: backend.region.clone(),
            table: backend.table.clone(),
            queue: backend.queue.clone(),
        }
    }
}

impl AwsConfig {
    /// The SDK's configuration loader with this config's endpoint and region applied and the
    /// HTTPS client on rustls (ring); credentials come from the default chain unless the
    /// caller sets them on the loader (tests set static ones for moto).
    pub fn loader(&self) -> ConfigLoader {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(http);
        if let Some(url) = &self.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        loader
    }

    /// The SDK clients from the usual AWS environment.
    pub async fn clients(&self) -> AwsClients {
        AwsClients::new(&self.loader().load().await)
    }

    /// The store on the table and the queue, through `clients` (the queue's URL is looked up
    /// when a name is configured).
    pub async fn connect_with(&self, clients: &AwsClients) -> Result<(DynamoStore, SqsQueue), AwsError> {
        let store = DynamoStore::new(clients.dynamodb.clone(), self.table.clone());
        let queue = SqsQueue::open(clients.sqs.clone(), &self.queue).await?;
        Ok((store, queue))
    }

    /// The store and the queue through `clients`, creating the table and the queue (with
    /// `queue_settings`) first when `create` is set and they are missing.
    pub async fn open(
        &self,
        clients: &AwsClients,
        create: bool,
        queue_settings: &QueueSettings,
    ) -> Result<(DynamoStore, SqsQueue), AwsError> {
        if create {
            crate::table::create_table(&clients.dynamodb, &self.table).await?;
            if !is_url(&self.queue) {
                SqsQueue::create_queue(&clients.sqs, &self.queue, queue_settings).await?;
            }
        }
        self.connect_with(clients).await
    }

    /// The store and the queue, with clients from the usual AWS environment.
    pub async fn connect(&self) -> Result<(DynamoStore, SqsQueue), AwsError> {
        self.connect_with(&self.clients().await).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_name_the_table_and_queue() {
        let config = AwsConfig::default();
        assert_eq!((config.table.as_str(), config.queue.as_str()), ("turnstone", "turnstone-wakeups"));
        assert_eq!((config.endpoint_url, config.region), (None, None));
    }
}

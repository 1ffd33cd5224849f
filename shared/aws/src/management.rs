//! Frames to AHP connections through API Gateway's Management API (`PostToConnection`,
//! `POST /@connections/{id}` with the frame as the body; `DeleteConnection` to close one whose
//! token expired): the WebSocket API's connections
//! reached from any function that has `execute-api:ManageConnections` on it.

use async_trait::async_trait;
use aws_config::SdkConfig;
use aws_sdk_apigatewaymanagement::Client;
use aws_sdk_apigatewaymanagement::primitives::Blob;
use turnstone_runtime::ahp::registry::{Frames, Posted, RegistryError};

/// The largest message API Gateway's WebSocket API takes (128 KB; it cuts messages into 32 KB
/// frames on the wire itself).
pub const MAX_MESSAGE: usize = 128 * 1024;

/// The Management API of one WebSocket API stage.
#[derive(Debug, Clone)]
pub struct ManagementFrames {
    client: Client,
}

impl ManagementFrames {
    /// Posts through the stage at `endpoint` (`https://{api id}.execute-api.{region}.amazonaws.com/{stage}`).
    pub fn new(sdk: &SdkConfig, endpoint: &str) -> Self {
        let config = aws_sdk_apigatewaymanagement::config::Builder::from(sdk).endpoint_url(endpoint).build();
        ManagementFrames { client: Client::from_conf(config) }
    }
}

#[async_trait]
impl Frames for ManagementFrames {
    async fn post(&self, id: &str, frame: &str) -> Result<Posted, RegistryError> {
        let posted =
            self.client.post_to_connection().connection_id(id).data(Blob::new(frame.as_bytes())).send().await;
        match posted {
            Ok(_) => Ok(Posted::Sent),
            // 410 Gone: the client left (its `$disconnect` may still be on its way).
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 410) => Ok(Posted::Gone),
            Err(e) => Err(RegistryError(format!(
                "PostToConnection {id} failed: {}",
                aws_sdk_apigatewaymanagement::error::DisplayErrorContext(e)
            ))),
        }
    }

    fn max_frame(&self) -> usize {
        MAX_MESSAGE
    }

    /// `DeleteConnection` (`DELETE /@connections/{id}`): API Gateway closes the socket. One
    /// that is gone already (410) is closed.
    async fn close(&self, id: &str) -> Result<(), RegistryError> {
        match self.client.delete_connection().connection_id(id).send().await {
            Ok(_) => Ok(()),
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 410) => Ok(()),
            Err(e) => Err(RegistryError(format!(
                "DeleteConnection {id} failed: {}",
                aws_sdk_apigatewaymanagement::error::DisplayErrorContext(e)
            ))),
        }
    }
}

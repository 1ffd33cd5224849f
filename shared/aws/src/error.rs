//! The AWS adapters' own failures. Behind the `Store` port they travel as
//! `StoreError::Backend`, behind the queue ports as `QueueError::Backend`, with this error as
//! the source; each names what failed and for which session, table or queue.

use turnstone_runtime::queue::QueueError;
use turnstone_runtime::store::StoreError;

/// What can go wrong talking to DynamoDB or SQS.
#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    /// A DynamoDB request about one session failed.
    #[error("DynamoDB {operation} for session {session_id} on table {table} failed: {message}")]
    Session {
        /// The request, e.g. `TransactWriteItems (commit)`.
        operation: &'static str,
        session_id: String,
        table: String,
        /// The SDK's error with its context (code, message, request id).
        message: String,
    },
    /// A DynamoDB request about the table as a whole (listing, due work, creating it) failed.
    #[error("DynamoDB {operation} on table {table} failed: {message}")]
    Table { operation: &'static str, table: String, message: String },
    /// An SQS request failed.
    #[error("SQS {operation} on queue {queue} failed: {message}")]
    Queue { operation: &'static str, queue: String, message: String },
    /// A commit needs more than one DynamoDB transaction can hold; nothing was written.
    #[error(
        "the commit of session {session_id} does not fit in one DynamoDB transaction: {reason}; \
         nothing was written"
    )]
    CommitTooLarge {
        session_id: String,
        /// Which limit, and by how much.
        reason: String,
    },
    /// The caller handed over a commit that contradicts itself.
    #[error("invalid commit for session {session_id}: {message}")]
    InvalidCommit { session_id: String, message: String },
    /// A session could not be serialized.
    #[error("cannot serialize session {session_id}: {source}")]
    Serialize {
        session_id: String,
        #[source]
        source: serde_json::Error,
    },
    /// The head of a session changed between reading it and reading its chunks, every time.
    #[error("the head of session {session_id} kept changing while it was read ({attempts} attempts)")]
    HeadKeptChanging { session_id: String, attempts: u32 },
    /// A wake-up could not be scheduled with EventBridge Scheduler.
    #[error("EventBridge Scheduler CreateSchedule of {name} failed: {message}")]
    Schedule { name: String, message: String },
    /// A request could not be built (a field the SDK requires was missing).
    #[error("cannot build the {what} request: {message}")]
    Build { what: &'static str, message: String },
}

impl From<AwsError> for StoreError {
    fn from(err: AwsError) -> Self {
        StoreError::Backend(Box::new(err))
    }
}

impl From<AwsError> for QueueError {
    fn from(err: AwsError) -> Self {
        QueueError::Backend(Box::new(err))
    }
}

/// An SDK error as one line with its context (error code, message, request id).
pub(crate) fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    aws_sdk_dynamodb::error::DisplayErrorContext(err).to_string()
}

/// A request builder's missing field as an error.
pub(crate) fn build_error(
    what: &'static str,
) -> impl FnOnce(aws_sdk_dynamodb::error::BuildError) -> AwsError {
    move |err| AwsError::Build { what, message: err.to_string() }
}

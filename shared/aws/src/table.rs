//! The table: its key schema and secondary indexes, and creating it (for tests and for a host
//! started with `--create`; `infra/template.yaml`'s `SessionsTable` declares the same).
//!
//! Heads carry the listing indexes' attributes, written at creation and never changed, so
//! those indexes hold one entry per session:
//! - `by-owner` (`owner`, `created_key`), projecting `agent`: a caller's sessions, newest first
//!   (filtered by agent when both are asked for).
//! - `by-agent` (`agent`, `created_key`): an agent's sessions.
//! - `by-created` (`list_shard`, `created_key`): every session; `list_shard` is one of 8 (a
//!   stable hash of the session id), so creations spread over 8 partitions; a listing queries
//!   each, and `all` (heads written before the shards), and merges them newest first.
//! - `due` (`due_shard`, `wake_key`), sparse and on packs: only a pack whose wake time no queued
//!   wake-up covers carries its keys; an entry with a newer pack after it is out of date, and
//!   `due` takes it out (see the store).
//!
//! All four project only keys (and `agent`). A listing reads the heads it found for agent,
//! owner and creation time, and each session's latest pack for its version and last write.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, IndexStatus, KeySchemaElement, KeyType,
    Projection, ProjectionType, ScalarAttributeType, TableStatus,
};

use crate::error::{AwsError, build_error, describe};
use crate::items::{AGENT, CREATED_KEY, DUE_SHARD, LIST_SHARD, OWNER, PK, SK, WAKE_KEY};

/// Sessions by owner, newest first.
pub const BY_OWNER: &str = "by-owner";
/// Sessions by agent, newest first.
pub const BY_AGENT: &str = "by-agent";
/// Every session, newest first.
pub const BY_CREATED: &str = "by-created";
/// Heads with a wake time, soonest first.
pub const DUE: &str = "due";

/// How long [`create_table`] waits for the table to become active.
const ACTIVE_WITHIN: Duration = Duration::from_secs(300);

fn key(name: &str, kind: KeyType) -> Result<KeySchemaElement, AwsError> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .map_err(build_error("CreateTable"))
}

fn index(name: &str, hash: &str, range: &str, include: &[&str]) -> Result<GlobalSecondaryIndex, AwsError> {
    let projection = if include.is_empty() {
        Projection::builder().projection_type(ProjectionType::KeysOnly).build()
    } else {
        let mut p = Projection::builder().projection_type(ProjectionType::Include);
        for attribute in include {
            p = p.non_key_attributes(*attribute);
        }
        p.build()
    };
    GlobalSecondaryIndex::builder()
        .index_name(name)
        .key_schema(key(hash, KeyType::Hash)?)
        .key_schema(key(range, KeyType::Range)?)
        .projection(projection)
        .build()
        .map_err(build_error("CreateTable"))
}

/// Creates `table` on demand (pay per request) with the store's key schema and indexes, and
/// waits until it and its indexes are active. A table that exists already is left as it is.
pub async fn create_table(client: &Client, table: &str) -> Result<(), AwsError> {
    let failed = |operation: &'static str, message: String| AwsError::Table {
        operation,
        table: table.to_owned(),
        message,
    };
    let mut request = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(key(PK, KeyType::Hash)?)
        .key_schema(key(SK, KeyType::Range)?)
        .global_secondary_indexes(index(BY_OWNER, OWNER, CREATED_KEY, &[AGENT])?)
        .global_secondary_indexes(index(BY_AGENT, AGENT, CREATED_KEY, &[])?)
        .global_secondary_indexes(index(BY_CREATED, LIST_SHARD, CREATED_KEY, &[])?)
        .global_secondary_indexes(index(DUE, DUE_SHARD, WAKE_KEY, &[])?);
    for name in [PK, SK, OWNER, AGENT, CREATED_KEY, LIST_SHARD, DUE_SHARD, WAKE_KEY] {
        let definition = AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(build_error("CreateTable"))?;
        request = request.attribute_definitions(definition);
    }
    match request.send().await {
        Ok(_) => tracing::info!(table, "created the sessions table"),
        Err(err) if err.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => {
            tracing::debug!(table, "the sessions table exists already");
        }
        Err(err) => return Err(failed("CreateTable", describe(&err))),
    }
    let deadline = tokio::time::Instant::now() + ACTIVE_WITHIN;
    loop {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|err| failed("DescribeTable", describe(&err)))?;
        let active = described.table().is_some_and(|t| {
            t.table_status() == Some(&TableStatus::Active)
                && t.global_secondary_indexes().iter().all(|i| i.index_status() == Some(&IndexStatus::Active))
        });
        if active {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(failed("DescribeTable", format!("not active after {ACTIVE_WITHIN:?}")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

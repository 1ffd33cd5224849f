//! Items by key in batches: reading (`BatchGetItem`, 100 keys a request) and writing
//! (`BatchWriteItem`, 25 puts or deletes a request), retrying what DynamoDB leaves unprocessed
//! (it may return part of a batch when throttled or past its size limits).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{KeysAndAttributes, WriteRequest};

use crate::error::describe;
use crate::items::{Item, PK, SK, get_s};

/// The most keys one `BatchGetItem` takes.
const MAX_KEYS: usize = 100;
/// The most requests one `BatchWriteItem` takes.
const MAX_WRITES: usize = 25;

/// How many times unprocessed keys are asked for again before giving up.
const ROUNDS: u32 = 10;

/// The items at `keys` in `table` that exist (in no particular order), with only `attributes`
/// (all when empty). Consistent reads see every commit that returned before the read began.
/// The error is the SDK's, described.
pub(crate) async fn get(
    client: &Client,
    table: &str,
    keys: Vec<Item>,
    attributes: &[&str],
    consistent: bool,
) -> Result<Vec<Item>, String> {
    let mut seen = HashSet::new();
    let keys: Vec<Item> = keys
        .into_iter()
        .filter(|k| seen.insert((get_s(k, PK).map(str::to_owned), get_s(k, SK).map(str::to_owned))))
        .collect();
    let mut found = Vec::with_capacity(keys.len());
    for batch in keys.chunks(MAX_KEYS) {
        let mut pending = Some(request(batch.to_vec(), attributes, consistent)?);
        let mut round = 0;
        while let Some(wanted) = pending.take() {
            if round > 0 {
                tokio::time::sleep(backoff(round)).await;
            }
            if round == ROUNDS {
                return Err(format!(
                    "{} keys were still unprocessed after {ROUNDS} attempts (throttled)",
                    wanted.keys().len()
                ));
            }
            round += 1;
            let out = client
                .batch_get_item()
                .request_items(table, wanted)
                .send()
                .await
                .map_err(|err| describe(&err))?;
            if let Some(mut responses) = out.responses {
                found.extend(responses.remove(table).unwrap_or_default());
            }
            pending = out.unprocessed_keys.and_then(|mut u| u.remove(table)).filter(|k| !k.keys().is_empty());
        }
    }
    Ok(found)
}

/// Performs `writes` (puts and deletes, each unconditional, no two on one key) in `table`.
/// The error is the SDK's, described; the writes before it stand.
pub(crate) async fn write(client: &Client, table: &str, writes: Vec<WriteRequest>) -> Result<(), String> {
    for batch in writes.chunks(MAX_WRITES) {
        let mut pending = batch.to_vec();
        let mut round = 0;
        while !pending.is_empty() {
            if round > 0 {
                tokio::time::sleep(backoff(round)).await;
            }
            if round == ROUNDS {
                return Err(format!(
                    "{} writes were still unprocessed after {ROUNDS} attempts (throttled)",
                    pending.len()
                ));
            }
            round += 1;
            let out = client
                .batch_write_item()
                .request_items(table, std::mem::take(&mut pending))
                .send()
                .await
                .map_err(|err| describe(&err))?;
            pending = out.unprocessed_items.and_then(|mut u| u.remove(table)).unwrap_or_default();
        }
    }
    Ok(())
}

fn request(keys: Vec<Item>, attributes: &[&str], consistent: bool) -> Result<KeysAndAttributes, String> {
    let mut builder = KeysAndAttributes::builder().set_keys(Some(keys)).consistent_read(consistent);
    if !attributes.is_empty() {
        let names: HashMap<String, String> =
            attributes.iter().enumerate().map(|(i, a)| (format!("#a{i}"), (*a).to_owned())).collect();
        let projection = (0..attributes.len()).map(|i| format!("#a{i}")).collect::<Vec<_>>().join(", ");
        builder = builder.projection_expression(projection).set_expression_attribute_names(Some(names));
    }
    builder.build().map_err(|err| err.to_string())
}

/// 50 ms, doubling, at most 2 s.
fn backoff(round: u32) -> Duration {
    Duration::from_millis(50u64.saturating_mul(1 << round.min(6))).min(Duration::from_secs(2))
}

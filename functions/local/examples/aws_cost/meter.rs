//! What the SDK really sends, metered: an interceptor on the DynamoDB and SQS clients that
//! counts requests by operation (the `X-Amz-Target` header) and prices every DynamoDB request
//! in capacity units from its JSON body and the JSON answer, by DynamoDB's billing rules
//! (developer guide: "Item sizes and formats", "Read/write capacity mode", "Global secondary
//! indexes: writes"):
//!
//! - **Item size**: per attribute, the UTF-8 bytes of its name plus its value: a string's
//!   UTF-8 bytes; a number 1 byte per two significant digits plus 1; a binary its raw bytes
//!   (base64 on the wire); a boolean or null 1; a list or map 3 bytes plus, per element, 1
//!   byte and the element (and a map element's name); a set the sum of its elements.
//! - **Writes**: 1 unit per started KB of the larger of the item before and after, per item;
//!   twice that for an item of a `TransactWriteItems`.
//! - **Reads**, strongly consistent (an eventually consistent read costs half): `GetItem` one
//!   unit per started 4 KB of the item (1 when there is none); `BatchGetItem` the same per item;
//!   `Query` and `Scan` the total of the items returned, rounded up to 4 KB, at least 1 unit. A
//!   read is charged on the whole item, whatever it projects, so the size of a table item comes
//!   from what was written there.
//! - **Index writes**: a table write that adds an entry to a global secondary index costs one
//!   write there, one that removes it one, one that changes its keys two (delete and put), one
//!   that changes only projected attributes one, one that changes none of them nothing; an
//!   entry's size is its key attributes, the table's key and the projected attributes plus 100
//!   bytes. Assumption: an index write is billed at the standard rate also when the table write
//!   was transactional (indexes are updated after the transaction, not inside it).
//!
//! A failed request (not 2xx) is counted as such and priced at nothing (DynamoDB does charge a
//! failed conditional write; the runs are expected to have none, and the report shows them).

// Shared by two examples (`aws_cost`, `long_session`); each uses part.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use serde_json::{Map, Value};

/// The interceptor's error type (the SDK's `BoxError`).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

// On-demand list prices, us-east-1, as DESIGN.md section 5 gives them ("as last seen
// published"). CHECK THEM against aws.amazon.com/dynamodb/pricing/on-demand/,
// aws.amazon.com/sqs/pricing/ and aws.amazon.com/lambda/pricing/ before quoting a figure.
/// DynamoDB, $ per write request unit (1 KB; 2 units per KB inside a transaction).
pub const DYNAMODB_WRITE_UNIT: f64 = 0.625 / 1e6;
/// DynamoDB, $ per read request unit (a strongly consistent read of 4 KB; eventual: half).
pub const DYNAMODB_READ_UNIT: f64 = 0.125 / 1e6;
/// SQS standard queue, $ per request (each 64 KB of payload is a request), past the free tier.
pub const SQS_REQUEST: f64 = 0.40 / 1e6;
/// Lambda, $ per invocation.
pub const LAMBDA_REQUEST: f64 = 0.20 / 1e6;
/// Lambda (x86), $ per GB-second of duration, billed per started millisecond.
pub const LAMBDA_GB_SECOND: f64 = 0.000_016_666_7;

/// Bytes per write unit and per read unit.
const WRITE_UNIT_BYTES: u64 = 1024;
const READ_UNIT_BYTES: u64 = 4096;
/// What an index entry weighs beyond its attributes.
const INDEX_ENTRY_OVERHEAD: u64 = 100;

/// What a written item is, by its sort key (`shared/aws/src/items.rs`), or an index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `H`: the head.
    Head,
    /// `E#<seq>`: an event pack.
    Events,
    /// `M#<pos>`: a message node.
    Messages,
    /// `T#<turn>`, `C#<call>`: a used id.
    UsedIds,
    /// `B#<item>#<n>`: a chunk of a large payload.
    Chunks,
    /// Any other sort key.
    Other,
    /// An entry of a global secondary index.
    Index,
}

impl Kind {
    /// Every kind, in the order reports print them.
    pub const ALL: [Kind; 7] =
        [Kind::Head, Kind::Events, Kind::Messages, Kind::UsedIds, Kind::Chunks, Kind::Other, Kind::Index];

    /// The kind of the table item with sort key `sk`.
    pub fn of(sk: &str) -> Kind {
        match sk {
            "H" => Kind::Head,
            _ if sk.starts_with("E#") => Kind::Events,
            _ if sk.starts_with("M#") => Kind::Messages,
            _ if sk.starts_with("T#") || sk.starts_with("C#") => Kind::UsedIds,
            _ if sk.starts_with("B#") => Kind::Chunks,
            _ => Kind::Other,
        }
    }

    /// A short column label.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Head => "head",
            Kind::Events => "events",
            Kind::Messages => "messages",
            Kind::UsedIds => "used ids",
            Kind::Chunks => "chunks",
            Kind::Other => "other",
            Kind::Index => "index",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sizes and units
// ---------------------------------------------------------------------------------------------

/// `n / d` rounded up.
fn ceil_div(n: u64, d: u64) -> u64 {
    n.div_ceil(d)
}

/// Write units of one item write: 1 per started KB of the larger of the item before and after
/// (at least 1), twice inside a transaction.
pub fn write_units(before: u64, after: u64, transactional: bool) -> u64 {
    let units = ceil_div(before.max(after), WRITE_UNIT_BYTES).max(1);
    if transactional { 2 * units } else { units }
}

/// Read units of `bytes` read as one read (a `GetItem`'s item, one item of a `BatchGetItem`,
/// all items of a `Query` page), in **half units**: 1 unit per started 4 KB, at least 1,
/// halved when eventually consistent.
pub fn read_halves(bytes: u64, consistent: bool) -> u64 {
    let units = ceil_div(bytes, READ_UNIT_BYTES).max(1);
    if consistent { 2 * units } else { units }
}

/// The bytes DynamoDB counts for a number given as its decimal text: 1 per two significant
/// digits (leading and trailing zeros trimmed, sign, point and exponent left out), plus 1.
pub fn number_size(text: &str) -> u64 {
    let mantissa = text.split(['e', 'E']).next().unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len() as u64;
    ceil_div(significant, 2) + 1
}

/// The raw length of base64 `text` (how DynamoDB counts a binary value).
fn base64_len(text: &str) -> u64 {
    let padding = text.bytes().rev().take_while(|b| *b == b'=').count() as u64;
    (text.len() as u64 / 4 * 3).saturating_sub(padding)
}

/// The size of one attribute value in DynamoDB JSON (`{"S": "..."}`, `{"N": "1"}`, ...).
pub fn value_size(value: &Value) -> u64 {
    let Some((kind, inner)) = value.as_object().and_then(|o| o.iter().next()) else { return 0 };
    let strs = || inner.as_array().into_iter().flatten().filter_map(Value::as_str);
    match (kind.as_str(), inner) {
        ("S", Value::String(s)) => s.len() as u64,
        ("N", Value::String(s)) => number_size(s),
        ("B", Value::String(s)) => base64_len(s),
        ("BOOL" | "NULL", _) => 1,
        ("SS", _) => strs().map(|s| s.len() as u64).sum(),
        ("NS", _) => strs().map(number_size).sum(),
        ("BS", _) => strs().map(base64_len).sum(),
        ("L", Value::Array(items)) => 3 + items.iter().map(|v| 1 + value_size(v)).sum::<u64>(),
        ("M", Value::Object(map)) => {
            3 + map.iter().map(|(k, v)| 1 + k.len() as u64 + value_size(v)).sum::<u64>()
        }
        _ => 0,
    }
}

/// The size of an item in DynamoDB JSON: its attribute names plus their values.
pub fn item_size(item: &Map<String, Value>) -> u64 {
    item.iter().map(|(name, value)| name.len() as u64 + value_size(value)).sum()
}

/// A string attribute of an item in DynamoDB JSON.
fn get_s<'a>(item: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    item.get(name)?.get("S")?.as_str()
}

// ---------------------------------------------------------------------------------------------
// What was counted
// ---------------------------------------------------------------------------------------------

/// Everything counted while the meter was on.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Successful `Store::commit` calls (counted by the store decorator): the steps.
    pub commits: u64,
    /// DynamoDB requests by operation.
    pub dynamodb: BTreeMap<String, u64>,
    /// SQS requests by operation (what the engine sends; the event source's are modelled).
    pub sqs: BTreeMap<String, u64>,
    /// Requests that failed, by operation.
    pub failed: BTreeMap<String, u64>,
    /// Requests of operations whose units this meter does not price, by operation.
    pub unpriced: BTreeMap<String, u64>,
    /// Write units by what was written.
    pub write_units: BTreeMap<Kind, u64>,
    /// Item bytes written (DynamoDB's item size) by what was written.
    pub written_bytes: BTreeMap<Kind, u64>,
    /// Items written by kind.
    pub items_written: BTreeMap<Kind, u64>,
    /// The largest item written, by kind.
    pub largest: BTreeMap<Kind, u64>,
    /// Read units, in halves.
    pub read_halves: u64,
    /// Item bytes read (as charged: whole items).
    pub read_bytes: u64,
    /// How long the clients waited for the answers, from sending a request to its answer
    /// read (the server's time and the loopback's).
    pub waited: Duration,
}

impl Tally {
    /// DynamoDB write requests.
    pub fn write_requests(&self) -> u64 {
        self.dynamodb.iter().filter(|(op, _)| is_write(op)).map(|(_, n)| n).sum()
    }

    /// DynamoDB read requests.
    pub fn read_requests(&self) -> u64 {
        self.dynamodb.iter().filter(|(op, _)| !is_write(op)).map(|(_, n)| n).sum()
    }

    /// All write units (table and indexes).
    pub fn total_write_units(&self) -> u64 {
        self.write_units.values().sum()
    }

    /// Read units (whole units, possibly .5).
    pub fn read_units(&self) -> f64 {
        self.read_halves as f64 / 2.0
    }

    /// Item bytes written, all kinds.
    pub fn total_written_bytes(&self) -> u64 {
        self.written_bytes.values().sum()
    }

    fn add_write(&mut self, kind: Kind, bytes: u64, units: u64) {
        *self.write_units.entry(kind).or_default() += units;
        *self.written_bytes.entry(kind).or_default() += bytes;
        *self.items_written.entry(kind).or_default() += 1;
        let largest = self.largest.entry(kind).or_default();
        *largest = (*largest).max(bytes);
    }
}

/// Whether a DynamoDB operation writes.
pub fn is_write(op: &str) -> bool {
    matches!(
        op,
        "TransactWriteItems"
            | "PutItem"
            | "UpdateItem"
            | "DeleteItem"
            | "BatchWriteItem"
            | "ExecuteStatement"
    )
}

/// A global secondary index, as `DescribeTable` tells it.
#[derive(Debug, Clone)]
pub struct Index {
    pub name: String,
    pub hash: String,
    pub range: Option<String>,
    /// Non-key attributes it projects (`INCLUDE`); `None`: all of them (`ALL`).
    pub projected: Option<Vec<String>>,
}

/// What the meter remembers of an item in the table: its size and its entry in each index (in
/// the order of the meter's indexes), what the next write of the item is priced against. Not
/// the item itself: a long session writes a thousand times its state, and a meter holding every
/// item slowed the process it measures as the table grew.
#[derive(Debug)]
struct Stored {
    size: u64,
    entries: Vec<Option<Entry>>,
}

/// A table item's key, `(PK, SK)`.
type Key = (String, String);

fn key_of(item: &Map<String, Value>) -> Option<Key> {
    Some((get_s(item, "PK")?.to_owned(), get_s(item, "SK")?.to_owned()))
}

/// An item's entry in an index: its key values, its projected attributes, its size.
#[derive(Debug, PartialEq)]
struct Entry {
    keys: Vec<Value>,
    projected: Vec<(String, Value)>,
    size: u64,
}

impl Index {
    /// The entry `item` has in this index, if any.
    fn entry(&self, item: &Map<String, Value>) -> Option<Entry> {
        let hash = item.get(&self.hash)?;
        let mut keys = vec![hash.clone()];
        let mut size = self.hash.len() as u64 + value_size(hash) + INDEX_ENTRY_OVERHEAD;
        if let Some(range) = &self.range {
            let value = item.get(range)?;
            keys.push(value.clone());
            size += range.len() as u64 + value_size(value);
        }
        for table_key in ["PK", "SK"] {
            if let Some(value) = item.get(table_key) {
                size += table_key.len() as u64 + value_size(value);
            }
        }
        let is_key = |name: &str| {
            name == "PK" || name == "SK" || name == self.hash || Some(name) == self.range.as_deref()
        };
        let projected: Vec<(String, Value)> = item
            .iter()
            .filter(|(name, _)| !is_key(name))
            .filter(|(name, _)| self.projected.as_ref().is_none_or(|p| p.contains(name)))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        size += projected.iter().map(|(n, v)| n.len() as u64 + value_size(v)).sum::<u64>();
        Some(Entry { keys, projected, size })
    }

    /// Index write units (and entry bytes) of replacing entry `before` by `after` (either may
    /// be absent).
    fn write_units(before: Option<&Entry>, after: Option<&Entry>) -> (u64, u64) {
        let units = |size: u64| ceil_div(size, WRITE_UNIT_BYTES).max(1);
        match (before, after) {
            (None, None) => (0, 0),
            (None, Some(entry)) | (Some(entry), None) => (units(entry.size), entry.size),
            // New keys: the old entry is deleted and the new one put.
            (Some(old), Some(new)) if old.keys != new.keys => {
                (units(old.size) + units(new.size), old.size + new.size)
            }
            (Some(old), Some(new)) if old.projected != new.projected => (units(new.size), new.size),
            (Some(_), Some(_)) => (0, 0),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The meter
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct State {
    counting: bool,
    tally: Tally,
    /// Every item written through the meter (while counting or not), by key.
    stored: HashMap<Key, Stored>,
    indexes: Vec<Index>,
    trace: bool,
    lines: Vec<String>,
}

/// Counts and prices what the SDK clients it is installed on send (see the module docs).
#[derive(Default)]
pub struct Meter {
    state: Mutex<State>,
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter").finish_non_exhaustive()
    }
}

impl Meter {
    /// A meter for a table with `indexes`; with `trace`, it describes every counted request.
    pub fn new(indexes: Vec<Index>, trace: bool) -> Arc<Meter> {
        Arc::new(Meter { state: Mutex::new(State { indexes, trace, ..State::default() }) })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere leaves counts that are still counts.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts counting afresh.
    pub fn start(&self) {
        let mut state = self.lock();
        state.counting = true;
        state.tally = Tally::default();
        state.lines.clear();
    }

    /// Stops counting; returns what was counted and, with `trace`, the requests described.
    pub fn stop(&self) -> (Tally, Vec<String>) {
        let mut state = self.lock();
        state.counting = false;
        (std::mem::take(&mut state.tally), std::mem::take(&mut state.lines))
    }

    /// Forgets the items written so far (their table is gone).
    pub fn forget(&self) {
        self.lock().stored.clear();
    }

    /// A successful commit of the store (counted while counting).
    pub fn committed(&self) {
        let mut state = self.lock();
        if state.counting {
            state.tally.commits += 1;
        }
    }

    /// An installable hook for an SDK client's config.
    pub fn hook(self: &Arc<Self>) -> Hook {
        Hook(Arc::clone(self))
    }

    /// Accounts for one request `target` with `body` and its answer.
    fn record(&self, target: &str, body: &[u8], status: u16, answer: &[u8], waited: Duration) {
        let ok = (200..300).contains(&status);
        let (service, op) = target.split_once('.').unwrap_or(("?", target));
        let mut state = self.lock();
        let counting = state.counting;
        if counting {
            let tally = &mut state.tally;
            tally.waited += waited;
            let by_op = if service.starts_with("AmazonSQS") { &mut tally.sqs } else { &mut tally.dynamodb };
            *by_op.entry(op.to_owned()).or_default() += 1;
            if !ok {
                *tally.failed.entry(op.to_owned()).or_default() += 1;
            }
        }
        if !ok || !service.starts_with("DynamoDB") {
            if counting && state.trace {
                state.lines.push(if ok { op.to_owned() } else { format!("{op}: HTTP {status}") });
            }
            return;
        }
        let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let answer: Value = serde_json::from_slice(answer).unwrap_or(Value::Null);
        let note = match op {
            "TransactWriteItems" => state.transact_write(&request),
            "PutItem" => state.put(&request, false),
            "GetItem" => state.get_item(&request, &answer),
            "Query" | "Scan" => state.query(&request, &answer),
            "BatchGetItem" => state.batch_get(&request, &answer),
            _ => {
                if counting {
                    *state.tally.unpriced.entry(op.to_owned()).or_default() += 1;
                }
                "not priced".to_owned()
            }
        };
        if counting && state.trace {
            state.lines.push(format!("{op}: {note}"));
        }
    }
}

impl State {
    /// Writes `item` (a `Put`); returns a description.
    fn write_item(&mut self, item: &Map<String, Value>, transactional: bool) -> String {
        let Some(key) = key_of(item) else { return "a put without PK/SK".to_owned() };
        let size = item_size(item);
        let before = self.stored.get(&key);
        let units = write_units(before.map_or(0, |b| b.size), size, transactional);
        let kind = Kind::of(&key.1);
        let mut index_units = 0;
        let mut index_bytes = 0;
        let entries: Vec<Option<Entry>> = self.indexes.iter().map(|index| index.entry(item)).collect();
        for (i, entry) in entries.iter().enumerate() {
            let old = before.and_then(|b| b.entries.get(i)).and_then(Option::as_ref);
            let (units, bytes) = Index::write_units(old, entry.as_ref());
            index_units += units;
            index_bytes += bytes;
        }
        if self.counting {
            self.tally.add_write(kind, size, units);
            if index_units > 0 {
                *self.tally.write_units.entry(Kind::Index).or_default() += index_units;
                *self.tally.written_bytes.entry(Kind::Index).or_default() += index_bytes;
                *self.tally.items_written.entry(Kind::Index).or_default() += 1;
            }
        }
        self.stored.insert(key.clone(), Stored { size, entries });
        let index = if index_units > 0 { format!(" +{index_units} index WU") } else { String::new() };
        format!("{} {size} B {units} WU{index}", key.1)
    }

    fn transact_write(&mut self, request: &Value) -> String {
        let mut notes = Vec::new();
        for action in request.get("TransactItems").and_then(Value::as_array).into_iter().flatten() {
            if let Some(item) = action.pointer("/Put/Item").and_then(Value::as_object) {
                notes.push(self.write_item(item, true));
            } else {
                if self.counting {
                    *self.tally.unpriced.entry("TransactWriteItems (not a Put)".to_owned()).or_default() += 1;
                }
                notes.push("a non-Put action (not priced)".to_owned());
            }
        }
        notes.join(", ")
    }

    fn put(&mut self, request: &Value, transactional: bool) -> String {
        match request.get("Item").and_then(Value::as_object) {
            Some(item) => self.write_item(item, transactional),
            None => "a put without an item".to_owned(),
        }
    }

    /// The size a read of table item `item` is charged on: the whole stored item when known
    /// (a projection returns less than is charged), else what came back. `keys` are the
    /// request's keys, to find an item whose projection left its PK out.
    fn charged_size(&self, item: &Map<String, Value>, keys: &[Key]) -> u64 {
        let key = key_of(item).or_else(|| {
            let sk = get_s(item, "SK")?;
            keys.iter().find(|(_, k)| k == sk).cloned()
        });
        key.and_then(|k| self.stored.get(&k)).map_or_else(|| item_size(item), |s| s.size)
    }

    fn add_read(&mut self, halves: u64, bytes: u64) {
        if self.counting {
            self.tally.read_halves += halves;
            self.tally.read_bytes += bytes;
        }
    }

    fn get_item(&mut self, request: &Value, answer: &Value) -> String {
        let consistent = request.get("ConsistentRead").and_then(Value::as_bool).unwrap_or(false);
        let keys: Vec<Key> =
            request.get("Key").and_then(Value::as_object).and_then(key_of).into_iter().collect();
        let bytes = match answer.get("Item").and_then(Value::as_object) {
            Some(item) => self.charged_size(item, &keys),
            None => 0,
        };
        let halves = read_halves(bytes, consistent);
        self.add_read(halves, bytes);
        let sk = keys.first().map_or("?", |k| k.1.as_str());
        format!("{sk} {bytes} B {} RU{}", halves as f64 / 2.0, if consistent { "" } else { " (eventual)" })
    }

    fn query(&mut self, request: &Value, answer: &Value) -> String {
        let on_index = request.get("IndexName").and_then(Value::as_str);
        let consistent =
            on_index.is_none() && request.get("ConsistentRead").and_then(Value::as_bool).unwrap_or(false);
        let items: Vec<&Map<String, Value>> = answer
            .get("Items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
            .collect();
        let bytes: u64 = items
            .iter()
            .map(|item| if on_index.is_some() { item_size(item) } else { self.charged_size(item, &[]) })
            .sum();
        let halves = read_halves(bytes, consistent);
        self.add_read(halves, bytes);
        let first = items.first().and_then(|i| get_s(i, "SK")).unwrap_or("-");
        let last = items.last().and_then(|i| get_s(i, "SK")).unwrap_or("-");
        format!(
            "{}{} items {first}..{last}, {bytes} B {} RU",
            on_index.map(|i| format!("index {i}: ")).unwrap_or_default(),
            items.len(),
            halves as f64 / 2.0
        )
    }

    fn batch_get(&mut self, request: &Value, answer: &Value) -> String {
        let mut notes = Vec::new();
        let requested = request.get("RequestItems").and_then(Value::as_object).into_iter().flatten();
        for (table, wanted) in requested {
            let consistent = wanted.get("ConsistentRead").and_then(Value::as_bool).unwrap_or(false);
            let keys: Vec<Key> = wanted
                .get("Keys")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_object)
                .filter_map(key_of)
                .collect();
            let found: Vec<&Map<String, Value>> = answer
                .pointer(&format!("/Responses/{table}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_object)
                .collect();
            let unprocessed = answer
                .pointer(&format!("/UnprocessedKeys/{table}/Keys"))
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let mut halves = 0;
            let mut bytes = 0;
            for item in &found {
                let size = self.charged_size(item, &keys);
                halves += read_halves(size, consistent);
                bytes += size;
            }
            // A key that names no item is charged like a GetItem of nothing.
            let missing = keys.len().saturating_sub(found.len() + unprocessed) as u64;
            halves += missing * read_halves(0, consistent);
            self.add_read(halves, bytes);
            notes.push(format!(
                "{} keys, {} found, {bytes} B {} RU",
                keys.len(),
                found.len(),
                halves as f64 / 2.0
            ));
        }
        notes.join("; ")
    }
}

// ---------------------------------------------------------------------------------------------
// The interceptor
// ---------------------------------------------------------------------------------------------

/// The meter as an SDK interceptor (`config::Builder::interceptor`).
#[derive(Debug, Clone)]
pub struct Hook(Arc<Meter>);

/// The request of the attempt in flight, kept in the attempt's config bag until its answer.
#[derive(Debug, Clone)]
struct Sent {
    target: String,
    body: Vec<u8>,
    at: Instant,
}

impl Storable for Sent {
    type Storer = StoreReplace<Self>;
}

impl Intercept for Hook {
    fn name(&self) -> &'static str {
        "aws_cost::meter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let target = request.headers().get("x-amz-target").unwrap_or("?").to_owned();
        let body = request.body().bytes().map(<[u8]>::to_vec).unwrap_or_default();
        cfg.interceptor_state().store_put(Sent { target, body, at: Instant::now() });
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // The answer's body was read into memory to deserialize it (no operation used here
        // streams), so its bytes are there.
        if let Some(sent) = cfg.load::<Sent>() {
            let response = context.response();
            let answer = response.body().bytes().unwrap_or_default();
            self.0.record(&sent.target, &sent.body, response.status().as_u16(), answer, sent.at.elapsed());
        }
        Ok(())
    }
}

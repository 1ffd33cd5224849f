//! The AHP connection registry on the sessions table (ARCHITECTURE.md, "The DynamoDB layout"):
//!
//! | `PK`                | `SK`                | item                                                |
//! |---------------------|---------------------|-----------------------------------------------------|
//! | `W#<connection id>` | `W`                 | a WebSocket connection: `caller` (JSON, with its token's expiry), `client_id`, `chats` (the sessions it subscribed to), `ttl` |
//! | `S#<session>`       | `W#<connection id>` | a subscription to the session's chat: `server_seq` (its position), `client_id`, `expires_at` (its caller's token's expiry, if any), `ttl` |
//! | `S#<session>`       | `V#<connection id>` | a subscription to the session's channel: `channel` (as the client spelled it), `client_id`, `expires_at`, `ttl` |
//! | `R`                 | `W#<connection id>` | a subscription to the root channel: `caller` (JSON), `ttl` |
//! | `C#<caller key>`    | `W#<connection id>` | a connection counted among its caller's open ones (`[limits] sockets_per_caller`): `ttl` |
//! | `A#<session>`       | `<client id>`       | an active client of the session (AHP's `activeClients`): `client` (JSON: its tools), `joined` (epoch ms), `ttl` |
//! | `K#<client id>`     | `K`                 | an AHP client (a VS Code window): `open` (its connections), `active_in` (the sessions it is active in), `gone_at` (epoch ms: when its last connection ended), `seq` (its `serverSeq`), per connection and chat the latest mark (`mf#`, `ml#`, `mb#`, `ma#`, `mq#` + `<connection>#<session>`), `ttl` |
//! | `K#<client id>`     | `H#<seq>`           | what the client's session channels were told: `session`, `connection`, `snapshot` (a session snapshot, else an action), `body` (JSON), `ttl` |
//!
//! A subscription lives in its session's partition, so whichever function commits the session
//! finds its subscribers with one strongly consistent query (`SK` beginning with `W#`, after
//! every other item of a session). Both items carry `ttl` (epoch seconds, the table's TTL
//! attribute): API Gateway closes a connection after 2 hours at most, and a `$disconnect`
//! that never came leaves nothing behind for long. A connection whose token expires sooner has
//! its records expire with it.
//!
//! Active clients have a partition per session of their own, apart from the session's items
//! (which its loads read by range): one query reads them all, at the snapshot and at a turn's
//! start. Their `ttl` is a connection's lifetime from the latest `session/activeClientSet`
//! (VS Code sends its entry again before a turn whenever the session's differs). When a
//! client's last connection ends, its item names the sessions it leaves after the grace
//! (`[limits] active_client_grace_secs`, [`Registry::departed`]).
//!
//! Root subscriptions share one fixed partition, so a function that commits a session's
//! creation finds them all with one strongly consistent query, and checks each caller without
//! reading its connection. One partition is enough: it is written once per root subscription
//! (a connection's `initialize`, `subscribe`, `unsubscribe`, `$disconnect`) and read once per
//! session created and at a session's status or title change (a turn's start and end), below a partition's 1,000 writes and 3,000 reads a second
//! until a deployment starts some 1,500 turns a second; sharding it (`R#<n>`, queried in
//! parallel) is the way on past that.

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::operation::update_item::{UpdateItemError, UpdateItemOutput};
use aws_sdk_dynamodb::types::AttributeValue;
use turnstone_engine::ids::SessionId;
use turnstone_runtime::ahp::registry::{
    CONNECTION_LIFETIME_SECS, ChatMark, ClientLedger, ConnectionRecord, Departure, Registry, RegistryError,
    RootSubscriber, SessionActiveClient, SessionSubscriber, Subscriber, Told, UriStyle, caller_from_json,
    caller_to_json,
};
use turnstone_runtime::auth::Caller;
use turnstone_runtime::clock::{Clock, SystemClock};

use crate::items::{self, PK, SK};

/// The root subscriptions' partition.
const ROOT: &str = "R";
/// The connection item's sort key, and the prefix of a subscription's.
const CONNECTION: &str = "W";
const SUBSCRIPTION_PREFIX: &str = "W#";
/// The TTL attribute (N, epoch seconds).
pub const TTL: &str = "ttl";
const CALLER: &str = "caller";
const CLIENT_ID: &str = "client_id";
/// How the connection's client spells session URIs ([`UriStyle::name`]; absent: the default).
const URIS: &str = "uris";
/// The sessions a connection subscribed to (SS).
const CHATS: &str = "chats";
/// The sessions whose channels a connection subscribed to (SS).
const SESSIONS: &str = "sessions";
/// A session channel subscription's `SK` prefix: after the session's items (`E#`, `M#`, ...)
/// and before its chat subscriptions (`W#`).
const SESSION_SUBSCRIPTION_PREFIX: &str = "V#";
/// The channel of a session channel subscription, as its client spelled it.
const CHANNEL: &str = "channel";
/// A subscription's position (N).
const SERVER_SEQ: &str = "server_seq";
/// When a subscription's caller's token expires (N, epoch seconds).
const EXPIRES_AT: &str = "expires_at";
/// An active client's entry (S, JSON) and when it joined (N, epoch milliseconds).
const CLIENT: &str = "client";
const JOINED: &str = "joined";
/// A client item's sort key (its partition is `K#<client id>`), and its attributes: the
/// connections it holds open (SS), the sessions it is active in (SS), and when its last
/// connection ended (N, epoch milliseconds).
const CLIENT_ITEM: &str = "K";
const OPEN: &str = "open";
const ACTIVE_IN: &str = "active_in";
const GONE_AT: &str = "gone_at";
/// A client's `serverSeq` counter (N), and per connection and chat `<prefix><connection>#<session>` its latest mark
/// ([`ChatMark`]: first and last number, positions before and after) and the last number of
/// the mark before it.
const SEQ: &str = "seq";
const MARK_FIRST: &str = "mf#";
const MARK_LAST: &str = "ml#";
const MARK_BEFORE: &str = "mb#";
const MARK_AFTER: &str = "ma#";
const MARK_PREVIOUS: &str = "mq#";
/// What a client's session channels were told: `SK` `H#<seq>` in the client's partition, with
/// the session, whether it is a snapshot, and the JSON.
const TOLD_PREFIX: &str = "H#";
const TOLD_SESSION: &str = "session";
const TOLD_CONNECTION: &str = "connection";
const TOLD_SNAPSHOT: &str = "snapshot";
const TOLD_BODY: &str = "body";

/// The registry on a DynamoDB table.
#[derive(Debug, Clone)]
pub struct DynamoRegistry {
    client: Client,
    table: String,
}

impl DynamoRegistry {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoRegistry { client, table: table.into() }
    }

    fn connection_key(id: &str) -> items::Item {
        [(PK.to_owned(), items::s(format!("W#{id}"))), (SK.to_owned(), items::s(CONNECTION))].into()
    }

    fn root_key(id: &str) -> items::Item {
        [(PK.to_owned(), items::s(ROOT)), (SK.to_owned(), items::s(format!("{SUBSCRIPTION_PREFIX}{id}")))]
            .into()
    }

    /// The item that counts connection `id` among its caller's (`Caller::key`) open ones.
    fn counted_key(caller_key: &str, id: &str) -> items::Item {
        [
            (PK.to_owned(), items::s(format!("C#{caller_key}"))),
            (SK.to_owned(), items::s(format!("{SUBSCRIPTION_PREFIX}{id}"))),
        ]
        .into()
    }

    fn active_partition(session: &SessionId) -> String {
        format!("A#{session}")
    }

    fn active_key(session: &SessionId, client_id: &str) -> items::Item {
        [(PK.to_owned(), items::s(Self::active_partition(session))), (SK.to_owned(), items::s(client_id))]
            .into()
    }

    /// Session `session`'s active client items with when each joined, oldest first; those
    /// past their `ttl` are gone (the table's TTL removes them late).
    async fn active_items(&self, session: &SessionId) -> Result<Vec<(u64, items::Item)>, RegistryError> {
        let now = u64::try_from(SystemClock.now().0 / 1000).unwrap_or(0);
        let mut found: Vec<(u64, items::Item)> = self
            .items_of(Self::active_partition(session), None)
            .await?
            .into_iter()
            .filter(|item| items::get_u64(item, TTL).is_none_or(|ttl| ttl > now))
            .map(|item| (items::get_u64(&item, JOINED).unwrap_or(0), item))
            .collect();
        found.sort_by_key(|(joined, _)| *joined);
        Ok(found)
    }

    /// The items of partition `pk` (with `SK` beginning with `prefix`, when given): one
    /// strongly consistent query, paged.
    async fn items_of(&self, pk: String, prefix: Option<&str>) -> Result<Vec<items::Item>, RegistryError> {
        self.query_items(pk, prefix.map(SortKeys::Prefix)).await
    }

    /// The items of partition `pk` whose `SK` is within `range` (inclusive), as [`Self::items_of`].
    async fn items_between(
        &self,
        pk: String,
        range: (&str, &str),
    ) -> Result<Vec<items::Item>, RegistryError> {
        self.query_items(pk, Some(SortKeys::Between(range.0, range.1))).await
    }

    async fn query_items(
        &self,
        pk: String,
        keys: Option<SortKeys<'_>>,
    ) -> Result<Vec<items::Item>, RegistryError> {
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("#pk = :pk")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":pk", items::s(pk.as_str()))
                .consistent_read(true)
                .set_exclusive_start_key(start);
            match keys {
                None => {}
                Some(SortKeys::Prefix(prefix)) => {
                    query = query
                        .key_condition_expression("#pk = :pk AND begins_with(#sk, :prefix)")
                        .expression_attribute_names("#sk", SK)
                        .expression_attribute_values(":prefix", items::s(prefix));
                }
                Some(SortKeys::Between(from, to)) => {
                    query = query
                        .key_condition_expression("#pk = :pk AND #sk BETWEEN :from AND :to")
                        .expression_attribute_names("#sk", SK)
                        .expression_attribute_values(":from", items::s(from))
                        .expression_attribute_values(":to", items::s(to));
                }
            }
            let out = query.send().await.map_err(|e| failed("Query", e))?;
            found.extend(out.items.unwrap_or_default());
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(found);
            }
        }
    }

    fn subscription_key(id: &str, session: &SessionId) -> items::Item {
        items::key(session, format!("{SUBSCRIPTION_PREFIX}{id}"))
    }

    fn session_subscription_key(id: &str, session: &SessionId) -> items::Item {
        items::key(session, format!("{SESSION_SUBSCRIPTION_PREFIX}{id}"))
    }

    /// Adds (`ADD`) or removes (`DELETE`) `session` in the connection's set `attribute` (its
    /// chats, its session channels); a connection that is gone is left alone, or with
    /// `required` refused.
    async fn name_session(
        &self,
        id: &str,
        verb: &str,
        attribute: &str,
        session: &SessionId,
        required: bool,
    ) -> Result<(), RegistryError> {
        self.name_in(Self::connection_key(id), verb, attribute, session.as_str(), required).await
    }

    /// Adds (`ADD`) or removes (`DELETE`) `member` in the set `attribute` of the item at `key`;
    /// an item that is not there is left alone (not created), or with `required` refused.
    async fn name_in(
        &self,
        key: items::Item,
        verb: &str,
        attribute: &str,
        member: &str,
        required: bool,
    ) -> Result<(), RegistryError> {
        let named = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .update_expression(format!("{verb} #set :member"))
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#set", attribute)
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":member", AttributeValue::Ss(vec![member.to_owned()]))
            .send()
            .await;
        match named {
            Ok(_) => Ok(()),
            Err(e)
                if !required
                    && e.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(failed("UpdateItem", e)),
        }
    }

    /// The item of AHP client `client_id` (its `clientId`, one per VS Code window): the
    /// connections it holds open and the sessions it is active in, so the end of its last
    /// connection finds where it leaves.
    fn client_key(client_id: &str) -> items::Item {
        [(PK.to_owned(), items::s(format!("K#{client_id}"))), (SK.to_owned(), items::s(CLIENT_ITEM))].into()
    }

    /// Adds `member` to client `client_id`'s set `attribute`, creating its item; the item is
    /// kept a connection's lifetime from now. Answers the item as it is then.
    async fn add_to_client(
        &self,
        client_id: &str,
        attribute: &str,
        member: &str,
    ) -> Result<items::Item, RegistryError> {
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::client_key(client_id)))
            .update_expression("ADD #set :member SET #ttl = :ttl")
            .expression_attribute_names("#set", attribute)
            .expression_attribute_names("#ttl", TTL)
            .expression_attribute_values(":member", AttributeValue::Ss(vec![member.to_owned()]))
            .expression_attribute_values(":ttl", Self::expiry(None))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
            .send()
            .await
            .map_err(|e| failed("UpdateItem", e))?;
        Ok(out.attributes.unwrap_or_default())
    }

    /// Connection `id` of client `client_id` ended: the client's departure when it holds no
    /// other connection open.
    async fn leave_client(&self, client_id: &str, id: &str) -> Result<Option<Departure>, RegistryError> {
        let at = u64::try_from(SystemClock.now().0).unwrap_or(0);
        let left = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::client_key(client_id)))
            .update_expression("DELETE #open :id SET #gone = :at")
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#open", OPEN)
            .expression_attribute_names("#gone", GONE_AT)
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":id", AttributeValue::Ss(vec![id.to_owned()]))
            .expression_attribute_values(":at", items::n(at))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
            .send()
            .await;
        let item = match left {
            Ok(out) => out.attributes.unwrap_or_default(),
            // A client never recorded (or forgotten by the table's TTL) is active nowhere.
            Err(e) if e.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => {
                return Ok(None);
            }
            Err(e) => return Err(failed("UpdateItem", e)),
        };
        // DynamoDB removes a set whose last member is deleted.
        if item.contains_key(OPEN) {
            return Ok(None);
        }
        let sessions = match item.get(ACTIVE_IN) {
            Some(AttributeValue::Ss(sessions)) => {
                sessions.iter().map(|s| SessionId::from(s.as_str())).collect()
            }
            _ => Vec::new(),
        };
        Ok(Some(Departure { client_id: client_id.to_owned(), at, sessions }))
    }

    /// Writes `item` whole.
    async fn put(&self, item: items::Item) -> Result<(), RegistryError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| failed("PutItem", e))?;
        Ok(())
    }

    /// The subscription items (`SK` beginning with `W#`) of partition `pk`, by connection.
    async fn subscription_items(&self, pk: String) -> Result<Vec<(String, items::Item)>, RegistryError> {
        let found = self.items_of(pk, Some(SUBSCRIPTION_PREFIX)).await?;
        Ok(found
            .into_iter()
            .filter_map(|item| {
                let connection = items::get_s(&item, SK)?.strip_prefix(SUBSCRIPTION_PREFIX)?.to_owned();
                Some((connection, item))
            })
            .collect())
    }

    /// Removes connection `id`'s subscriptions: to the chats and session channels its record
    /// lists, and to the root channel.
    async fn unsubscribe_listed(
        &self,
        id: &str,
        record: Option<ConnectionRecord>,
    ) -> Result<(), RegistryError> {
        let (chats, sessions) = record.map(|r| (r.chats, r.sessions)).unwrap_or_default();
        for chat in chats {
            self.unsubscribe(id, &chat).await?;
        }
        for session in sessions {
            self.unsubscribe_session(id, &session).await?;
        }
        // Deleting a root subscription that is not there costs the same as reading first.
        self.unsubscribe_root(id).await
    }

    /// When records written now for a caller whose token expires at `expires_at` expire: with
    /// the connection (2 hours), or with the token if that is sooner.
    fn expiry(expires_at: Option<u64>) -> AttributeValue {
        let now = u64::try_from(SystemClock.now().0 / 1000).unwrap_or(0);
        let lifetime = now + CONNECTION_LIFETIME_SECS;
        items::n(expires_at.map_or(lifetime, |at| at.min(lifetime)))
    }
}

impl DynamoRegistry {
    /// An update of the record at `key`, if it is still there, setting `ttl` (the caller's
    /// update expression and the rest to be added).
    fn renewal(&self, key: items::Item, ttl: &AttributeValue) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#ttl", TTL)
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":ttl", ttl.clone())
    }

    /// A renewal's outcome: a record no longer there (not subscribed to the root, unsubscribed
    /// meanwhile) has nothing to renew.
    fn renewed(
        outcome: Result<UpdateItemOutput, SdkError<UpdateItemError, HttpResponse>>,
    ) -> Result<(), RegistryError> {
        match outcome {
            Ok(_) => Ok(()),
            Err(e) if e.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => {
                Ok(())
            }
            Err(e) => Err(failed("UpdateItem", e)),
        }
    }
}

/// Which sort keys of a partition a query reads.
#[derive(Clone, Copy)]
enum SortKeys<'a> {
    Prefix(&'a str),
    Between(&'a str, &'a str),
}

/// A chat subscription item as its subscriber (`None` for any other item).
fn chat_subscriber(item: &items::Item) -> Option<Subscriber> {
    Some(Subscriber {
        connection_id: items::get_s(item, SK)?.strip_prefix(SUBSCRIPTION_PREFIX)?.to_owned(),
        client_id: items::get_s(item, CLIENT_ID).unwrap_or_default().to_owned(),
        server_seq: items::get_u64(item, SERVER_SEQ)?,
        expires_at: items::get_u64(item, EXPIRES_AT),
    })
}

/// A session channel subscription item as its subscriber (`None` for any other item).
fn session_subscriber(item: &items::Item) -> Option<SessionSubscriber> {
    Some(SessionSubscriber {
        connection_id: items::get_s(item, SK)?.strip_prefix(SESSION_SUBSCRIPTION_PREFIX)?.to_owned(),
        client_id: items::get_s(item, CLIENT_ID).unwrap_or_default().to_owned(),
        channel: items::get_s(item, CHANNEL)?.to_owned(),
        expires_at: items::get_u64(item, EXPIRES_AT),
    })
}

/// A failed DynamoDB request as a registry error.
fn failed<E: std::error::Error + 'static>(operation: &str, e: E) -> RegistryError {
    RegistryError(format!("DynamoDB {operation} failed: {}", crate::error::describe(&e)))
}

#[async_trait]
impl Registry for DynamoRegistry {
    async fn connect(&self, id: &str, caller: &Caller) -> Result<(), RegistryError> {
        let ttl = Self::expiry(caller.expires_at());
        let mut item = Self::connection_key(id);
        item.insert(CALLER.to_owned(), items::s(caller_to_json(caller)));
        item.insert(TTL.to_owned(), ttl.clone());
        self.put(item).await?;
        if let Some(key) = caller.key() {
            let mut counted = Self::counted_key(&key, id);
            counted.insert(TTL.to_owned(), ttl);
            self.put(counted).await?;
        }
        Ok(())
    }

    async fn open_connections(&self, caller_key: &str) -> Result<usize, RegistryError> {
        // The table's TTL removes expired items late: those past their `ttl` are not counted.
        let now = u64::try_from(SystemClock.now().0 / 1000).unwrap_or(0);
        let (mut count, mut start) = (0, None);
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("#pk = :pk")
                .filter_expression("#ttl > :now")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_names("#ttl", TTL)
                .expression_attribute_values(":pk", items::s(format!("C#{caller_key}")))
                .expression_attribute_values(":now", items::n(now))
                .select(aws_sdk_dynamodb::types::Select::Count)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| failed("Query", e))?;
            count += usize::try_from(out.count).unwrap_or(0);
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(count);
            }
        }
    }

    async fn connection(&self, id: &str) -> Result<Option<ConnectionRecord>, RegistryError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::connection_key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| failed("GetItem", e))?;
        let Some(item) = out.item else { return Ok(None) };
        let caller = caller_from_json(items::get_s(&item, CALLER).unwrap_or_default())?;
        let client_id = items::get_s(&item, CLIENT_ID).unwrap_or_default().to_owned();
        let chats = match item.get(CHATS) {
            Some(AttributeValue::Ss(chats)) => chats.iter().map(|c| SessionId::from(c.as_str())).collect(),
            _ => Vec::new(),
        };
        let sessions = match item.get(SESSIONS) {
            Some(AttributeValue::Ss(sessions)) => {
                sessions.iter().map(|s| SessionId::from(s.as_str())).collect()
            }
            _ => Vec::new(),
        };
        let uri_style = UriStyle::named(items::get_s(&item, URIS).unwrap_or_default());
        Ok(Some(ConnectionRecord { caller, client_id, chats, sessions, uri_style }))
    }

    async fn set_client(
        &self,
        id: &str,
        client_id: &str,
        uri_style: Option<UriStyle>,
    ) -> Result<UriStyle, RegistryError> {
        // The client's item keeps its spelling for the connections it reconnects on.
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::client_key(client_id)))
            .expression_attribute_names("#open", OPEN)
            .expression_attribute_names("#ttl", TTL)
            .expression_attribute_values(":id", AttributeValue::Ss(vec![id.to_owned()]))
            .expression_attribute_values(":ttl", Self::expiry(None))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew);
        update = match uri_style {
            Some(style) => update
                .update_expression("ADD #open :id SET #ttl = :ttl, #u = :u")
                .expression_attribute_names("#u", URIS)
                .expression_attribute_values(":u", items::s(style.name())),
            None => update.update_expression("ADD #open :id SET #ttl = :ttl"),
        };
        let client = update.send().await.map_err(|e| failed("UpdateItem", e))?.attributes.unwrap_or_default();
        let uri_style =
            uri_style.unwrap_or_else(|| UriStyle::named(items::get_s(&client, URIS).unwrap_or_default()));
        let before = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::connection_key(id)))
            .update_expression("SET #c = :c, #u = :u")
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#c", CLIENT_ID)
            .expression_attribute_names("#u", URIS)
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":c", items::s(client_id))
            .expression_attribute_values(":u", items::s(uri_style.name()))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedOld)
            .send()
            .await
            .map_err(|e| failed("UpdateItem", e))?;
        // A connection that introduced itself as another client before is that one's no more.
        let previous = before.attributes.as_ref().and_then(|old| items::get_s(old, CLIENT_ID));
        if let Some(previous) = previous.filter(|p| *p != client_id) {
            self.name_in(Self::client_key(previous), "DELETE", OPEN, id, false).await?;
        }
        Ok(uri_style)
    }

    async fn number(
        &self,
        client_id: &str,
        connection: &str,
        count: u64,
        floor: u64,
        marks: &[ChatMark],
    ) -> Result<Option<u64>, RegistryError> {
        // Every operand reads the item as it was before the update (the counter included), so
        // a mark's numbers count from the counter's old value, and its previous last number is
        // the one it replaces.
        let mut sets = Vec::new();
        let mut conditions = Vec::new();
        let mut removes = Vec::new();
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::client_key(client_id)))
            .expression_attribute_names("#seq", SEQ)
            .expression_attribute_names("#ttl", TTL)
            .expression_attribute_values(":floor", items::n(floor))
            .expression_attribute_values(":count", items::n(count))
            .expression_attribute_values(":ttl", Self::expiry(None));
        // DynamoDB refuses a value no expression uses.
        if !marks.is_empty() {
            update = update.expression_attribute_values(":zero", items::n(0));
        }
        for (i, mark) in marks.iter().enumerate() {
            let chat = mark.chat.as_str();
            for (key, prefix) in [
                ("f", MARK_FIRST),
                ("l", MARK_LAST),
                ("b", MARK_BEFORE),
                ("a", MARK_AFTER),
                ("q", MARK_PREVIOUS),
            ] {
                update = update
                    .expression_attribute_names(format!("#{key}{i}"), format!("{prefix}{connection}#{chat}"));
            }
            sets.push(format!("#q{i} = if_not_exists(#l{i}, :zero)"));
            sets.push(format!("#f{i} = if_not_exists(#seq, :floor) + :f{i}"));
            sets.push(format!("#l{i} = if_not_exists(#seq, :floor) + :l{i}"));
            sets.push(format!("#a{i} = :a{i}"));
            update = update
                .expression_attribute_values(format!(":f{i}"), items::n(mark.first + 1))
                .expression_attribute_values(format!(":l{i}"), items::n(mark.last + 1))
                .expression_attribute_values(format!(":a{i}"), items::n(mark.after));
            match mark.before {
                Some(before) => {
                    sets.push(format!("#b{i} = :b{i}"));
                    conditions.push(format!("(attribute_not_exists(#a{i}) OR #a{i} <= :b{i})"));
                    update = update.expression_attribute_values(format!(":b{i}"), items::n(before));
                }
                None => removes.push(format!("#b{i}")),
            }
        }
        sets.push("#seq = if_not_exists(#seq, :floor) + :count".to_owned());
        sets.push("#ttl = :ttl".to_owned());
        let mut expression = format!("SET {}", sets.join(", "));
        if !removes.is_empty() {
            expression.push_str(&format!(" REMOVE {}", removes.join(", ")));
        }
        if !conditions.is_empty() {
            update = update.condition_expression(conditions.join(" AND "));
        }
        let sent = update
            .update_expression(expression)
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
            .send()
            .await;
        let out = match sent {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => {
                return Ok(None);
            }
            Err(e) => return Err(failed("UpdateItem", e)),
        };
        let last = out.attributes.as_ref().and_then(|new| items::get_u64(new, SEQ)).unwrap_or(floor + count);
        Ok(Some((last + 1).saturating_sub(count)))
    }

    async fn record_told(&self, client_id: &str, told: &Told) -> Result<(), RegistryError> {
        let mut item: items::Item = [
            (PK.to_owned(), items::s(format!("K#{client_id}"))),
            (SK.to_owned(), items::s(format!("{TOLD_PREFIX}{:020}", told.seq))),
        ]
        .into();
        item.insert(TOLD_SESSION.to_owned(), items::s(told.session.as_str()));
        item.insert(TOLD_CONNECTION.to_owned(), items::s(told.connection.as_str()));
        item.insert(TOLD_BODY.to_owned(), items::s(told.body.as_str()));
        item.insert(TOLD_SNAPSHOT.to_owned(), AttributeValue::Bool(told.snapshot));
        item.insert(TTL.to_owned(), Self::expiry(None));
        self.put(item).await
    }

    async fn client_ledger(&self, client_id: &str) -> Result<Option<ClientLedger>, RegistryError> {
        let found = self.items_of(format!("K#{client_id}"), None).await?;
        let Some(client) = found.iter().find(|item| items::get_s(item, SK) == Some(CLIENT_ITEM)) else {
            return Ok(None);
        };
        let Some(last) = items::get_u64(client, SEQ) else { return Ok(None) };
        let marks = client
            .keys()
            .filter_map(|name| name.strip_prefix(MARK_LAST))
            .filter_map(|named| {
                let (connection, chat) = named.split_once('#')?;
                let get = |prefix: &str| items::get_u64(client, &format!("{prefix}{named}"));
                let mark = ChatMark {
                    chat: SessionId::from(chat),
                    first: get(MARK_FIRST)?,
                    last: get(MARK_LAST)?,
                    before: get(MARK_BEFORE),
                    after: get(MARK_AFTER)?,
                };
                Some((connection.to_owned(), mark, get(MARK_PREVIOUS).unwrap_or(0)))
            })
            .collect();
        let told = found
            .iter()
            .filter_map(|item| {
                let seq = items::get_s(item, SK)?.strip_prefix(TOLD_PREFIX)?.parse().ok()?;
                Some(Told {
                    seq,
                    connection: items::get_s(item, TOLD_CONNECTION).unwrap_or_default().to_owned(),
                    session: SessionId::from(items::get_s(item, TOLD_SESSION)?),
                    snapshot: matches!(item.get(TOLD_SNAPSHOT), Some(AttributeValue::Bool(true))),
                    body: items::get_s(item, TOLD_BODY)?.to_owned(),
                })
            })
            .collect();
        Ok(Some(ClientLedger { last, marks, told }))
    }

    async fn renew(&self, id: &str, caller: &Caller) -> Result<(), RegistryError> {
        // The records live as long as the renewed token, within a connection's lifetime from
        // now (API Gateway's bound counts from `$connect`; records kept past it are removed by
        // `$disconnect`, or by the table's TTL later).
        let ttl = Self::expiry(caller.expires_at());
        let updated = self
            .renewal(Self::connection_key(id), &ttl)
            .update_expression("SET #caller = :caller, #ttl = :ttl")
            .expression_attribute_names("#caller", CALLER)
            .expression_attribute_values(":caller", items::s(caller_to_json(caller)))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
            .send()
            .await;
        let record = match updated {
            Ok(out) => out.attributes.unwrap_or_default(),
            // A connection already gone has nothing left to renew.
            Err(e) => return Self::renewed(Err(e)),
        };
        let chats = match record.get(CHATS) {
            Some(AttributeValue::Ss(chats)) => chats.clone(),
            _ => Vec::new(),
        };
        for chat in &chats {
            let key = Self::subscription_key(id, &SessionId::from(chat.as_str()));
            let update = self.renewal(key, &ttl).expression_attribute_names("#exp", EXPIRES_AT);
            let update = match caller.expires_at() {
                Some(at) => update
                    .update_expression("SET #ttl = :ttl, #exp = :exp")
                    .expression_attribute_values(":exp", items::n(at)),
                None => update.update_expression("SET #ttl = :ttl REMOVE #exp"),
            };
            Self::renewed(update.send().await)?;
        }
        let root = self
            .renewal(Self::root_key(id), &ttl)
            .update_expression("SET #ttl = :ttl, #caller = :caller")
            .expression_attribute_names("#caller", CALLER)
            .expression_attribute_values(":caller", items::s(caller_to_json(caller)));
        Self::renewed(root.send().await)?;
        if let Some(key) = caller.key() {
            let counted =
                self.renewal(Self::counted_key(&key, id), &ttl).update_expression("SET #ttl = :ttl");
            Self::renewed(counted.send().await)?;
        }
        Ok(())
    }

    async fn active_clients(&self, session: &SessionId) -> Result<Vec<SessionActiveClient>, RegistryError> {
        self.active_items(session)
            .await?
            .into_iter()
            .map(|(_, item)| {
                serde_json::from_str(items::get_s(&item, CLIENT).unwrap_or_default())
                    .map_err(|e| RegistryError(format!("a recorded active client is not readable: {e}")))
            })
            .collect()
    }

    async fn set_active_client(
        &self,
        session: &SessionId,
        client: &SessionActiveClient,
        most: usize,
    ) -> Result<(), RegistryError> {
        let json = serde_json::to_string(client)
            .map_err(|e| RegistryError(format!("an active client cannot be recorded: {e}")))?;
        let now_ms = u64::try_from(SystemClock.now().0).unwrap_or(0);
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::active_key(session, &client.client_id)))
            .update_expression("SET #client = :client, #ttl = :ttl, #joined = if_not_exists(#joined, :now)")
            .expression_attribute_names("#client", CLIENT)
            .expression_attribute_names("#ttl", TTL)
            .expression_attribute_names("#joined", JOINED)
            .expression_attribute_values(":client", items::s(json))
            .expression_attribute_values(":ttl", Self::expiry(None))
            .expression_attribute_values(":now", items::n(now_ms))
            .send()
            .await
            .map_err(|e| failed("UpdateItem", e))?;
        self.add_to_client(&client.client_id, ACTIVE_IN, session.as_str()).await?;
        // The session keeps its latest `most`: the oldest beyond them leave.
        let known = self.active_items(session).await?;
        for (_, item) in known.iter().take(known.len().saturating_sub(most)) {
            let Some(client_id) = items::get_s(item, SK) else { continue };
            self.remove_active_client(session, client_id).await?;
        }
        Ok(())
    }

    async fn remove_active_client(&self, session: &SessionId, client_id: &str) -> Result<(), RegistryError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(Self::active_key(session, client_id)))
            .send()
            .await
            .map_err(|e| failed("DeleteItem", e))?;
        self.name_in(Self::client_key(client_id), "DELETE", ACTIVE_IN, session.as_str(), false).await
    }

    async fn disconnect(&self, id: &str) -> Result<Option<Departure>, RegistryError> {
        // One read of the connection: whose count it is in, and the chats it subscribed to.
        let record = self.connection(id).await?;
        if let Some(key) = record.as_ref().and_then(|r| r.caller.key()) {
            self.client
                .delete_item()
                .table_name(&self.table)
                .set_key(Some(Self::counted_key(&key, id)))
                .send()
                .await
                .map_err(|e| failed("DeleteItem", e))?;
        }
        let client_id = record.as_ref().map(|r| r.client_id.clone()).filter(|c| !c.is_empty());
        self.unsubscribe_listed(id, record).await?;
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(Self::connection_key(id)))
            .send()
            .await
            .map_err(|e| failed("DeleteItem", e))?;
        match client_id {
            Some(client_id) => self.leave_client(&client_id, id).await,
            None => Ok(None),
        }
    }

    async fn departed(&self, client_id: &str, at: u64) -> Result<bool, RegistryError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::client_key(client_id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| failed("GetItem", e))?;
        // No item: the client was forgotten (the table's TTL), with no connection open.
        Ok(out.item.is_none_or(|item| !item.contains_key(OPEN) && items::get_u64(&item, GONE_AT) == Some(at)))
    }

    async fn subscribe(
        &self,
        id: &str,
        session: &SessionId,
        server_seq: u64,
        expires_at: Option<u64>,
        client_id: &str,
    ) -> Result<(), RegistryError> {
        // The connection names the session first, so a disconnect always finds the
        // subscription; a connection that is gone is not subscribed.
        self.name_session(id, "ADD", CHATS, session, true).await?;
        let mut item = Self::subscription_key(id, session);
        item.insert(SERVER_SEQ.to_owned(), items::n(server_seq));
        item.insert(CLIENT_ID.to_owned(), items::s(client_id));
        if let Some(at) = expires_at {
            item.insert(EXPIRES_AT.to_owned(), items::n(at));
        }
        item.insert(TTL.to_owned(), Self::expiry(expires_at));
        self.put(item).await
    }

    async fn unsubscribe(&self, id: &str, session: &SessionId) -> Result<(), RegistryError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(Self::subscription_key(id, session)))
            .send()
            .await
            .map_err(|e| failed("DeleteItem", e))?;
        // A connection already gone has nothing to forget.
        self.name_session(id, "DELETE", CHATS, session, false).await
    }

    async fn unsubscribe_all(&self, id: &str) -> Result<(), RegistryError> {
        let record = self.connection(id).await?;
        self.unsubscribe_listed(id, record).await
    }

    async fn subscribe_session(
        &self,
        id: &str,
        session: &SessionId,
        channel: &str,
        expires_at: Option<u64>,
        client_id: &str,
    ) -> Result<(), RegistryError> {
        // Named by the connection first, as a chat subscription is.
        self.name_session(id, "ADD", SESSIONS, session, true).await?;
        let mut item = Self::session_subscription_key(id, session);
        item.insert(CHANNEL.to_owned(), items::s(channel));
        item.insert(CLIENT_ID.to_owned(), items::s(client_id));
        if let Some(at) = expires_at {
            item.insert(EXPIRES_AT.to_owned(), items::n(at));
        }
        item.insert(TTL.to_owned(), Self::expiry(expires_at));
        self.put(item).await
    }

    async fn unsubscribe_session(&self, id: &str, session: &SessionId) -> Result<(), RegistryError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(Self::session_subscription_key(id, session)))
            .send()
            .await
            .map_err(|e| failed("DeleteItem", e))?;
        self.name_session(id, "DELETE", SESSIONS, session, false).await
    }

    async fn session_subscribers(
        &self,
        session: &SessionId,
    ) -> Result<Vec<SessionSubscriber>, RegistryError> {
        let found = self.items_of(items::partition(session), Some(SESSION_SUBSCRIPTION_PREFIX)).await?;
        Ok(found.iter().filter_map(session_subscriber).collect())
    }

    async fn watchers(
        &self,
        session: &SessionId,
    ) -> Result<(Vec<Subscriber>, Vec<SessionSubscriber>), RegistryError> {
        // `V#` and `W#` are neighbours: one query from the first to the end of the second.
        let range = (SESSION_SUBSCRIPTION_PREFIX, "W#~");
        let found = self.items_between(items::partition(session), range).await?;
        let chats = found.iter().filter_map(chat_subscriber).collect();
        let channels = found.iter().filter_map(session_subscriber).collect();
        Ok((chats, channels))
    }

    async fn subscribe_root(
        &self,
        id: &str,
        caller: &Caller,
        uri_style: UriStyle,
    ) -> Result<(), RegistryError> {
        let mut item = Self::root_key(id);
        item.insert(CALLER.to_owned(), items::s(caller_to_json(caller)));
        item.insert(URIS.to_owned(), items::s(uri_style.name()));
        item.insert(TTL.to_owned(), Self::expiry(caller.expires_at()));
        self.put(item).await
    }

    async fn unsubscribe_root(&self, id: &str) -> Result<(), RegistryError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(Self::root_key(id)))
            .send()
            .await
            .map_err(|e| failed("DeleteItem", e))?;
        Ok(())
    }

    async fn root_subscribers(&self) -> Result<Vec<RootSubscriber>, RegistryError> {
        let mut subscribers = Vec::new();
        for (connection, item) in self.subscription_items(ROOT.to_owned()).await? {
            if let Some(caller) = items::get_s(&item, CALLER) {
                let uri_style = UriStyle::named(items::get_s(&item, URIS).unwrap_or_default());
                let caller = caller_from_json(caller)?;
                subscribers.push(RootSubscriber { connection_id: connection, caller, uri_style });
            }
        }
        Ok(subscribers)
    }

    async fn subscribers(&self, session: &SessionId) -> Result<Vec<Subscriber>, RegistryError> {
        let found = self.items_of(items::partition(session), Some(SUBSCRIPTION_PREFIX)).await?;
        Ok(found.iter().filter_map(chat_subscriber).collect())
    }

    async fn advance(&self, id: &str, session: &SessionId, to: u64) -> Result<Option<u64>, RegistryError> {
        self.claim(id, session, to.saturating_sub(1), to).await
    }

    async fn claim(
        &self,
        id: &str,
        session: &SessionId,
        at_most: u64,
        to: u64,
    ) -> Result<Option<u64>, RegistryError> {
        if at_most >= to {
            return Ok(None);
        }
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::subscription_key(id, session)))
            .update_expression("SET #seq = :to")
            .condition_expression("attribute_exists(#pk) AND #seq <= :at_most")
            .expression_attribute_names("#seq", SERVER_SEQ)
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":to", items::n(to))
            .expression_attribute_values(":at_most", items::n(at_most))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedOld)
            .send()
            .await;
        match out {
            Ok(out) => Ok(out.attributes.as_ref().and_then(|old| items::get_u64(old, SERVER_SEQ))),
            Err(e) if e.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => {
                Ok(None)
            }
            Err(e) => Err(failed("UpdateItem", e)),
        }
    }

    async fn position(&self, id: &str, session: &SessionId) -> Result<Option<u64>, RegistryError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::subscription_key(id, session)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| failed("GetItem", e))?;
        Ok(out.item.as_ref().and_then(|item| items::get_u64(item, SERVER_SEQ)))
    }
}

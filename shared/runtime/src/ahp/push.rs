//! Pushes of chat actions to connections recorded in a [`Registry`] (API Gateway's WebSocket
//! API): after a commit of session X by any function (`api`, `dispatch`, `ahp`) that may show
//! in its chat (a claim alone does not: [`turnstone_ahp::shows_in_chat`]), that function reads
//! X's subscribers (one strongly consistent query; a session without subscribers costs nothing
//! more), projects the new events through a per-process cache of
//! chat feeds (re-projecting the log on a miss), and posts each subscriber the actions past its
//! position, after moving the position past them ([`Registry::advance`]), numbered by the
//! subscriber's client's one counter ([`super::ledger`]).
//!
//! # Ordering across functions
//!
//! - Within one function, a session's pushes run one after the other, in commit order, and
//!   each connection gets its actions in `serverSeq` order (a batch takes its numbers from the
//!   client's counter in one write, which records where the chat's actions fell).
//! - An action goes to a connection at most once: a pusher claims a range of actions by moving
//!   the subscription's position with a conditional write before it posts them, and two
//!   pushers never claim the same action.
//! - Across functions there is no order: two functions committing the same session moments
//!   apart (a client's input through `api` or `ahp` while `dispatch` runs the turn) claim
//!   consecutive ranges. The numbering write refuses a range that starts before where the
//!   chat's last numbered range ends (the later range was numbered first): then the pushes
//!   crossed, and the connection is closed, so its client reconnects and is replayed from what
//!   its numbers say it saw. A post that fails (other than 410, which removes the connection)
//!   loses its range for that connection.
//!
//! So a client sees each action once, in order, or is made to reconnect; one that suspects a
//! loss `reconnect`s with the highest `serverSeq` it saw, and gets the missed actions
//! replayed from the durable log or a fresh snapshot.
//!
//! # Deltas
//!
//! The function that runs a model call (`dispatch`, or `api` for a run inside a request)
//! pushes the call's token deltas while it streams, as the local host's chat channel projects
//! them ([`ChatFeed::delta`]: `chat/responsePart` creating a part, then `chat/delta`s growing
//! it). Deltas are gathered per session, for up to 100 ms or 64 deltas or until the next
//! commit, and the batch's deltas of one call are joined (text to text, reasoning to
//! reasoning), so a batch is one action per part it grows: one conditional write (the claim)
//! and one post per follower per batch, no read. A stream is projected onto a copy of the
//! cached feed (the live feed), numbered in the slot of the last event before it, after the
//! durable actions.
//!
//! - The session's subscribers are read once, at the stream's first batch; with none, the
//!   stream costs that one query and its deltas are dropped unprojected.
//! - Those subscribers that stand where the stream began (nothing numbered after it reached
//!   them) get its first actions, those creating its parts, and follow it: each later batch is
//!   claimed only if the follower still stands where the stream left it. A connection that
//!   subscribes later gets none of the stream: its snapshot (the log) lacks the parts, so it
//!   gets the reply whole from the commit that records it, as the log projects it.
//! - The commits that follow (`llm.finished`, the recorded reply) go to followers as the live
//!   feed projects them (the rest of what streamed, not a new part) and to everyone else as
//!   the log does; each client's copy then equals `GET /v1/sessions/{id}/chat`. Once both
//!   feeds show the same chat, the live feed is dropped (followers are moved past both feeds'
//!   numbers, so from the next event on they are numbered alike).
//! - A follower that got an action numbered by another function meanwhile (a commit of the
//!   session through `api`, a rejection) missed part of the stream: it leaves the stream and
//!   its connection is closed, so its client reconnects (a model call mid-stream, or a part
//!   the log does not hold, means a snapshot).
//! - The live feed lives in the function that streamed. If another function commits the
//!   reply that completes a streamed part (a worker agent's answer to `llm.finished` delivered
//!   by a later invocation, after this one gave up), a follower gets it as the log projects it,
//!   a second part, until it reconnects. An engine-hosted agent records the reply in the same
//!   commit as the call's result, so this cannot happen there.
//!
//! # Expiry
//!
//! A subscriber whose caller's token expired (the subscription records the expiry,
//! [`Subscriber::expires_at`]; a root subscriber's caller carries it) is pushed nothing more:
//! the pusher that finds it so treats the connection as gone, removes its records and closes it
//! ([`Frames::close`]). A stream's followers are checked before each batch.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ahp_types::actions::{
    ActionEnvelope, ActionOrigin, PartialChatSummary, SessionChatAddedAction, SessionChatUpdatedAction,
    SessionInputNeededRemovedAction, SessionInputNeededSetAction, StateAction,
};
use ahp_types::state::ChatState;
use ahp_types::state::SessionInputRequest;
use async_trait::async_trait;
use tokio::sync::{Notify, broadcast, watch};
use turnstone_ahp::chat_uri;
use turnstone_engine::ids::{CallId, SessionId, TurnId};
use turnstone_engine::protocol::{StreamDelta, ToolCallDelta};

use super::channels::{ChatFeed, ProjectError};
use super::registry::{
    Frames, Posted, Registry, RegistryError, RootSubscriber, SessionSubscriber, Subscriber,
};
use super::rpc;
use super::sessions::Spelling;
use super::{AhpHost, expired};
use crate::app::{App, SessionChanged};
use crate::auth::Access;
use crate::error::Result;
use crate::notify::{Delta, Notifier, Progress, RootNotice};

/// Sessions whose chat feeds a process keeps (cleared when full).
const FEEDS: usize = 256;
/// Recent actions a cached feed keeps for subscribers a little behind.
const RECENT: usize = 4096;
/// Events read from the store at a time.
const PAGE: usize = 1000;
/// How long a session's deltas wait to be pushed together, and how many at most.
const BATCH_WAIT: Duration = Duration::from_millis(100);
const BATCH_DELTAS: usize = 64;
/// Text a merged delta carries at most (well under a frame, with its envelope).
const BATCH_TEXT: usize = 32 * 1024;

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PushError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Project(#[from] ProjectError),
    #[error("the AHP host is not attached to an app")]
    Detached,
}

/// What a process shares to serve and push to recorded connections: the AHP host (set once
/// the app exists), the registry, the frames' way out, and the chat feeds it projected.
pub struct Pushes {
    host: OnceLock<Arc<AhpHost>>,
    pub(crate) registry: Arc<dyn Registry>,
    pub(crate) frames: Arc<dyn Frames>,
    feeds: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<Cached>>>>,
    /// Whose catalog lists each session this process committed lately as a chat (a
    /// sub-agent's parent, a fork's source): its session channel hears what the chat waits for.
    chats_of: Mutex<HashMap<SessionId, SessionId>>,
    /// The sessions this process's connections named in `createSession` (by connection): the
    /// `root/sessionAdded` its commit pushes spells each so to its creator, who subscribes to
    /// its channel (the record later notices read) only after.
    created_as: Mutex<HashMap<(String, SessionId), String>>,
}

/// A session's chat feed as far as this process projected it, and its latest actions.
struct Cached {
    /// The log's projection alone (what a snapshot shows).
    feed: Option<ChatFeed>,
    /// Durable actions numbered after `floor`, oldest first.
    recent: VecDeque<(u64, StateAction)>,
    floor: u64,
    /// The model calls this process streams, while it streams them.
    stream: Option<Stream>,
}

/// The deltas of this process's model calls on one session, from the first delta after a
/// push until the chat they make is the log's again.
enum Stream {
    /// Nobody subscribed when the stream began: its deltas are dropped unprojected.
    Unwatched,
    Live(Box<Live>),
}

/// A copy of the feed that also takes the deltas: what a connection that saw the stream's
/// parts created holds.
struct Live {
    feed: ChatFeed,
    /// Where the log's feed stood when the stream began; the live actions number after it.
    start: u64,
    /// The actions the live feed numbered since `start` (deltas, and the events after them as a
    /// feed that saw the deltas projects them).
    actions: Vec<(u64, StateAction)>,
    /// Subscribers read when the stream began, not offered its first actions yet.
    candidates: Vec<Subscriber>,
    /// Connections that got the stream from its start, and the position each was moved to.
    followers: HashMap<String, u64>,
    /// Each follower's numbering key ([`super::ledger::numbering_key`]).
    keys: HashMap<String, String>,
    /// When the followers' tokens expire, for those whose do.
    expiry: HashMap<String, u64>,
}

impl Pushes {
    pub fn new(registry: Arc<dyn Registry>, frames: Arc<dyn Frames>) -> Arc<Self> {
        Arc::new(Pushes {
            host: OnceLock::new(),
            registry,
            frames,
            feeds: Mutex::new(HashMap::new()),
            chats_of: Mutex::new(HashMap::new()),
            created_as: Mutex::new(HashMap::new()),
        })
    }

    /// Connection `connection` creates session `session` as `uri`.
    pub(crate) fn creating(&self, connection: &str, session: &SessionId, uri: &str) {
        // Only a hint lives here: a poisoned map is still a usable one.
        let mut created_as = self.created_as.lock().unwrap_or_else(|p| p.into_inner());
        if created_as.len() >= FEEDS {
            created_as.clear();
        }
        created_as.insert((connection.to_owned(), session.clone()), uri.to_owned());
    }

    /// How root subscriber `subscriber` is told of `session`: as the channel of it it
    /// subscribed (one of `channels`), or created, else in its style.
    fn spelling(
        &self,
        subscriber: &RootSubscriber,
        session: &SessionId,
        channels: &[SessionSubscriber],
    ) -> Spelling {
        let mut spelling = Spelling::new(subscriber.uri_style);
        let subscribed =
            channels.iter().find(|c| c.connection_id == subscriber.connection_id).map(|c| c.channel.clone());
        let created = || {
            let created_as = self.created_as.lock().unwrap_or_else(|p| p.into_inner());
            created_as.get(&(subscriber.connection_id.clone(), session.clone())).cloned()
        };
        if let Some(uri) = subscribed.or_else(created) {
            spelling.name(session, &uri);
        }
        spelling
    }

    /// Records that session `chat` is a chat of session `of`'s catalog (told by each commit
    /// of it that shows, before its push reads it).
    fn note_chat_of(&self, chat: &SessionId, of: &SessionId) {
        // Only a cache lives here: a poisoned map is still a usable one.
        let mut chats_of = self.chats_of.lock().unwrap_or_else(|p| p.into_inner());
        if chats_of.len() >= FEEDS && !chats_of.contains_key(chat) {
            chats_of.clear();
        }
        chats_of.insert(chat.clone(), of.clone());
    }

    fn chat_of(&self, chat: &SessionId) -> Option<SessionId> {
        self.chats_of.lock().unwrap_or_else(|p| p.into_inner()).get(chat).cloned()
    }

    /// The AHP host of `app`, made once: the app's notifier holds these pushes, so the host
    /// is set after the app is built (and lives as long as the process).
    pub fn attach(&self, app: &Arc<App>) -> Arc<AhpHost> {
        Arc::clone(self.host.get_or_init(|| {
            let host = AhpHost::new(Arc::clone(app));
            // Each message may reach another process: active clients are recorded with the
            // connections.
            host.active_clients.record_in(Arc::clone(&self.registry));
            host
        }))
    }

    /// Where connections and subscriptions are recorded.
    pub fn registry(&self) -> &Arc<dyn Registry> {
        &self.registry
    }

    pub(crate) fn host(&self) -> Option<&Arc<AhpHost>> {
        self.host.get()
    }

    fn entry(&self, session: &SessionId) -> Arc<tokio::sync::Mutex<Cached>> {
        // Only a cache lives here: a poisoned map is still a usable one.
        let mut feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        if feeds.len() >= FEEDS && !feeds.contains_key(session) {
            feeds.clear();
        }
        let entry = feeds.entry(session.clone()).or_insert_with(|| {
            Arc::new(tokio::sync::Mutex::new(Cached {
                feed: None,
                recent: VecDeque::new(),
                floor: 0,
                stream: None,
            }))
        });
        Arc::clone(entry)
    }

    /// Pushes session `session`'s committed actions to every subscriber behind them: a
    /// connection that follows this process's stream gets them as the live feed projects them.
    pub(crate) async fn push(&self, session: &SessionId) -> std::result::Result<(), PushError> {
        let Some(host) = self.host() else { return Ok(()) };
        let (subscribers, channels) = self.registry.watchers(session).await?;
        // A sub-agent's or a fork's waits are its parent's (or source's) too, as on the local
        // host: that session channel's subscribers, one more query for such chats only.
        let catalog = match self.chat_of(session) {
            Some(of) => Some(self.registry.session_subscribers(&of).await?).filter(|c| !c.is_empty()),
            None => None,
        };
        let entry = self.entry(session);
        let mut cached = entry.lock().await;
        if subscribers.is_empty() && channels.is_empty() && catalog.is_none() {
            // Followers left with everyone else: the stream's copy is of no more use.
            cached.stream = None;
            return Ok(());
        }
        // What the chat waits for before and after the commit: its session channel's
        // `inputNeeded` (unknown before on a cold feed: its entries are told again, which a
        // client takes as the same entry set anew).
        let waits =
            |cached: &Cached| cached.feed.as_ref().map(|f| turnstone_ahp::input_needed(f.projection.chat()));
        let told = !channels.is_empty() || catalog.is_some();
        let waited = if told { waits(&cached) } else { None };
        cached.catch_up(&host.app, session, None).await?;
        if told {
            for action in input_needed_changes(waited.unwrap_or_default(), waits(&cached).unwrap_or_default())
            {
                self.tell(&channels, &action, None).await?;
                if let Some(channels) = &catalog {
                    self.tell(channels, &action, None).await?;
                }
            }
        }
        let end = cached.end();
        let mut live = match cached.stream.take() {
            Some(Stream::Live(live)) => Some(live),
            _ => None,
        };
        for subscriber in subscribers {
            let id = &subscriber.connection_id;
            if expired(subscriber.expires_at) {
                if let Some(live) = live.as_deref_mut() {
                    live.forget(id);
                }
                self.gone(id).await?;
                continue;
            }
            if let Some(live) = live.as_deref_mut()
                && let Some(&last) = live.followers.get(id)
            {
                let to = end.max(live.end());
                if last < to {
                    self.follow(host, session, live, id, last, to).await?;
                }
                continue;
            }
            if subscriber.server_seq >= end {
                continue;
            }
            let Some(from) = self.registry.advance(id, session, end).await? else { continue };
            let actions = cached.between(&host.app, session, from, end).await?;
            self.send(host, session, (id, &key_of(&subscriber)), from, actions).await?;
        }
        // Once the live chat is the log's again, both number alike from the next event on
        // (every follower stands past both feeds' numbers), and the copy is dropped.
        let converged = |live: &Live| {
            cached.feed.as_ref().is_some_and(|f| f.projection.chat() == live.feed.projection.chat())
        };
        if let Some(live) = live.filter(|l| !l.followers.is_empty() && !converged(l)) {
            cached.stream = Some(Stream::Live(live));
        }
        Ok(())
    }

    /// Pushes the deltas of this process's model calls on `session` (the log through `through`
    /// holds the calls' creation) to the subscribers that follow the stream: those subscribed
    /// when it began, read once per stream.
    pub(crate) async fn push_deltas(
        &self,
        session: &SessionId,
        through: u64,
        deltas: Vec<Delta>,
    ) -> std::result::Result<(), PushError> {
        let Some(host) = self.host() else { return Ok(()) };
        let entry = self.entry(session);
        let mut cached = entry.lock().await;
        match &cached.stream {
            Some(Stream::Unwatched) => return Ok(()),
            // A later call of a stream still live: the log now holds its creation.
            Some(Stream::Live(_))
                if through != u64::MAX
                    && cached.feed.as_ref().is_some_and(|f| f.position.event < through) =>
            {
                cached.catch_up(&host.app, session, Some(through)).await?;
            }
            Some(Stream::Live(_)) => {}
            None => {
                let subscribers = self.registry.subscribers(session).await?;
                if subscribers.is_empty() {
                    cached.stream = Some(Stream::Unwatched);
                    return Ok(());
                }
                cached.catch_up(&host.app, session, Some(through)).await?;
                let Some(feed) = cached.feed.clone() else { return Ok(()) };
                let start = feed.position.server_seq();
                let candidates = subscribers.into_iter().filter(|s| s.server_seq <= start).collect();
                let live = Live {
                    feed,
                    start,
                    actions: Vec::new(),
                    candidates,
                    followers: HashMap::new(),
                    keys: HashMap::new(),
                    expiry: HashMap::new(),
                };
                cached.stream = Some(Stream::Live(Box::new(live)));
            }
        }
        let Some(Stream::Live(mut live)) = cached.stream.take() else {
            cached.stream = Some(Stream::Unwatched);
            return Ok(());
        };
        for delta in merge(deltas) {
            let actions = live.feed.delta(&delta)?;
            live.actions.extend(actions);
        }
        let end = live.end();
        let outcome = self.stream(host, session, &cached, &mut live, end).await;
        cached.stream = Some(Stream::Live(live));
        outcome
    }

    /// Sends the live actions through `end` to the stream's followers, and its first ones to
    /// the subscribers it began with (with the durable actions they were still missing).
    async fn stream(
        &self,
        host: &AhpHost,
        session: &SessionId,
        cached: &Cached,
        live: &mut Live,
        end: u64,
    ) -> std::result::Result<(), PushError> {
        if end <= live.start {
            // Nothing shown yet (a delta of a call the projection does not know as running).
            return Ok(());
        }
        for candidate in std::mem::take(&mut live.candidates) {
            let id = &candidate.connection_id;
            if expired(candidate.expires_at) {
                self.gone(id).await?;
                continue;
            }
            // Only a connection that stands where the stream began may get its first actions:
            // one that got anything numbered after (another function's action) did not see the
            // parts created, and gets the reply from the log.
            let Some(from) = self.registry.claim(id, session, live.start, end).await? else { continue };
            let mut actions = cached.between(&host.app, session, from, live.start).await?;
            actions.extend(live.after(live.start, end));
            let key = key_of(&candidate);
            live.followers.insert(id.clone(), end);
            live.keys.insert(id.clone(), key.clone());
            if let Some(at) = candidate.expires_at {
                live.expiry.insert(id.clone(), at);
            }
            self.send(host, session, (id, &key), from, actions).await?;
        }
        let lapsed: Vec<String> =
            live.expiry.iter().filter(|(_, at)| expired(Some(**at))).map(|(id, _)| id.clone()).collect();
        for id in lapsed {
            live.forget(&id);
            self.gone(&id).await?;
        }
        let behind: Vec<(String, u64)> = live
            .followers
            .iter()
            .filter(|(_, last)| **last < end)
            .map(|(id, last)| (id.clone(), *last))
            .collect();
        for (id, last) in behind {
            self.follow(host, session, live, &id, last, end).await?;
        }
        Ok(())
    }

    /// Claims a follower's next range (its position must still be the `last` this stream
    /// moved it to) and sends the live actions in it. A follower whose position moved
    /// meanwhile (another function pushed to it) missed some of the stream: it leaves the
    /// stream, and gets the next live action anyway, numbered not above what it applied last,
    /// which the client takes for a gap (it reconnects and gets a snapshot).
    async fn follow(
        &self,
        host: &AhpHost,
        session: &SessionId,
        live: &mut Live,
        id: &str,
        last: u64,
        to: u64,
    ) -> std::result::Result<(), PushError> {
        let key = live.keys.get(id).cloned().unwrap_or_else(|| super::ledger::numbering_key("", id));
        if self.registry.claim(id, session, last, to).await?.is_some() {
            live.followers.insert(id.to_owned(), to);
            let actions = live.after(last, to);
            return self.send(host, session, (id, &key), last, actions).await;
        }
        live.followers.remove(id);
        live.keys.remove(id);
        let moved = self.registry.position(id, session).await?.is_some_and(|now| now > last);
        if moved {
            // Its copy holds part of a reply the log does not yet: only a snapshot mends it, so
            // the connection is closed and its client reconnects (its mark, past what the log
            // explains, answers snapshots).
            tracing::info!(connection_id = id, session_id = %session, "an AHP stream crossed another push; its follower is closed to reconnect");
            self.close(id).await?;
        }
        Ok(())
    }

    /// Posts a root channel notification to every root subscriber allowed to see it: one
    /// strongly consistent query of the root subscribers (none: nothing more), then one post
    /// each. Notifications are not numbered and never replayed (as AHP has it): a post that
    /// fails is lost for that connection.
    pub(crate) async fn notify_root(&self, notice: &RootNotice) -> std::result::Result<(), PushError> {
        let Some(host) = self.host() else { return Ok(()) };
        let subscribers = self.registry.root_subscribers().await?;
        if subscribers.is_empty() {
            return Ok(());
        }
        // A connection subscribed to the session's channel is told of it as it spelled that.
        let session = match notice {
            RootNotice::SessionAdded(id) => id,
            RootNotice::SummaryChanged(changed) => &changed.session_id,
            RootNotice::SessionRemoved(removed) => &removed.session_id,
        };
        let channels = self.registry.session_subscribers(session).await?;
        let spelling = |subscriber: &RootSubscriber| self.spelling(subscriber, session, &channels);
        match notice {
            RootNotice::SessionAdded(id) => {
                // Read once for every subscriber; each may see it or not (as `sessions::added`).
                let session = match host.app.session(id).await {
                    Ok(session) => session,
                    Err(e) => return Err(PushError::Project(ProjectError::Store(e))),
                };
                for subscriber in subscribers.iter().filter(|s| s.caller.may(Access::Read, &session)) {
                    if expired(subscriber.caller.expires_at()) {
                        self.gone(&subscriber.connection_id).await?;
                        continue;
                    }
                    let frame = super::sessions::added_frame(&session, &spelling(subscriber));
                    self.post(&subscriber.connection_id, &frame).await?;
                }
            }
            RootNotice::SummaryChanged(changed) => {
                for subscriber in &subscribers {
                    if expired(subscriber.caller.expires_at()) {
                        self.gone(&subscriber.connection_id).await?;
                        continue;
                    }
                    // No memory of what each connection was told: status and title both.
                    let spelling = spelling(subscriber);
                    if let Some(frame) =
                        super::sessions::summary_changed(&subscriber.caller, &spelling, changed, &mut None)
                    {
                        self.post(&subscriber.connection_id, &frame).await?;
                    }
                }
            }
            RootNotice::SessionRemoved(removed) => {
                for subscriber in &subscribers {
                    if expired(subscriber.caller.expires_at()) {
                        self.gone(&subscriber.connection_id).await?;
                        continue;
                    }
                    if let Some(frame) =
                        super::sessions::removed(&subscriber.caller, &spelling(subscriber), removed)
                    {
                        self.post(&subscriber.connection_id, &frame).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Posts `action` of session `session`'s channel, dispatched as `origin` (none: the host's
    /// own), to every subscriber of that channel: one strongly consistent query (none: nothing
    /// more), then per subscriber its client's next number with the action recorded as told
    /// (two writes, [`super::ledger`]) and a post.
    pub(crate) async fn tell_session(
        &self,
        session: &SessionId,
        action: &StateAction,
        origin: Option<&ActionOrigin>,
    ) -> std::result::Result<(), PushError> {
        let subscribers = self.registry.session_subscribers(session).await?;
        self.tell(&subscribers, action, origin).await
    }

    /// Tells session channels what a commit changed in their catalog of chats, as the local
    /// host's session channels hear it: a sub-agent's chat added to its parent's (the commit
    /// created it) and forks added to their source's (`session/chatAdded`, with the chat's
    /// summary as its log projects it), and, when the status changed, the chat's new status
    /// in its own session's channel and its parent's (`session/chatUpdated`).
    pub(crate) async fn tell_catalog(
        &self,
        changed: &SessionChanged,
        status_changed: bool,
    ) -> std::result::Result<(), PushError> {
        let Some(host) = self.host() else { return Ok(()) };
        let added = |chat: &SessionId| {
            let chat = chat.clone();
            async move {
                let projection = super::channels::project_log(&host.app, &chat).await?;
                let summary = super::sessions::chat_summary(projection.chat());
                Ok::<_, PushError>(StateAction::SessionChatAdded(SessionChatAddedAction { summary }))
            }
        };
        if changed.created {
            if let Some(parent) = &changed.chat_of {
                self.tell_session(parent, &added(&changed.session_id).await?, None).await?;
            }
            return Ok(());
        }
        for fork in &changed.forks {
            self.tell_session(&changed.session_id, &added(fork).await?, None).await?;
        }
        if status_changed {
            let changes = PartialChatSummary {
                status: Some(super::sessions::status(changed.status)),
                modified_at: Some(changed.at.to_rfc3339()),
                ..PartialChatSummary::default()
            };
            let chat = chat_uri(&changed.session_id);
            let action = StateAction::SessionChatUpdated(SessionChatUpdatedAction { chat, changes });
            for session in std::iter::once(&changed.session_id).chain(changed.chat_of.as_ref()) {
                self.tell_session(session, &action, None).await?;
            }
        }
        Ok(())
    }

    /// Posts a session channel's `action` to each of `subscribers`, numbered by each one's
    /// client ([`Pushes::tell_session`]).
    async fn tell(
        &self,
        subscribers: &[SessionSubscriber],
        action: &StateAction,
        origin: Option<&ActionOrigin>,
    ) -> std::result::Result<(), PushError> {
        for subscriber in subscribers {
            if expired(subscriber.expires_at) {
                self.gone(&subscriber.connection_id).await?;
                continue;
            }
            let envelope = ActionEnvelope {
                channel: subscriber.channel.clone(),
                action: action.clone(),
                server_seq: 0,
                origin: origin.cloned(),
                rejection_reason: None,
            };
            let key = super::ledger::numbering_key(&subscriber.client_id, &subscriber.connection_id);
            self.deliver(&subscriber.connection_id, &key, vec![envelope], &HashMap::new()).await?;
        }
        Ok(())
    }

    /// Posts actions of `session`'s chat (with their positions, the chat's position before
    /// them `before`) to connection `connection` whose numbering key is `key` (a connection
    /// that is gone is removed).
    pub(crate) async fn send(
        &self,
        host: &AhpHost,
        session: &SessionId,
        (connection, key): (&str, &str),
        before: u64,
        actions: Vec<(u64, StateAction)>,
    ) -> std::result::Result<(), PushError> {
        let channel = chat_uri(session);
        let envelopes = actions
            .into_iter()
            .map(|(server_seq, action)| ActionEnvelope {
                origin: host.origins.of(session, &action),
                channel: channel.clone(),
                action,
                server_seq,
                rejection_reason: None,
            })
            .collect();
        self.deliver(connection, key, envelopes, &HashMap::from([(session.clone(), before)])).await?;
        Ok(())
    }

    /// Numbers `envelopes` from the client's counter (`key`; a chat envelope's `server_seq`
    /// holds its position, `befores` each chat's position before them) and posts them in order
    /// to `connection`, until it is gone.
    pub(crate) async fn deliver(
        &self,
        connection: &str,
        key: &str,
        mut envelopes: Vec<ActionEnvelope>,
        befores: &HashMap<SessionId, u64>,
    ) -> std::result::Result<Posted, PushError> {
        if !self.number_envelopes((key, connection), &mut envelopes, befores).await? {
            // Another function's push to the client crossed this one: its copy of the chat
            // cannot be trusted to be in order, so it reconnects (its marks say what it saw).
            tracing::info!(
                connection_id = connection,
                "AHP pushes to one client crossed; its connection is closed to reconnect"
            );
            self.close(connection).await?;
            return Ok(Posted::Gone);
        }
        for envelope in &envelopes {
            if self.post(connection, &rpc::notification("action", envelope)).await? == Posted::Gone {
                return Ok(Posted::Gone);
            }
        }
        Ok(Posted::Sent)
    }

    /// Posts one frame; a connection that is gone is removed with its subscriptions.
    pub(crate) async fn post(&self, connection: &str, frame: &str) -> std::result::Result<Posted, PushError> {
        let max = self.frames.max_frame();
        if frame.len() > max {
            // Nothing can carry it: the client finds the gap and reconnects for a snapshot.
            tracing::error!(
                connection,
                size = frame.len(),
                max,
                "an AHP frame too large for the transport was dropped"
            );
            return Ok(Posted::Sent);
        }
        let posted = self.frames.post(connection, frame).await?;
        if posted == Posted::Gone {
            self.forget(connection).await?;
        }
        Ok(posted)
    }

    /// Connection `connection` is done (its token expired): its records are removed, and it is
    /// closed where the frames' way out can close it.
    pub(crate) async fn gone(&self, connection: &str) -> std::result::Result<(), RegistryError> {
        tracing::info!(connection, "an AHP connection's token expired: it is pushed nothing more");
        self.close(connection).await
    }

    /// Removes connection `connection`'s records and closes it where the frames' way out can
    /// (its client reconnects, or is gone).
    async fn close(&self, connection: &str) -> std::result::Result<(), RegistryError> {
        self.forget(connection).await?;
        if let Err(e) = self.frames.close(connection).await {
            // Its records are gone: whatever it sends next is dropped.
            tracing::warn!(connection, error = %e, "an AHP connection could not be closed");
        }
        Ok(())
    }

    /// Session `session`'s chat as its log makes it now.
    pub(crate) async fn chat(&self, session: &SessionId) -> std::result::Result<ChatState, PushError> {
        let Some(host) = self.host() else { return Err(PushError::Detached) };
        let entry = self.entry(session);
        let mut cached = entry.lock().await;
        cached.catch_up(&host.app, session, None).await?;
        cached.feed.as_ref().map(|f| f.projection.chat().clone()).ok_or(PushError::Detached)
    }

    /// Offers a feed projected elsewhere (a subscription's), if it is ahead of the cached one.
    pub(crate) async fn offer(&self, feed: &ChatFeed) {
        let entry = self.entry(&feed.session_id);
        let mut cached = entry.lock().await;
        if cached.stream.is_none()
            && cached.feed.as_ref().is_none_or(|f| f.position.event < feed.position.event)
        {
            cached.feed = Some(feed.clone());
            cached.recent.clear();
            cached.floor = feed.position.server_seq();
        }
    }
}

impl Live {
    /// Stops streaming to connection `id`.
    fn forget(&mut self, id: &str) {
        self.followers.remove(id);
        self.expiry.remove(id);
    }

    /// Where the live feed stands.
    fn end(&self) -> u64 {
        self.feed.position.server_seq()
    }

    /// The live actions numbered after `from` through `to`.
    fn after(&self, from: u64, to: u64) -> Vec<(u64, StateAction)> {
        self.actions.iter().filter(|(seq, _)| *seq > from && *seq <= to).cloned().collect()
    }
}

impl Cached {
    /// Projects the log past the feed (opening it on a miss), through event `through` if
    /// given; a live stream's copy takes the same events.
    async fn catch_up(
        &mut self,
        app: &App,
        session: &SessionId,
        through: Option<u64>,
    ) -> std::result::Result<(), ProjectError> {
        let feed = match &mut self.feed {
            Some(feed) => feed,
            None => self.feed.insert(ChatFeed::open(app, session.clone()).await?),
        };
        let mut live = match &mut self.stream {
            Some(Stream::Live(live)) => Some(live),
            _ => None,
        };
        let through = through.unwrap_or(u64::MAX);
        loop {
            let after =
                live.as_ref().map_or(feed.position.event, |l| l.feed.position.event.min(feed.position.event));
            if after >= through {
                break;
            }
            let events =
                app.store().events_after(session, after, PAGE).await.map_err(crate::error::Error::from)?;
            for logged in events.iter().take_while(|l| l.seq <= through) {
                if logged.seq > feed.position.event {
                    self.recent.extend(feed.apply(logged)?);
                }
                if let Some(live) = live.as_deref_mut()
                    && logged.seq > live.feed.position.event
                {
                    let actions = live.feed.apply(logged)?;
                    live.actions.extend(actions);
                }
            }
            if events.len() < PAGE || events.last().is_some_and(|l| l.seq >= through) {
                break;
            }
        }
        while self.recent.len() > RECENT {
            if let Some((seq, _)) = self.recent.pop_front() {
                self.floor = seq;
            }
        }
        Ok(())
    }

    /// Where the feed stands.
    fn end(&self) -> u64 {
        self.feed.as_ref().map_or(0, |f| f.position.server_seq())
    }

    /// The actions numbered after `from` through `to`, from the recent ones or the log.
    async fn between(
        &self,
        app: &App,
        session: &SessionId,
        from: u64,
        to: u64,
    ) -> std::result::Result<Vec<(u64, StateAction)>, ProjectError> {
        if from >= to {
            return Ok(Vec::new());
        }
        let wanted = |seq: u64| seq > from && seq <= to;
        if from >= self.floor {
            return Ok(self.recent.iter().filter(|(seq, _)| wanted(*seq)).cloned().collect());
        }
        let mut feed = ChatFeed::open(app, session.clone()).await?;
        let mut actions = Vec::new();
        feed.catch_up(app, |numbered| actions.extend(numbered.into_iter().filter(|(seq, _)| wanted(*seq))))
            .await?;
        Ok(actions)
    }
}

/// A batch of deltas as fewer: consecutive deltas of one call are joined where the join shows
/// the same parts, created in the same order (a delta projects its reasoning, then its text,
/// then its tool calls), so a batch is usually one action per part it grows.
fn merge(deltas: Vec<Delta>) -> Vec<Delta> {
    let mut merged: Vec<Delta> = Vec::new();
    for delta in deltas {
        if let Some(last) = merged.last_mut()
            && last.call_id == delta.call_id
            && joins(&last.delta, &delta.delta)
        {
            join(&mut last.delta, delta.delta);
            continue;
        }
        merged.push(delta);
    }
    merged
}

fn joins(a: &StreamDelta, b: &StreamDelta) -> bool {
    let text = |d: &StreamDelta| d.text.as_deref().is_some_and(|t| !t.is_empty());
    let reasoning = |d: &StreamDelta| d.reasoning.as_deref().is_some_and(|t| !t.is_empty());
    let tools = |d: &StreamDelta| d.tool_calls.as_ref().is_some_and(|t| !t.is_empty());
    let size = |d: &StreamDelta| {
        d.text.as_ref().map_or(0, String::len)
            + d.reasoning.as_ref().map_or(0, String::len)
            + d.tool_calls
                .iter()
                .flatten()
                .map(|t| t.arguments.as_ref().map_or(0, String::len))
                .sum::<usize>()
    };
    (!reasoning(b) || (!text(a) && !tools(a))) && (!text(b) || !tools(a)) && size(a) + size(b) <= BATCH_TEXT
}

fn join(a: &mut StreamDelta, b: StreamDelta) {
    let grow = |mine: &mut Option<String>, more: Option<String>| {
        if let Some(more) = more {
            mine.get_or_insert_with(String::new).push_str(&more);
        }
    };
    grow(&mut a.text, b.text);
    grow(&mut a.reasoning, b.reasoning);
    for fragment in b.tool_calls.into_iter().flatten() {
        let calls = a.tool_calls.get_or_insert_with(Vec::new);
        match calls.last_mut() {
            Some(ToolCallDelta { id, arguments, .. }) if *id == fragment.id && fragment.name.is_none() => {
                grow(arguments, fragment.arguments);
            }
            _ => calls.push(fragment),
        }
    }
    if b.finish_reason.is_some() {
        a.finish_reason = b.finish_reason;
    }
}

/// The notifier of a function that commits where AHP connections are recorded: the notices of
/// `inner`, and after each commit a push to the session's subscribers (one at a time per
/// session, in commit order; [`Notifier::flush`] waits for them). A model call's deltas are
/// gathered per session for up to [`BATCH_WAIT`] (or [`BATCH_DELTAS`] deltas, or until the next
/// commit) and pushed as one batch, before the commit that follows them.
pub struct Pusher {
    inner: Arc<dyn Notifier>,
    pushes: Arc<Pushes>,
    /// Sessions with a push running, and what waits for it.
    running: Arc<Mutex<HashMap<SessionId, Pending>>>,
    /// The last seq this process committed, per session (cleared with `FEEDS` sessions).
    committed: Mutex<HashMap<SessionId, u64>>,
    /// Pushes running in all.
    busy: Arc<watch::Sender<usize>>,
}

/// What waits for a session's running push.
#[derive(Default)]
struct Pending {
    /// A commit came.
    commit: bool,
    /// Deltas to push, oldest first, and when the first of them came.
    deltas: Vec<Delta>,
    since: Option<Instant>,
    /// The last seq this process committed when the first of them came.
    through: u64,
    /// Wakes the push waiting for a batch to fill.
    wake: Arc<Notify>,
}

/// The next thing a session's push does.
enum Work {
    Deltas { through: u64, deltas: Vec<Delta> },
    Commit,
    Wait { wake: Arc<Notify>, until: Instant },
    Done,
}

impl Pusher {
    pub fn new(inner: Arc<dyn Notifier>, pushes: Arc<Pushes>) -> Self {
        Pusher {
            inner,
            pushes,
            running: Arc::default(),
            committed: Mutex::default(),
            busy: Arc::new(watch::channel(0).0),
        }
    }

    /// Records what `session` waits for (`change`), and starts its push unless one runs.
    fn schedule(&self, session: SessionId, change: impl FnOnce(&mut Pending)) {
        {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(pending) = running.get_mut(&session) {
                change(pending);
                return;
            }
            let mut pending = Pending::default();
            change(&mut pending);
            running.insert(session.clone(), pending);
        }
        self.busy.send_modify(|n| *n += 1);
        let (pushes, running, busy) =
            (Arc::clone(&self.pushes), Arc::clone(&self.running), Arc::clone(&self.busy));
        tokio::spawn(async move {
            loop {
                let work = next(&running, &session);
                let pushed = match work {
                    Work::Deltas { through, deltas } => pushes.push_deltas(&session, through, deltas).await,
                    Work::Commit => pushes.push(&session).await,
                    Work::Wait { wake, until } => {
                        let _ = tokio::time::timeout_at(until.into(), wake.notified()).await;
                        Ok(())
                    }
                    Work::Done => break,
                };
                if let Err(e) = pushed {
                    tracing::warn!(session_id = %session, error = %e, "pushing to the chat's AHP subscribers failed");
                }
            }
            busy.send_modify(|n| *n = n.saturating_sub(1));
        });
    }
}

/// The numbering key of a chat subscriber's client.
fn key_of(subscriber: &Subscriber) -> String {
    super::ledger::numbering_key(&subscriber.client_id, &subscriber.connection_id)
}

/// The session channel's `inputNeeded` actions that take a chat from waiting for `before` to
/// waiting for `after`: each entry new or changed set, then each one gone removed.
fn input_needed_changes(
    before: Vec<SessionInputRequest>,
    after: Vec<SessionInputRequest>,
) -> Vec<StateAction> {
    let key = |entry: &SessionInputRequest| turnstone_ahp::entry_key(entry).map(|(key, _)| key.to_owned());
    let mut actions = Vec::new();
    for entry in &after {
        if !before.contains(entry) {
            let set = SessionInputNeededSetAction { request: entry.clone() };
            actions.push(StateAction::SessionInputNeededSet(Box::new(set)));
        }
    }
    let still: Vec<Option<String>> = after.iter().map(key).collect();
    for gone in before.iter().map(key).filter(|k| !still.contains(k)).flatten() {
        actions.push(StateAction::SessionInputNeededRemoved(SessionInputNeededRemovedAction { id: gone }));
    }
    actions
}

/// What `session`'s push does next: its deltas first (they precede any commit that came after
/// them), once the batch is full, old enough, or followed by a commit; then the commit.
fn next(running: &Mutex<HashMap<SessionId, Pending>>, session: &SessionId) -> Work {
    let mut running = running.lock().unwrap_or_else(|p| p.into_inner());
    let Some(pending) = running.get_mut(session) else { return Work::Done };
    if let Some(since) = pending.since {
        let until = since + BATCH_WAIT;
        if !pending.commit && pending.deltas.len() < BATCH_DELTAS && Instant::now() < until {
            return Work::Wait { wake: Arc::clone(&pending.wake), until };
        }
        // A backlog goes out N deltas at a time, so a reply shows as it grew.
        let deltas: Vec<Delta> = pending.deltas.drain(..pending.deltas.len().min(BATCH_DELTAS)).collect();
        if pending.deltas.is_empty() {
            pending.since = None;
        }
        return Work::Deltas { through: pending.through, deltas };
    }
    if std::mem::take(&mut pending.commit) {
        return Work::Commit;
    }
    running.remove(session);
    Work::Done
}

#[async_trait]
impl Notifier for Pusher {
    fn committed(&self, session_id: &str, last_seq: u64, ended_turns: &[TurnId], shows_in_chat: bool) {
        self.inner.committed(session_id, last_seq, ended_turns, shows_in_chat);
        let session = SessionId::from(session_id);
        {
            let mut committed = self.committed.lock().unwrap_or_else(|p| p.into_inner());
            if committed.len() >= FEEDS && !committed.contains_key(&session) {
                committed.clear();
            }
            committed.insert(session.clone(), last_seq);
        }
        // A commit of bookkeeping alone (a claim) has nothing for a chat: no subscriber query.
        // The next commit that shows pushes everything since.
        if shows_in_chat {
            self.schedule(session, |pending| {
                pending.commit = true;
                pending.wake.notify_one();
            });
        }
    }

    fn delta(&self, session_id: &str, call_id: &CallId, delta: StreamDelta) {
        let session = SessionId::from(session_id);
        // The call's claim is this process's last commit of the session before its deltas:
        // the log through it holds the call, running.
        let through = self
            .committed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&session)
            .copied()
            .unwrap_or(u64::MAX);
        let pushed = Delta { call_id: call_id.clone(), delta: delta.clone() };
        self.schedule(session, move |pending| {
            if pending.since.is_none() {
                pending.since = Some(Instant::now());
                pending.through = through;
            }
            pending.deltas.push(pushed);
            if pending.deltas.len() >= BATCH_DELTAS {
                pending.wake.notify_one();
            }
        });
        self.inner.delta(session_id, call_id, delta);
    }

    async fn progress(&self, session_id: &str) -> Result<watch::Receiver<Progress>> {
        self.inner.progress(session_id).await
    }

    fn deltas(&self, session_id: &str) -> broadcast::Receiver<Delta> {
        self.inner.deltas(session_id)
    }

    /// Root subscribers and session channels may be anywhere: every notice is pushed.
    fn hears_root(&self) -> bool {
        true
    }

    /// A change of the catalog: the root's list hears of sessions at the root (a summary when
    /// the commit changed the status or the title); session channels hear of their catalog's
    /// chats ([`Pushes::tell_catalog`]).
    fn root(&self, notice: RootNotice) {
        self.inner.root(notice.clone());
        if let RootNotice::SummaryChanged(changed) = &notice
            && let Some(of) = &changed.chat_of
        {
            self.pushes.note_chat_of(&changed.session_id, of);
        }
        let (to_root, to_catalog) = match &notice {
            RootNotice::SummaryChanged(changed) => {
                // News when the commit changed the status or set the title: subscribers are
                // read at a turn's start and end and a rename, not at every step.
                let news = changed.status_changed || changed.titled;
                let catalog = changed.status_changed
                    || (changed.created && changed.chat_of.is_some())
                    || !changed.forks.is_empty();
                (
                    news && changed.chat_of.is_none() && !changed.created,
                    catalog.then(|| (changed.clone(), changed.status_changed)),
                )
            }
            _ => (true, None),
        };
        if !to_root && to_catalog.is_none() {
            return;
        }
        self.busy.send_modify(|n| *n += 1);
        let (pushes, busy) = (Arc::clone(&self.pushes), Arc::clone(&self.busy));
        tokio::spawn(async move {
            if to_root && let Err(e) = pushes.notify_root(&notice).await {
                tracing::warn!(?notice, error = %e, "notifying the AHP root subscribers failed");
            }
            if let Some((changed, status_news)) = to_catalog
                && let Err(e) = pushes.tell_catalog(&changed, status_news).await
            {
                tracing::warn!(session_id = %changed.session_id, error = %e, "telling AHP session channels of their catalog failed");
            }
            busy.send_modify(|n| *n = n.saturating_sub(1));
        });
    }

    async fn flush(&self) {
        let mut busy = self.busy.subscribe();
        // The sender lives in `self`: waiting cannot outlive it.
        let _ = busy.wait_for(|n| *n == 0).await;
        self.inner.flush().await;
    }
}

//! Pushes of chat actions to connections recorded in a [`Registry`] (API Gateway's WebSocket
//! API): after a commit of session X by any function (`api`, `dispatch`, `ahp`) that may show
//! in its chat (a claim alone does not: [`turnstone_ahp::shows_in_chat`]), that function reads
//! X's subscribers (one strongly consistent query; a session without subscribers costs nothing
//! more), projects the new events through a per-process cache of
//! chat feeds (re-projecting the log on a miss), and posts each subscriber the numbered actions
//! past its position, after moving the position past them ([`Registry::advance`]).
//!
//! # Ordering across functions
//!
//! - Within one function, a session's pushes run one after the other, in commit order, and
//!   each connection gets its actions in `serverSeq` order.
//! - An action goes to a connection at most once: a pusher claims a range of actions by moving
//!   the subscription's position with a conditional write before it posts them, and two
//!   pushers never claim the same action.
//! - Across functions there is no order: two functions committing the same session moments
//!   apart (a client's input through `api` or `ahp` while `dispatch` runs the turn) claim
//!   consecutive ranges, and their posts may cross on the way. A post that fails (other than
//!   410, which removes the connection) loses its range for that connection.
//!
//! So a client sees each action once, usually in order; when an action arrives whose
//! `serverSeq` is not above the last it applied, or it suspects a loss (a turn that does not
//! move), it has a gap: it `reconnect`s (a new connection, or the same one) with the last
//! `serverSeq` it applied in order, and gets the missed actions replayed from the durable log
//! or a fresh snapshot. Deltas are not pushed on AWS yet: a subscriber sees a reply when its
//! message is committed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::state::ChatState;
use async_trait::async_trait;
use tokio::sync::{broadcast, watch};
use turnstone_ahp::chat_uri;
use turnstone_engine::ids::{CallId, SessionId, TurnId};
use turnstone_engine::protocol::StreamDelta;

use super::AhpHost;
use super::channels::{ChatFeed, ProjectError};
use super::registry::{Frames, Posted, Registry, RegistryError};
use super::rpc;
use crate::app::App;
use crate::error::Result;
use crate::notify::{Delta, Notifier, Progress};

/// Sessions whose chat feeds a process keeps (cleared when full).
const FEEDS: usize = 256;
/// Recent actions a cached feed keeps for subscribers a little behind.
const RECENT: usize = 4096;

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
}

/// A session's chat feed as far as this process projected it, and its latest actions.
struct Cached {
    feed: Option<ChatFeed>,
    /// Durable actions numbered after `floor`, oldest first.
    recent: VecDeque<(u64, StateAction)>,
    floor: u64,
}

impl Pushes {
    pub fn new(registry: Arc<dyn Registry>, frames: Arc<dyn Frames>) -> Arc<Self> {
        Arc::new(Pushes { host: OnceLock::new(), registry, frames, feeds: Mutex::new(HashMap::new()) })
    }

    /// The AHP host of `app`, made once: the app's notifier holds these pushes, so the host
    /// is set after the app is built (and lives as long as the process).
    pub fn attach(&self, app: &Arc<App>) -> Arc<AhpHost> {
        Arc::clone(self.host.get_or_init(|| AhpHost::new(Arc::clone(app))))
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
            Arc::new(tokio::sync::Mutex::new(Cached { feed: None, recent: VecDeque::new(), floor: 0 }))
        });
        Arc::clone(entry)
    }

    /// Pushes session `session`'s committed actions to every subscriber behind them.
    pub(crate) async fn push(&self, session: &SessionId) -> std::result::Result<(), PushError> {
        let Some(host) = self.host() else { return Ok(()) };
        let subscribers = self.registry.subscribers(session).await?;
        if subscribers.is_empty() {
            return Ok(());
        }
        let entry = self.entry(session);
        let mut cached = entry.lock().await;
        cached.catch_up(&host.app, session).await?;
        let end = cached.end();
        for subscriber in subscribers {
            if subscriber.server_seq >= end {
                continue;
            }
            let Some(from) = self.registry.advance(&subscriber.connection_id, session, end).await? else {
                continue;
            };
            let actions = cached.between(&host.app, session, from, end).await?;
            self.send(host, session, &subscriber.connection_id, actions).await?;
        }
        Ok(())
    }

    /// Posts numbered actions of `session`'s chat to connection `connection` (a connection
    /// that is gone is removed).
    pub(crate) async fn send(
        &self,
        host: &AhpHost,
        session: &SessionId,
        connection: &str,
        actions: Vec<(u64, StateAction)>,
    ) -> std::result::Result<(), PushError> {
        let channel = chat_uri(session);
        for (server_seq, action) in actions {
            let envelope = ActionEnvelope {
                origin: host.origins.of(session, &action),
                channel: channel.clone(),
                action,
                server_seq,
                rejection_reason: None,
            };
            let frame = rpc::notification("action", &envelope);
            if self.post(connection, &frame).await? == Posted::Gone {
                return Ok(());
            }
        }
        Ok(())
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
            self.registry.disconnect(connection).await?;
        }
        Ok(posted)
    }

    /// Session `session`'s chat as its log makes it now.
    pub(crate) async fn chat(&self, session: &SessionId) -> std::result::Result<ChatState, PushError> {
        let Some(host) = self.host() else { return Err(PushError::Detached) };
        let entry = self.entry(session);
        let mut cached = entry.lock().await;
        cached.catch_up(&host.app, session).await?;
        cached.feed.as_ref().map(|f| f.projection.chat().clone()).ok_or(PushError::Detached)
    }

    /// Offers a feed projected elsewhere (a subscription's), if it is ahead of the cached one.
    pub(crate) async fn offer(&self, feed: &ChatFeed) {
        let entry = self.entry(&feed.session_id);
        let mut cached = entry.lock().await;
        if cached.feed.as_ref().is_none_or(|f| f.position.event < feed.position.event) {
            cached.feed = Some(feed.clone());
            cached.recent.clear();
            cached.floor = feed.position.server_seq();
        }
    }
}

impl Cached {
    /// Projects the log past the feed (opening it on a miss).
    async fn catch_up(&mut self, app: &App, session: &SessionId) -> std::result::Result<(), ProjectError> {
        let feed = match &mut self.feed {
            Some(feed) => feed,
            None => self.feed.insert(ChatFeed::open(app, session.clone()).await?),
        };
        let recent = &mut self.recent;
        feed.catch_up(app, |actions| recent.extend(actions)).await?;
        while recent.len() > RECENT {
            if let Some((seq, _)) = recent.pop_front() {
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

/// The notifier of a function that commits where AHP connections are recorded: the notices of
/// `inner`, and after each commit a push to the session's subscribers (one at a time per
/// session, in commit order; [`Notifier::flush`] waits for them).
pub struct Pusher {
    inner: Arc<dyn Notifier>,
    pushes: Arc<Pushes>,
    /// Sessions with a push running: `true` when another commit came meanwhile.
    running: Arc<Mutex<HashMap<SessionId, bool>>>,
    /// Pushes running in all.
    busy: Arc<watch::Sender<usize>>,
}

impl Pusher {
    pub fn new(inner: Arc<dyn Notifier>, pushes: Arc<Pushes>) -> Self {
        Pusher { inner, pushes, running: Arc::default(), busy: Arc::new(watch::channel(0).0) }
    }

    fn schedule(&self, session: SessionId) {
        {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(again) = running.get_mut(&session) {
                *again = true;
                return;
            }
            running.insert(session.clone(), false);
        }
        self.busy.send_modify(|n| *n += 1);
        let (pushes, running, busy) =
            (Arc::clone(&self.pushes), Arc::clone(&self.running), Arc::clone(&self.busy));
        tokio::spawn(async move {
            loop {
                if let Err(e) = pushes.push(&session).await {
                    tracing::warn!(session_id = %session, error = %e, "pushing to the chat's AHP subscribers failed");
                }
                let mut running = running.lock().unwrap_or_else(|p| p.into_inner());
                match running.get_mut(&session) {
                    Some(again) if *again => *again = false,
                    _ => {
                        running.remove(&session);
                        break;
                    }
                }
            }
            busy.send_modify(|n| *n = n.saturating_sub(1));
        });
    }
}

#[async_trait]
impl Notifier for Pusher {
    fn committed(&self, session_id: &str, last_seq: u64, ended_turns: &[TurnId], shows_in_chat: bool) {
        self.inner.committed(session_id, last_seq, ended_turns, shows_in_chat);
        // A commit of bookkeeping alone (a claim) has nothing for a chat: no subscriber query.
        // The next commit that shows pushes everything since.
        if shows_in_chat {
            self.schedule(SessionId::from(session_id));
        }
    }

    fn delta(&self, session_id: &str, call_id: &CallId, delta: StreamDelta) {
        self.inner.delta(session_id, call_id, delta);
    }

    async fn progress(&self, session_id: &str) -> Result<watch::Receiver<Progress>> {
        self.inner.progress(session_id).await
    }

    fn deltas(&self, session_id: &str) -> broadcast::Receiver<Delta> {
        self.inner.deltas(session_id)
    }

    async fn flush(&self) {
        let mut busy = self.busy.subscribe();
        // The sender lives in `self`: waiting cannot outlive it.
        let _ = busy.wait_for(|n| *n == 0).await;
        self.inner.flush().await;
    }
}

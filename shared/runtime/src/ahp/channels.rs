//! Channels and their subscriptions: the root's snapshot, and a chat channel fed from its
//! session's log and live deltas ([`ChatFeed`], [`follow`]).
//!
//! A chat subscription follows its session the way the SSE stream does: it subscribes to the
//! session's commit progress and deltas first, then reads the log, then waits; a commit means
//! "read the log again", a delta is projected at once (after any commit it may depend on: the
//! commit that creates a model call is announced before the call streams).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ahp_types::actions::{ActionEnvelope, ActionOrigin, ChatTurnsLoadedAction, StateAction};
use ahp_types::common::ROOT_RESOURCE_URI;
use ahp_types::state::{
    AgentCapabilities, AgentInfo, MultipleChatsCapability, RootConfigState, RootState, Snapshot,
    SnapshotState, Turn,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use turnstone_ahp::{ChatProjection, ProjectionError, chat_uri};
use turnstone_engine::ids::{CallId, SessionId};
use turnstone_engine::session::CallSpec;

use super::AhpHost;
use super::connection::Outgoing;
use super::position::Position;
use super::rpc::RpcError;
use super::turns;
use crate::app::App;
use crate::notify::{Delta, Progress};
use crate::store::LoggedEvent;

/// Events read from the store at a time.
const PAGE: usize = 1000;

/// Why a session's log could not be projected.
#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error(transparent)]
    Store(#[from] crate::error::Error),
    /// The projection refused an event: a bug in the mapping, or a broken log.
    #[error("event {seq}: {error}")]
    Projection { seq: u64, error: ProjectionError },
}

/// The chat of session `session_id`'s whole log (a fork's starting from its source's turns).
pub async fn project_log(app: &App, session_id: &SessionId) -> Result<ChatProjection, ProjectError> {
    let mut feed = ChatFeed::open(app, session_id.clone()).await?;
    feed.catch_up(app, |_| {}).await?;
    Ok(feed.projection)
}

/// The turns a fork's chat starts with: its source's chat through the turn it forked at (AHP
/// copies a fork's history into the new chat). None for a session that is not a fork.
fn fork_history<'a>(
    app: &'a App,
    session_id: &'a SessionId,
) -> Pin<Box<dyn Future<Output = Result<Vec<Turn>, ProjectError>> + Send + 'a>> {
    Box::pin(async move {
        let session = match app.session(session_id).await {
            Ok(session) => session,
            Err(crate::error::Error::SessionNotFound(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let Some(origin) = session.init().and_then(|i| i.fork.clone()) else { return Ok(Vec::new()) };
        let source = project_log(app, &origin.session_id).await?;
        let (turns, through) = (&source.chat().turns, source.turns_through(&origin.turn_id));
        Ok(turns[..through.min(turns.len())].to_vec())
    })
}

/// The root channel's snapshot: every configured agent is an AHP agent; `config` is what the
/// client set ([`super::root_config`]).
pub(crate) fn root_snapshot(app: &App, config: Option<RootConfigState>) -> Snapshot {
    let agents = app
        .agent_ids()
        .map(|id| AgentInfo {
            provider: id.to_owned(),
            display_name: id.to_owned(),
            description: format!("Turnstone agent {id}"),
            models: Vec::new(),
            protected_resources: None,
            customizations: None,
            // A chat forks into a session of its own (`createChat` with a fork source).
            capabilities: Some(AgentCapabilities {
                multiple_chats: Some(MultipleChatsCapability { fork: Some(true), side_chat: None }),
                multiple_working_directories: None,
            }),
        })
        .collect();
    let state = RootState { agents, active_sessions: None, terminals: None, config, meta: None };
    Snapshot {
        resource: ROOT_RESOURCE_URI.to_owned(),
        state: SnapshotState::Root(Box::new(state)),
        from_seq: 0,
    }
}

/// One session's chat as a channel sees it: the projection, and where its numbering stands.
#[derive(Clone)]
pub(crate) struct ChatFeed {
    pub session_id: SessionId,
    pub projection: ChatProjection,
    pub position: Position,
    /// Model calls whose deltas this feed does not show: it missed some of them (they ran
    /// before it subscribed, or it lagged), and a reply shown from the middle would not be
    /// the one the log completes. Their recorded message shows the whole reply instead.
    skip: HashSet<CallId>,
}

impl ChatFeed {
    /// The feed of session `session_id` before its first event (a fork's chat holding its
    /// source's turns already).
    pub async fn open(app: &App, session_id: SessionId) -> Result<Self, ProjectError> {
        let history = fork_history(app, &session_id).await?;
        Ok(ChatFeed {
            projection: ChatProjection::forked(session_id.clone(), history),
            session_id,
            position: Position::default(),
            skip: HashSet::new(),
        })
    }

    /// Projects one logged event: its actions, numbered.
    pub fn apply(&mut self, logged: &LoggedEvent) -> Result<Vec<(u64, StateAction)>, ProjectError> {
        let actions = self
            .projection
            .apply(&logged.event)
            .map_err(|error| ProjectError::Projection { seq: logged.seq, error })?;
        self.position.enter(logged.seq);
        Ok(self.number(actions))
    }

    /// Projects a live delta: its actions, numbered.
    pub(crate) fn delta(&mut self, delta: &Delta) -> Result<Vec<(u64, StateAction)>, ProjectError> {
        if self.skip.contains(&delta.call_id) {
            return Ok(Vec::new());
        }
        let actions = self
            .projection
            .delta(&delta.call_id, &delta.delta)
            .map_err(|error| ProjectError::Projection { seq: self.position.event, error })?;
        Ok(self.number(actions))
    }

    /// Numbers actions the projection has reduced; past a full slot (only non-durable ones
    /// can fill it) the rest is not sent.
    pub fn number(&mut self, actions: Vec<StateAction>) -> Vec<(u64, StateAction)> {
        actions.into_iter().map_while(|a| self.position.next().map(|seq| (seq, a))).collect()
    }

    /// Reads and projects the log past the feed's position, handing each numbered action to
    /// `send`.
    pub async fn catch_up(
        &mut self,
        app: &App,
        mut send: impl FnMut(Vec<(u64, StateAction)>),
    ) -> Result<(), ProjectError> {
        loop {
            let events = app
                .store()
                .events_after(&self.session_id, self.position.event, PAGE)
                .await
                .map_err(crate::error::Error::from)?;
            for logged in &events {
                send(self.apply(logged)?);
            }
            if events.len() < PAGE {
                return Ok(());
            }
        }
    }

    /// Skips the deltas of every model call running now.
    pub async fn skip_running(&mut self, app: &App) {
        if let Ok(session) = app.session(&self.session_id).await {
            let running = session
                .calls()
                .iter()
                .filter(|c| c.is_pending() && matches!(c.spec, CallSpec::LlmCall { .. }))
                .map(|c| c.id.clone());
            self.skip.extend(running);
        }
    }

    /// The chat channel's snapshot, as of the feed's position.
    pub fn snapshot(&self, turns: Option<usize>) -> Snapshot {
        let chat = self.projection.chat();
        let chat = match turns {
            Some(limit) => turns::tail(chat, None, limit.max(1)).unwrap_or_else(|_| chat.clone()),
            None => chat.clone(),
        };
        Snapshot {
            resource: chat_uri(&self.session_id),
            state: SnapshotState::Chat(Box::new(chat)),
            from_seq: i64::try_from(self.position.server_seq()).unwrap_or(i64::MAX),
        }
    }
}

/// What a chat channel follows between reads of the log.
pub(crate) struct Live {
    progress: watch::Receiver<Progress>,
    deltas: broadcast::Receiver<Delta>,
}

impl Live {
    /// Starts following session `session_id` (before its log is read, so nothing committed in
    /// between is missed).
    pub async fn follow(app: &App, session_id: &SessionId) -> Result<Live, crate::error::Error> {
        let notifier = app.notifier();
        let deltas = notifier.deltas(session_id);
        let mut progress = notifier.progress(session_id).await?;
        progress.borrow_and_update();
        Ok(Live { progress, deltas })
    }
}

/// What the connection asks of a chat subscription.
pub(crate) enum Control {
    /// `fetchTurns`: the turns before `cursor` go out as `chat/turnsLoaded`.
    FetchTurns { cursor: Option<String>, reply: oneshot::Sender<Result<(), RpcError>> },
    /// A dispatched action the host refuses, echoed to its client only.
    Reject { action: Box<StateAction>, origin: ActionOrigin, reason: String },
}

/// Turns `fetchTurns` loads at a time.
const TURNS_PER_FETCH: usize = 50;

/// Runs a chat subscription: sends the chat's actions as its session commits and streams,
/// until the connection ends or drops it.
pub(crate) async fn follow(
    host: Arc<AhpHost>,
    mut feed: ChatFeed,
    mut live: Live,
    out: mpsc::Sender<Outgoing>,
    mut control: mpsc::Receiver<Control>,
) {
    let app = Arc::clone(&host.app);
    let channel = chat_uri(&feed.session_id);
    let sender = Sender { host: &host, channel: &channel, session_id: feed.session_id.clone(), out: &out };
    loop {
        let outcome = tokio::select! {
            changed = live.progress.changed() => match changed {
                Ok(()) => catch_up(&app, &mut feed, &mut live, &sender).await,
                Err(_) => return,
            },
            delta = live.deltas.recv() => match delta {
                Ok(delta) => {
                    // The commit a delta depends on (its call's creation) is announced first.
                    let caught_up = if live.progress.has_changed().unwrap_or(false) {
                        catch_up(&app, &mut feed, &mut live, &sender).await
                    } else {
                        Ok(true)
                    };
                    match (caught_up, feed.delta(&delta)) {
                        (Ok(true), Ok(actions)) => Ok(sender.send(actions, None).await),
                        (Err(e), _) | (_, Err(e)) => Err(e),
                        (Ok(false), _) => Ok(false),
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    feed.skip_running(&app).await;
                    Ok(true)
                }
                Err(broadcast::error::RecvError::Closed) => {
                    live.deltas = app.notifier().deltas(&feed.session_id);
                    Ok(true)
                }
            },
            command = control.recv() => match command {
                Some(Control::FetchTurns { cursor, reply }) => {
                    let (sent, answer) = match load_turns(&mut feed, cursor.as_deref()) {
                        Ok(actions) => (sender.send(actions, None).await, Ok(())),
                        Err(e) => (true, Err(e)),
                    };
                    let _ = reply.send(answer);
                    Ok(sent)
                }
                Some(Control::Reject { action, origin, reason }) => {
                    let numbered = feed.position.next().map(|seq| vec![(seq, *action)]).unwrap_or_default();
                    Ok(sender.send_rejected(numbered, origin, reason).await)
                }
                None => return,
            },
            () = out.closed() => return,
        };
        match outcome {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::error!(session_id = %feed.session_id, error = %e, "an AHP chat channel stopped");
                return;
            }
        }
    }
}

/// Reads the log's new events and sends their actions; `false` once the client is gone.
async fn catch_up(
    app: &App,
    feed: &mut ChatFeed,
    live: &mut Live,
    sender: &Sender<'_>,
) -> Result<bool, ProjectError> {
    live.progress.borrow_and_update();
    let mut batches = Vec::new();
    feed.catch_up(app, |actions| batches.push(actions)).await?;
    for actions in batches {
        if !sender.send(actions, None).await {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `chat/turnsLoaded` with the turns before `cursor`, reduced into the feed's chat (whose
/// turns are all there: only the client's copy starts from a tail).
fn load_turns(feed: &mut ChatFeed, cursor: Option<&str>) -> Result<Vec<(u64, StateAction)>, RpcError> {
    let (turns, next) = turns::page(&feed.projection.chat().turns, cursor, TURNS_PER_FETCH)
        .map_err(|_| RpcError::invalid_params("params.cursor: not a cursor of this chat"))?;
    let action = StateAction::ChatTurnsLoaded(ChatTurnsLoadedAction { turns, turns_next_cursor: next });
    Ok(feed.number(vec![action]))
}

/// Sends a chat channel's envelopes to its connection (which numbers them from the host's
/// sequence as they go out: [`Outgoing::Action`]).
pub(crate) struct Sender<'a> {
    pub host: &'a AhpHost,
    pub channel: &'a str,
    pub session_id: SessionId,
    pub out: &'a mpsc::Sender<Outgoing>,
}

impl Sender<'_> {
    /// Sends numbered actions, each with the origin of the client action it echoes, if any;
    /// `false` once the client is gone.
    pub async fn send(&self, actions: Vec<(u64, StateAction)>, origin: Option<ActionOrigin>) -> bool {
        for (server_seq, action) in actions {
            let origin = origin.clone().or_else(|| self.host.origins.of(&self.session_id, &action));
            if !self.envelope(server_seq, action, origin, None).await {
                return false;
            }
        }
        true
    }

    async fn send_rejected(
        &self,
        actions: Vec<(u64, StateAction)>,
        origin: ActionOrigin,
        reason: String,
    ) -> bool {
        for (server_seq, action) in actions {
            if !self.envelope(server_seq, action, Some(origin.clone()), Some(reason.clone())).await {
                return false;
            }
        }
        true
    }

    /// `position` is the action's number in the chat's own numbering.
    async fn envelope(
        &self,
        position: u64,
        action: StateAction,
        origin: Option<ActionOrigin>,
        rejection_reason: Option<String>,
    ) -> bool {
        let envelope = ActionEnvelope {
            channel: self.channel.to_owned(),
            action,
            server_seq: position,
            origin,
            rejection_reason,
        };
        self.out.send(Outgoing::Action(Box::new(envelope))).await.is_ok()
    }
}

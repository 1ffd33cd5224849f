//! One AHP connection of the local host: reads the client's JSON-RPC frames in order and hands
//! each to [`super::methods`], and holds the connection's subscriptions in this process (each
//! chat channel runs as its own task that writes into the connection's one outgoing queue, so a
//! response goes out before the actions of the subscription it opened).
//!
//! The connection ends when the client leaves, when its caller's token expires (closed with
//! [`CLOSE_TOKEN_EXPIRED`], `token expired`, at the expiry), or when the client sends a message
//! over the socket's limit (closed with [`CLOSE_TOO_BIG`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ahp_types::actions::ActionEnvelope;
use ahp_types::common::Uri;
use async_trait::async_trait;
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use turnstone_engine::ids::SessionId;

use super::channels::{Control, Live, follow};
use super::methods::{self, Refused, Subscribed, Transport};
use super::rpc::{self, RpcError};
use super::sequence::{Ledger, Sequence};
use super::sessions::{self, Spelling, UriStyle, not_found};
use super::{AhpHost, CLOSE_TOKEN_EXPIRED, CLOSE_TOO_BIG, time_left};
use crate::app::{Removed, SessionChanged};
use crate::auth::{Authenticator, Caller};

/// Frames queued for the client before the channels wait for it (back-pressure, not loss).
const OUT_BUFFER: usize = 1024;
/// Commands queued per chat channel.
const CONTROL_BUFFER: usize = 16;
/// How long a close frame of the host's may wait for the client to take the frames before it.
const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// Serves one upgraded connection of `caller` until either side ends it.
/// `auth` checks the tokens `authenticate` brings (none: the open host, where nothing is).
pub async fn serve(socket: WebSocket, host: Arc<AhpHost>, caller: Caller, auth: Option<Arc<Authenticator>>) {
    let (mut sink, mut stream) = socket.split();
    let (out, mut queued) = mpsc::channel::<Outgoing>(OUT_BUFFER);
    let ledger = Arc::new(Ledger::default());
    // How the host ends the connection, if it does: its close frame goes out next.
    let (closing, mut closed) = oneshot::channel::<CloseFrame>();
    // The writer holds what numbering needs, not the host: it may outlive the connection's
    // other tasks while it flushes, and must not keep the app (and its store) open.
    let numbering = (Arc::clone(&host.sequence), Arc::clone(&ledger));
    let mut writer = tokio::spawn(async move {
        let (sequence, ledger) = numbering;
        let close = loop {
            tokio::select! {
                biased;
                close = &mut closed => break close.ok(),
                next = queued.recv() => match next {
                    Some(next) => {
                        let text = next.into_frame(&sequence, &ledger);
                        if sink.send(Message::Text(text.into())).await.is_err() {
                            return;
                        }
                    }
                    None => break None,
                },
            }
        };
        match close {
            Some(frame) => {
                let _ = sink.send(Message::Close(Some(frame))).await;
            }
            None => {
                let _ = sink.close().await;
            }
        }
    });
    let mut connection = Connection {
        host: Arc::clone(&host),
        caller: caller.clone(),
        out,
        client_id: String::new(),
        subscriptions: HashMap::new(),
        ledger,
        previous: None,
        auth,
    };
    // The caller's token bounds the connection: at its expiry the host closes it (a renewed
    // token, `authenticate`, moves it).
    let mut expires_at = caller.expires_at();
    let expiry = tokio::time::sleep(expires_at.map_or(Duration::ZERO, time_left));
    tokio::pin!(expiry);
    let close = loop {
        let next = tokio::select! {
            next = stream.next() => next,
            () = &mut expiry, if expires_at.is_some() => break Some(token_expired()),
        };
        let text = match next {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(_))) | None => break None,
            // Pings are answered by the WebSocket layer; AHP speaks text only.
            Some(Ok(_)) => continue,
            Some(Err(e)) if too_big(&e) => {
                tracing::info!(error = %e, "an AHP client sent a message over the limit; its socket is closed");
                break Some(CloseFrame { code: CLOSE_TOO_BIG, reason: "message too big".into() });
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "an AHP connection failed");
                break None;
            }
        };
        if expires_at.is_some_and(|at| time_left(at).is_zero()) {
            break Some(token_expired());
        }
        let caller = connection.caller.clone();
        if !methods::handle(&host, &caller, &mut connection, text.as_str()).await
            || connection.out.is_closed()
        {
            break None;
        }
        if connection.caller.expires_at() != expires_at {
            expires_at = connection.caller.expires_at();
            let left = expires_at.map_or(Duration::ZERO, time_left);
            expiry.as_mut().reset(tokio::time::Instant::now() + left);
        }
    };
    drop(connection);
    // Nothing below needs the host: let go of it (and of the app's store) while the writer
    // flushes.
    drop(host);
    match close {
        Some(frame) => {
            // Whatever is still queued is not sent: the connection ends now.
            let _ = closing.send(frame);
            if tokio::time::timeout(CLOSE_WITHIN, &mut writer).await.is_err() {
                writer.abort();
            }
        }
        None => {
            // The writer sends what is queued and ends once every channel task (aborted with
            // the connection) let go; `closing` lives until then, so it does not cut that short.
            let _ = writer.await;
            drop(closing);
        }
    }
}

fn token_expired() -> CloseFrame {
    CloseFrame { code: CLOSE_TOKEN_EXPIRED, reason: "token expired".into() }
}

/// Whether a read failed on a message (or a frame) over the socket's limit. The WebSocket
/// layer's error type is not public, so it is told by its text (tungstenite's `Capacity`
/// error: "Space limit exceeded: Message too long: N > M").
fn too_big(e: &axum::Error) -> bool {
    e.to_string().contains("Message too long")
}

/// A subscription the connection holds.
enum Held {
    Root(JoinHandle<()>),
    Session(JoinHandle<()>),
    Chat { control: mpsc::Sender<Control>, task: JoinHandle<()> },
}

impl Held {
    fn stop(&self) {
        match self {
            Held::Root(task) | Held::Session(task) | Held::Chat { task, .. } => task.abort(),
        }
    }
}

/// What goes out on a connection, in order.
pub(crate) enum Outgoing {
    /// A frame as it is: a response, a notification.
    Frame(String),
    /// A chat action whose `serverSeq` is its number in the chat's own numbering (its
    /// position); it goes out numbered from the host's sequence, and marked in the ledger.
    Action(Box<ActionEnvelope>),
}

impl Outgoing {
    fn into_frame(self, sequence: &Sequence, ledger: &Ledger) -> String {
        match self {
            Outgoing::Frame(text) => text,
            Outgoing::Action(mut envelope) => {
                let server_seq = sequence.next();
                // A chat action carries its position; a session channel's has none (0), and
                // the ledger keeps the session as the client holds it instead (a refused
                // action changes nothing there).
                match envelope.server_seq {
                    0 if envelope.rejection_reason.is_none() => {
                        ledger.sent(&envelope.channel, &envelope.action)
                    }
                    0 => {}
                    position => ledger.mark(&envelope.channel, server_seq, position),
                }
                envelope.server_seq = server_seq;
                rpc::notification("action", &*envelope)
            }
        }
    }
}

struct Connection {
    host: Arc<AhpHost>,
    caller: Caller,
    out: mpsc::Sender<Outgoing>,
    /// From `initialize` or `reconnect`.
    client_id: String,
    subscriptions: HashMap<Uri, Held>,
    /// What this connection was sent, and what the client's connection before it was.
    ledger: Arc<Ledger>,
    previous: Option<Arc<Ledger>>,
    auth: Option<Arc<Authenticator>>,
}

impl Connection {
    /// The connection's client, if it introduced itself, is no longer here through it.
    fn leave(&self) {
        if !self.client_id.is_empty() {
            let grace = self.host.app.limits().active_client_grace_secs;
            let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(u64::MAX));
            self.host.active_clients.disconnected(&self.client_id, grace);
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        for held in self.subscriptions.values() {
            held.stop();
        }
        self.leave();
    }
}

#[async_trait]
impl Transport for Connection {
    fn follows(&self) -> bool {
        true
    }

    fn max_frame(&self) -> Option<usize> {
        None
    }

    fn client_id(&self) -> &str {
        &self.client_id
    }

    fn subscriptions_besides(&self, channel: &str) -> usize {
        self.subscriptions.len() - usize::from(self.subscriptions.contains_key(channel))
    }

    async fn set_client(&mut self, client_id: String, style: Option<UriStyle>) -> Result<(), RpcError> {
        self.host.active_clients.connected(&client_id);
        self.leave();
        self.previous = self.host.ledgers.register(&self.caller, &client_id, Arc::clone(&self.ledger));
        self.ledger.set_spelling(style, self.previous.as_deref());
        self.client_id = client_id;
        Ok(())
    }

    fn ledgers(&self) -> Option<(Arc<Ledger>, Option<Arc<Ledger>>)> {
        Some((Arc::clone(&self.ledger), self.previous.clone()))
    }

    async fn spelling(&mut self) -> Spelling {
        self.ledger.spelling()
    }

    fn name_session(&mut self, id: &SessionId, uri: &str) {
        self.ledger.name_session(id, uri);
    }

    async fn renew(&mut self, token: &str) -> Result<(), RpcError> {
        let Some(auth) = &self.auth else { return Ok(()) };
        self.caller = super::renewed_caller(auth, &self.caller, token)?;
        Ok(())
    }

    async fn send(&mut self, frame: String) -> bool {
        self.out.send(Outgoing::Frame(frame)).await.is_ok()
    }

    async fn hold(&mut self, subscribed: Vec<(Uri, Subscribed)>) {
        for (uri, subscribed) in subscribed {
            let held = match subscribed {
                Subscribed::Root => {
                    let host = Arc::clone(&self.host);
                    let feeds = RootFeeds {
                        added: host.app.sessions_created(),
                        removed: host.app.sessions_removed(),
                        changed: host.app.sessions_changed(),
                    };
                    let ledger = Arc::clone(&self.ledger);
                    let news = root_news(host, self.caller.clone(), ledger, feeds, self.out.clone());
                    Held::Root(tokio::spawn(news))
                }
                Subscribed::Session(id) => {
                    self.ledger.name_session(&id, &uri);
                    // Listening before the task runs: nothing dispatched next is missed.
                    let news = (self.host.active_clients.news(), self.host.app.sessions_changed());
                    let task = super::session_news::follow(
                        Arc::clone(&self.host),
                        self.caller.clone(),
                        news,
                        id,
                        uri.clone(),
                        self.out.clone(),
                    );
                    Held::Session(tokio::spawn(task))
                }
                Subscribed::Chat { feed, live } => {
                    let live = match live {
                        Some(live) => live,
                        None => match Live::follow(&self.host.app, &feed.session_id).await {
                            Ok(live) => live,
                            Err(e) => {
                                tracing::error!(error = %e, "an AHP chat channel could not follow its session");
                                continue;
                            }
                        },
                    };
                    let (control, commands) = mpsc::channel(CONTROL_BUFFER);
                    let task =
                        tokio::spawn(follow(Arc::clone(&self.host), *feed, live, self.out.clone(), commands));
                    Held::Chat { control, task }
                }
            };
            if let Some(old) = self.subscriptions.insert(uri, held) {
                old.stop();
            }
        }
    }

    async fn drop_subscription(&mut self, channel: Option<&str>) {
        match channel {
            Some(channel) => {
                if let Some(held) = self.subscriptions.remove(channel) {
                    held.stop();
                }
            }
            None => {
                for (_, held) in self.subscriptions.drain() {
                    held.stop();
                }
            }
        }
    }

    async fn fetch_turns(&mut self, channel: &str, cursor: Option<String>) -> Result<(), RpcError> {
        let Some(Held::Chat { control, .. }) = self.subscriptions.get(channel) else {
            return Err(RpcError::needs_subscription("fetchTurns"));
        };
        let (reply, answer) = oneshot::channel();
        control.send(Control::FetchTurns { cursor, reply }).await.map_err(|_| not_found(channel))?;
        answer.await.map_err(|_| not_found(channel))?
    }

    async fn reject(&mut self, channel: &str, refused: Refused) -> Option<Refused> {
        let Some(Held::Chat { control, .. }) = self.subscriptions.get(channel) else { return Some(refused) };
        let reject = Control::Reject {
            action: Box::new(refused.action),
            origin: refused.origin,
            reason: refused.reason,
        };
        // A channel that ended has no client left to tell.
        let _ = control.send(reject).await;
        None
    }
}

/// What the root channel follows, subscribed before its task runs (nothing in between is
/// missed).
struct RootFeeds {
    added: broadcast::Receiver<SessionId>,
    removed: broadcast::Receiver<Removed>,
    changed: broadcast::Receiver<SessionChanged>,
}

/// The root channel's notifications: `root/sessionAdded` for every session this process
/// creates (over AHP, over HTTP, or as a sub-agent) and `root/sessionRemoved` for every one it
/// disposes, and `root/sessionSummaryChanged` as its commits change one's status, title or
/// chat, for the sessions the caller may see, spelled as the client names them (`ledger`).
async fn root_news(
    host: Arc<AhpHost>,
    caller: Caller,
    ledger: Arc<Ledger>,
    mut feeds: RootFeeds,
    out: mpsc::Sender<Outgoing>,
) {
    // What this client was last told of each session's status and title (bounded: a client
    // told nothing of a session it forgot is told everything again).
    let mut shown: HashMap<SessionId, Option<(u32, Option<String>)>> = HashMap::new();
    loop {
        // Notifications are ephemeral: a lagging client misses some (AHP never replays them).
        let frame = tokio::select! {
            id = feeds.added.recv() => match id {
                Ok(id) => sessions::added(&host, &caller, &ledger.spelling(), &id).await,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            gone = feeds.removed.recv() => match gone {
                Ok(gone) => {
                    shown.remove(&gone.session_id);
                    ledger.with_spelling(|spelling| sessions::removed(&caller, spelling, &gone))
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            changed = feeds.changed.recv() => match changed {
                Ok(changed) => {
                    if shown.len() >= SHOWN_SESSIONS && !shown.contains_key(&changed.session_id) {
                        shown.clear();
                    }
                    let last = shown.entry(changed.session_id.clone()).or_default();
                    ledger.with_spelling(|spelling| sessions::summary_changed(&caller, spelling, &changed, last))
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        if let Some(frame) = frame
            && out.send(Outgoing::Frame(frame)).await.is_err()
        {
            return;
        }
    }
}

/// Sessions whose last told status and title a root subscription remembers.
const SHOWN_SESSIONS: usize = 4096;

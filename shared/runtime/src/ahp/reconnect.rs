//! `reconnect`: a client back on a new connection gets the chat actions it missed, replayed
//! from the durable log when its `lastSeenServerSeq` names, in every chat it subscribes to, a
//! point the log alone explains (and on each session channel, what turns the session as it
//! held it into the session now, [`super::session_replay`]), or fresh snapshots of every
//! subscription otherwise. On the
//! local host the number is the host's ([`super::sequence`]): the ledger of the client's last
//! connection turns it into a position per chat. Behind API Gateway it is the client's recorded
//! counter, read back through its marks ([`super::ledger`]).

use std::collections::HashMap;

use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::commands::{ReconnectParams, ReconnectReplayResult, ReconnectResult, ReconnectSnapshotResult};
use ahp_types::common::Uri;
use ahp_types::state::SnapshotState;
use turnstone_ahp::chat_uri;
use turnstone_engine::ids::SessionId;
use turnstone_engine::session::{CallSpec, Session};

use super::AhpHost;
use super::channels::{ChatFeed, Live, ProjectError};
use super::methods::{Channel, Subscribed, open, resolve};
use super::position::Position;
use super::rpc::RpcError;
use super::sequence::Numbering;
use super::session_replay;
use super::sessions::{self, internal};
use crate::auth::Caller;

/// Events read from the store at a time.
const PAGE: usize = 1000;
/// The largest integer JavaScript holds exactly (2^53 - 1): `serverSeq`s stay below it.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The result of `params`, and the subscriptions the connection then holds (their chats
/// followed in this process when `follow`). Replayed actions carry each chat's log-derived
/// numbers; the caller numbers them as its transport does ([`Numbering`]).
pub(crate) async fn reconnect(
    host: &AhpHost,
    caller: &Caller,
    params: &ReconnectParams,
    follow: bool,
    numbering: &Numbering<'_>,
) -> Result<(ReconnectResult, Vec<(Uri, Subscribed)>), RpcError> {
    let mut missing = Vec::new();
    let mut channels = Vec::new();
    for uri in &params.subscriptions {
        match resolve(host, caller, uri).await {
            Ok(channel) => channels.push((uri.clone(), channel)),
            Err(_) => missing.push(uri.clone()),
        }
    }
    let last_seen = u64::try_from(params.last_seen_server_seq).ok();
    let positions = match (numbering, last_seen) {
        (Numbering::Host { sequence, ledger, previous }, Some(last_seen)) => {
            // A number past any this host gave: another host's (one that ran before, on a
            // clock ahead of this one's), or none at all. The client's state is not this
            // host's to explain; later numbers pass it, while they stay exact in JavaScript.
            let beyond = last_seen > sequence.current();
            if beyond && last_seen < MAX_SAFE_INTEGER {
                sequence.pass(last_seen);
            }
            // Each chat's position from what the client's last connection was sent, if this
            // host remembers it.
            previous.as_ref().filter(|_| !beyond).and_then(|previous| {
                let positions: Option<Vec<(SessionId, u64)>> = chats(&channels)
                    .map(|(uri, id)| {
                        ledger.adopt(previous, uri);
                        previous.position_at(uri, last_seen).map(|p| (id.clone(), p))
                    })
                    .collect();
                positions
            })
        }
        // The client's recorded marks; a number past its counter is not this deployment's
        // (its numbers go on past it, [`Transport::number_answer`]).
        (Numbering::Recorded { ledger: Some(ledger) }, Some(last_seen)) if last_seen <= ledger.last => {
            let connection = super::ledger::previous_connection(ledger, last_seen);
            chats(&channels)
                .map(|(_, id)| {
                    super::ledger::position(ledger, connection?, id, last_seen).map(|p| (id.clone(), p))
                })
                .collect()
        }
        (Numbering::Recorded { .. }, Some(_)) => None,
        (_, None) => None,
    };
    if let Some(positions) = positions {
        let mut replays = Vec::new();
        for (id, position) in positions {
            match replay(host, &id, position, follow).await.map_err(internal)? {
                Some(replayed) => replays.push((id, replayed)),
                None => {
                    replays.clear();
                    break;
                }
            }
        }
        if (!replays.is_empty() || chats(&channels).next().is_none())
            && let Some(sessions) = sessions_missed(host, caller, &channels, numbering, last_seen).await?
        {
            return Ok(replayed(host, channels, replays, sessions, missing));
        }
    }
    let mut snapshots = Vec::new();
    let mut subscribed = Vec::new();
    for (uri, channel) in channels {
        let (snapshot, held) = open(host, caller, &params.client_id, channel, follow).await?;
        snapshots.push(snapshot);
        subscribed.push((uri, held));
    }
    Ok((ReconnectResult::Snapshot(ReconnectSnapshotResult { snapshots }), subscribed))
}

/// The subscribed chats: their URIs and sessions.
fn chats(channels: &[(Uri, Channel)]) -> impl Iterator<Item = (&Uri, &SessionId)> {
    channels.iter().filter_map(|(uri, c)| match c {
        Channel::Chat(id) => Some((uri, id)),
        _ => None,
    })
}

/// What each subscribed session channel missed, as envelopes on it: `None` when the client's
/// copy of one is not known (a snapshot then starts it afresh): kept by the client's last
/// connection's ledger on the local host, recorded under the client behind API Gateway.
async fn sessions_missed(
    host: &AhpHost,
    caller: &Caller,
    channels: &[(Uri, Channel)],
    numbering: &Numbering<'_>,
    last_seen: Option<u64>,
) -> Result<Option<Vec<ActionEnvelope>>, RpcError> {
    let mut envelopes = Vec::new();
    for (uri, channel) in channels {
        let Channel::Session { session, .. } = channel else { continue };
        let held = match numbering {
            Numbering::Host { previous, .. } => {
                previous.as_ref().and_then(|previous| previous.held_session(uri))
            }
            Numbering::Recorded { ledger } => ledger.as_ref().zip(last_seen).and_then(|(ledger, seen)| {
                let connection = super::ledger::previous_connection(ledger, seen)?;
                super::ledger::held_session(ledger, connection, session.id(), seen)
            }),
        };
        let Some(held) = held else { return Ok(None) };
        let now = sessions::snapshot(host, caller, session, uri).await?;
        let SnapshotState::Session(now) = now.state else { return Ok(None) };
        envelopes.extend(session_replay::missed(&held, &now).into_iter().map(|action| ActionEnvelope {
            channel: uri.clone(),
            action,
            server_seq: 0,
            origin: None,
            rejection_reason: None,
        }));
        if let Numbering::Host { ledger, .. } = numbering {
            ledger.hold_session(uri, *now);
        }
    }
    Ok(Some(envelopes))
}

/// What a chat's replay brings: the feed that goes on from it, and the actions it replays.
type Replayed = (ChatFeed, Option<Live>, Vec<(u64, StateAction)>);

/// The replay result of every subscribed chat's `replays`, and the subscriptions that go on
/// from them.
fn replayed(
    host: &AhpHost,
    channels: Vec<(Uri, Channel)>,
    replays: Vec<(SessionId, Replayed)>,
    sessions: Vec<ActionEnvelope>,
    missing: Vec<Uri>,
) -> (ReconnectResult, Vec<(Uri, Subscribed)>) {
    let mut feeds: HashMap<SessionId, (ChatFeed, Option<Live>)> = HashMap::new();
    let mut actions = Vec::new();
    for (id, (feed, live, replayed)) in replays {
        let channel = chat_uri(&id);
        actions.extend(replayed.into_iter().map(|(server_seq, action)| ActionEnvelope {
            origin: host.origins.of(&id, &action),
            channel: channel.clone(),
            action,
            server_seq,
            rejection_reason: None,
        }));
        feeds.insert(id, (feed, live));
    }
    actions.extend(sessions);
    let mut subscribed = Vec::new();
    for (uri, channel) in channels {
        let held = match channel {
            // Each replayed chat goes on from where its replay ended.
            Channel::Chat(id) => match feeds.remove(&id) {
                Some((feed, live)) => Subscribed::Chat { feed: Box::new(feed), live },
                None => continue,
            },
            Channel::Root => Subscribed::Root,
            Channel::Session { session, .. } => Subscribed::Session(session.id().clone()),
        };
        subscribed.push((uri, held));
    }
    (ReconnectResult::Replay(ReconnectReplayResult { actions, missing }), subscribed)
}

/// The actions of session `id`'s chat after `last_seen`, and the feed that goes on from
/// them; `None` when the log alone cannot say what the client holds.
async fn replay(
    host: &AhpHost,
    id: &SessionId,
    last_seen: u64,
    follow: bool,
) -> Result<Option<(ChatFeed, Option<Live>, Vec<(u64, StateAction)>)>, ProjectError> {
    let target = Position::decode(last_seen);
    let live = match follow {
        true => Some(Live::follow(&host.app, id).await?),
        false => None,
    };
    let mut feed = ChatFeed::open(&host.app, id.clone()).await?;
    // The engine's own fold beside the projection, to tell whether a model call was running.
    let mut session = Session::new(id.clone());
    let mut replayed = Vec::new();
    let mut reached = target.event == 0;
    'read: loop {
        let events = host
            .app
            .store()
            .events_after(id, feed.position.event, PAGE)
            .await
            .map_err(crate::error::Error::from)?;
        for logged in &events {
            if logged.seq > target.event && !reached {
                break 'read;
            }
            let numbered = feed.apply(logged)?;
            session.apply(&logged.event);
            if logged.seq == target.event {
                reached = true;
                let shown = u64::try_from(numbered.len()).unwrap_or(u64::MAX);
                let streaming = session
                    .calls()
                    .iter()
                    .any(|c| c.is_pending() && matches!(c.spec, CallSpec::LlmCall { .. }));
                if target.count > shown || streaming {
                    return Ok(None);
                }
            }
            if logged.seq >= target.event {
                replayed.extend(numbered.into_iter().filter(|(seq, _)| *seq > last_seen));
            }
        }
        if events.len() < PAGE {
            break;
        }
    }
    if !reached {
        // The client saw more than this log holds (another store?): start it afresh.
        return Ok(None);
    }
    feed.skip_running(&host.app).await;
    Ok(Some((feed, live, replayed)))
}

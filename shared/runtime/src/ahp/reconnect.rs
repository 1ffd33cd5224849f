//! `reconnect`: a client back on a new connection gets the chat actions it missed, replayed
//! from the durable log when its `lastSeenServerSeq` names a point the log alone explains, or
//! fresh snapshots of every subscription otherwise (the scheme is in [`super`]'s doc).

use ahp_types::actions::StateAction;
use ahp_types::commands::{ReconnectParams, ReconnectReplayResult, ReconnectResult, ReconnectSnapshotResult};
use ahp_types::common::Uri;
use turnstone_ahp::chat_uri;
use turnstone_engine::ids::SessionId;
use turnstone_engine::session::{CallSpec, Session};

use super::AhpHost;
use super::channels::{ChatFeed, Live, ProjectError};
use super::methods::{Channel, Subscribed, open, resolve};
use super::position::Position;
use super::rpc::RpcError;
use super::sessions::internal;
use crate::auth::Caller;

/// Events read from the store at a time.
const PAGE: usize = 1000;

/// The result of `params`, and the subscriptions the connection then holds (their chats
/// followed in this process when `follow`).
pub(crate) async fn reconnect(
    host: &AhpHost,
    caller: &Caller,
    params: &ReconnectParams,
    follow: bool,
) -> Result<(ReconnectResult, Vec<(Uri, Subscribed)>), RpcError> {
    let mut missing = Vec::new();
    let mut channels = Vec::new();
    for uri in &params.subscriptions {
        match resolve(host, caller, uri).await {
            Ok(channel) => channels.push((uri.clone(), channel)),
            Err(_) => missing.push(uri.clone()),
        }
    }
    let chats: Vec<&SessionId> = channels
        .iter()
        .filter_map(|(_, c)| match c {
            Channel::Chat(id) => Some(id),
            _ => None,
        })
        .collect();
    // One `lastSeenServerSeq` names a point in one chat's log only.
    let last_seen = u64::try_from(params.last_seen_server_seq).ok();
    if let ([id], Some(last_seen)) = (chats.as_slice(), last_seen) {
        let id = (*id).clone();
        if let Some((feed, live, replayed)) = replay(host, &id, last_seen, follow).await.map_err(internal)? {
            let channel = chat_uri(&id);
            let actions = replayed
                .into_iter()
                .map(|(server_seq, action)| ahp_types::actions::ActionEnvelope {
                    origin: host.origins.of(&id, &action),
                    channel: channel.clone(),
                    action,
                    server_seq,
                    rejection_reason: None,
                })
                .collect();
            // The replayed chat goes on from where the replay ended.
            let mut replayed_feed = Some((feed, live));
            let mut subscribed = Vec::new();
            for (uri, channel) in channels {
                let held = match channel {
                    Channel::Chat(_) => match replayed_feed.take() {
                        Some((feed, live)) => Subscribed::Chat { feed: Box::new(feed), live },
                        None => continue,
                    },
                    Channel::Root => Subscribed::Root,
                    Channel::Session { .. } => Subscribed::Session,
                };
                subscribed.push((uri, held));
            }
            return Ok((ReconnectResult::Replay(ReconnectReplayResult { actions, missing }), subscribed));
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

//! A session channel's news, as its subscribers hear it: its active clients' comings and
//! goings ([`super::active_clients`]), its title as commits set it (`session/titleChanged`),
//! its catalog of chats: a fork or a sub-agent's chat added (`session/chatAdded`), and a
//! chat's status changed (`session/chatUpdated`, the default chat's included, so the catalog
//! says what each chat says), and what its chats wait for (`session/inputNeededSet` and
//! `session/inputNeededRemoved`, each chat followed through its log as a chat channel is).

use std::collections::HashMap;
use std::sync::Arc;

use ahp_types::actions::{
    ActionEnvelope, ActionOrigin, PartialChatSummary, SessionChatAddedAction, SessionChatUpdatedAction,
    SessionInputNeededRemovedAction, SessionInputNeededSetAction, SessionTitleChangedAction, StateAction,
};
use ahp_types::common::Uri;
use ahp_types::state::SessionInputRequest;
use tokio::sync::{broadcast, mpsc};
use turnstone_ahp::chat_uri;
use turnstone_engine::ids::SessionId;

use super::AhpHost;
use super::active_clients::SessionNews;
use super::channels::ChatFeed;
use super::connection::Outgoing;
use super::sessions;
use crate::app::SessionChanged;
use crate::auth::{Access, Caller};

/// Chats whose last told status a subscription remembers (bounded: one told nothing of a
/// chat it forgot is told its status again).
const SHOWN_CHATS: usize = 1024;

/// Sends session `id`'s news to `caller` on `channel` (spelled as the client subscribed), each
/// action with the origin of whoever dispatched it, until the connection goes.
pub(crate) async fn follow(
    host: Arc<AhpHost>,
    caller: Caller,
    (mut news, mut changed): (broadcast::Receiver<SessionNews>, broadcast::Receiver<SessionChanged>),
    id: SessionId,
    channel: Uri,
    out: mpsc::Sender<Outgoing>,
) {
    let mut title: Option<String> = None;
    let mut statuses: HashMap<SessionId, u32> = HashMap::new();
    let mut waits = Waits::follow(&host, &caller, &id).await;
    loop {
        let actions: Vec<(StateAction, Option<ActionOrigin>)> = tokio::select! {
            news = news.recv() => match news {
                Ok(news) if news.session_id == id => vec![(news.action, news.origin)],
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            change = changed.recv() => match change {
                Ok(change) if change.session_id == id || change.chat_of.as_ref() == Some(&id) => {
                    if statuses.len() >= SHOWN_CHATS && !statuses.contains_key(&change.session_id) {
                        statuses.clear();
                    }
                    let mut actions =
                        catalog_news(&host, &caller, &id, &change, (&mut title, &mut statuses), &mut waits).await;
                    actions.extend(waits.changed(&host, &caller, &change.session_id).await);
                    actions
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        for (action, origin) in actions {
            // Numbered as it goes out; a session channel has no position in a log (0).
            let envelope = ActionEnvelope {
                channel: channel.clone(),
                action,
                server_seq: 0,
                origin,
                rejection_reason: None,
            };
            if out.send(Outgoing::Action(Box::new(envelope))).await.is_err() {
                return;
            }
        }
    }
}

/// What a commit of session `id`, or of a chat of its catalog, changed on its channel:
/// `title` and `statuses` are what the subscriber was last told (then updated); a new chat's
/// summary comes from the feed `waits` follows it by.
async fn catalog_news(
    host: &AhpHost,
    caller: &Caller,
    id: &SessionId,
    change: &SessionChanged,
    (title, statuses): (&mut Option<String>, &mut HashMap<SessionId, u32>),
    waits: &mut Waits,
) -> Vec<(StateAction, Option<ActionOrigin>)> {
    let mut actions = Vec::new();
    if change.session_id == *id && change.title.is_some() && change.title != *title {
        title.clone_from(&change.title);
        let action = StateAction::SessionTitleChanged(SessionTitleChangedAction {
            title: change.title.clone().unwrap_or_default(),
        });
        let origin = host.origins.of(id, &action);
        actions.push((action, origin));
    }
    // A new chat: a fork the commit recorded, or the sub-agent the commit created.
    let added = if change.created { vec![change.session_id.clone()] } else { change.forks.clone() };
    for chat in &added {
        let summary =
            waits.feed(host, caller, chat).await.map(|f| sessions::chat_summary(f.projection.chat()));
        if let Some(summary) = summary {
            statuses.insert(chat.clone(), summary.status);
            actions.push((StateAction::SessionChatAdded(SessionChatAddedAction { summary }), None));
        }
    }
    if change.created {
        return actions;
    }
    let status = sessions::status(change.status);
    if statuses.insert(change.session_id.clone(), status) != Some(status) {
        let changes = PartialChatSummary {
            status: Some(status),
            modified_at: Some(change.at.to_rfc3339()),
            ..PartialChatSummary::default()
        };
        let chat = chat_uri(&change.session_id);
        actions.push((StateAction::SessionChatUpdated(SessionChatUpdatedAction { chat, changes }), None));
    }
    actions
}

/// What the chats of one session's catalog wait for: each chat followed through its log (a
/// feed, as a chat channel's), and the `inputNeeded` entries the subscriber was told.
struct Waits {
    feeds: HashMap<SessionId, ChatFeed>,
    told: HashMap<String, SessionInputRequest>,
}

impl Waits {
    /// Follows session `id`'s chat and those of its catalog that `caller` may read, from what
    /// they wait for now (the session's snapshot told it).
    async fn follow(host: &AhpHost, caller: &Caller, id: &SessionId) -> Waits {
        let mut waits = Waits { feeds: HashMap::new(), told: HashMap::new() };
        let Some(own) = waits.feed(host, caller, id).await else { return waits };
        let catalog: Vec<SessionId> = own
            .projection
            .forks()
            .iter()
            .map(|(fork, _)| fork.clone())
            .chain(own.projection.children().iter().cloned())
            .collect();
        for chat in catalog {
            waits.feed(host, caller, &chat).await;
        }
        for feed in waits.feeds.values() {
            for entry in turnstone_ahp::input_needed(feed.projection.chat()) {
                if let Some((key, _)) = turnstone_ahp::entry_key(&entry) {
                    waits.told.insert(key.to_owned(), entry);
                }
            }
        }
        waits
    }

    /// The feed of chat `chat` caught up with its log, opened if new (if `caller` may read it).
    async fn feed(&mut self, host: &AhpHost, caller: &Caller, chat: &SessionId) -> Option<&ChatFeed> {
        if !self.feeds.contains_key(chat) {
            sessions::reachable(host, caller, chat, Access::Read, "").await.ok()?;
            let feed = ChatFeed::open(&host.app, chat.clone()).await;
            match feed {
                Ok(feed) => self.feeds.insert(chat.clone(), feed),
                Err(e) => {
                    tracing::warn!(session_id = %chat, error = %e, "a chat's open requests could not be followed");
                    return None;
                }
            };
        }
        let feed = self.feeds.get_mut(chat)?;
        if let Err(e) = feed.catch_up(&host.app, drop).await {
            tracing::warn!(session_id = %chat, error = %e, "a chat's open requests could not be followed");
            self.feeds.remove(chat);
            return None;
        }
        self.feeds.get(chat)
    }

    /// What chat `chat`'s commit changed in what it waits for: the entries it added or changed,
    /// then those it resolved.
    async fn changed(
        &mut self,
        host: &AhpHost,
        caller: &Caller,
        chat: &SessionId,
    ) -> Vec<(StateAction, Option<ActionOrigin>)> {
        let Some(feed) = self.feed(host, caller, chat).await else { return Vec::new() };
        let now = turnstone_ahp::input_needed(feed.projection.chat());
        let uri = chat_uri(chat);
        let mut actions = Vec::new();
        let mut current = Vec::new();
        for entry in now {
            let Some(key) = turnstone_ahp::entry_key(&entry).map(|(key, _)| key.to_owned()) else { continue };
            if self.told.get(&key) != Some(&entry) {
                self.told.insert(key.clone(), entry.clone());
                let set = SessionInputNeededSetAction { request: entry };
                actions.push((StateAction::SessionInputNeededSet(Box::new(set)), None));
            }
            current.push(key);
        }
        let resolved: Vec<String> = self
            .told
            .iter()
            .filter(|(key, entry)| {
                turnstone_ahp::entry_key(entry).is_some_and(|(_, chat)| chat == uri) && !current.contains(key)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in resolved {
            self.told.remove(&key);
            let removed = SessionInputNeededRemovedAction { id: key };
            actions.push((StateAction::SessionInputNeededRemoved(removed), None));
        }
        actions
    }
}

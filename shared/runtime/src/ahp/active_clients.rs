//! The clients active in each session (AHP's `activeClients`): a client joins with its tools
//! (`createSession.activeClient`, `session/activeClientSet`; VS Code sends its own entry before
//! a turn whenever the session's differs) and leaves with `session/activeClientRemoved`.
//!
//! A turn a client starts offers the agent that client's tools, as client tools it runs
//! ([`dispatch`](super::dispatch)): they ride on the turn's input (`client.message` with
//! `client: {tools, client_id}`), so the log holds what the model was offered and which client
//! answers each call ([`turnstone_ahp`] names it the call's contributor). Other clients' tools
//! are not offered in that turn.
//!
//! Who is active is the live state of connections, not of the session's log: it is memory of
//! this process ([`Memo`], and clients per session bounded, oldest forgotten first), and its
//! changes reach the session channel's subscribers on this host, each echoed with the origin of
//! the client that dispatched it. Behind API Gateway every message may reach another function
//! container, so there the entries are recorded in the connections' [`Registry`] as well, and
//! read from it: a turn started on any container offers the tools its client set on another. VS Code never removes its own entry: a client that has had
//! no connection for `[limits] active_client_grace_secs` (a reconnect within it keeps its
//! place) leaves every session it joined, told as `session/activeClientRemoved`; behind API
//! Gateway the wake-up queue carries that wait ([`super::departure`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ahp_types::actions::{ActionOrigin, StateAction};
use ahp_types::state::SessionActiveClient;
use tokio::sync::broadcast;
use turnstone_engine::ids::SessionId;
use turnstone_engine::protocol::{AgentTool, ClientContext, ToolHandler};

use super::registry::Registry;
use crate::memo::Memo;

/// Active clients kept per session at most.
const CLIENTS_PER_SESSION: usize = 16;
/// Session actions a slow subscriber may fall behind by before it misses some.
const NEWS: usize = 1024;

/// A session channel's action: the session, the action and who dispatched it.
#[derive(Debug, Clone)]
pub(crate) struct SessionNews {
    pub session_id: SessionId,
    pub action: StateAction,
    pub origin: Option<ActionOrigin>,
}

pub(crate) struct ActiveClients {
    by_session: Memo<SessionId, Vec<SessionActiveClient>>,
    /// The sessions each client joined, to leave them all once it is gone.
    joined: Memo<String, Vec<SessionId>>,
    /// Per client id: its connections open now, and how many it ever opened (a leave planned
    /// before the latest opened is called off).
    present: Mutex<HashMap<String, (usize, u64)>>,
    news: broadcast::Sender<SessionNews>,
    /// Where the entries are recorded for every process, when connections outlive this one.
    records: OnceLock<Arc<dyn Registry>>,
}

impl std::fmt::Debug for ActiveClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveClients")
            .field("recorded", &self.records.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Default for ActiveClients {
    fn default() -> Self {
        ActiveClients {
            by_session: Memo::new(),
            joined: Memo::new(),
            present: Mutex::new(HashMap::new()),
            news: broadcast::channel(NEWS).0,
            records: OnceLock::new(),
        }
    }
}

impl ActiveClients {
    /// Records the entries in `records` from now on, and reads them from it.
    pub fn record_in(&self, records: Arc<dyn Registry>) {
        let _ = self.records.set(records);
    }

    /// A connection of client `client_id` opened (it introduced itself).
    pub fn connected(&self, client_id: &str) {
        let mut present = self.present();
        let entry = present.entry(client_id.to_owned()).or_default();
        entry.0 += 1;
        entry.1 += 1;
    }

    /// A connection of client `client_id` ended: with none left, the client leaves the
    /// sessions it joined after `grace`, unless a connection of it opens meanwhile.
    pub fn disconnected(self: &Arc<Self>, client_id: &str, grace: Duration) {
        let planned = {
            let mut present = self.present();
            let Some(entry) = present.get_mut(client_id) else { return };
            entry.0 = entry.0.saturating_sub(1);
            (entry.0 == 0).then_some(entry.1)
        };
        let Some(opened) = planned else { return };
        let (this, client_id) = (Arc::clone(self), client_id.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            this.leave_if_gone(&client_id, opened).await;
        });
    }

    /// Client `client_id` leaves every session it joined, if it has had no connection since
    /// its `opened`-th.
    async fn leave_if_gone(&self, client_id: &str, opened: u64) {
        {
            let mut present = self.present();
            if present.get(client_id) != Some(&(0, opened)) {
                return;
            }
            present.remove(client_id);
        }
        for session in self.joined.remove(client_id).unwrap_or_default() {
            self.remove(&session, client_id, None).await;
        }
    }

    fn present(&self) -> std::sync::MutexGuard<'_, HashMap<String, (usize, u64)>> {
        // Counts only: a poisoned map is still a usable one.
        self.present.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Session `session`'s active clients, in the order they joined: as recorded where they
    /// are (this process's memory when the record cannot be read).
    pub async fn of(&self, session: &SessionId) -> Vec<SessionActiveClient> {
        if let Some(records) = self.records.get() {
            match records.active_clients(session).await {
                Ok(clients) => {
                    self.by_session.insert(session.clone(), clients.clone());
                    return clients;
                }
                Err(e) => {
                    tracing::warn!(session_id = %session, error = %e, "the active clients could not be read")
                }
            }
        }
        self.by_session.get(session).unwrap_or_default()
    }

    /// Adds or replaces `client`'s entry (by its client id), and tells the session channel.
    pub async fn set(&self, session: &SessionId, client: SessionActiveClient, origin: Option<ActionOrigin>) {
        if let Some(records) = self.records.get()
            && let Err(e) = records.set_active_client(session, &client, CLIENTS_PER_SESSION).await
        {
            tracing::warn!(session_id = %session, error = %e, "an active client could not be recorded");
        }
        self.by_session.update(session.clone(), |known| {
            let mut clients = known.cloned().unwrap_or_default();
            match clients.iter_mut().find(|c| c.client_id == client.client_id) {
                Some(known) => *known = client.clone(),
                None => clients.push(client.clone()),
            }
            if clients.len() > CLIENTS_PER_SESSION {
                clients.remove(0);
            }
            clients
        });
        self.joined.update(client.client_id.clone(), |known| {
            let mut sessions = known.cloned().unwrap_or_default();
            if !sessions.contains(session) {
                sessions.push(session.clone());
            }
            sessions
        });
        let action = StateAction::SessionActiveClientSet(ahp_types::actions::SessionActiveClientSetAction {
            active_client: client,
        });
        self.tell(session, action, origin);
    }

    /// Removes client `client_id`'s entry (a no-op when it has none), and tells the session
    /// channel.
    pub async fn remove(&self, session: &SessionId, client_id: &str, origin: Option<ActionOrigin>) {
        if let Some(records) = self.records.get()
            && let Err(e) = records.remove_active_client(session, client_id).await
        {
            tracing::warn!(session_id = %session, error = %e, "an active client's leaving could not be recorded");
        }
        self.by_session.update(session.clone(), |known| {
            let mut clients = known.cloned().unwrap_or_default();
            clients.retain(|c| c.client_id != client_id);
            clients
        });
        self.joined.update(client_id.to_owned(), |known| {
            known.into_iter().flatten().filter(|s| *s != session).cloned().collect()
        });
        let action =
            StateAction::SessionActiveClientRemoved(ahp_types::actions::SessionActiveClientRemovedAction {
                client_id: client_id.to_owned(),
            });
        self.tell(session, action, origin);
    }

    /// The client context of a turn client `client_id` starts in `session`: its tools, as
    /// client tools it runs; `None` when it is not active there or offers no tool.
    pub async fn context(&self, session: &SessionId, client_id: &str) -> Option<ClientContext> {
        let clients = self.of(session).await;
        let client = clients.iter().find(|c| c.client_id == client_id)?;
        let tools: Vec<AgentTool> = client
            .tools
            .iter()
            .map(|tool| AgentTool {
                name: tool.name.clone(),
                description: tool.description.clone().or_else(|| tool.title.clone()),
                input: tool.input_schema.as_ref().and_then(|s| serde_json::to_value(s).ok()),
                output: tool.output_schema.as_ref().and_then(|s| serde_json::to_value(s).ok()),
                handler: Some(ToolHandler::Client),
                approval: None,
                mcp: None,
            })
            .collect();
        (!tools.is_empty()).then(|| ClientContext {
            tools: Some(tools),
            client_id: Some(client_id.to_owned()),
            ..ClientContext::default()
        })
    }

    /// Session channel actions from now on.
    pub fn news(&self) -> broadcast::Receiver<SessionNews> {
        self.news.subscribe()
    }

    fn tell(&self, session: &SessionId, action: StateAction, origin: Option<ActionOrigin>) {
        // Nobody subscribed: nobody to tell.
        let _ = self.news.send(SessionNews { session_id: session.clone(), action, origin });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::state::ToolDefinition;
    use serde_json::json;

    fn client(id: &str, tools: &[&str]) -> SessionActiveClient {
        SessionActiveClient {
            client_id: id.to_owned(),
            display_name: None,
            tools: tools
                .iter()
                .map(|name| ToolDefinition {
                    name: (*name).to_owned(),
                    title: None,
                    description: Some(format!("{name} in the editor")),
                    input_schema: Some(serde_json::from_value(json!({"type": "object"})).unwrap()),
                    output_schema: None,
                    annotations: None,
                    meta: None,
                })
                .collect(),
            customizations: None,
        }
    }

    #[tokio::test]
    async fn a_turn_offers_its_own_clients_tools_only() {
        let active = ActiveClients::default();
        let mut news = active.news();
        let session = SessionId::from("s1");
        active.set(&session, client("w1", &["readFile"]), None).await;
        active.set(&session, client("w2", &["runTests"]), None).await;
        active.set(&session, client("w1", &["readFile", "editFile"]), None).await;
        assert_eq!(active.of(&session).await.len(), 2, "an entry is replaced by its client id");
        let context = active.context(&session, "w1").await.unwrap();
        let names: Vec<_> = context.tools.unwrap().into_iter().map(|t| (t.name, t.handler)).collect();
        assert_eq!(
            names,
            [
                ("readFile".to_owned(), Some(ToolHandler::Client)),
                ("editFile".to_owned(), Some(ToolHandler::Client))
            ]
        );
        assert_eq!(context.client_id.as_deref(), Some("w1"));
        active.remove(&session, "w2", None).await;
        assert!(active.context(&session, "w2").await.is_none());
        assert!(active.context(&SessionId::from("s2"), "w1").await.is_none());
        let kinds: Vec<_> = std::iter::from_fn(|| news.try_recv().ok())
            .map(|n| serde_json::to_value(&n.action).unwrap()["type"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            kinds,
            ["session/activeClientSet"; 3]
                .into_iter()
                .chain(["session/activeClientRemoved"])
                .collect::<Vec<_>>()
        );
    }
}

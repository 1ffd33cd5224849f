//! What a reconnecting client missed on a session channel. A session channel's actions are
//! not in any log (titles, catalogs and waits are derived; active clients are this host's
//! memory), so a replay cannot read them back: the connection's ledger keeps the session as
//! the client holds it (its snapshot, then every session action it was sent), and the replay
//! brings the actions that turn that into the session as it stands.

use ahp_types::actions::{
    PartialChatSummary, SessionActiveClientRemovedAction, SessionActiveClientSetAction,
    SessionChatAddedAction, SessionChatRemovedAction, SessionChatUpdatedAction,
    SessionInputNeededRemovedAction, SessionInputNeededSetAction, SessionTitleChangedAction, StateAction,
};
use ahp_types::state::{ChatSummary, SessionState};

/// The actions that turn `held` (the client's copy) into `now`: title, active clients, the
/// catalog of chats, and what they wait for; each entry set or updated, then those gone removed.
pub(crate) fn missed(held: &SessionState, now: &SessionState) -> Vec<StateAction> {
    let mut actions = Vec::new();
    if held.title != now.title {
        actions
            .push(StateAction::SessionTitleChanged(SessionTitleChangedAction { title: now.title.clone() }));
    }
    for client in &now.active_clients {
        if !held.active_clients.contains(client) {
            let set = SessionActiveClientSetAction { active_client: client.clone() };
            actions.push(StateAction::SessionActiveClientSet(set));
        }
    }
    for client in &held.active_clients {
        if !now.active_clients.iter().any(|c| c.client_id == client.client_id) {
            let removed = SessionActiveClientRemovedAction { client_id: client.client_id.clone() };
            actions.push(StateAction::SessionActiveClientRemoved(removed));
        }
    }
    for chat in &now.chats {
        match held.chats.iter().find(|c| c.resource == chat.resource) {
            None => {
                actions.push(StateAction::SessionChatAdded(SessionChatAddedAction { summary: chat.clone() }))
            }
            Some(before) => {
                if let Some(changes) = changes(before, chat) {
                    let chat = chat.resource.clone();
                    actions.push(StateAction::SessionChatUpdated(SessionChatUpdatedAction { chat, changes }));
                }
            }
        }
    }
    for chat in &held.chats {
        if !now.chats.iter().any(|c| c.resource == chat.resource) {
            let removed = SessionChatRemovedAction { chat: chat.resource.clone() };
            actions.push(StateAction::SessionChatRemoved(removed));
        }
    }
    let (held_waits, now_waits) =
        (held.input_needed.as_deref().unwrap_or_default(), now.input_needed.as_deref().unwrap_or_default());
    for entry in now_waits {
        if !held_waits.contains(entry) {
            let set = SessionInputNeededSetAction { request: entry.clone() };
            actions.push(StateAction::SessionInputNeededSet(Box::new(set)));
        }
    }
    for entry in held_waits {
        let Some((id, _)) = turnstone_ahp::entry_key(entry) else { continue };
        if !now_waits.iter().any(|e| turnstone_ahp::entry_key(e).is_some_and(|(other, _)| other == id)) {
            let removed = SessionInputNeededRemovedAction { id: id.to_owned() };
            actions.push(StateAction::SessionInputNeededRemoved(removed));
        }
    }
    actions
}

/// The summary fields of a chat that changed from `before` to `now`, if any.
fn changes(before: &ChatSummary, now: &ChatSummary) -> Option<PartialChatSummary> {
    let mut changes = PartialChatSummary::default();
    if before.title != now.title {
        changes.title = Some(now.title.clone());
    }
    if before.status != now.status {
        changes.status = Some(now.status);
    }
    if before.activity != now.activity {
        changes.activity.clone_from(&now.activity);
    }
    if before.modified_at != now.modified_at {
        changes.modified_at = Some(now.modified_at.clone());
    }
    if before.interactivity != now.interactivity {
        changes.interactivity = now.interactivity;
    }
    (changes != PartialChatSummary::default()).then_some(changes)
}

#[cfg(test)]
mod tests {
    use ahp::reducers::apply_action_to_session;
    use serde_json::json;

    use super::*;

    fn session(value: serde_json::Value) -> SessionState {
        serde_json::from_value(value).unwrap()
    }

    fn chat(resource: &str, status: u32) -> serde_json::Value {
        json!({"resource": resource, "title": "demo", "status": status, "modifiedAt": format!("2026-12-04T10:00:0{status}Z")})
    }

    fn waiting(id: &str) -> serde_json::Value {
        json!({"kind": "chatInput", "id": id, "chat": "ahp-chat:/s", "request": {"id": id}})
    }

    #[test]
    fn the_missed_actions_turn_the_held_session_into_the_current_one() {
        let held = session(json!({
            "provider": "demo", "title": "Old", "status": 1, "lifecycle": "ready",
            "activeClients": [{"clientId": "w1", "tools": []}, {"clientId": "w2", "tools": []}],
            "chats": [chat("ahp-chat:/s", 1), chat("ahp-chat:/fork", 1)],
            "inputNeeded": [waiting("ahp-chat:/s#i1"), waiting("ahp-chat:/s#i2")],
        }));
        let now = session(json!({
            "provider": "demo", "title": "New", "status": 8, "lifecycle": "ready",
            "activeClients": [{"clientId": "w2", "tools": [{"name": "readFile"}]}, {"clientId": "w3", "tools": []}],
            "chats": [chat("ahp-chat:/s", 8), chat("ahp-chat:/child", 1)],
            "inputNeeded": [waiting("ahp-chat:/s#i2"), waiting("ahp-chat:/s#i3")],
        }));
        let actions = missed(&held, &now);
        let mut reduced = held.clone();
        for action in &actions {
            apply_action_to_session(&mut reduced, action);
        }
        assert_eq!(reduced.title, now.title);
        assert_eq!(reduced.active_clients, now.active_clients);
        assert_eq!(reduced.chats, now.chats);
        assert_eq!(reduced.input_needed, now.input_needed);
        assert!(missed(&now, &now).is_empty(), "nothing missed, nothing sent");
    }
}

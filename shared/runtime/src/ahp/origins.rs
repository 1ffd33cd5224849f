//! Who dispatched what: the origin (`clientId`, `clientSeq`) of each accepted client action,
//! so the action the projection makes of its effect goes out as the client's echo.
//!
//! The engine does not keep AHP client ids, so this is memory of this host: bounded, oldest
//! forgotten first. An echo without its origin (after a restart, or one forgotten) still
//! carries the state; a client only loses the match with its optimistic copy.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use ahp_types::actions::{ActionOrigin, StateAction};
use turnstone_engine::ids::SessionId;

/// Origins remembered at most.
const KEEP: usize = 4096;

/// What an echo is matched by: the session and the action's kind and subject.
type Key = (SessionId, String);

#[derive(Debug, Default)]
pub(crate) struct Origins {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_key: HashMap<Key, ActionOrigin>,
    order: VecDeque<Key>,
}

impl Origins {
    /// Remembers that `action` of session `session` was dispatched as `origin`.
    pub fn remember(&self, session: &SessionId, action: &StateAction, origin: ActionOrigin) {
        let Some(subject) = subject(action) else { return };
        let key = (session.clone(), subject);
        let mut inner = self.lock();
        if inner.by_key.insert(key.clone(), origin).is_none() {
            inner.order.push_back(key);
        }
        while inner.order.len() > KEEP {
            if let Some(old) = inner.order.pop_front() {
                inner.by_key.remove(&old);
            }
        }
    }

    /// Forgets the origin of `action` (it was refused).
    pub fn forget(&self, session: &SessionId, action: &StateAction) {
        let Some(subject) = subject(action) else { return };
        self.lock().by_key.remove(&(session.clone(), subject));
    }

    /// The origin of the client action `action` (projected from session `session`) echoes.
    pub fn of(&self, session: &SessionId, action: &StateAction) -> Option<ActionOrigin> {
        let subject = subject(action)?;
        self.lock().by_key.get(&(session.clone(), subject)).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Only hints live here: a poisoned map is still a usable one.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The kind and subject of an action a client may dispatch, e.g. `chat/turnStarted turn-1`.
fn subject(action: &StateAction) -> Option<String> {
    let (kind, id) = match action {
        StateAction::ChatTurnStarted(a) => ("chat/turnStarted", a.turn_id.as_str()),
        StateAction::ChatTurnCancelled(a) => ("chat/turnCancelled", a.turn_id.as_str()),
        StateAction::ChatInputCompleted(a) => ("chat/inputCompleted", a.request_id.as_str()),
        StateAction::ChatToolCallComplete(a) => ("chat/toolCallComplete", a.tool_call_id.as_str()),
        StateAction::ChatToolCallConfirmed(a) => ("chat/toolCallConfirmed", a.tool_call_id.as_str()),
        StateAction::SessionTitleChanged(a) => ("session/titleChanged", a.title.as_str()),
        StateAction::ChatPendingMessageSet(a) => ("chat/pendingMessageSet", a.id.as_str()),
        StateAction::ChatTruncated(a) => ("chat/truncated", a.turn_id.as_deref().unwrap_or_default()),
        StateAction::ChatTurnResume(a) => ("chat/turnResume", a.turn_id.as_str()),
        _ => return None,
    };
    Some(format!("{kind} {id}"))
}

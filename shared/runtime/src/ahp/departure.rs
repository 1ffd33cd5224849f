//! A client gone for good behind API Gateway: when the last connection of a client (a VS Code
//! window, by its `clientId`) ends, the client leaves the sessions it is active in after
//! `[limits] active_client_grace_secs`, unless it connects again meanwhile, as on the local
//! host ([`super::active_clients`]). No function outlives the connection to wait out the
//! grace, so the wake-up queue carries the wait: one delayed wake-up per session, marked
//! [`Departed`], which the `dispatch` function hands here instead of running the session. The
//! registry says whether the client is still gone ([`super::registry::Registry::departed`]): it has no open
//! connection, and none ended after the one that planned the leaving.

use std::time::Duration;

use ahp_types::actions::{SessionActiveClientRemovedAction, StateAction};
use turnstone_engine::ids::SessionId;

use super::push::{PushError, Pushes};
use super::registry::RegistryError;
use crate::queue::{Departed, WakeUp};

/// Why a departure's wake-up was sent (for logs).
const REASON: &str = "departed";

impl Pushes {
    /// Removes connection `connection`'s records; when it was its client's last, the client's
    /// leaving of each session it is active in is queued for after the grace.
    pub(crate) async fn forget(&self, connection: &str) -> Result<(), RegistryError> {
        let Some(departure) = self.registry.disconnect(connection).await? else { return Ok(()) };
        let Some(host) = self.host() else { return Ok(()) };
        let grace = u64::try_from(host.app.limits().active_client_grace_secs).unwrap_or(u64::MAX);
        for session in departure.sessions {
            let departed = Departed { client_id: departure.client_id.clone(), at: departure.at };
            let wake_up = WakeUp { departed: Some(departed), ..WakeUp::new(session.as_str(), REASON) };
            host.app.enqueue(wake_up, Duration::from_secs(grace)).await.map_err(|e| {
                RegistryError(format!(
                    "client {}'s leaving of session {session} could not be queued: {e}",
                    departure.client_id
                ))
            })?;
        }
        Ok(())
    }

    /// A departure's wake-up, due: the client leaves session `session`'s active clients (told
    /// to the session channel's subscribers as `session/activeClientRemoved`) if it is still
    /// gone.
    pub async fn depart(&self, session: &SessionId, departed: &Departed) -> Result<(), String> {
        self.leave_if_gone(session, departed).await.map_err(|e| e.to_string())
    }

    async fn leave_if_gone(&self, session: &SessionId, departed: &Departed) -> Result<(), PushError> {
        let Some(host) = self.host() else { return Err(PushError::Detached) };
        if !self.registry.departed(&departed.client_id, departed.at).await? {
            return Ok(());
        }
        host.active_clients.remove(session, &departed.client_id, None).await;
        let action = StateAction::SessionActiveClientRemoved(SessionActiveClientRemovedAction {
            client_id: departed.client_id.clone(),
        });
        self.tell_session(session, &action, None).await
    }
}

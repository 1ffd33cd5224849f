//! `root/configChanged`: the configuration values a client dispatches to the root channel
//! (VS Code sends its telemetry level, terminal auto-approval rules, workspace trust and
//! synced settings right after every `initialize` and `reconnect`, each with `clientSeq` 0).
//!
//! Turnstone's agents take no settings from clients, so nothing acts on them; they are kept
//! per caller and client id, and the root snapshots that client is sent show them as
//! `config.values` (an empty schema: the host declares no setting). A client's values are its
//! own (workspace trust names paths of its machine): no other client, and no other caller
//! using the same client id, sees them. Memory of this process ([`Memo`]: bounded, the least
//! recently used forgotten first); a client sends its configuration again after each
//! reconnect.

use std::collections::HashMap;

use ahp_types::actions::RootConfigChangedAction;
use ahp_types::common::JsonObject;
use ahp_types::state::{ConfigSchema, RootConfigState};

use crate::auth::Caller;
use crate::memo::Memo;

/// Whose values: the caller's key (none for the open host's anyone) and its client id.
type Key = (Option<String>, String);

#[derive(Debug, Default)]
pub(crate) struct RootConfigs {
    values: Memo<Key, JsonObject>,
}

impl RootConfigs {
    /// Applies `action` of client `client_id` of `caller`: its values merged into what the
    /// client set before, or replacing them (`replace`), as AHP's reducer does.
    pub fn apply(&self, caller: &Caller, client_id: &str, action: &RootConfigChangedAction) {
        self.values.update((caller.key(), client_id.to_owned()), |known| {
            let mut values = match (known, action.replace) {
                (Some(known), None | Some(false)) => known.clone(),
                _ => JsonObject::new(),
            };
            values.extend(action.config.iter().map(|(k, v)| (k.clone(), v.clone())));
            values
        });
    }

    /// The root state's `config` for client `client_id` of `caller`: what it set, if anything.
    pub fn of(&self, caller: &Caller, client_id: &str) -> Option<RootConfigState> {
        let values = self.values.get(&(caller.key(), client_id.to_owned()))?;
        let schema = ConfigSchema { r#type: "object".to_owned(), properties: HashMap::new(), required: None };
        Some(RootConfigState { schema, values })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use turnstone_engine::protocol::WorkerIdentity;

    fn changed(config: serde_json::Value, replace: Option<bool>) -> RootConfigChangedAction {
        let serde_json::Value::Object(config) = config else { panic!("not an object") };
        RootConfigChangedAction { config: config.into_iter().collect(), replace }
    }

    fn client(name: &str) -> Caller {
        Caller::Client {
            identity: WorkerIdentity { id: Some(format!("client:{name}")), metadata: None },
            expires_at: None,
        }
    }

    #[test]
    fn values_merge_or_replace_and_stay_with_their_caller_and_client() {
        let configs = RootConfigs::default();
        let (ana, bob) = (client("ana"), client("bob"));
        configs.apply(&ana, "w1", &changed(json!({"telemetryLevel": "off"}), None));
        configs.apply(&ana, "w1", &changed(json!({"trustedUris": ["file:///home/ana"]}), None));
        let kept = configs.of(&ana, "w1").unwrap();
        assert_eq!(
            serde_json::to_value(&kept.values).unwrap(),
            json!({"telemetryLevel": "off", "trustedUris": ["file:///home/ana"]})
        );
        assert!(configs.of(&bob, "w1").is_none(), "another caller with the same client id sees nothing");
        assert!(configs.of(&ana, "w2").is_none());
        configs.apply(&ana, "w1", &changed(json!({"telemetryLevel": "all"}), Some(true)));
        let replaced = configs.of(&ana, "w1").unwrap();
        assert_eq!(serde_json::to_value(&replaced.values).unwrap(), json!({"telemetryLevel": "all"}));
    }
}

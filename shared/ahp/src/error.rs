//! Why a projection failed.

/// A projection failure: always a bug in the mapping, never bad input, since the engine's log
/// is trusted. After one, the chat may hold the actions of the failing event that went before.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProjectionError {
    /// The AHP reducer did not apply an action the projection emitted (a no-op or an invalid
    /// action): the projected chat would differ from what the action claims.
    #[error("the AHP reducer did not apply {action} ({outcome}) while projecting {source_name}")]
    NotApplied {
        /// The action's wire type, e.g. `chat/delta`.
        action: String,
        /// What the reducer reported, e.g. `NoOp`.
        outcome: String,
        /// What was being projected: an event's name (`call.settled`) or `stream delta`.
        source_name: &'static str,
    },
}

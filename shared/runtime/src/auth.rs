//! Who is calling, and what they may do to a session.
//!
//! With `[auth]` configured, every request presents `Authorization: Bearer <token>`, and the
//! token is one of:
//! - a **client key** (`api_keys_env`) or an **HS256 JWT** (`jwt_secret_env`, `sub` is the
//!   identity, `exp` required, `nbf` checked, `iss`/`aud` checked when configured): a client,
//!   which owns the sessions it creates and can reach no other;
//! - a **machine key** (`machine_keys_env`): a worker, which may only settle calls
//!   (`calls/settle`) of sessions whose agent it serves (`[auth.machines]`), and only the
//!   calls its worker runs;
//! - an **admin key** (`admin_keys_env`): may read every session, and owns what it creates.
//!
//! Identities are typed: a session's owner is `client:<key name>`, `jwt:<sub>` or
//! `admin:<key name>` ([`owner_id`]), so names of different kinds never meet. A JWT's subject
//! is the client key of the same name (`client:<sub>`) only with `[auth]
//! jwt_sub_is_api_key_name = true`.
//!
//! A session the caller may not reach answers exactly as one that does not exist (404
//! `session_not_found`), so ids do not leak. Without `[auth]` (loopback development) every
//! caller may do everything, and sessions have no owner. Keys are compared in constant time.

use std::collections::BTreeMap;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use turnstone_engine::protocol::WorkerIdentity;
use turnstone_engine::session::Session;

use crate::config::{AuthConfig, Secrets};

/// The kind of an identity. Names of different kinds never meet: a client key, an admin key
/// and a JWT subject may all be called `root` and are three identities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A client key (`api_keys_env`), or a JWT when `jwt_sub_is_api_key_name` says so.
    Client,
    /// An HS256 JWT's `sub`.
    Jwt,
    /// An admin key.
    Admin,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Client => "client",
            Kind::Jwt => "jwt",
            Kind::Admin => "admin",
        }
    }
}

/// `kind:name`: the owner id a session records (`WorkerIdentity.id`, the summary's `owner`,
/// `?owner=`). The kind comes first and ends at the first `:`, so no name of one kind can
/// spell another kind's id.
pub fn owner_id(kind: Kind, name: &str) -> String {
    format!("{}:{name}", kind.prefix())
}

/// Whether `id` is [`owner_id`]`(kind, name)`, without building it.
fn is_owner_id(id: &str, kind: Kind, name: &str) -> bool {
    id.strip_prefix(kind.prefix()).and_then(|rest| rest.strip_prefix(':')) == Some(name)
}

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No `[auth]`: everything is allowed, sessions have no owner.
    Anyone,
    /// A client (API key or JWT): owns the sessions it creates. `identity.id` is its typed
    /// owner id ([`owner_id`]).
    Client {
        identity: WorkerIdentity,
        /// When its token stops being valid (a JWT's `exp`, Unix seconds); `None`: a key.
        expires_at: Option<u64>,
    },
    /// A worker's machine key: settles calls of the agents it serves.
    Machine { name: String, agents: AgentScope },
    /// An admin key: reads every session.
    Admin { name: String },
}

/// The agents a machine key serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentScope {
    /// `"*"`: every agent.
    All,
    Only(Vec<String>),
}

impl AgentScope {
    fn serves(&self, agent_id: &str) -> bool {
        match self {
            AgentScope::All => true,
            AgentScope::Only(agents) => agents.iter().any(|a| a == agent_id),
        }
    }
}

/// Which sessions a caller may list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// Every session (optionally filtered by `?owner=`).
    Any,
    /// Only those this owner id owns.
    OwnedBy(String),
    /// None: the caller is not a client.
    Nothing,
}

impl Listing {
    /// Whether a session owned by `owner` is among these.
    pub fn shows(&self, owner: Option<&str>) -> bool {
        match self {
            Listing::Any => true,
            Listing::OwnedBy(me) => owner == Some(me.as_str()),
            Listing::Nothing => false,
        }
    }
}

/// What a request does to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Summary, messages, turns, events, the event stream.
    Read,
    /// Inputs, cancel, forks, disposal.
    Drive,
    /// `calls/settle`. Which calls a caller may settle is [`Caller::may_settle`]'s.
    Settle,
}

/// Who may settle a call: its handler's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settler {
    /// A client-handled call (`handler: "client"`, or a tool the client brought): the
    /// session's owner answers it.
    Client,
    /// A call the worker runs (a worker tool, a worker-run model call): the agent's machine
    /// keys answer it.
    Worker,
}

impl Caller {
    /// A client identified by a key or a token of `kind` (`Client` or `Jwt`).
    pub fn client(kind: Kind, name: &str) -> Caller {
        Caller::Client {
            identity: WorkerIdentity { id: Some(owner_id(kind, name)), metadata: None },
            expires_at: None,
        }
    }

    /// The identity that owns a session this caller creates; `None` for callers that cannot
    /// create sessions (machines).
    pub fn owner(&self) -> Option<WorkerIdentity> {
        match self {
            Caller::Anyone => Some(WorkerIdentity::default()),
            Caller::Client { identity, .. } => Some(identity.clone()),
            Caller::Admin { name } => {
                Some(WorkerIdentity { id: Some(owner_id(Kind::Admin, name)), metadata: None })
            }
            Caller::Machine { .. } => None,
        }
    }

    /// Who this caller is, as one string per identity (for per-caller caps); `None` for the
    /// open host's caller, who is everyone.
    pub fn key(&self) -> Option<String> {
        match self {
            Caller::Anyone => None,
            Caller::Client { identity, .. } => identity.id.clone(),
            Caller::Machine { name, .. } => Some(format!("machine:{name}")),
            Caller::Admin { name } => Some(owner_id(Kind::Admin, name)),
        }
    }

    /// When this caller's credential expires (Unix seconds): a socket it opened is closed
    /// then. `None`: it does not expire.
    pub fn expires_at(&self) -> Option<u64> {
        match self {
            Caller::Client { expires_at, .. } => *expires_at,
            _ => None,
        }
    }

    /// Whether this caller may `access` `session` (which exists).
    pub fn may(&self, access: Access, session: &Session) -> bool {
        // Compared in place: this runs on every request, so no owner id is built for it.
        let owner = session.init().and_then(|i| i.identity.id.as_deref());
        match self {
            Caller::Anyone => true,
            Caller::Client { identity, .. } => identity.id.is_some() && owner == identity.id.as_deref(),
            Caller::Admin { name } => {
                access == Access::Read || owner.is_some_and(|o| is_owner_id(o, Kind::Admin, name))
            }
            Caller::Machine { agents, .. } => access == Access::Settle && agents.serves(session.agent_id()),
        }
    }

    /// Whether this caller, which may [`Access::Settle`] in the session, may settle a call
    /// that `settler` answers. The owner answers its client's calls, the agent's machine keys
    /// its worker's; an open host lets anyone answer anything.
    pub fn may_settle(&self, settler: Settler) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Client { .. } | Caller::Admin { .. } => settler == Settler::Client,
            Caller::Machine { .. } => settler == Settler::Worker,
        }
    }

    /// Whose sessions `GET /v1/sessions` lists for this caller.
    pub fn listing(&self) -> Listing {
        match self {
            Caller::Anyone | Caller::Admin { .. } => Listing::Any,
            Caller::Client { identity, .. } => identity.id.clone().map_or(Listing::Nothing, Listing::OwnedBy),
            Caller::Machine { .. } => Listing::Nothing,
        }
    }
}

/// Why a request is not authenticated. The text is safe to show: it never echoes the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("a valid API key or token is required (Authorization: Bearer <key>)")]
    Missing,
    #[error("the API key or token is not valid")]
    Invalid,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
}

/// Checks bearer tokens against the configured keys and JWT settings.
pub struct Authenticator {
    clients: Vec<(String, String)>,
    machines: Vec<(String, String, AgentScope)>,
    admins: Vec<(String, String)>,
    jwt: Option<Jwt>,
}

struct Jwt {
    key: DecodingKey,
    validation: Validation,
    metadata_claims: Vec<String>,
    /// The kind a token's `sub` names: [`Kind::Jwt`], or [`Kind::Client`] when
    /// `jwt_sub_is_api_key_name` makes a subject the client key of that name.
    kind: Kind,
}

/// The shortest HS256 secret accepted, in bytes: the hash's own output size (RFC 7518 section
/// 3.2: "A key of the same size as the hash output ... or larger MUST be used").
pub const MIN_JWT_SECRET_BYTES: usize = 32;

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("clients", &self.clients.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("machines", &self.machines.iter().map(|(n, _, _)| n).collect::<Vec<_>>())
            .field("admins", &self.admins.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("jwt", &self.jwt.is_some())
            .finish()
    }
}

impl Authenticator {
    /// The authenticator `[auth]` describes, with the keys `secrets` read; `None` without
    /// `[auth]` (every caller is [`Caller::Anyone`]).
    pub fn new(auth: Option<&AuthConfig>, secrets: &Secrets) -> Option<Self> {
        let auth = auth?;
        let scope = |name: &str| match auth.machines.get(name) {
            Some(agents) if agents.iter().any(|a| a == "*") => AgentScope::All,
            Some(agents) => AgentScope::Only(agents.clone()),
            None => AgentScope::Only(Vec::new()),
        };
        let jwt = secrets.jwt_secret().map(|secret| {
            let mut validation = Validation::new(Algorithm::HS256);
            // One rule on every route that reads a token (requests, WebSocket upgrades, an open
            // socket, pushes to its subscriptions): valid until its `exp`, not on or after it
            // (RFC 7519, 4.1.4), with no leeway. A leeway on requests alone let a token open
            // nothing a request could not, yet be refused at an upgrade; a socket lives until
            // its token's `exp`, so that is where every route ends it. Issuers allow for clock
            // skew in the `exp` they set.
            validation.leeway = 0;
            validation.set_required_spec_claims(&["exp", "sub"]);
            // A token not valid yet is refused as one past its `exp` is.
            validation.validate_nbf = true;
            if let Some(issuer) = &auth.jwt_issuer {
                validation.set_issuer(&[issuer]);
            }
            match &auth.jwt_audience {
                Some(audience) => validation.set_audience(&[audience]),
                None => validation.validate_aud = false,
            }
            Jwt {
                key: DecodingKey::from_secret(secret.as_bytes()),
                validation,
                metadata_claims: auth.jwt_metadata_claims.clone(),
                kind: if auth.jwt_sub_is_api_key_name { Kind::Client } else { Kind::Jwt },
            }
        });
        Some(Authenticator {
            clients: secrets.client_keys().to_vec(),
            machines: secrets.machine_keys().iter().map(|(n, k)| (n.clone(), k.clone(), scope(n))).collect(),
            admins: secrets.admin_keys().to_vec(),
            jwt,
        })
    }

    /// The caller presenting `authorization` (the header's value, if any).
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, AuthError> {
        let token = authorization
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .ok_or(AuthError::Missing)?;
        self.authenticate_token(token)
    }

    /// The caller of a WebSocket upgrade: by its `Authorization` header's value as every
    /// request's or, without one, by `token`, the token a browser's WebSocket (which cannot set
    /// headers) carries in the URL's `tkn` parameter. The header wins when both are there. A
    /// token past its expiry is refused, as on every route.
    pub fn authenticate_upgrade(
        &self,
        authorization: Option<&str>,
        token: Option<&str>,
    ) -> Result<Caller, AuthError> {
        let caller = match (authorization, token) {
            (None, Some(token)) => self.authenticate_token(token),
            (authorization, _) => self.authenticate(authorization),
        }?;
        // A key's caller never expires; a JWT's was checked against its `exp` already, and
        // this says so for a token that expires between the two checks.
        if expired(caller.expires_at()) {
            return Err(AuthError::Expired);
        }
        Ok(caller)
    }

    /// The caller presenting `token` itself (a key or a JWT), however it arrived: the
    /// `Authorization` header, or where a browser's WebSocket puts it (the `tkn` query
    /// parameter). The same checks apply either way.
    pub fn authenticate_token(&self, token: &str) -> Result<Caller, AuthError> {
        let token = Some(token.trim()).filter(|t| !t.is_empty()).ok_or(AuthError::Missing)?;
        // Every key is compared, whatever matched first, so timing does not tell which list or
        // which position holds a key.
        let mut found: Option<Caller> = None;
        for (name, key) in &self.clients {
            if constant_time_eq(key.as_bytes(), token.as_bytes()) && found.is_none() {
                found = Some(Caller::client(Kind::Client, name));
            }
        }
        for (name, key, agents) in &self.machines {
            if constant_time_eq(key.as_bytes(), token.as_bytes()) && found.is_none() {
                found = Some(Caller::Machine { name: name.clone(), agents: agents.clone() });
            }
        }
        for (name, key) in &self.admins {
            if constant_time_eq(key.as_bytes(), token.as_bytes()) && found.is_none() {
                found = Some(Caller::Admin { name: name.clone() });
            }
        }
        if let Some(caller) = found {
            return Ok(caller);
        }
        match &self.jwt {
            Some(jwt) if token.split('.').count() == 3 => jwt.verify(token),
            _ => Err(AuthError::Invalid),
        }
    }
}

impl Jwt {
    fn verify(&self, token: &str) -> Result<Caller, AuthError> {
        use jsonwebtoken::errors::ErrorKind;
        let claims = jsonwebtoken::decode::<BTreeMap<String, Value>>(token, &self.key, &self.validation)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => AuthError::Expired,
                ErrorKind::ImmatureSignature => AuthError::NotYetValid,
                _ => AuthError::Invalid,
            })?
            .claims;
        let sub =
            claims.get("sub").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or(AuthError::Invalid)?;
        let metadata: BTreeMap<String, String> = self
            .metadata_claims
            .iter()
            .filter_map(|name| {
                let value = match claims.get(name)? {
                    Value::String(text) => text.clone(),
                    Value::Null => return None,
                    other => other.to_string(),
                };
                Some((name.clone(), value))
            })
            .collect();
        let metadata = (!metadata.is_empty()).then_some(metadata);
        let expires_at = claims.get("exp").and_then(Value::as_u64);
        let identity = WorkerIdentity { id: Some(owner_id(self.kind, sub)), metadata };
        Ok(Caller::Client { identity, expires_at })
    }
}

/// Compares two byte strings without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How long until a credential that expires at `expires_at` (Unix seconds) does, by the wall
/// clock (a token's `exp` is wall-clock time); zero once it has.
pub fn time_left(expires_at: u64) -> std::time::Duration {
    use crate::clock::Clock as _;
    let now = u64::try_from(crate::clock::SystemClock.now().0).unwrap_or(0);
    std::time::Duration::from_millis(expires_at.saturating_mul(1000).saturating_sub(now))
}

/// Whether a credential that expires at `expires_at` has: a token is not valid on or after its
/// `exp` (RFC 7519, section 4.1.4). `None` never expires.
pub fn expired(expires_at: Option<u64>) -> bool {
    expires_at.is_some_and(|at| time_left(at).is_zero())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::{Clock, SystemClock};

    #[test]
    fn expiry_is_on_or_after_exp() {
        let now = u64::try_from(SystemClock.now().0 / 1000).unwrap_or(0);
        assert!(expired(Some(now)));
        assert!(expired(Some(now.saturating_sub(5))));
        assert!(!expired(Some(now + 60)));
        assert!(!expired(None));
        assert!(time_left(now + 60) > Duration::from_secs(58));
    }
}

//! Secrets named by the configuration, read from the environment.

use super::*;

/// The secret values a [`Config`] names, read from the environment. `Debug` shows names only.
#[derive(Clone, Default)]
pub struct Secrets {
    pub(super) llm_keys: BTreeMap<String, String>,
    pub(super) worker_secrets: BTreeMap<String, String>,
    /// MCP servers' header values by (agent, server name), `(header, value)`.
    pub(super) mcp_headers: BTreeMap<(String, String), Vec<(String, String)>>,
    pub(super) auth: Option<AuthSecrets>,
}

/// The keys and the JWT secret `[auth]` names.
#[derive(Clone, Default)]
pub(super) struct AuthSecrets {
    pub(super) clients: Vec<(String, String)>,
    pub(super) machines: Vec<(String, String)>,
    pub(super) admins: Vec<(String, String)>,
    pub(super) jwt_secret: Option<String>,
}

impl Secrets {
    /// The API key of llm `id`, if its block names one.
    pub fn llm_api_key(&self, id: &str) -> Option<&str> {
        self.llm_keys.get(id).map(String::as_str)
    }

    /// The HMAC secret of agent `id`'s worker, if its section names one.
    pub fn worker_secret(&self, agent: &str) -> Option<&str> {
        self.worker_secrets.get(agent).map(String::as_str)
    }

    /// The HTTP headers of agent `agent`'s MCP server `server`, values resolved.
    pub fn mcp_headers(&self, agent: &str, server: &str) -> &[(String, String)] {
        self.mcp_headers.get(&(agent.to_owned(), server.to_owned())).map_or(&[], Vec::as_slice)
    }

    /// Whether callers must authenticate (`[auth]` is configured).
    pub fn auth_enabled(&self) -> bool {
        self.auth.is_some()
    }

    /// The client keys, `(name, key)`, in the variable's order.
    pub fn client_keys(&self) -> &[(String, String)] {
        self.auth.as_ref().map_or(&[], |a| &a.clients)
    }

    /// The machine (worker) keys, `(name, key)`.
    pub fn machine_keys(&self) -> &[(String, String)] {
        self.auth.as_ref().map_or(&[], |a| &a.machines)
    }

    /// The admin keys, `(name, key)`.
    pub fn admin_keys(&self) -> &[(String, String)] {
        self.auth.as_ref().map_or(&[], |a| &a.admins)
    }

    /// The HS256 secret JWTs are verified with.
    pub fn jwt_secret(&self) -> Option<&str> {
        self.auth.as_ref().and_then(|a| a.jwt_secret.as_deref())
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn names(keys: &[(String, String)]) -> Names<'_> {
            Names(keys.iter().map(|(n, _)| n.as_str()).collect())
        }
        f.debug_struct("Secrets")
            .field("llm_keys", &Names(self.llm_keys.keys().map(String::as_str).collect()))
            .field("worker_secrets", &Names(self.worker_secrets.keys().map(String::as_str).collect()))
            .field("client_keys", &names(self.client_keys()))
            .field("machine_keys", &names(self.machine_keys()))
            .field("admin_keys", &names(self.admin_keys()))
            .field("jwt_secret", &self.jwt_secret().map(|_| "<redacted>"))
            .finish()
    }
}

/// Debug-prints names, each mapped to `<redacted>`.
pub(super) struct Names<'a>(Vec<&'a str>);

impl fmt::Debug for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Redacted;
        impl fmt::Debug for Redacted {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("<redacted>")
            }
        }
        f.debug_map().entries(self.0.iter().map(|name| (name, Redacted))).finish()
    }
}

/// Parses `name:key,name:key`; messages never show a key.
pub(super) fn parse_api_keys(list: &str) -> Result<Vec<(String, String)>, String> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for (i, entry) in list.split(',').map(str::trim).enumerate().filter(|(_, e)| !e.is_empty()) {
        let n = i + 1;
        let Some((name, key)) = entry.split_once(':') else {
            return Err(format!("entry {n} is not `name:key`"));
        };
        let (name, key) = (name.trim(), key.trim());
        if name.is_empty() || name.chars().any(char::is_whitespace) {
            return Err(format!("entry {n} has an empty name or one with spaces (expected `name:key`)"));
        }
        if key.is_empty() {
            return Err(format!("entry {n} ({name:?}) has an empty key"));
        }
        if keys.iter().any(|(other, _)| other == name) {
            return Err(format!("entry {n} repeats the name {name:?}"));
        }
        if keys.iter().any(|(_, other)| other == key) {
            return Err(format!("entry {n} ({name:?}) repeats the key of another entry"));
        }
        keys.push((name.to_owned(), key.to_owned()));
    }
    if keys.is_empty() {
        return Err("holds no `name:key` entry; auth would refuse every request".to_owned());
    }
    Ok(keys)
}

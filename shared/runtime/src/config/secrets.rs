//! Secrets named by the configuration, read from the environment.

use super::*;

/// The secret values a [`Config`] names, read from the environment. `Debug` shows names only.
#[derive(Clone, Default)]
pub struct Secrets {
    pub(super) llm_keys: BTreeMap<String, String>,
    pub(super) worker_secrets: BTreeMap<String, String>,
    pub(super) api_keys: Option<Vec<(String, String)>>,
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

    /// Whether clients must present an API key (`[auth]` is configured).
    pub fn auth_enabled(&self) -> bool {
        self.api_keys.is_some()
    }

    /// The names of the configured API keys, in the variable's order.
    pub fn api_key_names(&self) -> impl Iterator<Item = &str> {
        self.api_keys.iter().flatten().map(|(name, _)| name.as_str())
    }

    /// The name of the API key equal to `presented`, compared in constant time per key.
    pub fn authenticate(&self, presented: &str) -> Option<&str> {
        let mut found = None;
        for (name, key) in self.api_keys.iter().flatten() {
            if constant_time_eq(key.as_bytes(), presented.as_bytes()) && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let api_keys =
            self.api_keys.as_ref().map(|keys| Names(keys.iter().map(|(n, _)| n.as_str()).collect()));
        f.debug_struct("Secrets")
            .field("llm_keys", &Names(self.llm_keys.keys().map(String::as_str).collect()))
            .field("worker_secrets", &Names(self.worker_secrets.keys().map(String::as_str).collect()))
            .field("api_keys", &api_keys)
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

/// Compares two byte strings without stopping at the first difference.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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

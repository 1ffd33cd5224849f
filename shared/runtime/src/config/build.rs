//! The file as written (raw serde types), and the checks that turn it into a [`Config`].

use std::num::NonZeroUsize;

use super::*;

// ---------------------------------------------------------------------------------------------
// The file as written, before checks.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) server: Option<ServerConfig>,
    #[serde(default)]
    pub(super) defaults: Option<RawDefaults>,
    #[serde(default)]
    pub(super) llm: BTreeMap<String, LlmConfig>,
    #[serde(default)]
    pub(super) agent: BTreeMap<String, RawAgent>,
    #[serde(default)]
    pub(super) auth: Option<AuthConfig>,
    #[serde(default)]
    pub(super) limits: Option<LimitsConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefaults {
    pub(super) llm: Option<RawRetry>,
    pub(super) tool: Option<RawRetry>,
    pub(super) client_tool: Option<RawRetry>,
    pub(super) sub_agent: Option<RawRetry>,
    pub(super) decision: Option<RawRetry>,
}

/// The seed's `RetryPolicy`, with `timeout_secs` left out for "no timeout" (TOML has no null).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    pub(super) timeout_secs: Option<f64>,
    pub(super) max_retries: u32,
    pub(super) backoff_base_secs: f64,
    pub(super) backoff_max_secs: f64,
}

impl RawRetry {
    pub(super) fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            timeout_secs: self.timeout_secs,
            max_retries: self.max_retries,
            backoff_base_secs: self.backoff_base_secs,
            backoff_max_secs: self.backoff_max_secs,
        }
    }
}

/// The seed's `AgentConfig` fields plus the host's; built into [`AgentConfig`] field by field,
/// so a field added to the seed's type fails to compile here until it is added.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAgent {
    pub(super) model: String,
    pub(super) system: Option<String>,
    pub(super) stream: Option<bool>,
    pub(super) handler: Option<LlmHandler>,
    pub(super) format: Option<LlmFormat>,
    pub(super) retry: Option<RawRetry>,
    pub(super) tools: Option<Vec<AgentTool>>,
    pub(super) sub_agents: Option<Vec<SubAgent>>,
    pub(super) llm: Option<String>,
    pub(super) worker: Option<String>,
    pub(super) worker_secret_env: Option<String>,
    pub(super) worker_messages: Option<usize>,
    pub(super) max_cost: Option<RawMoney>,
    pub(super) max_llm_calls: Option<u64>,
    pub(super) mcp: Option<Vec<McpServerConfig>>,
    pub(super) context_window: Option<u64>,
    pub(super) max_output_tokens: Option<u64>,
    pub(super) compaction: Option<CompactionConfig>,
}

/// Dollars, as a TOML string (`"0.50"`, exact) or number (`0.5`).
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawMoney {
    Text(String),
    Number(f64),
}

// ---------------------------------------------------------------------------------------------
// Checks.

pub(super) fn build(raw: RawConfig, src: &Source<'_>) -> Result<Config, ConfigError> {
    let mut problems = Problems { src, found: Vec::new() };
    let server = raw.server.unwrap_or_default();
    if server.max_body_bytes == 0 {
        problems.add(path(&["server", "max_body_bytes"]), "must be at least 1");
    }
    let defaults = build_defaults(raw.defaults, &mut problems);
    let limits = raw.limits.unwrap_or_default();
    check_limits(&limits, &mut problems);
    for (id, llm) in &raw.llm {
        check_llm(id, llm, &mut problems);
    }
    let llm_ids: Vec<&str> = raw.llm.keys().map(String::as_str).collect();
    let agent_ids: Vec<String> = raw.agent.keys().cloned().collect();
    let agent_ids: Vec<&str> = agent_ids.iter().map(String::as_str).collect();
    let mut agents = BTreeMap::new();
    for (id, agent) in raw.agent {
        let def = build_agent(id, agent, &llm_ids, &agent_ids, &mut problems);
        agents.insert(def.id.clone(), def);
    }
    if let Some(auth) = &raw.auth {
        check_auth(auth, &agent_ids, &mut problems);
    }
    if let Some(first) = problems.first() {
        return Err(first);
    }
    Ok(Config { file: src.file.to_owned(), server, defaults, llms: raw.llm, agents, auth: raw.auth, limits })
}

/// Every limit lets something through: zero would refuse all.
fn check_limits(limits: &LimitsConfig, problems: &mut Problems<'_>) {
    let LimitsConfig {
        messages_per_input,
        message_bytes,
        state_bytes,
        queued_turns,
        sub_agent_depth,
        sub_agent_fanout,
        sessions_per_owner,
        session_cache_mb,
        streams_per_caller,
        sockets_per_caller,
        subscriptions_per_socket,
        active_client_grace_secs,
    } = *limits;
    for (name, value) in [
        ("messages_per_input", Some(messages_per_input)),
        ("message_bytes", Some(message_bytes)),
        ("state_bytes", Some(state_bytes)),
        ("queued_turns", Some(queued_turns)),
        ("sub_agent_depth", Some(sub_agent_depth)),
        ("sub_agent_fanout", Some(sub_agent_fanout)),
        ("sessions_per_owner", sessions_per_owner),
        ("session_cache_mb", session_cache_mb),
        ("streams_per_caller", Some(streams_per_caller)),
        ("sockets_per_caller", Some(sockets_per_caller)),
        ("subscriptions_per_socket", Some(subscriptions_per_socket)),
        ("active_client_grace_secs", Some(active_client_grace_secs)),
    ] {
        if value == Some(0) {
            problems.add(path(&["limits", name]), "must be at least 1");
        }
    }
}

pub(super) fn build_defaults(raw: Option<RawDefaults>, problems: &mut Problems<'_>) -> Defaults {
    let mut defaults = Defaults::default();
    let Some(raw) = raw else { return defaults };
    let kinds = [
        ("llm", &mut defaults.llm, raw.llm),
        ("tool", &mut defaults.tool, raw.tool),
        ("client_tool", &mut defaults.client_tool, raw.client_tool),
        ("sub_agent", &mut defaults.sub_agent, raw.sub_agent),
        ("decision", &mut defaults.decision, raw.decision),
    ];
    for (kind, slot, given) in kinds {
        if let Some(given) = given {
            let policy = given.policy();
            if let Err(e) = policy.validate() {
                problems.add(join(path(&["defaults", kind]), &e.path), e.message);
            }
            *slot = policy;
        }
    }
    defaults
}

pub(super) fn check_llm(id: &str, llm: &LlmConfig, problems: &mut Problems<'_>) {
    let at = |field: &str| path(&["llm", id, field]);
    check_id("llm", id, path(&["llm", id]), problems);
    if let Some(url) = &llm.base_url {
        if llm.kind == LlmKind::Scripted {
            problems.add(at("base_url"), "the scripted model takes no base_url");
        } else if let Err(m) = check_url(url) {
            problems.add(at("base_url"), m);
        }
    }
    if let Some(var) = &llm.api_key_env {
        if llm.kind == LlmKind::Scripted {
            problems.add(at("api_key_env"), "the scripted model takes no API key");
        } else {
            check_env_name(var, at("api_key_env"), problems);
        }
    }
    check_context(llm.context_window, llm.max_output_tokens, &|f: &str| at(f), problems);
    if llm.kind == LlmKind::Scripted && !llm.prices.is_empty() {
        problems.add(at("prices"), "the scripted model is free: it takes no prices");
    }
    for (model, price) in &llm.prices {
        let fields = [
            ("input", Some(price.input)),
            ("output", Some(price.output)),
            ("cache_read", price.cache_read),
            ("cache_write", price.cache_write),
        ];
        for (field, value) in fields {
            if let Some(value) = value
                && !(value.is_finite() && (0.0..=1e6).contains(&value))
            {
                problems.add(
                    path(&["llm", id, "prices", model, field]),
                    "must be a price in dollars per million tokens, from 0 to 1000000",
                );
            }
        }
    }
}

pub(super) fn build_agent(
    id: String,
    raw: RawAgent,
    llm_ids: &[&str],
    agent_ids: &[&str],
    problems: &mut Problems<'_>,
) -> AgentDef {
    let at = |field: &str| join(path(&["agent", &id]), field);
    check_id("agent", &id, path(&["agent", &id]), problems);
    if raw.model.trim().is_empty() {
        problems.add(at("model"), "must not be empty");
    }
    let config = AgentConfig {
        model: raw.model,
        system: raw.system,
        stream: raw.stream,
        handler: raw.handler,
        format: raw.format,
        retry: raw.retry.as_ref().map(RawRetry::policy),
        tools: raw.tools,
        sub_agents: raw.sub_agents,
    };
    if let Err(e) = config.validate() {
        problems.add(at(&e.path), e.message);
    }
    let handler = config.handler.unwrap_or_default();
    match &raw.llm {
        Some(name) if !llm_ids.contains(&name.as_str()) => {
            problems.add(at("llm"), format!("unknown llm {name:?} ({})", defined(llm_ids)));
        }
        None if handler == LlmHandler::Server && llm_ids.is_empty() => problems.add(
            at("llm"),
            "missing: this agent's LLM calls run on the server (handler \"server\", the default) and no \
             [llm.<id>] block is defined; add one (e.g. [llm.scripted] with type = \"scripted\") or set \
             handler = \"worker\"",
        ),
        None if handler == LlmHandler::Server && llm_ids.len() > 1 => problems.add(
            at("llm"),
            format!(
                "missing: this agent's LLM calls run on the server (handler \"server\", the default) and \
                 {} [llm] blocks are defined ({}); name one with llm = \"<id>\"",
                llm_ids.len(),
                llm_ids.join(", ")
            ),
        ),
        _ => {}
    }
    if let Some(url) = &raw.worker
        && let Err(m) = check_url(url)
    {
        problems.add(at("worker"), m);
    }
    if raw.worker.is_none() {
        let worker = format!("agent.{id}.worker");
        if config.format.is_some() && handler == LlmHandler::Worker {
            problems.add(at("format"), format!("requires a worker URL ({worker} is not set)"));
        } else if handler == LlmHandler::Worker {
            problems.add(
                at("handler"),
                format!(
                    "\"worker\" sends LLM calls to the worker, but the agent has none ({worker} is not set)"
                ),
            );
        }
        for (i, tool) in config.tools().iter().enumerate() {
            if tool.handler.unwrap_or_default() == ToolHandler::Worker {
                let how = if tool.handler.is_none() { " (the default handler)" } else { "" };
                problems.add(
                    at(&format!("tools[{i}].handler")),
                    format!(
                        "tool {:?} runs on the worker{how}, but the agent has none ({worker} is not set); \
                         set handler = \"client\" or a worker",
                        tool.name
                    ),
                );
            }
        }
        if raw.worker_secret_env.is_some() {
            problems.add(
                at("worker_secret_env"),
                format!("there is no worker to sign requests for ({worker} is not set)"),
            );
        }
        if raw.worker_messages.is_some() {
            problems.add(
                at("worker_messages"),
                format!("there is no worker to send decision requests to ({worker} is not set)"),
            );
        }
    }
    let worker_messages = match raw.worker_messages.map(NonZeroUsize::new) {
        None => Transcript::Whole,
        Some(Some(n)) => Transcript::Last(n),
        Some(None) => {
            problems
                .add(at("worker_messages"), "must be at least 1 (leave it out for the whole conversation)");
            Transcript::Whole
        }
    };
    if let Some(var) = &raw.worker_secret_env {
        check_env_name(var, at("worker_secret_env"), problems);
    }
    for (i, sub) in config.sub_agents().iter().enumerate() {
        if !agent_ids.contains(&sub.id.as_str()) {
            problems.add(
                at(&format!("sub_agents[{i}].id")),
                format!("unknown agent {:?} ({})", sub.id, defined(agent_ids)),
            );
        }
    }
    let max_cost_picodollars = raw.max_cost.and_then(|money| {
        let text = match money {
            RawMoney::Text(text) => text,
            RawMoney::Number(n) if n.is_finite() => n.to_string(),
            RawMoney::Number(_) => String::new(),
        };
        let parsed = parse_picodollars(text.trim()).filter(|p| *p >= 0);
        if parsed.is_none() {
            problems.add(at("max_cost"), "must be an amount of dollars, e.g. \"0.50\"");
        }
        parsed
    });
    if raw.max_llm_calls == Some(0) {
        problems.add(at("max_llm_calls"), "must be at least 1 (leave it out for no limit)");
    }
    let budget = Budget { max_cost_picodollars, max_llm_calls: raw.max_llm_calls };
    let mcp = raw.mcp.unwrap_or_default();
    check_mcp(&mcp, &config, &at, problems);
    let compaction = raw.compaction.unwrap_or_default();
    check_context(raw.context_window, raw.max_output_tokens, &at, problems);
    check_compaction(&compaction, &at, problems);
    AgentDef {
        id,
        config,
        llm: raw.llm,
        worker: raw.worker,
        worker_secret_env: raw.worker_secret_env,
        worker_messages,
        budget,
        mcp,
        context_window: raw.context_window,
        max_output_tokens: raw.max_output_tokens,
        compaction,
    }
}

/// A window and a reply reserve that leave room for a request.
fn check_context(
    window: Option<u64>,
    max_output: Option<u64>,
    at: &dyn Fn(&str) -> Vec<Seg>,
    problems: &mut Problems<'_>,
) {
    if window.is_some_and(|w| w < 1_024) {
        problems.add(at("context_window"), "must be at least 1024 tokens");
    }
    if max_output == Some(0) {
        problems.add(at("max_output_tokens"), "must be at least 1");
    }
    if let (Some(w), Some(m)) = (window, max_output)
        && m >= w
    {
        problems.add(at("max_output_tokens"), format!("must be less than context_window ({w})"));
    }
}

/// `[agent.<id>.compaction]`: shares of the window between 0 and 1, positive sizes.
fn check_compaction(c: &CompactionConfig, at: &dyn Fn(&str) -> Vec<Seg>, problems: &mut Problems<'_>) {
    let field = |name: &str| join(at("compaction"), name);
    if !(c.at > 0.0 && c.at <= 1.0) {
        problems.add(field("at"), "must be a share of the window, more than 0 and at most 1 (e.g. 0.8)");
    }
    if !(c.keep_recent > 0.0 && c.keep_recent < c.at.min(1.0)) {
        problems.add(field("keep_recent"), format!("must be more than 0 and less than `at` ({})", c.at));
    }
    if c.tool_result_max_tokens == Some(0) {
        problems.add(field("tool_result_max_tokens"), "must be at least 1 (leave it out for no cap)");
    }
    if c.summary_max_tokens == Some(0) {
        problems.add(field("summary_max_tokens"), "must be at least 1");
    }
    if c.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
        problems.add(field("model"), "must not be empty (leave it out for the call's own model)");
    }
}

/// `[[agent.<id>.mcp]]`: names that make tool names no other tool has, one way to reach each
/// server, header values from named variables, a positive timeout.
fn check_mcp(
    servers: &[McpServerConfig],
    config: &AgentConfig,
    at: &dyn Fn(&str) -> Vec<Seg>,
    problems: &mut Problems<'_>,
) {
    let mut names = std::collections::HashSet::new();
    for (i, server) in servers.iter().enumerate() {
        let field = |f: &str| at(&format!("mcp[{i}].{f}"));
        let name = &server.name;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            problems.add(
                field("name"),
                format!("invalid MCP server name {name:?}: use only letters, digits, '_' and '-'"),
            );
        } else if name.contains("__") {
            problems.add(
                field("name"),
                format!("{name:?} must not contain \"__\", which ends the name in its tools' names"),
            );
        } else if !names.insert(name.as_str()) {
            problems.add(field("name"), format!("duplicate MCP server {name:?}"));
        }
        let prefix = format!("{name}__");
        if let Some(tool) = config.tools().iter().find(|t| t.name.starts_with(&prefix)) {
            problems
                .add(field("name"), format!("the tool {:?} would clash with this server's tools", tool.name));
        }
        match (&server.url, &server.command) {
            (Some(url), None) => {
                if let Err(m) = check_url(url) {
                    problems.add(field("url"), m);
                }
            }
            (None, Some(command)) => {
                if command.first().is_none_or(|p| p.trim().is_empty()) {
                    problems.add(field("command"), "must name the program to start, then its arguments");
                }
                if !server.headers_env.is_empty() {
                    problems.add(field("headers_env"), "a stdio server (command) takes no HTTP headers");
                }
            }
            _ => problems
                .add(field("url"), "give either url (Streamable HTTP) or command (stdio), one of them"),
        }
        for (header, var) in &server.headers_env {
            check_env_name(var, field(&format!("headers_env.{header}")), problems);
        }
        if !(server.timeout_secs.is_finite() && server.timeout_secs > 0.0) {
            problems.add(field("timeout_secs"), "must be a positive number of seconds");
        }
    }
}

pub(super) fn defined(ids: &[&str]) -> String {
    if ids.is_empty() { "none defined".to_owned() } else { format!("defined: {}", ids.join(", ")) }
}

pub(super) fn check_id(what: &str, id: &str, at: Vec<Seg>, problems: &mut Problems<'_>) {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        problems.add(at, format!("invalid {what} id {id:?}: use only letters, digits, '_' and '-'"));
    }
}

pub(super) fn check_env_name(var: &str, at: Vec<Seg>, problems: &mut Problems<'_>) {
    let mut chars = var.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        // Not echoed: a value here is most likely the secret itself.
        problems.add(
            at,
            "must be the NAME of an environment variable (letters, digits and '_', not starting with a \
             digit); the secret itself goes in that variable, never in this file",
        );
    }
}

pub(super) fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("is not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("must be an http:// or https:// URL, not scheme {:?}", parsed.scheme()));
    }
    if !parsed.has_host() {
        return Err("must be an http:// or https:// URL with a host".to_owned());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("must not carry credentials (user:password@); secrets never go in this file".to_owned());
    }
    Ok(())
}

fn check_auth(auth: &AuthConfig, agent_ids: &[&str], problems: &mut Problems<'_>) {
    let vars = [
        ("api_keys_env", &auth.api_keys_env),
        ("machine_keys_env", &auth.machine_keys_env),
        ("admin_keys_env", &auth.admin_keys_env),
        ("jwt_secret_env", &auth.jwt_secret_env),
    ];
    for (field, var) in vars {
        if let Some(var) = var {
            check_env_name(var, path(&["auth", field]), problems);
        }
    }
    if vars.iter().all(|(_, var)| var.is_none()) {
        problems.add(
            path(&["auth"]),
            "names no keys: set api_keys_env, jwt_secret_env, machine_keys_env or admin_keys_env \
             (or leave [auth] out for an open loopback host)",
        );
    }
    if auth.jwt_secret_env.is_none() {
        for (field, set) in [
            ("jwt_issuer", auth.jwt_issuer.is_some()),
            ("jwt_audience", auth.jwt_audience.is_some()),
            ("jwt_metadata_claims", !auth.jwt_metadata_claims.is_empty()),
        ] {
            if set {
                problems.add(path(&["auth", field]), "needs jwt_secret_env");
            }
        }
    }
    if !auth.machines.is_empty() && auth.machine_keys_env.is_none() {
        problems.add(path(&["auth", "machines"]), "needs machine_keys_env");
    }
    for (machine, agents) in &auth.machines {
        for agent in agents {
            if agent != "*" && !agent_ids.contains(&agent.as_str()) {
                problems.add(
                    path(&["auth", "machines", machine]),
                    format!("unknown agent {agent:?} (defined: {})", agent_ids.join(", ")),
                );
            }
        }
    }
}

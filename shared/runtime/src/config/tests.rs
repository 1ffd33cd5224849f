//! Tests of the configuration: parsing, every check, secrets.
use super::*;
use serde_json::json;

/// The message of the error `text` must fail with.
fn err(text: &str) -> String {
    match Config::parse(text, "turnstone.toml") {
        Ok(config) => panic!("parsed, expected an error: {config:?}"),
        Err(e) => e.to_string(),
    }
}

/// `text` after a `[llm.scripted]` block, so agents have a default llm.
fn with_llm(text: &str) -> String {
    format!("[llm.scripted]\ntype = \"scripted\"\n\n{text}")
}

const FULL: &str = r#"[server]
addr = "0.0.0.0:9000"
data_dir = "/var/lib/turnstone"
max_body_bytes = 2048
allow_anonymous = true
expose_internal_events = true
durability = "process"
backend = "aws"

[server.aws]
table = "sessions-prod"
queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/wakeups-prod"
endpoint_url = "http://127.0.0.1:5000"
region = "eu-west-1"

[defaults]
llm = { timeout_secs = 60, max_retries = 1, backoff_base_secs = 0.5, backoff_max_secs = 5 }
client_tool = { max_retries = 0, backoff_base_secs = 0, backoff_max_secs = 0 }

[llm.openai]
type = "openai"
base_url = "http://localhost:11434/v1"
api_key_env = "OPENAI_API_KEY"

[llm.claude]
type = "anthropic"
api_key_env = "ANTHROPIC_API_KEY"
reasoning = { effort = "medium" }

[agent.main]
model = "claude-sonnet"
system = "Be brief."
stream = false
handler = "worker"
format = "anthropic"
retry = { timeout_secs = 30, max_retries = 4, backoff_base_secs = 2, backoff_max_secs = 20 }
llm = "claude"
worker = "https://worker.example.com/decide"
worker_secret_env = "MAIN_WORKER_SECRET"
sub_agents = [{ id = "helper", description = "Helps." }]

[[agent.main.tools]]
name = "search"
description = "Search the web."
input = { type = "object", properties = { q = { type = "string" } }, required = ["q"] }
output = { type = "string" }
handler = "worker"

[[agent.main.tools]]
name = "ask"
handler = "client"

[agent.helper]
model = "gpt-4o-mini"
llm = "openai"

[auth]
api_keys_env = "TURNSTONE_API_KEYS"
"#;

#[test]
fn the_demo_parses() {
    let config = Config::demo().unwrap();
    assert_eq!(config.file, "demo.toml");
    assert_eq!(config.server, ServerConfig::default());
    assert_eq!(config.server.durability, Durability::Full, "power-loss durable by default");
    assert_eq!(config.defaults, Defaults::default());
    assert_eq!(config.llms.keys().collect::<Vec<_>>(), ["scripted"]);
    assert_eq!(config.llms["scripted"].kind, LlmKind::Scripted);
    assert!(config.auth.is_none());

    let demo = config.agent("demo").unwrap();
    assert_eq!(demo.config.model, "scripted");
    assert_eq!(demo.config.stream, Some(true));
    assert!(demo.config.system.as_deref().is_some_and(|s| !s.is_empty()));
    assert_eq!(demo.llm_for(&config), Some("scripted"));
    assert!(!demo.has_worker());
    let [confirm, deploy] = demo.config.tools() else { panic!("two tools: {:?}", demo.config.tools) };
    assert_eq!(confirm.name, "confirm");
    assert_eq!(confirm.handler, Some(ToolHandler::Client));
    assert!(!confirm.needs_approval());
    assert_eq!((deploy.name.as_str(), deploy.needs_approval()), ("deploy", true));
    assert_eq!(confirm.input.as_ref().unwrap()["properties"]["question"]["type"], "string");
    assert_eq!(demo.config.sub_agents().iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["researcher"]);

    let researcher = config.agent("researcher").unwrap();
    assert_eq!(researcher.config.model, "scripted");
    assert_eq!(researcher.llm_for(&config), Some("scripted"));
    assert!(config.agent("nobody").is_none());

    let secrets = config.resolve_secrets(|_| None).unwrap();
    assert!(!secrets.auth_enabled());
}

#[test]
fn the_demos_commented_examples_parse_once_uncommented() {
    let is_toml = |line: &str| {
        line.starts_with('[')
            || line.split_once(" = ").is_some_and(|(key, _)| {
                !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
    };
    let text: String = DEMO_TOML
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest) if is_toml(rest) => format!("{rest}\n"),
            _ => format!("{line}\n"),
        })
        .collect();
    let config = Config::parse(&text, "demo.toml").unwrap();
    // The commented [defaults] spell out the engine's own.
    assert_eq!(config.defaults, Defaults::default());
    assert_eq!(config.llms.keys().collect::<Vec<_>>(), ["anthropic", "openai", "responses", "scripted"]);
    assert_eq!(config.llms["responses"].kind, LlmKind::OpenaiResponses);
    let claude = &config.llms["anthropic"];
    assert_eq!(claude.prompt_cache, PromptCacheSetting::FiveMinutes);
    assert_eq!(claude.thinking, BTreeMap::from([("my-claude".to_owned(), ThinkingSetting::Adaptive)]));
    let demo = config.agent("demo").unwrap();
    assert!(demo.has_worker());
    assert_eq!(demo.worker_secret_env.as_deref(), Some("DEMO_WORKER_SECRET"));
    assert!(demo.config.retry.is_some());
    let auth = config.auth.unwrap();
    assert_eq!(auth.api_keys_env.as_deref(), Some("TURNSTONE_API_KEYS"));
    assert_eq!(auth.jwt_secret_env.as_deref(), Some("TURNSTONE_JWT_SECRET"));
    assert_eq!(auth.machines, BTreeMap::from([("billing_worker".to_owned(), vec!["demo".to_owned()])]));
}

#[test]
fn a_full_example_parses_to_every_field() {
    let config = Config::parse(FULL, "turnstone.toml").unwrap();
    assert_eq!(
        config.server,
        ServerConfig {
            addr: "0.0.0.0:9000".parse().unwrap(),
            data_dir: PathBuf::from("/var/lib/turnstone"),
            max_body_bytes: 2048,
            durability: Durability::Process,
            backend: Backend::Aws,
            aws: AwsBackend {
                table: "sessions-prod".to_owned(),
                queue: "https://sqs.eu-west-1.amazonaws.com/123456789012/wakeups-prod".to_owned(),
                endpoint_url: Some("http://127.0.0.1:5000".to_owned()),
                region: Some("eu-west-1".to_owned()),
            },
            allow_anonymous: true,
            expose_internal_events: true,
        }
    );
    let engine = Defaults::default();
    assert_eq!(
        config.defaults,
        Defaults {
            llm: RetryPolicy {
                timeout_secs: Some(60.0),
                max_retries: 1,
                backoff_base_secs: 0.5,
                backoff_max_secs: 5.0
            },
            client_tool: RetryPolicy::NONE,
            ..engine
        }
    );
    assert_eq!(
        config.llms["openai"],
        LlmConfig {
            kind: LlmKind::Openai,
            base_url: Some("http://localhost:11434/v1".into()),
            api_key_env: Some("OPENAI_API_KEY".into()),
            prices: BTreeMap::new(),
            reasoning: None,
            prompt_cache: PromptCacheSetting::FiveMinutes,
            thinking: BTreeMap::new(),
            context_window: None,
            max_output_tokens: None,
        }
    );
    assert_eq!(
        config.llms["claude"],
        LlmConfig {
            kind: LlmKind::Anthropic,
            base_url: None,
            api_key_env: Some("ANTHROPIC_API_KEY".into()),
            prices: BTreeMap::new(),
            reasoning: Some(ReasoningConfig {
                effort: Some(turnstone_engine::protocol::Effort::Medium),
                max_tokens: None,
                exclude: None,
                enabled: None,
            }),
            prompt_cache: PromptCacheSetting::FiveMinutes,
            thinking: BTreeMap::new(),
            context_window: None,
            max_output_tokens: None,
        }
    );
    assert_eq!(config.llms["claude"].kind.provider_kind(), crate::llm::ProviderKind::Anthropic);

    let main = config.agent("main").unwrap();
    let expected = AgentConfig {
        model: "claude-sonnet".into(),
        system: Some("Be brief.".into()),
        stream: Some(false),
        handler: Some(LlmHandler::Worker),
        format: Some(LlmFormat::Anthropic),
        retry: Some(RetryPolicy {
            timeout_secs: Some(30.0),
            max_retries: 4,
            backoff_base_secs: 2.0,
            backoff_max_secs: 20.0,
        }),
        tools: Some(vec![
            AgentTool {
                name: "search".into(),
                description: Some("Search the web.".into()),
                input: Some(json!({
                    "type": "object",
                    "properties": {"q": {"type": "string"}},
                    "required": ["q"]
                })),
                output: Some(json!({"type": "string"})),
                handler: Some(ToolHandler::Worker),
                approval: None,
                mcp: None,
            },
            AgentTool {
                name: "ask".into(),
                description: None,
                input: None,
                output: None,
                handler: Some(ToolHandler::Client),
                approval: None,
                mcp: None,
            },
        ]),
        sub_agents: Some(vec![SubAgent { id: "helper".into(), description: Some("Helps.".into()) }]),
    };
    assert_eq!(
        *main,
        AgentDef {
            id: "main".into(),
            config: expected,
            llm: Some("claude".into()),
            worker: Some("https://worker.example.com/decide".into()),
            worker_secret_env: Some("MAIN_WORKER_SECRET".into()),
            worker_messages: Transcript::Whole,
            budget: Budget::default(),
            mcp: Vec::new(),
            context_window: None,
            max_output_tokens: None,
            compaction: CompactionConfig::default(),
        }
    );
    assert!(main.has_worker());
    assert_eq!(main.llm_for(&config), Some("claude"));

    let helper = config.agent("helper").unwrap();
    assert_eq!(helper.config, AgentConfig::new("gpt-4o-mini"));
    assert_eq!(helper.llm_for(&config), Some("openai"));
    assert!(!helper.has_worker());
    assert_eq!(
        config.auth,
        Some(AuthConfig { api_keys_env: Some("TURNSTONE_API_KEYS".into()), ..AuthConfig::default() })
    );
}

#[test]
fn the_only_llm_is_the_default_and_worker_agents_need_none() {
    let config = Config::parse(&with_llm("[agent.a]\nmodel = \"m\"\n"), "t.toml").unwrap();
    let a = config.agent("a").unwrap();
    assert_eq!(a.llm, None);
    assert_eq!(a.llm_for(&config), Some("scripted"));

    let text = "[agent.w]\nmodel = \"m\"\nhandler = \"worker\"\nworker = \"http://127.0.0.1:9/\"\n";
    let config = Config::parse(text, "t.toml").unwrap();
    assert_eq!(config.agent("w").unwrap().llm_for(&config), None);
}

#[test]
fn syntax_errors_name_the_line_and_column() {
    assert_eq!(
        err("[agent.demo\nmodel = \"x\"\n"),
        "turnstone.toml:1:12: invalid TOML: unclosed table, expected `]`"
    );
    assert_eq!(
        err("[server]\naddr = \"a\"\naddr = \"b\"\n"),
        "turnstone.toml:3:1: invalid TOML: duplicate key \"addr\""
    );
    assert_eq!(
        err("[server]\n\nmax_body_bytes = = 3\n"),
        "turnstone.toml:3:18: invalid TOML: extra `=`, expected nothing"
    );
}

#[test]
fn unknown_keys_are_named_where_they_are() {
    assert_eq!(
        err("[agents.demo]\nmodel = \"x\"\n"),
        "turnstone.toml:1:2: agents: unknown key \"agents\" (did you mean \"agent\"?); \
         expected one of: server, defaults, llm, agent, auth, limits"
    );
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\nmodle = \"y\"\n")),
        "turnstone.toml:6:1: agent.demo.modle: unknown key \"modle\" (did you mean \"model\"?); \
         expected one of: model, system, stream, handler, format, retry, tools, sub_agents, llm, \
         worker, worker_secret_env, worker_messages, max_cost, max_llm_calls, mcp, context_window, \
         max_output_tokens, compaction"
    );
    assert_eq!(
        err(&with_llm(
            "[agent.demo]\nmodel = \"x\"\ntools = [{ name = \"a\", handler = \"client\", inptu = {} }]\n"
        )),
        "turnstone.toml:6:44: agent.demo.tools[0].inptu: unknown key \"inptu\" (did you mean \"input\"?); \
         expected one of: name, description, input, output, handler, approval, mcp"
    );
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\n\n[[agent.demo.sub_agents]]\nid = \"demo\"\nwhy = 1\n")),
        "turnstone.toml:9:1: agent.demo.sub_agents[0].why: unknown key \"why\"; expected one of: id, description"
    );
    assert_eq!(
        err(
            "[defaults]\nllm = { max_retries = 1, backoff_base_secs = 1, backoff_max_secs = 2, jitter = 1 }\n"
        ),
        "turnstone.toml:2:71: defaults.llm.jitter: unknown key \"jitter\"; \
         expected one of: timeout_secs, max_retries, backoff_base_secs, backoff_max_secs"
    );
    assert_eq!(
        err("[defaults]\nllms = { max_retries = 1, backoff_base_secs = 1, backoff_max_secs = 2 }\n"),
        "turnstone.toml:2:1: defaults.llms: unknown key \"llms\" (did you mean \"llm\"?); \
         expected one of: llm, tool, client_tool, sub_agent, decision"
    );
    assert_eq!(
        err("[llm.openai]\ntype = \"openai\"\napi_key = \"x\"\n"),
        "turnstone.toml:3:1: llm.openai.api_key: unknown key \"api_key\" (did you mean \"api_key_env\"?); \
         expected one of: type, base_url, api_key_env, prices, reasoning, prompt_cache, thinking, \
         context_window, max_output_tokens"
    );
    assert_eq!(
        err("[server]\nport = 8787\n"),
        "turnstone.toml:2:1: server.port: unknown key \"port\"; expected one of: addr, data_dir, max_body_bytes, durability, backend, aws, \
         allow_anonymous, expose_internal_events"
    );
    assert_eq!(
        err("[auth]\napi_keys = \"x\"\n"),
        "turnstone.toml:2:1: auth.api_keys: unknown key \"api_keys\" (did you mean \"api_keys_env\"?); \
         expected one of: api_keys_env, machine_keys_env, admin_keys_env, jwt_secret_env, jwt_issuer, \
         jwt_audience, jwt_metadata_claims, jwt_sub_is_api_key_name, machines"
    );
}

#[test]
fn wrong_types_and_values_name_the_field() {
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\nstream = \"yes\"\n")),
        "turnstone.toml:6:10: agent.demo.stream: expected a boolean, found a string"
    );
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\ntools = [\"confirm\"]\n")),
        "turnstone.toml:6:10: agent.demo.tools[0]: expected a table, found a string"
    );
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\nhandler = \"client\"\n")),
        "turnstone.toml:6:11: agent.demo.handler: unknown value \"client\"; expected one of: server, worker"
    );
    assert_eq!(
        err("[llm.x]\ntype = \"gpt\"\n"),
        "turnstone.toml:2:8: llm.x.type: unknown value \"gpt\"; expected one of: openai, openai-responses, anthropic, scripted"
    );
    assert_eq!(
        err("[llm.x]\ntype = \"anthropic\"\nthinking = { \"my-claude\" = \"deep\" }\n"),
        "turnstone.toml:3:28: llm.x.thinking.my-claude: unknown value \"deep\"; expected one of: adaptive, budget"
    );
    assert_eq!(
        err("[llm.x]\ntype = \"anthropic\"\nprompt_cache = \"2h\"\n"),
        "turnstone.toml:3:16: llm.x.prompt_cache: unknown value \"2h\" (did you mean \"1h\"?); expected one of: 5m, 1h, off"
    );
    assert_eq!(
        err("[llm.x]\nbase_url = \"http://h\"\n"),
        "turnstone.toml:1:1: llm.x: missing required key \"type\""
    );
    assert_eq!(
        err(&with_llm("[agent.demo]\nsystem = \"hi\"\n")),
        "turnstone.toml:4:1: agent.demo: missing required key \"model\""
    );
    assert_eq!(
        err("[defaults]\nllm = { max_retries = -1, backoff_base_secs = 1, backoff_max_secs = 2 }\n"),
        "turnstone.toml:2:23: defaults.llm.max_retries: invalid value -1, expected a non-negative integer"
    );
    assert_eq!(
        err("[server]\naddr = \"localhost\"\n"),
        "turnstone.toml:2:8: server.addr: invalid socket address, expected an IP address and port \
         such as \"127.0.0.1:8787\""
    );
    assert_eq!(
        err("[server]\ndurability = \"normal\"\n"),
        "turnstone.toml:2:14: server.durability: unknown value \"normal\"; expected one of: full, process"
    );
    assert_eq!(
        err("[server]\ndurability = true\n"),
        // toml's own words for a non-string where an enum's name is expected.
        "turnstone.toml:2:14: server.durability: wanted string or table"
    );
    assert_eq!(
        err("[server]\nmax_body_bytes = 0\n"),
        "turnstone.toml:2:1: server.max_body_bytes: must be at least 1"
    );
    assert_eq!(err("agent = 3\n"), "turnstone.toml:1:9: agent: expected a table, found an integer");
}

#[test]
fn the_seeds_own_rules_are_checked() {
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\nformat = \"openai\"\n")),
        "turnstone.toml:6:1: agent.demo.format: requires handler \"worker\""
    );
    let dup = "[agent.demo]\nmodel = \"x\"\n\n[[agent.demo.tools]]\nname = \"a\"\nhandler = \"client\"\n\n\
               [[agent.demo.tools]]\nname = \"a\"\nhandler = \"client\"\n";
    assert_eq!(err(&with_llm(dup)), "turnstone.toml:12:1: agent.demo.tools[1].name: duplicate tool \"a\"");
    let clash = "[agent.demo]\nmodel = \"x\"\ntools = [{ name = \"demo\", handler = \"client\" }]\n\
                 sub_agents = [{ id = \"demo\" }]\n";
    assert_eq!(
        err(&with_llm(clash)),
        "turnstone.toml:7:17: agent.demo.sub_agents[0].id: \"demo\" is already the name of a tool or sub-agent"
    );
    assert_eq!(
        err(&with_llm(
            "[agent.demo]\nmodel = \"x\"\nretry = { max_retries = 1, backoff_base_secs = 3, backoff_max_secs = 2 }\n"
        )),
        "turnstone.toml:6:51: agent.demo.retry.backoff_max_secs: must be a number no smaller than backoff_base_secs"
    );
    assert_eq!(
        err(
            "[defaults]\ndecision = { timeout_secs = 0, max_retries = 1, backoff_base_secs = 1, backoff_max_secs = 2 }\n"
        ),
        "turnstone.toml:2:14: defaults.decision.timeout_secs: must be a positive number of seconds or null"
    );
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \" \"\n")),
        "turnstone.toml:5:1: agent.demo.model: must not be empty"
    );
}

#[test]
fn an_agents_llm_must_be_defined_or_the_only_one() {
    let text = "[llm.openai]\ntype = \"openai\"\n\n[llm.scripted]\ntype = \"scripted\"\n\n\
                [agent.demo]\nmodel = \"x\"\nstream = true\n\n\n\nllm = \"gpt\"\n";
    assert_eq!(
        err(text),
        "turnstone.toml:13:1: agent.demo.llm: unknown llm \"gpt\" (defined: openai, scripted)"
    );
    assert_eq!(
        err("[agent.demo]\nmodel = \"x\"\nllm = \"gpt\"\n"),
        "turnstone.toml:3:1: agent.demo.llm: unknown llm \"gpt\" (none defined)"
    );
    let two = "[llm.a]\ntype = \"scripted\"\n[llm.b]\ntype = \"scripted\"\n[agent.demo]\nmodel = \"x\"\n";
    assert_eq!(
        err(two),
        "turnstone.toml:5:8: agent.demo.llm: missing: this agent's LLM calls run on the server \
         (handler \"server\", the default) and 2 [llm] blocks are defined (a, b); name one with llm = \"<id>\""
    );
    assert_eq!(
        err("[agent.demo]\nmodel = \"x\"\nhandler = \"server\"\n"),
        "turnstone.toml:1:8: agent.demo.llm: missing: this agent's LLM calls run on the server \
         (handler \"server\", the default) and no [llm.<id>] block is defined; add one \
         (e.g. [llm.scripted] with type = \"scripted\") or set handler = \"worker\""
    );
}

#[test]
fn sub_agents_must_be_defined() {
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\nsub_agents = [{ id = \"demo\" }, { id = \"ghost\" }]\n")),
        "turnstone.toml:6:34: agent.demo.sub_agents[1].id: unknown agent \"ghost\" (defined: demo)"
    );
}

#[test]
fn worker_urls_are_http() {
    let agent = |url: &str| err(&with_llm(&format!("[agent.demo]\nmodel = \"x\"\nworker = \"{url}\"\n")));
    assert_eq!(
        agent("ftp://files.example.com/"),
        "turnstone.toml:6:1: agent.demo.worker: must be an http:// or https:// URL, not scheme \"ftp\""
    );
    assert_eq!(
        agent("worker.example.com"),
        "turnstone.toml:6:1: agent.demo.worker: is not a URL (relative URL without a base)"
    );
    assert_eq!(
        agent("https://me:hunter2@worker.example.com/"),
        "turnstone.toml:6:1: agent.demo.worker: must not carry credentials (user:password@); \
         secrets never go in this file"
    );
    assert_eq!(
        err("[llm.o]\ntype = \"openai\"\nbase_url = \"localhost:11434\"\n"),
        "turnstone.toml:3:1: llm.o.base_url: must be an http:// or https:// URL, not scheme \"localhost\""
    );
}

#[test]
fn worker_work_needs_a_worker() {
    assert_eq!(
        err("[agent.demo]\nmodel = \"x\"\nhandler = \"worker\"\nformat = \"openai\"\n"),
        "turnstone.toml:4:1: agent.demo.format: requires a worker URL (agent.demo.worker is not set)"
    );
    assert_eq!(
        err("[agent.demo]\nmodel = \"x\"\nhandler = \"worker\"\n"),
        "turnstone.toml:3:1: agent.demo.handler: \"worker\" sends LLM calls to the worker, but the agent \
         has none (agent.demo.worker is not set)"
    );
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\n\n[[agent.demo.tools]]\nname = \"search\"\n")),
        "turnstone.toml:7:1: agent.demo.tools[0].handler: tool \"search\" runs on the worker (the default \
         handler), but the agent has none (agent.demo.worker is not set); set handler = \"client\" or a worker"
    );
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\nworker_secret_env = \"SECRET\"\n")),
        "turnstone.toml:6:1: agent.demo.worker_secret_env: there is no worker to sign requests for \
         (agent.demo.worker is not set)"
    );
    assert_eq!(
        err(&with_llm("[agent.demo]\nmodel = \"x\"\nworker_messages = 40\n")),
        "turnstone.toml:6:1: agent.demo.worker_messages: there is no worker to send decision requests to \
         (agent.demo.worker is not set)"
    );
    let worker = "[agent.demo]\nmodel = \"x\"\nworker = \"http://127.0.0.1:9/decide\"\n";
    assert_eq!(
        err(&with_llm(&format!("{worker}worker_messages = 0\n"))),
        "turnstone.toml:7:1: agent.demo.worker_messages: must be at least 1 (leave it out for the whole \
         conversation)"
    );
    let config =
        Config::parse(&with_llm(&format!("{worker}worker_messages = 40\n")), "turnstone.toml").unwrap();
    assert_eq!(config.agent("demo").unwrap().worker_messages, Transcript::Last(40.try_into().unwrap()));
}

#[test]
fn ids_use_a_safe_alphabet() {
    assert_eq!(
        err(&with_llm("[agent.\"my agent\"]\nmodel = \"x\"\n")),
        "turnstone.toml:4:8: agent.\"my agent\": invalid agent id \"my agent\": use only letters, digits, '_' and '-'"
    );
    assert_eq!(
        err("[llm.\"gpt.4\"]\ntype = \"scripted\"\n"),
        "turnstone.toml:1:6: llm.\"gpt.4\": invalid llm id \"gpt.4\": use only letters, digits, '_' and '-'"
    );
}

#[test]
fn secrets_are_named_never_written() {
    let message = err("[llm.openai]\ntype = \"openai\"\napi_key_env = \"sk-live-123\"\n");
    assert_eq!(
        message,
        "turnstone.toml:3:1: llm.openai.api_key_env: must be the NAME of an environment variable \
         (letters, digits and '_', not starting with a digit); the secret itself goes in that variable, \
         never in this file"
    );
    assert!(!message.contains("sk-live-123"));
    let message = err("[server]\naddr = { secret = \"sk-live-123\" }\n");
    assert!(!message.contains("sk-live-123"), "{message}");
    assert_eq!(
        err("[llm.s]\ntype = \"scripted\"\napi_key_env = \"KEY\"\n"),
        "turnstone.toml:3:1: llm.s.api_key_env: the scripted model takes no API key"
    );
}

#[test]
fn the_first_problem_in_the_file_is_reported() {
    let text = "[agent.b]\nmodel = \"x\"\nllm = \"nope\"\n\n[agent.a]\nmodel = \"x\"\nllm = \"nope\"\n";
    assert_eq!(err(text), "turnstone.toml:3:1: agent.b.llm: unknown llm \"nope\" (none defined)");
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    move |name| vars.get(name).cloned()
}

const ALL_SET: &[(&str, &str)] = &[
    ("OPENAI_API_KEY", "sk-openai-secret"),
    ("ANTHROPIC_API_KEY", "sk-ant-secret"),
    ("MAIN_WORKER_SECRET", "whsec-main"),
    ("TURNSTONE_API_KEYS", " alice:key-alice-1 , ci:key-ci-2,"),
];

#[test]
fn secrets_resolve_from_the_environment() {
    let config = Config::parse(FULL, "turnstone.toml").unwrap();
    let secrets = config.resolve_secrets(env(ALL_SET)).unwrap();
    assert_eq!(secrets.llm_api_key("openai"), Some("sk-openai-secret"));
    assert_eq!(secrets.llm_api_key("claude"), Some("sk-ant-secret"));
    assert_eq!(secrets.llm_api_key("nope"), None);
    assert_eq!(secrets.worker_secret("main"), Some("whsec-main"));
    assert_eq!(secrets.worker_secret("helper"), None);
    assert!(secrets.auth_enabled());
    let names: Vec<&str> = secrets.client_keys().iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["alice", "ci"]);
    let auth = crate::auth::Authenticator::new(config.auth.as_ref(), &secrets).unwrap();
    let client = |name: &str| Ok(crate::auth::Caller::client(crate::auth::Kind::Client, name));
    assert_eq!(auth.authenticate(Some("Bearer key-ci-2")), client("ci"));
    assert_eq!(auth.authenticate(Some("Bearer key-alice-1")), client("alice"));
    assert_eq!(auth.authenticate(Some("Bearer key-alice-")), Err(crate::auth::AuthError::Invalid));
    assert_eq!(auth.authenticate(Some("Bearer ")), Err(crate::auth::AuthError::Missing));

    let debug = format!("{secrets:?}");
    for (_, value) in ALL_SET {
        for part in
            value.split([',', ':']).map(str::trim).filter(|p| p.starts_with("key") || p.contains("sec"))
        {
            assert!(!debug.contains(part), "{debug} shows {part}");
        }
    }
    assert_eq!(
        debug,
        "Secrets { llm_keys: {\"claude\": <redacted>, \"openai\": <redacted>}, \
         worker_secrets: {\"main\": <redacted>}, client_keys: {\"alice\": <redacted>, \"ci\": <redacted>}, \
         machine_keys: {}, admin_keys: {}, jwt_secret: None }"
    );
}

#[test]
fn a_missing_secret_names_the_variable_and_who_needs_it() {
    let config = Config::parse(FULL, "turnstone.toml").unwrap();
    let without = |name: &str| {
        let vars: Vec<(&str, &str)> = ALL_SET.iter().copied().filter(|(k, _)| *k != name).collect();
        config.resolve_secrets(env(&vars)).unwrap_err().to_string()
    };
    assert_eq!(
        without("ANTHROPIC_API_KEY"),
        "turnstone.toml: llm.claude.api_key_env: environment variable ANTHROPIC_API_KEY is not set \
         (llm \"claude\" needs it)"
    );
    assert_eq!(
        without("MAIN_WORKER_SECRET"),
        "turnstone.toml: agent.main.worker_secret_env: environment variable MAIN_WORKER_SECRET is not set \
         (agent \"main\" needs it)"
    );
    assert_eq!(
        without("TURNSTONE_API_KEYS"),
        "turnstone.toml: auth.api_keys_env: environment variable TURNSTONE_API_KEYS is not set ([auth] needs it)"
    );
    let mut vars = ALL_SET.to_vec();
    vars[0].1 = "  ";
    assert_eq!(
        config.resolve_secrets(env(&vars)).unwrap_err().to_string(),
        "turnstone.toml: llm.openai.api_key_env: environment variable OPENAI_API_KEY is empty \
         (llm \"openai\" needs it)"
    );
}

#[test]
fn a_jwt_secret_shorter_than_the_hash_is_refused() {
    let config = Config::parse("[auth]\njwt_secret_env = \"JWT\"\n", "t.toml").unwrap();
    let short = "s".repeat(crate::auth::MIN_JWT_SECRET_BYTES - 1);
    assert_eq!(
        config.resolve_secrets(env(&[("JWT", &short)])).unwrap_err().to_string(),
        "t.toml: auth.jwt_secret_env: environment variable JWT holds 31 bytes; an HS256 secret needs at least 32"
    );
    let long = "s".repeat(crate::auth::MIN_JWT_SECRET_BYTES);
    assert_eq!(config.resolve_secrets(env(&[("JWT", &long)])).unwrap().jwt_secret(), Some(long.as_str()));
}

#[test]
fn malformed_api_keys_are_refused_without_showing_them() {
    let config = Config::parse("[auth]\napi_keys_env = \"KEYS\"\n", "t.toml").unwrap();
    let fail = |value: &str| config.resolve_secrets(env(&[("KEYS", value)])).unwrap_err().to_string();
    let message = fail("alice:k1,sk-live-999");
    assert_eq!(message, "t.toml: auth.api_keys_env: environment variable KEYS: entry 2 is not `name:key`");
    assert_eq!(
        fail("alice:k1,alice:k2"),
        "t.toml: auth.api_keys_env: environment variable KEYS: entry 2 repeats the name \"alice\""
    );
    assert_eq!(
        fail("alice:k1,bob:k1"),
        "t.toml: auth.api_keys_env: environment variable KEYS: entry 2 (\"bob\") repeats the key of another entry"
    );
    assert_eq!(
        fail("alice:"),
        "t.toml: auth.api_keys_env: environment variable KEYS: entry 1 (\"alice\") has an empty key"
    );
    assert_eq!(
        fail(":k1"),
        "t.toml: auth.api_keys_env: environment variable KEYS: entry 1 has an empty name or one with spaces \
         (expected `name:key`)"
    );
    assert_eq!(
        fail(" , "),
        "t.toml: auth.api_keys_env: environment variable KEYS: holds no `name:key` entry; \
         auth would refuse every request"
    );
}

#[test]
fn load_reads_a_file_and_names_it() {
    let dir = std::env::temp_dir().join(format!("turnstone-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("turnstone.toml");
    std::fs::write(&path, with_llm("[agent.demo]\nmodel = \"x\"\nllm = \"gpt\"\n")).unwrap();
    let message = Config::load(&path).unwrap_err().to_string();
    assert_eq!(
        message,
        format!("{}:6:1: agent.demo.llm: unknown llm \"gpt\" (defined: scripted)", path.display())
    );
    std::fs::write(&path, DEMO_TOML).unwrap();
    let config = Config::load(&path).unwrap();
    assert_eq!(config.file, path.display().to_string());
    assert_eq!(config.agents.keys().collect::<Vec<_>>(), ["demo", "researcher"]);

    let missing = dir.join("absent.toml");
    let error = Config::load(&missing).unwrap_err();
    assert!(error.io.is_some());
    assert!(
        error
            .to_string()
            .starts_with(&format!("{}: cannot read the configuration file: ", missing.display())),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn positions_count_characters() {
    assert_eq!(position("ab\ncd", 4), Position { line: 2, column: 2 });
    assert_eq!(position("é = 1", 2), Position { line: 1, column: 2 });
    assert_eq!(position("é", 1), Position { line: 1, column: 1 });
    assert_eq!(position("", 10), Position { line: 1, column: 1 });
}

#[test]
fn auth_settings_are_checked_where_they_are() {
    let agents = "[agent.demo]\nmodel = \"m\"\n";
    assert_eq!(
        err(&with_llm(&format!("{agents}[auth]\njwt_issuer = \"x\"\n"))),
        "turnstone.toml:6:2: auth: names no keys: set api_keys_env, jwt_secret_env, machine_keys_env or \
         admin_keys_env (or leave [auth] out for an open loopback host)"
    );
    assert_eq!(
        err(&with_llm(&format!("{agents}[auth]\napi_keys_env = \"K\"\njwt_audience = \"x\"\n"))),
        "turnstone.toml:8:1: auth.jwt_audience: needs jwt_secret_env"
    );
    assert_eq!(
        err(&with_llm(&format!(
            "{agents}[auth]\nmachine_keys_env = \"M\"\n[auth.machines]\nw = [\"demo\", \"nope\"]\n"
        ))),
        "turnstone.toml:9:1: auth.machines.w: unknown agent \"nope\" (defined: demo)"
    );
    assert_eq!(
        err(&with_llm(&format!("{agents}[auth]\napi_keys_env = \"K\"\n[auth.machines]\nw = [\"*\"]\n"))),
        "turnstone.toml:8:7: auth.machines: needs machine_keys_env"
    );
}

#[test]
fn auth_keys_are_each_their_own_and_machines_serve_agents() {
    let text = with_llm(
        "[agent.demo]\nmodel = \"m\"\n[auth]\napi_keys_env = \"K\"\nmachine_keys_env = \"M\"\n\
         [auth.machines]\nw1 = [\"demo\"]\n",
    );
    let config = Config::parse(&text, "t.toml").unwrap();
    let fail = |vars: &[(&str, &str)]| config.resolve_secrets(env(vars)).unwrap_err().to_string();
    assert_eq!(
        fail(&[("K", "alice:same"), ("M", "w1:same")]),
        "t.toml: auth: keys \"alice\" and \"w1\" are the same key; every key must be its own"
    );
    assert_eq!(
        fail(&[("K", "alice:a"), ("M", "w1:m1,w2:m2")]),
        "t.toml: auth.machines: machine key \"w2\" serves no agent: add `w2 = [\"<agent>\", ...]` (or [\"*\"])"
    );
    let secrets = config.resolve_secrets(env(&[("K", "alice:a"), ("M", "w1:m1")])).unwrap();
    assert_eq!(secrets.machine_keys(), [("w1".to_owned(), "m1".to_owned())]);
    assert!(!format!("{secrets:?}").contains("m1"), "Debug shows no key");
}

#[test]
fn prices_are_dollars_per_million_tokens_of_http_providers() {
    let config = Config::parse(
        "[llm.o]\ntype = \"openai\"\nprices.\"gpt-4o\" = { input = 2.5, output = 10.0, cache_read = 1.25 }\n",
        "t.toml",
    )
    .unwrap();
    let price = config.llms["o"].prices["gpt-4o"];
    assert_eq!(
        (price.input, price.output, price.cache_read, price.cache_write),
        (2.5, 10.0, Some(1.25), None)
    );
    assert_eq!(
        err("[llm.o]\ntype = \"openai\"\nprices.\"gpt-4o\" = { input = -1.0, output = 10.0 }\n"),
        "turnstone.toml:3:21: llm.o.prices.gpt-4o.input: must be a price in dollars per million tokens, \
         from 0 to 1000000"
    );
    assert_eq!(
        err("[llm.s]\ntype = \"scripted\"\nprices.m = { input = 1.0, output = 1.0 }\n"),
        "turnstone.toml:3:1: llm.s.prices: the scripted model is free: it takes no prices"
    );
}

#[test]
fn budgets_are_dollars_and_calls_per_turn() {
    let config = Config::parse(
        &with_llm("[agent.a]\nmodel = \"m\"\nmax_cost = \"0.50\"\nmax_llm_calls = 3\n"),
        "t.toml",
    )
    .unwrap();
    let budget = config.agent("a").unwrap().budget;
    assert_eq!(budget, Budget { max_cost_picodollars: Some(500_000_000_000), max_llm_calls: Some(3) });
    let config = Config::parse(&with_llm("[agent.a]\nmodel = \"m\"\nmax_cost = 2\n"), "t.toml").unwrap();
    assert_eq!(config.agent("a").unwrap().budget.max_cost_picodollars, Some(2_000_000_000_000));
    assert_eq!(
        err(&with_llm("[agent.a]\nmodel = \"m\"\nmax_cost = \"lots\"\n")),
        "turnstone.toml:6:1: agent.a.max_cost: must be an amount of dollars, e.g. \"0.50\""
    );
    assert_eq!(
        err(&with_llm("[agent.a]\nmodel = \"m\"\nmax_llm_calls = 0\n")),
        "turnstone.toml:6:1: agent.a.max_llm_calls: must be at least 1 (leave it out for no limit)"
    );
}

#[test]
fn limits_default_to_the_engines_and_are_read_and_checked() {
    let config = Config::parse(&with_llm("[agent.demo]\nmodel = \"x\"\n"), "turnstone.toml").unwrap();
    assert_eq!(config.limits.engine(), turnstone_engine::session::Limits::default());
    assert_eq!(config.limits.sessions_per_owner, None);
    let text =
        with_llm("[limits]\nqueued_turns = 3\nsessions_per_owner = 10\n\n[agent.demo]\nmodel = \"x\"\n");
    let config = Config::parse(&text, "turnstone.toml").unwrap();
    assert_eq!((config.limits.queued_turns, config.limits.sessions_per_owner), (3, Some(10)));
    assert_eq!(config.limits.engine().queued_turns, 3);
    let zero = err(&with_llm("[limits]\nmessage_bytes = 0\n\n[agent.demo]\nmodel = \"x\"\n"));
    assert!(zero.contains("limits.message_bytes: must be at least 1"), "{zero}");
    let typo = err(&with_llm("[limits]\nqueued_turn = 3\n"));
    assert!(typo.contains("limits.queued_turn: unknown key"), "{typo}");
}

/// `[llm.<id>] prompt_cache` and `thinking` reach the agents that use the llm: the cache's
/// lifetime, and the thinking form of a model by its longest matching prefix.
#[test]
fn caching_and_thinking_forms_reach_the_agents() {
    let text = "[llm.claude]\ntype = \"anthropic\"\nprompt_cache = \"1h\"\n\
                thinking = { \"my-claude\" = \"budget\", \"my-claude-next\" = \"adaptive\" }\n\n\
                [agent.a]\nmodel = \"my-claude-next-1\"\n";
    let config = Config::parse(text, "t.toml").unwrap();
    let agents = crate::assemble::agents(&config, &Secrets::default()).unwrap();
    let agent = &agents["a"];
    assert_eq!(agent.prompt_cache, Some(CacheTtl::OneHour));
    assert_eq!(agent.thinking_form("my-claude-next-1"), Some(ThinkingForm::Adaptive));
    assert_eq!(agent.thinking_form("my-claude-2"), Some(ThinkingForm::Budget));
    assert_eq!(agent.thinking_form("claude-opus-4-7"), None, "an id that says is left to the format");
    let off = Config::parse(
        "[llm.c]\ntype = \"anthropic\"\nprompt_cache = \"off\"\n[agent.a]\nmodel = \"m\"\n",
        "t.toml",
    );
    let agents = crate::assemble::agents(&off.unwrap(), &Secrets::default()).unwrap();
    assert_eq!(agents["a"].prompt_cache, None);
}

// ----- MCP servers ---------------------------------------------------------------------------

#[test]
fn mcp_servers_parse_with_their_defaults_and_header_secrets() {
    let config = Config::parse(
        &with_llm(
            r#"[agent.demo]
model = "m"

[[agent.demo.mcp]]
name = "files"
url = "http://127.0.0.1:9100/mcp"
headers_env = { Authorization = "FILES_MCP_TOKEN" }
tools = { include = ["read_file"] }

[[agent.demo.mcp]]
name = "local"
command = ["python3", "server.py"]
approve = "never"
timeout_secs = 5
"#,
        ),
        "turnstone.toml",
    )
    .unwrap();
    let servers = &config.agents["demo"].mcp;
    assert_eq!(servers.len(), 2);
    assert_eq!(
        (servers[0].approve, servers[0].timeout_secs, servers[0].tools.include.clone()),
        (McpApprove::Destructive, 60.0, Some(vec!["read_file".to_owned()]))
    );
    assert_eq!((servers[1].approve, servers[1].timeout_secs), (McpApprove::Never, 5.0));
    let secrets = config.resolve_secrets(env(&[("FILES_MCP_TOKEN", "Bearer t")])).unwrap();
    assert_eq!(secrets.mcp_headers("demo", "files"), [("Authorization".to_owned(), "Bearer t".to_owned())]);
    let missing = config.resolve_secrets(env(&[])).unwrap_err().to_string();
    assert!(missing.contains("agent.demo.mcp[0].headers_env.Authorization"), "{missing}");
    assert!(missing.contains("FILES_MCP_TOKEN is not set"), "{missing}");
    let functions = config.check_for_functions().unwrap_err().to_string();
    assert!(
        functions.contains("agent.demo.mcp[1].command") && functions.contains("local host"),
        "{functions}"
    );
}

#[test]
fn mcp_server_mistakes_are_named_with_their_line_and_field() {
    let bad = |server: &str| {
        err(&with_llm(&format!("[agent.demo]\nmodel = \"m\"\n\n[[agent.demo.mcp]]\n{server}")))
    };
    let both = bad("name = \"files\"\nurl = \"http://h/mcp\"\ncommand = [\"x\"]\n");
    assert!(both.contains("agent.demo.mcp[0].url") && both.contains("either url"), "{both}");
    let neither = bad("name = \"files\"\n");
    assert!(neither.contains("either url"), "{neither}");
    let name = bad("name = \"a__b\"\nurl = \"http://h/mcp\"\n");
    assert!(name.contains("agent.demo.mcp[0].name") && name.contains("__"), "{name}");
    let timeout = bad("name = \"f\"\nurl = \"http://h/mcp\"\ntimeout_secs = 0\n");
    assert!(timeout.contains("timeout_secs") && timeout.contains("positive"), "{timeout}");
    let approve = bad("name = \"f\"\nurl = \"http://h/mcp\"\napprove = \"sometimes\"\n");
    assert!(approve.contains("approve") && approve.contains("sometimes"), "{approve}");
    let unknown = bad("name = \"f\"\nurl = \"http://h/mcp\"\nheaders = { A = \"b\" }\n");
    assert!(unknown.starts_with("turnstone.toml:10:1: agent.demo.mcp[0].headers: unknown key"), "{unknown}");
    let url = bad("name = \"f\"\nurl = \"ftp://h/mcp\"\n");
    assert!(url.contains("agent.demo.mcp[0].url"), "{url}");
    let twice = err(&with_llm(
        "[agent.demo]\nmodel = \"m\"\n\n[[agent.demo.mcp]]\nname = \"f\"\nurl = \"http://h/mcp\"\n\n[[agent.demo.mcp]]\nname = \"f\"\nurl = \"http://h/mcp\"\n",
    ));
    assert!(twice.contains("duplicate MCP server"), "{twice}");
}

#[test]
fn context_windows_and_compaction_are_read_and_checked() {
    let config = Config::parse(
        r#"
[llm.local]
type = "openai"
base_url = "http://localhost:11434/v1"
context_window = 32768
max_output_tokens = 2048

[agent.a]
model = "llama-3"
llm = "local"
context_window = 16384

[agent.a.compaction]
at = 0.7
keep_recent = 0.2
tool_result_max_tokens = 4000
prompt = "Summarize tersely."
"#,
        "turnstone.toml",
    )
    .unwrap();
    let a = config.agent("a").unwrap();
    assert_eq!(a.context_window, Some(16_384));
    assert_eq!(a.compaction.at, 0.7);
    assert_eq!(a.compaction.tool_result_max_tokens, Some(4_000));
    assert_eq!(config.llms["local"].context_window, Some(32_768));

    let e = err("[llm.s]\ntype = \"scripted\"\ncontext_window = 100\n[agent.a]\nmodel = \"m\"\n");
    assert!(e.contains("llm.s.context_window: must be at least 1024 tokens"), "{e}");
    let e = err(&with_llm("[agent.a]\nmodel = \"m\"\n[agent.a.compaction]\nat = 1.5\n"));
    assert!(e.contains("agent.a.compaction.at: must be a share of the window"), "{e}");
    let e = err(&with_llm("[agent.a]\nmodel = \"m\"\ncontext_window = 4096\nmax_output_tokens = 8192\n"));
    assert!(e.contains("agent.a.max_output_tokens: must be less than context_window (4096)"), "{e}");
    let e = err(&with_llm("[agent.a]\nmodel = \"m\"\n[agent.a.compaction]\nkeep_recnt = 0.5\n"));
    assert!(e.contains("keep_recnt"), "{e}");
}

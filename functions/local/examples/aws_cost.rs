//! What a step costs on AWS (DESIGN.md sections 5 and 12), measured against a real moto
//! server: DynamoDB requests, write and read units, SQS requests, Lambda invocations and bytes
//! written per step, and dollars per million steps at on-demand list prices. A program that
//! prints figures, never a test.
//!
//! ```text
//! cargo run --release -p turnstone --example aws_cost -- \
//!     [--messages 10,100,1000] [--tools 1,20] [--scenarios hosted,worker] [--loop-steps 20] \
//!     [--cache warm,cold] [--lambda-mb 256] [--trace]
//! ```
//!
//! It starts its own moto server (`.venv/bin/moto_server`) unless `TURNSTONE_MOTO_ENDPOINT`
//! names one, and runs the engine as the Lambda deployment does (`Topology::Split`): an `api`
//! engine takes each client input (one `api` invocation: `App::submit`), and a `dispatch`
//! engine is driven as the SQS event source drives the `dispatch` function: a batch received
//! from the real `SqsQueue`, each session in it run once (`Dispatcher::run`, as
//! `turnstone_lambda::sqs::handle_batch` does), the messages deleted; one batch is one
//! `dispatch` invocation. Both engines share one `DynamoStore` and one `SqsQueue`, built from
//! SDK clients that carry a counting interceptor (`aws_cost/meter.rs`); the event source's own
//! receives and deletes go through other clients and are modelled instead (one
//! `ReceiveMessage` and one `DeleteMessageBatch` per invocation).
//!
//! A **step** is one successful commit of the measured session (`Store::commit`, counted by a
//! store decorator). Each cell of the matrix is a fresh session on a fresh table, pre-filled
//! by running real turns (uncounted) until it holds the conversation length, then one measured
//! turn with the engines that ran the pre-fill (`warm`: containers that have seen the session,
//! whose message cache reads only new messages) and one with fresh engines for every
//! invocation (`cold`: a new container each time, which loads the whole conversation).
//!
//! The pre-fill sends up to [`PREFILL_CHUNK`] messages per turn (a `client.messages` input: the
//! conversation so far, by id, and the new messages, which the model then answers): moto
//! deep-copies the whole table for every item of every `TransactWriteItems`, so one-message
//! turns slow down as the table grows (the first 400 of one session took 400 s), and a table
//! per cell keeps the copies small. The measured turns are ordinary one-message turns.

// The unit arithmetic and the interceptor (a crate root looks for modules next to it).
#[path = "aws_cost/meter.rs"]
mod meter;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_trait::async_trait;
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::types::ProjectionType;
use clap::{Parser, ValueEnum};
use serde_json::{Value, json};
use turnstone_aws::{
    AwsClients, DynamoRegistry, DynamoStore, ManagementFrames, QueueSettings, SqsQueue, moto,
};
use turnstone_engine::ids::CallId;
use turnstone_engine::protocol::{
    Action, ClientInput, ClientMessageInput, ClientMessagesInput, DecisionRequest, DecisionResponse,
    DraftMessage, Message, Role, ToolCall, ToolCallAction, Trigger,
};
use turnstone_engine::session::{TurnStatus, UsedId};
use turnstone_engine::time::Timestamp;
use turnstone_runtime::ahp::{Pusher, Pushes};
use turnstone_runtime::api::Placement;
use turnstone_runtime::app::AgentRuntime;
use turnstone_runtime::assemble::{self, Engine, Topology};
use turnstone_runtime::auth::Caller;
use turnstone_runtime::config::Config;
use turnstone_runtime::queue::{Consumer, Queue, WakeUp};
use turnstone_runtime::store::{
    Commit, Loaded, LoggedEvent, Page, SessionFilter, SessionListing, Store, StoreError,
};
use turnstone_tests::{FakeAnswer, FakeWorker, tool_answer};

use meter::{Kind, Meter, Tally};

// ---------------------------------------------------------------------------------------------
// Prices
// ---------------------------------------------------------------------------------------------

// On-demand list prices, us-east-1, as DESIGN.md section 5 gives them ("as last seen
// published"). CHECK THEM against aws.amazon.com/dynamodb/pricing/on-demand/,
// aws.amazon.com/sqs/pricing/ and aws.amazon.com/lambda/pricing/ before quoting a figure.
/// DynamoDB, $ per write request unit (1 KB; 2 units per KB inside a transaction).
const DYNAMODB_WRITE_UNIT: f64 = 0.625 / 1e6;
/// DynamoDB, $ per read request unit (a strongly consistent read of 4 KB; eventual: half).
const DYNAMODB_READ_UNIT: f64 = 0.125 / 1e6;
/// SQS standard queue, $ per request (each 64 KB of payload is a request), past the free tier.
const SQS_REQUEST: f64 = 0.40 / 1e6;
/// Lambda, $ per invocation.
const LAMBDA_REQUEST: f64 = 0.20 / 1e6;
/// Lambda (x86), $ per GB-second of duration, billed per started millisecond.
const LAMBDA_GB_SECOND: f64 = 0.000_016_666_7;

/// The design's target for an engine-hosted step, $ per million.
const TARGET_HOSTED_PER_MILLION: f64 = 3.0;
/// How far write units per step may spread across conversation lengths and agent sizes.
const TARGET_FLAT: f64 = 1.5;

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Parser)]
#[command(about = "Measures what a step costs on AWS (DynamoDB, SQS, Lambda), against a moto server.")]
struct Args {
    /// Conversation lengths: messages in the session before the measured turn.
    #[arg(long, value_delimiter = ',', default_values_t = [10, 100, 1000])]
    messages: Vec<usize>,
    /// Agent sizes: how many tools the agent declares (1..=20).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 20])]
    tools: Vec<usize>,
    /// Which scenarios to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["hosted", "worker"])]
    scenarios: Vec<Scenario>,
    /// Which measured turns: with the engines that ran the pre-fill, with fresh ones, or both.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["warm", "cold"])]
    cache: Vec<Cache>,
    /// Tool calls, one after another, in the measured turn of the worker scenario.
    #[arg(long, default_value_t = 20)]
    loop_steps: usize,
    /// KB of agent state the worker writes with every answer, changed each time (0: none): a
    /// worker keeping its working memory in the session (issue 25 measured 12).
    #[arg(long, default_value_t = 0)]
    state_kb: usize,
    /// Engine-hosted turns measured per cell, one after another. The store writes a checkpoint
    /// every 32 commits or so: one 3-step turn would show one or none by chance, 16 turns (48
    /// steps) take it in at its rate. A worker turn is 85 steps, measured once.
    #[arg(long, default_value_t = 16)]
    hosted_turns: usize,
    /// Lambda memory in MB, for the duration's cost.
    #[arg(long, default_value_t = 256)]
    lambda_mb: u64,
    /// Print every request of each measured turn.
    #[arg(long)]
    trace: bool,
    /// Keep each cell's table (to look at its items with other tools, with
    /// TURNSTONE_MOTO_ENDPOINT naming a server that outlives the run); by default it is dropped.
    #[arg(long)]
    keep_tables: bool,
    /// Build the functions without AHP pushes (as before the `ahp` function): by default each
    /// commit reads its session's AHP subscribers, as the deployed `api` and `dispatch` do.
    #[arg(long)]
    no_ahp: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Scenario {
    /// An agent without a worker on the scripted model: a plain message, `You said: ...`.
    Hosted,
    /// An agent with a worker webhook whose turn runs a tool loop of `--loop-steps` calls.
    Worker,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Cache {
    /// The measured turn runs on the engines that ran the pre-fill (warm containers).
    Warm,
    /// Every invocation of the measured turn gets fresh engines (a new container each).
    Cold,
}

impl Cache {
    fn name(self) -> &'static str {
        match self {
            Cache::Warm => "warm",
            Cache::Cold => "cold",
        }
    }
}

/// How long a turn may take before the run fails.
const TURN_DEADLINE: Duration = Duration::from_secs(120);
/// How long the event source waits for a message while a turn is still running.
const POLL: Duration = Duration::from_secs(1);
/// The most messages one `dispatch` invocation gets (the event source's default batch size).
const BATCH: usize = 10;
/// The last user message of a worker turn that should run the tool loop carries this.
const LOOP_MARK: &str = "[audit]";
/// The most new messages of one pre-fill turn (odd: user, assistant, ..., user), so its first
/// commit stays well under a transaction's 100 items.
const PREFILL_CHUNK: usize = 39;

// ---------------------------------------------------------------------------------------------
// The agents
// ---------------------------------------------------------------------------------------------

/// A tool the agents may declare: its name, description, input schema and the arguments the
/// worker's loop calls it with (valid for the schema).
struct ToolSpec {
    name: &'static str,
    description: &'static str,
    input: Value,
    example: Value,
}

fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn choice(description: &str, values: &[&str]) -> Value {
    json!({"type": "string", "description": description, "enum": values})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

/// Twenty tools of a customer-support agent, with JSON Schemas of a few properties each.
fn catalog() -> Vec<ToolSpec> {
    let order_id = || json!({"type": "string", "description": "The order id, e.g. ord_8f2k1.", "pattern": "^ord_[a-z0-9]+$"});
    let customer_id = || string("The customer's id, e.g. cus_1029.");
    vec![
        ToolSpec {
            name: "search_orders",
            description: "Search a customer's orders by status and date, newest first.",
            input: object(
                json!({
                    "customer_id": customer_id(),
                    "status": choice("Only orders in this state.", &["open", "shipped", "delivered", "cancelled"]),
                    "since": {"type": "string", "format": "date", "description": "Only orders placed on or after this day."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": "At most this many orders."}
                }),
                &["customer_id"],
            ),
            example: json!({"customer_id": "cus_1029", "status": "shipped", "limit": 10}),
        },
        ToolSpec {
            name: "get_order",
            description: "Fetch one order with its line items and payment state.",
            input: object(
                json!({"order_id": order_id(), "include_items": {"type": "boolean", "description": "Include line items."}}),
                &["order_id"],
            ),
            example: json!({"order_id": "ord_8f2k1", "include_items": true}),
        },
        ToolSpec {
            name: "refund_order",
            description: "Refund part or all of an order. Irreversible: confirm with the customer first.",
            input: object(
                json!({
                    "order_id": order_id(),
                    "amount_cents": {"type": "integer", "minimum": 1, "description": "How much to refund, in cents."},
                    "reason": choice("Why.", &["damaged", "late", "wrong_item", "goodwill"]),
                    "notify_customer": {"type": "boolean"}
                }),
                &["order_id", "amount_cents", "reason"],
            ),
            example: json!({"order_id": "ord_8f2k1", "amount_cents": 1299, "reason": "late", "notify_customer": true}),
        },
        ToolSpec {
            name: "get_customer",
            description: "Look a customer up by id or email address.",
            input: object(
                json!({"customer_id": customer_id(), "email": {"type": "string", "format": "email"}}),
                &[],
            ),
            example: json!({"email": "ana@example.com"}),
        },
        ToolSpec {
            name: "update_address",
            description: "Change a customer's shipping address for future orders.",
            input: object(
                json!({
                    "customer_id": customer_id(),
                    "line1": string("Street and number."),
                    "city": string("City."),
                    "postal_code": string("Postal code."),
                    "country": {"type": "string", "minLength": 2, "maxLength": 2, "description": "ISO 3166-1 alpha-2."}
                }),
                &["customer_id", "line1", "city", "country"],
            ),
            example: json!({"customer_id": "cus_1029", "line1": "12 Rue Oberkampf", "city": "Paris", "postal_code": "75011", "country": "FR"}),
        },
        ToolSpec {
            name: "create_ticket",
            description: "Open a support ticket for follow-up by a human agent.",
            input: object(
                json!({
                    "subject": string("One line."),
                    "body": string("What happened and what the customer wants."),
                    "priority": choice("How urgent.", &["low", "normal", "high", "urgent"]),
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10}
                }),
                &["subject", "body"],
            ),
            example: json!({"subject": "Parcel stuck in transit", "body": "Tracking has not moved for 3 days.", "priority": "normal", "tags": ["shipping"]}),
        },
        ToolSpec {
            name: "add_ticket_note",
            description: "Add a note to an existing ticket.",
            input: object(
                json!({"ticket_id": string("The ticket, e.g. T-4411."), "note": string("The note."), "internal": {"type": "boolean", "description": "Hidden from the customer."}}),
                &["ticket_id", "note"],
            ),
            example: json!({"ticket_id": "T-4411", "note": "Customer called again.", "internal": true}),
        },
        ToolSpec {
            name: "search_kb",
            description: "Search the help center articles.",
            input: object(
                json!({"query": string("What to look for."), "product": choice("Restrict to a product.", &["shoes", "apparel", "gear"]), "max_results": {"type": "integer", "minimum": 1, "maximum": 20}}),
                &["query"],
            ),
            example: json!({"query": "return policy worn shoes", "max_results": 3}),
        },
        ToolSpec {
            name: "get_shipment",
            description: "Tracking events of a shipment.",
            input: object(
                json!({"tracking_number": string("The carrier's tracking number."), "carrier": choice("The carrier.", &["ups", "fedex", "usps", "dhl"])}),
                &["tracking_number"],
            ),
            example: json!({"tracking_number": "1Z999AA10123456784", "carrier": "ups"}),
        },
        ToolSpec {
            name: "check_inventory",
            description: "Stock of a product variant per warehouse.",
            input: object(
                json!({"sku": string("The variant's SKU."), "warehouse": choice("One warehouse only.", &["east", "west", "eu"]), "quantity": {"type": "integer", "minimum": 1}}),
                &["sku"],
            ),
            example: json!({"sku": "RUN-42-BLU", "quantity": 1}),
        },
        ToolSpec {
            name: "apply_discount",
            description: "Apply a discount code or a percentage to an open order.",
            input: object(
                json!({"order_id": order_id(), "code": string("A discount code."), "percent": {"type": "number", "minimum": 0, "maximum": 100}}),
                &["order_id"],
            ),
            example: json!({"order_id": "ord_8f2k1", "percent": 10}),
        },
        ToolSpec {
            name: "schedule_callback",
            description: "Book a phone callback by a human agent.",
            input: object(
                json!({"customer_id": customer_id(), "phone": string("E.164 phone number."), "time": {"type": "string", "format": "date-time"}, "timezone": string("IANA zone, e.g. Europe/Paris.")}),
                &["customer_id", "phone", "time"],
            ),
            example: json!({"customer_id": "cus_1029", "phone": "+33612345678", "time": "2026-05-04T10:00:00Z", "timezone": "Europe/Paris"}),
        },
        ToolSpec {
            name: "send_email",
            description: "Send the customer a templated email.",
            input: object(
                json!({
                    "to": {"type": "string", "format": "email"},
                    "template": choice("Which template.", &["refund_issued", "address_changed", "ticket_opened", "generic"]),
                    "subject": string("Subject line (generic template only)."),
                    "variables": {"type": "object", "additionalProperties": {"type": "string"}}
                }),
                &["to", "template"],
            ),
            example: json!({"to": "ana@example.com", "template": "ticket_opened", "variables": {"ticket": "T-4411"}}),
        },
        ToolSpec {
            name: "get_invoice",
            description: "An order's invoice.",
            input: object(
                json!({"invoice_id": string("The invoice, e.g. in_2231."), "format": choice("Output format.", &["pdf", "html"])}),
                &["invoice_id"],
            ),
            example: json!({"invoice_id": "in_2231", "format": "html"}),
        },
        ToolSpec {
            name: "list_subscriptions",
            description: "A customer's subscriptions.",
            input: object(
                json!({"customer_id": customer_id(), "active_only": {"type": "boolean"}}),
                &["customer_id"],
            ),
            example: json!({"customer_id": "cus_1029", "active_only": true}),
        },
        ToolSpec {
            name: "cancel_subscription",
            description: "Cancel a subscription now or at the end of its period.",
            input: object(
                json!({"subscription_id": string("The subscription, e.g. sub_77."), "at_period_end": {"type": "boolean"}, "reason": string("Why the customer cancels.")}),
                &["subscription_id"],
            ),
            example: json!({"subscription_id": "sub_77", "at_period_end": true, "reason": "moving abroad"}),
        },
        ToolSpec {
            name: "convert_currency",
            description: "Convert an amount between currencies at today's rate.",
            input: object(
                json!({"amount": {"type": "number"}, "from": {"type": "string", "minLength": 3, "maxLength": 3}, "to": {"type": "string", "minLength": 3, "maxLength": 3}}),
                &["amount", "from", "to"],
            ),
            example: json!({"amount": 12.99, "from": "USD", "to": "EUR"}),
        },
        ToolSpec {
            name: "get_weather",
            description: "Weather forecast for a city (delivery delays).",
            input: object(
                json!({"city": string("City name."), "units": choice("Units.", &["metric", "imperial"])}),
                &["city"],
            ),
            example: json!({"city": "Memphis", "units": "metric"}),
        },
        ToolSpec {
            name: "translate_text",
            description: "Translate a text for the customer.",
            input: object(
                json!({"text": string("What to translate."), "target_language": string("BCP 47 tag, e.g. fr."), "formality": choice("Register.", &["formal", "informal"])}),
                &["text", "target_language"],
            ),
            example: json!({"text": "Your refund is on its way.", "target_language": "fr", "formality": "formal"}),
        },
        ToolSpec {
            name: "escalate",
            description: "Hand the conversation to a team of humans.",
            input: object(
                json!({"ticket_id": string("The ticket."), "team": choice("Which team.", &["billing", "logistics", "tech", "legal"]), "summary": string("What the team needs to know.")}),
                &["ticket_id", "team", "summary"],
            ),
            example: json!({"ticket_id": "T-4411", "team": "logistics", "summary": "Parcel lost; customer wants a reshipment."}),
        },
    ]
}

/// A JSON value as a TOML value (inline tables and arrays; JSON string escapes are TOML's).
fn toml_value(value: &Value) -> String {
    match value {
        Value::Null => "\"\"".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => Value::String(s.clone()).to_string(),
        Value::Array(items) => format!("[{}]", items.iter().map(toml_value).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| {
                    let bare =
                        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    let key = if bare { k.clone() } else { Value::String(k.clone()).to_string() };
                    format!("{key} = {}", toml_value(v))
                })
                .collect();
            format!("{{ {} }}", fields.join(", "))
        }
    }
}

const SYSTEM: &str = "You are the customer-support agent of an online running-gear shop. Be brief and \
     friendly. Look things up with your tools before answering; never invent order data. Ask before \
     refunding, cancelling or changing anything.";

/// The agent id of a scenario with `tools` tools.
fn agent_id(scenario: Scenario, tools: usize) -> String {
    match scenario {
        Scenario::Hosted => format!("hosted-{tools}t"),
        Scenario::Worker => format!("worker-{tools}t"),
    }
}

/// The configuration: the scripted model, and an agent per scenario and size. Engine-hosted
/// agents run their tools on the client (they have no worker); worker agents on the worker.
fn config_toml(worker_url: &str, sizes: &[usize], catalog: &[ToolSpec]) -> String {
    let mut toml = String::from("[llm.scripted]\ntype = \"scripted\"\n");
    for scenario in [Scenario::Hosted, Scenario::Worker] {
        for &tools in sizes {
            let id = agent_id(scenario, tools);
            let _ = write!(
                toml,
                "\n[agent.{id}]\nmodel = \"scripted\"\nllm = \"scripted\"\nsystem = {}\n",
                toml_value(&json!(SYSTEM))
            );
            if scenario == Scenario::Worker {
                let _ = writeln!(toml, "worker = {}", toml_value(&json!(worker_url)));
            }
            for tool in catalog.iter().take(tools) {
                let _ = write!(
                    toml,
                    "\n[[agent.{id}.tools]]\nname = \"{}\"\ndescription = {}\ninput = {}\n",
                    tool.name,
                    toml_value(&json!(tool.description)),
                    toml_value(&tool.input)
                );
                if scenario == Scenario::Hosted {
                    toml.push_str("handler = \"client\"\n");
                }
            }
        }
    }
    toml
}

// ---------------------------------------------------------------------------------------------
// The worker
// ---------------------------------------------------------------------------------------------

/// The text of a message.
fn text_of(message: &Message) -> String {
    message.content_text()
}

/// Tool results on the conversation since its last user message, and whether that message
/// asks for the tool loop.
fn loop_progress(messages: &[Message]) -> (usize, bool) {
    let mut results = 0;
    for message in messages.iter().rev() {
        match message.role {
            Role::Tool => results += 1,
            Role::User => return (results, text_of(message).contains(LOOP_MARK)),
            _ => {}
        }
    }
    (results, false)
}

/// A tool's result: a few hundred bytes of JSON, as a lookup answers.
fn tool_result(name: &str, arguments: &Value) -> Value {
    json!({
        "ok": true,
        "tool": name,
        "arguments": arguments,
        "data": {
            "summary": format!("{name}: 3 records found, newest first; nothing needs attention."),
            "records": [
                {"id": "rec_01", "status": "shipped", "updated_at": "2026-04-28T09:12:00Z"},
                {"id": "rec_02", "status": "delivered", "updated_at": "2026-04-20T16:40:00Z"},
                {"id": "rec_03", "status": "delivered", "updated_at": "2026-03-02T11:05:00Z"}
            ]
        }
    })
}

/// The worker's script. It accepts every proposal, runs `tool.execute` with [`tool_result`],
/// and drives the tool loop itself: when the model has answered (`llm.finished`) in a turn
/// whose user message carries [`LOOP_MARK`] and fewer than `steps` tool results followed it,
/// it answers with the assistant message turned into one tool call (the next of the agent's
/// tools, round robin) and the `tool.call` that runs it, as a model asking for a tool would
/// have the engine propose. So each loop step is a real model call, its decision, the tool's
/// `tool.execute` and its `tool.finished` decision, and adds an assistant and a tool message.
fn worker_script(
    catalog: Arc<Vec<ToolSpec>>,
    steps: usize,
    state_kb: usize,
) -> impl Fn(&DecisionRequest, usize) -> FakeAnswer + Send + Sync + 'static {
    let answer = worker_answer(catalog, steps);
    move |request, delivery| {
        let answer = answer(request, delivery);
        if state_kb == 0 {
            return answer;
        }
        // New state with every answer of a decision (a tool.execute answer is the tool's
        // result, not a decision's response, and carries none).
        let state = serde_json::json!({"decision": request.decision_id.as_str(), "memory": "m".repeat(state_kb * 1024)});
        match answer {
            FakeAnswer::Accept if !matches!(request.trigger, Trigger::ToolExecute(_)) => {
                FakeAnswer::Respond(DecisionResponse { state: Some(state), ..request.proposed.clone() })
            }
            FakeAnswer::Respond(response) if !matches!(request.trigger, Trigger::ToolExecute(_)) => {
                FakeAnswer::Respond(DecisionResponse { state: Some(state), ..response })
            }
            other => other,
        }
    }
}

/// [`worker_script`]'s answers, without state.
fn worker_answer(
    catalog: Arc<Vec<ToolSpec>>,
    steps: usize,
) -> impl Fn(&DecisionRequest, usize) -> FakeAnswer + Send + Sync + 'static {
    move |request, _| match &request.trigger {
        Trigger::ToolExecute(t) if request.proposed.is_empty() => {
            let arguments = serde_json::from_str(&t.arguments).unwrap_or(Value::Null);
            FakeAnswer::Respond(tool_answer(Ok(tool_result(&t.name, &arguments))))
        }
        Trigger::LlmFinished(t) if t.ok => {
            let (done, wanted) = loop_progress(&request.messages);
            let tools: Vec<&str> = request
                .agent
                .as_ref()
                .and_then(|a| a.tools.as_ref())
                .map(|tools| tools.iter().map(|t| t.name.as_str()).collect())
                .unwrap_or_default();
            let spec = tools
                .get(done % tools.len().max(1))
                .and_then(|name| catalog.iter().find(|s| s.name == *name));
            match spec {
                Some(spec) if wanted && done < steps => {
                    let mut response = request.proposed.clone();
                    let id = CallId::from(format!("call_{}", request.decision_id.trim_start_matches("dec_")));
                    let arguments = spec.example.to_string();
                    if let Some(message) = response.messages.as_mut().and_then(|m| m.first_mut()) {
                        message.content = None;
                        message.tool_calls =
                            Some(vec![ToolCall::function(id.clone(), spec.name, arguments.clone())]);
                    }
                    response.actions = Some(vec![Action::ToolCall(ToolCallAction {
                        id: Some(id),
                        name: spec.name.to_owned(),
                        arguments: Value::String(arguments),
                        handler: None,
                        retry: None,
                    })]);
                    FakeAnswer::Respond(response)
                }
                _ => FakeAnswer::Accept,
            }
        }
        _ => FakeAnswer::Accept,
    }
}

// ---------------------------------------------------------------------------------------------
// The store, counting commits
// ---------------------------------------------------------------------------------------------

/// The DynamoDB store; a successful commit is a step.
struct CountingStore {
    inner: DynamoStore,
    meter: Arc<Meter>,
}

#[async_trait]
impl Store for CountingStore {
    async fn load(&self, session_id: &str) -> Result<Option<Loaded>, StoreError> {
        self.inner.load(session_id).await
    }

    async fn load_since(
        &self,
        session_id: &str,
        from: u64,
    ) -> Result<Option<(Loaded, Vec<turnstone_engine::protocol::TreeNode>)>, StoreError> {
        self.inner.load_since(session_id, from).await
    }

    async fn used_ids(&self, session_id: &str, ids: &[UsedId]) -> Result<Vec<UsedId>, StoreError> {
        self.inner.used_ids(session_id, ids).await
    }

    async fn commit(
        &self,
        session_id: &str,
        expected_version: u64,
        commit: Commit<'_>,
    ) -> Result<u64, StoreError> {
        let result = self.inner.commit(session_id, expected_version, commit).await;
        if result.is_ok() {
            self.meter.committed();
        }
        result
    }

    async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        self.inner.events_after(session_id, after_seq, limit).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<SessionListing>, StoreError> {
        self.inner.list_sessions(filter, cursor, limit).await
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.due(now, limit).await
    }

    async fn dispose(&self, session_id: &str) -> Result<bool, StoreError> {
        self.inner.dispose(session_id).await
    }
}

// ---------------------------------------------------------------------------------------------
// The Lambda model
// ---------------------------------------------------------------------------------------------

/// The invocations of one turn, by function, with their wall times.
#[derive(Debug, Default)]
struct Invocations {
    api: Vec<Duration>,
    dispatch: Vec<Duration>,
}

impl Invocations {
    fn count(&self) -> u64 {
        (self.api.len() + self.dispatch.len()) as u64
    }

    /// Billed milliseconds (each invocation rounded up to the millisecond).
    fn billed_ms(&self) -> u64 {
        self.api.iter().chain(&self.dispatch).map(|d| d.as_micros().div_ceil(1000) as u64).sum()
    }

    /// SQS requests of the event source: one receive and one batch delete per `dispatch`
    /// invocation.
    fn event_source_requests(&self) -> u64 {
        2 * self.dispatch.len() as u64
    }
}

/// The `api` and the `dispatch` function's engines.
struct Functions {
    api: Engine,
    dispatch: Engine,
}

/// What every cell shares.
struct Shared {
    /// The Management API the functions would push through (no session has a subscriber).
    frames: ManagementFrames,
    no_ahp: bool,
    config: Config,
    agents: BTreeMap<String, AgentRuntime>,
    /// The functions' DynamoDB client, metered.
    dynamodb: aws_sdk_dynamodb::Client,
    /// Clients without the meter: tables, the event source, the observer.
    plain: AwsClients,
    /// The functions' queue, metered.
    queue: Arc<dyn Queue>,
    /// The event source's view of the queue (not metered: its requests are modelled).
    source: SqsQueue,
    meter: Arc<Meter>,
}

impl Shared {
    /// A cell of the matrix on a fresh table.
    async fn cell(&self) -> anyhow::Result<Bench> {
        let table = moto::unique("aws-cost");
        DynamoStore::new(self.plain.dynamodb.clone(), table.clone()).create_table().await?;
        let dynamodb = self.dynamodb.clone();
        let observer_store: Arc<dyn Store> =
            Arc::new(DynamoStore::new(self.plain.dynamodb.clone(), table.clone()));
        let observer = assemble::engine(
            &self.config,
            self.agents.clone(),
            observer_store,
            Arc::clone(&self.queue),
            Topology::Split,
        )?;
        Ok(Bench {
            frames: self.frames.clone(),
            no_ahp: self.no_ahp,
            config: self.config.clone(),
            agents: self.agents.clone(),
            table,
            dynamodb,
            queue: Arc::clone(&self.queue),
            source: self.source.clone(),
            observer,
            meter: Arc::clone(&self.meter),
        })
    }

    /// Drops a cell's table (moto keeps everything in memory) and what the meter knows of it.
    async fn drop_cell(&self, bench: Bench) -> anyhow::Result<()> {
        self.plain.dynamodb.delete_table().table_name(&bench.table).send().await?;
        self.meter.forget();
        Ok(())
    }
}

/// One cell of the matrix: a table, and the functions' store and queue on it.
struct Bench {
    frames: ManagementFrames,
    no_ahp: bool,
    config: Config,
    agents: BTreeMap<String, AgentRuntime>,
    table: String,
    /// The metered client: each engine gets a store of its own on it, as each container has.
    dynamodb: aws_sdk_dynamodb::Client,
    queue: Arc<dyn Queue>,
    /// The event source's view of the queue (not metered: its requests are modelled).
    source: SqsQueue,
    /// An engine on an unmetered store, to see how a turn ends.
    observer: Engine,
    meter: Arc<Meter>,
}

/// One measured turn.
struct Measured {
    tally: Tally,
    invocations: Invocations,
    trace: Vec<String>,
    /// Messages in the session before and after the turn.
    before: usize,
    after: usize,
}

impl Bench {
    /// An engine on a store of its own, which has seen nothing (a new container).
    fn cold_engine(&self) -> anyhow::Result<Engine> {
        let inner = DynamoStore::new(self.dynamodb.clone(), self.table.clone());
        self.engine_on(Arc::new(CountingStore { inner, meter: Arc::clone(&self.meter) }))
    }

    fn engine_on(&self, store: Arc<dyn Store>) -> anyhow::Result<Engine> {
        // As `Deployment::open` with an AHP endpoint: commits read the session's subscribers
        // (on the metered client); nothing is posted, since no session has one.
        let pushes = (!self.no_ahp).then(|| {
            let registry = DynamoRegistry::new(self.dynamodb.clone(), self.table.clone());
            Pushes::new(Arc::new(registry), Arc::new(self.frames.clone()))
        });
        let wrap = pushes.clone();
        let engine = assemble::engine_at(
            &self.config,
            self.agents.clone(),
            store,
            Arc::clone(&self.queue),
            Topology::Split,
            move |notifier| match wrap {
                Some(pushes) => Arc::new(Pusher::new(notifier, pushes)),
                None => notifier,
            },
            Arc::new(turnstone_runtime::clock::SystemClock),
        )?;
        if let Some(pushes) = pushes {
            pushes.attach(&engine.app);
        }
        Ok(engine)
    }

    /// The two functions, each a container of its own: a store each, warm from then on.
    fn functions(&self) -> anyhow::Result<Functions> {
        Ok(Functions { api: self.cold_engine()?, dispatch: self.cold_engine()? })
    }

    /// Messages the session holds (read without the meter).
    async fn messages(&self, session_id: &str) -> anyhow::Result<usize> {
        Ok(self.observer.app.load(session_id).await?.0.tree().len())
    }

    /// One client input and every invocation it takes, as on Lambda; with `cold`, each
    /// invocation gets fresh engines. Returns the messages the session holds afterwards.
    async fn run_turn(
        &self,
        functions: &mut Functions,
        cold: bool,
        session_id: &str,
        input: ClientInput,
        invocations: &mut Invocations,
    ) -> anyhow::Result<usize> {
        if cold {
            functions.api = self.cold_engine()?;
        }
        let started = Instant::now();
        let submitted =
            functions.api.app.submit(session_id, input, Placement::Start, &Caller::Anyone).await?;
        functions.api.app.notifier().flush().await;
        invocations.api.push(started.elapsed());
        let turn_id = submitted.turn_id.context("the input started no turn")?;
        let deadline = Instant::now() + TURN_DEADLINE;
        let mut ended: Option<usize> = None;
        loop {
            // Once the turn has ended, only what is queued already is left to run.
            let wait = if ended.is_some() { Duration::ZERO } else { POLL };
            let batch = self.source.receive(BATCH, wait).await?;
            if batch.is_empty() {
                if let Some(messages) = ended {
                    return Ok(messages);
                }
            } else {
                if cold {
                    functions.dispatch = self.cold_engine()?;
                }
                // As the `dispatch` function: each session of the batch once, in order.
                let mut sessions: BTreeMap<&str, &WakeUp> = BTreeMap::new();
                for delivery in &batch {
                    sessions.entry(delivery.wake_up.session_id.as_str()).or_insert(&delivery.wake_up);
                }
                let started = Instant::now();
                for wake_up in sessions.values() {
                    functions
                        .dispatch
                        .dispatcher
                        .run(wake_up)
                        .await
                        .with_context(|| format!("dispatch of {}", wake_up.session_id))?;
                }
                functions.dispatch.app.notifier().flush().await;
                invocations.dispatch.push(started.elapsed());
                for delivery in &batch {
                    self.source.ack(delivery).await?;
                }
            }
            if ended.is_none() {
                let (session, _) = self.observer.app.load(session_id).await?;
                if let Some(turn) = session.turn(&turn_id).filter(|t| t.status.is_ended()) {
                    if turn.status != TurnStatus::Completed {
                        bail!("turn {turn_id} of {session_id} ended {:?}: {:?}", turn.status, turn.error);
                    }
                    ended = Some(session.tree().len());
                }
            }
            if Instant::now() > deadline {
                bail!("turn {turn_id} of {session_id} did not end within {TURN_DEADLINE:?}");
            }
        }
    }

    /// Runs plain turns on a session until it holds `target` messages (not metered).
    async fn prefill(
        &self,
        functions: &mut Functions,
        session_id: &str,
        agent: &str,
        target: usize,
    ) -> anyhow::Result<usize> {
        let mut messages = 0;
        let mut n = 0;
        while messages < target {
            // The conversation so far, by id, then new messages (user, assistant, ..., user)
            // that the model answers: `new + 1` messages.
            let (session, _) = self.observer.app.load(session_id).await?;
            let mut view: Vec<DraftMessage> =
                session.tree().active_path().iter().map(|m| m.to_draft()).collect();
            let new = target.saturating_sub(messages + 1).clamp(1, PREFILL_CHUNK);
            let new = if new.is_multiple_of(2) { new - 1 } else { new };
            for i in 0..new {
                n += 1;
                // Named by the client: an engine minting several message ids in one command
                // repeats them in the next command of the same app (see the report), which
                // would put two nodes with one id into the tree.
                let id = format!("msg_prefill_{n:05}");
                view.push(
                    if i % 2 == 0 {
                        DraftMessage::user(format!(
                            "Question {n}: my order ord_{n:05} says shipped, but the tracking number does \
                         not work yet. When will it arrive, and which carrier has it?"
                        ))
                    } else {
                        DraftMessage::text(
                            Role::Assistant,
                            format!(
                                "Answer {n}: ord_{n:05} left the east warehouse on Monday with UPS; tracking \
                             usually starts within 48 hours. I will keep an eye on it."
                            ),
                        )
                    }
                    .with_id(id),
                );
            }
            let input = ClientInput::Messages(ClientMessagesInput {
                agent_id: agent.to_owned(),
                turn_id: None,
                messages: view,
                stream: None,
                client: None,
            });
            messages =
                self.run_turn(functions, false, session_id, input, &mut Invocations::default()).await?;
        }
        Ok(messages)
    }

    /// Runs `input` as the measured turn, `turns` times one after another.
    async fn measure(
        &self,
        functions: &mut Functions,
        cold: bool,
        session_id: &str,
        input: ClientInput,
        turns: usize,
    ) -> anyhow::Result<Measured> {
        let before = self.messages(session_id).await?;
        let mut invocations = Invocations::default();
        self.meter.start();
        let mut result = Ok(before);
        for _ in 0..turns {
            result = self.run_turn(functions, cold, session_id, input.clone(), &mut invocations).await;
            if result.is_err() {
                break;
            }
        }
        let (tally, trace) = self.meter.stop();
        let after = result?;
        Ok(Measured { tally, invocations, trace, before, after })
    }
}

/// A `client.message` input.
fn message(agent: &str, text: String) -> ClientInput {
    ClientInput::Message(ClientMessageInput {
        agent_id: agent.to_owned(),
        turn_id: None,
        message: DraftMessage::user(text),
        stream: None,
    })
}

/// The measured turn's input of a scenario.
fn measured_input(scenario: Scenario, agent: &str) -> ClientInput {
    match scenario {
        Scenario::Hosted => message(
            agent,
            "Hi! I ordered running shoes last week (ord_8f2k1) and the tracking page has not \
             changed in three days. Can you check what is going on?"
                .to_owned(),
        ),
        Scenario::Worker => message(
            agent,
            format!(
                "{LOOP_MARK} Please go through my account: every order, shipment, ticket and \
                 subscription, and tell me if anything needs my attention."
            ),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

/// One row of a table: a measured turn of one cell.
struct Row {
    scenario: Scenario,
    /// The conversation length asked for (the measured turn's `before` may be longer: a cold
    /// turn runs after the warm one).
    target: usize,
    tools: usize,
    cache: Cache,
    measured: Measured,
}

/// How far write units per step spread within groups of rows, worst group first: `(max/min,
/// min, max, what the group has in common)`.
fn spread(rows: &[(&Row, f64)], group: impl Fn(&Row) -> String) -> Option<(f64, f64, f64, String)> {
    let mut groups: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (row, units) in rows {
        let (low, high) = groups.entry(group(row)).or_insert((f64::MAX, 0.0));
        *low = low.min(*units);
        *high = high.max(*units);
    }
    groups
        .into_iter()
        .map(|(name, (low, high))| (if low > 0.0 { high / low } else { f64::INFINITY }, low, high, name))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// What a row costs per step.
struct PerStep {
    steps: f64,
    write_requests: f64,
    read_requests: f64,
    write_units: f64,
    index_units: f64,
    read_units: f64,
    sqs: f64,
    invocations: f64,
    ms_per_invocation: f64,
    bytes: f64,
    dollars_dynamodb: f64,
    dollars_sqs: f64,
    dollars_lambda: f64,
}

impl PerStep {
    fn of(row: &Row, lambda_mb: u64) -> PerStep {
        let m = &row.measured;
        let t = &m.tally;
        let steps = t.commits.max(1) as f64;
        let per = |n: f64| n / steps;
        let write_units = per(t.total_write_units() as f64);
        let read_units = per(t.read_units());
        let sqs = per((t.sqs.values().sum::<u64>() + m.invocations.event_source_requests()) as f64);
        let invocations = per(m.invocations.count() as f64);
        let gb_seconds = per(m.invocations.billed_ms() as f64 / 1000.0 * lambda_mb as f64 / 1024.0);
        PerStep {
            steps: t.commits as f64,
            write_requests: per(t.write_requests() as f64),
            read_requests: per(t.read_requests() as f64),
            write_units,
            index_units: per(t.write_units.get(&Kind::Index).copied().unwrap_or(0) as f64),
            read_units,
            sqs,
            invocations,
            ms_per_invocation: m.invocations.billed_ms() as f64 / m.invocations.count().max(1) as f64,
            bytes: per(t.total_written_bytes() as f64),
            dollars_dynamodb: 1e6 * (write_units * DYNAMODB_WRITE_UNIT + read_units * DYNAMODB_READ_UNIT),
            dollars_sqs: 1e6 * sqs * SQS_REQUEST,
            dollars_lambda: 1e6 * (invocations * LAMBDA_REQUEST + gb_seconds * LAMBDA_GB_SECOND),
        }
    }

    fn dollars(&self) -> f64 {
        self.dollars_dynamodb + self.dollars_sqs + self.dollars_lambda
    }
}

/// The DynamoDB operations reported as columns, with their short names.
const OPS: [(&str, &str); 5] = [
    ("GetItem", "Get"),
    ("Query", "Query"),
    ("BatchGetItem", "BGet"),
    ("TransactWriteItems", "TWI"),
    ("PutItem", "Put"),
];

fn scenario_title(scenario: Scenario, loop_steps: usize) -> String {
    match scenario {
        Scenario::Hosted => {
            "(a) engine-hosted turn: agent without a worker, scripted model, a plain user message \
                             answered `You said: ...`"
                .to_owned()
        }
        Scenario::Worker => format!(
            "(b) worker tool loop: agent with a worker webhook (FakeWorker over HTTP); the turn runs \
             {loop_steps} tool calls one after another, each a model call, its decision, the tool's \
             tool.execute and its tool.finished decision"
        ),
    }
}

fn row_label(row: &Row) -> String {
    format!("{:>5} {:>5} {:>5}", row.measured.before, row.tools, row.cache.name())
}

fn row_name(row: &Row) -> String {
    format!("{} msgs, {} tools, {}", row.measured.before, row.tools, row.cache.name())
}

fn print_report(rows: &[Row], args: &Args) {
    let mut out = String::new();
    let scenarios: Vec<Scenario> = {
        let mut s: Vec<Scenario> = rows.iter().map(|r| r.scenario).collect();
        s.dedup();
        s
    };
    for &scenario in &scenarios {
        let rows: Vec<&Row> = rows.iter().filter(|r| r.scenario == scenario).collect();
        let _ = writeln!(out, "\n{}", scenario_title(scenario, args.loop_steps));
        let _ = writeln!(
            out,
            "{:>5} {:>5} {:>5} {:>5} | {:>5} {:>5} {:>5} {:>5} {:>5} | {:>6} {:>5} {:>6} | {:>5} | {:>5} {:>6} | {:>7} | {:>6} {:>6} {:>6} {:>7}",
            "msgs",
            "tools",
            "cache",
            "steps",
            "Get",
            "Query",
            "BGet",
            "TWI",
            "Put",
            "WU",
            "(idx)",
            "RU",
            "SQS",
            "λ inv",
            "λ ms",
            "bytes",
            "$ DDB",
            "$ SQS",
            "$ λ",
            "$ total"
        );
        let _ = writeln!(
            out,
            "{:>23} | {:^29} | {:^20} | {:>5} | {:^12} | {:>7} | {:^30}",
            "",
            "DynamoDB requests per step",
            "units per step",
            "/step",
            "Lambda",
            "B/step",
            "$ per million steps"
        );
        for row in &rows {
            let p = PerStep::of(row, args.lambda_mb);
            let t = &row.measured.tally;
            let per_op = |op: &str| t.dynamodb.get(op).copied().unwrap_or(0) as f64 / p.steps.max(1.0);
            let _ = writeln!(
                out,
                "{} {:>5} | {:>5.2} {:>5.2} {:>5.2} {:>5.2} {:>5.2} | {:>6.1} {:>5.1} {:>6.1} | {:>5.2} | {:>5.2} {:>6.0} | {:>7.0} | {:>6.2} {:>6.2} {:>6.2} {:>7.2}",
                row_label(row),
                p.steps,
                per_op(OPS[0].0),
                per_op(OPS[1].0),
                per_op(OPS[2].0),
                per_op(OPS[3].0),
                per_op(OPS[4].0),
                p.write_units,
                p.index_units,
                p.read_units,
                p.sqs,
                p.invocations,
                p.ms_per_invocation,
                p.bytes,
                p.dollars_dynamodb,
                p.dollars_sqs,
                p.dollars_lambda,
                p.dollars(),
            );
            let others: Vec<String> = t
                .dynamodb
                .iter()
                .filter(|(op, _)| !OPS.iter().any(|(o, _)| o == op))
                .chain(t.failed.iter())
                .chain(t.unpriced.iter())
                .map(|(op, n)| format!("{op} {n}"))
                .collect();
            if !others.is_empty() {
                let _ = writeln!(out, "{:>23}   also: {}", "", others.join(", "));
            }
        }

        let _ = writeln!(
            out,
            "\nWhere the write units go (per step: units, and bytes written in brackets), and the largest item of each kind"
        );
        let mut header = format!("{:>5} {:>5} {:>5} |", "msgs", "tools", "cache");
        for kind in Kind::ALL {
            let _ = write!(header, " {:>15}", kind.label());
        }
        let _ = writeln!(out, "{header} | head share | largest head, pack, message");
        for row in &rows {
            let t = &row.measured.tally;
            let steps = t.commits.max(1) as f64;
            let mut line = format!("{} |", row_label(row));
            for kind in Kind::ALL {
                let units = t.write_units.get(&kind).copied().unwrap_or(0) as f64 / steps;
                let bytes = t.written_bytes.get(&kind).copied().unwrap_or(0) as f64 / steps;
                let _ = write!(line, " {:>15}", format!("{units:.1} ({bytes:.0})"));
            }
            let largest = |k: Kind| t.largest.get(&k).copied().unwrap_or(0);
            let head = t.write_units.get(&Kind::Head).copied().unwrap_or(0) as f64;
            let _ = writeln!(
                line,
                " | {:>9.0}% | {} B, {} B, {} B",
                100.0 * head / t.total_write_units().max(1) as f64,
                largest(Kind::Head),
                largest(Kind::Events),
                largest(Kind::Messages)
            );
            out.push_str(&line);
        }
        let _ = writeln!(out, "\nWhat the measured turns take");
        for row in &rows {
            let m = &row.measured;
            let t = &m.tally;
            let items: Vec<String> = Kind::ALL
                .iter()
                .filter_map(|k| t.items_written.get(k).map(|n| format!("{n} {}", k.label())))
                .collect();
            let sqs: Vec<String> = t.sqs.iter().map(|(op, n)| format!("{op} {n}")).collect();
            let _ = writeln!(
                out,
                "{}: {} steps, {} -> {} messages; {} api ({} ms) + {} dispatch ({} ms) invocations; \
                 SQS sent: {}; items written: {}; {:.1} RU reading {} B",
                row_name(row),
                t.commits,
                m.before,
                m.after,
                m.invocations.api.len(),
                m.invocations.api.iter().map(Duration::as_millis).sum::<u128>(),
                m.invocations.dispatch.len(),
                m.invocations.dispatch.iter().map(Duration::as_millis).sum::<u128>(),
                if sqs.is_empty() { "none".to_owned() } else { sqs.join(", ") },
                items.join(", "),
                t.read_units(),
                t.read_bytes,
            );
        }
    }

    // The targets.
    let _ = writeln!(out, "\nTargets");
    let per_step: Vec<(&Row, PerStep)> = rows.iter().map(|r| (r, PerStep::of(r, args.lambda_mb))).collect();
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    let worst_writes = per_step.iter().map(|(_, p)| p.write_requests).fold(0.0, f64::max);
    let worst_reads = per_step.iter().map(|(_, p)| p.read_requests).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "- one write request and at most two reads per step: {} (worst row: {worst_writes:.2} write and {worst_reads:.2} read requests per step)",
        verdict(worst_writes <= 1.0 && worst_reads <= 2.0)
    );
    for &scenario in &scenarios {
        let units: Vec<(&Row, f64)> = per_step
            .iter()
            .filter(|(r, _)| r.scenario == scenario)
            .map(|(r, p)| (*r, p.write_units))
            .collect();
        let by_length = spread(&units, |r| format!("{} tools, {}", r.tools, r.cache.name()));
        let by_size = spread(&units, |r| format!("{} msgs, {}", r.target, r.cache.name()));
        let describe = |found: &Option<(f64, f64, f64, String)>| match found {
            Some((ratio, low, high, at)) => format!("{ratio:.2}x ({low:.1} .. {high:.1} at {at})"),
            None => "-".to_owned(),
        };
        let flat =
            |found: &Option<(f64, f64, f64, String)>| found.as_ref().is_none_or(|f| f.0 <= TARGET_FLAT);
        let _ = writeln!(
            out,
            "- write units per step flat in conversation length and agent size (within {TARGET_FLAT}x), {}: {} \
             (in length: {}; in agent size: {})",
            match scenario {
                Scenario::Hosted => "engine-hosted",
                Scenario::Worker => "worker loop",
            },
            verdict(flat(&by_length) && flat(&by_size)),
            describe(&by_length),
            describe(&by_size),
        );
    }
    // Warm containers are the steady state; a container per invocation is reported apart: it
    // reads the whole conversation every time, whatever the store writes.
    for cache in [Cache::Warm, Cache::Cold] {
        let hosted: Vec<f64> = per_step
            .iter()
            .filter(|(r, _)| r.scenario == Scenario::Hosted && r.cache == cache)
            .map(|(_, p)| p.dollars())
            .collect();
        if hosted.is_empty() {
            continue;
        }
        let worst = hosted.iter().copied().fold(0.0, f64::max);
        let best = hosted.iter().copied().fold(f64::MAX, f64::min);
        let _ = writeln!(
            out,
            "- under ${TARGET_HOSTED_PER_MILLION} per million engine-hosted steps, {}: {} (${best:.2} .. ${worst:.2} per million)",
            match cache {
                Cache::Warm => "warm containers",
                Cache::Cold => "a new container for every invocation",
            },
            verdict(worst < TARGET_HOSTED_PER_MILLION)
        );
    }
    let _ = write!(out, "{}", explain(args));
    for line in out.lines() {
        println!("{}", line.trim_end());
    }
    if args.trace {
        for row in rows {
            println!("\nRequests of {:?}, {}", row.scenario, row_name(row));
            for line in &row.measured.trace {
                println!("  {line}");
            }
        }
    }
}

fn explain(args: &Args) -> String {
    format!(
        "
What the figures are
  step      one successful Store::commit of the measured session (a DynamoDB write of the store);
            the columns are totals of the measured turn divided by its steps.
  msgs      messages in the session before the measured turn (pre-filled by running real turns).
  cache     warm: the api and dispatch engines that ran the pre-fill, a store each (a container
            that has seen the session reads only the packs written since); cold: fresh engines
            and stores for every invocation (a new container reads the session's checkpoint,
            messages and the packs after it).
  Get/Query/BGet/TWI/Put
            DynamoDB requests per step by operation, counted by an SDK interceptor as sent.
  WU        write request units per step, from the request bodies: per item 1 per started KB
            of the larger of old and new item, twice inside TransactWriteItems; (idx) the part
            spent on global secondary indexes (an entry added or removed: 1, its keys changed: 2;
            assumed billed at the standard rate, outside the transaction).
  RU        read request units per step from the answers: GetItem and each BatchGetItem item 1
            per started 4 KB (1 for none), a Query page its items' total per 4 KB (at least 1);
            charged on whole items (a projection does not make a read cheaper); eventual: half.
  SQS       SQS requests per step: what the engine sends (SendMessage), plus the event source's
            ReceiveMessage and DeleteMessageBatch per dispatch invocation (modelled). Not per
            step: an event source polls an idle queue too (about 5 pollers x 3 long polls a
            minute: ~0.65 M requests, ~$0.26, a month per queue).
  λ inv     Lambda invocations per step: one `api` per client input, one `dispatch` per batch.
  λ ms      mean wall time per invocation, measured here against moto on loopback, billed per
            started ms at {} MB. moto is no DynamoDB: it deep-copies the whole table for every
            item of a TransactWriteItems, so its times grow with the table; take these as an
            upper bound of the duration part.
  bytes     item bytes written per step (DynamoDB's item size: names plus values).
  $         per million steps, at the prices at the top of examples/aws_cost.rs (check them):
            DynamoDB ${:.3}/M write units, ${:.3}/M read units; SQS ${:.2}/M requests; Lambda
            ${:.2}/M invocations + ${:.7}/GB-s. Client reads (turn long-polls, event streams),
            storage and the sweep are not included.
",
        args.lambda_mb,
        DYNAMODB_WRITE_UNIT * 1e6,
        DYNAMODB_READ_UNIT * 1e6,
        SQS_REQUEST * 1e6,
        LAMBDA_REQUEST * 1e6,
        LAMBDA_GB_SECOND,
    )
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.tools.iter().any(|&t| t == 0 || t > 20) {
        bail!("--tools takes sizes from 1 to 20");
    }
    // Starts `.venv/bin/moto_server` unless TURNSTONE_MOTO_ENDPOINT names a server (and panics,
    // saying how to install moto, when neither is there).
    let endpoint = tokio::task::spawn_blocking(moto::endpoint).await?;
    eprintln!("moto at {endpoint}");
    let queue_name = moto::unique("aws-cost");
    let plain = moto::clients().await;
    let settings = QueueSettings { visibility_timeout: Duration::from_secs(60), ..QueueSettings::default() };
    let queue_url = SqsQueue::create_queue(&plain.sqs, &queue_name, &settings).await?;

    // The table's indexes, as DynamoDB describes them, for the index write units.
    let probe = moto::unique("aws-cost");
    DynamoStore::new(plain.dynamodb.clone(), probe.clone()).create_table().await?;
    let described = plain.dynamodb.describe_table().table_name(&probe).send().await?;
    plain.dynamodb.delete_table().table_name(&probe).send().await?;
    let indexes = described
        .table()
        .map(|t| t.global_secondary_indexes())
        .unwrap_or_default()
        .iter()
        .map(|index| {
            let key = |kind: &str| {
                index
                    .key_schema()
                    .iter()
                    .find(|k| k.key_type().as_str() == kind)
                    .map(|k| k.attribute_name().to_owned())
            };
            let projection = index.projection();
            let projected = match projection.and_then(|p| p.projection_type()) {
                Some(ProjectionType::All) => None,
                _ => Some(projection.map(|p| p.non_key_attributes().to_vec()).unwrap_or_default()),
            };
            meter::Index {
                name: index.index_name().unwrap_or_default().to_owned(),
                hash: key("HASH").unwrap_or_default(),
                range: key("RANGE"),
                projected,
            }
        })
        .collect::<Vec<_>>();
    let meter = Meter::new(indexes.clone(), args.trace);

    // The functions' clients carry the meter.
    let sdk = moto::config(&probe, &queue_name)
        .loader()
        .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
        .load()
        .await;
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(meter.hook()).build(),
    );
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&sdk).interceptor(meter.hook()).build(),
    );
    let queue: Arc<dyn Queue> = Arc::new(SqsQueue::new(sqs, queue_url.clone()));

    let catalog = Arc::new(catalog());
    let worker =
        FakeWorker::start(None, worker_script(Arc::clone(&catalog), args.loop_steps, args.state_kb)).await;
    let mut sizes = args.tools.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let config = Config::parse(&config_toml(&worker.url(), &sizes, &catalog), "aws_cost.toml")?;
    let secrets = config.resolve_secrets(|_| None)?;
    let agents = assemble::agents(&config, &secrets)?;
    let shared = Shared {
        frames: ManagementFrames::new(&sdk, "http://127.0.0.1:9/unused"),
        no_ahp: args.no_ahp,
        config,
        agents,
        dynamodb,
        source: SqsQueue::new(plain.sqs.clone(), queue_url),
        plain,
        queue,
        meter,
    };

    println!(
        "Turnstone on AWS, as the Lambda deployment runs it (Topology::Split), against moto {endpoint}: \
         a fresh table per cell ({} indexes: {}), one SQS standard queue",
        indexes.len(),
        indexes.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
    );
    let mut rows = Vec::new();
    let started = Instant::now();
    let mut scenarios = args.scenarios.clone();
    scenarios.sort_unstable();
    scenarios.dedup();
    for &scenario in &scenarios {
        for &tools in &sizes {
            for &target in &args.messages {
                let agent = agent_id(scenario, tools);
                let session_id = format!("{agent}-{target}m-{}", std::process::id());
                let bench = shared.cell().await?;
                let mut functions = bench.functions()?;
                let cell = Instant::now();
                let before = bench.prefill(&mut functions, &session_id, &agent, target).await?;
                eprintln!(
                    "  {session_id}: pre-filled {before} messages in {:.1} s",
                    cell.elapsed().as_secs_f64()
                );
                for &cache in &args.cache {
                    let input = measured_input(scenario, &agent);
                    let turns = if scenario == Scenario::Hosted { args.hosted_turns.max(1) } else { 1 };
                    let cold = cache == Cache::Cold;
                    let measured = bench.measure(&mut functions, cold, &session_id, input, turns).await?;
                    eprintln!(
                        "  {session_id} {}: {} steps, {} -> {} messages",
                        cache.name(),
                        measured.tally.commits,
                        measured.before,
                        measured.after
                    );
                    rows.push(Row { scenario, target, tools, cache, measured });
                }
                if args.keep_tables {
                    eprintln!("  kept table {} for {session_id}", bench.table);
                } else {
                    shared.drop_cell(bench).await?;
                }
            }
        }
    }
    eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
    print_report(&rows, &args);
    drop(worker);
    Ok(())
}

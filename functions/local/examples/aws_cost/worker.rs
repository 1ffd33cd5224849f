//! The worker of the cost examples (`aws_cost`, `long_session`): a catalog of tools an agent may
//! declare, and a worker webhook script that runs a tool loop on them, optionally keeping KBs of
//! changing state in the session with every answer. Shared by two examples; each uses part.
#![allow(dead_code)]

use std::sync::Arc;

use serde_json::{Value, json};
use turnstone_engine::ids::CallId;
use turnstone_engine::protocol::{
    Action, DecisionRequest, DecisionResponse, Message, Role, ToolCall, ToolCallAction, Trigger,
};
use turnstone_tests::{FakeAnswer, tool_answer};

/// The last user message of a worker turn that should run the tool loop carries this.
pub const LOOP_MARK: &str = "[audit]";

/// A tool the agents may declare: its name, description, input schema and the arguments the
/// worker's loop calls it with (valid for the schema).
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub input: Value,
    pub example: Value,
}

pub fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

pub fn choice(description: &str, values: &[&str]) -> Value {
    json!({"type": "string", "description": description, "enum": values})
}

pub fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

/// Twenty tools of a customer-support agent, with JSON Schemas of a few properties each.
pub fn catalog() -> Vec<ToolSpec> {
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
pub fn toml_value(value: &Value) -> String {
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

/// The text of a message.
pub fn text_of(message: &Message) -> String {
    message.content_text()
}

/// Tool results on the conversation since its last user message, and whether that message
/// asks for the tool loop.
pub fn loop_progress(messages: &[Message]) -> (usize, bool) {
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
pub fn tool_result(name: &str, arguments: &Value) -> Value {
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
pub fn worker_script(
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
pub fn worker_answer(
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
            // The loop runs the catalog's tools only (an agent may declare others, such as a
            // client tool a person answers).
            let tools: Vec<&str> =
                tools.into_iter().filter(|name| catalog.iter().any(|s| s.name == *name)).collect();
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

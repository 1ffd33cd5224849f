//! Renders a turn's events as plain terminal text.
//!
//! Model text is written as it streams (`llm.token.delta`), or from the recorded assistant
//! message when nothing streamed; tool calls, their results, sub-agents, interrupts and the
//! turn's failure get one indented line each. Events are read leniently from JSON, so fields
//! the renderer does not know about are ignored. Whatever needs an answer from the user (an
//! interrupt, a client tool call) or ends the watched turn comes back as a [`Step`].

use std::collections::HashMap;
use std::io::{self, Write};

use serde_json::Value;
use turnstone_engine::protocol::Content;

use super::client::str_field;

/// The longest tool result shown, in characters.
const RESULT_WIDTH: usize = 200;

/// What the caller must do after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing: read on.
    Continue,
    /// An interrupt opened: ask the user for a resume payload.
    Interrupt { id: String },
    /// A client tool call waits: ask the user for its result.
    ClientCall { id: String, name: String, arguments: String },
    /// A tool call waits for approval: ask the user to approve or deny it.
    Approval { id: String, name: String, arguments: String },
    /// The watched turn ended.
    Ended {
        /// Whether it completed (rather than failed or was cancelled).
        ok: bool,
    },
}

/// Writes a session's events as text to `out`.
#[derive(Debug)]
pub struct Renderer<W> {
    out: W,
    /// The turn whose `turn.ended` ends the watch; `None`: any turn's.
    turn_id: Option<String>,
    /// Model text streamed since the last recorded assistant message.
    streamed: bool,
    /// Whether the cursor is at the start of a line.
    at_line_start: bool,
    /// Tool names by call id, for tool results without a name.
    tool_names: HashMap<String, String>,
    /// Client tool calls waiting for approval: once approved, the user answers them.
    awaiting: HashMap<String, Step>,
}

impl<W: Write> Renderer<W> {
    /// A renderer writing to `out`.
    pub fn new(out: W) -> Self {
        Renderer {
            out,
            turn_id: None,
            streamed: false,
            at_line_start: true,
            tool_names: HashMap::new(),
            awaiting: HashMap::new(),
        }
    }

    /// Watches `turn_id`: its `turn.ended` ends the watch.
    pub fn begin_turn(&mut self, turn_id: &str) {
        self.turn_id = Some(turn_id.to_owned());
        self.streamed = false;
    }

    /// The writer.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Renders one event named `name` (dotted, e.g. `message.recorded`) with its JSON `data`.
    pub fn on_event(&mut self, name: &str, data: &Value) -> io::Result<Step> {
        let step = match name {
            "llm.token.delta" => {
                self.delta(data)?;
                Step::Continue
            }
            "message.recorded" => {
                self.message(data.get("message").unwrap_or(&Value::Null))?;
                Step::Continue
            }
            "call.created" => self.call(data.get("call").unwrap_or(&Value::Null))?,
            "call.approved" => {
                let id = str_field(data, "call_id").unwrap_or_default();
                self.awaiting.remove(id).unwrap_or(Step::Continue)
            }
            "outbox.queued" => {
                let item = data.get("item").unwrap_or(&Value::Null);
                if str_field(item, "type") == Some("spawn_child") {
                    let agent = str_field(item, "agent_id").unwrap_or("?");
                    let session = str_field(item, "session_id").unwrap_or("?");
                    self.line(&format!("  ⇢ sub-agent {agent} (session {session})"))?;
                }
                Step::Continue
            }
            "interrupt.opened" => self.interrupt(data.get("interrupt").unwrap_or(&Value::Null))?,
            "turn.ended" => self.turn_ended(data)?,
            _ => Step::Continue,
        };
        self.out.flush()?;
        Ok(step)
    }

    fn delta(&mut self, data: &Value) -> io::Result<()> {
        let text = data.get("delta").and_then(|d| str_field(d, "text")).unwrap_or("");
        if text.is_empty() {
            return Ok(());
        }
        if !self.streamed {
            self.finish_line()?;
            self.streamed = true;
        }
        self.out.write_all(text.as_bytes())?;
        self.at_line_start = text.ends_with('\n');
        Ok(())
    }

    fn message(&mut self, message: &Value) -> io::Result<()> {
        match str_field(message, "role") {
            Some("assistant") => {
                for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    let name = call.get("function").and_then(|f| str_field(f, "name"));
                    if let (Some(id), Some(name)) = (str_field(call, "id"), name) {
                        self.tool_names.insert(id.to_owned(), name.to_owned());
                    }
                }
                if std::mem::take(&mut self.streamed) {
                    return self.finish_line();
                }
                let text = content_text(message);
                if !text.is_empty() {
                    self.line(text.strip_suffix('\n').unwrap_or(&text))?;
                }
                Ok(())
            }
            Some("tool") => {
                let by_call = str_field(message, "tool_call_id").and_then(|id| self.tool_names.get(id));
                let name = str_field(message, "name").or(by_call.map(String::as_str)).unwrap_or("tool");
                let line = format!("  ← {name}: {}", one_line(&content_text(message), RESULT_WIDTH));
                self.line(&line)
            }
            _ => Ok(()),
        }
    }

    fn call(&mut self, call: &Value) -> io::Result<Step> {
        let spec = call.get("spec").unwrap_or(&Value::Null);
        if str_field(spec, "kind") != Some("tool_call") {
            return Ok(Step::Continue);
        }
        let id = str_field(call, "id").unwrap_or_default().to_owned();
        let name = str_field(spec, "name").unwrap_or("?").to_owned();
        let arguments = str_field(spec, "arguments").unwrap_or_default().to_owned();
        self.tool_names.insert(id.clone(), name.clone());
        self.line(&format!("  → tool {name}({arguments})"))?;
        let run = match str_field(spec, "handler") {
            Some("client") => {
                Step::ClientCall { id: id.clone(), name: name.clone(), arguments: arguments.clone() }
            }
            _ => Step::Continue,
        };
        if call.get("awaiting_approval").and_then(Value::as_bool) == Some(true) {
            self.awaiting.insert(id.clone(), run);
            return Ok(Step::Approval { id, name, arguments });
        }
        Ok(run)
    }

    fn interrupt(&mut self, interrupt: &Value) -> io::Result<Step> {
        let id = str_field(interrupt, "id").unwrap_or_default().to_owned();
        let reason = str_field(interrupt, "reason").unwrap_or_default();
        self.line(&format!("  ⏸ interrupt {id}: {reason}"))?;
        if let Some(payload) = interrupt.get("payload").filter(|p| !p.is_null()) {
            self.line(&format!("    {payload}"))?;
        }
        Ok(Step::Interrupt { id })
    }

    fn turn_ended(&mut self, data: &Value) -> io::Result<Step> {
        let turn_id = str_field(data, "turn_id");
        if self.turn_id.is_some() && turn_id != self.turn_id.as_deref() {
            return Ok(Step::Continue);
        }
        self.streamed = false;
        self.finish_line()?;
        let status = str_field(data, "status").unwrap_or("unknown");
        if status == "completed" {
            return Ok(Step::Ended { ok: true });
        }
        let error = str_field(data, "error").map(str::to_owned);
        let line = match (status, error) {
            ("failed", Some(error)) => format!("  ✗ {error}"),
            (_, Some(error)) => format!("  ✗ {status}: {error}"),
            (_, None) => format!("  ✗ turn {status}"),
        };
        self.line(&line)?;
        Ok(Step::Ended { ok: false })
    }

    /// Writes `text` on a line of its own.
    pub fn line(&mut self, text: &str) -> io::Result<()> {
        self.finish_line()?;
        writeln!(self.out, "{text}")?;
        self.out.flush()
    }

    /// Ends the current line if something was written on it.
    pub fn finish_line(&mut self) -> io::Result<()> {
        if !self.at_line_start {
            writeln!(self.out)?;
            self.at_line_start = true;
        }
        Ok(())
    }

    /// Writes a prompt (on a line of its own) and leaves the cursor after it.
    pub fn prompt(&mut self, text: &str) -> io::Result<()> {
        self.finish_line()?;
        write!(self.out, "{text}")?;
        self.at_line_start = false;
        self.out.flush()
    }

    /// The user answered a prompt: a terminal echoed the line; otherwise (`echo`) write it.
    pub fn answered(&mut self, line: Option<&str>, echo: bool) -> io::Result<()> {
        match line {
            Some(line) if echo => writeln!(self.out, "{line}")?,
            None => writeln!(self.out)?,
            Some(_) => {}
        }
        self.at_line_start = true;
        self.out.flush()
    }
}

/// A message's text content (text parts joined), empty when it has none.
fn content_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(content @ Value::Array(_)) => {
            serde_json::from_value::<Content>(content.clone()).map(|c| c.text()).unwrap_or_default()
        }
        _ => String::new(),
    }
}

/// `text` on one line (line breaks become spaces), cut to `width` characters.
fn one_line(text: &str, width: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(width) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use turnstone_engine::protocol::{
        CallStatus, Message, RetryPolicy, Role, ToolCall, ToolHandler, WorkerIdentity,
    };
    use turnstone_engine::session::{CallRecord, CallSpec, Event, Interrupt, OutboxItem, TurnStatus};
    use turnstone_engine::time::Timestamp;

    fn tool_call(id: &str, name: &str, arguments: &str, handler: ToolHandler) -> Event {
        let spec = CallSpec::ToolCall { name: name.into(), arguments: arguments.into(), handler };
        Event::CallCreated {
            call: CallRecord {
                id: id.into(),
                spec,
                status: CallStatus::Queued,
                attempt: 0,
                deadline: None,
                retry_at: None,
                anchor: None,
                turn_id: Some("t1".into()),
                policy: RetryPolicy::NONE,
                outcome: None,
                awaiting_approval: false,
            },
        }
    }

    fn message(id: &str, role: Role, content: &str) -> Message {
        Message {
            id: id.into(),
            role,
            content: Some(content.into()),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            provider_blocks: None,
            compaction: None,
        }
    }

    fn recorded(message: Message) -> Event {
        Event::MessageRecorded { message, parent_id: None }
    }

    fn ended(turn_id: &str, status: TurnStatus, error: Option<&str>) -> Event {
        Event::TurnEnded {
            turn_id: turn_id.into(),
            status,
            data: None,
            error: error.map(str::to_owned),
            code: None,
            at: Timestamp(0),
        }
    }

    fn delta(text: &str) -> (String, Value) {
        ("llm.token.delta".to_owned(), json!({"call_id": "llm1", "delta": {"text": text}}))
    }

    fn event(e: Event) -> (String, Value) {
        (e.name().to_owned(), serde_json::to_value(&e).unwrap())
    }

    /// Feeds the events to a renderer watching `t1`; returns the text and the steps.
    fn render(events: Vec<(String, Value)>) -> (String, Vec<Step>) {
        let mut r = Renderer::new(Vec::new());
        r.begin_turn("t1");
        let steps = events.iter().map(|(name, data)| r.on_event(name, data).unwrap()).collect();
        (String::from_utf8(r.into_inner()).unwrap(), steps)
    }

    #[test]
    fn streamed_text_tool_calls_and_results() {
        let mut asking = message("m2", Role::Assistant, "");
        asking.content = None;
        asking.tool_calls = Some(vec![ToolCall::function("c1", "search", r#"{"q":"rust"}"#)]);
        let mut result = message("m3", Role::Tool, "found\n3 hits");
        result.tool_call_id = Some("c1".into());
        let (text, steps) = render(vec![
            event(recorded(message("m1", Role::User, "hi"))),
            delta("Let me "),
            delta("look."),
            event(recorded(asking)),
            event(tool_call("c1", "search", r#"{"q":"rust"}"#, ToolHandler::Worker)),
            event(recorded(result)),
            delta("Found "),
            delta("3."),
            event(recorded(message("m4", Role::Assistant, "Found 3."))),
            event(ended("t1", TurnStatus::Completed, None)),
        ]);
        assert_eq!(
            text,
            "Let me look.\n  → tool search({\"q\":\"rust\"})\n  ← search: found 3 hits\nFound 3.\n"
        );
        assert_eq!(steps.last(), Some(&Step::Ended { ok: true }));
        assert!(steps[..steps.len() - 1].iter().all(|s| *s == Step::Continue));
    }

    #[test]
    fn the_recorded_message_shows_when_nothing_streamed() {
        let (text, _) = render(vec![
            event(recorded(message("m1", Role::Assistant, "Hello there.\n"))),
            event(ended("t1", TurnStatus::Completed, None)),
        ]);
        assert_eq!(text, "Hello there.\n");
    }

    #[test]
    fn client_calls_interrupts_and_sub_agents_ask_or_show() {
        let interrupt = Interrupt {
            id: "i1".into(),
            reason: "approve the refund?".into(),
            payload: Some(json!({"amount": 5})),
            anchor: None,
            turn_id: Some("t1".into()),
        };
        let spawn = OutboxItem::SpawnChild {
            session_id: "s1-child".into(),
            agent_id: "researcher".into(),
            tool_call_id: "c2".into(),
            ancestry: vec!["s1".into()],
            identity: WorkerIdentity::default(),
        };
        let (text, steps) = render(vec![
            event(tool_call("c1", "ask_user", "{}", ToolHandler::Client)),
            event(Event::OutboxQueued { seq: 1, item: spawn }),
            event(Event::InterruptOpened { interrupt }),
        ]);
        assert_eq!(
            text,
            "  → tool ask_user({})\n  ⇢ sub-agent researcher (session s1-child)\n  ⏸ interrupt i1: approve the refund?\n    {\"amount\":5}\n"
        );
        assert_eq!(
            steps,
            vec![
                Step::ClientCall { id: "c1".into(), name: "ask_user".into(), arguments: "{}".into() },
                Step::Continue,
                Step::Interrupt { id: "i1".into() },
            ]
        );
    }

    #[test]
    fn a_call_awaiting_approval_asks_for_it_then_for_its_result() {
        let Event::CallCreated { mut call } = tool_call("c1", "deploy", "{}", ToolHandler::Client) else {
            panic!()
        };
        call.awaiting_approval = true;
        let (_, steps) = render(vec![
            event(Event::CallCreated { call }),
            event(Event::CallApproved { call_id: "c1".into() }),
            event(Event::CallApproved { call_id: "c1".into() }),
        ]);
        let (id, name, arguments) = ("c1".to_owned(), "deploy".to_owned(), "{}".to_owned());
        assert_eq!(
            steps,
            vec![
                Step::Approval { id: id.clone(), name: name.clone(), arguments: arguments.clone() },
                Step::ClientCall { id, name, arguments },
                Step::Continue,
            ]
        );
    }

    #[test]
    fn failures_end_the_watched_turn_only() {
        let (text, steps) = render(vec![
            delta("partial"),
            event(ended("t0", TurnStatus::Completed, None)),
            event(ended("t1", TurnStatus::Failed, Some("model refused"))),
        ]);
        assert_eq!(text, "partial\n  ✗ model refused\n");
        assert_eq!(steps, vec![Step::Continue, Step::Continue, Step::Ended { ok: false }]);
        let (text, _) = render(vec![event(ended("t1", TurnStatus::Cancelled, None))]);
        assert_eq!(text, "  ✗ turn cancelled\n");
    }

    #[test]
    fn unknown_fields_events_and_content_parts_are_taken_in_stride() {
        let (text, steps) = render(vec![
            ("brand.new".into(), json!({"whatever": 1})),
            ("call.created".into(), json!({"call": {"id": "c9", "spec": {"kind": "llm_call"}}})),
            (
                "message.recorded".into(),
                json!({"message": {"id": "m", "role": "assistant", "extra": true,
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}),
            ),
            (
                "message.recorded".into(),
                json!({"message": {"id": "m2", "role": "tool", "name": "t", "content": "x".repeat(300)}}),
            ),
        ]);
        assert_eq!(text, format!("a\nb\n  ← t: {}…\n", "x".repeat(RESULT_WIDTH)));
        assert!(steps.iter().all(|s| *s == Step::Continue));
    }

    #[test]
    fn prompts_and_answers_keep_lines_apart() {
        let mut r = Renderer::new(Vec::new());
        r.on_event("llm.token.delta", &json!({"delta": {"text": "Hmm"}})).unwrap();
        r.prompt("> ").unwrap();
        r.answered(Some("yes"), true).unwrap();
        r.prompt("> ").unwrap();
        r.answered(Some("typed"), false).unwrap();
        r.line("done").unwrap();
        assert_eq!(String::from_utf8(r.into_inner()).unwrap(), "Hmm\n> yes\n> done\n");
    }
}

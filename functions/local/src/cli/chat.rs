//! `turnstone chat`: send a message (or, without one, each line typed) and follow the turn.
//!
//! Per message: read the session's last event seq (a new session starts at 0), submit the
//! message, then follow the event stream from that seq, rendering, until the turn ends. An
//! interrupt asks for a resume payload line, a client tool call for its result line; both are
//! sent back as JSON strings. A call waiting for approval asks `y`, or why not (a denial). A dropped stream is resumed from the last event seen.

use std::hash::{BuildHasher, RandomState};
use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use turnstone_engine::protocol::{
    ClientInput, ClientMessageInput, DraftMessage, InterruptResumeInput, ToolApprovalInput, ToolResultInput,
};

use super::client::{ApiError, Client};
use super::events::event_name;
use super::render::{Renderer, Step};
use super::{ChatArgs, Global};
use turnstone_runtime::net::SseStream;

/// Reconnects tried in a row, without an event in between, before giving up on a stream.
const MAX_RECONNECTS: u32 = 5;

/// Where the conversation reads lines from and writes to.
pub struct Io<'a> {
    pub input: &'a mut dyn BufRead,
    pub out: &'a mut dyn Write,
    /// Write back what the user typed (for input that is not a terminal, which would echo it).
    pub echo: bool,
}

/// Runs `turnstone chat` on stdin and stdout.
pub async fn run(global: &Global, args: ChatArgs) -> anyhow::Result<()> {
    let client = Client::from_global(global)?;
    let session = args.session.clone().unwrap_or_else(new_session_id);
    if args.session.is_none() && args.message.is_some() {
        eprintln!("session {session}");
    }
    let stdin = std::io::stdin();
    let echo = !stdin.is_terminal();
    let (mut input, mut out) = (stdin.lock(), std::io::stdout().lock());
    let io = Io { input: &mut input, out: &mut out, echo };
    chat(&client, &args.agent, &session, args.message.as_deref(), io).await
}

/// Talks to `agent` in `session`: sends `message` and follows its turn (an error unless the
/// turn completes), or without one runs a REPL until end of input or `/quit`.
pub async fn chat(
    client: &Client,
    agent: &str,
    session: &str,
    message: Option<&str>,
    io: Io<'_>,
) -> anyhow::Result<()> {
    let Io { input, out, echo } = io;
    let mut chat = Chat { client, session, agent, renderer: Renderer::new(out), input, echo };
    if let Some(message) = message {
        if chat.turn(message).await? {
            return Ok(());
        }
        anyhow::bail!("the turn did not complete");
    }
    chat.renderer.line(&format!("session {session}, agent {agent} (/quit or end of input to leave)"))?;
    loop {
        chat.renderer.prompt("> ")?;
        let Some(line) = chat.read_line()? else { return Ok(()) };
        match line.trim() {
            "" => continue,
            "/quit" => return Ok(()),
            text => {
                if let Err(e) = chat.turn(text).await {
                    chat.renderer.line(&format!("  ✗ {e:#}"))?;
                }
            }
        }
    }
}

/// A fresh session id, `chat-<8 hex>`.
pub fn new_session_id() -> String {
    // `RandomState` is keyed from the OS's randomness, so no two processes share ids.
    format!("chat-{:08x}", RandomState::new().hash_one("turnstone chat") as u32)
}

struct Chat<'a, 'io> {
    client: &'a Client,
    session: &'a str,
    agent: &'a str,
    renderer: Renderer<&'io mut dyn Write>,
    input: &'io mut dyn BufRead,
    echo: bool,
}

impl Chat<'_, '_> {
    /// Sends `text` and follows its turn; whether it completed.
    async fn turn(&mut self, text: &str) -> anyhow::Result<bool> {
        let after = self.client.last_seq(self.session).await?;
        let input = ClientInput::Message(ClientMessageInput {
            agent_id: self.agent.to_owned(),
            turn_id: None,
            message: DraftMessage::user(text),
            stream: Some(true),
            client: None,
        });
        let accepted = self.client.post_input(self.session, &input, false).await?;
        let turn_id = accepted.turn_id.context("the server started no turn for the message")?;
        self.renderer.begin_turn(&turn_id);
        if accepted.queued {
            self.renderer.line("  (queued behind the active turn)")?;
        }
        self.follow(after).await
    }

    /// Follows the stream from after `after` until the watched turn ends.
    async fn follow(&mut self, after: u64) -> anyhow::Result<bool> {
        let mut last = after;
        let mut stream = self.client.stream(self.session, last, false).await?;
        let mut failures = 0;
        loop {
            let event = match stream.next().await {
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    tracing::warn!("event stream broke after seq {last}: {e:#}");
                    stream = self.reconnect(last, &mut failures).await?;
                    continue;
                }
                None => {
                    tracing::debug!("event stream ended after seq {last}");
                    stream = self.reconnect(last, &mut failures).await?;
                    continue;
                }
            };
            if let Some(seq) = event.seq() {
                if seq <= last {
                    continue;
                }
                (last, failures) = (seq, 0);
            }
            let data: Value = match serde_json::from_str(&event.data) {
                Ok(data) => data,
                Err(e) => {
                    tracing::warn!("skipping an event whose data is not JSON: {e}");
                    continue;
                }
            };
            let name = if event.event == "message" { event_name(&data) } else { event.event };
            match self.renderer.on_event(&name, &data)? {
                Step::Continue => {}
                Step::Ended { ok } => return Ok(ok),
                Step::Interrupt { id } => {
                    self.answer("  resume > ", |line| {
                        let payload = Some(Value::String(line));
                        ClientInput::InterruptResume(InterruptResumeInput {
                            interrupt_id: id.as_str().into(),
                            payload,
                        })
                    })
                    .await?
                }
                Step::Approval { id, name, arguments } => {
                    self.answer(&format!("  ! approve {name}({arguments})? y, or why not > "), |line| {
                        let approved = matches!(line.trim(), "y" | "yes");
                        let reason = (!approved && !line.trim().is_empty()).then(|| line.trim().to_owned());
                        ClientInput::ToolApproval(ToolApprovalInput {
                            id: id.as_str().into(),
                            approved,
                            reason,
                        })
                    })
                    .await?
                }
                Step::ClientCall { id, name, arguments } => {
                    self.answer(&format!("  ? {name}({arguments}) > "), |line| {
                        let result = Some(Value::String(line));
                        ClientInput::ToolResult(ToolResultInput {
                            id: id.as_str().into(),
                            attempt: None,
                            result,
                        })
                    })
                    .await?
                }
            }
        }
    }

    /// Opens the stream again from after `last`, backing off between tries.
    async fn reconnect(&self, last: u64, failures: &mut u32) -> anyhow::Result<SseStream> {
        loop {
            *failures += 1;
            if *failures > MAX_RECONNECTS {
                anyhow::bail!("lost the event stream after seq {last}");
            }
            tokio::time::sleep(Duration::from_millis(250 << *failures)).await;
            match self.client.stream(self.session, last, true).await {
                Ok(stream) => return Ok(stream),
                Err(e) => tracing::warn!("cannot reopen the event stream: {e:#}"),
            }
        }
    }

    /// Asks with `prompt` until the server takes the input `make` builds from the typed line.
    async fn answer(&mut self, prompt: &str, make: impl Fn(String) -> ClientInput) -> anyhow::Result<()> {
        loop {
            self.renderer.prompt(prompt)?;
            let line = self.read_line()?.context("end of input while the turn waits for an answer")?;
            match self.client.post_input(self.session, &make(line), false).await {
                Ok(_) => return Ok(()),
                Err(e) if e.downcast_ref::<ApiError>().is_some() => {
                    self.renderer.line(&format!("  ✗ {e:#}"))?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The next line of input, without its line break; `None` at end of input.
    fn read_line(&mut self) -> anyhow::Result<Option<String>> {
        let mut line = String::new();
        if self.input.read_line(&mut line).context("cannot read input")? == 0 {
            self.renderer.answered(None, self.echo)?;
            return Ok(None);
        }
        let line = line.strip_suffix('\n').unwrap_or(&line);
        let line = line.strip_suffix('\r').unwrap_or(line).to_owned();
        self.renderer.answered(Some(&line), self.echo)?;
        Ok(Some(line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_fresh_and_well_formed() {
        let (a, b) = (new_session_id(), new_session_id());
        assert_ne!(a, b);
        for id in [a, b] {
            let hex = id.strip_prefix("chat-").unwrap();
            assert!(hex.len() == 8 && hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
    }
}

//! `turnstone events`: a session's durable events, one per line as `SEQ NAME JSON`.
//!
//! Without `--follow` the log is paged through `GET …/events`; with it the SSE stream is
//! followed for good, reconnecting with `Last-Event-ID` when the connection drops. Live token
//! deltas are not part of the log and are not printed.

use std::io::Write;
use std::time::Duration;

use serde_json::Value;
use turnstone_engine::session::Event;

use super::client::{Client, str_field};
use super::{EventsArgs, Global};

/// Events asked for per page.
const PAGE: u32 = 500;

/// Runs `turnstone events` on stdout.
pub async fn run(global: &Global, args: EventsArgs) -> anyhow::Result<()> {
    let client = Client::from_global(global)?;
    let mut out = std::io::stdout().lock();
    if args.follow {
        follow(&client, &args.session, args.after, &mut out).await
    } else {
        list(&client, &args.session, args.after, &mut out).await
    }
}

/// Prints the events after `after` that the log holds now.
pub async fn list(client: &Client, session: &str, mut after: u64, out: &mut dyn Write) -> anyhow::Result<()> {
    loop {
        let page = client.events(session, after, PAGE).await?;
        let before = after;
        for logged in &page {
            writeln!(out, "{}", event_line(logged.seq, &logged.event))?;
            after = after.max(logged.seq);
        }
        out.flush()?;
        if after == before {
            return Ok(());
        }
    }
}

/// Prints the events after `after`, then new ones as they happen, until the process stops.
pub async fn follow(
    client: &Client,
    session: &str,
    mut after: u64,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut stream = client.stream(session, after, false).await?;
    let mut failures: u32 = 0;
    loop {
        match stream.next().await {
            Some(Ok(event)) => {
                let Some(seq) = event.seq() else {
                    continue;
                };
                if seq <= after {
                    continue;
                }
                let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::String(event.data));
                writeln!(out, "{}", event_line(seq, &data))?;
                out.flush()?;
                (after, failures) = (seq, 0);
                continue;
            }
            Some(Err(e)) => tracing::warn!("event stream broke after seq {after}: {e:#}"),
            None => tracing::debug!("event stream ended after seq {after}"),
        }
        loop {
            failures = failures.saturating_add(1);
            tokio::time::sleep(Duration::from_millis(250u64 << failures.min(4))).await;
            match client.stream(session, after, true).await {
                Ok(s) => break stream = s,
                Err(e) => tracing::warn!("cannot reopen the event stream: {e:#}"),
            }
        }
    }
}

/// `SEQ NAME JSON`.
pub fn event_line(seq: u64, event: &Value) -> String {
    format!("{seq} {} {event}", event_name(event))
}

/// An event's dotted name (`message.recorded`) from its JSON; for a type this build does not
/// know, its `type` with the first `_` made a dot.
pub fn event_name(event: &Value) -> String {
    if let Ok(known) = serde_json::from_value::<Event>(event.clone()) {
        return known.name().to_owned();
    }
    match str_field(event, "type") {
        Some(kind) => kind.replacen('_', ".", 1),
        None => "unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use turnstone_engine::session::TurnStatus;
    use turnstone_engine::time::Timestamp;

    #[test]
    fn lines_name_events_by_their_dotted_names() {
        let ended = Event::TurnEnded {
            turn_id: "t1".into(),
            status: TurnStatus::Completed,
            data: None,
            error: None,
            code: None,
            at: Timestamp(5),
        };
        let value = serde_json::to_value(&ended).unwrap();
        assert_eq!(
            event_line(7, &value),
            r#"7 turn.ended {"at":5,"data":null,"error":null,"status":"completed","turn_id":"t1","type":"turn_ended"}"#
        );
        assert_eq!(
            event_name(&json!({"type": "decision_retry_scheduled", "new": 1})),
            "decision.retry_scheduled"
        );
        assert_eq!(event_name(&json!({"type": "future_thing_happened"})), "future.thing_happened");
        assert_eq!(event_name(&json!([1])), "unknown");
    }
}

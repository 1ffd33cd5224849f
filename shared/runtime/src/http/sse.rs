//! `GET /v1/sessions/{id}/events/stream`: the durable log as Server-Sent Events, resumable
//! with `Last-Event-ID` (or `?after=`), with live model token deltas coalesced in between.
//!
//! Durable events carry their sequence number as the SSE id; deltas carry none, so a client
//! that reconnects resumes from the last durable event and gets the final message from the
//! log (deltas are a preview, never the record).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::{broadcast, mpsc, watch};
use turnstone_engine::ids::{CallId, SessionId};
use turnstone_engine::protocol::StreamDelta;

use super::query::ApiQuery;
use super::{ApiError, AppState, StreamEnds, authenticate, reachable};
use crate::api::TokenDelta;
use crate::auth::Access;
use crate::notify::{Delta, Progress};

/// How long deltas are gathered into one event.
const COALESCE: Duration = Duration::from_millis(25);
/// How many durable events are read from the store at a time.
const PAGE: usize = 256;
/// Frames buffered per client before the reader waits for it (back-pressure, not loss).
const BUFFER: usize = 64;
/// The `retry:` a stream that ends (`HttpConfig::stream_ends`) asks for.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);
/// The `retry:` of a stream that ended with news: the next long-poll at once.
const POLL_AGAIN_AFTER: Duration = Duration::from_millis(50);

#[derive(Deserialize)]
pub(super) struct StreamQuery {
    #[serde(default)]
    after: Option<u64>,
}

pub(super) async fn stream(
    State(state): State<AppState>,
    Path(id): Path<SessionId>,
    ApiQuery(query): ApiQuery<StreamQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let caller = authenticate(&state, &headers)?;
    reachable(&state, &caller, &id, Access::Read).await?;
    // Held by the pump: given back when the stream ends, however it ends.
    let slot = state.streams.acquire(&caller).ok_or_else(|| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_streams",
            format!(
                "this caller holds {} event streams open, the most allowed (limits.streams_per_caller)",
                state.streams.limit()
            ),
        )
    })?;
    let resume =
        headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    let after = resume.or(query.after).unwrap_or(0);
    // Follow before the first read, so nothing committed in between is missed.
    let notifier = state.app.notifier();
    let live = Live { progress: notifier.progress(&id).await?, deltas: notifier.deltas(&id) };
    let internals = super::redact::sees_internals(&caller, state.config.expose_internal_events);
    let (tx, rx) = mpsc::channel::<SseEvent>(BUFFER);
    let ends = state.config.stream_ends;
    tokio::spawn(async move {
        let last = tx.clone();
        let (lasts, with_news) = match ends {
            StreamEnds::Never => (None, false),
            StreamEnds::After(lasts) => (Some(lasts), false),
            StreamEnds::WithNews(lasts) => (Some(lasts), true),
        };
        let pumped = pump(state, id.into_string(), after, live, internals, with_news, tx);
        let end = match lasts {
            None => {
                pumped.await;
                None
            }
            Some(lasts) => tokio::select! {
                // The pump returns on its own only when the client left, or with news.
                () = pumped => with_news.then(|| {
                    SseEvent::default().retry(POLL_AGAIN_AFTER).comment("that is all for now; reconnect with Last-Event-ID")
                }),
                // The pump is dropped here, so this is the stream's last frame: reconnect
                // soon, from the last durable event (its id).
                () = tokio::time::sleep(lasts) => Some(
                    SseEvent::default()
                        .retry(RECONNECT_AFTER)
                        .comment("this stream ends before the host's deadline; reconnect with Last-Event-ID"),
                ),
            },
        };
        if let Some(end) = end {
            let _ = last.send(end).await;
        }
        drop(slot);
    });
    let frames =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (Ok(f), rx)) });
    Ok(Sse::new(frames).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)).text("keep-alive")))
}

/// Sends the log from `after`, then follows it, until the client goes away.
/// What a stream follows between reads of the log.
struct Live {
    progress: watch::Receiver<Progress>,
    deltas: broadcast::Receiver<Delta>,
}

/// With `internals` false, the events go out as end users see them (`crate::redact`); with
/// `with_news`, it returns once it has sent anything (and caught up with the log).
async fn pump(
    state: AppState,
    id: String,
    mut after: u64,
    mut live: Live,
    internals: bool,
    with_news: bool,
    tx: mpsc::Sender<SseEvent>,
) {
    let mut sent = false;
    loop {
        // Deltas passed on before the commit that woke this read go out before its events (the
        // dispatcher passes a call's deltas on before it commits the reply).
        let mut pending: BTreeMap<CallId, StreamDelta> = BTreeMap::new();
        loop {
            match live.deltas.try_recv() {
                Ok(Delta { call_id, delta }) => merge(pending.entry(call_id).or_default(), delta),
                // Deltas are a preview: a stream that lagged skips some.
                Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
        sent |= !pending.is_empty();
        if !send_deltas(&tx, pending).await {
            return;
        }
        // Catch up with the durable log (marking the progress seen first, so a commit during
        // the read is not missed).
        live.progress.borrow_and_update();
        loop {
            let events = match state.app.store().events_after(&id, after, PAGE).await {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(session_id = %id, error = %e, "event stream read failed");
                    return;
                }
            };
            for logged in &events {
                let event = if internals {
                    std::borrow::Cow::Borrowed(&logged.event)
                } else {
                    super::redact::for_clients(&logged.event)
                };
                let data = serde_json::to_string(&*event).unwrap_or_default();
                let frame =
                    SseEvent::default().id(logged.seq.to_string()).event(logged.event.name()).data(data);
                if tx.send(frame).await.is_err() {
                    return;
                }
                after = logged.seq;
                sent = true;
            }
            if events.len() < PAGE {
                break;
            }
        }
        if with_news && sent {
            return;
        }
        // Wait for news: a commit (read the log again) or deltas (pass them on, gathered).
        let first = tokio::select! {
            changed = live.progress.changed() => match changed {
                Ok(()) => continue,
                Err(_) => return,
            },
            delta = live.deltas.recv() => delta,
            () = tx.closed() => return,
        };
        let first = match first {
            Ok(delta) => delta,
            // Deltas are a preview: a stream that lagged skips them.
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let mut gathered: BTreeMap<CallId, StreamDelta> = BTreeMap::new();
        merge(gathered.entry(first.call_id).or_default(), first.delta);
        let until = tokio::time::Instant::now() + COALESCE;
        loop {
            tokio::select! {
                delta = live.deltas.recv() => match delta {
                    Ok(Delta { call_id, delta }) => merge(gathered.entry(call_id).or_default(), delta),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                // A commit ends the gathering: its events go out after these deltas.
                _ = live.progress.changed() => break,
                () = tokio::time::sleep_until(until) => break,
            }
        }
        if !send_deltas(&tx, gathered).await {
            return;
        }
        sent = true;
        if with_news && sent {
            return;
        }
    }
}

/// Sends the gathered deltas, one event per call; `false` when the client is gone.
async fn send_deltas(tx: &mpsc::Sender<SseEvent>, gathered: BTreeMap<CallId, StreamDelta>) -> bool {
    for (call_id, delta) in gathered {
        let data = serde_json::to_string(&TokenDelta { call_id, delta }).unwrap_or_default();
        if tx.send(SseEvent::default().event("llm.token.delta").data(data)).await.is_err() {
            return false;
        }
    }
    true
}

/// Appends `more` to `into`: text and reasoning concatenate, tool call fragments append.
fn merge(into: &mut StreamDelta, more: StreamDelta) {
    fn cat(a: &mut Option<String>, b: Option<String>) {
        if let Some(b) = b {
            a.get_or_insert_with(String::new).push_str(&b);
        }
    }
    cat(&mut into.text, more.text);
    cat(&mut into.reasoning, more.reasoning);
    if let Some(calls) = more.tool_calls {
        into.tool_calls.get_or_insert_with(Vec::new).extend(calls);
    }
    if more.finish_reason.is_some() {
        into.finish_reason = more.finish_reason;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_merge() {
        let mut d = StreamDelta::default();
        merge(&mut d, StreamDelta { text: Some("hel".into()), ..Default::default() });
        merge(
            &mut d,
            StreamDelta { text: Some("lo".into()), finish_reason: Some("stop".into()), ..Default::default() },
        );
        assert_eq!(d.text.as_deref(), Some("hello"));
        assert_eq!(d.finish_reason.as_deref(), Some("stop"));
    }
}

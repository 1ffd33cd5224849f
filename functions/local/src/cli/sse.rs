//! A small incremental reader for `text/event-stream` bodies.
//!
//! Bytes go in as they arrive, split anywhere (inside a line, a UTF-8 character or a CRLF);
//! complete events come out. Lines end with LF or CRLF; `:` starts a comment; `id`, `event`
//! and `data` are read (several `data` lines join with `\n`), other fields are ignored; a blank
//! line ends an event, and an event without `data` is dropped. Unlike a browser's
//! `EventSource`, an event's `id` is its own (not carried over to later events): durable events
//! carry their sequence number as id, live token deltas carry none.

use std::collections::VecDeque;
use std::pin::Pin;

use futures_util::{Stream, StreamExt};

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `id` field of this event.
    pub id: Option<String>,
    /// The `event` field (the event's name).
    pub event: Option<String>,
    /// The `data` lines, joined with `\n`.
    pub data: String,
}

/// The reader's state between chunks.
#[derive(Debug, Default)]
pub struct SseReader {
    line: Vec<u8>,
    event: SseEvent,
    has_data: bool,
}

impl SseReader {
    /// Feeds a chunk; returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut done = Vec::new();
        for &byte in chunk {
            if byte != b'\n' {
                self.line.push(byte);
                continue;
            }
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if let Some(event) = self.line_done(&String::from_utf8_lossy(&line)) {
                done.push(event);
            }
        }
        done
    }

    fn line_done(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            return std::mem::take(&mut self.has_data).then_some(event);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => self.event.id = Some(value.to_owned()),
            "event" => self.event.event = Some(value.to_owned()),
            "data" => {
                if self.has_data {
                    self.event.data.push('\n');
                }
                self.event.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

type Body = Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// The events of an HTTP response body, read as they arrive.
pub struct SseStream {
    body: Body,
    reader: SseReader,
    ready: VecDeque<SseEvent>,
}

impl SseStream {
    /// Reads `response`'s body as an event stream.
    pub fn new(response: reqwest::Response) -> Self {
        SseStream {
            body: Box::pin(response.bytes_stream()),
            reader: SseReader::default(),
            ready: VecDeque::new(),
        }
    }

    /// The next event; `None` when the body ended.
    pub async fn next(&mut self) -> Option<anyhow::Result<SseEvent>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(Ok(event));
            }
            match self.body.next().await? {
                Ok(chunk) => self.ready.extend(self.reader.feed(&chunk)),
                Err(e) => return Some(Err(anyhow::Error::new(e).context("event stream broke"))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: Option<&str>, name: Option<&str>, data: &str) -> SseEvent {
        SseEvent { id: id.map(str::to_owned), event: name.map(str::to_owned), data: data.to_owned() }
    }

    #[test]
    fn reads_fields_and_multi_line_data() {
        let mut r = SseReader::default();
        let out = r.feed(b"id: 3\nevent: turn.ended\ndata: {\"a\":\ndata: 1}\n\n");
        assert_eq!(out, vec![event(Some("3"), Some("turn.ended"), "{\"a\":\n1}")]);
    }

    #[test]
    fn crlf_comments_and_unknown_fields() {
        let mut r = SseReader::default();
        let out = r.feed(b": keep-alive\r\n\r\nretry: 10\r\nevent: x\r\ndata:no-space\r\n\r\n");
        assert_eq!(out, vec![event(None, Some("x"), "no-space")]);
    }

    #[test]
    fn chunks_split_anywhere_give_the_same_events() {
        let body = "id: 1\r\nevent: a\r\ndata: h\u{e9}llo\r\n\r\nevent: llm.token.delta\ndata: {}\n\n";
        let whole = SseReader::default().feed(body.as_bytes());
        assert_eq!(whole.len(), 2);
        for split in 0..body.len() {
            let mut r = SseReader::default();
            let mut got = r.feed(&body.as_bytes()[..split]);
            got.extend(r.feed(&body.as_bytes()[split..]));
            assert_eq!(got, whole, "split at {split}");
        }
        let mut r = SseReader::default();
        let got: Vec<_> = body.as_bytes().iter().flat_map(|b| r.feed(&[*b])).collect();
        assert_eq!(got, whole);
        assert_eq!(whole[0], event(Some("1"), Some("a"), "h\u{e9}llo"));
    }

    #[test]
    fn ids_do_not_carry_over_and_events_without_data_are_dropped() {
        let mut r = SseReader::default();
        let out = r.feed(b"id: 5\nevent: a\n\nid: 6\ndata: x\n\nevent: b\ndata:\n\n");
        assert_eq!(out, vec![event(Some("6"), None, "x"), event(None, Some("b"), "")]);
    }

    #[test]
    fn an_unfinished_event_waits_for_its_blank_line() {
        let mut r = SseReader::default();
        assert!(r.feed(b"data: x\n").is_empty());
        assert_eq!(r.feed(b"\n"), vec![event(None, None, "x")]);
    }
}

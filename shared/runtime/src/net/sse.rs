//! An incremental parser for `text/event-stream` bodies (the WHATWG server-sent events format),
//! shared by everything in the runtime that reads an event stream.
//!
//! Bytes are fed as they arrive, split anywhere (even inside a line, a UTF-8 character or a
//! CRLF pair); complete events come out in order. Lines end with LF, CRLF or CR; a line
//! starting with `:` is a comment; `event:` names the event; `data:` lines are joined with
//! `\n`; `id:` sets the last event id, which later events keep until another `id:` changes it
//! (an id containing NUL is ignored, as the format says), and is also reported as the event's
//! own id when the event carried it itself (Turnstone's durable events carry their sequence
//! number as id, live token deltas none); `retry:` and unknown fields are ignored; a blank line dispatches the event (an event without any `data` line is dropped);
//! a leading byte order mark is skipped. Whatever is pending when the stream ends is
//! discarded: an event is complete only once its blank line arrived.

use std::collections::VecDeque;
use std::pin::Pin;

use futures_util::{Stream, StreamExt};

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, `message` when there was none.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The id this event carried itself (an `id:` line inside it), if any.
    pub id: Option<String>,
    /// The last event id set by an `id:` line so far in the stream, if any (what a browser's
    /// `EventSource` reports and sends back as `Last-Event-ID`).
    pub last_event_id: Option<String>,
}

impl SseEvent {
    /// The event's own id as a number (Turnstone's durable events: their sequence number).
    pub fn seq(&self) -> Option<u64> {
        self.id.as_deref().and_then(|id| id.trim().parse().ok())
    }
}

/// Why a stream cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line is not UTF-8.
    #[error("event stream is not UTF-8")]
    NotUtf8,
    /// A line or an event's data is longer than the limit.
    #[error("event stream line or event is larger than {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
}

/// The parser's state between chunks.
#[derive(Debug)]
pub struct SseParser {
    /// The bytes of an unfinished line.
    line: Vec<u8>,
    /// The previous line ended with CR: a LF right after it belongs to that line end.
    after_cr: bool,
    /// No line has been processed yet (a byte order mark may lead it).
    first_line: bool,
    /// The event name of the event being built.
    event: String,
    /// The data of the event being built.
    data: String,
    /// Whether the event being built has seen a `data` field.
    has_data: bool,
    id: Option<String>,
    /// Whether the event being built carried an `id:` line itself.
    own_id: bool,
    /// The longest line and the largest event data accepted, in bytes.
    limit: usize,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseParser {
    /// A parser that refuses lines and event data longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        SseParser {
            line: Vec::new(),
            after_cr: false,
            first_line: true,
            event: String::new(),
            data: String::new(),
            has_data: false,
            id: None,
            own_id: false,
            limit,
        }
    }

    /// Parses the next chunk of the stream, appending each completed event to `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        while !chunk.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if let Some((b'\n', rest)) = chunk.split_first() {
                    chunk = rest;
                    continue;
                }
            }
            match chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(end) => {
                    let (line, rest) = chunk.split_at(end);
                    self.after_cr = rest.first() == Some(&b'\r');
                    chunk = rest.get(1..).unwrap_or_default();
                    if self.line.is_empty() {
                        self.process_line(line, out)?;
                    } else {
                        self.push_partial(line)?;
                        let mut whole = std::mem::take(&mut self.line);
                        let result = self.process_line(&whole, out);
                        whole.clear();
                        self.line = whole;
                        result?;
                    }
                }
                None => {
                    self.push_partial(chunk)?;
                    break;
                }
            }
        }
        Ok(())
    }

    fn push_partial(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > self.limit {
            return Err(SseError::TooLarge { limit: self.limit });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn process_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let line =
            if std::mem::take(&mut self.first_line) { line.strip_prefix(BOM).unwrap_or(line) } else { line };
        if line.len() > self.limit {
            return Err(SseError::TooLarge { limit: self.limit });
        }
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line.first() == Some(&b':') {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = line.get(colon + 1..).unwrap_or_default();
                (line.get(..colon).unwrap_or_default(), value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match field {
            b"event" => {
                let value = std::str::from_utf8(value).map_err(|_| SseError::NotUtf8)?;
                value.clone_into(&mut self.event);
            }
            b"data" => {
                let value = std::str::from_utf8(value).map_err(|_| SseError::NotUtf8)?;
                if self.data.len() + value.len() + 1 > self.limit {
                    return Err(SseError::TooLarge { limit: self.limit });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            b"id" => {
                let value = std::str::from_utf8(value).map_err(|_| SseError::NotUtf8)?;
                if !value.contains('\0') {
                    self.id = Some(value.to_owned());
                    self.own_id = true;
                }
            }
            // `retry` and fields the format does not know are ignored.
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let own_id = std::mem::take(&mut self.own_id);
        if !std::mem::take(&mut self.has_data) {
            self.event.clear();
            return;
        }
        let event =
            if self.event.is_empty() { "message".to_owned() } else { std::mem::take(&mut self.event) };
        out.push(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
            id: self.id.clone().filter(|_| own_id),
            last_event_id: self.id.clone(),
        });
    }
}

/// Why reading an event stream off a response stopped.
#[derive(Debug, thiserror::Error)]
pub enum SseStreamError {
    /// The body broke off or timed out.
    #[error("{}", super::error_chain(.0))]
    Body(#[source] reqwest::Error),
    /// The bytes are not a valid event stream.
    #[error(transparent)]
    Sse(#[from] SseError),
}

type Body = Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// The events of an HTTP response body, parsed as they arrive.
pub struct SseStream {
    body: Body,
    parser: SseParser,
    ready: VecDeque<SseEvent>,
    parsed: Vec<SseEvent>,
}

impl SseStream {
    /// Reads `response`'s body as an event stream whose lines and events are at most `limit`
    /// bytes.
    pub fn new(response: reqwest::Response, limit: usize) -> Self {
        SseStream {
            body: Box::pin(response.bytes_stream()),
            parser: SseParser::new(limit),
            ready: VecDeque::new(),
            parsed: Vec::new(),
        }
    }

    /// The next event; `None` once the body ended (an unfinished last event is dropped).
    pub async fn next(&mut self) -> Option<Result<SseEvent, SseStreamError>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(Ok(event));
            }
            let chunk = match self.body.next().await? {
                Ok(chunk) => chunk,
                Err(e) => return Some(Err(SseStreamError::Body(e))),
            };
            if let Err(e) = self.parser.feed(&chunk, &mut self.parsed) {
                return Some(Err(e.into()));
            }
            self.ready.extend(self.parsed.drain(..));
        }
    }

    /// Reads and drops the rest of the body, up to about `max_bytes`, so its connection can be
    /// reused; bound it with a timeout.
    pub async fn drain(mut self, max_bytes: usize) {
        let mut left = max_bytes;
        while let Some(Ok(chunk)) = self.body.next().await {
            left = left.saturating_sub(chunk.len());
            if left == 0 {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent { event: event.to_owned(), data: data.to_owned(), id: None, last_event_id: None }
    }

    fn parse_chunks(chunks: &[&[u8]]) -> Result<Vec<SseEvent>, SseError> {
        let mut parser = SseParser::new(1 << 20);
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, &mut out)?;
        }
        Ok(out)
    }

    /// Parses `input` whole, byte by byte, and split at every pair of points; all must agree.
    fn parse_every_way(input: &[u8]) -> Vec<SseEvent> {
        let whole = parse_chunks(&[input]).unwrap();
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(parse_chunks(&bytes).unwrap(), whole, "byte by byte");
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let got = parse_chunks(&[&input[..i], &input[i..j], &input[j..]]).unwrap();
                assert_eq!(got, whole, "split at {i} and {j}");
            }
        }
        whole
    }

    #[test]
    fn events_with_names_and_multi_line_data() {
        let input = b"event: content_block_delta\ndata: {\"a\":1}\n\ndata: {\ndata:  \"b\": []\ndata: }\n\n";
        assert_eq!(
            parse_every_way(input),
            vec![ev("content_block_delta", "{\"a\":1}"), ev("message", "{\n \"b\": []\n}")]
        );
    }

    #[test]
    fn openai_style_data_only_stream() {
        let input = b"data: {\"x\":1}\n\ndata: [DONE]\n\n";
        assert_eq!(parse_every_way(input), vec![ev("message", "{\"x\":1}"), ev("message", "[DONE]")]);
    }

    #[test]
    fn crlf_and_cr_line_ends() {
        let crlf = b"event: a\r\ndata: 1\r\n\r\nevent: b\r\ndata: 2\r\n\r\n";
        let cr = b"event: a\rdata: 1\r\revent: b\rdata: 2\r\r";
        let mixed = b"event: a\r\ndata: 1\n\revent: b\rdata: 2\r\n\n";
        let want = vec![ev("a", "1"), ev("b", "2")];
        assert_eq!(parse_every_way(crlf), want);
        assert_eq!(parse_every_way(cr), want);
        assert_eq!(parse_every_way(mixed), want);
    }

    #[test]
    fn comments_retries_and_unknown_fields_are_ignored() {
        let input = b": keep-alive\nretry: 1000\nfoo: bar\nevent: x\n:comment\ndata: y\n\n";
        assert_eq!(parse_every_way(input), vec![ev("x", "y")]);
    }

    #[test]
    fn ids_persist_until_changed() {
        let input = b"id: 7\ndata: a\n\ndata: b\n\nid: 8\ndata: c\n\nid: bad\0id\ndata: d\n\nid\ndata: e\n\n";
        let got = parse_every_way(input);
        let ids: Vec<Option<&str>> = got.iter().map(|e| e.last_event_id.as_deref()).collect();
        assert_eq!(ids, vec![Some("7"), Some("7"), Some("8"), Some("8"), Some("")]);
        // Only the events that carried an id themselves report it as their own.
        let own: Vec<Option<&str>> = got.iter().map(|e| e.id.as_deref()).collect();
        assert_eq!(own, vec![Some("7"), None, Some("8"), None, Some("")]);
        assert_eq!(got[2].seq(), Some(8));
        assert_eq!(got[1].seq(), None);
    }

    #[test]
    fn field_forms() {
        // No space after the colon, only one space stripped, a field without a colon, empty data.
        let input = b"event:x\ndata:a\ndata:  b\ndata\n\nevent: y\ndata:\n\n";
        assert_eq!(parse_every_way(input), vec![ev("x", "a\n b\n"), ev("y", "")]);
    }

    #[test]
    fn event_without_data_is_dropped_and_name_reset() {
        let input = b"event: ignored\n\ndata: plain\n\n";
        assert_eq!(parse_every_way(input), vec![ev("message", "plain")]);
    }

    #[test]
    fn leading_bom_is_skipped() {
        let input = b"\xEF\xBB\xBFevent: x\ndata: 1\n\n";
        assert_eq!(parse_every_way(input), vec![ev("x", "1")]);
    }

    #[test]
    fn unfinished_event_is_not_dispatched() {
        assert_eq!(parse_chunks(&[b"event: x\ndata: 1\n"]).unwrap(), vec![]);
        assert_eq!(parse_chunks(&[b"event: x\ndata: 1"]).unwrap(), vec![]);
    }

    #[test]
    fn limits_and_utf8() {
        let mut parser = SseParser::new(8);
        let mut out = Vec::new();
        assert_eq!(parser.feed(b"data: 0123456789", &mut out), Err(SseError::TooLarge { limit: 8 }));
        let mut parser = SseParser::new(8);
        assert_eq!(parser.feed(b"data:1234\ndata:5678\n", &mut out), Err(SseError::TooLarge { limit: 8 }));
        let mut parser = SseParser::new(64);
        assert_eq!(parser.feed(b"data: \xff\n", &mut out), Err(SseError::NotUtf8));
        // A UTF-8 character split across chunks is fine.
        let text = "data: h\u{e9}\n\n".as_bytes();
        let (a, b) = text.split_at(8);
        assert_eq!(parse_chunks(&[a, b]).unwrap(), vec![ev("message", "h\u{e9}")]);
    }
}

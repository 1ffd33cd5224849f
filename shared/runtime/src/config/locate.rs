//! Locating problems in the text: field paths, line and column, and the wording of errors.

use super::*;

// ---------------------------------------------------------------------------------------------
// Locating problems in the text.

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seg {
    Key(String),
    Index(usize),
}

pub(super) fn path(keys: &[&str]) -> Vec<Seg> {
    keys.iter().map(|k| Seg::Key((*k).to_owned())).collect()
}

/// Appends a relative path such as `tools[1].name` (as the engine's errors give them).
pub(super) fn join(mut base: Vec<Seg>, rel: &str) -> Vec<Seg> {
    for part in rel.split('.').filter(|p| !p.is_empty()) {
        let (name, indices) = part.find('[').map_or((part, ""), |i| part.split_at(i));
        if !name.is_empty() {
            base.push(Seg::Key(name.to_owned()));
        }
        for index in indices.split('[').filter_map(|s| s.strip_suffix(']')) {
            if let Ok(n) = index.parse() {
                base.push(Seg::Index(n));
            }
        }
    }
    base
}

pub(super) fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                    out.push_str(key);
                } else {
                    out.push_str(&format!("{key:?}"));
                }
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

pub(super) fn segments(path: &serde_path_to_error::Path) -> Vec<Seg> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|seg| match seg {
            Segment::Seq { index } => Some(Seg::Index(*index)),
            Segment::Map { key } | Segment::Enum { variant: key } => Some(Seg::Key(key.clone())),
            Segment::Unknown => None,
        })
        .collect()
}

/// The span of the deepest part of `path` written in the file: a key, or an array element.
pub(super) fn locate(doc: &DeTable<'_>, path: &[Seg]) -> Option<Range<usize>> {
    let mut span = None;
    let mut node: Option<&DeValue<'_>> = None;
    for seg in path {
        let table = match node {
            None => Some(doc),
            Some(DeValue::Table(t)) => Some(t),
            Some(_) => None,
        };
        let next = match (seg, table, node) {
            (Seg::Key(key), Some(table), _) => {
                table.get_key_value(key.as_str()).map(|(k, v)| (k.span(), v.get_ref()))
            }
            (Seg::Index(i), _, Some(DeValue::Array(items))) => items.get(*i).map(|v| (v.span(), v.get_ref())),
            _ => None,
        };
        let Some((at, value)) = next else { break };
        span = Some(at);
        node = Some(value);
    }
    span
}

/// The 1-based line and column of byte `offset` in `text`.
pub(super) fn position(text: &str, offset: usize) -> Position {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Position { line: before.matches('\n').count() + 1, column: before[line_start..].chars().count() + 1 }
}

/// The text being parsed, for errors that point into it.
pub(super) struct Source<'a> {
    pub(super) file: &'a str,
    pub(super) text: &'a str,
    pub(super) doc: &'a DeTable<'a>,
}

impl Source<'_> {
    pub(super) fn error_at(
        &self,
        span: Option<Range<usize>>,
        path: &[Seg],
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            position: span.map(|s| position(self.text, s.start)),
            path: render(path),
            message: message.into(),
            io: None,
        }
    }

    /// A type or shape error from deserializing, at the field it names.
    pub(super) fn serde_error(&self, err: &serde_path_to_error::Error<toml::de::Error>) -> ConfigError {
        let mut path = segments(err.path());
        let message = reword(&mut path, err.inner().message());
        let span = err.inner().span().or_else(|| locate(self.doc, &path));
        self.error_at(span, &path, message)
    }
}

/// The problems found after parsing; the first in the file is reported.
pub(super) struct Problems<'a> {
    pub(super) src: &'a Source<'a>,
    pub(super) found: Vec<(usize, ConfigError)>,
}

impl Problems<'_> {
    pub(super) fn add(&mut self, path: Vec<Seg>, message: impl Into<String>) {
        let span = locate(self.src.doc, &path);
        let start = span.as_ref().map_or(usize::MAX, |s| s.start);
        self.found.push((start, self.src.error_at(span, &path, message)));
    }

    pub(super) fn first(self) -> Option<ConfigError> {
        let mut found = self.found;
        found.sort_by_key(|(start, _)| *start);
        found.into_iter().next().map(|(_, e)| e)
    }
}

/// A TOML syntax error's message; a duplicate key is named (a key is never a secret).
pub(super) fn syntax_message(text: &str, err: &toml::de::Error) -> String {
    let key = err
        .span()
        .and_then(|s| text.get(s))
        .filter(|k| err.message() == "duplicate key" && !k.contains('\n'));
    match key {
        Some(key) => format!("invalid TOML: duplicate key {:?}", key.trim_matches('"')),
        None => format!("invalid TOML: {}", err.message()),
    }
}

/// Rewrites serde's messages in the file's words: keys, not fields; the key joins the path.
pub(super) fn reword(path: &mut Vec<Seg>, message: &str) -> String {
    let quoted = |rest: &str| rest.split_once('`').map(|(name, tail)| (name.to_owned(), backticked(tail)));
    if let Some((key, expected)) = message.strip_prefix("unknown field `").and_then(quoted) {
        if path.last() != Some(&Seg::Key(key.clone())) {
            path.push(Seg::Key(key.clone()));
        }
        return unknown("key", &key, &expected);
    }
    if let Some((value, expected)) = message.strip_prefix("unknown variant `").and_then(quoted) {
        return unknown("value", &value, &expected);
    }
    if let Some((key, _)) = message.strip_prefix("missing field `").and_then(quoted) {
        return format!("missing required key {key:?}");
    }
    if let Some((found, expected)) =
        message.strip_prefix("invalid type: ").and_then(|m| m.rsplit_once(", expected "))
    {
        // The value is not echoed: a misplaced secret must not reach the log.
        let found = match found.split(' ').next().unwrap_or_default() {
            "string" => "a string",
            "integer" => "an integer",
            "floating" => "a float",
            "boolean" => "a boolean",
            "sequence" => "an array",
            "map" => "a table",
            _ => found,
        };
        return format!("expected {}, found {found}", expected_in_toml(expected));
    }
    if let Some((value, expected)) =
        message.strip_prefix("invalid value: ").and_then(|m| m.rsplit_once(", expected "))
    {
        let value = backticked(value).into_iter().next().unwrap_or_else(|| value.to_owned());
        return format!("invalid value {value}, expected {}", expected_in_toml(expected));
    }
    if message == "invalid socket address syntax" {
        return "invalid socket address, expected an IP address and port such as \"127.0.0.1:8787\""
            .to_owned();
    }
    message.to_owned()
}

/// Serde's name of an expected type, in TOML's words.
pub(super) fn expected_in_toml(expected: &str) -> &str {
    match expected {
        "a sequence" => "an array",
        "a map" => "a table",
        "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer",
        "f32" | "f64" => "a number",
        _ if expected.starts_with("struct ") => "a table",
        _ => expected,
    }
}

/// The names quoted in backticks: "expected one of `a`, `b`" -> [a, b].
pub(super) fn backticked(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

pub(super) fn unknown(what: &str, got: &str, expected: &[String]) -> String {
    let mut message = format!("unknown {what} {got:?}");
    let near = |e: &&String| {
        edit_distance(got, e) <= 2 || (got.len() >= 3 && (e.starts_with(got) || got.starts_with(e.as_str())))
    };
    if let Some(near) = expected.iter().filter(near).min_by_key(|e| edit_distance(got, e)) {
        message.push_str(&format!(" (did you mean {near:?}?)"));
    }
    if !expected.is_empty() {
        message.push_str(&format!("; expected one of: {}", expected.join(", ")));
    }
    message
}

pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

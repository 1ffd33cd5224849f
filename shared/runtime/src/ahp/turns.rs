//! Paging a chat's turns, newest first, for `GET /v1/sessions/{id}/chat` and AHP's
//! `subscribe` (`view.turns`) and `fetchTurns`: a cursor `turns-before.N` names the turns
//! before position `N` (turns only grow at the end, so a position stays valid).

use ahp_types::state::{ChatState, Turn};

/// Cursors name a position in the chat's turns.
const CURSOR_PREFIX: &str = "turns-before.";

/// A cursor this host did not write, or past the chat's turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCursor;

/// At most `limit` turns of `turns` before `cursor` (the newest when `None`), oldest first,
/// and the cursor to the turns before them, if any.
pub fn page(
    turns: &[Turn],
    cursor: Option<&str>,
    limit: usize,
) -> Result<(Vec<Turn>, Option<String>), InvalidCursor> {
    let end = match cursor {
        None => turns.len(),
        Some(cursor) => parse_cursor(cursor).filter(|end| *end <= turns.len()).ok_or(InvalidCursor)?,
    };
    let start = end.saturating_sub(limit);
    let next = (start > 0).then(|| format!("{CURSOR_PREFIX}{start}"));
    Ok((turns[start..end].to_vec(), next))
}

/// `chat` with only its newest `limit` turns (before `cursor`), and the cursor to the rest.
pub fn tail(chat: &ChatState, cursor: Option<&str>, limit: usize) -> Result<ChatState, InvalidCursor> {
    let (turns, next) = page(&chat.turns, cursor, limit)?;
    Ok(ChatState { turns, turns_next_cursor: next, ..chat.clone() })
}

/// As [`tail`], and no more of the newest turns than make one page of JSON that fits behind a
/// Lambda function ([`crate::http::pages::fitting`]; the newest turn always comes).
pub fn tail_within_a_page(
    chat: &ChatState,
    cursor: Option<&str>,
    limit: usize,
) -> Result<ChatState, InvalidCursor> {
    let mut page = tail(chat, cursor, limit)?;
    let keep = crate::http::pages::fitting(page.turns.iter().rev(), limit);
    let dropped = page.turns.len() - keep;
    if dropped > 0 {
        let start = page.turns_next_cursor.as_deref().and_then(parse_cursor).unwrap_or(0) + dropped;
        page.turns.drain(..dropped);
        page.turns_next_cursor = Some(format!("{CURSOR_PREFIX}{start}"));
    }
    Ok(page)
}

fn parse_cursor(cursor: &str) -> Option<usize> {
    cursor.strip_prefix(CURSOR_PREFIX)?.parse().ok()
}

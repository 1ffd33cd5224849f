//! Listing cursors: the key of the last session on a page, opaque to callers.
//!
//! A cursor reads `d1.<created_at>.<session id as hex>`; the next page starts strictly after
//! that session in the newest-first order of the listing indexes' range key
//! (`<created_at>#<session>`, read backwards). Anything else is refused.

use std::fmt::Write;

use turnstone_engine::time::Timestamp;

use crate::items;

/// Where a listing page ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// The last item's creation time.
    pub created_at: Timestamp,
    /// The last item's session id.
    pub session_id: String,
}

const PREFIX: &str = "d1.";

impl Cursor {
    /// The cursor as handed to callers.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(PREFIX.len() + 21 + self.session_id.len() * 2);
        out.push_str(PREFIX);
        let _ = write!(out, "{}.", self.created_at.0);
        for byte in self.session_id.bytes() {
            let _ = write!(out, "{byte:02x}");
        }
        out
    }

    /// Reads a cursor back; `None` for anything this store did not hand out.
    pub fn decode(text: &str) -> Option<Cursor> {
        let rest = text.strip_prefix(PREFIX)?;
        let (created_at, hex) = rest.split_once('.')?;
        if created_at.is_empty() || hex.is_empty() || hex.len() % 2 != 0 {
            return None;
        }
        let created_at: i64 = created_at.parse().ok()?;
        let bytes = hex
            .as_bytes()
            .chunks(2)
            .map(|pair| std::str::from_utf8(pair).ok().and_then(|p| u8::from_str_radix(p, 16).ok()))
            .collect::<Option<Vec<u8>>>()?;
        let session_id = String::from_utf8(bytes).ok()?;
        Some(Cursor { created_at: Timestamp(created_at), session_id })
    }

    /// The listing indexes' range key of the session the cursor names.
    pub fn created_key(&self) -> String {
        items::timed_key(self.created_at, &self.session_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = Cursor { created_at: Timestamp(-5), session_id: "s-1/ü#x".into() };
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
    }

    #[test]
    fn garbage_is_refused() {
        for text in ["", "d1.", "d1.12", "d1.12.", "d1.x.6162", "d1.1.616", "d1.1.zz", "v1.1.61", "d1.1.ff"] {
            assert_eq!(Cursor::decode(text), None, "{text:?}");
        }
    }
}

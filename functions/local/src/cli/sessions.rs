//! `turnstone sessions`: a table of sessions (id, agent, last update), newest pages first as
//! the server orders them.

use std::io::Write;

use time::OffsetDateTime;
use turnstone_runtime::api::SessionListing;

use super::client::Client;
use super::{Global, SessionsArgs};

/// Runs `turnstone sessions` on stdout.
pub async fn run(global: &Global, args: SessionsArgs) -> anyhow::Result<()> {
    let client = Client::from_global(global)?;
    let rows = collect(&client, args.agent.as_deref(), args.limit).await?;
    let mut out = std::io::stdout().lock();
    out.write_all(table(&rows).as_bytes())?;
    Ok(())
}

/// Up to `limit` sessions (of `agent`, when given), following the server's page cursors.
pub async fn collect(
    client: &Client,
    agent: Option<&str>,
    limit: usize,
) -> anyhow::Result<Vec<SessionListing>> {
    let mut rows: Vec<SessionListing> = Vec::new();
    let mut cursor: Option<String> = None;
    while rows.len() < limit {
        let want = limit - rows.len();
        let (page, next) = client.sessions(agent, want, cursor.as_deref()).await?;
        let empty = page.is_empty();
        rows.extend(page.into_iter().take(want));
        match next {
            Some(next) if !empty => cursor = Some(next),
            _ => break,
        }
    }
    Ok(rows)
}

/// The sessions as an aligned table with a header, or a note that there are none.
pub fn table(sessions: &[SessionListing]) -> String {
    if sessions.is_empty() {
        return "no sessions\n".to_owned();
    }
    let mut rows = vec![["ID".to_owned(), "AGENT".to_owned(), "UPDATED".to_owned()]];
    for s in sessions {
        rows.push([s.session_id.clone(), s.agent_id.clone(), format_ms(s.updated_at.0)]);
    }
    let width = |col: usize| rows.iter().map(|r| r[col].chars().count()).max().unwrap_or(0);
    let (w0, w1) = (width(0), width(1));
    rows.iter().map(|[id, agent, updated]| format!("{id:<w0$}  {agent:<w1$}  {updated}\n")).collect()
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SSZ` (UTC).
fn format_ms(ms: i64) -> String {
    match OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => ms.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstone_engine::time::Timestamp;

    fn listing(id: &str, agent: &str, updated_at: i64) -> SessionListing {
        SessionListing {
            session_id: id.into(),
            agent_id: agent.into(),
            owner: None,
            version: 3,
            created_at: Timestamp(0),
            updated_at: Timestamp(updated_at),
        }
    }

    #[test]
    fn a_table_with_aligned_columns() {
        let sessions = [listing("chat-0011aabb", "demo", 1_700_000_000_123), listing("s2", "researcher", 0)];
        assert_eq!(
            table(&sessions),
            "ID             AGENT       UPDATED\n\
             chat-0011aabb  demo        2023-11-14 22:13:20Z\n\
             s2             researcher  1970-01-01 00:00:00Z\n"
        );
        assert_eq!(table(&[]), "no sessions\n");
    }
}

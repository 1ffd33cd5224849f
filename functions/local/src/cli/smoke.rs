//! `turnstone smoke`: a deployment checked end to end, as a user meets it: the host answers,
//! a new session's turn runs to its end while its event stream shows it, and disposing the
//! session removes it. Each step prints how long it took; the first that fails ends the run
//! with an error naming the step.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use turnstone_engine::protocol::{ClientInput, ClientMessageInput, DraftMessage};
use turnstone_engine::session::TurnStatus;

use super::client::Client;
use super::{Global, SmokeArgs};

pub async fn run(global: &Global, args: SmokeArgs) -> anyhow::Result<()> {
    let api = Client::from_global(global)?;
    let stream_at = args.stream_url.as_deref().unwrap_or(&global.url);
    let streams = Client::new(stream_at, global.api_key.clone())?;
    let mut out = std::io::stdout().lock();
    smoke(&api, &streams, &args, &mut out).await
}

/// Runs the steps, writing one line per step to `out`.
pub async fn smoke(
    api: &Client,
    streams: &Client,
    args: &SmokeArgs,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let timeout = Duration::from_secs(args.timeout);
    let mut step = |name: &str, took: Duration| writeln!(out, "ok  {name:<40} {} ms", took.as_millis());

    let at = Instant::now();
    api.healthz().await.context("step `healthz`: the API does not answer")?;
    step("healthz", at.elapsed())?;

    let at = Instant::now();
    let session = api.create_session(&args.agent).await.context("step `create session`")?;
    step(&format!("create session {session}"), at.elapsed())?;

    let at = Instant::now();
    let mut stream = streams.stream(&session, 0, false).await.context("step `open the event stream`")?;
    step("open the event stream", at.elapsed())?;

    let at = Instant::now();
    let input = ClientInput::Message(ClientMessageInput {
        agent_id: args.agent.clone(),
        turn_id: None,
        message: DraftMessage::user(&args.message),
        stream: Some(true),
        client: None,
    });
    let submitted = api.post_input(&session, &input, false).await.context("step `submit a message`")?;
    let turn_id = submitted.turn_id.context("step `submit a message`: the server started no turn")?;
    step(&format!("submit a message (turn {turn_id})"), at.elapsed())?;

    let at = Instant::now();
    let ended = tokio::time::timeout(timeout, async {
        let mut after = 0;
        loop {
            while let Some(event) = stream.next().await {
                let event = event.context("the event stream broke")?;
                after = event.seq().unwrap_or(after);
                if event.event == "turn.ended" {
                    return Ok::<(), anyhow::Error>(());
                }
            }
            // A stream ends where its host cuts it (on `ApiUrl`, which buffers, as soon as it
            // has news): resume after the last event, as every SSE client does.
            tokio::time::sleep(Duration::from_millis(50)).await;
            stream =
                streams.stream(&session, after, true).await.context("the event stream did not reopen")?;
        }
    })
    .await;
    match ended {
        Ok(result) => result.context("step `the stream shows the turn end`")?,
        Err(_) => anyhow::bail!("step `the stream shows the turn end`: nothing within {} s", args.timeout),
    }
    drop(stream);
    step("the stream shows the turn end", at.elapsed())?;

    let at = Instant::now();
    let turn = api.turn(&session, &turn_id, 0).await.context("step `the turn completed`")?;
    if turn.status != TurnStatus::Completed {
        anyhow::bail!("step `the turn completed`: it ended {:?}: {:?}", turn.status, turn.error);
    }
    step("the turn completed", at.elapsed())?;

    let at = Instant::now();
    api.dispose(&session).await.context("step `dispose the session`")?;
    if api.summary(&session).await.context("step `dispose the session`")?.is_some() {
        anyhow::bail!("step `dispose the session`: {session} is still there");
    }
    step("dispose the session", at.elapsed())?;
    writeln!(out, "smoke test passed in {} ms", started.elapsed().as_millis())?;
    Ok(())
}

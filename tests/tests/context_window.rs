//! Sessions that outlive the model's context window (issue 40), against the strict fakes, which
//! refuse a request past their window with the providers' own errors: hundreds of turns through
//! a small window, a tool loop whose results fill it inside one turn, a request refused for its
//! length, and a message too large for any window. On the backend `TURNSTONE_TEST_BACKEND`
//! names (SQLite by default; `scripts/test` runs it on DynamoDB too).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use turnstone_engine::session::TurnStatus;
use turnstone_tests::{FakeServer, FakeToolCall, ModelFake, Reply, TestHost};

const PATIENCE: Duration = Duration::from_secs(30);

/// A host whose agent `a` talks to `provider`, with `agent_extra` in its section (a window,
/// compaction settings) and a client tool `fetch`.
async fn host(provider: &ModelFake, agent_extra: &str, dir: &std::path::Path) -> TestHost {
    let config = format!(
        r#"
[defaults]
llm = {{ timeout_secs = 20, max_retries = 1, backoff_base_secs = 0.05, backoff_max_secs = 0.2 }}

[llm.model]
type = "{kind}"
base_url = "{url}"
prices."{model}" = {{ input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 }}

[agent.a]
model = "{model}"
llm = "model"
system = "You are a careful assistant. Keep every fact the user gives you."
{agent_extra}

[[agent.a.tools]]
name = "fetch"
description = "Fetches a document."
handler = "client"
input = {{ type = "object", properties = {{ url = {{ type = "string" }} }} }}
"#,
        kind = provider.kind,
        url = provider.base_url,
        model = provider.model,
    );
    TestHost::start(&config, dir).await
}

fn message(text: &str) -> Value {
    json!({"type": "client.message", "agent_id": "a", "message": {"role": "user", "content": text}})
}

/// The session's `context.compacted` events' data.
async fn compactions(host: &TestHost, session: &str) -> Vec<Value> {
    host.events(session, 0)
        .await
        .into_iter()
        .filter(|e| e.event.get("type").and_then(Value::as_str) == Some("context_compacted"))
        .map(|e| e.event)
        .collect()
}

/// The input tokens of each request the fake took, as it counts them.
fn request_tokens(fake: &FakeServer) -> Vec<u64> {
    fake.requests().iter().map(|r| fake.input_tokens(&r.body)).collect()
}

/// `turns` turns of about 1,800 tokens each (a 3,000-character question, a 4,000-character
/// answer) through a `window`-token window; every turn completes, none is refused.
async fn many_turns(provider: ModelFake, window: u64, turns: usize) {
    let dir = tempfile::tempdir().unwrap();
    provider.fake.set_context_window(Some(window));
    provider.fake.set_default(Reply::filler(800));
    let host =
        host(&provider, &format!("context_window = {window}\nmax_output_tokens = 4096"), dir.path()).await;
    let session = "s-long";
    let mut last_turn = String::new();
    for turn in 0..turns {
        let text = format!("Fact {turn}: the code word is w{turn}. {}", "Some more context. ".repeat(160));
        last_turn = host.submit_ok(session, &message(&text)).await;
        let record = host.wait_turn_within(session, &last_turn, PATIENCE).await;
        assert_eq!(record.status, TurnStatus::Completed, "turn {turn}: {record:?}");
    }
    // The estimates build on what the provider reported: prompts past 8,192 tokens are
    // measured (a 40,000-token window's stay past it), smaller ones estimated whole.
    let (head, _) = host.app().load(session).await.unwrap();
    if window >= 40_000 {
        assert!(
            head.prompt_measure().is_some_and(|m| m.input_tokens >= 8_192),
            "{:?}",
            head.prompt_measure()
        );
    }
    let compacted = compactions(&host, session).await;
    assert!(compacted.len() >= turns / 20, "{} compactions in {turns} turns", compacted.len());
    for c in &compacted {
        assert_eq!(c["reason"], "threshold", "nothing was refused for its length: {c}");
        assert!(c["tokens_after"].as_u64() < c["tokens_before"].as_u64(), "{c}");
    }
    // No request the model was sent passed the window (the fake counts as it reports).
    let sizes = request_tokens(&provider.fake);
    assert!(sizes.iter().all(|&t| t < window), "largest request {:?}", sizes.iter().max());
    // Nothing is lost: the conversation holds every message, and the markers.
    let messages = host.messages(session).await;
    let users = messages.iter().filter(|m| m["role"] == "user").count();
    assert_eq!(users, turns);
    let markers = messages.iter().filter(|m| m.get("compaction").is_some()).count();
    assert_eq!(markers, compacted.len());
    // The compactions' calls are billed to the session.
    let summary = host.summary(session).await;
    let summaries = compacted.iter().filter(|c| c["kind"] == "summary").count() as u64;
    assert_eq!(summary.usage.llm_calls, turns as u64 + summaries);
    // A fork through the last turn keeps the compacted view: its next request sends the
    // summary, not the session's first facts, and fits.
    let (status, body) = host
        .post(
            &format!("/v1/sessions/{session}/forks"),
            &json!({"turn_id": last_turn, "session_id": "s-fork"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let turn_id = host.submit_ok("s-fork", &message("And on this branch?")).await;
    assert_eq!(host.wait_turn_within("s-fork", &turn_id, PATIENCE).await.status, TurnStatus::Completed);
    let forked = provider.fake.last_request().body.to_string();
    assert!(
        forked.contains("compacted to fit the context window") && !forked.contains("Fact 0:"),
        "{}",
        forked.len()
    );
    assert!(provider.fake.input_tokens(&provider.fake.last_request().body) < window);
    eprintln!(
        "{turns} turns through a {window}-token window ({}): {} compactions ({summaries} summaries), largest \
         request {} tokens, {} model calls, ${}",
        provider.kind,
        compacted.len(),
        sizes.iter().max().unwrap(),
        summary.usage.llm_calls,
        summary.usage.cost
    );
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_turns_through_a_40k_window_on_anthropic() {
    many_turns(ModelFake::anthropic().await, 40_000, 200).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_turns_through_a_20k_window_on_chat_completions() {
    many_turns(ModelFake::chat_completions().await, 20_000, 60).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_turns_through_a_20k_window_on_the_responses_api() {
    many_turns(ModelFake::responses().await, 20_000, 60).await;
}

/// One turn of 30 tool calls whose results take 5,000 tokens each, through a 40k window: old
/// results are cleared (their calls stay), then the oldest steps summarized, inside the turn.
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_loop_with_large_results_stays_within_the_window() {
    let provider = ModelFake::anthropic().await;
    let dir = tempfile::tempdir().unwrap();
    provider.fake.set_context_window(Some(40_000));
    provider.fake.set_default(Reply::filler(200));
    const STEPS: usize = 30;
    for step in 0..STEPS {
        provider.fake.push(Reply::tool_calls([FakeToolCall::new(
            format!("call_{step}"),
            "fetch",
            format!(r#"{{"url":"https://example.com/{step}"}}"#),
        )]));
    }
    let host = host(&provider, "context_window = 40000\nmax_output_tokens = 4096", dir.path()).await;
    let session = "s-tools";
    let turn_id = host.submit_ok(session, &message("Read the 30 documents.")).await;
    for step in 0..STEPS {
        let calls = host.wait_summary(session, PATIENCE, |s| !s.pending_client_calls.is_empty()).await;
        let id = calls.pending_client_calls[0].id.clone();
        let document = format!("Document {step}. {}", "lorem ipsum dolor sit amet ".repeat(740));
        let (status, body) =
            host.submit(session, &json!({"type": "tool.result", "id": id, "result": document})).await;
        assert_eq!(status, 202, "step {step}: {body}");
    }
    let turn = host.wait_turn_within(session, &turn_id, PATIENCE).await;
    assert_eq!(turn.status, TurnStatus::Completed, "{turn:?}");
    let compacted = compactions(&host, session).await;
    assert!(compacted.iter().any(|c| c["kind"] == "cleared_tool_results"), "{compacted:?}");
    let sizes = request_tokens(&provider.fake);
    assert!(sizes.iter().all(|&t| t < 40_000), "largest request {:?}", sizes.iter().max());
    // The log keeps every result whole.
    let results = host.messages(session).await.into_iter().filter(|m| m["role"] == "tool").count();
    assert_eq!(results, STEPS);
    host.stop().await;
}

/// A configuration that promises more than the model takes: the provider refuses the request
/// for its length, the engine compacts and sends it again, and the turn completes.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_refused_for_its_length_is_compacted_and_sent_again() {
    for provider in
        [ModelFake::anthropic().await, ModelFake::chat_completions().await, ModelFake::responses().await]
    {
        let dir = tempfile::tempdir().unwrap();
        provider.fake.set_default(Reply::filler(300));
        // The agent believes in 200,000 tokens; the model takes 12,000.
        let host = host(&provider, "context_window = 200000\nmax_output_tokens = 1024", dir.path()).await;
        let session = "s-refused";
        for turn in 0..6 {
            let text = format!("Part {turn}. {}", "Context that matters. ".repeat(400));
            let turn_id = host.submit_ok(session, &message(&text)).await;
            let record = host.wait_turn_within(session, &turn_id, PATIENCE).await;
            assert_eq!(record.status, TurnStatus::Completed, "{}: turn {turn}: {record:?}", provider.kind);
            if turn == 2 {
                provider.fake.set_context_window(Some(12_000));
            }
        }
        let compacted = compactions(&host, session).await;
        assert!(compacted.iter().any(|c| c["reason"] == "refused"), "{}: {compacted:?}", provider.kind);
        host.stop().await;
    }
}

/// A message larger than the window fails its turn saying so; the session stays usable.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_larger_than_the_window_fails_its_turn_and_the_session_goes_on() {
    let provider = ModelFake::anthropic().await;
    let dir = tempfile::tempdir().unwrap();
    provider.fake.set_context_window(Some(20_000));
    provider.fake.set_default(Reply::filler(100));
    let host = host(&provider, "context_window = 20000\nmax_output_tokens = 2048", dir.path()).await;
    let session = "s-huge";
    let turn_id = host.submit_ok(session, &message("Hello.")).await;
    assert_eq!(host.wait_turn_within(session, &turn_id, PATIENCE).await.status, TurnStatus::Completed);
    let sent = provider.fake.request_count();
    let huge = "x ".repeat(60_000);
    let turn_id = host.submit_ok(session, &message(&huge)).await;
    let failed = host.wait_turn_within(session, &turn_id, PATIENCE).await;
    assert_eq!(failed.status, TurnStatus::Failed, "{failed:?}");
    let error = failed.error.clone().unwrap_or_default();
    assert!(error.contains("does not fit the model's context window"), "{error}");
    assert_eq!(provider.fake.request_count(), sent, "nothing the model would refuse was sent");
    // The next turn compacts the huge message away and is answered.
    let turn_id = host.submit_ok(session, &message("Shorter, then.")).await;
    let next = host.wait_turn_within(session, &turn_id, PATIENCE).await;
    assert_eq!(next.status, TurnStatus::Completed, "{next:?}");
    assert!(request_tokens(&provider.fake).iter().all(|&t| t < 20_000));
    host.stop().await;
}

/// An agent with a worker that accepts the engine's proposals: the `llm.call`s it asks the
/// engine to run are compacted like an engine-hosted agent's, and its `messages` are the whole
/// active path, the compaction markers among them.
#[tokio::test(flavor = "multi_thread")]
async fn a_workers_model_calls_are_compacted_and_it_sees_the_markers() {
    let provider = ModelFake::anthropic().await;
    let dir = tempfile::tempdir().unwrap();
    provider.fake.set_context_window(Some(20_000));
    provider.fake.set_default(Reply::filler(400));
    let worker = turnstone_tests::FakeWorker::accept_all(None).await;
    let extra = format!("context_window = 20000\nmax_output_tokens = 2048\nworker = \"{}\"", worker.url());
    let host = host(&provider, &extra, dir.path()).await;
    let session = "s-worker";
    for turn in 0..30 {
        let text = format!("Item {turn}. {}", "Details to keep. ".repeat(120));
        let turn_id = host.submit_ok(session, &message(&text)).await;
        let record = host.wait_turn_within(session, &turn_id, PATIENCE).await;
        assert_eq!(record.status, TurnStatus::Completed, "turn {turn}: {record:?}");
    }
    let compacted = compactions(&host, session).await;
    assert!(!compacted.is_empty());
    assert!(request_tokens(&provider.fake).iter().all(|&t| t < 20_000));
    let last = worker.records().last().unwrap().request.clone();
    let markers = last.messages.iter().filter(|m| m.compaction.is_some()).count();
    assert_eq!(markers, compacted.len(), "the worker sees every marker on the active path");
    assert!(last.messages.iter().any(|m| m.content_text().starts_with("Item 0.")), "and every message");
    host.stop().await;
}

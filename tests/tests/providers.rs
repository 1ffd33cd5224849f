//! The model providers over real HTTP against the fake OpenAI and Anthropic servers, and the
//! scripted model's rules.

// The helpers are test code too: a failure there must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstone_engine::protocol::{
    CacheTtl, Content, ContentPart, DraftMessage, Effort, ErrorCode, LlmRequest, LlmResponse, LlmTool,
    PromptCache, ReasoningConfig, Role, StreamDelta, ToolCall,
};
use turnstone_runtime::llm::{
    AnthropicProvider, ModelProvider, OpenAiProvider, ProviderError, ProviderKind, ProviderSetupError,
    ScriptedProvider, provider_for,
};
use turnstone_tests::{FakeAnthropic, FakeOpenAi, FakeToolCall, Reply};

const OPENAI_KEY: &str = "sk-test-openai-0123456789";
const ANTHROPIC_KEY: &str = "sk-ant-test-0123456789";
const PLENTY: Option<Duration> = Some(Duration::from_secs(10));

// ---------------------------------------------------------------------------------------------
// Helpers

fn weather_tool() -> LlmTool {
    LlmTool {
        name: "get_weather".into(),
        description: "Current weather".into(),
        input: Some(
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        ),
        output: None,
    }
}

fn time_tool() -> LlmTool {
    LlmTool { name: "get_time".into(), description: "Current time".into(), input: None, output: None }
}

/// A conversation with a system prompt, an earlier tool round trip and a new question.
fn request(model: &str) -> LlmRequest {
    let assistant = DraftMessage {
        id: None,
        role: Role::Assistant,
        content: None,
        tool_calls: Some(vec![ToolCall::function("call_prev", "get_weather", r#"{"city":"Paris"}"#)]),
        tool_call_id: None,
        name: None,
        provider_blocks: None,
    };
    LlmRequest {
        model: model.into(),
        messages: vec![
            DraftMessage::text(Role::System, "You are terse."),
            DraftMessage::user("What's the weather in Paris?"),
            assistant,
            DraftMessage::tool_result("call_prev", "get_weather", "18C, sunny"),
            DraftMessage::user("And in Rome?"),
        ]
        .into_iter()
        .map(Arc::new)
        .collect(),
        tools: Some(vec![weather_tool(), time_tool()]),
        temperature: Some(0.5),
        max_completion_tokens: Some(256),
        reasoning: None,
        cache: None,
        thinking_form: None,
    }
}

fn openai_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "Current time",
            "parameters": {"type": "object", "properties": {}}}}
    ])
}

fn expected_openai_body(stream: bool) -> Value {
    let mut body = json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "tool_calls": [
                {"id": "call_prev", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
            ]},
            {"role": "tool", "content": "18C, sunny", "tool_call_id": "call_prev", "name": "get_weather"},
            {"role": "user", "content": "And in Rome?"}
        ],
        "tools": openai_tools(),
        "temperature": 0.5,
        "max_completion_tokens": 256
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn expected_anthropic_body(stream: bool) -> Value {
    let mut body = json!({
        "model": "claude-test",
        "max_tokens": 256,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_prev", "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_prev", "content": "18C, sunny"}
            ]},
            {"role": "user", "content": "And in Rome?"}
        ],
        "tools": [
            {"name": "get_weather", "description": "Current weather",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            {"name": "get_time", "description": "Current time",
             "input_schema": {"type": "object", "properties": {}}}
        ],
        "temperature": 0.5
    });
    if stream {
        body["stream"] = json!(true);
    }
    body
}

fn openai(fake: &FakeOpenAi) -> OpenAiProvider {
    OpenAiProvider::new(&fake.base_url(), Some(OPENAI_KEY.into())).unwrap()
}

fn anthropic(fake: &FakeAnthropic) -> AnthropicProvider {
    AnthropicProvider::new(&fake.base_url(), Some(ANTHROPIC_KEY.into())).unwrap()
}

/// Runs one call, collecting the deltas.
async fn run(
    provider: &dyn ModelProvider,
    request: &LlmRequest,
    stream: bool,
    timeout: Option<Duration>,
) -> (Result<LlmResponse, ProviderError>, Vec<StreamDelta>) {
    let mut deltas = Vec::new();
    let result = provider.complete(request, stream, timeout, &mut |d| deltas.push(d)).await;
    (result, deltas)
}

fn text_of(deltas: &[StreamDelta]) -> String {
    deltas.iter().filter_map(|d| d.text.as_deref()).collect()
}

/// The argument fragments streamed for `id`, joined, and the names announced for it.
fn streamed_call(deltas: &[StreamDelta], id: &str) -> (Vec<String>, String, usize) {
    let mut names = Vec::new();
    let mut arguments = String::new();
    let mut fragments = 0;
    for fragment in deltas.iter().flat_map(|d| d.tool_calls.iter().flatten()).filter(|f| f.id == id) {
        names.extend(fragment.name.clone());
        if let Some(more) = &fragment.arguments {
            arguments.push_str(more);
            fragments += 1;
        }
    }
    (names, arguments, fragments)
}

fn assert_error(err: &ProviderError, code: ErrorCode, retryable: bool) {
    assert_eq!((err.code, err.retryable, err.is_retryable()), (code, retryable, retryable), "{err:?}");
}

fn parallel_calls() -> Vec<FakeToolCall> {
    vec![
        FakeToolCall::new("call_a1", "get_weather", r#"{"city":"Rome","unit":"celsius"}"#),
        FakeToolCall::new("call_b2", "get_time", r#"{"zone":"Europe/Rome"}"#),
    ]
}

// ---------------------------------------------------------------------------------------------
// OpenAI

#[tokio::test]
async fn openai_plain_answer_and_wire_request() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("It is 21C in Rome.").usage(40, 7));
    let (result, deltas) = run(&openai(&fake), &request("gpt-4o-mini"), false, PLENTY).await;
    let answer = result.unwrap();
    assert_eq!(answer.model, "gpt-4o-mini");
    assert_eq!(answer.content.as_deref(), Some("It is 21C in Rome."));
    assert_eq!(answer.tool_calls, None);
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert_eq!(answer.usage.as_ref().unwrap()["prompt_tokens"], 40);
    assert_eq!(answer.usage.as_ref().unwrap()["completion_tokens"], 7);
    assert!(deltas.is_empty(), "no deltas without streaming");

    let seen = fake.last_request();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/v1/chat/completions");
    assert_eq!(seen.body, expected_openai_body(false));
    assert_eq!(seen.header("authorization").as_deref(), Some(&*format!("Bearer {OPENAI_KEY}")));
    assert_eq!(seen.header("content-type").as_deref(), Some("application/json"));
    assert_eq!(seen.header("accept").as_deref(), Some("application/json"));
    assert!(seen.header("x-api-key").is_none());
}

#[tokio::test]
async fn openai_streaming_answer_and_wire_request() {
    let fake = FakeOpenAi::start().await;
    let text = "Rome is sunny today, 21 degrees.";
    fake.push(Reply::text(text));
    let (result, deltas) = run(&openai(&fake), &request("gpt-4o-mini"), true, PLENTY).await;
    let answer = result.unwrap();
    assert_eq!(answer.content.as_deref(), Some(text));
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert!(answer.usage.as_ref().unwrap()["total_tokens"].as_u64().unwrap() > 0, "the usage chunk was read");
    // One delta per word, in order, then the finish reason.
    let texts: Vec<&str> = deltas.iter().filter_map(|d| d.text.as_deref()).collect();
    assert_eq!(texts, vec!["Rome", " is", " sunny", " today,", " 21", " degrees."]);
    assert_eq!(text_of(&deltas), text);
    assert_eq!(deltas.last().unwrap().finish_reason.as_deref(), Some("stop"));

    let seen = fake.last_request();
    assert_eq!(seen.body, expected_openai_body(true));
    assert_eq!(seen.header("accept").as_deref(), Some("text/event-stream"));
    assert_eq!(seen.header("authorization").as_deref(), Some(&*format!("Bearer {OPENAI_KEY}")));
}

#[tokio::test]
async fn openai_stream_is_read_as_it_arrives() {
    let fake = FakeOpenAi::start().await;
    // The fake stops after the first word until the client has handed a delta on: a client
    // that waited for the whole body would never get there.
    fake.push(Reply::text("first second third").pause_after(2));
    let provider = openai(&fake);
    let gate = fake.gate();
    let mut deltas = Vec::new();
    let req = request("gpt-4o-mini");
    let mut on_delta = |d: StreamDelta| {
        gate.notify_one();
        deltas.push(d);
    };
    let call = provider.complete(&req, true, PLENTY, &mut on_delta);
    let answer =
        tokio::time::timeout(Duration::from_secs(5), call).await.expect("the stream was read live").unwrap();
    assert_eq!(answer.content.as_deref(), Some("first second third"));
    assert_eq!(text_of(&deltas), "first second third");
}

#[tokio::test]
async fn openai_parallel_tool_calls_streamed_in_fragments() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::tool_calls(parallel_calls()).fragment_chars(5));
    let (result, deltas) = run(&openai(&fake), &request("gpt-4o-mini"), true, PLENTY).await;
    let answer = result.unwrap();
    assert_eq!(answer.content, None);
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    let expected: Vec<ToolCall> =
        parallel_calls().into_iter().map(|c| ToolCall::function(c.id, c.name, c.arguments)).collect();
    assert_eq!(answer.tool_calls.as_deref(), Some(expected.as_slice()));
    for call in parallel_calls() {
        let (names, arguments, fragments) = streamed_call(&deltas, &call.id);
        assert_eq!(names, vec![call.name.clone()], "the name arrives once");
        assert_eq!(arguments, call.arguments);
        assert!(fragments >= 3, "{} arrived in {fragments} fragments", call.id);
    }
    // The first call is complete before the second starts.
    let order: Vec<&str> =
        deltas.iter().flat_map(|d| d.tool_calls.iter().flatten()).map(|f| f.id.as_str()).collect();
    let first_b = order.iter().position(|id| *id == "call_b2").unwrap();
    assert!(order[..first_b].iter().all(|id| *id == "call_a1"));
    assert_eq!(deltas.last().unwrap().finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn openai_parallel_tool_calls_without_streaming() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text_and_tool_calls("Checking.", parallel_calls()));
    let (result, _) = run(&openai(&fake), &request("gpt-4o-mini"), false, PLENTY).await;
    let answer = result.unwrap();
    assert_eq!(answer.content.as_deref(), Some("Checking."));
    let calls = answer.tool_calls.unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0], ToolCall::function("call_a1", "get_weather", r#"{"city":"Rome","unit":"celsius"}"#));
    assert_eq!(calls[1], ToolCall::function("call_b2", "get_time", r#"{"zone":"Europe/Rome"}"#));
}

#[tokio::test]
async fn openai_429_is_rate_limited_and_retryable() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::error(429, "Rate limit reached for gpt-4o-mini").header("retry-after", "7"));
    let (result, _) = run(&openai(&fake), &request("gpt-4o-mini"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::RateLimited, true);
    assert_eq!(err.message, "openai answered HTTP 429: Rate limit reached for gpt-4o-mini");
    let detail = err.detail.clone().unwrap();
    assert_eq!(detail["status"], 429);
    assert_eq!(detail["retry_after_secs"], 7);
    assert_eq!(detail["provider"], "openai");
    let call_error = err.into_call_error();
    assert_eq!(call_error.code, Some(ErrorCode::RateLimited));
    assert!(call_error.retryable);
}

#[tokio::test]
async fn openai_5xx_is_retryable() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::error(500, "The server had an error while processing your request."));
    fake.push(Reply::error(503, "The engine is currently overloaded."));
    let provider = openai(&fake);
    for status in [500, 503] {
        let (result, _) = run(&provider, &request("gpt-4o-mini"), false, PLENTY).await;
        let err = result.unwrap_err();
        assert_error(&err, ErrorCode::ProviderError, true);
        assert!(err.message.starts_with(&format!("openai answered HTTP {status}: The")), "{}", err.message);
    }
}

#[tokio::test]
async fn openai_400_is_terminal_with_the_provider_message_and_never_the_key() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::error(400, format!("Invalid 'messages[4]': bad things (key {OPENAI_KEY})")));
    fake.push(Reply::error(401, format!("Incorrect API key provided: {OPENAI_KEY}.")));
    let provider = openai(&fake);
    let (result, _) = run(&provider, &request("gpt-4o-mini"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert!(err.message.contains("HTTP 400"), "{}", err.message);
    assert!(err.message.contains("Invalid 'messages[4]': bad things"), "{}", err.message);
    let (result, _) = run(&provider, &request("gpt-4o-mini"), false, PLENTY).await;
    let err401 = result.unwrap_err();
    assert_error(&err401, ErrorCode::ProviderError, false);
    for text in [format!("{err:?}"), format!("{err401:?}"), format!("{provider:?}")] {
        assert!(!text.contains(OPENAI_KEY), "the key leaked: {text}");
    }
    assert!(err401.message.contains("[redacted]"));
}

#[tokio::test]
async fn openai_long_provider_messages_are_shortened() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::error(422, "x".repeat(5000)));
    let (result, _) = run(&openai(&fake), &request("gpt-4o-mini"), false, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert!(err.message.chars().count() < 340, "{} chars", err.message.chars().count());
}

#[tokio::test]
async fn openai_timeout_is_deadline_exceeded() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("too late").delay(Duration::from_secs(3)));
    let started = Instant::now();
    let (result, _) =
        run(&openai(&fake), &request("gpt-4o-mini"), false, Some(Duration::from_millis(200))).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::DeadlineExceeded, true);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(err.message, "openai did not answer within 0.200s");
}

#[tokio::test]
async fn openai_stalled_stream_is_deadline_exceeded() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("one two three").pause_after(2));
    let (result, deltas) =
        run(&openai(&fake), &request("gpt-4o-mini"), true, Some(Duration::from_millis(300))).await;
    assert_error(&result.unwrap_err(), ErrorCode::DeadlineExceeded, true);
    assert_eq!(text_of(&deltas), "one", "what arrived before the stall was forwarded");
}

#[tokio::test]
async fn openai_cut_stream_is_retryable() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("one two three four").cut_after(3));
    let (result, deltas) = run(&openai(&fake), &request("gpt-4o-mini"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, true);
    assert!(err.message.contains("broke off"), "{}", err.message);
    assert_eq!(text_of(&deltas), "one two");
}

#[tokio::test]
async fn openai_stream_ending_early_is_retryable() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::tool_calls(parallel_calls()).end_after(4));
    let (result, _) = run(&openai(&fake), &request("gpt-4o-mini"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, true);
    assert!(err.message.contains("ended before a finish_reason"), "{}", err.message);
}

#[tokio::test]
async fn openai_error_event_midway() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("one two three").error_after(2, "server_error", "upstream failed"));
    fake.push(Reply::text("one two three").error_after(2, "invalid_request_error", "bad input"));
    let provider = openai(&fake);
    let (result, _) = run(&provider, &request("gpt-4o-mini"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, true);
    assert_eq!(err.message, "openai reported an error: upstream failed");
    let (result, _) = run(&provider, &request("gpt-4o-mini"), true, PLENTY).await;
    assert_error(&result.unwrap_err(), ErrorCode::ProviderError, false);
}

#[tokio::test]
async fn openai_unparseable_body_is_terminal_and_names_the_field() {
    let fake = FakeOpenAi::start().await;
    let wrong =
        json!({"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": 5}}]});
    fake.push(Reply::raw(200, "application/json", wrong.to_string()));
    fake.push(Reply::raw(200, "application/json", "<html>nope</html>"));
    fake.push(Reply::raw(200, "text/event-stream", "data: {\"model\":\"m\",\"choices\":7}\n\n"));
    let provider = openai(&fake);
    let (result, _) = run(&provider, &request("gpt-4o-mini"), false, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert!(err.message.contains("choices[0].message.content"), "{}", err.message);
    let (result, _) = run(&provider, &request("gpt-4o-mini"), false, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert!(err.message.contains("not JSON") && !err.message.contains("nope"), "{}", err.message);
    let (result, _) = run(&provider, &request("gpt-4o-mini"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert!(err.message.contains("choices"), "{}", err.message);
}

#[tokio::test]
async fn openai_json_answer_to_a_stream_request_is_one_delta() {
    let fake = FakeOpenAi::start().await;
    let body = json!({
        "id": "x", "object": "chat.completion", "model": "local-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "whole answer"}, "finish_reason": "stop"}]
    });
    fake.push(Reply::raw(200, "application/json", body.to_string()));
    let (result, deltas) = run(&openai(&fake), &request("gpt-4o-mini"), true, PLENTY).await;
    assert_eq!(result.unwrap().content.as_deref(), Some("whole answer"));
    assert_eq!(deltas.len(), 1);
    assert_eq!(deltas[0].text.as_deref(), Some("whole answer"));
    assert_eq!(deltas[0].finish_reason.as_deref(), Some("stop"));
}

#[tokio::test]
async fn openai_compatible_server_without_key_and_with_extra_headers() {
    let fake = FakeOpenAi::start().await;
    let provider = OpenAiProvider::new(&format!("{}/", fake.base_url()), None)
        .unwrap()
        .with_header("OpenAI-Organization", "org-123")
        .unwrap();
    assert_eq!(provider.url(), format!("{}/chat/completions", fake.base_url()));
    let (result, _) = run(&provider, &request("local"), false, PLENTY).await;
    assert_eq!(result.unwrap().content.as_deref(), Some("ok"));
    let seen = fake.last_request();
    assert!(seen.header("authorization").is_none());
    assert_eq!(seen.header("openai-organization").as_deref(), Some("org-123"));
    // An empty key counts as none.
    let provider = OpenAiProvider::new(&fake.base_url(), Some(String::new())).unwrap();
    run(&provider, &request("local"), false, PLENTY).await.0.unwrap();
    assert!(fake.last_request().header("authorization").is_none());
}

#[tokio::test]
async fn openai_connection_refused_is_retryable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let provider =
        OpenAiProvider::new(&format!("http://127.0.0.1:{port}/v1"), Some(OPENAI_KEY.into())).unwrap();
    let (result, _) = run(&provider, &request("gpt-4o-mini"), false, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, true);
    assert!(err.message.starts_with("could not reach openai"), "{}", err.message);
    assert!(!err.message.contains(OPENAI_KEY));
}

// ---------------------------------------------------------------------------------------------
// Anthropic

#[tokio::test]
async fn anthropic_plain_answer_and_wire_request() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text("21C in Rome.").usage(30, 5));
    let (result, deltas) = run(&anthropic(&fake), &request("claude-test"), false, PLENTY).await;
    let answer = result.unwrap();
    assert_eq!(answer.model, "claude-test");
    assert_eq!(answer.content.as_deref(), Some("21C in Rome."));
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert_eq!(answer.usage.as_ref().unwrap()["input_tokens"], 30);
    assert_eq!(answer.usage.as_ref().unwrap()["output_tokens"], 5);
    assert!(deltas.is_empty());

    let seen = fake.last_request();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/v1/messages");
    assert_eq!(seen.body, expected_anthropic_body(false));
    assert_eq!(seen.header("x-api-key").as_deref(), Some(ANTHROPIC_KEY));
    assert_eq!(seen.header("anthropic-version").as_deref(), Some("2023-06-01"));
    assert_eq!(seen.header("content-type").as_deref(), Some("application/json"));
    assert!(seen.header("authorization").is_none());
}

#[tokio::test]
async fn anthropic_streaming_answer_and_wire_request() {
    let fake = FakeAnthropic::start().await;
    let text = "Rome is sunny today, 21 degrees.";
    fake.push(Reply::text(text).usage(30, 9));
    let (result, deltas) = run(&anthropic(&fake), &request("claude-test"), true, PLENTY).await;
    let answer = result.unwrap();
    assert_eq!(answer.content.as_deref(), Some(text));
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert_eq!(answer.usage.as_ref().unwrap()["input_tokens"], 30);
    assert_eq!(answer.usage.as_ref().unwrap()["output_tokens"], 9, "message_delta's usage wins");
    let texts: Vec<&str> = deltas.iter().filter_map(|d| d.text.as_deref()).collect();
    assert_eq!(texts, vec!["Rome", " is", " sunny", " today,", " 21", " degrees."]);
    assert_eq!(text_of(&deltas), text);
    assert_eq!(deltas.last().unwrap().finish_reason.as_deref(), Some("stop"));

    let seen = fake.last_request();
    assert_eq!(seen.body, expected_anthropic_body(true));
    assert_eq!(seen.header("accept").as_deref(), Some("text/event-stream"));
    assert_eq!(seen.header("x-api-key").as_deref(), Some(ANTHROPIC_KEY));
}

#[tokio::test]
async fn anthropic_stream_is_read_as_it_arrives() {
    let fake = FakeAnthropic::start().await;
    // message_start, content_block_start, ping, the first word: then wait for the client.
    fake.push(Reply::text("first second third").pause_after(4));
    let provider = anthropic(&fake);
    let gate = fake.gate();
    let mut deltas = Vec::new();
    let req = request("claude-test");
    let mut on_delta = |d: StreamDelta| {
        gate.notify_one();
        deltas.push(d);
    };
    let call = provider.complete(&req, true, PLENTY, &mut on_delta);
    let answer =
        tokio::time::timeout(Duration::from_secs(5), call).await.expect("the stream was read live").unwrap();
    assert_eq!(answer.content.as_deref(), Some("first second third"));
}

#[tokio::test]
async fn anthropic_parallel_tool_calls_streamed_in_fragments() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text_and_tool_calls("Let me check.", parallel_calls()).fragment_chars(4));
    let (result, deltas) = run(&anthropic(&fake), &request("claude-test"), true, PLENTY).await;
    let answer = result.unwrap();
    assert_eq!(answer.content.as_deref(), Some("Let me check."));
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    let expected: Vec<ToolCall> =
        parallel_calls().into_iter().map(|c| ToolCall::function(c.id, c.name, c.arguments)).collect();
    assert_eq!(answer.tool_calls.as_deref(), Some(expected.as_slice()));
    for call in parallel_calls() {
        let (names, arguments, fragments) = streamed_call(&deltas, &call.id);
        assert_eq!(names, vec![call.name.clone()]);
        assert_eq!(arguments, call.arguments);
        assert!(fragments >= 3, "{} arrived in {fragments} fragments", call.id);
    }
    assert_eq!(text_of(&deltas), "Let me check.");
}

#[tokio::test]
async fn anthropic_tool_calls_without_streaming() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::tool_calls(parallel_calls()));
    let (result, _) = run(&anthropic(&fake), &request("claude-test"), false, PLENTY).await;
    let answer = result.unwrap();
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    let calls = answer.tool_calls.unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].id, "call_a1");
    let args: Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
    assert_eq!(args, json!({"city": "Rome", "unit": "celsius"}));
}

#[tokio::test]
async fn anthropic_429_is_rate_limited_and_retryable() {
    let fake = FakeAnthropic::start().await;
    fake.push(
        Reply::error(429, "Number of request tokens has exceeded your rate limit.")
            .header("retry-after", "12"),
    );
    let (result, _) = run(&anthropic(&fake), &request("claude-test"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::RateLimited, true);
    assert!(
        err.message.starts_with("anthropic answered HTTP 429: Number of request tokens"),
        "{}",
        err.message
    );
    let detail = err.detail.unwrap();
    assert_eq!(detail["type"], "rate_limit_error");
    assert_eq!(detail["retry_after_secs"], 12);
}

#[tokio::test]
async fn anthropic_500_and_529_overloaded_are_retryable() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::error(500, "Internal server error"));
    fake.push(Reply::error(529, "Overloaded"));
    let provider = anthropic(&fake);
    for status in [500, 529] {
        let (result, _) = run(&provider, &request("claude-test"), false, PLENTY).await;
        let err = result.unwrap_err();
        assert_error(&err, ErrorCode::ProviderError, true);
        assert!(err.message.contains(&format!("HTTP {status}")), "{}", err.message);
    }
}

#[tokio::test]
async fn anthropic_400_is_terminal_with_the_provider_message_and_never_the_key() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::error(400, format!("messages.1.content: bad block (x-api-key {ANTHROPIC_KEY})")));
    fake.push(Reply::error(401, "invalid x-api-key"));
    let provider = anthropic(&fake);
    let (result, _) = run(&provider, &request("claude-test"), false, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert!(err.message.contains("HTTP 400") && err.message.contains("messages.1.content: bad block"));
    assert!(!format!("{err:?}").contains(ANTHROPIC_KEY));
    assert!(!format!("{provider:?}").contains(ANTHROPIC_KEY));
    let (result, _) = run(&provider, &request("claude-test"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert_eq!(err.detail.unwrap()["type"], "authentication_error");
}

#[tokio::test]
async fn anthropic_timeout_is_deadline_exceeded() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text("too late").delay(Duration::from_secs(3)));
    let started = Instant::now();
    let (result, _) =
        run(&anthropic(&fake), &request("claude-test"), true, Some(Duration::from_millis(200))).await;
    assert_error(&result.unwrap_err(), ErrorCode::DeadlineExceeded, true);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn anthropic_cut_and_early_ended_streams_are_retryable() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text("one two three four").cut_after(5));
    fake.push(Reply::tool_calls(parallel_calls()).end_after(6));
    let provider = anthropic(&fake);
    let (result, deltas) = run(&provider, &request("claude-test"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, true);
    assert!(err.message.contains("broke off"), "{}", err.message);
    assert_eq!(text_of(&deltas), "one two");
    let (result, _) = run(&provider, &request("claude-test"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, true);
    assert!(err.message.contains("message_stop"), "{}", err.message);
}

#[tokio::test]
async fn anthropic_error_event_midway() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text("one two three").error_after(4, "overloaded_error", "Overloaded"));
    fake.push(Reply::text("one two three").error_after(4, "rate_limit_error", "Slow down"));
    fake.push(Reply::text("one two three").error_after(4, "invalid_request_error", "Bad"));
    let provider = anthropic(&fake);
    let (result, _) = run(&provider, &request("claude-test"), true, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, true);
    assert_eq!(err.message, "anthropic reported an error: Overloaded");
    let (result, _) = run(&provider, &request("claude-test"), true, PLENTY).await;
    assert_error(&result.unwrap_err(), ErrorCode::RateLimited, true);
    let (result, _) = run(&provider, &request("claude-test"), true, PLENTY).await;
    assert_error(&result.unwrap_err(), ErrorCode::ProviderError, false);
}

#[tokio::test]
async fn anthropic_unparseable_body_is_terminal_and_names_the_field() {
    let fake = FakeAnthropic::start().await;
    let wrong =
        json!({"type": "message", "model": "m", "content": [{"type": "tool_use", "id": "t", "name": 3}]});
    fake.push(Reply::raw(200, "application/json", wrong.to_string()));
    let (result, _) = run(&anthropic(&fake), &request("claude-test"), false, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert!(err.message.contains("content[0].name"), "{}", err.message);
}

#[tokio::test]
async fn anthropic_request_it_cannot_carry_fails_before_sending() {
    let fake = FakeAnthropic::start().await;
    let mut req = request("claude-test");
    req.messages.push(Arc::new(DraftMessage {
        content: Some(Content::Parts(vec![ContentPart::VideoUrl {
            video_url: turnstone_engine::protocol::UrlRef { url: "https://v/x.mp4".into() },
        }])),
        ..DraftMessage::user("")
    }));
    let (result, _) = run(&anthropic(&fake), &req, false, PLENTY).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert!(err.message.contains("messages[5].content[0]"), "{}", err.message);
    assert_eq!(fake.request_count(), 0);
}

#[tokio::test]
async fn anthropic_base_url_forms() {
    let fake = FakeAnthropic::start().await;
    for base in [fake.base_url(), format!("{}/", fake.base_url()), format!("{}/v1", fake.base_url())] {
        let provider = AnthropicProvider::new(&base, Some(ANTHROPIC_KEY.into())).unwrap();
        assert_eq!(provider.url(), format!("{}/v1/messages", fake.base_url()));
    }
    let provider =
        AnthropicProvider::new(&fake.base_url(), None).unwrap().with_header("anthropic-beta", "x").unwrap();
    run(&provider, &request("claude-test"), false, PLENTY).await.0.unwrap();
    let seen = fake.last_request();
    assert!(seen.header("x-api-key").is_none());
    assert_eq!(seen.header("anthropic-beta").as_deref(), Some("x"));
    assert_eq!(seen.header("anthropic-version").as_deref(), Some("2023-06-01"));
}

#[tokio::test]
async fn finished_streams_leave_their_connection_reusable() {
    let openai_fake = FakeOpenAi::start().await;
    let anthropic_fake = FakeAnthropic::start().await;
    let openai = openai(&openai_fake);
    let anthropic = anthropic(&anthropic_fake);
    for stream in [true, false, true, true] {
        run(&openai, &request("gpt-4o-mini"), stream, PLENTY).await.0.unwrap();
        run(&anthropic, &request("claude-test"), stream, PLENTY).await.0.unwrap();
    }
    assert_eq!(openai_fake.connection_count(), 1);
    assert_eq!(anthropic_fake.connection_count(), 1);
}

// ---------------------------------------------------------------------------------------------
// Factory

#[tokio::test]
async fn provider_for_builds_each_kind() {
    let openai_fake = FakeOpenAi::start().await;
    let anthropic_fake = FakeAnthropic::start().await;
    openai_fake.push(Reply::text("from openai"));
    anthropic_fake.push(Reply::text("from anthropic"));
    let cases: [(&str, Option<String>, &str); 3] = [
        ("openai", Some(openai_fake.base_url()), "from openai"),
        ("anthropic", Some(anthropic_fake.base_url()), "from anthropic"),
        ("scripted", None, "You said: hi"),
    ];
    for (kind, base_url, want) in cases {
        let kind: ProviderKind = kind.parse().unwrap();
        let provider: Arc<dyn ModelProvider> =
            provider_for(kind, base_url.as_deref(), Some("k".into())).unwrap();
        let req =
            LlmRequest { messages: vec![Arc::new(DraftMessage::user("hi"))], tools: None, ..request("m") };
        let (result, _) = run(provider.as_ref(), &req, false, PLENTY).await;
        assert_eq!(result.unwrap().content.as_deref(), Some(want), "{kind}");
    }
    assert!(matches!("worker".parse::<ProviderKind>(), Err(ProviderSetupError::UnknownKind(_))));
    assert!(matches!(
        provider_for(ProviderKind::Openai, Some("ftp://x"), None).err(),
        Some(ProviderSetupError::InvalidUrl(_))
    ));
    assert!(provider_for(ProviderKind::Openai, None, None).is_ok(), "defaults to the public API");
}

// ---------------------------------------------------------------------------------------------
// Scripted

fn scripted_request(messages: Vec<DraftMessage>) -> LlmRequest {
    LlmRequest {
        model: "scripted-1".into(),
        messages: messages.into_iter().map(Arc::new).collect(),
        tools: Some(vec![
            weather_tool(),
            time_tool(),
            LlmTool {
                name: "researcher".into(),
                description: "Delegate a task to the researcher agent.".into(),
                input: Some(json!({"type": "object", "properties": {"message": {"type": "string"}}})),
                output: None,
            },
        ]),
        temperature: None,
        max_completion_tokens: None,
        reasoning: None,
        cache: None,
        thinking_form: None,
    }
}

async fn scripted(request: &LlmRequest) -> Result<LlmResponse, ProviderError> {
    run(&ScriptedProvider::new(), request, false, None).await.0
}

#[tokio::test]
async fn scripted_echoes_the_user_and_never_the_system_prompt() {
    let req = scripted_request(vec![
        DraftMessage::text(Role::System, "SECRET SYSTEM PROMPT"),
        DraftMessage::user("hello there"),
    ]);
    let answer = scripted(&req).await.unwrap();
    assert_eq!(answer.content.as_deref(), Some("You said: hello there"));
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert_eq!(answer.model, "scripted-1");
    assert_eq!(answer.cost.as_deref(), Some("0"));
    assert_eq!(answer.tool_calls, None);
    // Multimodal: the text parts.
    let parts = DraftMessage {
        content: Some(Content::Parts(vec![
            ContentPart::Text { text: "look".into() },
            ContentPart::ImageUrl {
                image_url: turnstone_engine::protocol::UrlRef { url: "https://i/x.png".into() },
            },
            ContentPart::Text { text: "at this".into() },
        ])),
        ..DraftMessage::user("")
    };
    let answer = scripted(&scripted_request(vec![parts])).await.unwrap();
    assert_eq!(answer.content.as_deref(), Some("You said: look\nat this"));
    // No user message at all.
    let answer = scripted(&scripted_request(vec![DraftMessage::text(Role::System, "sys")])).await.unwrap();
    assert_eq!(answer.content.as_deref(), Some("Hello from the scripted model."));
}

#[tokio::test]
async fn scripted_summarizes_trailing_tool_results() {
    let assistant = DraftMessage {
        tool_calls: Some(vec![
            ToolCall::function("c1", "get_weather", "{}"),
            ToolCall::function("c2", "get_time", "{}"),
        ]),
        content: None,
        ..DraftMessage::text(Role::Assistant, "")
    };
    let unnamed = DraftMessage { name: None, ..DraftMessage::tool_result("c2", "", "12:00") };
    let req = scripted_request(vec![
        DraftMessage::user("weather and time?"),
        assistant,
        DraftMessage::tool_result("c1", "get_weather", "18C, sunny"),
        unnamed,
    ]);
    let answer = scripted(&req).await.unwrap();
    assert_eq!(answer.content.as_deref(), Some("get_weather returned: 18C, sunny\nget_time returned: 12:00"));
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
}

#[tokio::test]
async fn scripted_tool_command_calls_a_known_tool() {
    let req = scripted_request(vec![DraftMessage::user("/tool get_weather {\"city\": \"Rome\"}")]);
    let answer = scripted(&req).await.unwrap();
    assert_eq!(answer.content, None);
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    let calls = answer.tool_calls.unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].function.name, "get_weather");
    assert_eq!(calls[0].function.arguments, "{\"city\": \"Rome\"}");
    assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 17, "{}", calls[0].id);
    // No arguments: `{}`; malformed arguments pass through verbatim.
    let req = scripted_request(vec![DraftMessage::user("/tool get_time")]);
    assert_eq!(scripted(&req).await.unwrap().tool_calls.unwrap()[0].function.arguments, "{}");
    let req = scripted_request(vec![DraftMessage::user("/tool get_time {not json")]);
    assert_eq!(scripted(&req).await.unwrap().tool_calls.unwrap()[0].function.arguments, "{not json");
}

#[tokio::test]
async fn scripted_several_command_lines_make_parallel_calls() {
    let req = scripted_request(vec![DraftMessage::user(
        "/tool get_weather {\"city\":\"Rome\"}\n/tool get_weather {\"city\":\"Oslo\"}\n/agent researcher find facts",
    )]);
    let calls = scripted(&req).await.unwrap().tool_calls.unwrap();
    let names: Vec<&str> = calls.iter().map(|c| c.function.name.as_str()).collect();
    assert_eq!(names, vec!["get_weather", "get_weather", "researcher"]);
    assert_eq!(calls[1].function.arguments, "{\"city\":\"Oslo\"}");
    let ids: std::collections::HashSet<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids.len(), 3, "ids are distinct");
}

#[tokio::test]
async fn scripted_unknown_tool_answers_text() {
    let req = scripted_request(vec![DraftMessage::user("/tool launch_rockets {}")]);
    let answer = scripted(&req).await.unwrap();
    assert_eq!(answer.tool_calls, None);
    assert_eq!(
        answer.content.as_deref(),
        Some("Unknown tool \"launch_rockets\". Available tools: get_weather, get_time, researcher.")
    );
    let req = LlmRequest { tools: None, ..scripted_request(vec![DraftMessage::user("/agent helper do it")]) };
    assert_eq!(
        scripted(&req).await.unwrap().content.as_deref(),
        Some("Unknown tool \"helper\". Available tools: none.")
    );
}

#[tokio::test]
async fn scripted_agent_command_delegates_with_a_message() {
    let req =
        scripted_request(vec![DraftMessage::user("/agent researcher Find the \"best\" pizza in Naples")]);
    let answer = scripted(&req).await.unwrap();
    let calls = answer.tool_calls.unwrap();
    assert_eq!(calls[0].function.name, "researcher");
    let args: Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
    assert_eq!(args, json!({"message": "Find the \"best\" pizza in Naples"}));
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn scripted_fail_is_retryable() {
    let err = scripted(&scripted_request(vec![DraftMessage::user("/fail")])).await.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, true);
}

#[tokio::test]
async fn scripted_fail_bang_is_terminal() {
    let err = scripted(&scripted_request(vec![DraftMessage::user("/fail!")])).await.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    // A command only counts in the last message, and `/failure` is no command.
    let req = scripted_request(vec![DraftMessage::user("/fail!"), DraftMessage::text(Role::Assistant, "ok")]);
    assert_eq!(scripted(&req).await.unwrap().content.as_deref(), Some("You said: /fail!"));
    let req = scripted_request(vec![DraftMessage::user("/failure")]);
    assert_eq!(scripted(&req).await.unwrap().content.as_deref(), Some("You said: /failure"));
}

#[tokio::test]
async fn scripted_long_streams_word_by_word() {
    let req = scripted_request(vec![DraftMessage::user("/long")]);
    let (result, deltas) = run(&ScriptedProvider::new(), &req, true, None).await;
    let answer = result.unwrap();
    let content = answer.content.unwrap();
    let words = content.split_whitespace().count();
    assert!(words > 200, "{words} words");
    let text_deltas: Vec<&str> = deltas.iter().filter_map(|d| d.text.as_deref()).collect();
    assert_eq!(text_deltas.len(), words, "one delta per word");
    assert_eq!(text_deltas.concat(), content);
    assert_eq!(deltas.last().unwrap().finish_reason.as_deref(), Some("stop"));
    assert_eq!(deltas.len(), words + 1);
}

#[tokio::test]
async fn scripted_streams_tool_calls_whole() {
    let req = scripted_request(vec![DraftMessage::user("/tool get_time\n/tool get_weather {}")]);
    let (result, deltas) = run(&ScriptedProvider::new(), &req, true, None).await;
    let calls = result.unwrap().tool_calls.unwrap();
    assert_eq!(deltas.len(), 3);
    for (delta, call) in deltas.iter().zip(&calls) {
        let fragment = &delta.tool_calls.as_ref().unwrap()[0];
        assert_eq!(fragment.id, call.id);
        assert_eq!(fragment.name.as_deref(), Some(call.function.name.as_str()));
        assert_eq!(fragment.arguments.as_deref(), Some(call.function.arguments.as_str()));
    }
    assert_eq!(deltas[2].finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn scripted_usage_counts_words() {
    let req = scripted_request(vec![
        DraftMessage::text(Role::System, "be brief"),
        DraftMessage::user("one two three"),
    ]);
    let answer = scripted(&req).await.unwrap();
    // Prompt: 2 + 3 words; completion: "You said: one two three" = 5 words.
    assert_eq!(answer.usage, Some(json!({"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10})));
    let req = scripted_request(vec![DraftMessage::user("/tool get_weather {\"city\": \"Rome\"}")]);
    let answer = scripted(&req).await.unwrap();
    // Prompt: 4 words; completion: the name (1) and the arguments (2).
    assert_eq!(answer.usage, Some(json!({"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7})));
}

#[tokio::test]
async fn scripted_is_deterministic() {
    let provider = ScriptedProvider::new();
    for text in ["hi", "/tool get_weather {}", "/agent researcher go", "/long"] {
        let req = scripted_request(vec![DraftMessage::user("earlier"), DraftMessage::user(text)]);
        let (first, first_deltas) = run(&provider, &req, true, None).await;
        let (second, second_deltas) = run(&provider, &req, true, None).await;
        let (plain, _) = run(&provider, &req, false, None).await;
        assert_eq!(first.clone().unwrap(), second.unwrap(), "{text}");
        assert_eq!(first.unwrap(), plain.unwrap(), "{text}: streaming changes nothing");
        assert_eq!(first_deltas, second_deltas, "{text}");
    }
    // A pinned id: the hash is stable across builds and platforms (changing it breaks
    // recorded demos and golden traces).
    let req = scripted_request(vec![DraftMessage::user("/tool get_time")]);
    let id = scripted(&req).await.unwrap().tool_calls.unwrap()[0].id.clone();
    assert_eq!(id, "call_9f7e1242ecf6");
    // The same command elsewhere in a conversation (or on another branch) gets another id.
    let later = scripted_request(vec![
        DraftMessage::user("/tool get_time"),
        DraftMessage::text(Role::Assistant, "done"),
        DraftMessage::user("/tool get_time"),
    ]);
    assert_ne!(scripted(&later).await.unwrap().tool_calls.unwrap()[0].id, id);
    let branch = scripted_request(vec![DraftMessage::user("/tool get_time").with_id("m-2")]);
    assert_ne!(scripted(&branch).await.unwrap().tool_calls.unwrap()[0].id, id);
}

/// Claude 4 models before 4.6 think between tool calls only with interleaved thinking's beta:
/// a budgeted thinking request that offers tools sends the header; adaptive thinking (which
/// interleaves by itself), Claude 3.7 (which cannot) and a request without tools do not.
#[tokio::test]
async fn anthropic_budgeted_thinking_with_tools_asks_for_interleaved_thinking() {
    let fake = FakeAnthropic::start().await;
    let thinking =
        ReasoningConfig { effort: Some(Effort::Low), max_tokens: None, exclude: None, enabled: None };
    for (model, tools, beta) in [
        ("claude-sonnet-4-5", true, Some("interleaved-thinking-2025-05-14")),
        ("claude-opus-4-1-20250805", true, Some("interleaved-thinking-2025-05-14")),
        ("claude-opus-4-7", true, None),
        ("claude-3-7-sonnet-20250219", true, None),
        ("claude-sonnet-4-5", false, None),
    ] {
        let mut req = LlmRequest { reasoning: Some(thinking.clone()), ..request(model) };
        req.messages.retain(|m| m.role == Role::User || m.role == Role::System);
        if !tools {
            req.tools = None;
        }
        fake.push(Reply::text("ok"));
        let (result, _) = run(&anthropic(&fake), &req, false, PLENTY).await;
        result.unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_eq!(fake.last_request().header("anthropic-beta").as_deref(), beta, "{model}, tools {tools}");
    }
}

/// A compatible server behind `type = "openai"` is not sent OpenAI's `prompt_cache_key` (it
/// may refuse a field it does not know); the rest of a cached request is as ever.
#[tokio::test]
async fn a_compatible_server_is_not_sent_the_prompt_cache_key() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("ok"));
    let mut req = request("gpt-4o-mini");
    req.cache = Some(PromptCache { key: "s-1".into(), ttl: CacheTtl::FiveMinutes });
    let (result, _) = run(&openai(&fake), &req, false, PLENTY).await;
    result.unwrap();
    let sent = fake.last_request().body;
    assert!(sent.get("prompt_cache_key").is_none(), "{sent}");
    assert_eq!(sent["model"], "gpt-4o-mini");
}

//! The OpenAI Responses provider over real HTTP against the strict fake Responses server.

// The helpers are test code too: a failure there must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use turnstone_engine::protocol::{
    Content, DraftMessage, Effort, ErrorCode, LlmRequest, LlmResponse, ReasoningConfig, Role, StreamDelta,
    ToolCall,
};
use turnstone_runtime::llm::{
    ModelProvider, OpenAiResponsesProvider, ProviderError, ProviderKind, provider_for,
};
use turnstone_tests::fake_openai_responses::{refuse, seal, thought};
use turnstone_tests::{FakeOpenAiResponses, FakeToolCall, Reply};

const KEY: &str = "sk-test-responses-0123456789";
const PLENTY: Option<Duration> = Some(Duration::from_secs(10));

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "Current weather",
           "input": {"type": "object", "properties": {"city": {"type": "string"}}}})
}

/// A conversation with a system prompt and a question; built from JSON so that fields the
/// protocol adds later keep their defaults.
fn request(reasoning: Option<Effort>) -> LlmRequest {
    let mut request: LlmRequest = serde_json::from_value(json!({
        "model": "gpt-5",
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Rome?"}],
        "tools": [weather_tool()],
        "max_completion_tokens": 256,
    }))
    .unwrap();
    request.reasoning = reasoning.map(|effort| ReasoningConfig {
        effort: Some(effort),
        max_tokens: None,
        exclude: None,
        enabled: None,
    });
    request
}

fn provider(fake: &FakeOpenAiResponses) -> OpenAiResponsesProvider {
    OpenAiResponsesProvider::new(&fake.base_url(), Some(KEY.into())).unwrap()
}

async fn run(
    provider: &dyn ModelProvider,
    request: &LlmRequest,
    stream: bool,
) -> (Result<LlmResponse, ProviderError>, Vec<StreamDelta>) {
    let mut deltas = Vec::new();
    let result = provider.complete(request, stream, PLENTY, &mut |d| deltas.push(d)).await;
    (result, deltas)
}

fn assert_error(err: &ProviderError, code: ErrorCode, retryable: bool) {
    assert_eq!((err.code, err.retryable), (code, retryable), "{err:?}");
}

#[tokio::test]
async fn plain_answer_and_wire_request() {
    let fake = FakeOpenAiResponses::start().await;
    fake.push(Reply::text("It is 21C in Rome.").usage(40, 7));
    let (result, deltas) = run(&provider(&fake), &request(None), false).await;
    let answer = result.unwrap();
    assert_eq!(answer.content.as_deref(), Some("It is 21C in Rome."));
    assert_eq!((answer.finish_reason.as_deref(), answer.reasoning.as_deref()), (Some("stop"), None));
    assert_eq!(answer.provider_blocks, None, "nothing to keep without reasoning");
    let usage = answer.usage.unwrap();
    assert_eq!(
        (usage["input_tokens"].clone(), usage["input_tokens_details"]["cached_tokens"].clone()),
        (json!(40), json!(0))
    );
    assert!(deltas.is_empty());

    let seen = fake.last_request();
    assert_eq!((seen.method.as_str(), seen.path.as_str()), ("POST", "/v1/responses"));
    assert_eq!(seen.header("authorization"), Some(format!("Bearer {KEY}")));
    assert_eq!(
        seen.body,
        json!({
            "model": "gpt-5",
            "instructions": "You are terse.",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Rome?"}]}],
            "tools": [{"type": "function", "name": "get_weather", "description": "Current weather",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": false}],
            "max_output_tokens": 256,
            "store": false,
            "include": ["reasoning.encrypted_content"]
        })
    );
}

#[tokio::test]
async fn streamed_text_and_parallel_tool_calls() {
    let fake = FakeOpenAiResponses::start().await;
    let calls = [
        FakeToolCall::new("call_a1", "get_weather", r#"{"city":"Rome","unit":"celsius"}"#),
        FakeToolCall::new("call_b2", "get_weather", r#"{"city":"Paris","unit":"celsius"}"#),
    ];
    fake.push(Reply::text_and_tool_calls("Checking both.", calls.clone()).fragment_chars(5));
    let (result, deltas) = run(&provider(&fake), &request(None), true).await;
    let answer = result.unwrap();
    assert_eq!(fake.last_request().body["stream"], true);
    assert_eq!(fake.last_request().header("accept").as_deref(), Some("text/event-stream"));
    assert_eq!(answer.content.as_deref(), Some("Checking both."));
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    let expected: Vec<ToolCall> =
        calls.iter().map(|c| ToolCall::function(&*c.id, &*c.name, &*c.arguments)).collect();
    assert_eq!(answer.tool_calls, Some(expected));
    let texts: Vec<&str> = deltas.iter().filter_map(|d| d.text.as_deref()).collect();
    assert_eq!(texts, ["Checking", " both."]);
    for call in &calls {
        let fragments: Vec<&str> = deltas
            .iter()
            .flat_map(|d| d.tool_calls.iter().flatten())
            .filter(|f| f.id == call.id.as_str())
            .filter_map(|f| f.arguments.as_deref())
            .collect();
        assert!(fragments.len() >= 3, "{fragments:?}");
        assert_eq!(fragments.concat(), call.arguments);
    }
    assert_eq!(deltas.last().unwrap().finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn error_statuses_and_stream_errors_are_classified() {
    let fake = FakeOpenAiResponses::start().await;
    let provider = provider(&fake);
    fake.push(Reply::error(429, "Rate limit reached for gpt-5"));
    fake.push(Reply::error(500, "The server had an error"));
    fake.push(Reply::error(400, format!("Invalid 'input[0]': echoing {KEY}")));
    fake.push(Reply::text("one two three").error_after(3, "rate_limit_exceeded", "slow down"));
    fake.push(Reply::text("one two three").cut_after(4));
    let (result, _) = run(&provider, &request(None), false).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::RateLimited, true);
    assert_eq!(err.message, "openai-responses answered HTTP 429: Rate limit reached for gpt-5");
    let (result, _) = run(&provider, &request(None), true).await;
    assert_error(&result.unwrap_err(), ErrorCode::ProviderError, true);
    let (result, _) = run(&provider, &request(None), false).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, false);
    assert!(!err.message.contains(KEY), "{}", err.message);
    let (result, _) = run(&provider, &request(None), true).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::RateLimited, true);
    assert_eq!(err.message, "openai-responses reported an error: slow down");
    let (result, _) = run(&provider, &request(None), true).await;
    assert_error(&result.unwrap_err(), ErrorCode::ProviderError, true);

    // A failed response, streamed: the provider's error, retryable as a server error is.
    let failed = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\
        \"response\":{\"id\":\"resp_1\",\"model\":\"gpt-5\",\"status\":\"in_progress\",\"output\":[]}}\n\n\
        event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":1,\"response\":\
        {\"id\":\"resp_1\",\"model\":\"gpt-5\",\"status\":\"failed\",\"output\":[],\
        \"error\":{\"code\":\"server_error\",\"message\":\"The model failed.\"}}}\n\n";
    fake.push(Reply::raw(200, "text/event-stream", failed));
    let (result, _) = run(&provider, &request(None), true).await;
    let err = result.unwrap_err();
    assert_error(&err, ErrorCode::ProviderError, true);
    assert_eq!(err.message, "openai-responses reported an error: The model failed.");
}

/// A reasoning model's reasoning item comes back with its encrypted content, is kept with
/// the reply, and is sent back unchanged with the tool result; changed or dropped, the strict
/// fake refuses the request as OpenAI does.
#[tokio::test]
async fn reasoning_items_round_trip() {
    for stream in [false, true] {
        let fake = FakeOpenAiResponses::start().await;
        fake.push(Reply::tool_calls([FakeToolCall::new("call_1", "get_weather", r#"{"city":"Rome"}"#)]));
        fake.set_default(Reply::text("21C in Rome."));
        let provider = provider(&fake);
        let mut req = request(Some(Effort::High));
        let (result, deltas) = run(&provider, &req, stream).await;
        let first = result.unwrap();
        let sent = fake.last_request().body;
        assert_eq!(sent["reasoning"], json!({"effort": "high", "summary": "auto"}));
        let expected_thought = thought(&sent);
        assert_eq!(first.reasoning.as_deref(), Some(expected_thought.as_str()), "stream {stream}");
        if stream {
            let live: String = deltas.iter().filter_map(|d| d.reasoning.as_deref()).collect();
            assert_eq!(live, expected_thought);
        }
        assert!(
            first.usage.as_ref().unwrap()["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap() > 0
        );
        let kept = first.provider_blocks.clone().unwrap();
        assert_eq!(kept.provider, "openai-responses");
        let item = kept.blocks[0].clone();
        assert_eq!(item["encrypted_content"], seal(item["id"].as_str().unwrap(), &expected_thought));

        req.messages.push(Arc::new(DraftMessage {
            content: first.content.clone().map(Content::Text),
            tool_calls: first.tool_calls.clone(),
            provider_blocks: first.provider_blocks.clone(),
            ..DraftMessage::text(Role::Assistant, "")
        }));
        req.messages.push(Arc::new(DraftMessage::tool_result("call_1", "get_weather", "21C")));
        let (result, _) = run(&provider, &req, stream).await;
        assert_eq!(result.unwrap().content.as_deref(), Some("21C in Rome."));
        let input = fake.last_request().body["input"].clone();
        let kinds: Vec<&str> =
            input.as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["message", "reasoning", "function_call", "function_call_output"]);
        assert_eq!(input[1], item, "sent back unchanged");

        let mut changed = req.clone();
        Arc::make_mut(&mut changed.messages[2]).provider_blocks.as_mut().unwrap().blocks[0]["encrypted_content"] =
            json!(format!("{}0", item["encrypted_content"].as_str().unwrap()));
        let (result, _) = run(&provider, &changed, stream).await;
        let err = result.unwrap_err();
        assert_error(&err, ErrorCode::ProviderError, false);
        assert!(err.message.contains("could not be verified"), "{}", err.message);

        let mut dropped = req.clone();
        Arc::make_mut(&mut dropped.messages[2]).provider_blocks.as_mut().unwrap().blocks[0]
            .as_object_mut()
            .unwrap()
            .remove("encrypted_content");
        let (result, _) = run(&provider, &dropped, stream).await;
        assert!(result.unwrap_err().message.contains("Items are not persisted when `store` is set to false"));

        // Another provider's blocks are not sent: the reasoning is missing, which the fake sees.
        let mut foreign = req.clone();
        Arc::make_mut(&mut foreign.messages[2]).provider_blocks.as_mut().unwrap().provider =
            "anthropic".into();
        let (result, _) = run(&provider, &foreign, stream).await;
        assert!(result.unwrap_err().message.contains("without its required 'reasoning' item"));
    }
}

/// Each refusal rule of the strict fake, on hand-made bodies.
#[test]
fn the_fake_refuses_what_openai_refuses() {
    let base = json!({"model": "gpt-5", "store": false, "input": [{"role": "user", "content": "hi"}]});
    let with = |patch: Value| {
        let mut body = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        refuse(&body)
    };
    assert_eq!(refuse(&base), None);
    assert_eq!(with(json!({"messages": []})), Some("Unknown parameter: 'messages'.".into()));
    let chat_tools = json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]});
    assert_eq!(with(chat_tools), Some("Missing required parameter: 'tools[0].name'.".into()));
    assert!(with(json!({"previous_response_id": "resp_1"})).unwrap().contains("not found"));
    let reference = json!({"input": [{"type": "item_reference", "id": "rs_1"}]});
    assert!(with(reference).unwrap().contains("Items are not persisted"));
    let orphan = json!({"input": [{"role": "user", "content": "hi"},
                                  {"type": "function_call_output", "call_id": "call_9", "output": "x"}]});
    assert_eq!(with(orphan), Some("No tool call found for function call output with call_id call_9.".into()));
    let unanswered = json!({"input": [{"role": "user", "content": "hi"},
                                      {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}]});
    assert_eq!(with(unanswered), Some("No tool output found for function call call_1.".into()));
    let input_text_from_assistant =
        json!({"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]});
    assert!(with(input_text_from_assistant).unwrap().contains("input[0].content[0].type"));
    let call = json!({"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"});
    let output = json!({"type": "function_call_output", "call_id": "call_1", "output": "x"});
    let reasoning =
        json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": seal("rs_1", "t")});
    let user = json!({"role": "user", "content": "hi"});
    let thinking = json!({"reasoning": {"effort": "low"}});
    let ok = json!({"input": [user, reasoning, call, output], "reasoning": {"effort": "low"}});
    assert_eq!(with(ok), None);
    let dropped = json!({"input": [user, call, output], "reasoning": thinking["reasoning"]});
    assert!(with(dropped).unwrap().contains("without its required 'reasoning' item"));
    let last = json!({"input": [user, reasoning, call, output, reasoning]});
    assert!(with(last).unwrap().contains("without its required following item"));
    let mut forged = reasoning.clone();
    forged["id"] = json!("rs_2");
    assert!(with(json!({"input": [user, forged, call, output]})).unwrap().contains("could not be verified"));
    assert!(with(json!({"reasoning": {"effort": "maximal"}})).is_some());
}

#[tokio::test]
async fn provider_for_builds_it_by_its_config_name() {
    let fake = FakeOpenAiResponses::start().await;
    fake.push(Reply::text("from responses"));
    let kind: ProviderKind = "openai-responses".parse().unwrap();
    assert_eq!(kind, ProviderKind::OpenaiResponses);
    let provider = provider_for(kind, Some(&fake.base_url()), Some("k".into())).unwrap();
    assert_eq!(provider.name(), "openai-responses");
    let (result, _) = run(provider.as_ref(), &request(None), false).await;
    assert_eq!(result.unwrap().content.as_deref(), Some("from responses"));
    assert_eq!(
        OpenAiResponsesProvider::new("https://api.openai.com/v1/", None).unwrap().url(),
        "https://api.openai.com/v1/responses"
    );
}

//! The model fakes' context window: each accepts a request that just fits and refuses, with
//! the provider's own status and body, one a token too long, counting input tokens as its
//! `usage` reports them; the runtime's providers recognise those refusals. And a default reply
//! answers hundreds of requests.

// The helpers are test code too: a failure there must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use turnstone_engine::protocol::LlmRequest;
use turnstone_runtime::llm::{
    AnthropicProvider, ContextOverflow, ModelProvider, OpenAiProvider, OpenAiResponsesProvider, ProviderError,
};
use turnstone_tests::{FakeAnthropic, FakeOpenAi, FakeOpenAiResponses, FakeServer, Reply};

/// Posts `body` to `url`: the status, the `request_id_header`, the body as JSON.
async fn post(url: &str, body: &Value, request_id_header: &str) -> (u16, Option<String>, Value) {
    let response = reqwest::Client::new().post(url).json(body).send().await.unwrap();
    let status = response.status().as_u16();
    let id = response.headers().get(request_id_header).map(|v| v.to_str().unwrap().to_owned());
    let body: Value = response.json().await.unwrap();
    (status, id, body)
}

/// A message long enough that a prompt holding it may be cached (over 1,024 tokens).
fn long_text() -> String {
    "The quick brown fox jumps over the lazy dog. ".repeat(100)
}

fn anthropic_body(max_tokens: u64) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": max_tokens,
        "system": "You are terse.",
        "tools": [{"name": "get_weather", "description": "Current weather",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": long_text()},
            {"role": "assistant", "content": [{"type": "text", "text": "Noted."}]},
            {"role": "user", "content": "And now?"}
        ]
    })
}

fn chat_body(output: Option<(&str, u64)>) -> Value {
    let mut body = json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": long_text()},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "And now?"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    });
    if let Some((field, tokens)) = output {
        body[field] = json!(tokens);
    }
    body
}

fn responses_body(max_output_tokens: Option<u64>) -> Value {
    let mut body = json!({
        "model": "gpt-5",
        "instructions": "You are terse.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": long_text()}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And now?"}]}
        ],
        "tools": [{"type": "function", "name": "get_weather", "description": "Current weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": false}],
        "store": false
    });
    if let Some(tokens) = max_output_tokens {
        body["max_output_tokens"] = json!(tokens);
    }
    body
}

/// The refusal left the reply queue alone and was recorded like any request.
fn assert_refusal_recorded(fake: &FakeServer, body: &Value, requests_before: usize) {
    assert_eq!(fake.request_count(), requests_before + 1, "the refused request is recorded");
    assert_eq!(&fake.last_request().body, body);
    assert_eq!(fake.pending_replies(), 1, "a refusal takes no reply");
}

// ---------------------------------------------------------------------------------------------
// Anthropic Messages

#[tokio::test]
async fn anthropic_refuses_a_prompt_past_the_window_and_one_past_it_with_max_tokens() {
    let fake = FakeAnthropic::start().await;
    let url = format!("{}/v1/messages", fake.base_url());
    let body = anthropic_body(1000);
    let input = fake.input_tokens(&body);
    assert!(input > 1024, "a prompt worth counting: {input}");
    assert_eq!(fake.context_window(), None, "no window by default");

    // Input plus max_tokens exactly fills the window: answered, with that many input tokens.
    fake.set_context_window(Some(input + 1000));
    fake.push(Reply::text("fits"));
    let (status, _, answer) = post(&url, &body, "request-id").await;
    assert_eq!(status, 200, "{answer}");
    let usage = &answer["usage"];
    let reported = ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"]
        .iter()
        .map(|k| usage[*k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(reported, input, "the window counts what usage reports: {usage}");

    // One token short of room for max_tokens.
    fake.push(Reply::text("never sent"));
    let before = fake.request_count();
    let window = input + 999;
    fake.set_context_window(Some(window));
    let (status, id, refused) = post(&url, &body, "request-id").await;
    assert_eq!(status, 400);
    assert_eq!(id, Some(format!("req_fake_{}", before + 1)));
    assert_eq!(
        refused,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": format!(
            "input length and `max_tokens` exceed context limit: {input} + 1000 > {window}, decrease input length \
             or `max_tokens` and try again"
        )}})
    );
    assert_refusal_recorded(&fake, &body, before);

    // The prompt alone one token past the window.
    let window = input - 1;
    fake.set_context_window(Some(window));
    let (status, _, refused) = post(&url, &body, "request-id").await;
    assert_eq!(status, 400);
    assert_eq!(
        refused,
        json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": format!("prompt is too long: {input} tokens > {window} maximum")}})
    );

    // Cached tokens count too: the same prompt, now read from the cache, is still too long.
    let mut marked = anthropic_body(1000);
    marked["system"] = json!([{"type": "text", "text": long_text(), "cache_control": {"type": "ephemeral"}}]);
    let marked_input = fake.input_tokens(&marked);
    fake.set_context_window(Some(marked_input + 1000));
    let (status, _, first) = post(&url, &marked, "request-id").await;
    assert_eq!(status, 200, "{first}");
    let (status, _, second) = post(&url, &marked, "request-id").await;
    assert_eq!(status, 200, "{second}");
    assert!(second["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0, "{second}");
    fake.set_context_window(Some(marked_input - 1));
    let (status, _, refused) = post(&url, &marked, "request-id").await;
    assert_eq!(status, 400);
    assert_eq!(
        refused["error"]["message"],
        format!("prompt is too long: {marked_input} tokens > {} maximum", marked_input - 1)
    );

    // Lifted: anything goes again.
    fake.set_context_window(None);
    assert_eq!(post(&url, &body, "request-id").await.0, 200);
}

// ---------------------------------------------------------------------------------------------
// OpenAI Chat Completions

#[tokio::test]
async fn chat_completions_refuses_messages_past_the_window_and_with_the_completion() {
    let fake = FakeOpenAi::start().await.with_context_window(1_000_000);
    let url = format!("{}/chat/completions", fake.base_url());
    let body = chat_body(Some(("max_completion_tokens", 500)));
    let input = fake.input_tokens(&body);
    assert!(input > 1024, "{input}");

    fake.set_context_window(Some(input + 500));
    fake.push(Reply::text("fits"));
    let (status, _, answer) = post(&url, &body, "x-request-id").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"], input, "the window counts what usage reports");

    fake.push(Reply::text("never sent"));
    let before = fake.request_count();
    let window = input + 499;
    fake.set_context_window(Some(window));
    let (status, id, refused) = post(&url, &body, "x-request-id").await;
    assert_eq!((status, id), (400, Some(format!("req_fake_{}", before + 1))));
    assert_eq!(
        refused,
        json!({"error": {
            "message": format!(
                "This model's maximum context length is {window} tokens. However, you requested {} tokens ({input} \
                 in the messages, 500 in the completion). Please reduce the length of the messages or completion.",
                input + 500
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded"
        }})
    );
    assert_refusal_recorded(&fake, &body, before);

    // The deprecated `max_tokens` counts the same.
    let legacy = chat_body(Some(("max_tokens", 500)));
    assert_eq!(fake.input_tokens(&legacy), input);
    assert_eq!(post(&url, &legacy, "x-request-id").await.0, 400);

    // Without either, only the messages count: the window they just fit is enough.
    let bare = chat_body(None);
    fake.set_context_window(Some(input));
    assert_eq!(post(&url, &bare, "x-request-id").await.0, 200);
    let window = input - 1;
    fake.set_context_window(Some(window));
    let (status, _, refused) = post(&url, &bare, "x-request-id").await;
    assert_eq!(status, 400);
    assert_eq!(
        refused,
        json!({"error": {
            "message": format!(
                "This model's maximum context length is {window} tokens. However, your messages resulted in {input} \
                 tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded"
        }})
    );
}

// ---------------------------------------------------------------------------------------------
// OpenAI Responses

#[tokio::test]
async fn responses_refuses_input_past_the_window() {
    let fake = FakeOpenAiResponses::start().await;
    let url = format!("{}/responses", fake.base_url());
    let body = responses_body(Some(300));
    let input = fake.input_tokens(&body);
    assert!(input > 1024, "{input}");
    let refusal = json!({"error": {
        "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded"
    }});

    fake.set_context_window(Some(input + 300));
    fake.push(Reply::text("fits"));
    let (status, _, answer) = post(&url, &body, "x-request-id").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["input_tokens"], input, "the window counts what usage reports");

    // Again: now mostly read from the prompt cache, the same count.
    fake.push(Reply::text("fits again"));
    let (status, _, answer) = post(&url, &body, "x-request-id").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["input_tokens"], input);
    assert!(answer["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{answer}");

    // With room for one token less than max_output_tokens.
    fake.push(Reply::text("never sent"));
    let before = fake.request_count();
    fake.set_context_window(Some(input + 299));
    let (status, id, refused) = post(&url, &body, "x-request-id").await;
    assert_eq!((status, id), (400, Some(format!("req_fake_{}", before + 1))));
    assert_eq!(refused, refusal);
    assert_refusal_recorded(&fake, &body, before);

    // Without max_output_tokens only the input counts.
    let bare = responses_body(None);
    fake.set_context_window(Some(input));
    fake.push(Reply::text("fits"));
    assert_eq!(post(&url, &bare, "x-request-id").await.0, 200);
    fake.set_context_window(Some(input - 1));
    let (status, _, refused) = post(&url, &bare, "x-request-id").await;
    assert_eq!((status, refused), (400, refusal));
}

// ---------------------------------------------------------------------------------------------
// The runtime's providers recognise each refusal

fn llm_request(model: &str) -> LlmRequest {
    serde_json::from_value(json!({
        "model": model,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": long_text()}],
        "max_completion_tokens": 256,
    }))
    .unwrap()
}

async fn fail(provider: &dyn ModelProvider, request: &LlmRequest) -> ProviderError {
    let timeout = Some(Duration::from_secs(10));
    provider.complete(request, false, timeout, &mut |_| {}).await.unwrap_err()
}

#[tokio::test]
async fn providers_see_each_refusal_as_a_context_overflow() {
    let anthropic = FakeAnthropic::start().await.with_context_window(10);
    let provider = AnthropicProvider::new(&anthropic.base_url(), Some("sk-ant-test".into())).unwrap();
    let err = fail(&provider, &llm_request("claude-test")).await;
    let input = anthropic.input_tokens(&anthropic.last_request().body);
    assert_eq!(
        err.context_overflow(),
        Some(ContextOverflow { tokens: Some(input), window: Some(10) }),
        "{err:?}"
    );
    assert!(!err.retryable);
    // Room for the prompt, not for max_tokens.
    anthropic.set_context_window(Some(input + 255));
    let err = fail(&provider, &llm_request("claude-test")).await;
    assert_eq!(
        err.context_overflow(),
        Some(ContextOverflow { tokens: Some(input + 256), window: Some(input + 255) })
    );

    let openai = FakeOpenAi::start().await.with_context_window(10);
    let provider = OpenAiProvider::new(&openai.base_url(), Some("sk-test".into())).unwrap();
    let err = fail(&provider, &llm_request("gpt-4o-mini")).await;
    let input = openai.input_tokens(&openai.last_request().body);
    assert_eq!(
        err.context_overflow(),
        Some(ContextOverflow { tokens: Some(input), window: Some(10) }),
        "{err:?}"
    );
    openai.set_context_window(Some(input + 255));
    let err = fail(&provider, &llm_request("gpt-4o-mini")).await;
    assert_eq!(
        err.context_overflow(),
        Some(ContextOverflow { tokens: Some(input + 256), window: Some(input + 255) })
    );

    let responses = FakeOpenAiResponses::start().await.with_context_window(10);
    let provider = OpenAiResponsesProvider::new(&responses.base_url(), Some("sk-test".into())).unwrap();
    let err = fail(&provider, &llm_request("gpt-5")).await;
    assert_eq!(err.context_overflow(), Some(ContextOverflow { tokens: None, window: None }), "{err:?}");
    assert!(!err.retryable);
}

// ---------------------------------------------------------------------------------------------
// A default reply for long tests

#[tokio::test]
async fn a_default_reply_answers_hundreds_of_requests() {
    let fake = FakeOpenAi::start().await.with_context_window(100_000);
    fake.set_default(Reply::filler(200));
    let url = format!("{}/chat/completions", fake.base_url());
    let client = reqwest::Client::new();
    for n in 0..300 {
        let mut body = chat_body(Some(("max_completion_tokens", 1000)));
        body["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "user", "content": format!("turn {n}")}));
        let stream = n % 10 == 0;
        if stream {
            body["stream"] = json!(true);
        }
        let response = client.post(&url).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 200, "request {n}");
        let text = response.text().await.unwrap();
        if stream {
            assert!(text.ends_with("data: [DONE]\n\n"), "request {n}");
        } else {
            let answer: Value = serde_json::from_str(&text).unwrap();
            let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
            assert_eq!(content.split_whitespace().count(), 200, "request {n}");
            assert_eq!(answer["usage"]["completion_tokens"], 200);
            assert_eq!(answer["usage"]["prompt_tokens"], fake.input_tokens(&body));
        }
    }
    assert_eq!((fake.request_count(), fake.pending_replies()), (300, 0));
}

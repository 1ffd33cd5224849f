//! Tests of `turnstone_engine::llm_format` against payloads in the providers' real wire shapes.

#![cfg(test)]

use serde_json::{Value, json};
use turnstone_engine::llm_format::{self, FormatError, LlmFormat, anthropic, openai};
use turnstone_engine::protocol::{
    CacheTtl, LlmRequest, LlmResponse, PromptCache, StreamDelta, ToolCall, ToolCallDelta, UrlRef,
};

#[path = "common/llm.rs"]
mod llm;

use llm::{call_delta, finish_delta, reasoning_delta, req, text_delta};

/// A conversation using every message kind: system, user (text and parts), assistant tool calls, tool results.
fn conversation() -> Value {
    json!([
        { "role": "system", "content": "You are a weather bot." },
        { "role": "user", "content": [
            { "type": "text", "text": "Weather in Paris and Bogotá? Here is a photo." },
            { "type": "image_url", "image_url": { "url": "https://example.com/sky.jpg" } }
        ] },
        { "id": "n2", "role": "assistant", "content": "Let me check both.", "tool_calls": [
            { "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } },
            { "id": "call_2", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Bogotá\"}" } }
        ] },
        { "role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18C, cloudy" },
        { "role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "24C, sunny" },
        { "role": "user", "content": "Thanks!" }
    ])
}

fn weather_tools() -> Value {
    json!([
        {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "input": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] },
            "output": { "type": "string" }
        },
        { "name": "now", "description": "The current time." }
    ])
}

// ---------------------------------------------------------------- OpenAI requests

#[test]
fn openai_request_maps_every_field() {
    let request = req(json!({
        "model": "gpt-4o",
        "messages": conversation(),
        "tools": weather_tools(),
        "temperature": 0.2,
        "max_completion_tokens": 1000,
        "reasoning": { "effort": "high", "max_tokens": 2000, "exclude": true }
    }));
    assert_eq!(
        openai::request(&request, false),
        json!({
            "model": "gpt-4o",
            "messages": [
                { "role": "system", "content": "You are a weather bot." },
                { "role": "user", "content": [
                    { "type": "text", "text": "Weather in Paris and Bogotá? Here is a photo." },
                    { "type": "image_url", "image_url": { "url": "https://example.com/sky.jpg" } }
                ] },
                { "role": "assistant", "content": "Let me check both.", "tool_calls": [
                    { "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } },
                    { "id": "call_2", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Bogotá\"}" } }
                ] },
                { "role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18C, cloudy" },
                { "role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "24C, sunny" },
                { "role": "user", "content": "Thanks!" }
            ],
            "tools": [
                { "type": "function", "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] }
                } },
                { "type": "function", "function": {
                    "name": "now",
                    "description": "The current time.",
                    "parameters": { "type": "object", "properties": {} }
                } }
            ],
            "temperature": 0.2,
            "max_completion_tokens": 1000,
            "reasoning_effort": "high"
        })
    );
}

#[test]
fn openai_request_streaming_minimal() {
    let request = req(json!({
        "model": "gpt-4o-mini",
        "messages": [{ "role": "user", "content": "Hi" }],
        "tools": [],
        "reasoning": { "max_tokens": 1000, "enabled": true }
    }));
    assert_eq!(
        openai::request(&request, true),
        json!({
            "model": "gpt-4o-mini",
            "messages": [{ "role": "user", "content": "Hi" }],
            "stream": true,
            "stream_options": { "include_usage": true }
        })
    );
}

#[test]
fn openai_request_passes_every_part_kind_through() {
    let request = req(json!({
        "model": "gpt-4o-audio-preview",
        "messages": [
            { "role": "assistant", "tool_calls": [
                { "id": "call_9", "type": "function", "function": { "name": "now", "arguments": "{}" } }
            ] },
            { "role": "user", "content": [
                { "type": "file", "file": { "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0=" } },
                { "type": "input_audio", "input_audio": { "data": "UklGRg==", "format": "wav" } },
                { "type": "video_url", "video_url": { "url": "https://example.com/v.mp4" } }
            ] }
        ]
    }));
    assert_eq!(
        openai::request(&request, false)["messages"],
        json!([
            { "role": "assistant", "tool_calls": [
                { "id": "call_9", "type": "function", "function": { "name": "now", "arguments": "{}" } }
            ] },
            { "role": "user", "content": [
                { "type": "file", "file": { "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0=" } },
                { "type": "input_audio", "input_audio": { "data": "UklGRg==", "format": "wav" } },
                { "type": "video_url", "video_url": { "url": "https://example.com/v.mp4" } }
            ] }
        ])
    );
}

/// Two tool results, the first with an image (an MCP tool's), then the next user message.
fn tool_results_with_an_image() -> LlmRequest {
    req(json!({
        "model": "m",
        "messages": [
            { "role": "assistant", "tool_calls": [
                { "id": "call_1", "type": "function", "function": { "name": "chart", "arguments": "{}" } },
                { "id": "call_2", "type": "function", "function": { "name": "now", "arguments": "{}" } }
            ] },
            { "role": "tool", "tool_call_id": "call_1", "content": [
                { "type": "text", "text": "the chart" },
                { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } }
            ] },
            { "role": "tool", "tool_call_id": "call_2", "content": "noon" },
            { "role": "user", "content": "and?" }
        ]
    }))
}

#[test]
fn openai_request_moves_a_tool_results_image_to_a_user_message_after_the_results() {
    // Chat Completions takes text only in tool messages; a user message may not stand between
    // a call and the results that answer it.
    assert_eq!(
        openai::request(&tool_results_with_an_image(), false)["messages"].as_array().unwrap()[1..],
        json!([
            { "role": "tool", "tool_call_id": "call_1",
              "content": "the chart\n(more of this result follows in the next user message)" },
            { "role": "tool", "tool_call_id": "call_2", "content": "noon" },
            { "role": "user", "content": [
                { "type": "text", "text": "The result of tool call call_1 includes:" },
                { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } }
            ] },
            { "role": "user", "content": "and?" }
        ])
        .as_array()
        .unwrap()[..]
    );
}

#[test]
fn anthropic_request_keeps_a_tool_results_image_in_the_result() {
    let body = anthropic::request(&tool_results_with_an_image(), false).expect("converts");
    assert_eq!(
        body["messages"][1]["content"][0],
        json!({ "type": "tool_result", "tool_use_id": "call_1", "content": [
            { "type": "text", "text": "the chart" },
            { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=" } }
        ] })
    );
}

#[test]
fn openai_request_sends_every_effort_name() {
    for (effort, name) in [
        ("xhigh", "xhigh"),
        ("high", "high"),
        ("medium", "medium"),
        ("low", "low"),
        ("minimal", "minimal"),
        ("none", "none"),
    ] {
        let request = req(json!({ "model": "o3", "messages": [], "reasoning": { "effort": effort } }));
        assert_eq!(openai::request(&request, false)["reasoning_effort"], json!(name));
    }
}

// ---------------------------------------------------------------- OpenAI responses

#[test]
fn openai_response_text() {
    let body = json!({
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion",
        "created": 1741569952,
        "model": "gpt-4.1-2025-04-14",
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": "Hello! How can I assist you today?", "refusal": null, "annotations": [] },
            "logprobs": null,
            "finish_reason": "stop"
        }],
        "usage": {
            "prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
            "prompt_tokens_details": { "cached_tokens": 0, "audio_tokens": 0 },
            "completion_tokens_details": { "reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0 }
        },
        "service_tier": "default"
    });
    let response = openai::response(&body).expect("parses");
    assert_eq!(
        response,
        LlmResponse {
            model: "gpt-4.1-2025-04-14".into(),
            content: Some("Hello! How can I assist you today?".into()),
            tool_calls: None,
            finish_reason: Some("stop".into()),
            usage: Some(body["usage"].clone()),
            cost: None,
            images: None,
            reasoning: None,
            provider_blocks: None,
        }
    );
    assert!(!response.is_truncated() && !response.is_refused());
}

#[test]
fn openai_response_parallel_tool_calls() {
    let body = json!({
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "created": 1741570283,
        "model": "gpt-4o-2024-08-06",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [
                    { "id": "call_12345xyz", "type": "function", "function": { "name": "get_weather", "arguments": "{\"location\":\"Paris, France\"}" } },
                    { "id": "call_67890abc", "type": "function", "function": { "name": "get_weather", "arguments": "{\"location\":\"Bogotá, Colombia\"}" } }
                ],
                "refusal": null,
                "annotations": []
            },
            "logprobs": null,
            "finish_reason": "tool_calls"
        }],
        "usage": { "prompt_tokens": 82, "completion_tokens": 51, "total_tokens": 133 },
        "system_fingerprint": "fp_fc9f1d7035"
    });
    let response = openai::response(&body).expect("parses");
    assert_eq!(response.content, None);
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.tool_calls,
        Some(vec![
            ToolCall::function("call_12345xyz", "get_weather", "{\"location\":\"Paris, France\"}"),
            ToolCall::function("call_67890abc", "get_weather", "{\"location\":\"Bogotá, Colombia\"}"),
        ])
    );
    assert_eq!(
        response.usage,
        Some(json!({ "prompt_tokens": 82, "completion_tokens": 51, "total_tokens": 133 }))
    );
}

#[test]
fn openai_response_truncated() {
    let body = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "Once upon a" }, "finish_reason": "length" }],
        "usage": { "prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8 }
    });
    let response = openai::response(&body).expect("parses");
    assert!(response.is_truncated());
    assert_eq!(response.content.as_deref(), Some("Once upon a"));
}

#[test]
fn openai_response_refusal_is_content_filter() {
    let body = json!({
        "id": "chatcmpl-2", "object": "chat.completion", "created": 1, "model": "gpt-4o-2024-08-06",
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": null, "refusal": "I'm sorry, I can't help with that." },
            "finish_reason": "stop"
        }]
    });
    let response = openai::response(&body).expect("parses");
    assert!(response.is_refused());
    assert_eq!(response.finish_reason.as_deref(), Some("content_filter"));
    assert_eq!(response.content.as_deref(), Some("I'm sorry, I can't help with that."));
    assert_eq!(response.usage, None);
}

#[test]
fn openai_response_compatible_server_quirks() {
    // Content as a list of parts, arguments as an object, OpenRouter images, empty text.
    let body = json!({
        "id": "gen-1", "object": "chat.completion", "created": 1, "model": "mistral-large",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": [{ "type": "text", "text": "Here" }, { "type": "thinking", "thinking": [] }, { "type": "text", "text": " it is." }],
                "tool_calls": [{ "id": "a1", "function": { "name": "now", "arguments": { "tz": "UTC" } } }],
                "images": [{ "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } }]
            },
            "finish_reason": "tool_calls"
        }]
    });
    let response = openai::response(&body).expect("parses");
    assert_eq!(response.content.as_deref(), Some("Here it is."));
    assert_eq!(response.tool_calls, Some(vec![ToolCall::function("a1", "now", "{\"tz\":\"UTC\"}")]));
    assert_eq!(response.images, Some(vec![UrlRef { url: "data:image/png;base64,iVBORw0KGgo=".into() }]));

    let empty = json!({
        "model": "m", "choices": [{ "index": 0, "message": { "role": "assistant", "content": "" }, "finish_reason": "stop" }]
    });
    assert_eq!(openai::response(&empty).expect("parses").content, None);
}

#[test]
fn openai_response_error_body() {
    let body = json!({
        "error": {
            "message": "Incorrect API key provided: sk-abc. You can find your API key at https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "param": null,
            "code": "invalid_api_key"
        }
    });
    let err = openai::response(&body).expect_err("an error body");
    assert_eq!(err.path, "error");
    assert!(err.message.starts_with("invalid_request_error: Incorrect API key"), "{err}");
}

#[test]
fn openai_response_errors_name_the_path() {
    let cases = [
        (json!([]), "", "expected an object, found an array"),
        (json!({ "choices": [] }), "model", "missing"),
        (json!({ "model": "m", "choices": [] }), "choices", "empty: the response has no choice"),
        (json!({ "model": "m", "choices": [{ "index": 0 }] }), "choices[0].message", "missing"),
        (
            json!({ "model": "m", "choices": [{ "message": { "content": 42 } }] }),
            "choices[0].message.content",
            "expected a string or an array, found a number",
        ),
        (
            json!({ "model": "m", "choices": [{ "message": { "tool_calls": [
                { "id": "a", "type": "function", "function": { "name": "x", "arguments": "{}" } },
                { "id": "b", "type": "function", "function": { "arguments": "{}" } }
            ] } }] }),
            "choices[0].message.tool_calls[1].function.name",
            "missing",
        ),
        (
            json!({ "model": "m", "choices": [{ "message": { "tool_calls": [
                { "id": "a", "type": "custom", "custom": { "name": "x", "input": "" } }
            ] } }] }),
            "choices[0].message.tool_calls[0].type",
            "unsupported tool call type \"custom\"",
        ),
        (
            json!({ "model": "m", "choices": [{ "message": {}, "finish_reason": 3 }] }),
            "choices[0].finish_reason",
            "expected a string, found a number",
        ),
    ];
    for (body, path, message) in cases {
        assert_eq!(openai::response(&body), Err(FormatError::new(path, message)), "{body}");
    }
    let err = FormatError::new("choices[0].message.tool_calls[1].function.name", "missing");
    assert_eq!(err.to_string(), "choices[0].message.tool_calls[1].function.name: missing");
    assert_eq!(FormatError::new("", "bad").to_string(), "bad");
}

// ---------------------------------------------------------------- OpenAI streams

fn chunk(delta: Value, finish_reason: Value) -> Value {
    json!({
        "id": "chatcmpl-9lEnqrmnvNQfTGvh6fEabQzzcVpXx",
        "object": "chat.completion.chunk",
        "created": 1721046534,
        "model": "gpt-4o-2024-05-13",
        "system_fingerprint": "fp_400f27fa1f",
        "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason }],
        "usage": null
    })
}

fn usage_chunk(usage: Value) -> Value {
    json!({
        "id": "chatcmpl-9lEnqrmnvNQfTGvh6fEabQzzcVpXx",
        "object": "chat.completion.chunk",
        "created": 1721046534,
        "model": "gpt-4o-2024-05-13",
        "system_fingerprint": "fp_400f27fa1f",
        "choices": [],
        "usage": usage
    })
}

fn feed_openai(chunks: &[Value]) -> (Vec<StreamDelta>, openai::StreamAccumulator) {
    let mut acc = openai::StreamAccumulator::new();
    let deltas = chunks.iter().filter_map(|c| acc.push(c).expect("a valid chunk")).collect();
    (deltas, acc)
}

#[test]
fn openai_stream_text_with_usage() {
    let usage = json!({
        "prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
        "prompt_tokens_details": { "cached_tokens": 0 }, "completion_tokens_details": { "reasoning_tokens": 0 }
    });
    let chunks = [
        chunk(json!({ "role": "assistant", "content": "", "refusal": null }), Value::Null),
        chunk(json!({ "content": "Hello" }), Value::Null),
        chunk(json!({ "content": " there" }), Value::Null),
        chunk(json!({ "content": "!" }), Value::Null),
        chunk(json!({}), json!("stop")),
        usage_chunk(usage.clone()),
    ];
    let (deltas, acc) = feed_openai(&chunks);
    assert_eq!(
        deltas,
        vec![text_delta("Hello"), text_delta(" there"), text_delta("!"), finish_delta("stop")]
    );
    assert_eq!(
        acc.finish().expect("complete"),
        LlmResponse {
            model: "gpt-4o-2024-05-13".into(),
            content: Some("Hello there!".into()),
            tool_calls: None,
            finish_reason: Some("stop".into()),
            usage: Some(usage),
            cost: None,
            images: None,
            reasoning: None,
            provider_blocks: None,
        }
    );
}

/// Splits `s` into pieces of at most `n` characters.
fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n).map(|c| c.iter().collect()).collect()
}

#[test]
fn openai_stream_parallel_tool_calls_split_across_many_chunks() {
    let paris = "{\"location\": \"Paris, France\", \"unit\": \"celsius\"}";
    let bogota = "{\"location\": \"Bogotá, Colombia\", \"unit\": \"celsius\"}";
    let mut chunks =
        vec![chunk(json!({ "role": "assistant", "content": null, "refusal": null }), Value::Null)];
    for (index, id, args) in
        [(0, "call_DdmO9pD3xa9XTPNJ32zg2hcA", paris), (1, "call_ABCDEF0123456789abcdefgh", bogota)]
    {
        chunks.push(chunk(
            json!({ "tool_calls": [{ "index": index, "id": id, "type": "function", "function": { "name": "get_weather", "arguments": "" } }] }),
            Value::Null,
        ));
        for piece in pieces(args, 3) {
            chunks.push(chunk(
                json!({ "tool_calls": [{ "index": index, "function": { "arguments": piece } }] }),
                Value::Null,
            ));
        }
    }
    chunks.push(chunk(json!({}), json!("tool_calls")));
    chunks.push(usage_chunk(json!({ "prompt_tokens": 80, "completion_tokens": 60, "total_tokens": 140 })));

    let (deltas, acc) = feed_openai(&chunks);
    // One delta announcing each call, one per argument piece, one finish.
    assert_eq!(deltas.len(), 2 + pieces(paris, 3).len() + pieces(bogota, 3).len() + 1);
    assert_eq!(deltas[0], call_delta("call_DdmO9pD3xa9XTPNJ32zg2hcA", Some("get_weather"), None));
    assert_eq!(deltas[1], call_delta("call_DdmO9pD3xa9XTPNJ32zg2hcA", None, Some("{\"l")));
    let second_start = 1 + pieces(paris, 3).len();
    assert_eq!(deltas[second_start], call_delta("call_ABCDEF0123456789abcdefgh", Some("get_weather"), None));
    assert_eq!(deltas.last(), Some(&finish_delta("tool_calls")));

    // Forwarded fragments reassemble to the same arguments as the final response.
    let forwarded: String = deltas
        .iter()
        .flat_map(|d| d.tool_calls.iter().flatten())
        .filter(|c| c.id == "call_ABCDEF0123456789abcdefgh")
        .filter_map(|c| c.arguments.as_deref())
        .collect();
    assert_eq!(forwarded, bogota);

    let response = acc.finish().expect("complete");
    assert_eq!(
        response.tool_calls,
        Some(vec![
            ToolCall::function("call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather", paris),
            ToolCall::function("call_ABCDEF0123456789abcdefgh", "get_weather", bogota),
        ])
    );
    assert_eq!(response.content, None);
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.usage,
        Some(json!({ "prompt_tokens": 80, "completion_tokens": 60, "total_tokens": 140 }))
    );
}

#[test]
fn openai_stream_interleaved_fragments_are_keyed_by_index() {
    let chunks = [
        chunk(
            json!({ "tool_calls": [
                { "index": 0, "id": "call_a", "type": "function", "function": { "name": "now", "arguments": "" } },
                { "index": 1, "id": "call_b", "type": "function", "function": { "name": "get_weather", "arguments": "{\"ci" } }
            ] }),
            Value::Null,
        ),
        chunk(
            json!({ "tool_calls": [{ "index": 1, "function": { "arguments": "ty\":\"Os" } }] }),
            Value::Null,
        ),
        chunk(json!({ "tool_calls": [{ "index": 0, "function": { "arguments": "{}" } }] }), Value::Null),
        chunk(json!({ "tool_calls": [{ "index": 1, "function": { "arguments": "lo\"}" } }] }), Value::Null),
        chunk(json!({}), json!("tool_calls")),
    ];
    let (deltas, acc) = feed_openai(&chunks);
    assert_eq!(
        deltas[0].tool_calls,
        Some(vec![
            ToolCallDelta { id: "call_a".into(), name: Some("now".into()), arguments: None },
            ToolCallDelta {
                id: "call_b".into(),
                name: Some("get_weather".into()),
                arguments: Some("{\"ci".into())
            },
        ])
    );
    assert_eq!(
        acc.finish().expect("complete").tool_calls,
        Some(vec![
            ToolCall::function("call_a", "now", "{}"),
            ToolCall::function("call_b", "get_weather", "{\"city\":\"Oslo\"}")
        ])
    );
}

#[test]
fn openai_stream_calls_without_ids_or_indexes() {
    // Some compatible servers send whole calls without `index`, and some without `id`.
    let chunks = [
        chunk(
            json!({ "tool_calls": [{ "id": "x1", "function": { "name": "now", "arguments": "{}" } }] }),
            Value::Null,
        ),
        chunk(
            json!({ "tool_calls": [{ "id": "x2", "function": { "name": "now", "arguments": "{\"tz\":1}" } }] }),
            Value::Null,
        ),
        chunk(
            json!({ "tool_calls": [{ "index": 5, "function": { "name": "get_weather", "arguments": "{}" } }] }),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
    ];
    let (_, acc) = feed_openai(&chunks);
    assert_eq!(
        acc.finish().expect("complete").tool_calls,
        Some(vec![
            ToolCall::function("x1", "now", "{}"),
            ToolCall::function("x2", "now", "{\"tz\":1}"),
            ToolCall::function("call_5", "get_weather", "{}"),
        ])
    );
}

#[test]
fn openai_stream_reasoning_fields() {
    // DeepSeek / vLLM send `reasoning_content`, OpenRouter `reasoning`.
    let chunks = [
        chunk(json!({ "role": "assistant", "content": null, "reasoning_content": "Let me" }), Value::Null),
        chunk(json!({ "content": null, "reasoning_content": " think." }), Value::Null),
        chunk(json!({ "content": null, "reasoning": "Still thinking." }), Value::Null),
        chunk(json!({ "content": "42", "reasoning_content": null }), Value::Null),
        chunk(json!({ "content": "" }), json!("stop")),
    ];
    let (deltas, acc) = feed_openai(&chunks);
    assert_eq!(
        deltas,
        vec![
            reasoning_delta("Let me"),
            reasoning_delta(" think."),
            reasoning_delta("Still thinking."),
            text_delta("42"),
            finish_delta("stop"),
        ]
    );
    let response = acc.finish().expect("complete");
    assert_eq!(response.content.as_deref(), Some("42"));
    assert_eq!(response.reasoning.as_deref(), Some("Let me think.Still thinking."), "recorded as streamed");
    assert_eq!(response.usage, None);
}

#[test]
fn openai_stream_truncated_by_length() {
    let chunks = [chunk(json!({ "content": "Once upon" }), Value::Null), chunk(json!({}), json!("length"))];
    let (_, acc) = feed_openai(&chunks);
    let response = acc.finish().expect("complete");
    assert!(response.is_truncated());
    assert_eq!(response.content.as_deref(), Some("Once upon"));
}

#[test]
fn openai_stream_refusal() {
    let chunks = [
        chunk(json!({ "role": "assistant", "content": null, "refusal": "" }), Value::Null),
        chunk(json!({ "refusal": "I'm sorry, " }), Value::Null),
        chunk(json!({ "refusal": "I can't help with that." }), Value::Null),
        chunk(json!({}), json!("stop")),
    ];
    let (deltas, acc) = feed_openai(&chunks);
    assert_eq!(deltas[0], text_delta("I'm sorry, "));
    let response = acc.finish().expect("complete");
    assert!(response.is_refused());
    assert_eq!(response.content.as_deref(), Some("I'm sorry, I can't help with that."));
}

#[test]
fn openai_stream_azure_filter_chunk_and_other_choices() {
    let filter = json!({
        "id": "", "object": "", "created": 0, "model": "",
        "choices": [],
        "prompt_filter_results": [{ "prompt_index": 0, "content_filter_results": {} }]
    });
    let other_choice = json!({
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
        "choices": [{ "index": 1, "delta": { "content": "ignored" }, "finish_reason": null }]
    });
    let mut acc = openai::StreamAccumulator::new();
    assert_eq!(acc.push(&filter), Ok(None));
    assert_eq!(acc.push(&other_choice), Ok(None));
    assert_eq!(
        acc.push(&chunk(json!({ "content": "ok" }), json!("stop"))).expect("valid").map(|d| d.text),
        Some(Some("ok".into()))
    );
    let response = acc.finish().expect("complete");
    assert_eq!(response.model, "gpt-4o");
    assert_eq!(response.content.as_deref(), Some("ok"));
}

#[test]
fn openai_stream_errors() {
    // Cut short: no finish_reason.
    let (_, acc) = feed_openai(&[chunk(json!({ "content": "Hel" }), Value::Null)]);
    assert_eq!(
        acc.finish(),
        Err(FormatError::new(
            "choices[0].finish_reason",
            "the stream ended before a finish_reason (cut short?)"
        ))
    );

    // A call that is never named.
    let (_, acc) = feed_openai(&[
        chunk(
            json!({ "tool_calls": [{ "index": 0, "id": "call_1", "function": { "arguments": "{}" } }] }),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
    ]);
    assert_eq!(
        acc.finish(),
        Err(FormatError::new("tool_calls[0].function.name", "tool call \"call_1\" was never named"))
    );

    // An error mid-stream (OpenRouter style).
    let mut acc = openai::StreamAccumulator::new();
    let err = acc
        .push(&json!({ "id": "gen-1", "object": "chat.completion.chunk", "error": { "code": "server_error", "message": "Provider disconnected" } }))
        .expect_err("an error chunk");
    assert_eq!(err, FormatError::new("error", "server_error: Provider disconnected"));

    // A malformed fragment names its path.
    let mut acc = openai::StreamAccumulator::new();
    let bad = chunk(
        json!({ "tool_calls": [{ "index": 0, "id": "c", "function": { "name": "now", "arguments": 7 } }] }),
        Value::Null,
    );
    assert_eq!(
        acc.push(&bad),
        Err(FormatError::new(
            "choices[0].delta.tool_calls[0].function.arguments",
            "expected a string, found a number"
        ))
    );
    let bad = chunk(json!({ "tool_calls": [{ "index": -1 }] }), Value::Null);
    assert_eq!(
        acc.push(&bad),
        Err(FormatError::new(
            "choices[0].delta.tool_calls[0].index",
            "expected a non-negative integer, found a number"
        ))
    );
    assert_eq!(acc.push(&json!("[DONE]")), Err(FormatError::new("", "expected an object, found a string")));
}

// ---------------------------------------------------------------- Anthropic requests

#[test]
fn anthropic_request_maps_every_field() {
    let mut messages = conversation();
    if let Some(list) = messages.as_array_mut() {
        list.insert(
            1,
            json!({ "role": "system", "content": [{ "type": "text", "text": "Use metric units." }] }),
        );
    }
    let request = req(json!({
        "model": "claude-sonnet-4-5",
        "messages": messages,
        "tools": weather_tools(),
        "temperature": 0.2,
        "max_completion_tokens": 1000
    }));
    assert_eq!(
        anthropic::request(&request, false).expect("converts"),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1000,
            "system": "You are a weather bot.\n\nUse metric units.",
            "messages": [
                { "role": "user", "content": [
                    { "type": "text", "text": "Weather in Paris and Bogotá? Here is a photo." },
                    { "type": "image", "source": { "type": "url", "url": "https://example.com/sky.jpg" } }
                ] },
                { "role": "assistant", "content": [
                    { "type": "text", "text": "Let me check both." },
                    { "type": "tool_use", "id": "call_1", "name": "get_weather", "input": { "city": "Paris" } },
                    { "type": "tool_use", "id": "call_2", "name": "get_weather", "input": { "city": "Bogotá" } }
                ] },
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "call_1", "content": "18C, cloudy" },
                    { "type": "tool_result", "tool_use_id": "call_2", "content": "24C, sunny" }
                ] },
                { "role": "user", "content": "Thanks!" }
            ],
            "tools": [
                {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "input_schema": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] }
                },
                { "name": "now", "description": "The current time.", "input_schema": { "type": "object", "properties": {} } }
            ],
            "temperature": 0.2
        })
    );
}

#[test]
fn anthropic_request_defaults_and_streaming() {
    let request = req(
        json!({ "model": "claude-haiku-4-5", "messages": [{ "role": "user", "content": "Hi" }], "tools": [] }),
    );
    assert_eq!(
        anthropic::request(&request, true).expect("converts"),
        json!({
            "model": "claude-haiku-4-5",
            "max_tokens": anthropic::DEFAULT_MAX_TOKENS,
            "messages": [{ "role": "user", "content": "Hi" }],
            "stream": true
        })
    );
    assert_eq!(anthropic::DEFAULT_MAX_TOKENS, 4096);
}

#[test]
fn anthropic_request_thinking() {
    let body = |reasoning: Value, max: Value| {
        let mut r = json!({ "model": "claude-sonnet-4-5", "messages": [], "reasoning": reasoning });
        if !max.is_null() {
            r["max_completion_tokens"] = max;
        }
        anthropic::request(&req(r), false).expect("converts")
    };
    let thinking = |budget: u64| json!({ "type": "enabled", "budget_tokens": budget });

    // Explicit budget and cap.
    let b = body(json!({ "max_tokens": 10000 }), json!(16000));
    assert_eq!((b["max_tokens"].clone(), b["thinking"].clone()), (json!(16000), thinking(10000)));
    // Enabled only: default budget, default cap plus budget.
    let b = body(json!({ "enabled": true }), Value::Null);
    assert_eq!(
        (b["max_tokens"].clone(), b["thinking"].clone()),
        (
            json!(anthropic::DEFAULT_MAX_TOKENS + anthropic::DEFAULT_THINKING_BUDGET),
            thinking(anthropic::DEFAULT_THINKING_BUDGET)
        )
    );
    // Effort picks the budget.
    let b = body(json!({ "effort": "high" }), Value::Null);
    assert_eq!((b["max_tokens"].clone(), b["thinking"].clone()), (json!(4096 + 16384), thinking(16384)));
    let b = body(json!({ "effort": "minimal" }), json!(8000));
    assert_eq!((b["max_tokens"].clone(), b["thinking"].clone()), (json!(8000), thinking(1024)));
    // Off switches win; exclude alone does nothing.
    for off in [
        json!({ "enabled": false, "max_tokens": 5000 }),
        json!({ "effort": "none", "max_tokens": 5000 }),
        json!({ "exclude": true }),
    ] {
        let b = body(off.clone(), Value::Null);
        assert_eq!((b["max_tokens"].clone(), b.get("thinking")), (json!(4096), None), "{off}");
    }
}

#[test]
fn anthropic_request_tool_arguments_that_are_not_objects_become_empty_input() {
    let request = req(json!({
        "model": "claude-sonnet-4-5",
        "messages": [
            { "role": "user", "content": "go" },
            { "role": "assistant", "content": "", "tool_calls": [
                { "id": "t1", "type": "function", "function": { "name": "now", "arguments": "" } },
                { "id": "t2", "type": "function", "function": { "name": "now", "arguments": "{\"tz\": \"UT" } },
                { "id": "t3", "type": "function", "function": { "name": "now", "arguments": "[1, 2]" } }
            ] },
            { "role": "tool", "tool_call_id": "t1", "content": [{ "type": "text", "text": "12:00" }] },
            { "role": "tool", "tool_call_id": "t2", "content": "error: invalid arguments" },
            { "role": "tool", "tool_call_id": "t3" }
        ]
    }));
    let body = anthropic::request(&request, false).expect("converts");
    assert_eq!(
        body["messages"],
        json!([
            { "role": "user", "content": "go" },
            { "role": "assistant", "content": [
                { "type": "tool_use", "id": "t1", "name": "now", "input": {} },
                { "type": "tool_use", "id": "t2", "name": "now", "input": {} },
                { "type": "tool_use", "id": "t3", "name": "now", "input": {} }
            ] },
            { "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "t1", "content": [{ "type": "text", "text": "12:00" }] },
                { "type": "tool_result", "tool_use_id": "t2", "content": "error: invalid arguments" },
                { "type": "tool_result", "tool_use_id": "t3" }
            ] }
        ])
    );
}

#[test]
fn anthropic_request_media_parts() {
    let request = req(json!({
        "model": "claude-sonnet-4-5",
        "messages": [
            { "role": "user", "content": [
                { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } },
                { "type": "image_url", "image_url": { "url": "HTTPS://example.com/a.webp" } },
                { "type": "file", "file": { "filename": "report.pdf", "file_data": "data:application/pdf;base64,JVBERi0xLjQ=" } },
                { "type": "file", "file": { "filename": "scan.PDF", "file_data": "JVBERi0xLjU=" } },
                { "type": "file", "file": { "filename": "photo.jpg", "file_data": "/9j/4AAQ" } }
            ] }
        ]
    }));
    assert_eq!(
        anthropic::request(&request, false).expect("converts")["messages"][0]["content"],
        json!([
            { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=" } },
            { "type": "image", "source": { "type": "url", "url": "HTTPS://example.com/a.webp" } },
            { "type": "document", "source": { "type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ=" }, "title": "report.pdf" },
            { "type": "document", "source": { "type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjU=" }, "title": "scan.PDF" },
            { "type": "image", "source": { "type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ" } }
        ])
    );
}

#[test]
fn anthropic_request_refuses_what_it_cannot_carry() {
    let convert =
        |messages: Value| anthropic::request(&req(json!({ "model": "claude", "messages": messages })), false);
    let user = |part: Value| json!([{ "role": "user", "content": "hi" }, { "role": "user", "content": [{ "type": "text", "text": "see" }, part] }]);
    let cases = [
        (
            user(json!({ "type": "input_audio", "input_audio": { "data": "UklGRg==", "format": "wav" } })),
            FormatError::new("messages[1].content[1]", "Anthropic cannot carry input_audio parts"),
        ),
        (
            user(json!({ "type": "video_url", "video_url": { "url": "https://example.com/v.mp4" } })),
            FormatError::new("messages[1].content[1]", "Anthropic cannot carry video_url parts"),
        ),
        (
            user(json!({ "type": "image_url", "image_url": { "url": "data:image/svg+xml,%3Csvg%3E" } })),
            FormatError::new("messages[1].content[1].image_url.url", "Anthropic takes base64 data URLs only"),
        ),
        (
            user(json!({ "type": "image_url", "image_url": { "url": "ftp://example.com/a.png" } })),
            FormatError::new(
                "messages[1].content[1].image_url.url",
                "Anthropic takes images as data: or http(s) URLs",
            ),
        ),
        (
            user(json!({ "type": "file", "file": { "filename": "notes.txt", "file_data": "aGVsbG8=" } })),
            FormatError::new(
                "messages[1].content[1].file.filename",
                "cannot tell the media type of \"notes.txt\"; send the file as a data URL",
            ),
        ),
        (
            user(
                json!({ "type": "file", "file": { "filename": "notes.txt", "file_data": "data:text/plain;base64,aGVsbG8=" } }),
            ),
            FormatError::new(
                "messages[1].content[1].file.file_data",
                "Anthropic takes PDF and image files only, not text/plain",
            ),
        ),
        (
            json!([{ "role": "user", "content": "hi" }, { "role": "system", "content": "late" }]),
            FormatError::new(
                "messages[1].role",
                "Anthropic takes system messages only at the start of the conversation",
            ),
        ),
        (
            json!([{ "role": "system", "content": [{ "type": "image_url", "image_url": { "url": "https://x/y.png" } }] }]),
            FormatError::new(
                "messages[0].content[0]",
                "an Anthropic system prompt carries only text, not image_url parts",
            ),
        ),
        (
            json!([{ "role": "user", "content": "hi" }, { "role": "assistant", "content": [{ "type": "file", "file": { "filename": "a.pdf", "file_data": "data:application/pdf;base64,AA==" } }] }]),
            FormatError::new(
                "messages[1].content[0]",
                "Anthropic assistant messages carry only text, not file parts",
            ),
        ),
        (
            json!([{ "role": "user", "content": "hi" }, { "role": "tool", "content": "orphan" }]),
            FormatError::new("messages[1].tool_call_id", "a tool message must name the call it answers"),
        ),
        (
            json!([{ "role": "tool", "tool_call_id": "t", "content": [{ "type": "input_audio", "input_audio": { "data": "", "format": "mp3" } }] }]),
            FormatError::new("messages[0].content[0]", "Anthropic cannot carry input_audio parts"),
        ),
    ];
    for (messages, expected) in cases {
        assert_eq!(convert(messages.clone()), Err(expected), "{messages}");
    }
}

// ---------------------------------------------------------------- Anthropic responses

#[test]
fn anthropic_response_text_and_parallel_tool_use() {
    let body = json!({
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            { "type": "text", "text": "I'll check the weather in both cities." },
            { "type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather", "input": { "location": "San Francisco, CA", "unit": "celsius" } },
            { "type": "tool_use", "id": "toolu_01B09q90qw90lq917835lq9", "name": "get_time", "input": {} }
        ],
        "stop_reason": "tool_use",
        "stop_sequence": null,
        "usage": { "input_tokens": 472, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 91, "service_tier": "standard" }
    });
    assert_eq!(
        anthropic::response(&body).expect("parses"),
        LlmResponse {
            model: "claude-sonnet-4-5-20250929".into(),
            content: Some("I'll check the weather in both cities.".into()),
            tool_calls: Some(vec![
                ToolCall::function(
                    "toolu_01A09q90qw90lq917835lq9",
                    "get_weather",
                    "{\"location\":\"San Francisco, CA\",\"unit\":\"celsius\"}"
                ),
                ToolCall::function("toolu_01B09q90qw90lq917835lq9", "get_time", "{}"),
            ]),
            finish_reason: Some("tool_calls".into()),
            usage: Some(body["usage"].clone()),
            cost: None,
            images: None,
            reasoning: None,
            provider_blocks: None,
        }
    );
}

#[test]
fn anthropic_response_thinking_is_skipped_and_text_joined() {
    let body = json!({
        "id": "msg_02", "type": "message", "role": "assistant", "model": "claude-opus-4-1",
        "content": [
            { "type": "thinking", "thinking": "The user wants a number.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..." },
            { "type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a" },
            { "type": "text", "text": "The answer is " },
            { "type": "text", "text": "42.", "citations": null }
        ],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": { "input_tokens": 10, "output_tokens": 30 }
    });
    let response = anthropic::response(&body).expect("parses");
    assert_eq!(response.content.as_deref(), Some("The answer is 42."));
    assert_eq!(response.tool_calls, None);
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn anthropic_response_stop_reasons() {
    let cases = [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
    ];
    for (stop, expected) in cases {
        let body = json!({
            "id": "msg", "type": "message", "role": "assistant", "model": "claude",
            "content": [{ "type": "text", "text": "x" }], "stop_reason": stop, "stop_sequence": null,
            "usage": { "input_tokens": 1, "output_tokens": 1 }
        });
        assert_eq!(
            anthropic::response(&body).expect("parses").finish_reason.as_deref(),
            Some(expected),
            "{stop}"
        );
    }
    let truncated = json!({
        "id": "msg", "type": "message", "role": "assistant", "model": "claude",
        "content": [{ "type": "text", "text": "Once upon a" }], "stop_reason": "max_tokens",
        "usage": { "input_tokens": 5, "output_tokens": 3 }
    });
    assert!(anthropic::response(&truncated).expect("parses").is_truncated());
    let refused = json!({ "model": "claude", "content": [], "stop_reason": "refusal" });
    let refused = anthropic::response(&refused).expect("parses");
    assert!(refused.is_refused());
    assert_eq!(refused.content, None);
}

#[test]
fn anthropic_response_errors() {
    let overloaded = json!({ "type": "error", "error": { "type": "overloaded_error", "message": "Overloaded" }, "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy" });
    assert_eq!(
        anthropic::response(&overloaded),
        Err(FormatError::new("error", "overloaded_error: Overloaded"))
    );
    let cases = [
        (json!({ "content": [] }), "model", "missing"),
        (json!({ "model": "claude" }), "content", "missing"),
        (
            json!({ "model": "claude", "content": [{ "type": "text", "text": "a" }, { "type": "tool_use", "name": "x", "input": {} }] }),
            "content[1].id",
            "missing",
        ),
        (json!({ "model": "claude", "content": [{ "text": "a" }] }), "content[0].type", "missing"),
        (json!({ "model": "claude", "content": ["a"] }), "content[0]", "expected an object, found a string"),
    ];
    for (body, path, message) in cases {
        assert_eq!(anthropic::response(&body), Err(FormatError::new(path, message)), "{body}");
    }
}

// ---------------------------------------------------------------- Anthropic streams

fn message_start(model: &str, usage: Value) -> (&'static str, Value) {
    (
        "message_start",
        json!({
            "type": "message_start",
            "message": {
                "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": usage
            }
        }),
    )
}

fn block_start(index: u64, block: Value) -> (&'static str, Value) {
    ("content_block_start", json!({ "type": "content_block_start", "index": index, "content_block": block }))
}

fn block_delta(index: u64, delta: Value) -> (&'static str, Value) {
    ("content_block_delta", json!({ "type": "content_block_delta", "index": index, "delta": delta }))
}

fn block_stop(index: u64) -> (&'static str, Value) {
    ("content_block_stop", json!({ "type": "content_block_stop", "index": index }))
}

fn message_delta(stop_reason: &str, usage: Value) -> (&'static str, Value) {
    (
        "message_delta",
        json!({ "type": "message_delta", "delta": { "stop_reason": stop_reason, "stop_sequence": null }, "usage": usage }),
    )
}

fn message_stop() -> (&'static str, Value) {
    ("message_stop", json!({ "type": "message_stop" }))
}

fn ping() -> (&'static str, Value) {
    ("ping", json!({ "type": "ping" }))
}

fn feed_anthropic(events: &[(&str, Value)]) -> (Vec<StreamDelta>, anthropic::StreamAccumulator) {
    let mut acc = anthropic::StreamAccumulator::new();
    let deltas =
        events.iter().filter_map(|(event, data)| acc.push(event, data).expect("a valid event")).collect();
    (deltas, acc)
}

#[test]
fn anthropic_stream_text() {
    let events = [
        message_start(
            "claude-opus-4-1-20250805",
            json!({ "input_tokens": 25, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1, "service_tier": "standard" }),
        ),
        block_start(0, json!({ "type": "text", "text": "" })),
        ping(),
        block_delta(0, json!({ "type": "text_delta", "text": "Hello" })),
        block_delta(0, json!({ "type": "text_delta", "text": "!" })),
        block_stop(0),
        message_delta("end_turn", json!({ "output_tokens": 15, "cache_creation_input_tokens": null })),
        message_stop(),
    ];
    let (deltas, acc) = feed_anthropic(&events);
    assert_eq!(deltas, vec![text_delta("Hello"), text_delta("!"), finish_delta("stop")]);
    assert_eq!(
        acc.finish().expect("complete"),
        LlmResponse {
            model: "claude-opus-4-1-20250805".into(),
            content: Some("Hello!".into()),
            tool_calls: None,
            finish_reason: Some("stop".into()),
            usage: Some(json!({
                "input_tokens": 25, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                "output_tokens": 15, "service_tier": "standard"
            })),
            cost: None,
            images: None,
            reasoning: None,
            provider_blocks: None,
        }
    );
}

#[test]
fn anthropic_stream_thinking_text_and_parallel_tool_use_split_across_many_events() {
    let paris = "{\"location\": \"Paris, France\"}";
    let tokyo = "{\"location\": \"Tokyo, Japan\", \"unit\": \"celsius\"}";
    let mut events = vec![
        message_start("claude-sonnet-4-5-20250929", json!({ "input_tokens": 472, "output_tokens": 2 })),
        block_start(0, json!({ "type": "thinking", "thinking": "" })),
        block_delta(0, json!({ "type": "thinking_delta", "thinking": "Two cities, " })),
        block_delta(0, json!({ "type": "thinking_delta", "thinking": "two calls." })),
        block_delta(
            0,
            json!({ "type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..." }),
        ),
        block_stop(0),
        block_start(1, json!({ "type": "text", "text": "" })),
        block_delta(1, json!({ "type": "text_delta", "text": "Checking both." })),
        block_stop(1),
    ];
    for (index, id, args) in
        [(2, "toolu_01T1x1fJ34qAmk2tNTrN7Up6", paris), (3, "toolu_02U2y2gK45rBnl3uOUsO8Vq7", tokyo)]
    {
        events.push(block_start(
            index,
            json!({ "type": "tool_use", "id": id, "name": "get_weather", "input": {} }),
        ));
        events.push(block_delta(index, json!({ "type": "input_json_delta", "partial_json": "" })));
        for piece in pieces(args, 4) {
            events.push(block_delta(index, json!({ "type": "input_json_delta", "partial_json": piece })));
        }
        events.push(block_stop(index));
    }
    events.push(message_delta("tool_use", json!({ "output_tokens": 89 })));
    events.push(message_stop());

    let (deltas, acc) = feed_anthropic(&events);
    assert_eq!(deltas[0], reasoning_delta("Two cities, "));
    assert_eq!(deltas[1], reasoning_delta("two calls."));
    assert_eq!(deltas[2], text_delta("Checking both."));
    assert_eq!(deltas[3], call_delta("toolu_01T1x1fJ34qAmk2tNTrN7Up6", Some("get_weather"), None));
    assert_eq!(deltas[4], call_delta("toolu_01T1x1fJ34qAmk2tNTrN7Up6", None, Some("{\"lo")));
    assert_eq!(deltas.len(), 3 + 2 + pieces(paris, 4).len() + pieces(tokyo, 4).len() + 1);
    assert_eq!(deltas.last(), Some(&finish_delta("tool_calls")));

    let response = acc.finish().expect("complete");
    assert_eq!(response.content.as_deref(), Some("Checking both."));
    assert_eq!(response.reasoning.as_deref(), Some("Two cities, two calls."), "recorded as streamed");
    assert_eq!(
        response.tool_calls,
        Some(vec![
            ToolCall::function("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather", paris),
            ToolCall::function("toolu_02U2y2gK45rBnl3uOUsO8Vq7", "get_weather", tokyo),
        ])
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(response.usage, Some(json!({ "input_tokens": 472, "output_tokens": 89 })));
}

#[test]
fn anthropic_stream_tool_use_without_input_deltas() {
    // A tool with no arguments streams no input_json_delta at all; a proxy may put the input in the start block.
    let events = [
        message_start("claude", json!({ "input_tokens": 1, "output_tokens": 1 })),
        block_start(0, json!({ "type": "tool_use", "id": "toolu_a", "name": "now", "input": {} })),
        block_stop(0),
        block_start(
            1,
            json!({ "type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": { "city": "Oslo" } }),
        ),
        block_stop(1),
        message_delta("tool_use", json!({ "output_tokens": 20 })),
        message_stop(),
    ];
    let (_, acc) = feed_anthropic(&events);
    assert_eq!(
        acc.finish().expect("complete").tool_calls,
        Some(vec![
            ToolCall::function("toolu_a", "now", "{}"),
            ToolCall::function("toolu_b", "get_weather", "{\"city\":\"Oslo\"}")
        ])
    );
}

#[test]
fn anthropic_stream_truncated_by_max_tokens() {
    let events = [
        message_start("claude", json!({ "input_tokens": 12, "output_tokens": 1 })),
        block_start(0, json!({ "type": "text", "text": "" })),
        block_delta(0, json!({ "type": "text_delta", "text": "Once upon a" })),
        block_stop(0),
        message_delta("max_tokens", json!({ "output_tokens": 3 })),
        message_stop(),
    ];
    let (deltas, acc) = feed_anthropic(&events);
    assert_eq!(deltas.last(), Some(&finish_delta("length")));
    assert!(acc.finish().expect("complete").is_truncated());
}

#[test]
fn anthropic_stream_event_name_from_data_type() {
    let mut acc = anthropic::StreamAccumulator::new();
    let (_, start) = message_start("claude", json!({ "input_tokens": 1, "output_tokens": 1 }));
    for data in [
        start,
        json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "Hi" } }),
        json!({ "type": "message_delta", "delta": { "stop_reason": "end_turn" }, "usage": { "output_tokens": 2 } }),
        json!({ "type": "message_stop" }),
    ] {
        acc.push("", &data).expect("valid");
    }
    let response = acc.finish().expect("complete");
    assert_eq!(response.content.as_deref(), Some("Hi"));
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn anthropic_stream_errors() {
    let mut acc = anthropic::StreamAccumulator::new();
    let err = acc
        .push(
            "error",
            &json!({ "type": "error", "error": { "type": "overloaded_error", "message": "Overloaded" } }),
        )
        .expect_err("an error event");
    assert_eq!(err, FormatError::new("error", "overloaded_error: Overloaded"));
    assert_eq!(err.to_string(), "error: overloaded_error: Overloaded");

    // Never started.
    assert_eq!(
        anthropic::StreamAccumulator::new().finish(),
        Err(FormatError::new("message_start", "the stream never started"))
    );

    // Cut short before message_stop.
    let (_, acc) = feed_anthropic(&[
        message_start("claude", json!({ "input_tokens": 1, "output_tokens": 1 })),
        block_start(0, json!({ "type": "text", "text": "" })),
        block_delta(0, json!({ "type": "text_delta", "text": "Hel" })),
    ]);
    assert_eq!(
        acc.finish(),
        Err(FormatError::new("message_stop", "the stream ended before message_stop (cut short?)"))
    );

    // Malformed events name their path.
    let mut acc = anthropic::StreamAccumulator::new();
    let (event, data) = message_start("claude", json!({}));
    acc.push(event, &data).expect("valid");
    let (event, data) = block_delta(3, json!({ "type": "text_delta", "text": "x" }));
    assert_eq!(
        acc.push(event, &data),
        Err(FormatError::new("content_block_delta.index", "content block 3 was never started"))
    );
    let (event, data) = block_start(0, json!({ "type": "tool_use", "name": "now", "input": {} }));
    assert_eq!(
        acc.push(event, &data),
        Err(FormatError::new("content_block_start.content_block.id", "missing"))
    );
    let (event, data) = block_start(0, json!({ "type": "text", "text": "" }));
    acc.push(event, &data).expect("valid");
    let (event, data) = block_start(0, json!({ "type": "text", "text": "" }));
    assert_eq!(
        acc.push(event, &data),
        Err(FormatError::new("content_block_start.index", "content block 0 started twice"))
    );
    let (event, data) = block_delta(0, json!({ "type": "input_json_delta", "partial_json": "{" }));
    assert_eq!(
        acc.push(event, &data),
        Err(FormatError::new(
            "content_block_delta.delta.type",
            "input_json_delta does not fit content block 0"
        ))
    );
    let (event, data) = block_delta(0, json!({ "type": "text_delta" }));
    assert_eq!(acc.push(event, &data), Err(FormatError::new("content_block_delta.delta.text", "missing")));
    assert_eq!(
        acc.push("message_start", &json!({ "type": "message_start", "message": { "model": 1 } })),
        Err(FormatError::new("message_start.message.model", "expected a string, found a number"))
    );
    // Unknown events and deltas are ignored.
    assert_eq!(acc.push("future_event", &json!({ "type": "future_event" })), Ok(None));
    let (event, data) = block_delta(0, json!({ "type": "citations_delta", "citation": {} }));
    assert_eq!(acc.push(event, &data), Ok(None));
}

// ---------------------------------------------------------------- dispatch

#[test]
fn dispatch_by_format() {
    let request = req(json!({ "model": "m", "messages": [{ "role": "user", "content": "Hi" }] }));
    assert_eq!(llm_format::request(LlmFormat::Openai, &request, false), Ok(openai::request(&request, false)));
    assert_eq!(llm_format::request(LlmFormat::Anthropic, &request, true), anthropic::request(&request, true));

    let openai_body =
        json!({ "model": "gpt", "choices": [{ "message": { "content": "a" }, "finish_reason": "stop" }] });
    assert_eq!(llm_format::response(LlmFormat::Openai, &openai_body), openai::response(&openai_body));
    let anthropic_body =
        json!({ "model": "claude", "content": [{ "type": "text", "text": "a" }], "stop_reason": "end_turn" });
    assert_eq!(
        llm_format::response(LlmFormat::Anthropic, &anthropic_body),
        anthropic::response(&anthropic_body)
    );

    let mut acc = llm_format::StreamAccumulator::new(LlmFormat::Openai);
    assert_eq!(
        acc.push("", &chunk(json!({ "content": "a" }), json!("stop"))).expect("valid").and_then(|d| d.text),
        Some("a".into())
    );
    assert_eq!(acc.finish().expect("complete").content.as_deref(), Some("a"));

    let mut acc = llm_format::StreamAccumulator::new(LlmFormat::Anthropic);
    for (event, data) in [
        message_start("claude", json!({ "input_tokens": 1, "output_tokens": 1 })),
        block_start(0, json!({ "type": "text", "text": "" })),
        block_delta(0, json!({ "type": "text_delta", "text": "b" })),
        message_delta("end_turn", json!({ "output_tokens": 2 })),
        message_stop(),
    ] {
        acc.push(event, &data).expect("valid");
    }
    assert_eq!(acc.finish().expect("complete").content.as_deref(), Some("b"));
}

#[test]
fn whole_temperatures_stay_integers() {
    for (temperature, expected) in [(json!(1), json!(1)), (json!(0.7), json!(0.7)), (json!(0), json!(0))] {
        let request = req(json!({ "model": "m", "messages": [], "temperature": temperature }));
        assert_eq!(openai::request(&request, false)["temperature"], expected);
        assert_eq!(anthropic::request(&request, false).expect("converts")["temperature"], expected);
    }
}

/// Images a model produced are recorded in its assistant message; when the conversation goes
/// back to a model they are left out (both formats take only text back from the assistant), so
/// one generated image does not make every later request of the session invalid.
#[test]
fn images_in_assistant_messages_are_left_out_of_requests() {
    let request: LlmRequest = serde_json::from_value(json!({
        "model": "m",
        "messages": [
            { "role": "user", "content": "draw a cat" },
            { "role": "assistant", "content": [
                { "type": "text", "text": "Here it is" },
                { "type": "image_url", "image_url": { "url": "data:image/png;base64,AA==" } }
            ] },
            { "role": "user", "content": "thanks" }
        ]
    }))
    .unwrap();
    let anthropic = llm_format::request(LlmFormat::Anthropic, &request, false).unwrap();
    assert_eq!(
        anthropic["messages"][1],
        json!({"role": "assistant", "content": [{"type": "text", "text": "Here it is"}]})
    );
    let openai = llm_format::request(LlmFormat::Openai, &request, false).unwrap();
    assert_eq!(openai["messages"][1]["content"], json!([{"type": "text", "text": "Here it is"}]));
}

#[test]
fn reasoning_of_whole_responses_is_recorded() {
    let body = json!({
        "model": "deepseek-reasoner",
        "choices": [{ "index": 0, "finish_reason": "stop",
            "message": { "role": "assistant", "content": "42", "reasoning_content": "Six times seven." } }]
    });
    assert_eq!(openai::response(&body).unwrap().reasoning.as_deref(), Some("Six times seven."));
    let body = json!({
        "model": "claude", "stop_reason": "end_turn",
        "content": [
            { "type": "thinking", "thinking": "Six times ", "signature": "sig" },
            { "type": "thinking", "thinking": "seven." },
            { "type": "text", "text": "42" }
        ]
    });
    let response = anthropic::response(&body).unwrap();
    assert_eq!(
        (response.reasoning.as_deref(), response.content.as_deref()),
        (Some("Six times seven."), Some("42"))
    );
}

/// Thinking blocks survive the transcript: kept whole (signature and redacted blocks
/// included) from a `message` and from a stream, and sent back first in the assistant turn to
/// Anthropic, never to another provider's format.
#[test]
fn anthropic_thinking_blocks_are_kept_and_sent_back_unchanged() {
    let thinking = json!({ "type": "thinking", "thinking": "Check the weather.", "signature": "sig-1" });
    let redacted = json!({ "type": "redacted_thinking", "data": "opaque" });
    let body = json!({
        "model": "claude-sonnet-4-5", "stop_reason": "tool_use",
        "content": [thinking, redacted, { "type": "tool_use", "id": "toolu_1", "name": "weather", "input": {} }],
    });
    let response = anthropic::response(&body).expect("parses");
    let kept = *response.provider_blocks.clone().expect("the blocks are kept");
    assert_eq!(
        (kept.provider.as_str(), kept.blocks.clone()),
        ("anthropic", vec![thinking.clone(), redacted.clone()])
    );
    assert_eq!(response.reasoning.as_deref(), Some("Check the weather."));

    // Streamed: the thinking and its signature delta make the same block.
    let (_, acc) = feed_anthropic(&[
        ("message_start", json!({ "message": { "model": "claude-sonnet-4-5", "usage": {} } })),
        (
            "content_block_start",
            json!({ "index": 0, "content_block": { "type": "thinking", "thinking": "", "signature": "" } }),
        ),
        (
            "content_block_delta",
            json!({ "index": 0, "delta": { "type": "thinking_delta", "thinking": "Check the " } }),
        ),
        (
            "content_block_delta",
            json!({ "index": 0, "delta": { "type": "thinking_delta", "thinking": "weather." } }),
        ),
        (
            "content_block_delta",
            json!({ "index": 0, "delta": { "type": "signature_delta", "signature": "sig-1" } }),
        ),
        ("content_block_start", json!({ "index": 1, "content_block": redacted.clone() })),
        (
            "content_block_start",
            json!({ "index": 2, "content_block": { "type": "tool_use", "id": "toolu_1", "name": "weather", "input": {} } }),
        ),
        ("message_delta", json!({ "delta": { "stop_reason": "tool_use" } })),
        ("message_stop", json!({})),
    ]);
    assert_eq!(acc.finish().expect("complete").provider_blocks.as_deref(), Some(&kept));

    // Sent back first, unchanged, to Anthropic.
    let mut reply = json!({ "role": "assistant", "tool_calls": [
        { "id": "toolu_1", "type": "function", "function": { "name": "weather", "arguments": "{}" } }
    ] });
    reply["provider_blocks"] = serde_json::to_value(&kept).unwrap();
    let conversation = json!({ "model": "claude-sonnet-4-5", "messages": [
        { "role": "user", "content": "Weather?" },
        reply,
        { "role": "tool", "tool_call_id": "toolu_1", "content": "sunny" },
    ] });
    let sent = anthropic::request(&req(conversation.clone()), false).expect("converts");
    let content = &sent["messages"][1]["content"];
    assert_eq!(content[0], thinking);
    assert_eq!(content[1], redacted);
    assert_eq!(content[2]["type"], "tool_use");
    // Another format leaves them out; so does Anthropic for another provider's blocks.
    let to_openai = openai::request(&req(conversation.clone()), false);
    assert!(!to_openai.to_string().contains("sig-1"), "{to_openai}");
    let mut foreign = conversation;
    foreign["messages"][1]["provider_blocks"]["provider"] = json!("openai-responses");
    let sent = anthropic::request(&req(foreign), false).expect("converts");
    assert_eq!(sent["messages"][1]["content"][0]["type"], "tool_use");
}

/// Claude 4.6 and later think adaptively (Opus 4.7 refuses the budgeted form); older models
/// take a budget.
#[test]
fn anthropic_thinking_takes_the_form_of_the_model() {
    use anthropic::ThinkingForm::{Adaptive, Budget};
    for (model, form) in [
        ("claude-opus-4-7", Adaptive),
        ("claude-sonnet-4-6", Adaptive),
        ("claude-opus-4-6-v1", Adaptive),
        ("us.anthropic.claude-opus-4-6-v1:0", Adaptive),
        ("claude-sonnet-5", Adaptive),
        ("claude-fable-5-1", Adaptive),
        ("claude-sonnet-4-5-20250929", Budget),
        ("claude-haiku-4-5-20251001", Budget),
        ("claude-3-7-sonnet-20250219", Budget),
        ("claude-opus-4-20250514", Budget),
        ("claude-fake", Budget),
    ] {
        assert_eq!(anthropic::thinking_form(model), form, "{model}");
    }
    let body = |model: &str, reasoning: Value| {
        let r = json!({ "model": model, "messages": [], "reasoning": reasoning });
        anthropic::request(&req(r), false).expect("converts")
    };
    let b = body("claude-opus-4-7", json!({ "effort": "xhigh" }));
    assert_eq!(
        (b["thinking"].clone(), b["output_config"].clone()),
        (json!({ "type": "adaptive" }), json!({ "effort": "max" }))
    );
    let b = body("claude-opus-4-7", json!({ "enabled": true, "max_tokens": 2048 }));
    assert_eq!((b["thinking"].clone(), b.get("output_config")), (json!({ "type": "adaptive" }), None));
    let b = body("claude-opus-4-7", json!({ "effort": "none" }));
    assert_eq!(b.get("thinking"), None, "off is no thinking field at all");
    let b = body("claude-sonnet-4-5", json!({ "effort": "minimal" }));
    assert_eq!(b["thinking"], json!({ "type": "enabled", "budget_tokens": 1024 }));
    // A form the configuration gives the model wins over its id.
    let mut alias = req(json!({ "model": "my-claude", "messages": [], "reasoning": { "effort": "low" } }));
    assert_eq!(anthropic::request(&alias, false).unwrap()["thinking"]["type"], "enabled");
    alias.thinking_form = Some(Adaptive);
    let b = anthropic::request(&alias, false).unwrap();
    assert_eq!(
        (b["thinking"].clone(), b["output_config"].clone()),
        (json!({ "type": "adaptive" }), json!({ "effort": "low" }))
    );
}

fn cached(mut request: LlmRequest, key: &str, ttl: CacheTtl) -> LlmRequest {
    request.cache = Some(PromptCache { key: key.to_owned(), ttl });
    request
}

/// The cache breakpoints of an Anthropic request: where, and with which TTL.
fn breakpoints(body: &Value) -> Vec<(String, Value)> {
    let mut found = Vec::new();
    for (i, tool) in body["tools"].as_array().into_iter().flatten().enumerate() {
        if let Some(c) = tool.get("cache_control") {
            found.push((format!("tools.{i}"), c.clone()));
        }
    }
    for (i, block) in body["system"].as_array().into_iter().flatten().enumerate() {
        if let Some(c) = block.get("cache_control") {
            found.push((format!("system.{i}"), c.clone()));
        }
    }
    for (i, message) in body["messages"].as_array().into_iter().flatten().enumerate() {
        for (j, block) in message["content"].as_array().into_iter().flatten().enumerate() {
            if let Some(c) = block.get("cache_control") {
                found.push((format!("messages.{i}.{j}"), c.clone()));
            }
        }
    }
    found
}

/// Prompt caching: the last tool, the system prompt and the last block of each of the last two
/// messages carry a breakpoint with the TTL asked for (four, Anthropic's most); a thinking
/// block is never marked; nothing is marked unless the request asks.
#[test]
fn anthropic_request_marks_cache_breakpoints_when_asked() {
    let thinking = json!({ "type": "thinking", "thinking": "Look it up.", "signature": "sig-1" });
    let conversation = json!({ "model": "claude-sonnet-4-5", "messages": [
        { "role": "system", "content": "You are terse." },
        { "role": "user", "content": "Weather in Paris?" },
        { "role": "assistant", "tool_calls": [
            { "id": "toolu_1", "type": "function", "function": { "name": "weather", "arguments": "{}" } }
        ], "provider_blocks": { "provider": "anthropic", "blocks": [thinking] } },
        { "role": "tool", "tool_call_id": "toolu_1", "content": "sunny" },
    ], "tools": [
        { "name": "time", "description": "The time." },
        { "name": "weather", "description": "The weather." },
    ] });
    let plain = anthropic::request(&req(conversation.clone()), false).unwrap();
    assert!(breakpoints(&plain).is_empty());
    assert_eq!(plain["system"], "You are terse.");

    let five = json!({ "type": "ephemeral", "ttl": "5m" });
    let sent =
        anthropic::request(&cached(req(conversation.clone()), "s-1", CacheTtl::FiveMinutes), false).unwrap();
    let marks = breakpoints(&sent);
    let at = |at: &str| (at.to_owned(), five.clone());
    assert_eq!(marks, [at("tools.1"), at("system.0"), at("messages.1.1"), at("messages.2.0")]);
    assert_eq!(marks.len(), anthropic::MAX_CACHE_BREAKPOINTS);
    assert_eq!(sent["system"][0]["text"], "You are terse.");
    // The signed thinking block goes back unchanged and unmarked, before the marked tool_use.
    assert_eq!(sent["messages"][1]["content"][0], thinking);
    assert_eq!(sent["messages"][1]["content"][1]["type"], "tool_use");

    // One hour, everywhere alike; a text-only tail is made a block to carry the mark.
    let short = json!({ "model": "claude-sonnet-4-5", "messages": [
        { "role": "user", "content": "Hi" }, { "role": "assistant", "content": "" }, { "role": "user", "content": "Again" },
    ] });
    let sent = anthropic::request(&cached(req(short), "s-1", CacheTtl::OneHour), false).unwrap();
    let hour = json!({ "type": "ephemeral", "ttl": "1h" });
    assert_eq!(
        breakpoints(&sent),
        [("messages.2.0".to_owned(), hour)],
        "an empty assistant turn carries none"
    );
    assert_eq!(
        sent["messages"][2]["content"],
        json!([{ "type": "text", "text": "Again", "cache_control": { "type": "ephemeral", "ttl": "1h" } }])
    );
}

/// OpenAI caches by itself: a cached request names its conversation as `prompt_cache_key`, in
/// at most 64 characters.
#[test]
fn openai_request_names_the_prompt_cache_key() {
    let base = req(json!({ "model": "gpt-5", "messages": [{ "role": "user", "content": "hi" }] }));
    assert!(openai::request(&base, false).get("prompt_cache_key").is_none());
    let sent = openai::request(&cached(base.clone(), "session-1", CacheTtl::FiveMinutes), false);
    assert_eq!(sent["prompt_cache_key"], "session-1");
    let long = "s".repeat(100);
    let sent = openai::request(&cached(base.clone(), &long, CacheTtl::FiveMinutes), false);
    let key = sent["prompt_cache_key"].as_str().unwrap();
    assert!(key.len() <= PromptCache::MAX_KEY_CHARS && key != long, "{key}");
    let again = openai::request(&cached(base, &long, CacheTtl::FiveMinutes), false);
    assert_eq!(again["prompt_cache_key"], key, "the same conversation, the same key");
}

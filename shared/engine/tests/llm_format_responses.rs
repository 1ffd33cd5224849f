//! Tests of `turnstone_engine::llm_format::openai_responses` against payloads in the shapes of
//! OpenAI's Responses API (https://platform.openai.com/docs/api-reference/responses).

#![cfg(test)]

use serde_json::{Value, json};
use turnstone_engine::llm_format::{self, FormatError, LlmFormat, anthropic, openai, openai_responses};
use turnstone_engine::protocol::{CacheTtl, LlmResponse, PromptCache, StreamDelta, ToolCall};

use openai_responses::{StreamAccumulator, request, response};

#[path = "common/llm.rs"]
mod llm;

use llm::{call_delta, finish_delta, reasoning_delta, req, text_delta};

fn weather_tool() -> Value {
    json!({
        "name": "get_weather",
        "description": "Current weather for a city.",
        "input": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] },
        "output": { "type": "string" }
    })
}

fn call(id: &str, name: &str, arguments: &str) -> Value {
    json!({ "id": id, "type": "function", "function": { "name": name, "arguments": arguments } })
}

/// Every message kind, tools and sampling settings, in the Responses shapes.
#[test]
fn request_maps_messages_tools_and_tool_results() {
    let conversation = req(json!({
        "model": "gpt-5",
        "messages": [
            { "role": "system", "content": "You are a weather bot." },
            { "role": "system", "content": [{ "type": "text", "text": "Be brief." }] },
            { "role": "user", "content": [
                { "type": "text", "text": "Paris and Bogotá? Here is a photo." },
                { "type": "image_url", "image_url": { "url": "https://example.com/sky.jpg" } }
            ] },
            { "role": "assistant", "content": "Let me check both.", "tool_calls": [
                call("call_1", "get_weather", "{\"city\":\"Paris\"}"),
                call("call_2", "get_weather", "{\"city\":\"Bogotá\"}")
            ] },
            { "role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18C" },
            { "role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "24C" },
            { "role": "user", "content": "Thanks!" }
        ],
        "tools": [weather_tool(), { "name": "now", "description": "The time." }],
        "temperature": 1.0,
        "max_completion_tokens": 500
    }));
    let expected_input = json!([
        { "type": "message", "role": "user", "content": [
            { "type": "input_text", "text": "Paris and Bogotá? Here is a photo." },
            { "type": "input_image", "image_url": "https://example.com/sky.jpg", "detail": "auto" }
        ] },
        { "type": "message", "role": "assistant", "content": [
            { "type": "output_text", "text": "Let me check both." }
        ] },
        { "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" },
        { "type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Bogotá\"}" },
        { "type": "function_call_output", "call_id": "call_1", "output": "18C" },
        { "type": "function_call_output", "call_id": "call_2", "output": "24C" },
        { "type": "message", "role": "user", "content": [{ "type": "input_text", "text": "Thanks!" }] }
    ]);
    let expected = json!({
        "model": "gpt-5",
        "instructions": "You are a weather bot.\n\nBe brief.",
        "input": expected_input,
        "tools": [
            { "type": "function", "name": "get_weather", "description": "Current weather for a city.",
              "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] },
              "strict": false },
            { "type": "function", "name": "now", "description": "The time.",
              "parameters": { "type": "object", "properties": {} }, "strict": false }
        ],
        "temperature": 1,
        "max_output_tokens": 500,
        "store": false,
        "include": ["reasoning.encrypted_content"]
    });
    assert_eq!(request(&conversation, false), Ok(expected.clone()));
    let mut streamed = expected;
    streamed["stream"] = json!(true);
    assert_eq!(request(&conversation, true), Ok(streamed));
}

/// A system message after the start is a developer message; files go as data URLs; a tool
/// result with parts is a list of input parts; the cache key is `prompt_cache_key`.
#[test]
fn request_developer_messages_files_part_results_and_cache_key() {
    let mut conversation = req(json!({
        "model": "gpt-5",
        "messages": [
            { "role": "user", "content": [
                { "type": "file", "file": { "filename": "report.pdf", "file_data": "JVBERi0=" } },
                { "type": "file", "file": { "filename": "x", "file_data": "data:text/plain;base64,aGk=" } }
            ] },
            { "role": "system", "content": "Answer in French from now on." },
            { "role": "assistant", "tool_calls": [call("call_1", "snap", "{}")] },
            { "role": "tool", "tool_call_id": "call_1", "content": [
                { "type": "text", "text": "Here:" },
                { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBO" } }
            ] }
        ]
    }));
    conversation.cache = Some(PromptCache { key: "session-42".into(), ttl: CacheTtl::FiveMinutes });
    let body = request(&conversation, false).expect("converts");
    assert_eq!(body.get("instructions"), None);
    assert_eq!(body["prompt_cache_key"], "session-42");
    assert_eq!(
        body["input"],
        json!([
            { "type": "message", "role": "user", "content": [
                { "type": "input_file", "filename": "report.pdf", "file_data": "data:application/pdf;base64,JVBERi0=" },
                { "type": "input_file", "filename": "x", "file_data": "data:text/plain;base64,aGk=" }
            ] },
            { "type": "message", "role": "developer", "content": [
                { "type": "input_text", "text": "Answer in French from now on." }
            ] },
            { "type": "function_call", "call_id": "call_1", "name": "snap", "arguments": "{}" },
            { "type": "function_call_output", "call_id": "call_1", "output": [
                { "type": "input_text", "text": "Here:" },
                { "type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "auto" }
            ] }
        ])
    );
}

/// The neutral reasoning settings as `reasoning.effort` and a summary when reasoning is asked for.
#[test]
fn request_reasoning_effort_and_summary() {
    let cases = [
        (json!({ "effort": "high" }), Some(json!({ "effort": "high", "summary": "auto" }))),
        (json!({ "effort": "xhigh" }), Some(json!({ "effort": "xhigh", "summary": "auto" }))),
        (json!({ "effort": "minimal", "exclude": true }), Some(json!({ "effort": "minimal" }))),
        (json!({ "effort": "none" }), Some(json!({ "effort": "none" }))),
        (json!({ "enabled": true }), Some(json!({ "summary": "auto" }))),
        (json!({ "max_tokens": 2048 }), Some(json!({ "summary": "auto" }))),
        (json!({ "enabled": false }), None),
        (json!({ "exclude": true }), None),
    ];
    for (config, expected) in cases {
        let body = request(
            &req(json!({ "model": "o4-mini", "messages": [{ "role": "user", "content": "hi" }], "reasoning": config })),
            false,
        )
        .expect("converts");
        assert_eq!(body.get("reasoning"), expected.as_ref(), "{config}");
        assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
        assert_eq!(body["store"], false);
    }
}

/// Content the Responses API cannot carry fails, naming where.
#[test]
fn request_refuses_what_it_cannot_carry() {
    let failing = |message: Value| {
        request(
            &req(json!({ "model": "gpt-5", "messages": [{ "role": "user", "content": "hi" }, message] })),
            false,
        )
        .expect_err("refused")
    };
    let audio = failing(json!({ "role": "user", "content": [
        { "type": "text", "text": "listen" },
        { "type": "input_audio", "input_audio": { "data": "AAA", "format": "wav" } }
    ] }));
    assert_eq!(audio.path, "messages[1].content[1]");
    let video = failing(
        json!({ "role": "user", "content": [{ "type": "video_url", "video_url": { "url": "https://v" } }] }),
    );
    assert_eq!(video.path, "messages[1].content[0]");
    let file = failing(
        json!({ "role": "user", "content": [{ "type": "file", "file": { "filename": "a.bin", "file_data": "AA" } }] }),
    );
    assert_eq!(file.path, "messages[1].content[0].file.filename");
    let orphan = failing(json!({ "role": "tool", "content": "x" }));
    assert_eq!(orphan.path, "messages[1].tool_call_id");
    let assistant = failing(json!({ "role": "assistant", "content": [
        { "type": "text", "text": "here" },
        { "type": "file", "file": { "filename": "a.pdf", "file_data": "AA" } }
    ] }));
    assert_eq!(assistant.path, "messages[1].content[1]");
}

/// A reasoning model's reply: a reasoning item before each function call.
fn reasoning_item(id: &str, summary: &str) -> Value {
    json!({ "id": id, "type": "reasoning", "status": "completed",
            "summary": [{ "type": "summary_text", "text": summary }],
            "encrypted_content": format!("gAAAA-{id}") })
}

fn function_call_item(id: &str, call_id: &str, arguments: &str) -> Value {
    json!({ "id": id, "type": "function_call", "status": "completed", "call_id": call_id,
            "name": "get_weather", "arguments": arguments })
}

fn reasoning_reply() -> Value {
    json!({
        "id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "error": null,
        "incomplete_details": null, "model": "o4-mini-2025-04-16",
        "output": [
            reasoning_item("rs_1", "Paris first."),
            function_call_item("fc_1", "call_1", "{\"city\":\"Paris\"}"),
            reasoning_item("rs_2", "Then Bogotá."),
            function_call_item("fc_2", "call_2", "{\"city\":\"Bogotá\"}")
        ],
        "usage": { "input_tokens": 80, "input_tokens_details": { "cached_tokens": 64 },
                   "output_tokens": 120, "output_tokens_details": { "reasoning_tokens": 96 }, "total_tokens": 200 }
    })
}

/// Reasoning items are kept whole, in order with markers for the calls, sent back unchanged
/// where they stood, and only to this format.
#[test]
fn reasoning_items_are_kept_and_sent_back_where_they_stood() {
    let answer = response(&reasoning_reply()).expect("parses");
    assert_eq!(answer.reasoning.as_deref(), Some("Paris first.\n\nThen Bogotá."));
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        answer.tool_calls,
        Some(vec![
            ToolCall::function("call_1", "get_weather", "{\"city\":\"Paris\"}"),
            ToolCall::function("call_2", "get_weather", "{\"city\":\"Bogotá\"}"),
        ])
    );
    let kept = *answer.provider_blocks.clone().expect("the reasoning is kept");
    assert_eq!(kept.provider, openai_responses::PROVIDER);
    assert_eq!(
        kept.blocks,
        vec![
            reasoning_item("rs_1", "Paris first."),
            json!({ "type": "function_call", "call_id": "call_1" }),
            reasoning_item("rs_2", "Then Bogotá."),
            json!({ "type": "function_call", "call_id": "call_2" }),
        ]
    );

    let mut reply = json!({ "role": "assistant", "tool_calls": [
        call("call_1", "get_weather", "{\"city\":\"Paris\"}"),
        call("call_2", "get_weather", "{\"city\":\"Bogotá\"}")
    ] });
    reply["provider_blocks"] = serde_json::to_value(&kept).unwrap();
    let conversation = json!({ "model": "o4-mini", "messages": [
        { "role": "user", "content": "Weather?" },
        reply,
        { "role": "tool", "tool_call_id": "call_1", "content": "18C" },
        { "role": "tool", "tool_call_id": "call_2", "content": "24C" },
    ] });
    let sent = request(&req(conversation.clone()), false).expect("converts");
    let types: Vec<&str> =
        sent["input"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "message",
            "reasoning",
            "function_call",
            "reasoning",
            "function_call",
            "function_call_output",
            "function_call_output"
        ]
    );
    assert_eq!(sent["input"][1], reasoning_item("rs_1", "Paris first."), "unchanged");
    assert_eq!(sent["input"][3], reasoning_item("rs_2", "Then Bogotá."));
    assert_eq!(sent["input"][4]["call_id"], "call_2");

    // Other formats leave them out; so does this one for another provider's blocks.
    for other in [
        openai::request(&req(conversation.clone()), false),
        anthropic::request(&req(conversation.clone()), false).unwrap(),
    ] {
        assert!(!other.to_string().contains("gAAAA"), "{other}");
    }
    let mut foreign = conversation.clone();
    foreign["messages"][1]["provider_blocks"]["provider"] = json!("anthropic");
    let sent = request(&req(foreign), false).expect("converts");
    assert!(!sent.to_string().contains("gAAAA"), "{sent}");
    assert_eq!(sent["input"][1]["type"], "function_call");

    // A call the message no longer has goes with its marker; one it gained comes after.
    let mut rewritten = conversation;
    rewritten["messages"][1]["tool_calls"] =
        json!([call("call_2", "get_weather", "{}"), call("call_9", "now", "{}")]);
    rewritten["messages"][1]["content"] = json!("Checking.");
    rewritten["messages"].as_array_mut().unwrap().truncate(2);
    let sent = request(&req(rewritten), false).expect("converts");
    let items: Vec<(String, String)> = sent["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["type"].as_str().unwrap().to_owned(),
                i["id"].as_str().or(i["call_id"].as_str()).unwrap_or("").to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("message", ""),
        ("reasoning", "rs_1"),
        ("reasoning", "rs_2"),
        ("function_call", "call_2"),
        ("message", ""),
        ("function_call", "call_9"),
    ]
    .iter()
    .map(|(t, i)| ((*t).to_owned(), (*i).to_owned()))
    .collect();
    assert_eq!(items, expected);
}

/// A reply with text after its reasoning keeps the message's place; one without reasoning keeps nothing.
#[test]
fn message_markers_and_replies_without_reasoning() {
    let body = json!({ "model": "gpt-5", "status": "completed", "output": [
        reasoning_item("rs_1", ""),
        { "id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
          "content": [{ "type": "output_text", "text": "Hello.", "annotations": [] }] }
    ] });
    let answer = response(&body).expect("parses");
    assert_eq!((answer.content.as_deref(), answer.reasoning.as_deref()), (Some("Hello."), None));
    let kept = *answer.provider_blocks.expect("kept");
    assert_eq!(kept.blocks[1], json!({ "type": "message" }));
    let mut reply = json!({ "role": "assistant", "content": "Hello." });
    reply["provider_blocks"] = serde_json::to_value(&kept).unwrap();
    let sent = request(
        &req(json!({ "model": "gpt-5", "messages": [{ "role": "user", "content": "Hi" }, reply, { "role": "user", "content": "Bye" }] })),
        false,
    )
    .expect("converts");
    assert_eq!(sent["input"][1]["type"], "reasoning");
    assert_eq!(
        sent["input"][2],
        json!({ "type": "message", "role": "assistant", "content": [{ "type": "output_text", "text": "Hello." }] })
    );

    let plain = json!({ "model": "gpt-4.1", "output": [
        { "type": "message", "role": "assistant", "content": [{ "type": "output_text", "text": "Hi." }] }
    ] });
    let answer = response(&plain).expect("parses");
    assert_eq!((answer.provider_blocks, answer.finish_reason.as_deref()), (None, Some("stop")));
}

fn completed(output: Value, status: &str, incomplete: Value) -> Value {
    json!({ "id": "resp_1", "object": "response", "model": "gpt-5", "status": status,
            "incomplete_details": incomplete, "error": null, "output": output,
            "usage": { "input_tokens": 10, "input_tokens_details": { "cached_tokens": 0 },
                       "output_tokens": 5, "output_tokens_details": { "reasoning_tokens": 0 }, "total_tokens": 15 } })
}

fn message_item(text: &str) -> Value {
    json!({ "id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [{ "type": "output_text", "text": text, "annotations": [] }] })
}

/// Text, usage, and each status as a neutral finish reason.
#[test]
fn response_text_usage_and_finish_reasons() {
    let body = completed(json!([message_item("Hello"), message_item("again.")]), "completed", Value::Null);
    let answer = response(&body).expect("parses");
    assert_eq!(
        answer,
        LlmResponse {
            model: "gpt-5".into(),
            content: Some("Hello\n\nagain.".into()),
            tool_calls: None,
            finish_reason: Some("stop".into()),
            usage: Some(body["usage"].clone()),
            cost: None,
            images: None,
            reasoning: None,
            provider_blocks: None,
        }
    );
    let length = response(&completed(
        json!([message_item("Once upon")]),
        "incomplete",
        json!({ "reason": "max_output_tokens" }),
    ))
    .expect("parses");
    assert!(length.is_truncated(), "{length:?}");
    let filtered =
        response(&completed(json!([]), "incomplete", json!({ "reason": "content_filter" }))).expect("parses");
    assert!(filtered.is_refused());
    let refusal = json!([{ "type": "message", "role": "assistant",
                           "content": [{ "type": "refusal", "refusal": "I can't help with that." }] }]);
    let refused = response(&completed(refusal, "completed", Value::Null)).expect("parses");
    assert_eq!(refused.content.as_deref(), Some("I can't help with that."));
    assert!(refused.is_refused());
    // An item kind this format does not read goes back as it came.
    let search = json!({ "id": "ws_1", "type": "web_search_call", "status": "completed" });
    let answer =
        response(&completed(json!([search, message_item("Found.")]), "completed", Value::Null)).unwrap();
    assert_eq!(answer.provider_blocks.expect("kept").blocks[0], search);
}

/// Malformed and error bodies fail with the path of the problem.
#[test]
fn response_errors_name_the_path() {
    let err = |body: Value| response(&body).expect_err("fails");
    let error = err(json!({ "error": { "type": "invalid_request_error", "message": "bad" } }));
    assert_eq!(error, FormatError::new("error", "invalid_request_error: bad"));
    let failed = err(json!({ "model": "gpt-5", "status": "failed", "output": [],
                             "error": { "code": "server_error", "message": "boom" } }));
    assert_eq!(failed, FormatError::new("error", "server_error: boom"));
    assert_eq!(err(json!({ "output": [] })).path, "model");
    assert_eq!(err(json!({ "model": "m" })).path, "output");
    let no_call_id = json!([{ "type": "function_call", "name": "f", "arguments": "{}" }]);
    assert_eq!(err(completed(no_call_id, "completed", Value::Null)).path, "output[0].call_id");
    let odd_part = json!([{ "type": "message", "content": [{ "type": "output_audio" }] }]);
    assert_eq!(err(completed(odd_part, "completed", Value::Null)).path, "output[0].content[0].type");
    assert_eq!(err(completed(json!([]), "in_progress", Value::Null)).path, "status");
}

// ---------------------------------------------------------------------------------------------
// Streams

fn feed(events: &[Value]) -> (Vec<StreamDelta>, StreamAccumulator) {
    let mut acc = StreamAccumulator::new();
    let deltas = events
        .iter()
        .filter_map(|e| acc.push(e["type"].as_str().unwrap(), e).expect("a valid event"))
        .collect();
    (deltas, acc)
}

fn created() -> Value {
    json!({ "type": "response.created", "sequence_number": 0, "response": {
        "id": "resp_1", "object": "response", "model": "gpt-5", "status": "in_progress", "output": [] } })
}

fn added(index: u64, item: Value) -> Value {
    json!({ "type": "response.output_item.added", "output_index": index, "item": item })
}

fn done(index: u64, item: Value) -> Value {
    json!({ "type": "response.output_item.done", "output_index": index, "item": item })
}

fn output_text_event(index: u64, delta: &str) -> Value {
    json!({ "type": "response.output_text.delta", "item_id": "msg_1", "output_index": index,
            "content_index": 0, "delta": delta, "logprobs": [] })
}

fn arguments_delta(index: u64, delta: &str) -> Value {
    json!({ "type": "response.function_call_arguments.delta", "item_id": format!("fc_{index}"),
            "output_index": index, "delta": delta })
}

fn summary_delta(index: u64, summary: u64, delta: &str) -> Value {
    json!({ "type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": index,
            "summary_index": summary, "delta": delta })
}

fn finished(kind: &str, response: Value) -> Value {
    json!({ "type": kind, "response": response })
}

/// Text streams word by word; the answer is the completed response.
#[test]
fn stream_text() {
    let message = json!({ "id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": [] });
    let (deltas, acc) = feed(&[
        created(),
        json!({ "type": "response.in_progress", "response": { "model": "gpt-5", "status": "in_progress" } }),
        added(0, message),
        json!({ "type": "response.content_part.added", "output_index": 0, "content_index": 0,
                "part": { "type": "output_text", "text": "", "annotations": [] } }),
        output_text_event(0, "Hello"),
        output_text_event(0, ""),
        output_text_event(0, " there."),
        json!({ "type": "response.output_text.done", "output_index": 0, "content_index": 0, "text": "Hello there." }),
        done(0, message_item("Hello there.")),
        finished(
            "response.completed",
            completed(json!([message_item("Hello there.")]), "completed", Value::Null),
        ),
    ]);
    assert_eq!(deltas, vec![text_delta("Hello"), text_delta(" there."), finish_delta("stop")]);
    let answer = acc.finish().expect("complete");
    assert_eq!(answer.content.as_deref(), Some("Hello there."));
    assert_eq!(answer.usage.unwrap()["total_tokens"], 15);
}

/// Reasoning summaries, then parallel calls whose argument fragments interleave; the kept
/// items come from the completed response, the deltas from the stream.
#[test]
fn stream_reasoning_summary_and_parallel_tool_calls() {
    let rs = json!({ "id": "rs_1", "type": "reasoning", "summary": [] });
    let fc = |i: u64, call_id: &str| {
        json!({ "id": format!("fc_{i}"), "type": "function_call", "status": "in_progress",
                "call_id": call_id, "name": "get_weather", "arguments": "" })
    };
    let final_output = json!([
        { "id": "rs_1", "type": "reasoning", "encrypted_content": "gAAAA-rs_1",
          "summary": [{ "type": "summary_text", "text": "Two cities." }, { "type": "summary_text", "text": "Both now." }] },
        function_call_item("fc_1", "call_a", "{\"city\":\"Paris\"}"),
        function_call_item("fc_2", "call_b", "{\"city\":\"Rome\"}")
    ]);
    let (deltas, acc) = feed(&[
        created(),
        added(0, rs),
        json!({ "type": "response.reasoning_summary_part.added", "output_index": 0, "summary_index": 0,
                "part": { "type": "summary_text", "text": "" } }),
        summary_delta(0, 0, "Two "),
        summary_delta(0, 0, "cities."),
        summary_delta(0, 1, "Both now."),
        done(0, final_output[0].clone()),
        added(1, fc(1, "call_a")),
        added(2, fc(2, "call_b")),
        arguments_delta(1, "{\"city\":"),
        arguments_delta(2, "{\"city\":\"Rome\"}"),
        arguments_delta(1, "\"Paris\"}"),
        json!({ "type": "response.function_call_arguments.done", "output_index": 1, "arguments": "{\"city\":\"Paris\"}" }),
        done(1, final_output[1].clone()),
        done(2, final_output[2].clone()),
        finished("response.completed", completed(final_output.clone(), "completed", Value::Null)),
    ]);
    assert_eq!(
        deltas,
        vec![
            reasoning_delta("Two "),
            reasoning_delta("cities."),
            reasoning_delta("\n\nBoth now."),
            call_delta("call_a", Some("get_weather"), None),
            call_delta("call_b", Some("get_weather"), None),
            call_delta("call_a", None, Some("{\"city\":")),
            call_delta("call_b", None, Some("{\"city\":\"Rome\"}")),
            call_delta("call_a", None, Some("\"Paris\"}")),
            finish_delta("tool_calls"),
        ]
    );
    let answer = acc.finish().expect("complete");
    assert_eq!(answer.reasoning.as_deref(), Some("Two cities.\n\nBoth now."));
    assert_eq!(
        answer
            .tool_calls
            .unwrap()
            .iter()
            .map(|c| (c.id.as_str().to_owned(), c.function.arguments.clone()))
            .collect::<Vec<_>>(),
        [
            ("call_a".to_owned(), "{\"city\":\"Paris\"}".to_owned()),
            ("call_b".to_owned(), "{\"city\":\"Rome\"}".to_owned())
        ]
    );
    let kept = answer.provider_blocks.expect("kept");
    assert_eq!(kept.blocks[0], final_output[0], "the finished reasoning item, encrypted content included");
}

/// A server whose completed response leaves `output` empty: the answer is built from the
/// items the stream delivered. `response.incomplete` ends a stream cut by the token limit.
#[test]
fn stream_without_output_in_completed_and_incomplete() {
    let message = json!({ "id": "msg_1", "type": "message", "role": "assistant", "content": [] });
    let call = json!({ "type": "function_call", "call_id": "call_1", "name": "f", "arguments": "" });
    let (_, acc) = feed(&[
        created(),
        added(0, message),
        output_text_event(0, "Hi."),
        added(1, call),
        arguments_delta(1, "{}"),
        finished("response.completed", json!({ "status": "completed", "output": [] })),
    ]);
    let answer = acc.finish().expect("complete");
    assert_eq!(answer.model, "gpt-5", "from response.created");
    assert_eq!(answer.content.as_deref(), Some("Hi."));
    assert_eq!(answer.tool_calls, Some(vec![ToolCall::function("call_1", "f", "{}")]));

    let (deltas, acc) = feed(&[
        created(),
        added(0, json!({ "id": "msg_1", "type": "message", "role": "assistant", "content": [] })),
        output_text_event(0, "Once"),
        finished(
            "response.incomplete",
            completed(json!([message_item("Once")]), "incomplete", json!({ "reason": "max_output_tokens" })),
        ),
    ]);
    assert_eq!(deltas.last(), Some(&finish_delta("length")));
    assert!(acc.finish().unwrap().is_truncated());
}

/// Text of separate messages is joined by a blank line, live as in the answer.
#[test]
fn stream_separate_messages_join_like_the_answer() {
    let message = |id: &str| json!({ "id": id, "type": "message", "role": "assistant", "content": [] });
    let (deltas, acc) = feed(&[
        created(),
        added(0, message("msg_1")),
        output_text_event(0, "One."),
        added(1, message("msg_2")),
        output_text_event(1, "Two."),
        finished(
            "response.completed",
            completed(json!([message_item("One."), message_item("Two.")]), "completed", Value::Null),
        ),
    ]);
    let live: String = deltas.iter().filter_map(|d| d.text.clone()).collect();
    assert_eq!(Some(live), acc.finish().unwrap().content);
}

/// Errors: an `error` event, a failed response, a stream cut short, deltas for items never added.
#[test]
fn stream_errors() {
    let mut acc = StreamAccumulator::new();
    let err = acc
        .push(
            "error",
            &json!({ "type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": null }),
        )
        .unwrap_err();
    assert_eq!(err, FormatError::new("error", "rate_limit_exceeded: slow down"));

    let mut acc = StreamAccumulator::new();
    let failed = json!({ "type": "response.failed", "response": { "model": "gpt-5", "status": "failed", "output": [],
                         "error": { "code": "server_error", "message": "boom" } } });
    assert_eq!(acc.push("", &failed).unwrap_err(), FormatError::new("error", "server_error: boom"));

    let (_, acc) =
        feed(&[created(), added(0, json!({ "type": "message", "content": [] })), output_text_event(0, "Hi")]);
    assert_eq!(acc.finish().unwrap_err().path, "response.completed");

    let mut acc = StreamAccumulator::new();
    let err = acc.push("response.output_text.delta", &output_text_event(3, "x")).unwrap_err();
    assert_eq!(err.path, "response.output_text.delta.output_index");
    let err = acc.push("response.function_call_arguments.delta", &arguments_delta(0, "{")).unwrap_err();
    assert_eq!(err.path, "response.function_call_arguments.delta.output_index");

    let mut acc = StreamAccumulator::new();
    let bad = finished(
        "response.completed",
        completed(json!([{ "type": "function_call", "name": "f" }]), "completed", Value::Null),
    );
    assert_eq!(acc.push("", &bad).unwrap_err().path, "response.completed.response.output[0].call_id");
}

/// `LlmFormat::OpenaiResponses` (`"openai-responses"` on the wire) dispatches here.
#[test]
fn dispatch_by_format() {
    assert_eq!(serde_json::to_value(LlmFormat::OpenaiResponses).unwrap(), json!("openai-responses"));
    assert_eq!(
        serde_json::from_value::<LlmFormat>(json!("openai-responses")).unwrap(),
        LlmFormat::OpenaiResponses
    );
    let conversation = req(json!({ "model": "gpt-5", "messages": [{ "role": "user", "content": "hi" }] }));
    assert_eq!(
        llm_format::request(LlmFormat::OpenaiResponses, &conversation, true),
        request(&conversation, true)
    );
    let body = reasoning_reply();
    assert_eq!(llm_format::response(LlmFormat::OpenaiResponses, &body), response(&body));
    let mut acc = llm_format::StreamAccumulator::new(LlmFormat::OpenaiResponses);
    acc.push("", &created()).unwrap();
    acc.push("", &finished("response.completed", body.clone())).unwrap();
    assert_eq!(acc.finish(), response(&body));
}

//! `/v1/responses` at the gateway: the request reaches the engine as the chat prompt it
//! translates to; the reply comes back as output items (a message, function calls), whole
//! and as the API's typed events; refusals name the Responses field.

use bytes::Bytes;
use serde_json::{json, Value};

use super::{call, expect_error, json, post, Fixture, Script, CACHED_TOKENS, MODEL};
use crate::messages::FinishReason;

const BAD: &str = "invalid_request_error";

/// A reply of text, then two calls in one Hermes list.
const REPLY: &str = "Checking.<tool_call>[{\"name\": \"get_weather\", \"arguments\": \
    {\"city\": \"Oslo\"}}, {\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}]</tool_call>";

/// A short template that renders the tools itself, the calls of assistant turns and the
/// tool turns' call ids (the newline after a block tag is trimmed).
const TEMPLATE: &str = "{% if tools %}T{{ tools | length }}\n{% endif %}{% for m in messages %}\
    {{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}[{{ c.id }} {{ c.function.name }}]\
    {% endfor %}{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}\n{% endfor %}";

fn tools() -> Value {
    json!([
        {"type": "function", "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}},
        {"type": "function", "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}},
    ])
}

fn fixture(text: &str, finish: FinishReason) -> Fixture {
    let script = Script::Generate {
        text: text.to_owned(),
        per_event: 3,
        finish,
    };
    Fixture::build(script, Some(TEMPLATE), None)
}

/// The prompt the engine was given, as text.
fn prompt(fixture: &Fixture) -> String {
    let ids = fixture.last_submitted().prompt;
    fixture.tokenizer.decode(&ids, false).unwrap()
}

/// Each event of a Responses stream: its `event:` name and its data, checked to agree
/// and to be numbered from 0.
fn typed_events(body: &Bytes) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).unwrap();
    assert!(!text.contains("[DONE]"), "{text}");
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|block| !block.is_empty()) {
        let (name, data) = block
            .strip_prefix("event: ")
            .and_then(|rest| rest.split_once("\ndata: "))
            .unwrap_or_else(|| panic!("{block:?}"));
        let data: Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["type"], name, "{block}");
        assert_eq!(data["sequence_number"], events.len(), "{block}");
        events.push((name.to_owned(), data));
    }
    events
}

#[actix_web::test]
async fn a_string_input_with_instructions_is_answered_with_a_message() {
    let fixture = fixture("Hello there", FinishReason::Stop);
    let app = fixture.app().await;
    let body = json!({"model": MODEL, "input": "Hi", "instructions": "Be brief.",
        "temperature": 0.5, "metadata": {"k": "v"}, "store": false, "include": []});
    let response = json(&call(&app, post("/v1/responses", body)).await.1);
    assert_eq!(prompt(&fixture), "system:Be brief.user:Hi");
    assert!(response["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["model"], MODEL);
    assert_eq!(response["incomplete_details"], Value::Null);
    assert_eq!(response["instructions"], "Be brief.");
    assert_eq!(response["temperature"], 0.5);
    assert_eq!(response["metadata"], json!({"k": "v"}));
    assert_eq!(response["tools"], json!([]));
    assert_eq!(response["tool_choice"], "auto");
    assert_eq!(response["store"], false);
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{response}");
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(output[0]["status"], "completed");
    assert!(output[0]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        output[0]["content"],
        json!([{"type": "output_text", "text": "Hello there", "annotations": [],
            "logprobs": []}])
    );
    let usage = &response["usage"];
    let generated = fixture
        .tokenizer
        .encode("Hello there", false)
        .unwrap()
        .len();
    let prompt_tokens = fixture.last_submitted().prompt.len();
    assert_eq!(usage["input_tokens"], prompt_tokens);
    assert_eq!(usage["output_tokens"], generated);
    assert_eq!(usage["total_tokens"], prompt_tokens + generated);
    assert_eq!(
        usage["input_tokens_details"]["cached_tokens"],
        CACHED_TOKENS
    );
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
}

#[actix_web::test]
async fn the_output_limit_makes_an_incomplete_response() {
    let fixture = fixture("Hello there", FinishReason::Length);
    let app = fixture.app().await;
    let body = json!({"input": "Hi", "max_output_tokens": 4});
    let response = json(&call(&app, post("/v1/responses", body)).await.1);
    assert_eq!(fixture.last_submitted().spec.max_tokens, 4);
    assert_eq!(response["status"], "incomplete");
    assert_eq!(
        response["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(response["max_output_tokens"], 4);
    assert_eq!(response["output"][0]["status"], "incomplete");
}

#[actix_web::test]
async fn calls_are_function_call_items_and_required_is_a_grammar() {
    let fixture = fixture(REPLY, FinishReason::Stop);
    let app = fixture.app().await;
    let body = json!({"input": "weather?", "tools": tools(), "tool_choice": "required"});
    let (status, body) = call(&app, post("/v1/responses", body)).await;
    assert_eq!(status, 200, "{body:?}");
    let response = json(&body);
    let grammar = fixture.last_submitted().spec.grammar.expect("a grammar");
    assert_eq!(grammar.kind(), "tool_call");
    assert!(
        prompt(&fixture).starts_with("T2\n"),
        "the tools reach the template"
    );
    assert_eq!(response["tools"], tools());
    assert_eq!(response["tool_choice"], "required");
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 3, "{response}");
    assert_eq!(output[0]["content"][0]["text"], "Checking.");
    for (item, (name, arguments)) in output[1..].iter().zip([
        ("get_weather", "{\"city\":\"Oslo\"}"),
        ("get_time", "{\"zone\":\"CET\"}"),
    ]) {
        assert_eq!(item["type"], "function_call");
        assert_eq!(item["status"], "completed");
        assert_eq!(
            (item["name"].as_str(), item["arguments"].as_str()),
            (Some(name), Some(arguments))
        );
        assert!(item["id"].as_str().unwrap().starts_with("fc_"));
        assert!(item["call_id"].as_str().unwrap().starts_with("call_"));
    }
    assert_ne!(output[1]["call_id"], output[2]["call_id"]);
    let named = json!({"input": "x", "tools": tools(),
        "tool_choice": {"type": "function", "name": "get_time"}});
    assert_eq!(call(&app, post("/v1/responses", named)).await.0, 200);
    assert!(fixture.last_submitted().spec.grammar.is_some());
}

#[actix_web::test]
async fn a_second_turn_sends_the_calls_and_their_outputs_back() {
    let fixture = fixture("Sunny.", FinishReason::Stop);
    let app = fixture.app().await;
    let body = json!({"tools": tools(), "instructions": "Help.", "input": [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
            "arguments": "{\"city\": \"Oslo\"}", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\": 3}"},
    ]});
    let (status, body) = call(&app, post("/v1/responses", body)).await;
    assert_eq!(status, 200, "{body:?}");
    assert_eq!(
        prompt(&fixture),
        "T2\nsystem:Help.user:weather?assistant:[call_1 get_weather]tool:{\"temp\": 3}(call_1)"
    );
    assert_eq!(json(&body)["output"][0]["content"][0]["text"], "Sunny.");
}

#[actix_web::test]
async fn a_stream_sends_typed_events_that_rebuild_the_response() {
    let fixture = fixture(REPLY, FinishReason::Stop);
    let app = fixture.app().await;
    let body = json!({"input": "weather?", "tools": tools(), "stream": true});
    let (status, body) = call(&app, post("/v1/responses", body)).await;
    assert_eq!(status, 200);
    let events = typed_events(&body);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(names.last(), Some(&"response.completed"));
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(events[0].1["response"]["output"], json!([]));
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["id"], events[0].1["response"]["id"]);
    assert!(completed["usage"]["output_tokens"].as_u64().unwrap() > 0);
    let output = completed["output"].as_array().unwrap();
    assert_eq!(output.len(), 3);
    let mut text = String::new();
    let mut arguments = vec![String::new(); output.len()];
    let mut done = Vec::new();
    for (name, data) in &events {
        let index = data["output_index"].as_u64().unwrap_or(0) as usize;
        match name.as_str() {
            "response.output_text.delta" => text.push_str(data["delta"].as_str().unwrap()),
            "response.function_call_arguments.delta" => {
                assert_eq!(data["item_id"], output[index]["id"]);
                arguments[index].push_str(data["delta"].as_str().unwrap());
            }
            "response.function_call_arguments.done" => {
                assert_eq!(data["arguments"].as_str().unwrap(), arguments[index]);
            }
            "response.output_item.done" => {
                assert_eq!(data["item"], output[index]);
                done.push(index);
            }
            _ => {}
        }
    }
    assert_eq!(done, [0, 1, 2], "each item is done once, in order");
    assert_eq!(text, output[0]["content"][0]["text"].as_str().unwrap());
    for (item, arguments) in output.iter().zip(&arguments).skip(1) {
        assert_eq!(item["arguments"].as_str().unwrap(), arguments);
    }
}

#[actix_web::test]
async fn a_stream_that_reaches_the_limit_ends_incomplete_and_one_that_fails_with_an_error() {
    let fixture = fixture("Hello there", FinishReason::Length);
    let app = fixture.app().await;
    let body = json!({"input": "Hi", "stream": true});
    let events = typed_events(&call(&app, post("/v1/responses", body.clone())).await.1);
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );

    let fixture = self::fixture("Hello there", FinishReason::Error);
    let app = fixture.app().await;
    let events = typed_events(&call(&app, post("/v1/responses", body)).await.1);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names[names.len() - 2..], ["error", "response.failed"]);
    let failed = &events.last().unwrap().1["response"];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], "server_error");
    assert_eq!(events[names.len() - 2].1["code"], "server_error");
}

#[actix_web::test]
async fn refusals_and_chat_errors_name_the_responses_field() {
    let fixture = fixture("x", FinishReason::Stop);
    let app = fixture.app().await;
    let cases = [
        (json!({"input": "x", "store": true}), "store"),
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search_preview"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"input": "x", "max_output_tokens": 100_000}),
            "max_output_tokens",
        ),
        (json!({"input": "x", "temperature": -1}), "temperature"),
        (
            json!({"input": "x", "tools": [{"type": "function"}]}),
            "tools[0].name",
        ),
        (
            json!({"input": "x", "tools": tools(),
                "tool_choice": {"type": "function", "name": "nope"}}),
            "tool_choice",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "a",
                "schema": [1]}}}),
            "text.format.schema",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "xml"}}}),
            "text.format.type",
        ),
        (json!({"input": []}), "input"),
    ];
    for (body, param) in cases {
        let message = expect_error(
            call(&app, post("/v1/responses", body)).await,
            400,
            BAD,
            Some(param),
        );
        assert!(!message.is_empty());
    }
    let other = json!({"model": "other", "input": "x"});
    let response = call(&app, post("/v1/responses", other)).await;
    expect_error(response, 404, "not_found_error", Some("model"));
}

#[actix_web::test]
async fn text_format_reaches_the_engine_as_a_grammar() {
    let fixture = fixture("{}", FinishReason::Stop);
    let app = fixture.app().await;
    let body = json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "a",
        "schema": {"type": "object"}, "strict": true}}});
    let response = json(&call(&app, post("/v1/responses", body)).await.1);
    let grammar = fixture.last_submitted().spec.grammar.expect("a grammar");
    assert_eq!(grammar.kind(), "json_schema");
    assert_eq!(response["text"]["format"]["type"], "json_schema");
    assert_eq!(response["output"][0]["content"][0]["text"], "{}");
}

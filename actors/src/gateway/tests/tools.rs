//! Tool calling at the gateway: a reply written in the model's call format comes back as
//! `message.tool_calls` with `finish_reason: "tool_calls"`, whole and as OpenAI's deltas;
//! `required` and a named function reach the engine as a grammar; completions refuse tools.

use serde_json::{json, Value};

use super::{call, expect_error, post, sse_events, Fixture, Script};
use crate::messages::FinishReason;

const BAD: &str = "invalid_request_error";

/// The reply the fake engine writes: text, then two calls in one Hermes list.
const REPLY: &str = "Checking.<tool_call>[{\"name\": \"get_weather\", \"arguments\": \
    {\"city\": \"Oslo\"}}, {\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}]</tool_call>";

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}},
    ])
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "weather?"}],
        "tools": tools()});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// A short template that renders the tools itself (the tiny test context would not hold
/// the system-turn description of them), and the calls of assistant turns.
const TEMPLATE: &str = "{% if tools %}T{{ tools | length }}\n{% endif %}{% for m in messages %}\
    {{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}[{{ c.function.name }}]\
    {% endfor %}\n{% endfor %}";

fn replying() -> Fixture {
    let script = Script::Generate {
        text: REPLY.to_owned(),
        per_event: 3,
        finish: FinishReason::Stop,
    };
    Fixture::build(script, Some(TEMPLATE), None)
}

#[actix_web::test]
async fn a_whole_reply_carries_its_calls() {
    let fixture = replying();
    let app = fixture.app().await;
    let (status, body) = call(&app, post("/v1/chat/completions", chat(json!({})))).await;
    assert_eq!(status, 200, "{body:?}");
    let body: Value = serde_json::from_slice(&body).unwrap();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Checking.");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
    assert_eq!(calls[1]["function"]["arguments"], "{\"zone\":\"CET\"}");
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    assert!(
        fixture.last_submitted().spec.grammar.is_none(),
        "auto is not forced"
    );
}

#[actix_web::test]
async fn a_streamed_reply_sends_openais_deltas() {
    let fixture = replying();
    let app = fixture.app().await;
    let request = post("/v1/chat/completions", chat(json!({"stream": true})));
    let (status, body) = call(&app, request).await;
    assert_eq!(status, 200);
    let (events, done) = sse_events(&body);
    assert!(done);
    let mut content = String::new();
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut reasons = Vec::new();
    for event in &events {
        let choice = &event["choices"][0];
        if let Some(reason) = choice["finish_reason"].as_str() {
            reasons.push(reason.to_owned());
        }
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        for delta in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = delta["index"].as_u64().unwrap() as usize;
            let function = &delta["function"];
            if index == calls.len() {
                let id = delta["id"].as_str().expect("the first delta has the id");
                assert_eq!(delta["type"], "function");
                let name = function["name"].as_str().expect("and the name").to_owned();
                calls.push((id.to_owned(), name, String::new()));
            } else {
                assert!(delta.get("id").is_none() && function.get("name").is_none());
            }
            calls[index]
                .2
                .push_str(function["arguments"].as_str().unwrap());
        }
    }
    assert_eq!(content, "Checking.");
    assert_eq!(reasons, ["tool_calls"]);
    let args: Vec<Value> = calls
        .iter()
        .map(|c| serde_json::from_str(&c.2).unwrap())
        .collect();
    assert_eq!(calls[0].1, "get_weather");
    assert_eq!(args, [json!({"city": "Oslo"}), json!({"zone": "CET"})]);
}

#[actix_web::test]
async fn required_and_named_choices_are_enforced_by_a_grammar() {
    let fixture = replying();
    let app = fixture.app().await;
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_time"}}),
    ] {
        let body = chat(json!({"tool_choice": choice}));
        let (status, _) = call(&app, post("/v1/chat/completions", body)).await;
        assert_eq!(status, 200, "{choice}");
        let grammar = fixture.last_submitted().spec.grammar.expect("a grammar");
        assert_eq!(grammar.kind(), "tool_call");
    }
    let both = chat(json!({"tool_choice": "required", "guided_regex": "a"}));
    let response = call(&app, post("/v1/chat/completions", both)).await;
    expect_error(response, 400, BAD, Some("guided_regex"));
}

#[actix_web::test]
async fn tool_choice_none_reads_no_calls_and_completions_refuse_tools() {
    let fixture = replying();
    let app = fixture.app().await;
    let body = chat(json!({"tool_choice": "none"}));
    let (status, body) = call(&app, post("/v1/chat/completions", body)).await;
    assert_eq!(status, 200);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(body["choices"][0]["message"].get("tool_calls").is_none());
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    for (field, value) in [("tools", tools()), ("tool_choice", json!("required"))] {
        let request = post("/v1/completions", json!({"prompt": "x", field: value}));
        expect_error(call(&app, request).await, 400, BAD, Some(field));
    }
}

#[actix_web::test]
async fn an_assistant_turn_with_calls_and_a_tool_answer_are_taken() {
    let fixture = replying();
    let app = fixture.app().await;
    let body = json!({"tools": tools(), "tool_choice": "none", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
            "type": "function", "function": {"name": "get_weather",
            "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"},
    ]});
    let (status, _) = call(&app, post("/v1/chat/completions", body)).await;
    assert_eq!(status, 200);
    let bad = json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c",
        "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]});
    let response = call(&app, post("/v1/chat/completions", bad)).await;
    expect_error(
        response,
        400,
        BAD,
        Some("messages[0].tool_calls[0].function.arguments"),
    );
}

#[actix_web::test]
async fn each_choice_reads_its_own_calls_under_ids_of_its_own() {
    let fixture = replying();
    let app = fixture.app().await;
    let request = post("/v1/chat/completions", chat(json!({"n": 2})));
    let (status, body) = call(&app, request).await;
    assert_eq!(status, 200, "{body:?}");
    let body: Value = serde_json::from_slice(&body).unwrap();
    let mut ids = Vec::new();
    for (index, choice) in body["choices"].as_array().unwrap().iter().enumerate() {
        assert_eq!(choice["index"], index);
        assert_eq!(choice["finish_reason"], "tool_calls");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2, "{body}");
        ids.extend(calls.iter().map(|c| c["id"].as_str().unwrap().to_owned()));
    }
    let distinct: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 4, "{ids:?}");
    // Streamed: each choice's deltas under its index, each ending in `tool_calls`.
    let request = post(
        "/v1/chat/completions",
        chat(json!({"n": 2, "stream": true})),
    );
    let (_, body) = call(&app, request).await;
    let (events, done) = sse_events(&body);
    assert!(done);
    let mut names = vec![Vec::new(); 2];
    let mut reasons = vec![Value::Null; 2];
    for event in &events {
        let choice = &event["choices"][0];
        let index = choice["index"].as_u64().unwrap() as usize;
        for delta in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(name) = delta["function"]["name"].as_str() {
                names[index].push(name.to_owned());
            }
        }
        if !choice["finish_reason"].is_null() {
            reasons[index] = choice["finish_reason"].clone();
        }
    }
    assert_eq!(names, [["get_weather", "get_time"]; 2]);
    assert_eq!(reasons, [json!("tool_calls"), json!("tool_calls")]);
}

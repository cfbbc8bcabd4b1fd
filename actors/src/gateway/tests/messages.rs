//! `POST /v1/messages` over HTTP: Anthropic's message and events for a plain reply and a
//! tool call, `any` reaching the engine as a grammar, `x-api-key`, and every refusal in
//! Anthropic's error shape.

use actix_web::test::TestRequest;
use serde_json::{json, Value};

use super::{call, json, post, Fixture, Script, CACHED_TOKENS, MODEL};
use crate::messages::FinishReason;

/// A reply in Hermes: text, then one call.
const REPLY: &str = "Checking.<tool_call>[{\"name\": \"get_weather\", \"arguments\": \
    {\"city\": \"Oslo\"}}]</tool_call>";

/// A short template that renders the tools itself, as the chat tool tests use.
const TEMPLATE: &str = "{% if tools %}T{{ tools | length }}\n{% endif %}{% for m in messages %}\
    {{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}[{{ c.function.name }}]\
    {% endfor %}\n{% endfor %}";

fn weather() -> Value {
    json!({"name": "get_weather", "input_schema": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

fn messages(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_tokens": 40,
        "messages": [{"role": "user", "content": "weather?"}]});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

fn replying(text: &str) -> Fixture {
    let script = Script::Generate {
        text: text.to_owned(),
        per_event: 3,
        finish: FinishReason::Stop,
    };
    Fixture::build(script, Some(TEMPLATE), None)
}

/// Checks an Anthropic error: its status and type; returns the message.
fn expect_anthropic_error(
    (status, body): (actix_web::http::StatusCode, bytes::Bytes),
    code: u16,
    kind: &str,
) -> String {
    let body = json(&body);
    assert_eq!(status.as_u16(), code, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    body["error"]["message"].as_str().unwrap().to_owned()
}

#[actix_web::test]
async fn a_plain_reply_is_a_message_with_a_text_block() {
    let fixture = replying("Hello there");
    let app = fixture.app().await;
    let body = messages(json!({"system": "Be brief.", "stop_sequences": ["zzz"]}));
    let (status, body) = call(&app, post("/v1/messages", body)).await;
    assert_eq!(status, 200, "{body:?}");
    let body = json(&body);
    assert!(body["id"].as_str().unwrap().starts_with("msg_"), "{body}");
    assert_eq!(
        (&body["type"], &body["role"], &body["model"]),
        (&json!("message"), &json!("assistant"), &json!(MODEL))
    );
    assert_eq!(
        body["content"],
        json!([{"type": "text", "text": "Hello there"}])
    );
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["stop_sequence"], Value::Null);
    let submitted = fixture.last_submitted();
    // Anthropic counts cache reads apart from the prompt tokens computed.
    assert_eq!(
        body["usage"]["input_tokens"],
        submitted.prompt.len() - CACHED_TOKENS
    );
    assert_eq!(body["usage"]["cache_read_input_tokens"], CACHED_TOKENS);
    assert_eq!(body["usage"]["cache_creation_input_tokens"], 0);
    let output = fixture
        .tokenizer
        .encode("Hello there", false)
        .unwrap()
        .len();
    assert_eq!(body["usage"]["output_tokens"], output);
    let prompt = fixture.tokenizer.decode(&submitted.prompt, false).unwrap();
    assert!(
        prompt.starts_with("system:Be brief.user:weather?"),
        "{prompt}"
    );
    assert_eq!(submitted.spec.max_tokens, 40);
    let stopped = messages(json!({"stop_sequences": ["there"]}));
    let body = json(&call(&app, post("/v1/messages", stopped)).await.1);
    assert_eq!(body["content"][0]["text"], "Hello ");
    assert_eq!(
        (&body["stop_reason"], &body["stop_sequence"]),
        (&json!("stop_sequence"), &json!("there"))
    );
}

#[actix_web::test]
async fn a_forced_call_is_a_tool_use_block_whole_and_streamed() {
    let fixture = replying(REPLY);
    let app = fixture.app().await;
    let body = messages(json!({"tools": [weather()], "tool_choice": {"type": "any"}}));
    let (status, whole) = call(&app, post("/v1/messages", body.clone())).await;
    assert_eq!(status, 200, "{whole:?}");
    let grammar = fixture.last_submitted().spec.grammar.expect("a grammar");
    assert_eq!(grammar.kind(), "tool_call");
    let whole = json(&whole);
    assert_eq!(whole["stop_reason"], "tool_use");
    let call_block = &whole["content"][1];
    assert_eq!(
        (&call_block["type"], &call_block["name"]),
        (&json!("tool_use"), &json!("get_weather"))
    );
    assert_eq!(call_block["input"], json!({"city": "Oslo"}));
    assert!(call_block["id"].as_str().unwrap().starts_with("toolu_"));

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let (status, bytes) = call(&app, post("/v1/messages", streamed)).await;
    assert_eq!(status, 200);
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(!text.contains("[DONE]"), "{text}");
    let (mut names, mut partial) = (Vec::new(), String::new());
    for event in text.split("\n\n").filter(|event| !event.is_empty()) {
        let (name, data) = event.split_once('\n').unwrap();
        let name = name.strip_prefix("event: ").unwrap().to_owned();
        let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
        if data["delta"]["type"] == "input_json_delta" {
            partial.push_str(data["delta"]["partial_json"].as_str().unwrap());
        }
        if name == "message_delta" {
            assert_eq!(data["delta"]["stop_reason"], "tool_use");
        }
        names.push(name);
    }
    assert_eq!(names.first().map(String::as_str), Some("message_start"));
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
    assert_eq!(
        serde_json::from_str::<Value>(&partial).unwrap(),
        json!({"city": "Oslo"})
    );
}

#[actix_web::test]
async fn the_key_may_come_as_x_api_key() {
    let fixture = replying("ok");
    fixture.configure(|config| config.api_keys = vec!["k1".into()]);
    let app = fixture.app().await;
    let request = |key: Option<(&str, &str)>| {
        let request = TestRequest::post()
            .uri("/v1/messages")
            .set_json(messages(json!({})));
        match key {
            Some(header) => request.insert_header(header),
            None => request,
        }
        .to_request()
    };
    let message =
        expect_anthropic_error(call(&app, request(None)).await, 401, "authentication_error");
    assert!(message.contains("x-api-key"), "{message}");
    expect_anthropic_error(
        call(&app, request(Some(("x-api-key", "k2")))).await,
        401,
        "authentication_error",
    );
    assert_eq!(call(&app, request(Some(("x-api-key", "k1")))).await.0, 200);
    assert_eq!(
        call(&app, request(Some(("authorization", "Bearer k1"))))
            .await
            .0,
        200
    );
    let completion = TestRequest::post()
        .uri("/v1/completions")
        .insert_header(("x-api-key", "k1"))
        .set_json(json!({"prompt": "x"}))
        .to_request();
    assert_eq!(
        call(&app, completion).await.0,
        200,
        "every endpoint takes it"
    );
}

#[actix_web::test]
async fn refusals_are_in_anthropics_shape() {
    let fixture = replying("ok");
    let app = fixture.app().await;
    let mut missing = messages(json!({}));
    missing.as_object_mut().unwrap().remove("max_tokens");
    let message = expect_anthropic_error(
        call(&app, post("/v1/messages", missing)).await,
        400,
        "invalid_request_error",
    );
    assert!(message.starts_with("max_tokens"), "{message}");
    let thinking = messages(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}}));
    let message = expect_anthropic_error(
        call(&app, post("/v1/messages", thinking)).await,
        400,
        "invalid_request_error",
    );
    assert!(message.contains("`thinking`"), "{message}");
    let other = messages(json!({"model": "claude-x"}));
    expect_anthropic_error(
        call(&app, post("/v1/messages", other)).await,
        404,
        "not_found_error",
    );
    let malformed = TestRequest::post()
        .uri("/v1/messages")
        .set_payload("{")
        .to_request();
    expect_anthropic_error(call(&app, malformed).await, 400, "invalid_request_error");
    let long = messages(json!({"max_tokens": 100_000}));
    expect_anthropic_error(
        call(&app, post("/v1/messages", long)).await,
        400,
        "invalid_request_error",
    );
}

#[actix_web::test]
async fn a_full_queue_is_overloaded() {
    let fixture = Fixture::build(
        Script::Refuse(crate::messages::SubmitError::QueueFull { limit: 1 }),
        Some(TEMPLATE),
        None,
    );
    let app = fixture.app().await;
    let response = call(&app, post("/v1/messages", messages(json!({})))).await;
    expect_anthropic_error(response, 429, "overloaded_error");
}

#[actix_web::test]
async fn count_tokens_is_the_prompt_messages_would_send() {
    let fixture = Fixture::new(Script::text("Hello there"));
    let app = fixture.app().await;
    let body = messages(json!({"system": "Be brief."}));
    let (status, _) = call(&app, post("/v1/messages", body.clone())).await;
    assert_eq!(status, 200);
    let prompt = fixture.last_submitted().prompt.len();
    let mut count = body;
    count.as_object_mut().unwrap().remove("max_tokens");
    let (status, counted) = call(&app, post("/v1/messages/count_tokens", count)).await;
    assert_eq!(status, 200, "{counted:?}");
    assert_eq!(json(&counted), json!({"input_tokens": prompt}));
    assert_eq!(
        fixture.submitted.lock().unwrap().len(),
        1,
        "nothing submitted"
    );
    // Refusals keep Anthropic's shape.
    let bad = json!({"model": MODEL, "messages": "not a list"});
    let (status, refused) = call(&app, post("/v1/messages/count_tokens", bad)).await;
    assert_eq!(status, 400);
    assert_eq!(json(&refused)["type"], "error", "{refused:?}");
}

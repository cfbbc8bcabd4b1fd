//! Bad requests get OpenAI-shaped errors with the right status and a message naming the
//! problem.

use actix_web::http::header::CONTENT_TYPE;
use actix_web::test::TestRequest;
use serde_json::json;

use super::{call, expect_error, post, Fixture, Script, MAX_MODEL_LEN, MODEL};
use crate::gateway::MAX_BODY_BYTES;

const BAD: &str = "invalid_request_error";

#[actix_web::test]
async fn malformed_json_is_400() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let request = TestRequest::post()
        .uri("/v1/completions")
        .insert_header((CONTENT_TYPE, "application/json"))
        .set_payload("{\"prompt\": ")
        .to_request();
    let message = expect_error(call(&app, request).await, 400, BAD, None);
    assert!(message.contains("not valid JSON"), "{message}");
}

#[actix_web::test]
async fn a_wrong_type_names_the_field() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let request = post(
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": "ten"}),
    );
    let message = expect_error(call(&app, request).await, 400, BAD, Some("max_tokens"));
    assert!(message.starts_with("max_tokens: invalid type"), "{message}");
    let request = json!({"messages": [{"role": "user", "content": 5}]});
    let response = call(&app, post("/v1/chat/completions", request)).await;
    expect_error(response, 400, BAD, Some("messages[0].content"));
    let request = post("/v1/completions", json!({"max_tokens": 3}));
    let message = expect_error(call(&app, request).await, 400, BAD, None);
    assert!(message.contains("missing field `prompt`"), "{message}");
}

#[actix_web::test]
async fn out_of_range_fields_are_named() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let cases = [
        (json!({"max_tokens": -1}), "max_tokens", "-1"),
        (json!({"temperature": -0.5}), "temperature", "-0.5"),
        (json!({"top_p": 0}), "top_p", "0"),
        (json!({"n": 2}), "n", "2"),
        (json!({"best_of": 3}), "best_of", "3"),
        (json!({"echo": true}), "echo", "echo"),
        (json!({"suffix": "!"}), "suffix", "suffix"),
        (json!({"stop": ""}), "stop", "empty"),
    ];
    for (mut request, param, needle) in cases {
        request["prompt"] = json!("x");
        let response = call(&app, post("/v1/completions", request.clone())).await;
        let message = expect_error(response, 400, BAD, Some(param));
        assert!(message.contains(needle), "{request}: {message}");
    }
    let request = post(
        "/v1/completions",
        json!({"prompt": "x", "n": 1, "echo": false}),
    );
    assert_eq!(call(&app, request).await.0, 200);
}

#[actix_web::test]
async fn an_unknown_model_is_404() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let request = post("/v1/completions", json!({"model": "gpt-4", "prompt": "x"}));
    let message = expect_error(call(&app, request).await, 404, "not_found_error", None);
    assert!(
        message.contains("The model 'gpt-4' does not exist"),
        "{message}"
    );
    assert!(message.contains(MODEL), "{message}");
}

#[actix_web::test]
async fn a_prompt_over_the_context_names_both_numbers() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let prompt = fixture.tokenizer.encode("Say hi", true).unwrap().len();
    let request = post(
        "/v1/completions",
        json!({"prompt": "Say hi", "max_tokens": 200}),
    );
    let message = expect_error(call(&app, request).await, 400, BAD, Some("max_tokens"));
    let numbers = [
        format!("({prompt} tokens)"),
        "(200)".into(),
        MAX_MODEL_LEN.to_string(),
    ];
    assert!(
        numbers.iter().all(|n| message.contains(n.as_str())),
        "{message}"
    );
    let long = "a ".repeat(MAX_MODEL_LEN);
    let request = post("/v1/completions", json!({"prompt": long}));
    let message = expect_error(call(&app, request).await, 400, BAD, Some("prompt"));
    assert!(message.contains(&MAX_MODEL_LEN.to_string()), "{message}");
}

#[actix_web::test]
async fn an_oversized_body_is_413() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let request = TestRequest::post()
        .uri("/v1/completions")
        .insert_header((CONTENT_TYPE, "application/json"))
        .set_payload(vec![b' '; MAX_BODY_BYTES + 1])
        .to_request();
    let message = expect_error(call(&app, request).await, 413, BAD, None);
    assert!(message.contains(&MAX_BODY_BYTES.to_string()), "{message}");
}

#[actix_web::test]
async fn unknown_paths_and_methods_get_json_errors() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let request = TestRequest::get().uri("/v2/nothing").to_request();
    let message = expect_error(call(&app, request).await, 404, "not_found_error", None);
    assert!(message.contains("/v2/nothing"), "{message}");
    let request = TestRequest::get().uri("/v1/completions").to_request();
    expect_error(call(&app, request).await, 405, BAD, None);
}

//! What the gateway refuses rather than serves wrongly: fields that would change the
//! output, bodies that are not JSON, and engine failures told apart from shutdowns; and
//! the signed 64-bit `seed` it takes.

use actix_web::http::header::CONTENT_TYPE;
use actix_web::test::TestRequest;
use serde_json::json;

use super::{call, expect_error, post, Fixture, Script};
use crate::messages::FinishReason;

const BAD: &str = "invalid_request_error";

#[actix_web::test]
async fn fields_that_would_change_the_output_are_refused_by_name() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let cases = [
        ("functions", json!([{"name": "f"}])),
        ("function_call", json!({"name": "f"})),
        ("structural_tag", json!({"structures": []})),
        ("bad_words", json!(["x"])),
    ];
    for uri in ["/v1/completions", "/v1/chat/completions"] {
        for (field, value) in &cases {
            let request = json!({"prompt": "x", "messages": [{"role": "user", "content": "x"}],
                *field: value});
            let message = expect_error(call(&app, post(uri, request)).await, 400, BAD, Some(field));
            assert!(
                message.contains("not supported"),
                "{uri} {field}: {message}"
            );
        }
    }
    assert!(
        fixture.submitted.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    let neutral = json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none",
        "tools": [], "min_tokens": 0, "prompt_logprobs": null,
        "response_format": {"type": "text"}, "user": "u"});
    let (status, body) = call(&app, post("/v1/chat/completions", neutral)).await;
    assert_eq!(status, 200, "{body:?}");
}

#[actix_web::test]
async fn a_body_that_is_not_declared_json_is_415() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let body = r#"{"prompt": "x", "max_tokens": 2}"#;
    for content_type in ["application/x-www-form-urlencoded", "text/plain"] {
        let request = TestRequest::post()
            .uri("/v1/completions")
            .insert_header((CONTENT_TYPE, content_type))
            .set_payload(body)
            .to_request();
        let message = expect_error(call(&app, request).await, 415, BAD, None);
        assert!(message.contains(content_type), "{message}");
    }
    let request = TestRequest::post()
        .uri("/tokenize")
        .insert_header((CONTENT_TYPE, "application/x-www-form-urlencoded"))
        .set_payload(r#"{"prompt": "x"}"#)
        .to_request();
    expect_error(call(&app, request).await, 415, BAD, None);
    assert!(fixture.submitted.lock().unwrap().is_empty());
    for content_type in [Some("application/json; charset=utf-8"), None] {
        let mut request = TestRequest::post().uri("/v1/completions").set_payload(body);
        if let Some(content_type) = content_type {
            request = request.insert_header((CONTENT_TYPE, content_type));
        }
        let (status, _) = call(&app, request.to_request()).await;
        assert_eq!(status, 200, "{content_type:?}");
    }
}

#[actix_web::test]
async fn seed_takes_the_signed_64_bit_range() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    for (seed, expected) in [
        (json!(-1), u64::MAX),
        (json!(i64::MIN), 1 << 63),
        (json!(i64::MAX), i64::MAX as u64),
        (json!(7), 7),
    ] {
        let request = post("/v1/completions", json!({"prompt": "x", "seed": seed}));
        assert_eq!(call(&app, request).await.0, 200, "{seed}");
        assert_eq!(fixture.last_submitted().spec.params.seed, Some(expected));
    }
    let request = post("/v1/completions", json!({"prompt": "x", "seed": u64::MAX}));
    expect_error(call(&app, request).await, 400, BAD, Some("seed"));
}

#[actix_web::test]
async fn an_engine_failure_is_not_called_a_shutdown() {
    let fixture = Fixture::new(Script::Generate {
        text: "Hello".into(),
        per_event: 1,
        finish: FinishReason::Error,
    });
    let app = fixture.app().await;
    let request = post("/v1/completions", json!({"prompt": "x"}));
    let message = expect_error(call(&app, request).await, 500, "server_error", None);
    assert!(message.contains("engine failed"), "{message}");
    assert!(!message.contains("shutting down"), "{message}");
}

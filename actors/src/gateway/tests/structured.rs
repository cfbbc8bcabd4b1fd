//! Constrained requests at the gateway: every spelling of a constraint reaches the engine
//! with its compiled grammar, on both endpoints; a constraint that does not compile is a
//! 400 naming its field and saying why, and reaches nothing.

use serde_json::{json, Value};

use super::{call, expect_error, post, Fixture, Script};

const BAD: &str = "invalid_request_error";

/// `field: value` on a request of `uri`.
fn request(uri: &str, field: &str, value: &Value) -> Value {
    match uri {
        "/v1/completions" => json!({"prompt": "x", "max_tokens": 4, field: value}),
        _ => json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
            field: value}),
    }
}

#[actix_web::test]
async fn constrained_requests_reach_the_engine_with_their_grammar() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let cases = [
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}),
            "json_schema",
        ),
        (
            "response_format",
            json!({"type": "json_object"}),
            "json_object",
        ),
        (
            "structured_outputs",
            json!({"choice": ["a", "b"]}),
            "choice",
        ),
        ("guided_regex", json!("[0-9]+"), "regex"),
        ("guided_grammar", json!("start: \"a\" | \"b\""), "grammar"),
        ("json_schema", schema.clone(), "json_schema"),
    ];
    for uri in ["/v1/completions", "/v1/chat/completions"] {
        for (field, value, kind) in &cases {
            let (status, body) = call(&app, post(uri, request(uri, field, value))).await;
            assert_eq!(status, 200, "{uri} {field}: {body:?}");
            let submitted = fixture.last_submitted();
            let grammar = submitted.spec.grammar.expect("a grammar");
            assert_eq!(grammar.kind(), *kind, "{uri} {field}");
        }
    }
    let (status, _) = call(&app, post("/v1/completions", json!({"prompt": "x"}))).await;
    assert_eq!(status, 200);
    assert!(fixture.last_submitted().spec.grammar.is_none());
}

#[actix_web::test]
async fn constraints_that_do_not_compile_name_their_field() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let cases = [
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "s",
                "schema": {"type": "no-such-type"}}}),
            "response_format.json_schema.schema",
            "invalid JSON schema",
        ),
        (
            "structured_outputs",
            json!({"regex": "(unclosed"}),
            "structured_outputs.regex",
            "invalid regular expression",
        ),
        (
            "guided_grammar",
            json!("start: missing"),
            "guided_grammar",
            "invalid grammar",
        ),
        (
            "json_schema",
            json!({"type": "object", "minProperties": 2, "additionalProperties": true}),
            "json_schema",
            "minProperties",
        ),
    ];
    for uri in ["/v1/completions", "/v1/chat/completions"] {
        for (field, value, param, says) in &cases {
            let response = call(&app, post(uri, request(uri, field, value))).await;
            let message = expect_error(response, 400, BAD, Some(param));
            assert!(message.contains(says), "{uri} {field}: {message}");
        }
    }
    assert!(fixture.submitted.lock().unwrap().is_empty());
}

//! `/tokenize` and `/detokenize`.

use serde_json::json;

use super::{call, expect_error, json, post, Fixture, Script, MAX_MODEL_LEN};

#[actix_web::test]
async fn tokenize_a_prompt_or_a_chat() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let (status, body) = call(&app, post("/tokenize", json!({"prompt": "Hello"}))).await;
    assert_eq!(status, 200);
    let tokens = fixture.tokenizer.encode("Hello", true).unwrap();
    let expected = json!({"count": tokens.len(), "max_model_len": MAX_MODEL_LEN, "tokens": tokens});
    assert_eq!(json(&body), expected);

    let request = json!({"prompt": "Hello", "add_special_tokens": false});
    let (_, body) = call(&app, post("/tokenize", request)).await;
    let plain = fixture.tokenizer.encode("Hello", false).unwrap();
    assert_eq!(json(&body)["tokens"], json!(plain));

    let request = json!({"messages": [{"role": "user", "content": "Hi"}]});
    let (_, body) = call(&app, post("/tokenize", request)).await;
    let rendered = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    let chat = fixture.tokenizer.encode(rendered, false).unwrap();
    assert_eq!(json(&body)["tokens"], json!(chat));

    let response = call(&app, post("/tokenize", json!({}))).await;
    let message = expect_error(response, 400, "invalid_request_error", None);
    assert!(message.contains("`prompt`"), "{message}");
}

#[actix_web::test]
async fn detokenize_round_trips_and_rejects_unknown_ids() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let tokens = fixture.tokenizer.encode("Hello wörld", true).unwrap();
    let (status, body) = call(&app, post("/detokenize", json!({"tokens": tokens}))).await;
    assert_eq!(status, 200);
    assert_eq!(json(&body), json!({"prompt": "<|bos|>Hello wörld"}));

    let response = call(&app, post("/detokenize", json!({"tokens": [1, 5000]}))).await;
    let message = expect_error(response, 400, "invalid_request_error", Some("tokens"));
    assert!(message.contains("5000"), "{message}");
    let response = call(&app, post("/detokenize", json!({"tokens": [-1]}))).await;
    expect_error(response, 400, "invalid_request_error", Some("tokens[0]"));
}

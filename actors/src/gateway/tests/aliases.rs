//! The compatibility aliases: the OpenAI routes without `/v1` (as llama.cpp serves them),
//! vLLM's `root` and `parent` on model cards, and `return_token_strs` on `/tokenize`.

use actix_web::http::header::AUTHORIZATION;
use actix_web::test::TestRequest;
use serde_json::{json, Value};

use super::{call, expect_error, json, post, Fixture, Script, MODEL, ROOT};

/// A request each OpenAI route answers with 200, by its path without `/v1`.
fn requests() -> Vec<(&'static str, Option<Value>)> {
    // Anthropic's Messages API needs `model`; the others take the served one.
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2});
    vec![
        (
            "/completions",
            Some(json!({"prompt": "Hi", "max_tokens": 2})),
        ),
        ("/chat/completions", Some(chat.clone())),
        ("/messages", Some(chat)),
        (
            "/responses",
            Some(json!({"input": "Hi", "max_output_tokens": 2})),
        ),
        ("/models", None),
        ("/models/tiny", None), // the fixture's MODEL
    ]
}

/// `path` as a GET, or a POST of `body`, with the key `key` when given.
fn request(path: &str, body: &Option<Value>, key: Option<&str>) -> actix_http::Request {
    let mut request = match body {
        Some(body) => TestRequest::post().uri(path).set_json(body),
        None => TestRequest::get().uri(path),
    };
    if let Some(key) = key {
        request = request.insert_header((AUTHORIZATION, format!("Bearer {key}")));
    }
    request.to_request()
}

#[actix_web::test]
async fn openai_routes_answer_without_the_v1_prefix_as_with_it() {
    let fixture = Fixture::new(Script::text("Hello there"));
    let app = fixture.app().await;
    for (path, body) in requests() {
        let (status, bare) = call(&app, request(path, &body, None)).await;
        assert_eq!(status, 200, "{path}: {bare:?}");
        let (status, v1) = call(&app, request(&format!("/v1{path}"), &body, None)).await;
        assert_eq!(status, 200, "/v1{path}: {v1:?}");
        let (bare, v1) = (json(&bare), json(&v1));
        assert_eq!(bare["object"], v1["object"], "{path}: {bare} vs {v1}");
        assert_eq!(bare["type"], v1["type"], "{path}: {bare} vs {v1}");
    }
    let (status, _) = call(&app, TestRequest::get().uri("/completions").to_request()).await;
    assert_eq!(status, 405);
    let missing = call(&app, TestRequest::get().uri("/models/gpt-4").to_request()).await;
    expect_error(missing, 404, "not_found_error", Some("model"));
}

#[actix_web::test]
async fn the_aliases_need_the_api_key_as_v1_does() {
    let fixture = Fixture::new(Script::text("ok"));
    fixture.configure(|config| config.api_keys = vec!["k1".into()]);
    let app = fixture.app().await;
    for (path, body) in requests() {
        let (status, _) = call(&app, request(path, &body, None)).await;
        assert_eq!(status, 401, "{path}");
        let (status, _) = call(&app, request(path, &body, Some("k1"))).await;
        assert_eq!(status, 200, "{path}");
    }
}

#[actix_web::test]
async fn model_cards_carry_vllms_root_and_a_null_parent() {
    let fixture = Fixture::new(Script::text("ok"));
    fixture.configure(|config| config.served_model_name = "served-name".into());
    let app = fixture.app().await;
    let list = json(
        &call(&app, TestRequest::get().uri("/v1/models").to_request())
            .await
            .1,
    );
    let card = &list["data"][0];
    assert_eq!(card["id"], "served-name", "{list}");
    assert_eq!(card["root"], ROOT, "{list}");
    assert!(
        card["parent"].is_null() && card.get("parent").is_some(),
        "{list}"
    );
    let one = TestRequest::get()
        .uri("/v1/models/served-name")
        .to_request();
    assert_eq!(json(&call(&app, one).await.1)["root"], ROOT);
}

#[actix_web::test]
async fn tokenize_returns_the_vocabulary_strings_when_asked() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let ask =
        json!({"prompt": "Hello world", "add_special_tokens": false, "return_token_strs": true});
    let body = json(&call(&app, post("/tokenize", ask)).await.1);
    let strs: Vec<&str> = body["token_strs"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(
        strs.len(),
        body["tokens"].as_array().unwrap().len(),
        "{body}"
    );
    // Byte-level BPE marks the space before "world" as `Ġ`, as convert_ids_to_tokens does.
    assert_eq!(strs.concat(), "HelloĠworld", "{body}");

    let plain = json(
        &call(&app, post("/tokenize", json!({"prompt": "Hello world"})))
            .await
            .1,
    );
    assert!(plain.get("token_strs").is_none(), "{plain}");
}

//! API keys on `/v1/*`, `/tokenize` and `/detokenize`; `/health`, `/ready` and `/metrics`
//! stay open.

use actix_web::http::header::{AUTHORIZATION, CONTENT_TYPE};
use actix_web::test::TestRequest;
use serde_json::json;

use super::{call, expect_error, json, Fixture, Script, MAX_MODEL_LEN, MODEL};

fn with_key(request: TestRequest, key: Option<&str>) -> actix_http::Request {
    match key {
        Some(key) => request.insert_header((AUTHORIZATION, format!("Bearer {key}"))),
        None => request,
    }
    .to_request()
}

fn completion(key: Option<&str>) -> actix_http::Request {
    let request = TestRequest::post()
        .uri("/v1/completions")
        .set_json(json!({"prompt": "x"}));
    with_key(request, key)
}

#[actix_web::test]
async fn a_missing_or_wrong_api_key_is_401() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    assert_eq!(call(&app, completion(None)).await.0, 200, "no keys: open");
    fixture.configure(|config| config.api_keys = vec!["k1".into(), "k2".into()]);

    let response = call(&app, completion(None)).await;
    let message = expect_error(response, 401, "authentication_error", None);
    assert!(message.contains("missing API key"), "{message}");
    let response = call(&app, completion(Some("nope"))).await;
    let message = expect_error(response, 401, "authentication_error", None);
    assert!(message.contains("invalid API key"), "{message}");
    assert_eq!(call(&app, completion(Some("k2"))).await.0, 200);

    let malformed = TestRequest::post().uri("/v1/completions").set_payload("{");
    let response = call(&app, with_key(malformed, None)).await;
    expect_error(response, 401, "authentication_error", None);
    for uri in ["/tokenize", "/detokenize"] {
        let request = TestRequest::post()
            .uri(uri)
            .set_json(json!({"tokens": [1]}));
        let response = call(&app, with_key(request, None)).await;
        expect_error(response, 401, "authentication_error", None);
    }
    let models = with_key(TestRequest::get().uri("/v1/models"), Some("wrong"));
    expect_error(call(&app, models).await, 401, "authentication_error", None);
}

#[actix_web::test]
async fn health_and_metrics_stay_open() {
    let fixture = Fixture::new(Script::text("ok"));
    fixture.configure(|config| config.api_keys = vec!["k1".into()]);
    let app = fixture.app().await;
    for uri in ["/health", "/ready"] {
        let probe = TestRequest::get().uri(uri).to_request();
        assert_eq!(call(&app, probe).await.0, 200, "{uri}");
    }
    let metrics = TestRequest::get().uri("/metrics").to_request();
    let response = actix_web::test::call_service(&app, metrics).await;
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(content_type, "text/plain; version=0.0.4");
    let body = actix_web::test::read_body(response).await;
    assert_eq!(body, "peregrine:num_requests_running 0\n");
}

#[actix_web::test]
async fn models_lists_the_served_model() {
    let fixture = Fixture::new(Script::text("ok"));
    fixture.configure(|config| config.api_keys = vec!["k1".into()]);
    let app = fixture.app().await;
    let request = with_key(TestRequest::get().uri("/v1/models"), Some("k1"));
    let (status, body) = call(&app, request).await;
    assert_eq!(status, 200);
    let body = json(&body);
    assert_eq!(body["object"], "list");
    let card = &body["data"][0];
    assert_eq!(card["id"], MODEL);
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "peregrine");
    assert_eq!(card["max_model_len"], MAX_MODEL_LEN);
}

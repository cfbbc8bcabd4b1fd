//! The front door's limits: bodies that stall or overflow, prompts too long to tokenize,
//! and web origins.

use actix_http::{BoxedPayloadStream, Payload};
use actix_web::http::header::{
    ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_REQUEST_METHOD,
    CONTENT_LENGTH, CONTENT_TYPE, ORIGIN,
};
use actix_web::test::{self, TestRequest};
use serde_json::json;

use super::{call, expect_error, post, Fixture, Script, BODY_LIMIT};

const BAD: &str = "invalid_request_error";

#[actix_web::test]
async fn a_body_that_stops_short_of_its_length_gets_408() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let request = TestRequest::post()
        .uri("/v1/completions")
        .insert_header((CONTENT_TYPE, "application/json"))
        .insert_header((CONTENT_LENGTH, "1000"))
        .to_request();
    let stalled: BoxedPayloadStream = Box::pin(futures_util::stream::pending());
    let (request, _) = request.replace_payload(Payload::from(stalled));
    let started = std::time::Instant::now();
    let message = expect_error(call(&app, request).await, 408, BAD, None);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(
        message,
        "the request body did not arrive within 1 s (request_body_timeout)"
    );
}

#[actix_web::test]
async fn a_body_over_the_limit_gets_413_before_it_is_read() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let request = TestRequest::post()
        .uri("/v1/completions")
        .insert_header((CONTENT_TYPE, "application/json"))
        .set_payload(vec![b' '; BODY_LIMIT + 1])
        .to_request();
    let message = expect_error(call(&app, request).await, 413, BAD, None);
    assert!(message.contains(&BODY_LIMIT.to_string()), "{message}");
    assert!(message.contains("max_request_body"), "{message}");
    // A declared length over the limit is refused without waiting for the body.
    let request = TestRequest::post()
        .uri("/v1/chat/completions")
        .insert_header((CONTENT_LENGTH, (BODY_LIMIT + 1).to_string()))
        .to_request();
    let stalled: BoxedPayloadStream = Box::pin(futures_util::stream::pending());
    let (request, _) = request.replace_payload(Payload::from(stalled));
    expect_error(call(&app, request).await, 413, BAD, None);
    // The limit reloads live.
    fixture.configure(|c| c.max_request_body = 64);
    let request = post("/v1/completions", json!({"prompt": "x".repeat(100)}));
    expect_error(call(&app, request).await, 413, BAD, None);
}

#[actix_web::test]
async fn prompts_over_the_character_limit_get_413_naming_the_field() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    fixture.configure(|c| c.max_prompt_chars = Some(40));
    let long = "é".repeat(41);
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": long, "max_tokens": 2}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": [long], "max_tokens": 2}),
            "prompt",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": long}], "max_tokens": 2}),
            "messages",
        ),
        ("/tokenize", json!({"prompt": long}), "prompt"),
        (
            "/tokenize",
            json!({"messages": [{"role": "user", "content": long}]}),
            "messages",
        ),
    ];
    for (uri, body, param) in cases {
        let message = expect_error(call(&app, post(uri, body)).await, 413, BAD, Some(param));
        assert!(
            message.contains("over the limit of 40 (max_prompt_chars)"),
            "{message}"
        );
    }
    let (status, body) = call(
        &app,
        post(
            "/v1/completions",
            json!({"prompt": "é".repeat(40), "max_tokens": 2}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body:?}");
}

#[actix_web::test]
async fn only_allowed_web_origins_are_served() {
    let fixture = Fixture::new(Script::text("ok"));
    let request = || post("/v1/completions", json!({"prompt": "hi", "max_tokens": 2}));
    let from = |origin: &str| {
        let mut request = request();
        request
            .headers_mut()
            .insert(ORIGIN, origin.parse().unwrap());
        request
    };

    // By default no origin is allowed; clients that send none are served.
    let app = fixture.app().await;
    let (status, _) = call(&app, request()).await;
    assert_eq!(status, 200);
    let message = expect_error(
        call(&app, from("http://localhost:3000")).await,
        403,
        "permission_error",
        None,
    );
    assert!(
        message.contains("--allowed-origins http://localhost:3000"),
        "{message}"
    );

    let app = fixture.app_for_origins(&["https://app.example.com"]).await;
    let response = test::call_service(&app, from("https://app.example.com")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers().get(ACCESS_CONTROL_ALLOW_ORIGIN).unwrap(),
        "https://app.example.com"
    );
    let (status, _) = call(&app, from("https://evil.example.com")).await;
    assert_eq!(status, 403);

    let preflight = |origin: &str| {
        TestRequest::default()
            .method(actix_web::http::Method::OPTIONS)
            .uri("/v1/chat/completions")
            .insert_header((ORIGIN, origin))
            .insert_header((ACCESS_CONTROL_REQUEST_METHOD, "POST"))
            .to_request()
    };
    let response = test::call_service(&app, preflight("https://app.example.com")).await;
    assert!(response.status().is_success(), "{}", response.status());
    let methods = response
        .headers()
        .get(ACCESS_CONTROL_ALLOW_METHODS)
        .unwrap();
    assert!(methods.to_str().unwrap().contains("POST"), "{methods:?}");
    let (status, _) = call(&app, preflight("https://evil.example.com")).await;
    assert_eq!(status, 403);
}

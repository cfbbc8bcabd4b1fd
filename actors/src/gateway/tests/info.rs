//! `GET /v1/models/{model}` (OpenAI's retrieve) and `GET /health`'s engine liveness.

use actix_web::test::TestRequest;

use super::{call, expect_error, json, Fixture, Script, MODEL};
use crate::health::ThreadAlive;

#[actix_web::test]
async fn the_served_model_is_retrieved_and_another_is_404() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let request = TestRequest::get().uri(&format!("/v1/models/{MODEL}"));
    let (status, body) = call(&app, request.to_request()).await;
    assert_eq!(status, 200);
    let card = json(&body);
    assert_eq!(
        (card["id"].as_str(), card["object"].as_str()),
        (Some(MODEL), Some("model"))
    );
    assert!(card["created"].as_u64().is_some(), "{card}");
    for other in ["gpt-4", "org/name"] {
        let request = TestRequest::get().uri(&format!("/v1/models/{other}"));
        let response = call(&app, request.to_request()).await;
        let message = expect_error(response, 404, "not_found_error", Some("model"));
        assert!(
            message.contains(&format!("The model '{other}' does not exist")),
            "{message}"
        );
    }
}

#[actix_web::test]
async fn a_model_name_with_a_slash_is_retrieved() {
    let fixture = Fixture::new(Script::text("ok"));
    fixture.configure(|config| config.served_model_name = "org/name".into());
    let app = fixture.app().await;
    let request = TestRequest::get().uri("/v1/models/org/name").to_request();
    let (status, body) = call(&app, request).await;
    assert_eq!(status, 200);
    assert_eq!(json(&body)["id"], "org/name");
}

#[actix_web::test]
async fn health_is_503_after_a_failed_step_until_one_succeeds() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let health = || TestRequest::get().uri("/health").to_request();
    assert_eq!(call(&app, health()).await.0, 200);
    fixture.health.step_failed("device fault".into());
    let message = expect_error(call(&app, health()).await, 503, "server_error", None);
    assert!(message.contains("device fault"), "{message}");
    fixture.health.step_succeeded();
    assert_eq!(call(&app, health()).await.0, 200);
}

#[actix_web::test]
async fn ready_is_503_while_draining_or_failed_and_health_stays_200_through_a_drain() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let get = |uri: &str| TestRequest::get().uri(uri).to_request();
    assert_eq!(call(&app, get("/ready")).await.0, 200);
    fixture.health.step_failed("device fault".into());
    let message = expect_error(call(&app, get("/ready")).await, 503, "server_error", None);
    assert!(message.contains("device fault"), "{message}");
    fixture.health.step_succeeded();
    assert_eq!(call(&app, get("/ready")).await.0, 200);
    fixture.state.stop_accepting();
    let message = expect_error(call(&app, get("/ready")).await, 503, "server_error", None);
    assert!(message.contains("shutting down"), "{message}");
    assert_eq!(call(&app, get("/health")).await.0, 200);
}

#[actix_web::test]
async fn health_is_503_once_a_runner_thread_has_died() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let alive = ThreadAlive::new();
    fixture.health.watch("target runner", &alive);
    let health = || TestRequest::get().uri("/health").to_request();
    assert_eq!(call(&app, health()).await.0, 200);
    drop(alive.guard());
    let message = expect_error(call(&app, health()).await, 503, "server_error", None);
    assert!(message.contains("target runner"), "{message}");
}

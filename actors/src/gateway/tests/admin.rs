//! `/admin/reload` and `/admin/config` behind the admin token.

use actix_web::http::header::AUTHORIZATION;
use actix_web::test::TestRequest;
use serde_json::json;

use super::{call, expect_error, json, Fixture, Script, TEMPLATE};

fn reload(token: Option<&str>) -> actix_http::Request {
    let request = TestRequest::post().uri("/admin/reload");
    match token {
        Some(token) => request.insert_header((AUTHORIZATION, format!("Bearer {token}"))),
        None => request,
    }
    .to_request()
}

#[actix_web::test]
async fn admin_endpoints_need_the_token() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let response = call(&app, reload(None)).await;
    let message = expect_error(response, 401, "authentication_error", None);
    assert!(message.contains("missing admin token"), "{message}");
    let response = call(&app, reload(Some("wrong"))).await;
    let message = expect_error(response, 401, "authentication_error", None);
    assert!(message.contains("invalid admin token"), "{message}");

    fixture.configure(|config| config.admin_token = None);
    let response = call(&app, reload(Some("admin"))).await;
    let message = expect_error(response, 403, "permission_error", None);
    assert!(message.contains("disabled"), "{message}");
}

#[actix_web::test]
async fn reload_reports_what_changed_and_config_is_masked() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let (status, body) = call(&app, reload(Some("admin"))).await;
    assert_eq!(status, 200);
    let expected = json!({"status": "reloaded", "message": "max_num_seqs: 8 -> 16"});
    assert_eq!(json(&body), expected);

    let request = TestRequest::get()
        .uri("/admin/config")
        .insert_header((AUTHORIZATION, "Bearer admin"))
        .to_request();
    let (status, body) = call(&app, request).await;
    assert_eq!(status, 200);
    assert_eq!(json(&body)["api_keys"], json!(["***"]));
}

#[actix_web::test]
async fn a_refused_reload_says_why() {
    let reason = "max_num_seqs must be at least 1";
    let fixture = Fixture::build(Script::text("ok"), Some(TEMPLATE), Some(reason));
    let app = fixture.app().await;
    let response = call(&app, reload(Some("admin"))).await;
    let message = expect_error(response, 400, "invalid_request_error", None);
    assert!(message.contains(reason), "{message}");
    assert!(message.contains("running one stays"), "{message}");
}

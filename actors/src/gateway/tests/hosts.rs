//! The `Host` guard against DNS rebinding, as a listener bound to a loopback address runs
//! it: every route refuses a foreign `Host` with 403 naming the header.

use actix_web::http::header::HOST;
use actix_web::http::Method;
use actix_web::test::TestRequest;
use serde_json::json;

use super::{call, expect_error, Fixture, Script};

/// A request to `uri` with `method` and, when given, `Host: host`.
fn to(method: Method, uri: &str, host: Option<&str>) -> actix_http::Request {
    let mut request = TestRequest::default().method(method).uri(uri);
    if let Some(host) = host {
        request = request.insert_header((HOST, host));
    }
    if uri.ends_with("completions") {
        request = request.set_json(json!({"prompt": "hi", "max_tokens": 2}));
    }
    request.to_request()
}

const ROUTES: [(Method, &str); 7] = [
    (Method::GET, "/metrics"),
    (Method::GET, "/v1/models"),
    (Method::GET, "/health"),
    (Method::GET, "/ready"),
    (Method::POST, "/v1/completions"),
    (Method::GET, "/no/such/path"),
    (Method::OPTIONS, "/v1/chat/completions"),
];

#[actix_web::test]
async fn a_loopback_server_refuses_every_route_to_a_rebound_host() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app_on_loopback(&[]).await;
    for (method, uri) in ROUTES {
        for host in [
            "attacker.example:8000",
            "localhost.attacker.com",
            "127.0.0.1.nip.io",
        ] {
            let what = format!("{method} {uri} Host {host}");
            let answer = call(&app, to(method.clone(), uri, Some(host))).await;
            let message = expect_error(answer, 403, "permission_error", Some("Host"));
            assert!(message.contains("Host header"), "{what}: {message}");
            assert!(message.contains("--allowed-hosts"), "{what}: {message}");
        }
    }
    // An absolute request-target names the host too.
    let (status, _) = call(
        &app,
        to(Method::GET, "http://attacker.example/v1/models", None),
    )
    .await;
    assert_eq!(status, 403);
}

#[actix_web::test]
async fn a_loopback_server_serves_loopback_hosts_and_listed_ones() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app_on_loopback(&[]).await;
    for host in [
        Some("localhost:8000"),
        Some("LocalHost"),
        Some("127.0.0.1:8000"),
        Some("[::1]:8000"),
        None,
    ] {
        for uri in ["/metrics", "/v1/models", "/health", "/v1/completions"] {
            let method = if uri == "/v1/completions" {
                Method::POST
            } else {
                Method::GET
            };
            let (status, body) = call(&app, to(method, uri, host)).await;
            assert_eq!(status, 200, "{uri} Host {host:?}: {body:?}");
        }
    }

    let app = fixture.app_on_loopback(&["api.example.com"]).await;
    let (status, _) = call(
        &app,
        to(Method::GET, "/v1/models", Some("API.example.com:443")),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = call(&app, to(Method::GET, "/v1/models", Some("evil.example"))).await;
    assert_eq!(status, 403);

    let app = fixture.app_on_loopback(&["*"]).await;
    let (status, _) = call(&app, to(Method::GET, "/metrics", Some("evil.example"))).await;
    assert_eq!(status, 200);

    // The default app is a non-loopback listener without --allowed-hosts: nothing checked.
    let app = fixture.app().await;
    let (status, _) = call(&app, to(Method::GET, "/metrics", Some("evil.example"))).await;
    assert_eq!(status, 200);
}

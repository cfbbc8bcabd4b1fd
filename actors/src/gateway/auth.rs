//! Bearer-token checks as extractors: put [`ApiKeyAuth`] or [`AdminAuth`] first among a
//! handler's arguments and the request is refused before its body is read.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::http::header::AUTHORIZATION;
use actix_web::{web, FromRequest, HttpRequest};

use super::errors::ApiError;
use super::state::GatewayState;

/// Proof that the request carries one of the configured API keys (or that none is set).
#[derive(Debug)]
pub struct ApiKeyAuth;

/// Proof that the request carries the admin token.
#[derive(Debug)]
pub struct AdminAuth;

impl FromRequest for ApiKeyAuth {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(state(req).and_then(|state| {
            let config = state.config.get();
            if config.api_keys.is_empty() {
                return Ok(Self);
            }
            match bearer(req) {
                None => Err(ApiError::unauthorized(
                    "missing API key: send it as `Authorization: Bearer <key>`",
                )),
                Some(key) if config.api_keys.iter().any(|k| same(k, key)) => Ok(Self),
                Some(_) => Err(ApiError::unauthorized("invalid API key")),
            }
        }))
    }
}

impl FromRequest for AdminAuth {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(state(req).and_then(|state| {
            let Some(token) = state.config.get().admin_token.clone() else {
                return Err(ApiError::forbidden(
                    "admin endpoints are disabled: no admin token is configured",
                ));
            };
            match bearer(req) {
                None => Err(ApiError::unauthorized(
                    "missing admin token: send it as `Authorization: Bearer <token>`",
                )),
                Some(given) if same(&token, given) => Ok(Self),
                Some(_) => Err(ApiError::unauthorized("invalid admin token")),
            }
        }))
    }
}

/// The gateway state registered as app data.
fn state(req: &HttpRequest) -> Result<&web::Data<GatewayState>, ApiError> {
    req.app_data::<web::Data<GatewayState>>()
        .ok_or_else(|| ApiError::internal("the gateway state is not registered"))
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case).
fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Compares secrets in time that does not depend on where they first differ.
fn same(expected: &str, given: &str) -> bool {
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn bearer_tokens_are_parsed_leniently() {
        let req = TestRequest::default()
            .insert_header((AUTHORIZATION, "bearer  k1 "))
            .to_http_request();
        assert_eq!(bearer(&req), Some("k1"));
        let req = TestRequest::default()
            .insert_header((AUTHORIZATION, "Basic k1"))
            .to_http_request();
        assert_eq!(bearer(&req), None);
        assert_eq!(bearer(&TestRequest::default().to_http_request()), None);
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(same("secret", "secret"));
        assert!(!same("secret", "secreT"));
        assert!(!same("secret", "secret2"));
        assert!(!same("", "x"));
    }
}

//! Key and token checks as extractors: put [`ApiKeyAuth`] or [`AdminAuth`] first among a
//! handler's arguments and the request is refused before its body is read.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::http::header::AUTHORIZATION;
use actix_web::{web, FromRequest, HttpRequest};
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use super::errors::ApiError;
use super::state::GatewayState;

/// The header Anthropic's clients send their key in.
const API_KEY: &str = "x-api-key";

/// Proof that the request carries one of the configured API keys, as a bearer token or
/// in `x-api-key` (or that none is set).
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
            match bearer(req).or_else(|| api_key_header(req)) {
                None => Err(ApiError::unauthorized(
                    "missing API key: send it as `Authorization: Bearer <key>` or \
                     `x-api-key: <key>`",
                )),
                Some(key) if matches_any(&config.api_keys, key) => Ok(Self),
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
                Some(given) if matches_any(std::slice::from_ref(&token), given) => Ok(Self),
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

/// The key of an `x-api-key: <key>` header, as Anthropic's clients send it.
fn api_key_header(req: &HttpRequest) -> Option<&str> {
    let key = req.headers().get(API_KEY)?.to_str().ok()?.trim();
    (!key.is_empty()).then_some(key)
}

/// Whether `given` is one of `secrets`, in time that depends neither on where a secret
/// first differs from it, nor on their lengths, nor on which secret matched: each side is
/// hashed to a fixed-length digest and every secret's digest is compared with `subtle`'s
/// constant-time equality, with no early exit.
fn matches_any(secrets: &[String], given: &str) -> bool {
    let given = Sha256::digest(given.as_bytes());
    let found = secrets.iter().fold(Choice::from(0), |found, secret| {
        found
            | Sha256::digest(secret.as_bytes())
                .as_slice()
                .ct_eq(given.as_slice())
    });
    found.into()
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
        let keys = ["k1".to_owned(), "secret".to_owned(), "k3".to_owned()];
        assert!(matches_any(&keys, "secret"));
        assert!(matches_any(&keys, "k1"));
        assert!(matches_any(&keys, "k3"));
        assert!(!matches_any(&keys, "secreT"));
        assert!(!matches_any(&keys, "secret2"));
        assert!(!matches_any(&keys, "k"));
        assert!(!matches_any(&keys, ""));
        assert!(!matches_any(&[], "x"));
    }
}

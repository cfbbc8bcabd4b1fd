//! Errors in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`, with the
//! HTTP status of the gateway's error; and extractors whose refusals are worded so.

use std::fmt;

use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError};
use futures_util::future::LocalBoxFuture;
use serde_json::{json, Value};

use crate::gateway::errors::ApiError;

/// A gateway error answered in Anthropic's shape.
#[derive(Debug)]
pub struct MessagesError(pub ApiError);

impl fmt::Display for MessagesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl ResponseError for MessagesError {
    fn status_code(&self) -> StatusCode {
        self.0.status()
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.0.status()).json(body(&self.0))
    }
}

/// The error body: also the data of an `error` event when a stream fails part-way. The
/// message names the field it is about, as Anthropic's do (there is no `param`).
pub fn body(err: &ApiError) -> Value {
    let message = match err.param() {
        Some(param) if !err.message().starts_with(param) => {
            format!("{param}: {}", err.message())
        }
        _ => err.message().to_owned(),
    };
    json!({"type": "error", "error": {"type": kind(err.status()), "message": message}})
}

/// Anthropic's error type for `status`.
fn kind(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        status if status.is_server_error() => "api_error",
        _ => "invalid_request_error",
    }
}

/// The gateway's extractor `T` (the key check, the JSON body) with its refusal in
/// Anthropic's shape.
pub struct Worded<T>(pub T);

impl<T> FromRequest for Worded<T>
where
    T: FromRequest<Error = ApiError> + 'static,
    T::Future: 'static,
{
    type Error = MessagesError;
    type Future = LocalBoxFuture<'static, Result<Self, MessagesError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let extracted = T::from_request(req, payload);
        Box::pin(async move { extracted.await.map(Worded).map_err(MessagesError) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_anthropics_types_and_the_field_is_named() {
        let cases = [
            (
                ApiError::invalid("max_tokens", "missing"),
                400,
                "invalid_request_error",
            ),
            (
                ApiError::unauthorized("no key"),
                401,
                "authentication_error",
            ),
            (ApiError::not_found("no model"), 404, "not_found_error"),
            (ApiError::rate_limited("full"), 429, "overloaded_error"),
            (ApiError::internal("bad"), 500, "api_error"),
            (ApiError::unavailable("down"), 503, "overloaded_error"),
        ];
        for (err, status, kind) in cases {
            let response = MessagesError(err.clone()).error_response();
            assert_eq!(response.status().as_u16(), status);
            let body = body(&err);
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], kind, "{err}");
        }
        let named = body(&ApiError::invalid("max_tokens", "missing"));
        assert_eq!(named["error"]["message"], "max_tokens: missing");
        let already = body(&ApiError::invalid("top_k", "top_k: invalid type"));
        assert_eq!(already["error"]["message"], "top_k: invalid type");
    }
}

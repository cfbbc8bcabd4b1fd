//! Request bodies: declared JSON (or not declared at all), read within the live size limit
//! and time limit, then turned into typed requests with the path of the offending field in
//! every error (`messages[0].content: invalid type…`).

use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::http::header::CONTENT_LENGTH;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use bytes::BytesMut;
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::errors::ApiError;
use super::state::GatewayState;

/// A request's body read as JSON. Its `Content-Type` must be JSON (`application/json`,
/// `…+json`) or absent (else 415, before the body is read); it may be at most
/// `max_request_body` bytes (else 413, at once when `Content-Length` says so) and must
/// arrive within `request_body_timeout` (else 408: a client that sends less than it
/// declared does not hold its connection for ever).
#[derive(Debug)]
pub struct JsonBody(pub Value);

/// How a body is read.
#[derive(Clone, Copy, Debug)]
struct BodyLimits {
    max_bytes: usize,
    timeout: Duration,
}

impl FromRequest for JsonBody {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let checked = json_content(req).and_then(|()| {
            let state = req
                .app_data::<web::Data<GatewayState>>()
                .ok_or_else(|| ApiError::internal("the gateway's state is missing from the app"))?;
            let config = state.config.get();
            let limits = BodyLimits {
                max_bytes: config.max_request_body,
                timeout: config.request_body_timeout,
            };
            match declared_length(req) {
                Some(length) if length > limits.max_bytes => Err(too_large(limits.max_bytes)),
                _ => Ok(limits),
            }
        });
        let mut payload = payload.take();
        Box::pin(async move {
            let limits = checked?;
            let read = read_body(&mut payload, limits.max_bytes);
            let body = tokio::time::timeout(limits.timeout, read)
                .await
                .map_err(|_| {
                    ApiError::request_timeout(format!(
                        "the request body did not arrive within {} s (request_body_timeout)",
                        limits.timeout.as_secs()
                    ))
                })??;
            serde_json::from_slice(&body).map(JsonBody).map_err(|err| {
                ApiError::bad_request(format!("the request body is not valid JSON: {err}"))
            })
        })
    }
}

/// 415 unless the request's `Content-Type` is JSON or absent.
fn json_content(req: &HttpRequest) -> Result<(), ApiError> {
    match req.mime_type() {
        Ok(None) => Ok(()),
        Ok(Some(mime))
            if mime.subtype() == actix_web::mime::JSON
                || mime.suffix() == Some(actix_web::mime::JSON) =>
        {
            Ok(())
        }
        _ => Err(ApiError::unsupported_media_type(format!(
            "the request body must be JSON (`Content-Type: application/json`), not `{}`",
            req.content_type()
        ))),
    }
}

/// The body length the `Content-Length` header declares, if it does.
fn declared_length(req: &HttpRequest) -> Option<usize> {
    req.headers()
        .get(CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The whole body, refused with 413 as soon as it passes `max_bytes`.
async fn read_body(payload: &mut Payload, max_bytes: usize) -> Result<BytesMut, ApiError> {
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk
            .map_err(|err| ApiError::bad_request(format!("cannot read the request body: {err}")))?;
        if body.len() + chunk.len() > max_bytes {
            return Err(too_large(max_bytes));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// 413 for a body over `limit` bytes.
fn too_large(limit: usize) -> ApiError {
    ApiError::too_large(format!(
        "the request body exceeds the limit of {limit} bytes (max_request_body)"
    ))
}

/// Deserializes `value` into `T`; the error names the field's path as `param`: for a
/// missing field, the path of the field itself (`messages[0].role`), not of its container.
pub fn parse<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let message = err.to_string();
        // serde's `missing field `NAME``, said of the container.
        let inner = err.inner().to_string();
        let missing = inner
            .strip_prefix("missing field `")
            .and_then(|rest| rest.strip_suffix('`'));
        match (path.as_str(), missing) {
            (".", Some(field)) => ApiError::invalid(field, message),
            (_, Some(field)) => ApiError::invalid(format!("{path}.{field}"), message),
            (".", None) => ApiError::bad_request(message),
            _ => ApiError::invalid(path, message),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    struct Inner {
        content: String,
    }

    #[derive(Debug, Deserialize)]
    struct Outer {
        max_tokens: Option<usize>,
        messages: Vec<Inner>,
    }

    #[test]
    fn errors_name_the_field_path() {
        let ok = parse::<Outer>(&json!({"max_tokens": 3, "messages": [{"content": "hi"}]}));
        let ok = ok.unwrap();
        assert_eq!(
            (ok.max_tokens, ok.messages[0].content.as_str()),
            (Some(3), "hi")
        );

        let err = parse::<Outer>(&json!({"max_tokens": "x", "messages": []})).unwrap_err();
        assert_eq!(err.param(), Some("max_tokens"));
        assert!(
            err.message().starts_with("max_tokens: invalid type"),
            "{err}"
        );

        let err = parse::<Outer>(&json!({"messages": [{"content": 3}]})).unwrap_err();
        assert_eq!(err.param(), Some("messages[0].content"));

        let err = parse::<Outer>(&json!({})).unwrap_err();
        assert_eq!(err.param(), Some("messages"));
        assert!(err.message().contains("missing field `messages`"), "{err}");

        let err = parse::<Outer>(&json!({"messages": [{"content": "a"}, {}]})).unwrap_err();
        assert_eq!(err.param(), Some("messages[1].content"));
        assert_eq!(err.message(), "messages[1]: missing field `content`");

        let err = parse::<Outer>(&json!([1])).unwrap_err();
        assert_eq!(err.param(), None, "about the body as a whole: {err}");
    }
}

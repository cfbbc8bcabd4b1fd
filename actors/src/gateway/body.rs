//! Request bodies: declared JSON (or not declared at all), read under a size limit, then
//! turned into typed requests with the path of the offending field in every error
//! (`messages[0].content: invalid type…`).

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::error::{JsonPayloadError, PayloadError};
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::errors::ApiError;

/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Proof that the request's `Content-Type` is JSON (`application/json`, `…+json`) or
/// absent; anything else is refused with 415 before the body is read. Put it before the
/// `web::Json` argument of a handler.
#[derive(Debug)]
pub struct JsonContent;

impl FromRequest for JsonContent {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(match req.mime_type() {
            Ok(None) => Ok(Self),
            Ok(Some(mime))
                if mime.subtype() == actix_web::mime::JSON
                    || mime.suffix() == Some(actix_web::mime::JSON) =>
            {
                Ok(Self)
            }
            _ => Err(ApiError::unsupported_media_type(format!(
                "the request body must be JSON (`Content-Type: application/json`), not `{}`",
                req.content_type()
            ))),
        })
    }
}

/// How JSON bodies are read: up to [`MAX_BODY_BYTES`] (else 413), with errors in OpenAI's
/// shape. The `Content-Type` is checked before, by [`JsonContent`].
pub fn json_config() -> web::JsonConfig {
    web::JsonConfig::default()
        .limit(MAX_BODY_BYTES)
        .content_type_required(false)
        .error_handler(|err, _req| payload_error(err).into())
}

/// The API error for a body that could not be read as JSON.
fn payload_error(err: JsonPayloadError) -> ApiError {
    match err {
        JsonPayloadError::OverflowKnownLength { length, limit } => ApiError::too_large(format!(
            "the request body ({length} bytes) exceeds the limit of {limit} bytes"
        )),
        JsonPayloadError::Overflow { limit } => too_large(limit),
        JsonPayloadError::Payload(PayloadError::Overflow) => too_large(MAX_BODY_BYTES),
        JsonPayloadError::Deserialize(err) => {
            ApiError::bad_request(format!("the request body is not valid JSON: {err}"))
        }
        other => ApiError::bad_request(format!("cannot read the request body: {other}")),
    }
}

/// 413 for a body of unknown length over `limit`.
fn too_large(limit: usize) -> ApiError {
    ApiError::too_large(format!(
        "the request body exceeds the limit of {limit} bytes"
    ))
}

/// Deserializes `value` into `T`; the error names the field's path as `param`.
pub fn parse<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let message = err.to_string();
        if path == "." {
            ApiError::bad_request(message)
        } else {
            ApiError::invalid(path, message)
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
        assert_eq!(err.param(), None);
        assert!(err.message().contains("missing field `messages`"), "{err}");
    }
}

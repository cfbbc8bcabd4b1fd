//! Request bodies: read as JSON under a size limit, then turned into typed requests with
//! the path of the offending field in every error (`messages[0].content: invalid type…`).

use actix_web::error::{JsonPayloadError, PayloadError};
use actix_web::web;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::errors::ApiError;

/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// How JSON bodies are read: up to [`MAX_BODY_BYTES`] (else 413), whatever the
/// `Content-Type` says (as `curl -d` sends a form type), with errors in OpenAI's shape.
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

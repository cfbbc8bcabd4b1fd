//! Errors in OpenAI's JSON shape, `{"error": {"message", "type", "param", "code"}}`, with
//! `code` set to the HTTP status as vLLM does.

use std::fmt;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::messages::SubmitError;

/// A refused or failed request: the status, a message that names the problem, and the
/// request field it is about (OpenAI's `param`) where there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<String>,
}

/// The body of an error response.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// The error itself.
    pub error: ErrorDetail<'a>,
}

/// OpenAI's error object.
#[derive(Debug, Serialize)]
pub struct ErrorDetail<'a> {
    /// What went wrong, in words.
    pub message: &'a str,
    /// The error's class, such as `invalid_request_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field the error is about.
    pub param: Option<&'a str>,
    /// The HTTP status.
    pub code: u16,
}

impl ApiError {
    /// An error of any `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// 400 about the request field `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            ..Self::bad_request(message)
        }
    }

    /// This error, about the request field `param`.
    pub fn with_param(self, param: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            ..self
        }
    }

    /// This error with its `param` renamed by `rename` (from another API's name of the
    /// field).
    pub fn map_param(self, rename: impl FnOnce(&str) -> String) -> Self {
        let param = self.param.as_deref().map(rename);
        Self { param, ..self }
    }

    /// 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401: a missing or wrong key or token.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 403: the endpoint is turned off.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    /// 404: an unknown model or path.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 405: a known path with the wrong method.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, message)
    }

    /// 408: the client did not send its request in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, message)
    }

    /// 413: the request body is over the limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }

    /// 415: the request body is not JSON.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, message)
    }

    /// 429: the waiting queue is full.
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, message)
    }

    /// 500: something the client cannot fix.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// 503: the server is shutting down or its engine is gone.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The request field the error is about.
    pub fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }

    /// OpenAI's error class for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            status if status.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body: also sent as an SSE event when a stream fails part-way.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind(),
                param: self.param(),
                code: self.status.as_u16(),
            },
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status).json(self.body())
    }
}

impl From<SubmitError> for ApiError {
    fn from(err: SubmitError) -> Self {
        let message = err.to_string();
        match err {
            SubmitError::QueueFull { .. } => Self::rate_limited(message),
            SubmitError::TooLong { .. } => Self::invalid("max_tokens", message),
            SubmitError::CacheTooSmall { .. } => Self::invalid("max_tokens", message),
            SubmitError::ShuttingDown => Self::unavailable(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submit_errors_map_to_their_statuses() {
        let cases = [
            (SubmitError::QueueFull { limit: 3 }, 429, "rate_limit_error"),
            (
                SubmitError::TooLong {
                    prompt: 10,
                    max_tokens: 20,
                    max_model_len: 16,
                },
                400,
                "invalid_request_error",
            ),
            (SubmitError::ShuttingDown, 503, "server_error"),
        ];
        for (err, status, kind) in cases {
            let api = ApiError::from(err.clone());
            assert_eq!(api.status().as_u16(), status, "{err}");
            assert_eq!(api.kind(), kind);
            assert_eq!(api.message(), err.to_string());
        }
    }

    #[test]
    fn the_body_has_openai_shape() {
        let err = ApiError::invalid("temperature", "bad");
        let body = serde_json::to_value(err.body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {"message": "bad", "type": "invalid_request_error",
                "param": "temperature", "code": 400}})
        );
    }
}

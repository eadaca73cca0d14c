//! Errors as the OpenAI API writes them: `{"error": {"message", "type", "param",
//! "code"}}` with a 4xx or 5xx status — and, for a full queue, `Retry-After`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An error as the OpenAI API returns it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
    /// Seconds after which a client may try again (`Retry-After`).
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A bad request (400), naming the parameter at fault.
    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            param,
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// A path or method the API does not have (404, 405), or another model (404).
    pub fn not_found(status: StatusCode, message: impl Into<String>) -> Self {
        Self::new(status, "invalid_request_error", message)
    }

    /// No key, or not the server's (401).
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
            .with_code("invalid_api_key")
    }

    /// A body larger than the server takes (413).
    pub fn too_large(limit: usize) -> Self {
        let message = format!("the request body is larger than this server's limit of {limit} bytes (--max-body-bytes)");
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            message,
        )
        .with_code("request_too_large")
    }

    /// The queue is full (429): try again after `retry_after` seconds.
    pub fn busy(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
                .with_code("queue_full")
        }
    }

    /// The request ran past the server's time limit, or its body came too slowly (408).
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "timeout_error", message)
            .with_code("request_timeout")
    }

    /// The model is still loading, or the server is shutting down (503).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            message,
        )
    }

    /// The server failed (500): decoding failed, or the model's thread stopped.
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn with_code(self, code: &'static str) -> Self {
        ApiError {
            code: Some(code),
            ..self
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The `{"error": …}` object.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

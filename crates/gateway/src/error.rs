//! The gateway's one error type. Errors that reach a client leave as the OpenAI
//! envelope; what went wrong upstream is logged, not sent.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use slotgate_protocol::{ApiError, ErrorType};

/// Seconds a client is told to wait before retrying a 503.
pub const RETRY_AFTER_SECS: u32 = 1;

/// Everything that can go wrong in the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// An answer for the client, as it is.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A setting is wrong; names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Binding, spawning or serving failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The response for an [`ApiError`]: its status, the envelope, and `Retry-After`
/// on a 503.
pub fn api_response(err: ApiError) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let retry = err.kind == ErrorType::UnavailableError;
    let mut response = (status, axum::Json(err.into_envelope())).into_response();
    if retry {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    response
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        match self {
            Self::Api(err) => api_response(err),
            other => {
                tracing::error!(error = %other, "request failed");
                api_response(ApiError::internal())
            }
        }
    }
}

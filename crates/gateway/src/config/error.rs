//! The gateway's one error type. Errors that reach a client leave as the OpenAI
//! envelope; what went wrong upstream is logged, not sent.

use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use slotgate_protocol::ApiError;

pub use slotgate_http::{api_response, RETRY_AFTER_SECS};

/// Everything that can go wrong in the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// An answer for the client, as it is.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The request body could not be read (too large, broken off).
    #[error(transparent)]
    Body(#[from] BytesRejection),
    /// A setting is wrong; names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Binding, spawning or serving failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        match self {
            Self::Api(err) => api_response(err),
            Self::Body(rejection) => {
                slotgate_http::rejection_response(rejection.status(), rejection.body_text())
            }
            other => {
                tracing::error!(error = %other, "request failed");
                api_response(ApiError::internal())
            }
        }
    }
}

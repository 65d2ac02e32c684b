//! The engine's one error type. Every error that reaches a client leaves as the
//! OpenAI envelope, built in one `IntoResponse`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use slotgate_protocol::{ApiError, ErrorType};

/// Seconds a client is told to wait before retrying a 503.
pub const RETRY_AFTER_SECS: u32 = 1;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A request the client must change; sent as it is.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A setting is wrong; names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A model file could not be loaded.
    #[error("cannot load model {path}: {reason}")]
    Load {
        /// The file.
        path: String,
        /// What llama.cpp or the file check said.
        reason: String,
    },
    /// llama.cpp failed while running a request.
    #[error("llama.cpp: {0}")]
    Llama(String),
    /// The scheduler thread is gone.
    #[error("the scheduler has stopped")]
    SchedulerGone,
    /// Binding or serving failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl EngineError {
    /// What the client sees. Internal details stay in the log.
    pub fn to_api(&self) -> ApiError {
        match self {
            Self::Api(err) => err.clone(),
            Self::Load { .. } => ApiError::invalid("model", self.to_string()),
            Self::Config(msg) => ApiError::new(ErrorType::InvalidRequestError, msg.clone()),
            Self::SchedulerGone => {
                ApiError::new(ErrorType::UnavailableError, "the engine is shutting down")
            }
            Self::Llama(_) | Self::Io(_) => ApiError::internal(),
        }
    }
}

/// Turns an [`ApiError`] into a response: the status of its type, the envelope as
/// the body, and `Retry-After` on a 503.
pub fn api_response(err: ApiError) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let retry = err.kind == ErrorType::UnavailableError;
    let mut response = (status, axum::Json(err.into_envelope())).into_response();
    if retry {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    response
}

impl IntoResponse for EngineError {
    fn into_response(self) -> Response {
        if matches!(self, Self::Llama(_) | Self::Io(_)) {
            tracing::error!(error = %self, "request failed");
        }
        api_response(self.to_api())
    }
}

//! The engine's one error type. Every error that reaches a client leaves as the
//! OpenAI envelope, built in one `IntoResponse`.

use axum::response::{IntoResponse, Response};
use slotgate_protocol::{ApiError, ErrorType};

pub use slotgate_http::{api_response, RETRY_AFTER_SECS};

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A request the client must change; sent as it is.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The configuration cannot be read.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A setting has a value it cannot take.
    #[error("invalid configuration: {field}: {reason}")]
    Setting {
        /// The setting.
        field: String,
        /// Why its value is refused.
        reason: String,
    },
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
    /// The error in the words of an API served as chat, whose fields have
    /// other names (see [`ApiError::renamed`]).
    pub fn renamed(self, names: &[(&str, &str)]) -> Self {
        match self {
            Self::Api(err) => Self::Api(err.renamed(names)),
            other => other,
        }
    }

    /// What the client sees. Internal details stay in the log.
    pub fn to_api(&self) -> ApiError {
        match self {
            Self::Api(err) => err.clone(),
            Self::Load { .. } => ApiError::invalid("model", self.to_string()),
            Self::Config(msg) => ApiError::new(ErrorType::InvalidRequestError, msg.clone()),
            Self::Setting { field, .. } => ApiError::invalid(field.clone(), self.to_string()),
            Self::SchedulerGone => {
                ApiError::new(ErrorType::UnavailableError, "the engine is shutting down")
            }
            Self::Llama(_) | Self::Io(_) => ApiError::internal(),
        }
    }
}

impl IntoResponse for EngineError {
    fn into_response(self) -> Response {
        if matches!(self, Self::Llama(_) | Self::Io(_)) {
            tracing::error!(error = %self, "request failed");
        }
        api_response(self.to_api())
    }
}

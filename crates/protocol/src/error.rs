//! The OpenAI error envelope, `{"error":{"message","type","param","code"}}`, and the
//! error this crate returns when a request fails validation.

use serde::{Deserialize, Serialize};

/// The `type` of an error, which OpenAI clients branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    /// The request is malformed or asks for something impossible (400).
    InvalidRequestError,
    /// The model or resource does not exist (404).
    NotFoundError,
    /// Missing or wrong credentials (401).
    AuthenticationError,
    /// Valid credentials that may not do this, such as use a model (403).
    PermissionError,
    /// Too many requests (429).
    RateLimitError,
    /// The server is full or loading and the request may be retried (503).
    UnavailableError,
    /// The prompt does not fit the context (400), as llama.cpp's server names it.
    ExceedContextSizeError,
    /// Something failed inside the server (500).
    ServerError,
    /// A backend failed the request in a way that another attempt would repeat,
    /// as when it killed every engine it reached (502).
    UpstreamError,
    /// A feature this server has switched off, such as llama-server's
    /// `--no-slots` (501), as llama-server names it.
    NotSupportedError,
    /// A type this crate does not know, as sent by some other server.
    #[serde(other)]
    Unknown,
}

impl ErrorType {
    /// The HTTP status that carries this type of error.
    pub fn status(self) -> u16 {
        match self {
            Self::InvalidRequestError | Self::ExceedContextSizeError => 400,
            Self::AuthenticationError => 401,
            Self::PermissionError => 403,
            Self::NotFoundError => 404,
            Self::RateLimitError => 429,
            Self::UnavailableError => 503,
            Self::ServerError | Self::Unknown => 500,
            Self::UpstreamError => 502,
            Self::NotSupportedError => 501,
        }
    }
}

/// The error code sent when every slot and the queue are full, or a queued request
/// waited too long. A gateway retries such a request elsewhere.
pub const SLOT_UNAVAILABLE: &str = "slot_unavailable";

/// One error as a client sees it: the inside of the envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// A sentence for people, naming the problem.
    pub message: String,
    /// The class of error.
    #[serde(rename = "type")]
    pub kind: ErrorType,
    /// The request parameter at fault, as a path such as `messages[0].content`.
    pub param: Option<String>,
    /// A machine-readable code such as `slot_unavailable`.
    pub code: Option<String>,
    /// For a prompt longer than the context: both sizes, beside the other
    /// fields, as llama-server sends them.
    #[serde(flatten)]
    pub context: Option<ContextSize>,
    /// Seconds after which a retry may succeed, sent as `Retry-After` (not in
    /// the body): a rate limit's window, or a busy server's guess.
    #[serde(skip)]
    pub retry_after: Option<u32>,
}

/// The sizes of a prompt that does not fit, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextSize {
    /// Tokens of the prompt.
    pub n_prompt_tokens: u32,
    /// Tokens the context holds.
    pub n_ctx: u32,
}

impl ApiError {
    /// This error in the words of an API served as the chat it translates to,
    /// whose fields have other names: each pair is chat's name and the API's.
    /// A name renames a `param` that starts with it (up to a `.` or `[`); a
    /// name that starts with `.` renames that part wherever it is. The message
    /// names the field as the `param` does.
    pub fn renamed(mut self, names: &[(&str, &str)]) -> Self {
        let Some(old) = self.param.clone() else { return self };
        let mut param = old.clone();
        for (chat, own) in names {
            if chat.starts_with('.') {
                param = param.replace(chat, own);
            } else if let Some(rest) = param.strip_prefix(chat) {
                if rest.is_empty() || rest.starts_with(['.', '[']) {
                    param = format!("{own}{rest}");
                }
            }
        }
        if param != old {
            self.message = self.message.replace(&old, &param);
            self.param = Some(param);
        }
        self
    }

    /// An error of the given type with no parameter or code.
    pub fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind,
            param: None,
            code: None,
            context: None,
            retry_after: None,
        }
    }

    /// A 400 naming the parameter at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorType::InvalidRequestError, message).with_param(param)
    }

    /// A 404 for a model this server does not serve.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(ErrorType::NotFoundError, format!("The model `{model}` does not exist"))
            .with_param("model")
            .with_code("model_not_found")
    }

    /// A 503 saying that no slot is free and the queue cannot take the request.
    pub fn slot_unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorType::UnavailableError, message).with_code(SLOT_UNAVAILABLE)
    }

    /// A 500 whose details stay in the server's log.
    pub fn internal() -> Self {
        Self::new(ErrorType::ServerError, "internal server error")
    }

    /// Sets `param`.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets `code`.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// Sets the `Retry-After` seconds.
    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Sets the sizes of a prompt that does not fit.
    pub fn with_context(mut self, n_prompt_tokens: u32, n_ctx: u32) -> Self {
        self.context = Some(ContextSize { n_prompt_tokens, n_ctx });
        self
    }

    /// The HTTP status for this error.
    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// Whether another server may succeed where this one refused: the error says the
    /// server was busy or loading, not that the request is wrong.
    pub fn is_retryable(&self) -> bool {
        self.kind == ErrorType::UnavailableError
    }

    /// Wraps the error in its envelope.
    pub fn into_envelope(self) -> ErrorEnvelope {
        ErrorEnvelope { error: self }
    }
}

/// The body of every error response: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    /// The error itself.
    pub error: ApiError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_error_names_the_apis_own_field() {
        let names = [
            ("max_completion_tokens", "max_output_tokens"),
            ("messages", "input"),
            (".function.parameters", ".parameters"),
        ];
        let err = ApiError::invalid("max_completion_tokens", "max_completion_tokens must be >= 1");
        let err = err.renamed(&names);
        assert_eq!(err.param.as_deref(), Some("max_output_tokens"));
        assert_eq!(err.message, "max_output_tokens must be >= 1");
        let err = ApiError::invalid(
            "tools.f.function.parameters.a",
            "at `tools.f.function.parameters.a`",
        );
        let err = err.renamed(&names);
        assert_eq!(err.param.as_deref(), Some("tools.f.parameters.a"));
        assert_eq!(err.message, "at `tools.f.parameters.a`");
        let err = ApiError::invalid("messages[0].content", "x").renamed(&names);
        assert_eq!(err.param.as_deref(), Some("input[0].content"));
        let err = ApiError::invalid("messages_extra", "x").renamed(&names);
        assert_eq!(err.param.as_deref(), Some("messages_extra"), "a word that starts with a name");
    }
}

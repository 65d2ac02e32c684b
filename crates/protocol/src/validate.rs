//! Checks of a parsed request that serde cannot express. Each failure names the
//! parameter and the reason, as OpenAI does: `temperature must be between 0 and 2`.

use crate::chat::{ChatCompletionRequest, MessageContent, Role};
use crate::common::Sampling;
use crate::completions::CompletionRequest;
use crate::embeddings::{EmbeddingInput, EmbeddingRequest};
use crate::error::ApiError;

/// Most choices per prompt, as OpenAI allows.
pub const MAX_N: u32 = 128;
/// Most stop sequences, as OpenAI allows.
pub const MAX_STOP: usize = 4;
/// Most inputs in one embeddings request, as OpenAI allows.
pub const MAX_EMBEDDING_INPUTS: usize = 2048;
/// Most tools one request may offer, as OpenAI allows.
pub const MAX_TOOLS: usize = 128;
/// Most prompts in one completions request. An engine takes fewer still: no more
/// choices (prompts times `n`) than its slots and queue hold.
pub const MAX_PROMPTS: usize = 2048;
/// Longest `cache_salt`, in bytes: a salt is an identifier, not a payload.
pub const MAX_CACHE_SALT: usize = 1024;

type Check = Result<(), ApiError>;

fn range(param: &str, value: Option<f32>, min: f32, max: f32) -> Check {
    match value {
        Some(v) if !(min..=max).contains(&v) => Err(ApiError::invalid(
            param,
            format!("{param} must be between {min} and {max}, got {v}"),
        )),
        _ => Ok(()),
    }
}

fn at_least_one(param: &str, value: Option<u32>) -> Check {
    match value {
        Some(0) => Err(ApiError::invalid(param, format!("{param} must be at least 1"))),
        _ => Ok(()),
    }
}

impl Sampling {
    /// Checks the sampling settings.
    pub fn validate(&self) -> Check {
        range("temperature", self.temperature, 0.0, 2.0)?;
        range("top_p", self.top_p, 0.0, 1.0)?;
        range("min_p", self.min_p, 0.0, 1.0)?;
        range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        if let Some(k) = self.top_k.filter(|k| *k < 0) {
            return Err(ApiError::invalid("top_k", format!("top_k must be at least 0, got {k}")));
        }
        at_least_one("n", self.n)?;
        match self.cache_salt.as_deref() {
            Some("") => {
                return Err(ApiError::invalid(
                    "cache_salt",
                    "cache_salt must be a non-empty string when given",
                ))
            }
            Some(salt) if salt.len() > MAX_CACHE_SALT => {
                return Err(ApiError::invalid(
                    "cache_salt",
                    format!(
                        "cache_salt must be at most {MAX_CACHE_SALT} bytes, got {}",
                        salt.len()
                    ),
                ))
            }
            _ => {}
        }
        if let Some(n) = self.n.filter(|n| *n > MAX_N) {
            return Err(ApiError::invalid("n", format!("n must be at most {MAX_N}, got {n}")));
        }
        if self.stream_options.is_some() && !self.is_stream() {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ));
        }
        let stops = self.stop_strings();
        if stops.len() > MAX_STOP {
            return Err(ApiError::invalid(
                "stop",
                format!("stop must hold at most {MAX_STOP} sequences, got {}", stops.len()),
            ));
        }
        if stops.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", "stop sequences must not be empty"));
        }
        if let Some(bias) = &self.logit_bias {
            bias.check_openai()?;
        }
        if let Some(resume) = &self.slotgate_resume {
            resume.validate(self.is_stream())?;
        }
        Ok(())
    }
}

impl ChatCompletionRequest {
    /// Checks the request; the error names the first parameter at fault.
    pub fn validate(&self) -> Check {
        if self.model.is_empty() {
            return Err(ApiError::invalid("model", "model must not be empty"));
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "messages must contain at least one message",
            ));
        }
        self.validate_messages()?;
        at_least_one("max_tokens", self.max_tokens)?;
        at_least_one("max_completion_tokens", self.max_completion_tokens)?;
        if let Some(n) = self.top_logprobs {
            if n > crate::logprobs::MAX_TOP_LOGPROBS {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!(
                        "top_logprobs must be between 0 and {}",
                        crate::logprobs::MAX_TOP_LOGPROBS
                    ),
                ));
            }
            if n > 0 && self.logprobs != Some(true) {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs needs `logprobs: true`",
                ));
            }
        }
        self.validate_tools()?;
        self.sampling.validate()
    }

    /// Every message's content is text, and every tool message names its call.
    fn validate_messages(&self) -> Check {
        for (i, message) in self.messages.iter().enumerate() {
            match &message.content {
                None if message.role != Role::Assistant => {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].content"),
                        format!(
                            "messages[{i}].content is required for {} messages",
                            message.role.as_str()
                        ),
                    ));
                }
                Some(MessageContent::Parts(parts)) => {
                    for (j, part) in parts.iter().enumerate() {
                        let param = format!("messages[{i}].content[{j}]");
                        if part.kind != "text" {
                            return Err(ApiError::invalid(
                                &param,
                                format!(
                                    "{param}: content part type `{}` is not supported by this server; only `text` parts are",
                                    part.kind
                                ),
                            ));
                        }
                        if part.text.is_none() {
                            return Err(ApiError::invalid(
                                format!("{param}.text"),
                                format!("{param}.text is required for text parts"),
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        for (i, message) in self.messages.iter().enumerate() {
            if message.role == Role::Tool
                && message.tool_call_id.as_deref().is_none_or(str::is_empty)
            {
                return Err(ApiError::invalid(
                    format!("messages[{i}].tool_call_id"),
                    "a tool message needs the `tool_call_id` of the call it answers",
                ));
            }
        }
        Ok(())
    }

    /// The tools are functions with distinct plain names, and `tool_choice`
    /// names one of them or needs them.
    fn validate_tools(&self) -> Check {
        let choice = crate::ToolChoice::read(self.tool_choice.as_ref())?;
        let tools = self.tools.as_deref().unwrap_or_default();
        if tools.len() > MAX_TOOLS {
            return Err(ApiError::invalid(
                "tools",
                format!("tools must hold at most {MAX_TOOLS} tools, got {}", tools.len()),
            ));
        }
        let mut names = std::collections::HashSet::with_capacity(tools.len());
        for (i, tool) in tools.iter().enumerate() {
            if tool.kind != "function" {
                return Err(ApiError::invalid(
                    format!("tools[{i}].type"),
                    format!("tool type `{}` is not supported; only `function`", tool.kind),
                ));
            }
            let name = &tool.function.name;
            if name.is_empty()
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.name"),
                    "a function name must be letters, digits, `_` or `-`",
                ));
            }
            if !names.insert(name.as_str()) {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.name"),
                    format!("two tools are named `{name}`"),
                ));
            }
        }
        match &choice {
            crate::ToolChoice::Required if tools.is_empty() => {
                return Err(ApiError::invalid("tool_choice", "`required` needs `tools`"));
            }
            crate::ToolChoice::Function(name)
                if !tools.iter().any(|t| t.function.name == *name) =>
            {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("no tool named `{name}` is in `tools`"),
                ));
            }
            _ => {}
        }
        Ok(())
    }
}

impl CompletionRequest {
    /// Checks the request; the error names the first parameter at fault.
    pub fn validate(&self) -> Check {
        if self.model.is_empty() {
            return Err(ApiError::invalid("model", "model must not be empty"));
        }
        if self.prompt.has_empty() {
            return Err(ApiError::invalid("prompt", "prompt must not be empty"));
        }
        if self.prompt.has_media() {
            return Err(ApiError::invalid(
                "prompt",
                "multimodal_data: this engine serves text models; send the prompt as text",
            ));
        }
        let count = self.prompt.count();
        if count > MAX_PROMPTS {
            return Err(ApiError::invalid(
                "prompt",
                format!("prompt must hold at most {MAX_PROMPTS} prompts, got {count}"),
            ));
        }
        at_least_one("max_tokens", self.max_tokens)?;
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "suffix is not supported by this server"));
        }
        if self.logprobs.is_some_and(|l| l > crate::logprobs::MAX_COMPLETION_LOGPROBS) {
            return Err(ApiError::invalid(
                "logprobs",
                format!(
                    "logprobs must be between 0 and {}",
                    crate::logprobs::MAX_COMPLETION_LOGPROBS
                ),
            ));
        }
        if let Some(best_of) = self.best_of {
            if best_of != self.sampling.n() {
                return Err(ApiError::invalid(
                    "best_of",
                    "best_of is not supported by this server unless it equals n",
                ));
            }
        }
        self.sampling.validate()
    }
}

impl EmbeddingRequest {
    /// Checks the request; the error names the first parameter at fault.
    pub fn validate(&self) -> Check {
        if self.model.is_empty() {
            return Err(ApiError::invalid("model", "model must not be empty"));
        }
        let count = match &self.input {
            EmbeddingInput::Text(s) => {
                if s.is_empty() {
                    return Err(ApiError::invalid("input", "input must not be empty"));
                }
                1
            }
            EmbeddingInput::Texts(v) => {
                if let Some(i) = v.iter().position(String::is_empty) {
                    return Err(ApiError::invalid(
                        format!("input[{i}]"),
                        format!("input[{i}] must not be empty"),
                    ));
                }
                v.len()
            }
            EmbeddingInput::Tokens(t) => usize::from(!t.is_empty()),
            EmbeddingInput::TokenArrays(v) => {
                if let Some(i) = v.iter().position(Vec::is_empty) {
                    return Err(ApiError::invalid(
                        format!("input[{i}]"),
                        format!("input[{i}] must not be empty"),
                    ));
                }
                v.len()
            }
        };
        if count == 0 {
            return Err(ApiError::invalid("input", "input must not be empty"));
        }
        if count > MAX_EMBEDDING_INPUTS {
            return Err(ApiError::invalid(
                "input",
                format!("input must hold at most {MAX_EMBEDDING_INPUTS} items, got {count}"),
            ));
        }
        if self.dimensions.is_some() {
            return Err(ApiError::invalid(
                "dimensions",
                "dimensions is not supported by this server",
            ));
        }
        Ok(())
    }
}

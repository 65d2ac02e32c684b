//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`)
//! as the official `anthropic` SDKs send and read it, and its one translation
//! to and from Chat Completions ([`request`], [`answer`], [`stream`]): the
//! engine serves a Messages request as the chat it translates to, and a gateway
//! in front of a backend that speaks only chat could do the same.

pub mod answer;
pub mod request;
pub mod stream;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ApiError, ErrorType};

/// A Messages request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagesRequest {
    /// The model asked for; left out (empty), the only one served, as
    /// llama-server takes it.
    #[serde(default)]
    pub model: String,
    /// Most tokens to generate; required.
    pub max_tokens: u32,
    /// The system prompt: a string or text blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<Content>,
    /// The conversation, alternating user and assistant turns.
    pub messages: Vec<InputMessage>,
    /// Strings that end the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequences: Option<Vec<String>>,
    /// Sampling temperature, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Top-k sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    /// The caller's metadata (`user_id`), accepted and not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Tools the model may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolDef>>,
    /// Whether and which tool to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Extended thinking: refused when enabled (see [`request`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Value>,
    /// Whether the answer is streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// vLLM's extension, as on chat: prompts share cached prefixes only with
    /// prompts of the same salt (a gateway sets it per key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
}

/// A `count_tokens` request: a Messages request without `max_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CountTokensRequest {
    /// The model whose tokenizer counts; left out (empty), the only one
    /// served, as llama-server takes it.
    #[serde(default)]
    pub model: String,
    /// The system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<Content>,
    /// The conversation.
    pub messages: Vec<InputMessage>,
    /// Tools, which count as the request's would.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolDef>>,
    /// Whether and which tool to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
}

impl CountTokensRequest {
    /// The Messages request it counts, with room for one token of answer.
    pub fn as_messages(self) -> MessagesRequest {
        MessagesRequest {
            model: self.model,
            max_tokens: 1,
            system: self.system,
            messages: self.messages,
            stop_sequences: None,
            temperature: None,
            top_p: None,
            top_k: None,
            metadata: None,
            tools: self.tools,
            tool_choice: self.tool_choice,
            thinking: None,
            stream: None,
            cache_salt: None,
        }
    }
}

/// The answer to `count_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokensCount {
    /// Tokens of the prompt the request makes.
    pub input_tokens: u32,
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string, or content blocks.
    pub content: Content,
}

/// Content: a string, or a list of blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Typed blocks.
    Blocks(Vec<Block>),
}

/// A content block, of a request or an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A call of a tool by the model.
    ToolUse {
        /// The call's id, which its result names.
        id: String,
        /// The tool.
        name: String,
        /// Its input: a JSON object.
        input: Value,
    },
    /// The result of a call, sent back by the client.
    ToolResult {
        /// The call it answers.
        tool_use_id: String,
        /// What the tool gave: a string or text blocks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<Content>,
        /// Whether the tool failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
    },
    /// The model's reasoning in an earlier assistant turn, given back to it
    /// (as `reasoning_content`, which reasoning models' templates render).
    Thinking {
        /// The reasoning.
        thinking: String,
        /// Anthropic's proof of it; not checked here.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// Reasoning Anthropic encrypted: nothing a template can render.
    RedactedThinking {
        /// The encrypted reasoning.
        #[serde(default)]
        data: String,
    },
    /// Any other block (images, documents): refused by name.
    #[serde(other)]
    Other,
}

impl Content {
    /// The text of the content: the string, or its text blocks joined.
    pub fn text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Blocks(blocks) => blocks
                .iter()
                .filter_map(|b| match b {
                    Block::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// A tool the model may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// Its name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its input.
    pub input_schema: Value,
    /// A server tool's type (`web_search_...`): refused; client tools have none
    /// or `custom`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    Auto {
        /// At most one call per answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    /// Some tool must be used.
    Any {
        /// At most one call per answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    /// This tool must be used.
    Tool {
        /// The tool.
        name: String,
        /// At most one call per answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    /// No tool may be used.
    None,
}

/// A Messages answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `msg_...`.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Always `assistant`.
    pub role: String,
    /// What the model wrote: text and tool calls.
    pub content: Vec<Block>,
    /// The model that answered.
    pub model: String,
    /// Why it stopped; `null` in `message_start`.
    pub stop_reason: Option<String>,
    /// The stop sequence that ended it, if one did.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: Usage,
}

/// Token counts, as Anthropic splits them: `input_tokens` are those not read
/// from the prompt cache, `cache_read_input_tokens` those that were.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens decoded for this request.
    pub input_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Prompt tokens found in the cache.
    pub cache_read_input_tokens: u32,
    /// Prompt tokens written to a cache: the engine's cache is automatic, 0.
    pub cache_creation_input_tokens: u32,
}

impl Usage {
    /// From Chat Completions' usage.
    pub fn of(usage: &crate::Usage) -> Self {
        let cached = usage.prompt_tokens_details.as_ref().map_or(0, |d| d.cached_tokens);
        Self {
            input_tokens: usage.prompt_tokens.saturating_sub(cached),
            output_tokens: usage.completion_tokens,
            cache_read_input_tokens: cached,
            cache_creation_input_tokens: 0,
        }
    }
}

/// Anthropic's error envelope: `{"type":"error","error":{"type":...,"message":...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The error.
    pub error: ErrorBody,
}

/// The error inside the envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Anthropic's error type.
    #[serde(rename = "type")]
    pub kind: String,
    /// What went wrong.
    pub message: String,
}

/// The status and envelope an [`ApiError`] has on the Messages API: Anthropic's
/// types, and 529 `overloaded_error` where OpenAI's routes answer 503, so that
/// the SDK raises the class its callers catch.
pub fn error(err: &ApiError) -> (u16, ErrorEnvelope) {
    let (status, kind) = match err.kind {
        ErrorType::InvalidRequestError | ErrorType::ExceedContextSizeError => {
            (400, "invalid_request_error")
        }
        ErrorType::AuthenticationError => (401, "authentication_error"),
        ErrorType::PermissionError => (403, "permission_error"),
        ErrorType::NotFoundError => (404, "not_found_error"),
        ErrorType::RateLimitError => (429, "rate_limit_error"),
        ErrorType::UnavailableError => (529, "overloaded_error"),
        ErrorType::NotSupportedError => (501, "api_error"),
        ErrorType::ServerError | ErrorType::UpstreamError | ErrorType::Unknown => {
            (500, "api_error")
        }
    };
    let message = match &err.param {
        Some(param) if !err.message.contains(param.as_str()) => {
            format!("{param}: {}", err.message)
        }
        _ => err.message.clone(),
    };
    let body = ErrorBody { kind: kind.into(), message };
    (status, ErrorEnvelope { kind: "error".into(), error: body })
}

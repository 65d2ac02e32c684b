//! `POST /v1/chat/completions`: the request, the answer, and its streamed chunks.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::common::{FinishReason, Sampling, Usage};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions from the application.
    System,
    /// Instructions from the developer (the newer name for `system`).
    Developer,
    /// The end user.
    User,
    /// The model.
    Assistant,
    /// The result of a tool call.
    Tool,
}

impl Role {
    /// The role's name as sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Developer => "developer",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// One part of a message whose content is an array. Only `text` parts are used; the
/// others are kept as sent so that validation can name them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    /// `text`, `image_url`, `input_audio`, `file`, `refusal`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Every other field of the part, as sent.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self { kind: "text".into(), text: Some(text.into()), rest: Map::new() }
    }
}

/// The content of a message: a string or an array of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// An array of typed parts.
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text of the message: the string, or its text parts joined. Other parts
    /// are rejected by validation before this is called.
    pub fn to_text(&self) -> String {
        match self {
            Self::Text(s) => s.clone(),
            Self::Parts(parts) => parts.iter().filter_map(|p| p.text.as_deref()).collect(),
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// What it says; may be absent on an assistant message that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// A participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls of an assistant message, kept as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning, apart from its text (the extension
    /// vLLM, DeepSeek and llama-server share): templates of reasoning models
    /// write it back into the prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message with text content.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(MessageContent::Text(content.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
        }
    }

    /// The message's text, empty when it has none.
    pub fn text(&self) -> String {
        self.content.as_ref().map(MessageContent::to_text).unwrap_or_default()
    }
}

/// `response_format`: what shape the answer must take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema of `json_schema`, and anything else sent.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The body of `POST /v1/chat/completions`. Fields this server does not know are
/// accepted and ignored, as OpenAI-compatible servers do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    /// The model to use; left out (empty), the only one served, as llama-server
    /// takes it.
    #[serde(default)]
    pub model: String,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Most tokens to generate (legacy name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Most tokens to generate; wins over `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// The shape of the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Whether to answer each token's log probability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// How many alternatives per token, with `logprobs` (0 to 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Functions the model may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<crate::Tool>>,
    /// Whether and which tool to call, as sent (see [`crate::ToolChoice::read`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Whether several calls may come in one answer (default false, as in
    /// llama-server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Whether the prompt ends with the assistant's turn opened (default true;
    /// vLLM's and llama-server's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
    /// `true` (or `"content"`): the model goes on with the last message, the
    /// assistant's, instead of writing a new one (vLLM's and llama-server's
    /// extension). A last assistant message is continued unless this is `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<Value>,
    /// More variables for the model's Jinja template, such as
    /// `{"enable_thinking": false}` (vLLM's and llama-server's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Sampling and streaming settings.
    #[serde(flatten)]
    pub sampling: Sampling,
}

impl ChatCompletionRequest {
    /// A request with defaults for everything but the model and the messages.
    pub fn new(model: impl Into<String>, messages: Vec<ChatMessage>) -> Self {
        Self {
            model: model.into(),
            messages,
            max_tokens: None,
            max_completion_tokens: None,
            response_format: None,
            logprobs: None,
            top_logprobs: None,
            tools: None,
            tool_choice: None,
            parallel_tool_calls: None,
            add_generation_prompt: None,
            continue_final_message: None,
            chat_template_kwargs: None,
            sampling: Sampling::default(),
        }
    }

    /// The token limit the client asked for, if any.
    pub fn max_tokens(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }
}

/// A message written by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: Role,
    /// The generated text.
    pub content: Option<String>,
    /// A refusal by the model; OpenAI's schema requires the field, and this
    /// server never refuses, so it is always null.
    #[serde(default)]
    pub refusal: Option<String>,
    /// The tools the model called, if it called any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<crate::ToolCall>>,
}

impl AssistantMessage {
    /// The model's answer `text`.
    pub fn text(text: String) -> Self {
        Self { role: Role::Assistant, content: Some(text), refusal: None, tool_calls: None }
    }
}

/// One choice of a chat answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Its place among the choices: prompt-major, then sample.
    pub index: u32,
    /// The generated message.
    pub message: AssistantMessage,
    /// Log probabilities, when asked for.
    #[serde(default)]
    pub logprobs: Option<crate::ChoiceLogprobs>,
    /// Why generation stopped.
    pub finish_reason: Option<FinishReason>,
    /// The stop string that ended it, where one did (see [`crate::StopReason`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<crate::StopReason>,
}

/// The answer to a non-streamed chat request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// `chatcmpl-...`, unique.
    pub id: String,
    /// Always `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// An identifier of the server's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// The choices, in index order.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama-server's `timings` (an extension): with the answer, and in a
    /// stream with each choice's last chunk and the usage chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<crate::native::Timings>,
    /// llama-server's `__verbose` (an extension, when asked for): the answer as
    /// `/completion` gives it, with the prompt as rendered.
    #[serde(rename = "__verbose", default, skip_serializing_if = "Option::is_none")]
    pub verbose: Option<Value>,
}

/// What a streamed chunk adds to a choice.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Delta {
    /// Sent once, in the first chunk of a choice.
    #[serde(default)]
    pub role: Option<Role>,
    /// New text.
    #[serde(default)]
    pub content: Option<String>,
    /// Pieces of tool calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<crate::ToolCallDelta>>,
}

/// Fields that are absent are left out, except that the chunk naming the role
/// says `"content": null` when it carries no text, as llama-server writes it
/// (and as its clients read it: the role chunk has no text yet).
impl Serialize for Delta {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        if let Some(role) = &self.role {
            map.serialize_entry("role", role)?;
        }
        if self.content.is_some() || self.role.is_some() {
            map.serialize_entry("content", &self.content)?;
        }
        if let Some(calls) = &self.tool_calls {
            map.serialize_entry("tool_calls", calls)?;
        }
        map.end()
    }
}

/// One choice inside a streamed chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    /// The choice this delta belongs to.
    pub index: u32,
    /// What it adds.
    pub delta: Delta,
    /// Log probabilities of the tokens this chunk adds, when asked for.
    #[serde(default)]
    pub logprobs: Option<crate::ChoiceLogprobs>,
    /// Set on the last chunk of the choice.
    pub finish_reason: Option<FinishReason>,
    /// The stop string that ended it, where one did (see [`crate::StopReason`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<crate::StopReason>,
}

/// One server-sent event of a streamed chat answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// The same id in every chunk of one answer.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds, the same in every chunk.
    pub created: u64,
    /// The model that answers.
    pub model: String,
    /// An identifier of the server's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// Usually one choice; empty in the final usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// Set only in the final chunk when `stream_options.include_usage` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama-server's `timings` (an extension): with the answer, and in a
    /// stream with each choice's last chunk and the usage chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<crate::native::Timings>,
    /// llama-server's `prompt_progress` (with `return_progress`): in a chunk
    /// of no choices, how far the prompt has been read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_progress: Option<crate::native::PromptProgress>,
}

//! `POST /v1/completions`: the legacy text completion request and its answer.

use serde::{Deserialize, Serialize};

use crate::common::{FinishReason, Sampling, Usage};

/// The prompt of a text completion: text or token ids, one or several, and
/// llama-server's forms besides (ids and text mixed in one prompt; several
/// prompts of different forms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenArrays(Vec<Vec<u32>>),
    /// One prompt of token ids and texts in turn (`[1, 2, "text", 3]`).
    Mixed(Vec<PromptPiece>),
    /// Several prompts, each in any of the forms above.
    Several(Vec<SubPrompt>),
    /// One prompt as llama-server's object, `{"prompt_string": ...}`.
    Object(PromptObject),
}

/// llama-server's prompt object: `{"prompt_string": ...}`, with
/// `multimodal_data` for a multimodal model (refused: the engine serves text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptObject {
    /// The text.
    pub prompt_string: String,
    /// Base64 media; refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multimodal_data: Option<serde_json::Value>,
}

/// A piece of a mixed prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PromptPiece {
    /// A token id.
    Token(u32),
    /// Text, tokenized in place.
    Text(String),
}

/// One prompt among several, in llama-server's forms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SubPrompt {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// Token ids and texts in turn.
    Mixed(Vec<PromptPiece>),
    /// `{"prompt_string": ...}`.
    Object(PromptObject),
}

/// One prompt after the array forms are taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptItem {
    /// Text, to be tokenized.
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
    /// Token ids and texts in turn; only the first piece gets the BOS token.
    Mixed(Vec<PromptPiece>),
}

impl SubPrompt {
    fn item(&self) -> PromptItem {
        match self {
            Self::Text(s) | Self::Object(PromptObject { prompt_string: s, .. }) => {
                PromptItem::Text(s.clone())
            }
            Self::Tokens(t) => PromptItem::Tokens(t.clone()),
            Self::Mixed(p) => PromptItem::Mixed(p.clone()),
        }
    }
}

impl Prompt {
    /// The prompts, in the order their choices are indexed.
    pub fn items(&self) -> Vec<PromptItem> {
        match self {
            Self::Text(s) => vec![PromptItem::Text(s.clone())],
            Self::Texts(v) => v.iter().cloned().map(PromptItem::Text).collect(),
            Self::Tokens(t) => vec![PromptItem::Tokens(t.clone())],
            Self::TokenArrays(v) => v.iter().cloned().map(PromptItem::Tokens).collect(),
            Self::Mixed(p) => vec![PromptItem::Mixed(p.clone())],
            Self::Several(v) => v.iter().map(SubPrompt::item).collect(),
            Self::Object(o) => vec![PromptItem::Text(o.prompt_string.clone())],
        }
    }

    /// How many prompts it holds.
    pub fn count(&self) -> usize {
        match self {
            Self::Texts(v) => v.len(),
            Self::TokenArrays(v) => v.len(),
            Self::Several(v) => v.len(),
            Self::Text(_) | Self::Tokens(_) | Self::Mixed(_) | Self::Object(_) => 1,
        }
    }

    /// Whether it, or one of its prompts, is empty.
    pub fn has_empty(&self) -> bool {
        let empty = |item: &PromptItem| match item {
            PromptItem::Text(_) => false,
            PromptItem::Tokens(t) => t.is_empty(),
            PromptItem::Mixed(p) => p.is_empty(),
        };
        match self {
            Self::Texts(v) => v.is_empty(),
            Self::TokenArrays(v) if v.is_empty() => true,
            Self::Several(v) if v.is_empty() => true,
            _ => self.items().iter().any(empty),
        }
    }

    /// Whether a prompt carries media (`multimodal_data`), which a text model
    /// cannot read.
    pub fn has_media(&self) -> bool {
        let media = |o: &PromptObject| o.multimodal_data.is_some();
        match self {
            Self::Object(o) => media(o),
            Self::Several(v) => v.iter().any(|p| matches!(p, SubPrompt::Object(o) if media(o))),
            _ => false,
        }
    }
}

/// The body of `POST /v1/completions`. Unknown fields are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The model to use; left out (empty), the only one served.
    #[serde(default)]
    pub model: String,
    /// The prompt or prompts.
    pub prompt: Prompt,
    /// Most tokens to generate per choice (OpenAI's default is 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Put the prompt in front of the generated text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Text after the insertion point (fill-in-the-middle); not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// Log probabilities of the top tokens; not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Generate this many and return the best `n`; only `best_of == n` is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of: Option<u32>,
    /// The shape of the answer (`json_object`, `json_schema`), as llama-server
    /// takes it on completions too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<crate::chat::ResponseFormat>,
    /// Sampling and streaming settings.
    #[serde(flatten)]
    pub sampling: Sampling,
}

impl CompletionRequest {
    /// A request with defaults for everything but the model and the prompt.
    pub fn new(model: impl Into<String>, prompt: Prompt) -> Self {
        Self {
            model: model.into(),
            prompt,
            max_tokens: None,
            echo: None,
            suffix: None,
            logprobs: None,
            best_of: None,
            response_format: None,
            sampling: Sampling::default(),
        }
    }
}

/// One choice of a text completion, streamed or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// The generated text (or, streamed, the new part of it).
    pub text: String,
    /// Its place among the choices: prompt-major, then sample.
    pub index: u32,
    /// Log probabilities, when asked for.
    #[serde(default)]
    pub logprobs: Option<crate::CompletionLogprobs>,
    /// Why generation stopped; null until the last chunk of a stream.
    pub finish_reason: Option<FinishReason>,
    /// The stop string that ended it, where one did (see [`crate::StopReason`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<crate::StopReason>,
}

/// The answer to a text completion, and also each chunk of a streamed one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// `cmpl-...`, unique.
    pub id: String,
    /// Always `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// An identifier of the server's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// The choices.
    pub choices: Vec<CompletionChoice>,
    /// Token counts; in a stream only in the final usage chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama-server's `timings` (an extension): with the answer, and in a
    /// stream with each choice's last chunk and the usage chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<crate::native::Timings>,
}

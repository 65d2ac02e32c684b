//! Pieces shared by the chat, completion and embedding requests and responses.

use serde::{Deserialize, Serialize};

/// One stop sequence or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop string.
    One(String),
    /// Up to four stop strings.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

/// `stream_options` of a streamed request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send one last chunk, with no choices, that carries the usage of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
}

/// Why a choice stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` or the end of the context.
    Length,
    /// The model called a tool.
    ToolCalls,
    /// Output was withheld by a content filter.
    ContentFilter,
}

/// What ended a choice beyond its finish reason: vLLM's `stop_reason`
/// extension, which the OpenAI SDKs keep as an extra field. slotgate sends the
/// stop string that ended the choice (so that the Messages API can report its
/// `stop_sequence`); vLLM also sends the id of a stop token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopReason {
    /// The stop string found in the text.
    Text(String),
    /// A stop token's id (vLLM's `stop_token_ids`).
    Token(i64),
}

/// Token counts of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt (all prompts, for several).
    pub prompt_tokens: u32,
    /// Tokens generated (all choices together).
    #[serde(default)]
    pub completion_tokens: u32,
    /// The sum of the two.
    pub total_tokens: u32,
    /// Details of the prompt tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    /// Usage from prompt and generated counts, with the number of prompt tokens
    /// served from the prompt cache.
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }),
        }
    }
}

/// How many prompt tokens were reused from the cache.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens that were already in the slot's KV cache and not decoded again.
    #[serde(default)]
    pub cached_tokens: u32,
}

/// Sampling settings shared by chat and text completions. Each is optional; the
/// server's defaults apply to those left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Randomness, 0 to 2; 0 is greedy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Keep only the k most likely tokens (llama.cpp extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    /// Minimum probability relative to the best token (llama.cpp extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// How many choices to generate for each prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Stream the answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Options of a streamed answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Up to four strings that end generation; they are not part of the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Seed of the sampler: the same seed gives the same output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Penalty for tokens already present, -2 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// Penalty growing with a token's count so far, -2 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Bias added to the logits of token ids (keys are token ids as strings),
    /// -100 to 100; llama-server's forms are read too, and taken on its
    /// `/completion` only (see [`crate::logit_bias`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<crate::logit_bias::LogitBias>,
    /// An end-user id, passed through for logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// OpenAI's key for prompt-cache hits: requests that share it are routed alike
    /// by the gateway (see its `cache_aware` policy). Engines ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
    /// Reuse the slot's cached prompt prefix (llama.cpp extension, default true).
    /// Logits are not bit-identical across batch shapes, so a seeded request is
    /// reproducible token for token only with the cache off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_prompt: Option<bool>,
    /// Requests reuse each other's cached prompt prefixes only when they carry
    /// the same salt (vLLM's extension): a tenant's salt keeps its prompts from
    /// being probed through `cached_tokens` by another. The gateway sets it for
    /// keys with `cache_isolation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    /// A GBNF grammar the output must match (llama.cpp extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// A JSON schema the output must match (llama.cpp extension; OpenAI's way is
    /// `response_format`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<serde_json::Value>,
    /// llama.cpp's name for log probabilities: this many alternatives per token
    /// (`logprobs` wins when both are sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_probs: Option<u32>,
    /// Never end at the model's end-of-generation tokens: generate until a
    /// stop string or the token limit (llama-server's and vLLM's extension,
    /// which benchmarks send to fix answer lengths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// llama-server's `verbose`: the answer carries `__verbose`, itself in
    /// `/completion`'s shape with the prompt as rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbose: Option<bool>,
    /// llama-server's `return_progress`: a stream reports how far its prompt has
    /// been read (`prompt_progress`), before its first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_progress: Option<bool>,
    /// llama-server's `post_sampling_probs`: log probabilities (on
    /// `/completion`, probabilities) of the distribution a token was drawn
    /// from, after top-k, top-p, min-p and temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_sampling_probs: Option<bool>,
    /// llama-server's `timings_per_token`: each streamed chunk with text
    /// carries the `timings` so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings_per_token: Option<bool>,
    /// slotgate's own: go on with a stream that another engine began
    /// ([`crate::resume`]). The gateway sends it; clients have no use for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slotgate_resume: Option<crate::resume::Resume>,
}

impl Sampling {
    /// Whether the answer is streamed.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a streamed answer ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }

    /// The number of choices per prompt.
    pub fn n(&self) -> u32 {
        self.n.unwrap_or(1)
    }

    /// The stop strings, empty when none.
    pub fn stop_strings(&self) -> Vec<String> {
        self.stop.as_ref().map(Stop::to_vec).unwrap_or_default()
    }

    /// `logit_bias` as (token id, bias) pairs: those that name ids.
    pub fn logit_bias_pairs(&self) -> Vec<(i32, f32)> {
        self.logit_bias.as_ref().map(|b| b.resolve().0).unwrap_or_default()
    }
}

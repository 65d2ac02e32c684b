//! Log probabilities of generated tokens, in OpenAI's two shapes: chat's list of
//! tokens with their alternatives, and text completions' parallel arrays.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Most alternatives per token on chat (`top_logprobs`), as OpenAI allows.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// Most alternatives per token on text completions (`logprobs`), as OpenAI allows.
pub const MAX_COMPLETION_LOGPROBS: u32 = 5;

/// One alternative for a token's place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text (invalid UTF-8 replaced; `bytes` has it exactly).
    pub token: String,
    /// Natural log of its probability.
    pub logprob: f32,
    /// The token's bytes.
    pub bytes: Option<Vec<u8>>,
    /// The token's id, for llama-server's answers, which name it; not part
    /// of OpenAI's.
    #[serde(skip)]
    pub id: Option<i32>,
}

/// One generated token: its log probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's text (invalid UTF-8 replaced; `bytes` has it exactly).
    pub token: String,
    /// Natural log of its probability.
    pub logprob: f32,
    /// The token's bytes.
    pub bytes: Option<Vec<u8>>,
    /// The most likely tokens at this place, most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat choice's `logprobs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChoiceLogprobs {
    /// One entry per generated token.
    pub content: Option<Vec<TokenLogprob>>,
    /// Refusal tokens; this server never refuses, so always null.
    #[serde(default)]
    pub refusal: Option<Vec<TokenLogprob>>,
}

impl ChoiceLogprobs {
    /// The logprobs of `tokens`.
    pub fn new(tokens: Vec<TokenLogprob>) -> Self {
        Self { content: Some(tokens), refusal: None }
    }
}

/// A text completion choice's `logprobs`: parallel arrays, one place per token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log probability.
    pub token_logprobs: Vec<f32>,
    /// Each place's alternatives, token text to log probability.
    pub top_logprobs: Vec<Map<String, Value>>,
    /// Where each token starts in the choice's text, in characters.
    pub text_offset: Vec<u32>,
}

impl CompletionLogprobs {
    /// The arrays of `tokens`, whose text starts at character `offset` of the choice.
    pub fn new(tokens: &[TokenLogprob], mut offset: u32) -> Self {
        let mut out = Self::default();
        for t in tokens {
            out.tokens.push(t.token.clone());
            out.token_logprobs.push(t.logprob);
            out.top_logprobs.push(
                t.top_logprobs.iter().map(|a| (a.token.clone(), shortest(a.logprob))).collect(),
            );
            out.text_offset.push(offset);
            offset += t.token.chars().count() as u32;
        }
        out
    }
}

/// `x` as the JSON number with the fewest digits that reads back as the same
/// `f32` (widening to `f64` first would print float noise: -0.9322662353515625).
fn shortest(x: f32) -> Value {
    x.to_string().parse::<f64>().map_or(Value::Null, Value::from)
}

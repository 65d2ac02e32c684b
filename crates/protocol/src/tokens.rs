//! llama-server's `/tokenize`, `/detokenize` and `/apply-template` bodies, which
//! tools written for it (token counters, prompt builders, UIs) send as they are.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /tokenize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizeRequest {
    /// The model whose vocabulary is used; may be left out when one model serves.
    #[serde(default)]
    pub model: Option<String>,
    /// The text to tokenize.
    pub content: String,
    /// Add the model's special tokens (BOS), as a prompt gets them; llama-server's
    /// default is not to.
    #[serde(default)]
    pub add_special: bool,
    /// Read special tokens written in the text (`<start_of_turn>`) as those tokens.
    #[serde(default = "yes")]
    pub parse_special: bool,
    /// Answer each token with its text piece.
    #[serde(default)]
    pub with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// One token of a `/tokenize` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenOut {
    /// The id alone.
    Id(i32),
    /// The id and its piece: a string when the piece is valid UTF-8, else its bytes
    /// (a token may hold part of a character).
    Piece {
        /// The token id.
        id: i32,
        /// Its text, or its bytes.
        piece: Value,
    },
}

impl TokenOut {
    /// Token `id` with the `bytes` of its piece, as llama-server writes them.
    pub fn piece(id: i32, bytes: Vec<u8>) -> Self {
        let piece = match String::from_utf8(bytes) {
            Ok(text) => Value::String(text),
            Err(e) => Value::Array(e.into_bytes().into_iter().map(Value::from).collect()),
        };
        Self::Piece { id, piece }
    }
}

/// The answer to `POST /tokenize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// The tokens, in order.
    pub tokens: Vec<TokenOut>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeRequest {
    /// The model whose vocabulary is used; may be left out when one model serves.
    #[serde(default)]
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<i64>,
}

/// The answer to `POST /detokenize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The tokens' text, special tokens written out.
    pub content: String,
}

/// The answer to `POST /apply-template`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplyTemplateResponse {
    /// The rendered prompt, ending with the opening of the assistant's turn.
    pub prompt: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_shapes_are_llama_servers() {
        let r: TokenizeRequest = serde_json::from_str(r#"{"content":"hi"}"#).unwrap();
        assert!(!r.add_special && r.parse_special && !r.with_pieces && r.model.is_none());
        let out = TokenizeResponse {
            tokens: vec![
                TokenOut::Id(7),
                TokenOut::piece(8, b"a".to_vec()),
                TokenOut::piece(9, vec![0xe2, 0x82]),
            ],
        };
        assert_eq!(
            serde_json::to_value(&out).unwrap(),
            serde_json::json!({"tokens": [7, {"id": 8, "piece": "a"}, {"id": 9, "piece": [226, 130]}]})
        );
    }
}

//! `POST /v1/embeddings`: the request and its answer.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// What to embed: text or token ids, one or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One input as token ids.
    Tokens(Vec<u32>),
    /// Several inputs as token ids.
    TokenArrays(Vec<Vec<u32>>),
}

/// How the vectors are written in the answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    /// A JSON array of numbers.
    #[default]
    Float,
    /// Little-endian f32s, base64-encoded.
    Base64,
}

/// The body of `POST /v1/embeddings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingRequest {
    /// The model to use; left out (empty), the only one served.
    #[serde(default)]
    pub model: String,
    /// What to embed.
    pub input: EmbeddingInput,
    /// How vectors are written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<EncodingFormat>,
    /// Truncate vectors to this many dimensions; not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    /// An end-user id, passed through for logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// One vector, as floats or as base64.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// A JSON array of numbers.
    Float(Vec<f32>),
    /// Little-endian f32s, base64-encoded.
    Base64(String),
}

impl EmbeddingVector {
    /// Writes a vector in the requested format.
    pub fn encode(values: Vec<f32>, format: EncodingFormat) -> Self {
        match format {
            EncodingFormat::Float => Self::Float(values),
            EncodingFormat::Base64 => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                Self::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        }
    }

    /// The floats, decoding base64 if needed; `None` if the base64 is malformed.
    pub fn to_floats(&self) -> Option<Vec<f32>> {
        match self {
            Self::Float(v) => Some(v.clone()),
            Self::Base64(s) => {
                let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
                if bytes.len() % 4 != 0 {
                    return None;
                }
                Some(
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                )
            }
        }
    }
}

/// One embedding in the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Embedding {
    /// Always `embedding`.
    pub object: String,
    /// The vector.
    pub embedding: EmbeddingVector,
    /// The input it belongs to.
    pub index: u32,
}

/// Token counts of an embedding request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingUsage {
    /// Tokens in all inputs.
    pub prompt_tokens: u32,
    /// The same number.
    pub total_tokens: u32,
}

/// The answer to `POST /v1/embeddings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingResponse {
    /// Always `list`.
    pub object: String,
    /// One embedding per input, in input order.
    pub data: Vec<Embedding>,
    /// The model that answered.
    pub model: String,
    /// Token counts.
    pub usage: EmbeddingUsage,
}

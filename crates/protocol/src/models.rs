//! `GET /v1/models`.

use serde::{Deserialize, Serialize};

/// One model a server serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    /// The name clients send as `model`.
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// Unix seconds when it was loaded.
    #[serde(default)]
    pub created: u64,
    /// Who serves it.
    #[serde(default)]
    pub owned_by: String,
    /// Other names it answers to (llama-server's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aliases: Option<Vec<String>>,
    /// Labels (llama-server's field; none here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// What the model is (llama-server's field: `n_vocab`, `n_ctx_train`, `n_params`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Value>,
}

impl Model {
    /// A model entry.
    pub fn new(id: impl Into<String>, created: u64, owned_by: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            object: "model".into(),
            created,
            owned_by: owned_by.into(),
            aliases: None,
            tags: None,
            meta: None,
        }
    }
}

/// The answer to `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    /// The models.
    pub data: Vec<Model>,
}

impl ModelList {
    /// A list of models.
    pub fn new(data: Vec<Model>) -> Self {
        Self { object: "list".into(), data }
    }
}

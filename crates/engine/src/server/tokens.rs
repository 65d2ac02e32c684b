//! `/tokenize`, `/detokenize`, `/apply-template` and
//! `/v1/chat/completions/input_tokens` in llama-server's shapes, so that tools
//! written for it (token counters, prompt builders, UIs) work against this
//! engine.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use slotgate_protocol::{
    ApiError, ApplyTemplateResponse, ChatCompletionRequest, DetokenizeRequest, DetokenizeResponse,
    TokenizeRequest, TokenizeResponse,
};

use super::body::JsonBody;
use super::AppState;
use crate::error::EngineError;
use crate::scheduler::{VocabAnswer, VocabOp};

/// `POST /tokenize`.
pub async fn tokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, EngineError> {
    let op = VocabOp::Tokenize {
        content: req.content,
        add_special: req.add_special,
        parse_special: req.parse_special,
        with_pieces: req.with_pieces,
    };
    match state.scheduler.vocab(req.model, op).await? {
        VocabAnswer::Tokens(tokens) => Ok(Json(TokenizeResponse { tokens })),
        VocabAnswer::Text(_) => Err(ApiError::internal().into()),
    }
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, EngineError> {
    match state.scheduler.vocab(req.model, VocabOp::Detokenize(req.tokens)).await? {
        VocabAnswer::Text(content) => Ok(Json(DetokenizeResponse { content })),
        VocabAnswer::Tokens(_) => Err(ApiError::internal().into()),
    }
}

/// `POST /apply-template`: the prompt a chat request renders to (its tools and
/// how it ends included), as llama-server answers it.
pub async fn apply_template(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Json<ApplyTemplateResponse>, EngineError> {
    let prompt = super::chat_job::rendered(&state, req).await?;
    Ok(Json(ApplyTemplateResponse { prompt }))
}

/// `POST /v1/chat/completions/input_tokens`: the tokens of the prompt a chat
/// request would be rendered to, tools included, as llama-server counts them.
pub async fn chat_input_tokens(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Json<Value>, EngineError> {
    let tokens = super::chat_job::prompt_tokens(&state, req).await?;
    Ok(Json(json!({"input_tokens": tokens})))
}

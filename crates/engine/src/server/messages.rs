//! Anthropic's Messages API: `POST /v1/messages` served as the chat it
//! translates to (`slotgate_protocol::anthropic`), through the same scheduler,
//! and `POST /v1/messages/count_tokens` counted by the prompt that chat would
//! render. Every error on these routes is in Anthropic's envelope
//! ([`slotgate_http::anthropic_errors`]).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use slotgate_protocol::anthropic::request::FIELD_NAMES;
use slotgate_protocol::anthropic::stream::Translator;
use slotgate_protocol::anthropic::{CountTokensRequest, Message, MessagesRequest, TokensCount};
use slotgate_protocol::{ApiError, ChatCompletionChunk, ErrorEnvelope};

use super::body::JsonBody;
use super::generate::PromptTokens;
use super::restream::{restream, whole, Piece};
use super::AppState;
use crate::error::EngineError;

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<MessagesRequest>,
) -> Result<Response, EngineError> {
    let chat = req.to_chat()?;
    let streamed = chat.sampling.is_stream();
    let answer =
        super::chat::respond(&state, &headers, chat).await.map_err(|e| e.renamed(FIELD_NAMES))?;
    if streamed {
        return Ok(translate_stream(answer));
    }
    let chat = whole(answer).await?;
    Ok(Json(Message::from_chat(&chat)).into_response())
}

/// A streamed chat answer's chunks as Messages events, one chunk at a time;
/// `message_start` counts the prompt's tokens, as Anthropic's does.
fn translate_stream(answer: Response) -> Response {
    let prompt = answer.extensions().get::<PromptTokens>().map_or(0, |p| p.0);
    let mut translator = Translator::with_input_tokens(prompt);
    restream(answer, String::new(), move |piece| match piece {
        Piece::Data(data) => translate_event(&mut translator, data),
        Piece::Broken => translator.error(&ApiError::internal()),
        Piece::End => translator.finish(),
    })
}

/// One chat event as Messages events: a chunk, the end, or an error.
fn translate_event(translator: &mut Translator, data: &str) -> String {
    if data == "[DONE]" {
        return translator.finish();
    }
    if let Ok(chunk) = serde_json::from_str::<ChatCompletionChunk>(data) {
        return translator.chunk(&chunk);
    }
    match serde_json::from_str::<ErrorEnvelope>(data) {
        Ok(envelope) => translator.error(&envelope.error),
        Err(_) => String::new(),
    }
}

/// `POST /v1/messages/count_tokens`: the tokens of the prompt the request
/// would be rendered to, tools included.
pub async fn count_tokens(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CountTokensRequest>,
) -> Result<Json<TokensCount>, EngineError> {
    let chat = req.as_messages().to_chat()?;
    let input_tokens =
        super::chat_job::prompt_tokens(&state, chat).await.map_err(|e| e.renamed(FIELD_NAMES))?;
    Ok(Json(TokensCount { input_tokens }))
}

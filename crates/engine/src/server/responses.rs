//! OpenAI's Responses API: `POST /v1/responses` served as the chat it
//! translates to (`slotgate_protocol::responses`), through the same scheduler;
//! stored responses (`GET` and `DELETE /v1/responses/{id}`, and the
//! conversations `previous_response_id` continues, in [`super::stored`]); and
//! `POST /v1/responses/input_tokens`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use slotgate_protocol::responses::output::{Echo, Outcome};
use slotgate_protocol::responses::stream::Translator;
use slotgate_protocol::responses::{ResponsesRequest, FIELD_NAMES};
use slotgate_protocol::{ApiError, ChatCompletionChunk, ChatMessage, ErrorEnvelope, ErrorType};

use super::body::JsonBody;
use super::generate::{now, resolve_model};
use super::restream::{restream, whole, Piece};
use super::stored::{Store, Stored};
use super::AppState;
use crate::error::EngineError;

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, EngineError> {
    let owner = owner(&headers);
    let previous = match &req.previous_response_id {
        Some(id) => state.responses.get(id, &owner).ok_or_else(|| previous_not_found(id))?,
        None => Arc::new(Stored { response: Value::Null, conversation: Vec::new(), owner: None }),
    };
    let conversation = req.conversation(&previous.conversation)?;
    let mut chat = req.to_chat(conversation.clone())?;
    let served = resolve_model(&state, &mut chat.model)?;
    // This engine's instance (see `/health`), for a gateway to route follow-ups
    // by, then random bits: a stored response is read by whoever holds its id
    // (and, through a gateway, its key).
    let id = format!("resp_{:016x}{:032x}", crate::ids::nonce(), rand::random::<u128>());
    let echo = Echo::of(&req, id.clone(), now(), served.id.clone());
    let streamed = chat.sampling.is_stream();
    let answer = super::chat::respond_by(&state, &headers, chat, served)
        .await
        .map_err(|e| e.renamed(FIELD_NAMES))?;
    let store = req.stores().then(|| (state.responses.clone(), id, conversation, owner));
    if streamed {
        return Ok(translate_stream(answer, echo, store));
    }
    let chat = whole(answer).await?;
    let outcome = Outcome::of_chat(&chat);
    let response = echo.response(Some(&outcome));
    keep(store, &response, &outcome);
    Ok(Json(response).into_response())
}

/// Where a response is kept, if it is: the store, its id, its conversation,
/// its owner.
type Keep = Option<(Arc<Store>, String, Vec<ChatMessage>, Option<String>)>;

/// Stores `response` with its conversation and `outcome`'s turn, if asked.
fn keep(store: Keep, response: &Value, outcome: &Outcome) {
    if let Some((store, id, mut conversation, owner)) = store {
        conversation.push(outcome.as_message());
        store.put(id, Stored { response: response.clone(), conversation, owner });
    }
}

/// Whose a stored response is: the key a gateway says sent the request
/// (`x-slotgate-owner`); only requests of that owner find it again.
fn owner(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers.get(slotgate_protocol::OWNER_HEADER)?.to_str().ok()?;
    (!value.is_empty() && value.len() <= 128).then(|| value.to_owned())
}

/// A streamed chat answer as Responses events; the whole response is stored
/// when it ends.
fn translate_stream(answer: Response, echo: Echo, store: Keep) -> Response {
    let mut translator = Translator::new(echo);
    let first = translator.start();
    let mut store = store;
    restream(answer, first, move |piece| match piece {
        Piece::Data("[DONE]") | Piece::End => {
            let (events, response) = translator.finish();
            if let Some(response) = response {
                keep(store.take(), &response, translator.outcome());
            }
            events
        }
        Piece::Data(data) => {
            if let Ok(chunk) = serde_json::from_str::<ChatCompletionChunk>(data) {
                return translator.chunk(&chunk);
            }
            match serde_json::from_str::<ErrorEnvelope>(data) {
                Ok(envelope) => translator.error(&envelope.error),
                Err(_) => String::new(),
            }
        }
        Piece::Broken => translator.error(&ApiError::internal()),
    })
}

/// `GET /v1/responses/{id}`.
pub async fn get(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, EngineError> {
    let stored = state.responses.get(&id, &owner(&headers)).ok_or_else(|| not_found(&id))?;
    Ok(Json(stored.response.clone()))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, EngineError> {
    if !state.responses.delete(&id, &owner(&headers)) {
        return Err(not_found(&id).into());
    }
    Ok(Json(json!({"id": id, "object": "response.deleted", "deleted": true})))
}

/// `POST /v1/responses/input_tokens`: the tokens of the prompt the request
/// would be rendered to, its previous response's conversation and tools included.
pub async fn input_tokens(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Json<Value>, EngineError> {
    let owner = owner(&headers);
    let previous = match &req.previous_response_id {
        Some(id) => state
            .responses
            .get(id, &owner)
            .ok_or_else(|| previous_not_found(id))?
            .conversation
            .clone(),
        None => Vec::new(),
    };
    let chat = req.to_chat(req.conversation(&previous)?)?;
    let tokens =
        super::chat_job::prompt_tokens(&state, chat).await.map_err(|e| e.renamed(FIELD_NAMES))?;
    Ok(Json(json!({"object": "response.input_tokens", "input_tokens": tokens})))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorType::NotFoundError, format!("no stored response `{id}`"))
        .with_code("response_not_found")
}

fn previous_not_found(id: &str) -> ApiError {
    ApiError::new(
        ErrorType::NotFoundError,
        format!("previous response `{id}` is not stored here (never stored, expired, or deleted)"),
    )
    .with_param("previous_response_id")
    .with_code("previous_response_not_found")
}

//! Anthropic's Messages API: `POST /v1/messages` served as the chat it
//! translates to (`slotgate_protocol::anthropic`), through the same scheduler,
//! and `POST /v1/messages/count_tokens` counted by the prompt that chat would
//! render. Every error on these routes is in Anthropic's envelope
//! ([`slotgate_http::anthropic_errors`]).

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use slotgate_protocol::anthropic::stream::Translator;
use slotgate_protocol::anthropic::{CountTokensRequest, Message, MessagesRequest, TokensCount};
use slotgate_protocol::{ApiError, ChatCompletion, ChatCompletionChunk, ErrorEnvelope, SseDecoder};

use super::body::JsonBody;
use super::generate::resolve_model;
use super::AppState;
use crate::error::EngineError;
use crate::scheduler::GenParams;
use crate::tools::ToolPlan;

/// A chat answer larger than this is not read back for translation.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<MessagesRequest>,
) -> Result<Response, EngineError> {
    let chat = req.to_chat()?;
    let streamed = chat.sampling.is_stream();
    let answer = super::chat::respond(&state, &headers, chat).await?;
    if streamed {
        return Ok(translate_stream(answer));
    }
    let bytes = axum::body::to_bytes(answer.into_body(), MAX_ANSWER_BYTES);
    let bytes = bytes.await.map_err(|_| ApiError::internal())?;
    let chat: ChatCompletion = serde_json::from_slice(&bytes).map_err(|_| ApiError::internal())?;
    Ok(Json(Message::from_chat(&chat)).into_response())
}

/// A streamed chat answer's chunks as Messages events, one chunk at a time.
fn translate_stream(answer: Response) -> Response {
    let mut decoder = SseDecoder::new();
    let mut translator = Translator::default();
    let chunks = answer.into_body().into_data_stream();
    let events = chunks.map(Some).chain(futures::stream::once(async { None })).map(move |piece| {
        let mut out = String::new();
        match piece {
            Some(Ok(bytes)) => {
                for event in decoder.push(&bytes) {
                    out.push_str(&translate_event(&mut translator, &event.data));
                }
            }
            Some(Err(_)) => out.push_str(&translator.error(&ApiError::internal())),
            None => out.push_str(&translator.finish()),
        }
        Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(out))
    });
    let mut response = Body::from_stream(events).into_response();
    slotgate_http::event_stream(&mut response);
    response
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
    let mut chat = req.as_messages().to_chat()?;
    let served = resolve_model(&state, &mut chat.model)?;
    chat.validate()?;
    let mut plan = ToolPlan::read(&chat)?;
    let mut params = GenParams::from_sampling(&chat.sampling, chat.max_tokens());
    let messages = std::mem::take(&mut chat.messages);
    let native = served.info.tool_format;
    let input = super::chat::with_tools(plan.as_mut(), native, &mut params, messages)?;
    let reader = served.reader.clone();
    let read = state.scheduler.off_loop(move || reader.read(&input, &params)).await??;
    let input_tokens = read.prompts.first().map_or(0, |(tokens, _)| tokens.len() as u32);
    Ok(Json(TokensCount { input_tokens }))
}

//! A chat answer read back for another API (Anthropic's Messages, OpenAI's
//! Responses): whole ([`whole`]), or streamed, its server-sent events decoded
//! as they come and each handed to a translator, whose output is streamed
//! instead ([`restream`]).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use slotgate_protocol::{ApiError, ChatCompletion, SseDecoder};

/// A chat answer larger than this is not read back.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// The whole chat answer of `answer`, a 200 from the chat handler.
pub async fn whole(answer: Response) -> Result<ChatCompletion, ApiError> {
    let bytes = axum::body::to_bytes(answer.into_body(), MAX_ANSWER_BYTES).await;
    let bytes = bytes.map_err(|_| ApiError::internal())?;
    serde_json::from_slice(&bytes).map_err(|_| ApiError::internal())
}

/// What the translator is handed.
pub enum Piece<'a> {
    /// One chat event's data: a chunk, `[DONE]`, or `{"error": ...}`.
    Data(&'a str),
    /// The chat answer broke off.
    Broken,
    /// The chat answer ended.
    End,
}

/// `answer`'s events as `translate` writes them, after `first`.
pub fn restream(
    answer: Response,
    first: String,
    mut translate: impl FnMut(Piece<'_>) -> String + Send + 'static,
) -> Response {
    let mut decoder = SseDecoder::new();
    let pieces = answer.into_body().into_data_stream().map(Some);
    let translated = pieces.chain(futures::stream::once(async { None })).map(move |piece| {
        let out = match piece {
            Some(Ok(bytes)) => {
                let mut out = String::new();
                for event in decoder.push(&bytes) {
                    out.push_str(&translate(Piece::Data(&event.data)));
                }
                out
            }
            Some(Err(_)) => translate(Piece::Broken),
            None => translate(Piece::End),
        };
        Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(out))
    });
    let first = futures::stream::once(async move { Ok(axum::body::Bytes::from(first)) });
    let events = first.chain(translated);
    let mut response = Body::from_stream(events).into_response();
    slotgate_http::event_stream(&mut response);
    response
}

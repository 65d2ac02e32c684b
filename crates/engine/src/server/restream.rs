//! A streamed chat answer re-written as another API's events (Anthropic's
//! Messages, OpenAI's Responses): its server-sent events decoded as they come
//! and each handed to a translator, whose output is streamed instead.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use slotgate_protocol::SseDecoder;

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

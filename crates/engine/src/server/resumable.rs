//! Streams that outlive their connection (llama-server's `/v1/stream`): a
//! streamed answer requested with an `X-Conversation-Id` header is also kept,
//! byte for byte, under that id, and it runs to its end even when its client
//! goes away (a page reloaded, a laptop asleep). `GET /v1/stream?conv_id=ID&from=N`
//! sends it again from byte `N` and then follows it live; `DELETE` stops it and
//! forgets it.
//!
//! Bounded as an attacker would probe it: at most [`MAX_BYTES`] kept of each
//! (the oldest bytes go first; asking for them is a 400), at most
//! [`MAX_SESSIONS`] kept at once (the oldest is stopped and forgotten), ids of
//! at most [`MAX_ID_BYTES`], and a finished one is forgotten [`TTL`] after it
//! ended.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use slotgate_protocol::{ApiError, ErrorType};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::AppState;
use crate::error::api_response;

/// Bytes kept of one stream.
pub const MAX_BYTES: usize = 4 << 20;
/// Streams kept at once.
pub const MAX_SESSIONS: usize = 256;
/// Longest conversation id.
pub const MAX_ID_BYTES: usize = 256;
/// How long a finished stream is kept.
pub const TTL: Duration = Duration::from_secs(300);

/// The header that asks for a stream to be kept.
const CONVERSATION: &str = "x-conversation-id";

/// One kept stream.
struct Session {
    kept: Mutex<Kept>,
    /// The bytes written so far (kept or not), and whether it ended.
    progress: watch::Sender<(usize, bool)>,
    /// Stops the answer.
    stop: CancellationToken,
    started: Instant,
}

/// The bytes kept of a stream, and how many went before them.
#[derive(Default)]
struct Kept {
    bytes: VecDeque<u8>,
    dropped: usize,
    ended: Option<Instant>,
}

impl Session {
    fn new() -> Self {
        Self {
            kept: Mutex::default(),
            progress: watch::channel((0, false)).0,
            stop: CancellationToken::new(),
            started: Instant::now(),
        }
    }

    fn push(&self, chunk: &[u8]) {
        let end = {
            let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            kept.bytes.extend(chunk);
            let over = kept.bytes.len().saturating_sub(MAX_BYTES);
            kept.bytes.drain(..over);
            kept.dropped += over;
            kept.dropped + kept.bytes.len()
        };
        self.progress.send_replace((end, false));
    }

    fn end(&self) {
        let end = {
            let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            kept.ended = Some(Instant::now());
            kept.dropped + kept.bytes.len()
        };
        self.progress.send_replace((end, true));
    }

    /// The kept bytes from `from` on; `None` when they are no longer kept.
    fn read_from(&self, from: usize) -> Option<Bytes> {
        let kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let skip = from.checked_sub(kept.dropped)?;
        Some(kept.bytes.iter().skip(skip).copied().collect::<Vec<u8>>().into())
    }

    fn expired(&self) -> bool {
        let kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.ended.is_some_and(|t| t.elapsed() > TTL)
    }
}

/// Every kept stream, by conversation id.
#[derive(Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    /// Keeps a new stream under `id`, stopping any earlier one of that id, the
    /// expired ones, and the oldest when too many are kept.
    fn create(&self, id: &str) -> Arc<Session> {
        let session = Arc::new(Session::new());
        let mut by_id = self.by_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        by_id.retain(|_, s| !s.expired());
        if let Some(old) = by_id.insert(id.to_owned(), session.clone()) {
            old.stop.cancel();
        }
        while by_id.len() > MAX_SESSIONS {
            let oldest = by_id.iter().min_by_key(|(_, s)| s.started).map(|(k, _)| k.clone());
            if let Some(old) = oldest.and_then(|k| by_id.remove(&k)) {
                old.stop.cancel();
            }
        }
        session
    }

    fn get(&self, id: &str) -> Option<Arc<Session>> {
        let by_id = self.by_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        by_id.get(id).filter(|s| !s.expired()).cloned()
    }

    fn stop(&self, id: &str) {
        let removed =
            self.by_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(id);
        if let Some(session) = removed {
            session.stop.cancel();
        }
    }
}

/// Keeps a streamed answer whose request carries `X-Conversation-Id`: it is
/// read to its end here, whatever its client does, and sent on to the client
/// while it listens.
pub async fn keep(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let id = request.headers().get(CONVERSATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let response = next.run(request).await;
    let streamed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let Some(id) = id.filter(|id| streamed && !id.is_empty() && id.len() <= MAX_ID_BYTES) else {
        return response;
    };
    let session = state.streams.create(&id);
    let (parts, body) = response.into_parts();
    let (to_client, from_producer) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut body = body.into_data_stream();
        let mut client = Some(to_client);
        loop {
            let chunk = tokio::select! {
                () = session.stop.cancelled() => break,
                chunk = body.next() => chunk,
            };
            let Some(Ok(chunk)) = chunk else { break };
            session.push(&chunk);
            // A client that went away stops listening; the answer goes on.
            if let Some(tx) = &client {
                if tx.send(chunk).await.is_err() {
                    client = None;
                }
            }
        }
        session.end();
    });
    let stream = futures::stream::unfold(from_producer, |mut rx| async move {
        rx.recv().await.map(|chunk| (Ok::<_, std::convert::Infallible>(chunk), rx))
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Query of `/v1/stream`.
#[derive(Debug, Deserialize)]
pub struct StreamQuery {
    conv_id: Option<String>,
    from: Option<String>,
}

/// `GET /v1/stream?conv_id=ID&from=N`: the kept stream from byte `N` (0 when
/// left out), then live until it ends.
pub async fn replay(State(state): State<AppState>, Query(q): Query<StreamQuery>) -> Response {
    let id = match conv_id(&q) {
        Ok(id) => id,
        Err(err) => return api_response(err),
    };
    let Some(session) = state.streams.get(id) else {
        return api_response(ApiError::new(
            ErrorType::NotFoundError,
            "stream not found or expired",
        ));
    };
    let from = match q.from.as_deref().map(str::parse::<usize>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return api_response(ApiError::invalid("from", "`from` must be a byte offset"))
        }
    };
    if session.read_from(from).is_none() {
        let why = "the stream's bytes before `from` are no longer kept; start again";
        return api_response(ApiError::invalid("from", why));
    }
    let progress = session.progress.subscribe();
    let stream = futures::stream::unfold(
        (session, progress, from),
        |(session, mut progress, from)| async move {
            loop {
                let (end, ended) = *progress.borrow_and_update();
                if end > from {
                    let bytes = session.read_from(from)?;
                    let next = from + bytes.len();
                    return Some((
                        Ok::<_, std::convert::Infallible>(bytes),
                        (session, progress, next),
                    ));
                }
                if ended || progress.changed().await.is_err() {
                    return None;
                }
            }
        },
    );
    let mut response = Body::from_stream(stream).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

/// `DELETE /v1/stream?conv_id=ID`: stops the stream and forgets it; 204
/// whether or not there was one.
pub async fn stop(State(state): State<AppState>, Query(q): Query<StreamQuery>) -> Response {
    match conv_id(&q) {
        Ok(id) => {
            state.streams.stop(id);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) => api_response(err),
    }
}

fn conv_id(q: &StreamQuery) -> Result<&str, ApiError> {
    match q.conv_id.as_deref() {
        Some(id) if !id.is_empty() && id.len() <= MAX_ID_BYTES => Ok(id),
        _ => Err(ApiError::invalid(
            "conv_id",
            format!("`conv_id` must name a conversation, in at most {MAX_ID_BYTES} bytes"),
        )),
    }
}

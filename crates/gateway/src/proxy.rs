//! Forwarding one OpenAI request: claim a slot, send the body as received, and
//! retry on another backend while nothing has reached the client yet.
//!
//! Headers are held back until the backend's first byte, so a retry is invisible.
//! A non-streamed answer is read whole before it is sent, so a backend that dies
//! at any point of it is retried too. Once a stream has started it is never
//! retried; if the backend dies mid-stream the client gets a final SSE error event.

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::Value;
use slotgate_protocol::{sse, ApiError, ErrorType};

use crate::error::api_response;
use crate::metrics as m;
use crate::pool::Claim;
use crate::server::AppState;

/// The header that names a request across the gateway, the backend and the logs.
pub const REQUEST_ID: &str = "x-request-id";

/// Why an attempt is retried, as the `reason` label of the retry counter.
#[derive(Debug, Clone, Copy)]
enum Retry {
    /// The backend said its slots and queue are full, or it is loading.
    SlotUnavailable,
    /// The connection was refused: the backend is down.
    Connect,
    /// The request failed before any byte of an answer came back.
    BeforeFirstByte,
    /// A non-streamed answer broke off before its end.
    BrokenBody,
}

impl Retry {
    fn label(self) -> &'static str {
        match self {
            Self::SlotUnavailable => "slot_unavailable",
            Self::Connect => "connect",
            Self::BeforeFirstByte => "before_first_byte",
            Self::BrokenBody => "broken_body",
        }
    }
}

/// What the gateway reads of a request body; the rest is forwarded untouched.
#[derive(Debug)]
struct Peek {
    model: String,
    stream: bool,
    /// The affinity key for `cache_aware` routing.
    affinity: Option<u64>,
}

fn peek(body: &[u8], headers: &HeaderMap) -> Result<Peek, ApiError> {
    let value: Value = slotgate_protocol::parse_json(body)?;
    let model = match value.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => return Err(ApiError::invalid("model", "model must be a non-empty string")),
        None => return Err(ApiError::invalid("model", "missing field `model`")),
    };
    let affinity = crate::affinity::key(&model, &value, headers);
    let stream = value.get("stream").and_then(Value::as_bool).unwrap_or(false);
    Ok(Peek { model, stream, affinity })
}

/// Whether a 503 (or 429) body says "full or loading, try elsewhere", in any of
/// the forms slotgate engines and llama.cpp's server use.
fn is_retryable_refusal(status: StatusCode, body: &[u8]) -> bool {
    if status != StatusCode::SERVICE_UNAVAILABLE && status != StatusCode::TOO_MANY_REQUESTS {
        return false;
    }
    if let Ok(envelope) = serde_json::from_slice::<slotgate_protocol::ErrorEnvelope>(body) {
        if envelope.error.code.as_deref() == Some(slotgate_protocol::SLOT_UNAVAILABLE)
            || envelope.error.kind == ErrorType::UnavailableError
        {
            return true;
        }
    }
    let text = String::from_utf8_lossy(body).to_lowercase();
    ["slot unavailable", "slot_unavailable", "loading model", "no slot available"]
        .iter()
        .any(|s| text.contains(s))
}

/// Forwards `body` to `path` of a backend serving its model.
pub async fn forward(
    state: AppState,
    path: &'static str,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let request_id = headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map_or_else(crate::ids::request_id, str::to_owned);
    let mut response = forward_inner(&state, path, &headers, body, &request_id, started).await;
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

async fn forward_inner(
    state: &AppState,
    path: &'static str,
    headers: &HeaderMap,
    body: Bytes,
    request_id: &str,
    started: Instant,
) -> Response {
    let peek = match peek(&body, headers) {
        Ok(p) => p,
        Err(err) => return api_response(err),
    };
    let model = peek.model.as_str();
    if !state.pool.knows(model) {
        tracing::info!(request_id, model, "unknown model");
        return api_response(ApiError::model_not_found(model));
    }
    state.budget.deposit();
    let routing = &state.config.routing;
    let mut exclude: Vec<usize> = Vec::new();
    let mut failures = 0;
    let mut last = None;
    for attempt in 0..routing.max_attempts {
        if attempt > 0 {
            if !state.budget.withdraw() {
                tracing::warn!(request_id, model, "retry budget exhausted");
                break;
            }
            tokio::time::sleep(Duration::from_millis(routing.retry_backoff_ms)).await;
        }
        if !state.pool.has_other(model, &exclude) {
            // Nowhere else to go: the same backend again, on a fresh attempt.
            exclude.clear();
        }
        let claim = match state.pool.acquire(model, &exclude, peek.affinity).await {
            Ok(claim) => claim,
            Err(err) => {
                count(model, "none", err.status());
                return api_response(err);
            }
        };
        let backend = claim.backend.clone();
        let url = format!("{}{}", backend.url(), path);
        tracing::debug!(request_id, model, backend = %backend.url(), attempt, "forwarding");
        let mut request = state
            .client
            .post(&url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(REQUEST_ID, request_id)
            .body(body.clone());
        if let Some(auth) = headers.get(header::AUTHORIZATION) {
            request = request.header(header::AUTHORIZATION, auth);
        }
        let retry = match request.send().await {
            Err(err) => {
                if err.is_connect() {
                    if backend.eject() {
                        tracing::warn!(backend = %backend.url(), "ejected: connection refused");
                    }
                    exclude.push(backend.index);
                    Retry::Connect
                } else {
                    // Often a pooled connection the backend had closed: a fresh one
                    // may well work, on this backend or another.
                    if failures > 0 {
                        exclude.push(backend.index);
                    }
                    Retry::BeforeFirstByte
                }
            }
            Ok(upstream) => {
                let status = upstream.status();
                if status == StatusCode::SERVICE_UNAVAILABLE
                    || status == StatusCode::TOO_MANY_REQUESTS
                {
                    let bytes = upstream.bytes().await.unwrap_or_default();
                    if !is_retryable_refusal(status, &bytes) {
                        count(model, &backend.url(), status.as_u16());
                        return passthrough(status, &bytes);
                    }
                    backend.mark_full();
                    exclude.push(backend.index);
                    Retry::SlotUnavailable
                } else if peek.stream && status.is_success() {
                    match stream_response(upstream, claim, model, started).await {
                        Ok(response) => return response,
                        Err(()) => Retry::BeforeFirstByte,
                    }
                } else {
                    match upstream.bytes().await {
                        Ok(bytes) => {
                            metrics::histogram!(m::TTFT, "model" => model.to_owned())
                                .record(started.elapsed().as_secs_f64());
                            metrics::histogram!(m::DURATION, "model" => model.to_owned())
                                .record(started.elapsed().as_secs_f64());
                            count(model, &backend.url(), status.as_u16());
                            if status.is_success() {
                                count_reuse(&backend, &bytes);
                            }
                            drop(claim);
                            return passthrough(status, &bytes);
                        }
                        Err(_) => Retry::BrokenBody,
                    }
                }
            }
        };
        failures += 1;
        last = Some(retry);
        note_retry(retry, request_id, &backend.url());
    }
    let message = format!("no backend could answer after {failures} failed attempts; retry later");
    let err = match last {
        // Every backend said it was full: the client may retry, as with a full queue.
        Some(Retry::SlotUnavailable) => ApiError::slot_unavailable(message),
        _ => ApiError::new(ErrorType::UnavailableError, message),
    };
    count(model, "none", err.status());
    api_response(err)
}

fn note_retry(retry: Retry, request_id: &str, backend: &str) {
    metrics::counter!(m::RETRIES, "reason" => retry.label()).increment(1);
    tracing::info!(
        request_id,
        backend,
        reason = retry.label(),
        "attempt failed; retrying elsewhere"
    );
}

fn count(model: &str, backend: &str, status: u16) {
    metrics::counter!(m::REQUESTS, "model" => model.to_owned(), "backend" => backend.to_owned(), "status" => status.to_string())
        .increment(1);
}

/// Counts the prompt-cache reuse that `backend` reported in an answer or chunk.
fn count_reuse(backend: &crate::backend::Backend, bytes: &[u8]) {
    if let Some((prompt, cached)) = crate::usage::scan(bytes) {
        let url = backend.url();
        metrics::counter!(m::BACKEND_PROMPT_TOKENS, "backend" => url.to_string()).increment(prompt);
        metrics::counter!(m::BACKEND_CACHED_TOKENS, "backend" => url.to_string()).increment(cached);
    }
}

fn passthrough(status: StatusCode, bytes: &Bytes) -> Response {
    let mut response = (status, bytes.clone()).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(crate::error::RETRY_AFTER_SECS));
    }
    response
}

/// A stream being relayed to the client. The claim is held until the relay is
/// dropped: at the end of the stream or when the client goes away. Dropping the
/// upstream stream closes its connection, which tells the engine to free its slot.
struct Relay {
    chunks: futures::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    first: Option<Bytes>,
    claim: Claim,
    model: String,
    started: Instant,
    ended: bool,
}

/// Waits for the first chunk (a failure before it is retryable), then relays the
/// rest chunk by chunk, ending with an SSE error event if the backend dies.
async fn stream_response(
    upstream: reqwest::Response,
    claim: Claim,
    model: &str,
    started: Instant,
) -> Result<Response, ()> {
    let status = upstream.status();
    count(model, &claim.backend.url(), status.as_u16());
    let mut chunks = upstream.bytes_stream().boxed();
    let first = match chunks.next().await {
        Some(Ok(bytes)) => bytes,
        _ => return Err(()),
    };
    metrics::histogram!(m::TTFT, "model" => model.to_owned())
        .record(started.elapsed().as_secs_f64());
    let relay =
        Relay { chunks, first: Some(first), claim, model: model.to_owned(), started, ended: false };
    let body = futures::stream::unfold(relay, |mut r| async move {
        if r.ended {
            return None;
        }
        if let Some(first) = r.first.take() {
            return Some((Ok::<_, std::convert::Infallible>(first), r));
        }
        match r.chunks.next().await {
            Some(Ok(bytes)) => {
                // Only the last chunk of a stream that asked for usage carries it.
                count_reuse(&r.claim.backend, &bytes);
                Some((Ok(bytes), r))
            }
            Some(Err(err)) => {
                tracing::warn!(error = %err, model = %r.model, "backend failed mid-stream");
                r.ended = true;
                let err = ApiError::new(
                    ErrorType::ServerError,
                    "the backend failed while streaming; the answer is incomplete",
                );
                Some((Ok(Bytes::from(sse::encode(&err.into_envelope()))), r))
            }
            None => {
                metrics::histogram!(m::DURATION, "model" => r.model.clone())
                    .record(r.started.elapsed().as_secs_f64());
                None
            }
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_in_every_known_form_are_retryable() {
        let ours = br#"{"error":{"message":"full","type":"unavailable_error","param":null,"code":"slot_unavailable"}}"#;
        assert!(is_retryable_refusal(StatusCode::SERVICE_UNAVAILABLE, ours));
        let loading =
            br#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
        assert!(is_retryable_refusal(StatusCode::SERVICE_UNAVAILABLE, loading));
        assert!(is_retryable_refusal(StatusCode::SERVICE_UNAVAILABLE, b"slot unavailable"));
        assert!(!is_retryable_refusal(StatusCode::BAD_REQUEST, ours));
        assert!(!is_retryable_refusal(StatusCode::SERVICE_UNAVAILABLE, b"{\"error\":{\"message\":\"x\",\"type\":\"server_error\",\"param\":null,\"code\":null}}"));
    }

    #[test]
    fn peek_reads_model_and_stream_only() {
        let h = HeaderMap::new();
        let p = peek(br#"{"model":"m","stream":true,"extra":{"kept":1}}"#, &h).unwrap();
        assert_eq!((p.model.as_str(), p.stream, p.affinity), ("m", true, None));
        assert_eq!(peek(br#"{"stream":true}"#, &h).unwrap_err().param.as_deref(), Some("model"));
        assert_eq!(peek(b"{", &h).unwrap_err().status(), 400);
    }
}

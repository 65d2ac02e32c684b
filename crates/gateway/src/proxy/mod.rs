//! Forwarding one OpenAI request: claim a slot, send the body as received, and
//! retry on another backend while nothing has reached the client yet.
//!
//! Headers are held back until the backend's first byte, so a retry is invisible.
//! A non-streamed answer is read whole before it is sent, so a backend that dies
//! at any point of it is retried too. Once a stream has started it is never
//! retried; if the backend dies mid-stream the client gets a final SSE error event.

mod peek;
mod record;
mod relay;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;
use slotgate_protocol::{ApiError, ErrorType};

use crate::backend::Backend;
use crate::error::{api_response, RETRY_AFTER_SECS};
use crate::metrics as m;
use crate::pool::{Claim, Pool};
use crate::retry::{Failure, Next, Outcome, RetryPolicy};
use crate::upstream::{Lease, SendError, Upstream};
use record::Record;
use relay::Relay;

/// The header that names a request across the gateway, the backend and the logs.
pub const REQUEST_ID: &str = "x-request-id";

/// Forwards requests: the pool to claim slots from, the client to reach
/// backends with, and the retry policy.
pub struct Forwarder {
    pool: Arc<Pool>,
    upstream: Upstream,
    /// Shared by every worker thread: one budget for the whole gateway.
    retry: Arc<RetryPolicy>,
    /// Other names for served models, and the model each names.
    aliases: Arc<BTreeMap<String, String>>,
}

impl Forwarder {
    /// A forwarder over `pool`.
    pub fn new(
        pool: Arc<Pool>,
        upstream: Upstream,
        retry: Arc<RetryPolicy>,
        aliases: Arc<BTreeMap<String, String>>,
    ) -> Self {
        Self { pool, upstream, retry, aliases }
    }

    /// Other names for served models, and the model each names.
    pub fn aliases(&self) -> &BTreeMap<String, String> {
        &self.aliases
    }

    /// The backends and their queues.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Forwards `body` to `path` of a backend serving its model. Every answer,
    /// errors included, carries the request's id.
    pub async fn forward(&self, path: &'static str, headers: &HeaderMap, body: Bytes) -> Response {
        let started = Instant::now();
        let request_id = headers
            .get(REQUEST_ID)
            .filter(|v| !v.is_empty() && v.len() <= 128 && v.to_str().is_ok())
            .cloned()
            .unwrap_or_else(crate::ids::request_id);
        let mut response = match self.attempts(path, headers, body, &request_id, started).await {
            Ok(response) => response,
            Err(err) => api_response(err),
        };
        response.headers_mut().insert(REQUEST_ID, request_id);
        response
    }

    async fn attempts(
        &self,
        path: &'static str,
        headers: &HeaderMap,
        body: Bytes,
        request_id: &HeaderValue,
        started: Instant,
    ) -> Result<Response, ApiError> {
        let mut peek = peek::peek(&body, headers, self.pool.uses_affinity())?;
        let mut body = body;
        if let Some(target) = self.aliases.get(&peek.model) {
            // The backend knows the model by its own name: the body says that one.
            body = peek::rename_model(&body, target)?;
            peek.model.clone_from(target);
        }
        if peek.model.is_empty() {
            // Clients written for llama-server name no model: the only one, if
            // there is only one. The backend, serving just that one, does the same.
            peek.model = self.pool.only_model().ok_or_else(|| {
                ApiError::invalid("model", "several models are served here: name one in `model`")
            })?;
        }
        let model = peek.model.as_str();
        if !self.pool.knows(model) {
            tracing::info!(request_id = ?request_id, model, "unknown model");
            return Err(ApiError::model_not_found(model));
        }
        let mut record = Record::new(model, started);
        self.retry.arrived();
        let mut exclude: Vec<usize> = Vec::new();
        let mut failed = 0;
        let mut last = None;
        let mut made = 0;
        loop {
            if !self.pool.has_other(model, &exclude) {
                // Nowhere else to go: the same backend again, on a fresh attempt.
                exclude.clear();
            }
            let claim = match self.pool.acquire(model, &exclude, peek.affinity).await {
                Ok(claim) => claim,
                Err(err) => {
                    record.refused(err.status());
                    return Err(err);
                }
            };
            made += 1;
            let backend = claim.backend.clone();
            tracing::debug!(request_id = ?request_id, model, backend = %backend.url(), made, "forwarding");
            let result = self.attempt(claim, path, headers, &body, request_id, peek.stream).await;
            let outcome = match &result {
                Ok((status, _)) => Outcome::Answered(status.as_u16()),
                Err(failure) => Outcome::Failed(*failure),
            };
            let verdict = self.retry.judge(outcome, failed);
            if !verdict.retryable {
                if let Ok((status, answer)) = result {
                    return Ok(answer.into_response(&backend, status, record));
                }
                break;
            }
            if verdict.eject && backend.eject() {
                tracing::warn!(backend = %backend.url(), "ejected: connection refused");
            }
            if verdict.exclude {
                exclude.push(backend.index);
            }
            failed += 1;
            if let Outcome::Failed(failure) = outcome {
                last = Some(failure);
                metrics::counter!(m::RETRIES, "reason" => failure.label()).increment(1);
                tracing::info!(request_id = ?request_id, backend = %backend.url(), reason = failure.label(), "attempt failed");
            }
            match self.retry.next(&verdict, made) {
                Next::RetryAfter(pause) => tokio::time::sleep(pause).await,
                Next::GiveUp(why) => {
                    tracing::warn!(request_id = ?request_id, model, ?why, "no more attempts");
                    break;
                }
            }
        }
        let message =
            format!("no backend could answer after {failed} failed attempts; retry later");
        let err = match last {
            // Every backend said it was full: the client may retry, as with a full queue.
            Some(Failure::SlotUnavailable) => ApiError::slot_unavailable(message),
            _ => ApiError::new(ErrorType::UnavailableError, message),
        };
        record.refused(err.status());
        Err(err)
    }

    /// One attempt on the claimed backend: its status and answer, or what failed.
    async fn attempt(
        &self,
        claim: Claim,
        path: &'static str,
        headers: &HeaderMap,
        body: &Bytes,
        request_id: &HeaderValue,
        stream: bool,
    ) -> Result<(StatusCode, Answer), Failure> {
        let backend = &claim.backend;
        let mut extra: Vec<(HeaderName, HeaderValue)> =
            vec![(HeaderName::from_static(REQUEST_ID), request_id.clone())];
        if let Some(auth) = headers.get(header::AUTHORIZATION) {
            extra.push((header::AUTHORIZATION, auth.clone()));
        }
        let (upstream, lease) =
            self.upstream.post(&backend.url(), path, extra, body.clone()).await.map_err(|e| {
                tracing::debug!(error = %e, backend = %backend.url(), "no answer");
                match e {
                    SendError::Connect(_) => Failure::Connect,
                    SendError::Broken(_) | SendError::Uri(_) => Failure::BeforeFirstByte,
                }
            })?;
        let status = upstream.status();
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            let bytes = collect(upstream.into_body(), lease).await.unwrap_or_default();
            if crate::retry::is_refusal(status.as_u16(), &bytes) {
                backend.mark_full();
                return Err(Failure::SlotUnavailable);
            }
            return Ok((status, Answer::Whole(bytes)));
        }
        let mut upstream = upstream.into_body();
        if stream && status.is_success() {
            // A failure before the first chunk is still invisible to the client.
            let first = loop {
                match upstream.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) if !data.is_empty() => break data,
                        _ => continue,
                    },
                    _ => return Err(Failure::BeforeFirstByte),
                }
            };
            return Ok((status, Answer::Stream { first, upstream, lease, claim }));
        }
        let bytes = collect(upstream, lease).await.map_err(|_| Failure::BrokenBody)?;
        if status.is_success() {
            count_reuse(backend, &bytes);
        }
        Ok((status, Answer::Whole(bytes)))
    }
}

/// What a backend answered.
enum Answer {
    /// A whole body, read before anything is sent.
    Whole(Bytes),
    /// A stream whose first chunk has arrived; it keeps the claim and the
    /// connection.
    Stream { first: Bytes, upstream: hyper::body::Incoming, lease: Lease, claim: Claim },
}

impl Answer {
    fn into_response(self, backend: &Backend, status: StatusCode, mut record: Record) -> Response {
        record.answered(backend.url(), status.as_u16());
        match self {
            Self::Whole(bytes) => {
                let mut response = Response::new(Body::from(bytes));
                *response.status_mut() = status;
                let h = response.headers_mut();
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    h.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
                }
                response
            }
            Self::Stream { first, upstream, lease, claim } => {
                let relay = Relay::new(first, upstream, lease, claim, record);
                let mut response = Response::new(Body::new(relay));
                *response.status_mut() = status;
                let h = response.headers_mut();
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
                h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                response
            }
        }
    }
}

/// Reads a whole answer; its connection is then pooled again.
async fn collect(body: hyper::body::Incoming, lease: Lease) -> Result<Bytes, hyper::Error> {
    let bytes = body.collect().await?.to_bytes();
    lease.release();
    Ok(bytes)
}

/// Counts the prompt-cache reuse that `backend` reported in an answer or chunk.
fn count_reuse(backend: &Backend, bytes: &[u8]) {
    if let Some((prompt, cached)) = crate::usage::scan(bytes) {
        m::prompt_reuse(&backend.url(), prompt, cached);
    }
}

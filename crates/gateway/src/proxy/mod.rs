//! Forwarding one OpenAI request: claim a slot, send the body as received, and
//! retry on another backend while nothing has reached the client yet.
//!
//! Headers are held back until the backend's first byte, so a retry is invisible.
//! A non-streamed answer is read whole before it is sent, so a backend that dies
//! at any point of it is retried too. Once a stream has started it is never
//! retried; if the backend dies mid-stream the client gets a final SSE error event.

pub mod bounded;
pub mod ids;
mod peek;
mod poison;
pub mod recent;
mod record;
mod relay;
pub mod retry;
mod strip;
pub mod upstream;
pub mod usage;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;
use slotgate_protocol::{ApiError, ErrorType};

use crate::config::error::{api_response, RETRY_AFTER_SECS};
use crate::config::live::{Live, LiveCell};
use crate::fleet::backend::Backend;
use crate::fleet::pool::{Claim, Class, Pool, Wait};
use crate::metrics as m;
use crate::proxy::retry::{Failure, Next, Outcome, Refusal, RetryPolicy};
use crate::proxy::upstream::{BackendClient, Body as UpstreamBody, SendError};
use crate::tenancy::limits::UsageBook;
use crate::tenancy::Tenant;
use record::Record;
use relay::Relay;

/// The header that names a request across the gateway, the backend and the logs.
pub const REQUEST_ID: &str = "x-request-id";

/// The header with which a request says how long it may wait to start, in ms.
pub const DEADLINE: &str = "x-slotgate-deadline-ms";

/// How long a backend that said it is full counts as full without a report of
/// its slots: long enough not to send it the next requests of a burst, short
/// enough that a wrong mark costs one pause, not an outage.
const FULL_MARK: Duration = Duration::from_secs(1);

/// Forwards requests: the pool to claim slots from, the client to reach
/// backends with, and the retry policy.
pub struct Forwarder {
    pool: Arc<Pool>,
    upstream: BackendClient,
    /// Shared by every worker thread: one budget for the whole gateway.
    retry: Arc<RetryPolicy>,
    /// Keys, CORS and aliases in force.
    live: LiveCell,
    /// What each key has used, against its limits.
    book: Arc<UsageBook>,
    /// Requests that killed backends.
    poisons: poison::Poisons,
    /// How long a backend may be silent.
    timeouts: Timeouts,
}

/// How long a backend may be silent: before its first byte, and between chunks.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// To the first byte of the answer (a whole answer, when not streamed).
    pub first_byte: Duration,
    /// Between two chunks of a stream.
    pub chunk: Duration,
    /// For the whole answer to one of the gateway's own reads of a backend
    /// (health, slots, models): the health check's interval, at least 500 ms.
    pub read: Duration,
}

impl Timeouts {
    /// From `routing`.
    pub fn of(routing: &crate::config::Routing) -> Self {
        Self {
            first_byte: Duration::from_millis(routing.first_byte_timeout_ms),
            chunk: Duration::from_millis(routing.chunk_timeout_ms),
            read: Duration::from_millis(routing.health_interval_ms.max(500)),
        }
    }
}

/// Who sent a request, as the routes found out.
pub struct Caller {
    /// The live settings the request is served under.
    pub live: Arc<Live>,
    /// Its key; `None` when the gateway is open.
    pub tenant: Option<Arc<Tenant>>,
}

impl Forwarder {
    /// A forwarder over `pool`.
    pub fn new(
        pool: Arc<Pool>,
        upstream: BackendClient,
        retry: Arc<RetryPolicy>,
        live: LiveCell,
        book: Arc<UsageBook>,
        timeouts: Timeouts,
    ) -> Self {
        Self { pool, upstream, retry, live, book, poisons: poison::Poisons::default(), timeouts }
    }

    /// The live settings in force now.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// The usage of every key.
    pub fn book(&self) -> &Arc<UsageBook> {
        &self.book
    }

    /// The backends and their queues.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The client that reaches the backends, from this worker thread.
    pub fn client(&self) -> &BackendClient {
        &self.upstream
    }

    /// How long a backend may be silent.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Forwards `body` to `path` of a backend serving its model. Every answer,
    /// errors included, carries the request's id.
    pub async fn forward(
        &self,
        path: &'static str,
        headers: &HeaderMap,
        body: Bytes,
        caller: Caller,
    ) -> Response {
        let started = Instant::now();
        let request_id = headers
            .get(REQUEST_ID)
            .filter(|v| !v.is_empty() && v.len() <= 128 && v.to_str().is_ok())
            .cloned()
            .unwrap_or_else(crate::proxy::ids::request_id);
        let attempts = self.attempts(path, headers, body, &request_id, started, caller);
        let mut response = match attempts.await {
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
        caller: Caller,
    ) -> Result<Response, ApiError> {
        let mut peek = peek::peek(&body, headers, self.pool.uses_affinity())?;
        self.poisons.check(&body).inspect_err(|_| {
            tracing::warn!(request_id = ?request_id, "refused: this request killed backends lately");
        })?;
        let asked = peek.model.clone();
        let target = caller.live.aliases.get(&peek.model);
        // Keys are charged for tokens, so a stream must report them: asked for
        // here when the client did not, and taken out again before it sees them.
        let strip_usage = caller.tenant.is_some() && peek.stream && !peek.usage_asked;
        // The body as the client sent it, which a poisonous one is remembered by
        // (what is forwarded may be rewritten below).
        let sent = body.clone();
        let mut body = body;
        // Salts are the key's (only generation reads a prompt cache): with cache
        // isolation, its prompts share cached prefixes with no other key's.
        let generates = matches!(path, "/v1/chat/completions" | "/v1/completions");
        let tenant = caller.tenant.as_ref().filter(|_| generates);
        let changes = peek::Changes {
            // The backend knows the model by its own name: the body says that one.
            model: target.map(String::as_str),
            ask_usage: strip_usage,
            salt: tenant.map(|t| &*t.cache_salt),
            isolate: tenant.is_some_and(|t| t.cache_isolation),
        };
        if changes.any(&body) {
            body = peek::rewrite(&body, &changes)?;
        }
        if let (Some(salt), true, Some(key)) =
            (changes.salt, changes.isolate, peek.affinity.as_mut())
        {
            // Its prompts are warm only where its own went.
            *key = crate::fleet::hash::Fnv::default()
                .write(&key.to_le_bytes())
                .write(salt.as_bytes())
                .finish();
        }
        if let Some(target) = target {
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
        let mut record = Record::new(model, request_id, started);
        let mut wait = Wait { class: Class::default(), deadline: deadline(headers, started)? };
        if let Some(tenant) = &caller.tenant {
            record.key(tenant.name.clone());
            if !tenant.may_use(&asked, model) {
                record.refused(403);
                return Err(ApiError::new(
                    ErrorType::PermissionError,
                    format!("the key `{}` may not use the model `{asked}`", tenant.name),
                )
                .with_param("model")
                .with_code("model_not_allowed"));
            }
            let permit =
                self.book.admit(tenant).await.inspect_err(|e| record.refused(e.status()))?;
            record.permit(permit);
            wait.class = Class { priority: tenant.priority, tenant: tenant.id };
        }
        // A client's key opens this gateway, not the backends: with keys, it is
        // never passed on.
        let pass_key = caller.live.auth.is_open();
        self.retry.arrived();
        let mut exclude: Vec<usize> = Vec::new();
        let mut failed = 0;
        let mut last = None;
        let mut made = 0;
        // Backends that died while this request was on them.
        let mut deaths = 0;
        loop {
            if !self.pool.has_other(model, &exclude) {
                // Nowhere else to go: the same backend again, on a fresh attempt.
                exclude.clear();
            }
            let claim = match self.pool.acquire(model, &exclude, peek.affinity, wait).await {
                Ok(claim) => claim,
                Err(err) => {
                    record.refused(err.status());
                    return Err(err);
                }
            };
            made += 1;
            record.attempt();
            let backend = claim.backend.clone();
            tracing::debug!(request_id = ?request_id, model, backend = %backend.url(), made, "forwarding");
            let send = Send { path, headers, body: &body, request_id, pass_key };
            let result = self.attempt(claim, &send, peek.stream).await;
            let outcome = match &result {
                Ok((status, _)) => Outcome::Answered(status.as_u16()),
                Err(failure) => Outcome::Failed(*failure),
            };
            let verdict = self.retry.judge(outcome);
            if !self.retry.counts(&verdict) {
                made -= 1;
            }
            if !verdict.retryable {
                if let Ok((status, answer)) = result {
                    let silence = self.timeouts.chunk;
                    return Ok(answer.into_response(
                        &backend,
                        status,
                        record,
                        strip_usage,
                        silence,
                    ));
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
                if failure.is_death() {
                    deaths += 1;
                    if deaths >= poison::DEATHS {
                        tracing::error!(request_id = ?request_id, model, "{deaths} backends died under this request: refused as poison");
                        let err = self.poisons.remember(&sent);
                        record.refused(err.status());
                        return Err(err);
                    }
                }
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

    /// Marks `backend` full until it reports its slots, or for [`FULL_MARK`] at
    /// most; then the requests waiting for it are woken.
    fn mark_full(&self, backend: &Arc<Backend>) {
        let mark = backend.mark_full();
        let (pool, backend) = (self.pool.clone(), backend.clone());
        tokio::spawn(async move {
            tokio::time::sleep(FULL_MARK).await;
            if backend.unmark_full(mark) {
                pool.wake_backend(&backend);
            }
        });
    }

    /// One attempt on the claimed backend: its status and answer, or what failed.
    async fn attempt(
        &self,
        claim: Claim,
        send: &Send<'_>,
        stream: bool,
    ) -> Result<(StatusCode, Answer), Failure> {
        let backend = &claim.backend;
        let mut extra: Vec<(HeaderName, HeaderValue)> =
            vec![(HeaderName::from_static(REQUEST_ID), send.request_id.clone())];
        let key = match &backend.api_key {
            Some(own) => Some(own),
            None => send.headers.get(header::AUTHORIZATION).filter(|_| send.pass_key),
        };
        if let Some(key) = key {
            extra.push((header::AUTHORIZATION, key.clone()));
        }
        // A supervised engine between restarts has no address: as if refused.
        let url = backend.address().ok_or(Failure::Connect)?;
        let deadline = tokio::time::Instant::now() + self.timeouts.first_byte;
        let silent = || {
            tracing::warn!(backend = %backend.url(), "no answer within routing.first_byte_timeout_ms");
            Failure::Silent
        };
        let posted = self.upstream.post(&url, send.path, extra, send.body.clone());
        let posted = tokio::time::timeout_at(deadline, posted).await.map_err(|_| silent())?;
        let reply = posted.map_err(|e| {
            tracing::debug!(error = %e, backend = %backend.url(), "no answer");
            match e {
                // A URL that makes no URI is the backend's configuration at fault:
                // out of rotation, as for a refused connection.
                SendError::Connect(_) | SendError::Uri(_) => Failure::Connect,
                SendError::Broken(_) => Failure::BeforeFirstByte,
                SendError::Stale(_) => Failure::Stale,
            }
        })?;
        let status = reply.status;
        let mut upstream = reply.body;
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            let bytes = tokio::time::timeout_at(deadline, collect(upstream));
            let bytes = bytes.await.map_err(|_| silent())?.unwrap_or_default();
            match crate::proxy::retry::refusal(status.as_u16(), &bytes) {
                Some(Refusal::Full) => {
                    self.mark_full(backend);
                    return Err(Failure::SlotUnavailable);
                }
                Some(Refusal::Busy) => return Err(Failure::SlotUnavailable),
                None => {}
            }
            return Ok((status, Answer::Whole(bytes)));
        }
        if stream && status.is_success() {
            // A failure before the first chunk is still invisible to the client.
            let first = loop {
                let frame = tokio::time::timeout_at(deadline, upstream.frame());
                match frame.await.map_err(|_| silent())? {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) if !data.is_empty() => break data,
                        _ => continue,
                    },
                    _ => return Err(Failure::BeforeFirstByte),
                }
            };
            return Ok((status, Answer::Stream { first, upstream, claim }));
        }
        let bytes =
            tokio::time::timeout_at(deadline, collect(upstream)).await.map_err(|_| silent())?;
        let bytes = bytes.map_err(|_| Failure::BrokenBody)?;
        Ok((status, Answer::Whole(bytes)))
    }
}

/// What every attempt of one request sends.
struct Send<'a> {
    path: &'static str,
    headers: &'a HeaderMap,
    body: &'a Bytes,
    request_id: &'a HeaderValue,
    /// Whether the client's own `Authorization` goes to the backend.
    pass_key: bool,
}

/// The deadline a request set with `x-slotgate-deadline-ms`, from its arrival.
fn deadline(
    headers: &HeaderMap,
    started: Instant,
) -> Result<Option<tokio::time::Instant>, ApiError> {
    let Some(value) = headers.get(DEADLINE) else { return Ok(None) };
    let ms: u64 = value.to_str().ok().and_then(|v| v.trim().parse().ok()).ok_or_else(|| {
        ApiError::invalid(DEADLINE, format!("{DEADLINE} must be a whole number of milliseconds"))
    })?;
    Ok(Some(tokio::time::Instant::from_std(started) + Duration::from_millis(ms)))
}

/// What a backend answered.
enum Answer {
    /// A whole body, read before anything is sent.
    Whole(Bytes),
    /// A stream whose first chunk has arrived; it keeps the claim, and its body
    /// the connection.
    Stream { first: Bytes, upstream: UpstreamBody, claim: Claim },
}

impl Answer {
    fn into_response(
        self,
        backend: &Backend,
        status: StatusCode,
        mut record: Record,
        strip_usage: bool,
        silence: Duration,
    ) -> Response {
        record.answered(backend.url(), status.as_u16());
        match self {
            Self::Whole(bytes) => {
                if status.is_success() {
                    count_usage(backend, &mut record, &bytes);
                }
                let mut response = Response::new(Body::from(bytes));
                *response.status_mut() = status;
                let h = response.headers_mut();
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    h.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
                }
                response
            }
            Self::Stream { first, upstream, claim } => {
                let strip = strip_usage.then(strip::UsageStrip::default);
                let relay = Relay::new(first, upstream, claim, record, strip, silence);
                let mut response = Response::new(Body::new(relay));
                *response.status_mut() = status;
                slotgate_http::event_stream(&mut response);
                response
            }
        }
    }
}

/// Reads a whole answer; its connection is then pooled again.
async fn collect(body: UpstreamBody) -> Result<Bytes, crate::proxy::upstream::BodyError> {
    Ok(body.collect().await?.to_bytes())
}

/// Counts the usage that `backend` reported in an answer or chunk: its
/// prompt-cache reuse, and the tokens of the request's key.
fn count_usage(backend: &Backend, record: &mut Record, bytes: &[u8]) {
    if let Some(usage) = crate::proxy::usage::scan(bytes) {
        m::prompt_reuse(&backend.url(), usage.prompt, usage.cached);
        record.tokens(usage.prompt, usage.completion, usage.cached);
    }
}

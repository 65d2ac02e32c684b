//! Forwarding one OpenAI request: claim a slot, send the body as received, and
//! retry on another backend while nothing has reached the client yet.
//!
//! Headers are held back until the backend's first byte, so a retry is invisible.
//! A non-streamed answer is read whole before it is sent, so a backend that dies
//! at any point of it is retried too. Once a stream has started it is never
//! retried; if the backend dies mid-stream the client gets a final SSE error event.

mod attempt;
pub mod bounded;
pub mod course;
pub mod ids;
mod ledger;
mod peek;
mod poison;
mod prepare;
pub mod recent;
mod record;
mod relay;
mod resume;
pub mod retry;
mod strip;
pub mod upstream;
pub mod usage;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use slotgate_protocol::{ApiError, ErrorType};

use crate::config::error::api_response;
use crate::config::live::{Live, LiveCell};
use crate::fleet::backend::Backend;
use crate::fleet::pool::Pool;
use crate::proxy::course::Then;
use crate::proxy::retry::{Outcome, RetryPolicy};
use crate::proxy::upstream::BackendClient;
use crate::tenancy::limits::UsageBook;
use crate::tenancy::Tenant;
use attempt::Send;

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
        self: &Arc<Self>,
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
        self: &Arc<Self>,
        path: &'static str,
        headers: &HeaderMap,
        body: Bytes,
        request_id: &HeaderValue,
        started: Instant,
        caller: Caller,
    ) -> Result<Response, ApiError> {
        let ready = prepare::prepare(self, path, headers, body, request_id, &caller)?;
        let model = ready.peek.model.as_str();
        let (mut record, wait) =
            prepare::admit(self, &ready, headers, request_id, started, &caller).await?;
        // A client's key opens this gateway, not the backends: with keys, it is
        // never passed on.
        let pass_key = caller.live.auth.is_open();
        let owner = owner(path, &caller);
        // A chat or text completion stream may move to another backend if its
        // own is lost: its engine marks the tokens it sends.
        let movable = ready.peek.stream
            && self.retry.max_resumes() > 0
            && matches!(path, "/v1/chat/completions" | "/v1/completions");
        let send =
            Send { path, headers, body: &ready.body, request_id, pass_key, owner, mark: movable };
        let mut course = self.retry.course();
        if let Some(previous) = &ready.peek.previous {
            let others = self.holder(previous).inspect_err(|e| record.refused(e.status()))?;
            course.pin(others);
        }
        loop {
            let exclude = course.exclusions(|ex| self.pool.has_other(model, ex));
            let claim = match self.pool.acquire(model, exclude, ready.peek.affinity, wait).await {
                Ok(claim) => claim,
                Err(err) => {
                    record.refused(err.status());
                    return Err(err);
                }
            };
            record.attempt();
            let backend = claim.backend.clone();
            let made = course.made() + 1;
            tracing::debug!(request_id = ?request_id, model, backend = %backend.url(), made, "forwarding");
            let result = self.attempt(claim, &send, ready.peek.stream).await;
            let outcome = match &result {
                Ok((status, _)) => Outcome::Answered(status.as_u16()),
                Err(failure) => Outcome::Failed(*failure),
            };
            let ruling = course.rule(backend.index, outcome);
            if ruling.eject && backend.eject() {
                tracing::warn!(backend = %backend.url(), "ejected: connection refused");
            }
            if let Some(failure) = ruling.failure {
                tracing::info!(request_id = ?request_id, backend = %backend.url(), reason = failure.label(), "attempt failed");
                self.poisoned(&course, &ready.sent, request_id)
                    .inspect_err(|e| record.refused(e.status()))?;
            }
            match (ruling.then, result) {
                (Then::Deliver, Ok((status, answer))) => {
                    let lost = (vec![backend.index], course.deaths());
                    let moving = movable.then(|| self.moving(&send, &ready, (wait, lost)));
                    let timing = (self.timeouts.chunk, relay::Dialect::of(path));
                    let strip = ready.strip_usage;
                    return Ok(
                        answer.into_response(&backend, status, record, strip, timing, moving)
                    );
                }
                (Then::RetryAfter(pause), _) => tokio::time::sleep(pause).await,
                (then, _) => {
                    tracing::warn!(request_id = ?request_id, model, ?then, "no more attempts");
                    break;
                }
            }
        }
        let err = course.exhausted();
        record.refused(err.status());
        Err(err)
    }
}

impl Forwarder {
    /// What a stream needs to move to another backend: its request, owned, and
    /// the backends its attempts lost (`lost`: left out, and how many died).
    fn moving(
        self: &Arc<Self>,
        send: &Send<'_>,
        ready: &prepare::Ready,
        (wait, lost): (crate::fleet::pool::Wait, (Vec<usize>, u32)),
    ) -> Box<resume::Moving> {
        let request = resume::Request {
            path: send.path,
            headers: send.headers.clone(),
            body: ready.body.clone(),
            sent: ready.sent.clone(),
            request_id: send.request_id.clone(),
            pass_key: send.pass_key,
            owner: send.owner.clone(),
        };
        let model = ready.peek.model.clone();
        let resumer = resume::Resumer::new(self.clone(), request, (model, wait), lost);
        Box::new(resume::Moving { ledger: Default::default(), resumer, pending: None })
    }

    /// The refusal of a request under which [`poison::DEATHS`] backends died.
    fn poisoned(
        &self,
        course: &course::Course<'_>,
        sent: &[u8],
        request_id: &HeaderValue,
    ) -> Result<(), ApiError> {
        let deaths = course.deaths();
        if deaths < poison::DEATHS {
            return Ok(());
        }
        tracing::error!(request_id = ?request_id, "{deaths} backends died under this request: refused as poison");
        Err(self.poisons.remember(sent))
    }

    /// The backends other than the one that holds the stored response `id` (its
    /// engine instance is in the id): a follow-up goes there, or nowhere.
    fn holder(&self, id: &str) -> Result<Vec<usize>, ApiError> {
        let backends = self.pool.backends();
        let instance = slotgate_protocol::responses::instance_of(id);
        let holds = |b: &Backend| {
            instance.is_some() && b.instance().as_deref().map(String::as_str) == instance
        };
        if !backends.iter().any(|b| holds(b)) {
            return Err(previous_not_found(id));
        }
        Ok(backends.iter().filter(|b| !holds(b)).map(|b| b.index).collect())
    }
}

/// A follow-up of a response that no backend holds.
pub fn previous_not_found(id: &str) -> ApiError {
    ApiError::new(
        ErrorType::NotFoundError,
        format!(
            "previous response `{id}` is not stored on any backend (never stored, expired, \
             deleted, or its engine restarted)"
        ),
    )
    .with_param("previous_response_id")
    .with_code("previous_response_not_found")
}

/// Whose a Responses request is, for the engine that stores it: its key's salt
/// (a digest no client can derive), so that no other key finds the response.
fn owner(path: &str, caller: &Caller) -> Option<HeaderValue> {
    let tenant = caller.tenant.as_ref().filter(|_| path.starts_with("/v1/responses"))?;
    HeaderValue::from_str(&tenant.cache_salt).ok()
}

//! The one place a request's metrics and its access-log line are recorded: once,
//! when it ends, whichever way it ends (an answer, an error, a stream that
//! finished or a client that left).

use std::sync::Arc;
use std::time::Instant;

use crate::fleet::backend::Backend;
use crate::metrics as m;
use crate::tenancy::limits::Permit;

/// What the metrics say of one request; recorded when dropped.
pub struct Record {
    model: String,
    /// The API the request spoke (its `api` label).
    api: &'static str,
    /// The backend that answered, if one did.
    backend: Option<Arc<String>>,
    status: u16,
    started: Instant,
    /// When the answer's first byte went out.
    first_byte: Option<Instant>,
    /// The key's admission, given back (with the tokens) at the end.
    permit: Option<Permit>,
    /// For the access log: the request's id, its key's name, the backends
    /// tried, and the tokens the answer reported (prompt, completion, cached).
    request_id: axum::http::HeaderValue,
    key: Option<Arc<str>>,
    attempts: u32,
    /// Backends that sent part of the answer: more than one when its stream
    /// moved.
    served_by: u32,
    tokens: [u64; 3],
}

impl Record {
    /// Counts the usage that `backend` reported in an answer or chunk: its
    /// prompt-cache reuse, and the tokens of the request's key.
    pub fn count_usage(&mut self, backend: &Backend, bytes: &[u8]) {
        if let Some(usage) = crate::proxy::usage::scan(bytes) {
            m::prompt_reuse(&backend.url(), usage.prompt, usage.cached);
            self.tokens(usage.prompt, usage.completion, usage.cached);
        }
    }

    /// A request for `model` through `api`, numbered `request_id`, that
    /// arrived at `started`.
    pub fn new(
        model: &str,
        api: &'static str,
        request_id: &axum::http::HeaderValue,
        started: Instant,
    ) -> Self {
        Self {
            model: model.to_owned(),
            api,
            backend: None,
            status: 0,
            started,
            first_byte: None,
            permit: None,
            request_id: request_id.clone(),
            key: None,
            attempts: 0,
            served_by: 0,
            tokens: [0; 3],
        }
    }

    /// The request came with the key named `name`.
    pub fn key(&mut self, name: Arc<str>) {
        self.key = Some(name);
    }

    /// The request was admitted under a key's limits.
    pub fn permit(&mut self, permit: Permit) {
        self.permit = Some(permit);
    }

    /// One more backend was tried.
    pub fn attempt(&mut self) {
        self.attempts += 1;
    }

    /// The answer reported these tokens: charged to the key, if any.
    pub fn tokens(&mut self, prompt: u64, completion: u64, cached: u64) {
        self.tokens = [prompt, completion, cached];
        if let Some(permit) = &mut self.permit {
            permit.tokens(prompt, completion);
        }
    }

    /// A stream that ended without reporting its tokens: with a key, it is
    /// charged `completion` tokens (an estimate from what was relayed).
    pub fn unreported(&mut self, completion: u64) {
        if self.permit.is_some() && self.tokens == [0; 3] && completion > 0 {
            self.tokens(0, completion, 0);
        }
    }

    /// The gateway answered itself, with an error of this status.
    pub fn refused(&mut self, status: u16) {
        self.backend = None;
        self.status = status;
    }

    /// `backend` answered with `status`; its first byte is going out now.
    pub fn answered(&mut self, backend: Arc<String>, status: u16) {
        self.backend = Some(backend);
        self.status = status;
        self.first_byte = Some(Instant::now());
        self.served_by = 1;
    }

    /// The answer's stream went on at `backend`.
    pub fn moved(&mut self, backend: Arc<String>) {
        self.backend = Some(backend);
        self.served_by += 1;
        self.attempts += 1;
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let backend = self.backend.as_ref().map_or("none", |b| b.as_str());
        // One clock read for the metrics and the log line (a tenth of a
        // microsecond each); the dashboard's record reads its own.
        let duration = self.started.elapsed();
        let ttft = self.first_byte.map(|first| first.duration_since(self.started));
        let times = ttft.map(|ttft| (ttft.as_secs_f64(), duration.as_secs_f64()));
        m::request_done(&self.model, self.api, backend, self.status, times);
        let [prompt, completion, cached] = self.tokens;
        crate::proxy::recent::RECENT.ended(
            &self.model,
            backend,
            self.status,
            ttft,
            duration,
            completion,
        );
        let ms = |s: f64| (s * 1000.0 * 10.0).round() / 10.0;
        tracing::info!(
            target: "slotgate::access",
            request_id = %String::from_utf8_lossy(self.request_id.as_bytes()),
            key = self.key.as_deref().unwrap_or("-"),
            model = %self.model,
            api = self.api,
            backend,
            status = self.status,
            attempts = self.attempts,
            backends = self.served_by,
            prompt_tokens = prompt,
            completion_tokens = completion,
            cached_tokens = cached,
            ttft_ms = times.map_or(0.0, |(ttft, _)| ms(ttft)),
            duration_ms = ms(duration.as_secs_f64()),
            "request"
        );
    }
}

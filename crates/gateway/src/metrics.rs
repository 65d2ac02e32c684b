//! Prometheus metrics of the gateway. Labels stay bounded: backends, models,
//! APIs, statuses and retry reasons, never request ids or user text.

use std::cell::RefCell;
use std::collections::HashMap;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::PrometheusHandle;
use slotgate_http::MetricKind as Kind;

/// 1 when a backend takes traffic (gauge; `backend`).
pub const BACKEND_UP: &str = "slotgate_backend_up";
/// Slots of a backend (gauge; `backend`, `model`). Not `_total`: that suffix
/// is for counters.
pub const SLOTS: &str = "slotgate_backend_slots";
/// Busy slots of a backend, this gateway's and others' (gauge; `backend`, `model`).
pub const SLOTS_BUSY: &str = "slotgate_backend_slots_busy";
/// Requests waiting for a slot (gauge; `model`).
pub const QUEUE_DEPTH: &str = "slotgate_queue_depth";
/// Time waited for a slot (histogram, seconds; `model`).
pub const QUEUE_WAIT: &str = "slotgate_queue_wait_seconds";
/// Answers sent (counter; `model`, `api`, `backend`, `status`).
pub const REQUESTS: &str = "slotgate_requests_total";
/// Backends chosen, by how (counter; `reason`: `affinity` kept, `spilled` by
/// load, `no_affinity`).
pub const ROUTING: &str = "slotgate_routing_decisions_total";
/// Prompt tokens of answers, as each backend reported them (counter; `backend`).
pub const BACKEND_PROMPT_TOKENS: &str = "slotgate_backend_prompt_tokens_total";
/// Of those, tokens the backend took from its prompt cache (counter; `backend`).
pub const BACKEND_CACHED_TOKENS: &str = "slotgate_backend_prompt_tokens_cached_total";
/// Retries (counter; `reason`).
pub const RETRIES: &str = "slotgate_retries_total";
/// From arrival to the end of the answer (histogram, seconds; `model`, `api`).
pub const DURATION: &str = "slotgate_request_duration_seconds";
/// From arrival to the first byte of the answer (histogram, seconds; `model`, `api`).
pub const TTFT: &str = "slotgate_time_to_first_token_seconds";

/// Per-key request counts (counter; `key`).
pub const KEY_REQUESTS: &str = "slotgate_key_requests_total";
/// Per-key prompt tokens (counter; `key`).
pub const KEY_PROMPT_TOKENS: &str = "slotgate_key_prompt_tokens_total";
/// Per-key completion tokens (counter; `key`).
pub const KEY_COMPLETION_TOKENS: &str = "slotgate_key_completion_tokens_total";
/// Per-key refusals (counter; `key`, `reason`).
pub const KEY_REFUSALS: &str = "slotgate_key_refusals_total";
/// 1 while the shared limit counters in Redis are reachable (gauge).
pub const REDIS_UP: &str = "slotgate_limits_redis_up";
/// Requests refused because backends died under them twice (counter).
pub const POISON: &str = "slotgate_poison_requests_total";
/// Streams that went on at another backend (counter; `reason`: died, stalled).
pub const RESUMES: &str = "slotgate_stream_resumes_total";
/// The silence a client of a resumed stream saw, from the loss of its backend
/// (or the start of its silence) to the next backend's first byte (histogram).
pub const RESUME_GAP: &str = "slotgate_stream_resume_gap_seconds";
/// Answer tokens a resumed stream's next backend read instead of sampling
/// (counter): what moving recomputes beside the prompt.
pub const RESUMED_TOKENS: &str = "slotgate_stream_resumed_tokens_total";
/// Open client connections of each worker thread (gauge; `worker`, bounded by
/// the configured worker count).
pub const WORKER_CONNECTIONS: &str = "slotgate_worker_connections";

/// Every metric with its type and the help text `/metrics` shows for it (as
/// Prometheus' linter, `promtool check metrics`, asks). The README lists them.
const DESCRIBED: &[(&str, Kind, &str)] = &[
    (BACKEND_UP, Kind::Gauge, "1 when the backend takes traffic (healthy, not draining), else 0."),
    (SLOTS, Kind::Gauge, "Slots of the backend for the model."),
    (SLOTS_BUSY, Kind::Gauge, "Busy slots of the backend: this gateway's requests and others'."),
    (QUEUE_DEPTH, Kind::Gauge, "Requests waiting in this gateway for a slot, per model."),
    (QUEUE_WAIT, Kind::Histogram, "Time requests waited in this gateway for a slot, in seconds."),
    (
        REQUESTS,
        Kind::Counter,
        "Answers sent, by model, API, backend (none: the gateway's own) and HTTP status.",
    ),
    (ROUTING, Kind::Counter, "Backends chosen, by reason: affinity, spilled or no_affinity."),
    (
        BACKEND_PROMPT_TOKENS,
        Kind::Counter,
        "Prompt tokens of answers, as each backend reported them.",
    ),
    (
        BACKEND_CACHED_TOKENS,
        Kind::Counter,
        "Prompt tokens each backend took from its prompt cache.",
    ),
    (RETRIES, Kind::Counter, "Requests sent again to a backend, by reason."),
    (
        DURATION,
        Kind::Histogram,
        "Time from a request's arrival to the end of its answer, in seconds.",
    ),
    (
        TTFT,
        Kind::Histogram,
        "Time from a request's arrival to its answer's first byte, in seconds.",
    ),
    (KEY_REQUESTS, Kind::Counter, "Requests admitted, by key name."),
    (KEY_PROMPT_TOKENS, Kind::Counter, "Prompt tokens charged, by key name."),
    (KEY_COMPLETION_TOKENS, Kind::Counter, "Completion tokens charged, by key name."),
    (KEY_REFUSALS, Kind::Counter, "Requests refused by a key's limits, by key name and reason."),
    (
        REDIS_UP,
        Kind::Gauge,
        "1 while the Redis that shares per-minute limits is reachable, else 0.",
    ),
    (WORKER_CONNECTIONS, Kind::Gauge, "Open client connections of each worker thread."),
    (POISON, Kind::Counter, "Requests answered 502 because two backends died while serving them."),
    (
        RESUMES,
        Kind::Counter,
        "Streams that went on at another backend, by reason: died or stalled.",
    ),
    (
        RESUME_GAP,
        Kind::Histogram,
        "Silence a resumed stream's client saw while it moved to another backend, in seconds.",
    ),
    (
        RESUMED_TOKENS,
        Kind::Counter,
        "Answer tokens that resumed streams carried to their next backend.",
    ),
];

/// The `api` label of a request by the path it is forwarded to: which client
/// protocol it spoke, so that each API's traffic, errors and latency can be
/// told apart.
pub fn api(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "chat",
        "/v1/completions" | "/completion" => "completions",
        "/v1/embeddings" => "embeddings",
        "/v1/rerank" => "rerank",
        p if p.starts_with("/v1/responses") => "responses",
        p if p.starts_with("/v1/messages") => "messages",
        _ => "llama_server",
    }
}

/// The process's Prometheus recorder, with every metric described.
pub fn handle() -> PrometheusHandle {
    slotgate_http::recorder(DESCRIBED)
}

/// Handles of the metrics recorded on every request, looked up once per thread.
/// `counter!` with owned labels allocates the labels, hashes the key and searches
/// the registry on each call: a tenth of the proxy's user time (see
/// BENCHMARKS.md, gateway overhead). The label sets are bounded (known models,
/// configured backends, statuses), and the recorder keeps every metric for the
/// life of the process, so a handle never goes stale.
#[derive(Default)]
struct Handles {
    /// By model and API.
    models: HashMap<(String, &'static str), ModelHandles>,
    backends: HashMap<String, [Counter; 2]>,
    routing: Vec<(&'static str, Counter)>,
}

/// One model's histograms for one API, and its request counters by backend
/// and status.
struct ModelHandles {
    ttft: Histogram,
    duration: Histogram,
    requests: Vec<(String, u16, Counter)>,
}

thread_local! {
    static HANDLES: RefCell<Handles> = RefCell::default();
}

/// Counts an answer of `status` for `model` through `api` from `backend`
/// (`none` when the gateway answered itself), with its time to first byte and
/// whole duration in seconds when it had any.
pub fn request_done(
    model: &str,
    api: &'static str,
    backend: &str,
    status: u16,
    times: Option<(f64, f64)>,
) {
    HANDLES.with_borrow_mut(|h| {
        let key = (model.to_owned(), api);
        if !h.models.contains_key(&key) {
            let (model, api) = (model.to_owned(), api);
            let per = ModelHandles {
                ttft: metrics::histogram!(TTFT, "model" => model.clone(), "api" => api),
                duration: metrics::histogram!(DURATION, "model" => model, "api" => api),
                requests: Vec::new(),
            };
            h.models.insert(key.clone(), per);
        }
        let per = h.models.get_mut(&key).expect("inserted above");
        let i = match per.requests.iter().position(|(b, s, _)| *s == status && b == backend) {
            Some(i) => i,
            None => {
                let counter = metrics::counter!(REQUESTS, "model" => model.to_owned(),
                    "api" => api, "backend" => backend.to_owned(), "status" => status.to_string());
                per.requests.push((backend.to_owned(), status, counter));
                per.requests.len() - 1
            }
        };
        per.requests[i].2.increment(1);
        if let Some((ttft, duration)) = times {
            per.ttft.record(ttft);
            per.duration.record(duration);
        }
    });
}

/// Counts the prompt tokens that `backend` reported, and how many of them came
/// from its prompt cache.
pub fn prompt_reuse(backend: &str, prompt: u64, cached: u64) {
    HANDLES.with_borrow_mut(|h| {
        if !h.backends.contains_key(backend) {
            let counters = [
                metrics::counter!(BACKEND_PROMPT_TOKENS, "backend" => backend.to_owned()),
                metrics::counter!(BACKEND_CACHED_TOKENS, "backend" => backend.to_owned()),
            ];
            h.backends.insert(backend.to_owned(), counters);
        }
        let [p, c] = h.backends.get_mut(backend).expect("inserted above");
        p.increment(prompt);
        c.increment(cached);
    });
}

/// Counts a routing decision, by its `reason` label.
pub fn routed(reason: &'static str) {
    HANDLES.with_borrow_mut(|h| {
        let i = match h.routing.iter().position(|(r, _)| *r == reason) {
            Some(i) => i,
            None => {
                h.routing.push((reason, metrics::counter!(ROUTING, "reason" => reason)));
                h.routing.len() - 1
            }
        };
        h.routing[i].1.increment(1);
    });
}

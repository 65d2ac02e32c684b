//! Prometheus metrics of the gateway. Labels stay bounded: backends, models,
//! statuses and retry reasons, never request ids or user text.

use metrics_exporter_prometheus::PrometheusHandle;

/// 1 when a backend takes traffic (gauge; `backend`).
pub const BACKEND_UP: &str = "slotgate_backend_up";
/// Slots of a backend (gauge; `backend`, `model`).
pub const SLOTS_TOTAL: &str = "slotgate_backend_slots_total";
/// Busy slots of a backend, this gateway's and others' (gauge; `backend`, `model`).
pub const SLOTS_BUSY: &str = "slotgate_backend_slots_busy";
/// Requests waiting for a slot (gauge; `model`).
pub const QUEUE_DEPTH: &str = "slotgate_queue_depth";
/// Time waited for a slot (histogram, seconds; `model`).
pub const QUEUE_WAIT: &str = "slotgate_queue_wait_seconds";
/// Answers sent (counter; `model`, `backend`, `status`).
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
/// From arrival to the end of the answer (histogram, seconds; `model`).
pub const DURATION: &str = "slotgate_request_duration_seconds";
/// From arrival to the first byte of the answer (histogram, seconds; `model`).
pub const TTFT: &str = "slotgate_time_to_first_token_seconds";

/// The process's Prometheus recorder.
pub fn handle() -> PrometheusHandle {
    slotgate_http::prometheus()
}

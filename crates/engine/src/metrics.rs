//! Prometheus metrics of the engine. Every series is labelled by `model`.

use metrics_exporter_prometheus::PrometheusHandle;

/// Slots of a model (gauge).
pub const SLOTS_TOTAL: &str = "slotgate_engine_slots_total";
/// Slots running a request (gauge).
pub const SLOTS_BUSY: &str = "slotgate_engine_slots_busy";
/// Choices waiting for a slot (gauge).
pub const QUEUE_DEPTH: &str = "slotgate_engine_queue_depth";
/// Requests answered, by HTTP status (counter).
pub const REQUESTS: &str = "slotgate_engine_requests_total";
/// Prompt tokens of finished choices (counter).
pub const PROMPT_TOKENS: &str = "slotgate_engine_prompt_tokens_total";
/// Prompt tokens reused from the prompt cache (counter).
pub const PROMPT_TOKENS_CACHED: &str = "slotgate_engine_prompt_tokens_cached_total";
/// Prompt tokens decoded because no cache held them (counter).
pub const PROMPT_TOKENS_COMPUTED: &str = "slotgate_engine_prompt_tokens_computed_total";
/// Bytes of KV state held in the host-memory prompt cache (gauge).
pub const HOST_CACHE_BYTES: &str = "slotgate_engine_host_cache_bytes";
/// Conversations held in the host-memory prompt cache (gauge).
pub const HOST_CACHE_ENTRIES: &str = "slotgate_engine_host_cache_entries";
/// Admissions that restored a conversation from the host cache (counter).
pub const HOST_CACHE_HITS: &str = "slotgate_engine_host_cache_hits_total";
/// Admissions that looked in the host cache and found nothing to restore (counter).
pub const HOST_CACHE_MISSES: &str = "slotgate_engine_host_cache_misses_total";
/// Tokens sampled (counter).
pub const GENERATED_TOKENS: &str = "slotgate_engine_generated_tokens_total";
/// Choices cancelled because their client went away (counter).
pub const CANCELLED: &str = "slotgate_engine_cancelled_total";
/// From arrival to the first sampled token (histogram, seconds).
pub const TTFT: &str = "slotgate_engine_time_to_first_token_seconds";
/// Mean time per output token after the first, per choice (histogram, seconds).
pub const TPOT: &str = "slotgate_engine_time_per_output_token_seconds";
/// Time spent waiting for a slot (histogram, seconds).
pub const QUEUE_WAIT: &str = "slotgate_engine_queue_wait_seconds";
/// Scheduler work per step outside llama.cpp's decode (histogram, seconds).
pub const STEP_OVERHEAD: &str = "slotgate_engine_step_overhead_seconds";

/// The process's Prometheus recorder.
pub fn handle() -> PrometheusHandle {
    slotgate_http::prometheus()
}

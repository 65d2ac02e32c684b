//! Prometheus metrics of the engine. Every series is labelled by `model`, and
//! the vLLM-named ones, which schedulers built for vLLM read (Kubernetes'
//! Gateway API Inference Extension, llm-d), by `model_name` as vLLM labels them.

pub mod llama_server;
mod ordered;

use metrics_exporter_prometheus::PrometheusHandle;
use slotgate_http::MetricKind as Kind;

/// Slots of a model (gauge). Not `_total`: that suffix is for counters.
pub const SLOTS: &str = "slotgate_engine_slots";
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
/// Models loaded (counter; `model`, `reason`: `start` for a load asked for,
/// `wake` for one after sleep).
pub const MODEL_LOADS: &str = "slotgate_engine_model_loads_total";
/// Models unloaded (counter; `model`, `reason`: `admin` or `idle`).
pub const MODEL_UNLOADS: &str = "slotgate_engine_model_unloads_total";

/// Requests running in a slot, as vLLM names it (gauge; `model_name`).
pub const VLLM_RUNNING: &str = "vllm:num_requests_running";
/// Requests waiting for a slot, as vLLM names it (gauge; `model_name`).
pub const VLLM_WAITING: &str = "vllm:num_requests_waiting";
/// KV cells holding tokens over the cells of every slot, 0 to 1 (gauge; `model_name`).
pub const VLLM_KV_USAGE: &str = "vllm:kv_cache_usage_perc";
/// The KV cache's layout, in labels; always 1 (gauge; `model_name`, `block_size`,
/// `num_gpu_blocks`, `cache_dtype`, `enable_prefix_caching`).
pub const VLLM_CACHE_CONFIG: &str = "vllm:cache_config_info";

/// Every metric with its type and the help text `/metrics` shows for it (as
/// Prometheus' linter, `promtool check metrics`, asks). The README lists them.
const DESCRIBED: &[(&str, Kind, &str)] = &[
    (SLOTS, Kind::Gauge, "Slots of the model: requests it decodes together."),
    (SLOTS_BUSY, Kind::Gauge, "Slots running a request."),
    (QUEUE_DEPTH, Kind::Gauge, "Requests (choices) waiting for a slot."),
    (REQUESTS, Kind::Counter, "Requests answered, by HTTP status."),
    (PROMPT_TOKENS, Kind::Counter, "Prompt tokens of finished choices."),
    (PROMPT_TOKENS_CACHED, Kind::Counter, "Prompt tokens reused from the prompt cache."),
    (PROMPT_TOKENS_COMPUTED, Kind::Counter, "Prompt tokens decoded because no cache held them."),
    (HOST_CACHE_BYTES, Kind::Gauge, "Bytes of KV state held in the host-memory prompt cache."),
    (HOST_CACHE_ENTRIES, Kind::Gauge, "Conversations held in the host-memory prompt cache."),
    (
        HOST_CACHE_HITS,
        Kind::Counter,
        "Admissions that restored a conversation from the host cache.",
    ),
    (
        HOST_CACHE_MISSES,
        Kind::Counter,
        "Admissions that found nothing to restore in the host cache.",
    ),
    (GENERATED_TOKENS, Kind::Counter, "Tokens sampled."),
    (CANCELLED, Kind::Counter, "Choices cancelled because their client went away."),
    (
        TTFT,
        Kind::Histogram,
        "Time from a request's arrival to its first sampled token, in seconds.",
    ),
    (TPOT, Kind::Histogram, "Mean time per output token after the first, per choice, in seconds."),
    (QUEUE_WAIT, Kind::Histogram, "Time requests waited for a slot, in seconds."),
    (
        STEP_OVERHEAD,
        Kind::Histogram,
        "Scheduler work per step outside llama.cpp's decode, in seconds.",
    ),
    (MODEL_LOADS, Kind::Counter, "Models loaded, by reason (start, wake)."),
    (MODEL_UNLOADS, Kind::Counter, "Models unloaded, by reason (admin, idle)."),
    (VLLM_RUNNING, Kind::Gauge, "Number of requests in model execution batches (vLLM's name)."),
    (VLLM_WAITING, Kind::Gauge, "Number of requests waiting to be processed (vLLM's name)."),
    (VLLM_KV_USAGE, Kind::Gauge, "KV-cache usage. 1 means 100 percent usage (vLLM's name)."),
    (VLLM_CACHE_CONFIG, Kind::Gauge, "Information of the KV cache's configuration (vLLM's name)."),
];

/// The process's Prometheus recorder, with every metric described.
pub fn handle() -> PrometheusHandle {
    slotgate_http::recorder(DESCRIBED)
}

/// Which other servers' names `/metrics` also uses.
#[derive(Debug, Clone, Copy)]
pub struct Names {
    /// vLLM's (`vllm:`), labelled by model.
    pub vllm: bool,
    /// llama-server's (`llamacpp:`), process totals.
    pub llama_server: bool,
}

/// `/metrics` as rendered, less the series under other servers' names that
/// are not wanted: their `:` is reserved for recording rules, and Prometheus'
/// linter says so.
pub fn render(handle: &PrometheusHandle, names: Names) -> String {
    let text = ordered::ordered(&handle.render());
    let mut out = String::with_capacity(text.len());
    if names.vllm {
        out.push_str(&text);
    } else {
        for line in text.split_inclusive('\n') {
            let name = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
                .unwrap_or(line);
            if !name.starts_with("vllm:") {
                out.push_str(line);
            }
        }
    }
    if names.llama_server {
        out.push_str(&llama_server::TOTALS.render());
    }
    out
}

//! Where the engine listens and how it answers, apart from any model.

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::defaults;
use crate::error::EngineError;

/// Where the engine listens and how it answers, apart from any model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Args)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on; several separated by commas (`127.0.0.1,::1`, as
    /// llama-server's `--host` takes them), all on one port.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 8081)]
    pub port: u16,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// A request's head must arrive within this many milliseconds of its first byte.
    #[arg(long, default_value_t = 30_000)]
    pub header_timeout_ms: u64,
    /// A request's body must arrive within this many milliseconds of its head.
    #[arg(long, default_value_t = 60_000)]
    pub body_timeout_ms: u64,
    /// A connection with no request in hand that moves no byte for this many
    /// milliseconds is closed. Longer than the gateway's
    /// `routing.pool_idle_timeout_ms`, so that the gateway closes first.
    #[arg(long, default_value_t = 120_000)]
    pub idle_timeout_ms: u64,
    /// Client connections open at once, at most; more are closed on arrival.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// The scheduler thread may take this many milliseconds for one turn of its
    /// loop (one decode step, with what it admits); past it `/health` answers 503
    /// and the process exits, for its supervisor to start it again. 0: never.
    #[arg(long, default_value_t = 60_000)]
    pub stuck_timeout_ms: u64,
    /// On SIGTERM, how long running requests may take to finish, in milliseconds;
    /// what still runs then is cut off.
    #[arg(long, default_value_t = 30_000)]
    pub drain_timeout_ms: u64,
    /// While a streamed request waits for a slot or reads its prompt, an SSE
    /// comment is sent this often (milliseconds), so that proxies with idle
    /// timeouts keep the stream open; 0 sends none. Until the first one is sent
    /// the answer can still be a plain 503 that a gateway retries elsewhere.
    #[arg(long, default_value_t = 10_000)]
    pub sse_keepalive_ms: u64,
    /// The environment variable holding the admin key. Loading and unloading
    /// models need it, as `Authorization: Bearer KEY` (without one they are
    /// closed, see `admin_loopback`), and so does the detail of `/slots` (what
    /// each slot holds) when it is set. A gateway gives the engines it starts a
    /// key of its own.
    #[arg(long)]
    pub admin_key_env: Option<String>,
    /// The environment variable holding the key, or keys separated by commas,
    /// that every endpoint but `/health` and the model list then needs, as
    /// `Authorization: Bearer KEY` or `x-api-key` (llama-server's `--api-key`,
    /// kept off the command line). The admin key opens them too.
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// A file with one such key per line (llama-server's `--api-key-file`).
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// Web pages that may call the engine from a browser (CORS): origins
    /// (`https://chat.example.com`), `localhost` (this machine's pages, any
    /// port) or `*` (any, echoed without credentials). Default: none, and no CORS
    /// headers at all (llama-server allows every origin unless told otherwise).
    #[arg(long, value_delimiter = ',')]
    pub cors_origins: Vec<String>,
    /// How many tokens a `/completion` that sets no `n_predict` generates
    /// (llama-server's `--n-predict`; a request's own wins, as there); -1:
    /// until the context is full.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// The temperature of requests that send none (llama-server's `--temp`).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// The `top_k` of requests that send none (llama-server's `--top-k`); 0: off.
    #[arg(long, default_value_t = 40)]
    pub top_k: i32,
    /// The `top_p` of requests that send none (llama-server's `--top-p`); 1: off.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// The `min_p` of requests that send none (llama-server's `--min-p`); 0: off.
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// What Jinja templates get as `enable_thinking` unless a request's
    /// `chat_template_kwargs` say (llama-server's `--reasoning off` is false):
    /// reasoning models' templates then open their answer without thinking.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_thinking: bool,
    /// The sampler seed of requests that send none (llama-server's `--seed`);
    /// -1: a random one each.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
    /// The directory where `POST /slots/{id}?action=save|restore` writes and
    /// reads slot files (llama-server's `--slot-save-path`); unset, those
    /// actions are refused.
    #[arg(long)]
    pub slot_save_path: Option<PathBuf>,
    /// While one model serves, a request naming any other model is served by
    /// it, as llama-server does (clients written for it send `gpt-3.5-turbo`,
    /// the OpenAI library's defaults). Off: such a request is a 404, as
    /// OpenAI's, and as it must be where several models serve.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub any_model_name: bool,
    /// Without an admin key, loading and unloading are refused to everyone;
    /// with this set, they are served to callers on the loopback address.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub admin_loopback: bool,
    /// When set, models may be loaded at run time only from files under this
    /// directory.
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// Log lines as `text` (coloured only on a terminal) or `json` (one object
    /// per line, for log shippers).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: slotgate_http::LogFormat,
    /// Also export the load under vLLM's metric names (`vllm:num_requests_running`,
    /// `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
    /// `vllm:cache_config_info`), which the Gateway API Inference Extension and
    /// llm-d schedule on. Prometheus' linter objects to their `:`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub vllm_metrics: bool,
    /// Also export llama-server's series (`llamacpp:prompt_tokens_total`,
    /// `llamacpp:requests_processing` and the rest, as its `--metrics` does),
    /// process totals for the dashboards written for llama-server.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub llama_server_metrics: bool,
    /// `GET /metrics` answers (llama-server's `--metrics`); off, it is a 501.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_endpoint: bool,
    /// `GET /slots` lists the slots (llama-server's `--slots`); off, it is a 501
    /// (`--no-slots`). A gateway reads it for health and routing: leave it on
    /// behind one.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub slots_endpoint: bool,
    /// Chat and completion answers carry llama-server's `__verbose` (the answer
    /// in `/completion`'s shape, with the prompt as rendered) unless a request
    /// sets `verbose: false`, as llama-server's `--verbose` makes them; off, only
    /// a request that sets `verbose: true` gets it.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub verbose: bool,
    /// After this many seconds without a request, unload every model, freeing
    /// its memory, and load it again when a request needs one (llama-server's
    /// `--sleep-idle-seconds`); the first request then waits for the load.
    /// `/health`, `/props`, the model list, `/slots` and `/metrics` neither
    /// need a model nor wake one. 0: never. Behind a gateway, leave it 0: the
    /// gateway sees a sleeping engine as one with no slots.
    #[arg(long, default_value_t = 0)]
    pub sleep_idle_s: u64,
}

impl ServerSettings {
    /// How long one turn of the scheduler's loop may take, if bounded.
    pub fn stuck_bound(&self) -> Option<std::time::Duration> {
        (self.stuck_timeout_ms > 0).then(|| std::time::Duration::from_millis(self.stuck_timeout_ms))
    }

    /// The bounds on client connections.
    pub fn limits(&self) -> slotgate_http::conn::Limits {
        slotgate_http::conn::Limits::from_ms(
            self.header_timeout_ms,
            self.body_timeout_ms,
            self.idle_timeout_ms,
            self.max_connections,
        )
    }

    /// The SHA-256 of each API key, from `api_key_env` and `api_key_file`; none
    /// leaves the endpoints open. An unset variable, an unreadable file or one
    /// without a key is an error.
    pub fn api_keys(&self) -> Result<Vec<[u8; 32]>, EngineError> {
        let setting =
            |field: &str, reason: String| EngineError::Setting { field: field.into(), reason };
        let mut keys = Vec::new();
        if let Some(var) = &self.api_key_env {
            let value = std::env::var(var)
                .map_err(|_| setting("api_key_env", format!("the variable `{var}` is not set")))?;
            keys.extend(
                value.split(',').map(str::trim).filter(|k| !k.is_empty()).map(String::from),
            );
        }
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| setting("api_key_file", format!("{}: {e}", path.display())))?;
            let lines =
                text.lines().map(str::trim).filter(|k| !k.is_empty() && !k.starts_with('#'));
            let before = keys.len();
            keys.extend(lines.map(String::from));
            if keys.len() == before {
                return Err(setting("api_key_file", format!("{} holds no key", path.display())));
            }
        }
        if self.api_key_env.is_some() && keys.is_empty() {
            return Err(setting("api_key_env", "the variable holds no key".into()));
        }
        Ok(keys.iter().map(|k| slotgate_http::keys::digest(k.as_bytes())).collect())
    }

    /// What a request samples with where it sends nothing: `temperature`,
    /// `top_k`, `top_p` and `min_p`; a bad one names itself.
    pub fn sampling_defaults(&self) -> Result<crate::scheduler::GenParams, EngineError> {
        let bad = |field: &str, reason: &str| {
            Err(EngineError::Setting { field: field.into(), reason: reason.into() })
        };
        if !(0.0..=100.0).contains(&self.temperature) {
            return bad("temperature", "must be from 0 to 100");
        }
        if self.top_k < 0 {
            return bad("top_k", "must not be negative");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "must be above 0 and at most 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "must be from 0 to 1");
        }
        Ok(crate::scheduler::GenParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            ..Default::default()
        })
    }

    /// The admin key's SHA-256, when one is configured; an unset variable is an error.
    pub fn admin_key(&self) -> Result<Option<[u8; 32]>, EngineError> {
        let Some(var) = &self.admin_key_env else { return Ok(None) };
        match std::env::var(var) {
            Ok(key) if !key.is_empty() => Ok(Some(slotgate_http::keys::digest(key.as_bytes()))),
            _ => Err(EngineError::Setting {
                field: "admin_key_env".into(),
                reason: format!("the variable `{var}` is not set"),
            }),
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        defaults()
    }
}

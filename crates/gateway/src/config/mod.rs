//! Settings of the gateway: defaults, then a TOML file (`--config`), then
//! `SLOTGATE_*` environment variables (nested keys joined with `__`), then flags.

pub mod error;
pub mod live;
mod routing;

use std::path::PathBuf;

use clap::Parser;
use figment::providers::{Env, Serialized};
use serde::{Deserialize, Serialize};

use crate::config::error::GatewayError;
pub use crate::fleet::balancer::Policy;
pub use crate::tenancy::config::{AuthConfig, CorsConfig, KeyConfig, Priority};
pub use routing::Routing;

/// An engine or llama.cpp server the gateway forwards to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Base URL, such as `http://127.0.0.1:8081`.
    pub url: String,
    /// Models it serves; default: read from its `/v1/models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Slots it has; default: read from its `/slots`. Set it for a backend without
    /// `/slots` (vLLM: its `max_num_seqs`), whose load is read from `/metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    /// Relative share of traffic among equals.
    #[serde(default = "one")]
    pub weight: u32,
    /// An environment variable holding the backend's own API key, sent as
    /// `Authorization: Bearer` (llama-server's `--api-key`). With `[[keys]]`
    /// configured, a client's key is never passed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

fn one() -> u32 {
    1
}

impl BackendConfig {
    /// The backend at `url`, everything else as a configuration that names
    /// only its URL has it.
    pub fn at(url: impl Into<String>) -> Self {
        Self { url: url.into(), models: None, slots: None, weight: one(), api_key_env: None }
    }

    /// Checks every field; the error names the field and why.
    fn check(&self) -> Result<(), (&'static str, String)> {
        if let Err(why) = crate::fleet::target::Target::parse(&self.url) {
            return Err(("url", why));
        }
        if self.weight == 0 {
            return Err(("weight", "must be at least 1".into()));
        }
        if self.slots == Some(0) {
            return Err(("slots", "must be at least 1".into()));
        }
        if let Some(var) = &self.api_key_env {
            if std::env::var(var).map_or(true, |v| v.is_empty()) {
                return Err(("api_key_env", format!("the variable `{var}` is not set")));
            }
        }
        Ok(())
    }
}

/// A `slotgate-engine` process the gateway starts and supervises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSpec {
    /// Path of the GGUF file.
    pub model: PathBuf,
    /// The name clients send; default: the file name without `.gguf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// Slots of the engine.
    #[serde(default = "four")]
    pub n_parallel: u32,
    /// Context per slot.
    #[serde(default = "ctx_len")]
    pub ctx_len: u32,
    /// GPU index; sets `CUDA_VISIBLE_DEVICES` for the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// More flags for `slotgate-engine`.
    #[serde(default)]
    pub args: Vec<String>,
    /// The engine binary; default: `slotgate-engine` next to the gateway's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<PathBuf>,
}

fn four() -> u32 {
    4
}

fn ctx_len() -> u32 {
    4096
}

/// All settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address to listen on; port 0 picks a free one.
    pub listen: String,
    /// Backends to forward to.
    pub backends: Vec<BackendConfig>,
    /// Engines to start and supervise; each becomes a backend.
    pub engines: Vec<EngineSpec>,
    /// Routing, queueing, retries and health checks.
    pub routing: Routing,
    /// On shutdown, how long in-flight requests may take to finish.
    pub drain_timeout_ms: u64,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Threads that serve clients, each proxying its own connections (a new
    /// connection goes to the one with the fewest open); 0 means one per core.
    pub workers: usize,
    /// Other names for served models (`"gpt-4o-mini" = "gemma-3-270m-q4_k_m"`):
    /// listed in `/v1/models`, and sent to the backend under the model's name.
    pub aliases: std::collections::BTreeMap<String, String>,
    /// The admin key, and Redis for limits shared between replicas.
    pub auth: AuthConfig,
    /// Client keys; none: the gateway is open.
    pub keys: Vec<KeyConfig>,
    /// Browser origins allowed to call the gateway.
    pub cors: CorsConfig,
    /// This gateway's name to the engines (`x-slotgate-replica`), so that
    /// replicas can tell their requests apart; default: made at start.
    pub replica_id: Option<String>,
    /// How backends named by DNS (`dns+http://`, `dnssrv+http://`) are resolved.
    pub discovery: DiscoveryConfig,
    /// Log lines as `text` (coloured only on a terminal) or `json`.
    pub log_format: slotgate_http::LogFormat,
    /// Bounds on client connections.
    pub connections: Connections,
}

/// Bounds on client connections: a slow or idle client holds no socket for long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Connections {
    /// A request's head must arrive within this many milliseconds of its first byte.
    pub header_timeout_ms: u64,
    /// A request's body must arrive within this many milliseconds of its head.
    pub body_timeout_ms: u64,
    /// A connection with no request in hand that moves no byte for this many
    /// milliseconds is closed.
    pub idle_timeout_ms: u64,
    /// Client connections open at once, at most; more are closed on arrival.
    pub max_connections: usize,
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            header_timeout_ms: 30_000,
            body_timeout_ms: 60_000,
            idle_timeout_ms: 60_000,
            max_connections: 4096,
        }
    }
}

impl Connections {
    /// As the HTTP server takes them.
    pub fn limits(&self) -> slotgate_http::conn::Limits {
        slotgate_http::conn::Limits::from_ms(
            self.header_timeout_ms,
            self.body_timeout_ms,
            self.idle_timeout_ms,
            self.max_connections,
        )
    }
}

/// DNS discovery: a backend URL `dns+http://NAME:PORT` stands for every A and
/// AAAA record of NAME, and `dnssrv+http://NAME` for every SRV record of NAME
/// (each target's addresses at the record's port).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// How often each name is resolved again.
    pub interval_ms: u64,
    /// Name servers to ask, as `IP:PORT`; empty: the system's (`/etc/resolv.conf`).
    pub nameservers: Vec<String>,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self { interval_ms: 5_000, nameservers: Vec::new() }
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            backends: Vec::new(),
            engines: Vec::new(),
            routing: Routing::default(),
            drain_timeout_ms: 30_000,
            max_body_bytes: 16 * 1024 * 1024,
            workers: 0,
            aliases: std::collections::BTreeMap::new(),
            auth: AuthConfig::default(),
            keys: Vec::new(),
            cors: CorsConfig::default(),
            replica_id: None,
            discovery: DiscoveryConfig::default(),
            log_format: slotgate_http::LogFormat::Text,
            connections: Connections::default(),
        }
    }
}

/// Command-line flags.
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "slotgate", version, about = "Slot-aware OpenAI gateway for llama.cpp engines")]
pub struct Cli {
    /// A TOML file of settings (see config/gateway.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long)]
    pub listen: Option<String>,
    /// A backend URL; repeat for several. Added to those of the file.
    #[arg(long = "backend")]
    pub backends: Vec<String>,
    /// Log lines as `text` or `json` [default: text].
    #[arg(long, value_enum)]
    pub log_format: Option<slotgate_http::LogFormat>,
}

impl GatewayConfig {
    /// Layers defaults, the file, the environment and the flags, and validates.
    pub fn load(cli: &Cli) -> Result<Self, GatewayError> {
        let figment =
            slotgate_http::settings::defaults_and_file(&Self::default(), cli.config.as_deref());
        let mut figment = figment.map_err(GatewayError::Config)?;
        // SLOTGATE_ is shared with other variables (the engine's SLOTGATE_ENGINE_*,
        // the tests' SLOTGATE_TEST_*): only the gateway's own top-level keys are read.
        let keys = slotgate_http::settings::field_names::<Self>();
        let env = Env::prefixed("SLOTGATE_")
            .filter(move |key| {
                let key = key.as_str().to_ascii_lowercase();
                keys.iter().any(|k| key.starts_with(k.as_str()))
            })
            .split("__");
        figment = figment.merge(env);
        if let Some(listen) = &cli.listen {
            figment = figment.merge(Serialized::default("listen", listen));
        }
        if let Some(format) = cli.log_format {
            figment = figment.merge(Serialized::default("log_format", format));
        }
        let mut config: Self =
            figment.extract().map_err(|e| GatewayError::Config(e.to_string()))?;
        config.backends.extend(cli.backends.iter().map(BackendConfig::at));
        config.validate()?;
        Ok(config)
    }

    /// Checks every field; the error names it.
    pub fn validate(&self) -> Result<(), GatewayError> {
        let bad =
            |field: String, reason: String| Err(GatewayError::Config(format!("{field}: {reason}")));
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return bad(
                "listen".into(),
                format!("`{}` is not an address such as 127.0.0.1:8080", self.listen),
            );
        }
        for (i, b) in self.backends.iter().enumerate() {
            b.check().map_err(|(field, why)| {
                GatewayError::Config(format!("backends[{i}].{field}: {why}"))
            })?;
        }
        for (i, ns) in self.discovery.nameservers.iter().enumerate() {
            if ns.parse::<std::net::SocketAddr>().is_err() {
                return bad(
                    format!("discovery.nameservers[{i}]"),
                    format!("`{ns}` is not an address such as 127.0.0.1:53"),
                );
            }
        }
        if self.discovery.interval_ms < 100 {
            return bad("discovery.interval_ms".into(), "must be at least 100".into());
        }
        for (i, e) in self.engines.iter().enumerate() {
            if !e.model.is_file() {
                return bad(
                    format!("engines[{i}].model"),
                    format!("{} is not a readable file", e.model.display()),
                );
            }
            if e.n_parallel == 0 {
                return bad(format!("engines[{i}].n_parallel"), "must be at least 1".into());
            }
        }
        if self.backends.is_empty() && self.engines.is_empty() {
            return bad(
                "backends".into(),
                "give at least one backend (--backend URL) or [[engines]]".into(),
            );
        }
        self.routing.check().map_err(GatewayError::Config)?;
        let config_error = GatewayError::Config;
        crate::tenancy::config::check_keys(&self.keys).map_err(config_error)?;
        self.auth.check().map_err(config_error)?;
        self.cors.check().map_err(config_error)?;
        Ok(())
    }
}

#[cfg(test)]
// figment's Jail returns its large error type from the test closures.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn layers_file_env_and_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "gw.toml",
                "listen = \"127.0.0.1:9000\"\n[[backends]]\nurl = \"http://127.0.0.1:8081\"\nweight = 3\n\
                 [routing]\nqueue_size = 5\nmax_attempts = 4\n",
            )?;
            jail.set_env("SLOTGATE_ROUTING__QUEUE_SIZE", "7");
            jail.set_env("SLOTGATE_ENGINE_N_PARALLEL", "2");
            jail.set_env("SLOTGATE_TEST_MODEL", "/x.gguf");
            jail.set_env("SLOTGATE_ROUTING__POLICY", "least_requests");
            let cli = Cli {
                config: Some("gw.toml".into()),
                listen: Some("127.0.0.1:0".into()),
                backends: vec!["http://127.0.0.1:8082".into()],
                log_format: Some(slotgate_http::LogFormat::Json),
            };
            let config = GatewayConfig::load(&cli).unwrap();
            assert_eq!(config.log_format, slotgate_http::LogFormat::Json, "flag");
            assert_eq!(config.listen, "127.0.0.1:0", "flag over file");
            assert_eq!(config.routing.queue_size, 7, "env over file");
            assert_eq!(config.routing.max_attempts, 4, "file over default");
            assert_eq!(config.routing.policy, Policy::LeastRequests);
            assert_eq!(config.routing.retry_backoff_ms, 25, "default");
            assert_eq!(config.backends.len(), 2);
            assert_eq!(config.backends[0].weight, 3);
            assert_eq!(config.backends[1].url, "http://127.0.0.1:8082");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        figment::Jail::expect_with(|jail| {
            let backend = || vec!["http://127.0.0.1:8081".to_owned()];
            jail.create_file("a.toml", "[routing]\nqueue_sise = 3\n")?;
            let err = GatewayConfig::load(&Cli {
                config: Some("a.toml".into()),
                backends: backend(),
                ..Cli::default()
            })
            .unwrap_err()
            .to_string();
            assert!(err.contains("queue_sise"), "{err}");
            jail.create_file("b.toml", "[[backends]]\nurl = \"ftp://x\"\n")?;
            let err = GatewayConfig::load(&Cli { config: Some("b.toml".into()), ..Cli::default() })
                .unwrap_err()
                .to_string();
            assert!(err.contains("backends[0].url"), "{err}");
            let err = GatewayConfig::load(&Cli::default()).unwrap_err().to_string();
            assert!(err.contains("at least one backend"), "{err}");
            let err = GatewayConfig::load(&Cli {
                listen: Some("nowhere".into()),
                backends: backend(),
                ..Cli::default()
            })
            .unwrap_err()
            .to_string();
            assert!(err.contains("listen"), "{err}");
            let keyed = |name: &str, body: &str| -> Result<String, figment::Error> {
                jail.create_file(
                    name,
                    &format!("[[backends]]\nurl = \"http://127.0.0.1:1\"\n{body}"),
                )?;
                let cli = Cli { config: Some(name.into()), ..Cli::default() };
                Ok(GatewayConfig::load(&cli).unwrap_err().to_string())
            };
            let key = "[[keys]]\nname = \"a\"\nkey = \"sk-a\"\n";
            let err = keyed("k1.toml", &format!("{key}rate = 3\n"))?;
            assert!(err.contains("rate"), "unknown key field: {err}");
            let err = keyed("k2.toml", &format!("{key}[[keys]]\nname = \"a\"\nkey = \"sk-b\"\n"))?;
            assert!(err.contains("keys[1].name"), "duplicate name: {err}");
            let both = format!("{key}key_sha256 = \"{}\"\n", "0".repeat(64));
            let err = keyed("k3.toml", &both)?;
            assert!(err.contains("keys[0]") && err.contains("only one"), "hashed and plain: {err}");
            let err = keyed("k4.toml", &format!("{key}max_concurrent = 0\n"))?;
            assert!(err.contains("keys[0].max_concurrent"), "a limit of 0: {err}");
            let err = keyed("k5.toml", "[auth]\nadmin_key_env = \"SLOTGATE_TEST_UNSET_ADMIN\"\n")?;
            assert!(err.contains("auth.admin_key_env"), "{err}");
            let err = keyed("k6.toml", "[cors]\nallowed_origins = [\"example.com\"]\n")?;
            assert!(err.contains("cors.allowed_origins[0]"), "{err}");
            jail.set_env("SLOTGATE_ROUTING__MAX_ATTEMPTS", "0");
            let err = GatewayConfig::load(&Cli { backends: backend(), ..Cli::default() })
                .unwrap_err()
                .to_string();
            assert!(err.contains("routing.max_attempts"), "{err}");
            Ok(())
        });
    }
}

//! Settings of the engine: defaults, then a TOML file (`--config`), then
//! `SLOTGATE_ENGINE_*` environment variables, then CLI flags, layered with figment.

use std::path::{Path, PathBuf};

use clap::Parser;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::template::ChatTemplate;

/// Everything one model needs to be served: the file and its slots, queue and
/// template. `POST /v1/models/load` takes the same fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelSettings {
    /// Path of the GGUF file.
    pub model: Option<PathBuf>,
    /// The name clients send; default: the file name without `.gguf`.
    pub model_id: Option<String>,
    /// Context of each slot, in tokens.
    pub ctx_len: u32,
    /// Number of slots: requests decoded together.
    pub n_parallel: u32,
    /// Admit new requests while others are still reading their prompts.
    pub cont_batching: bool,
    /// Layers offloaded to the GPU (needs the `cuda` feature).
    pub ngl: u32,
    /// CPU threads for decoding; default: every core.
    pub threads: Option<u32>,
    /// Most tokens decoded in one step (prompt chunks included).
    pub batch_size: u32,
    /// Requests that may wait for a slot; 0 means none wait.
    pub queue_size: u32,
    /// How long a request may wait for a slot.
    pub queue_timeout_ms: u64,
    /// `auto`, a built-in name (`gemma`, `chatml`, `llama3`), or `model` for the
    /// template stored in the GGUF. Ignored when the three prompts below are set.
    pub chat_template: String,
    /// Nitro's template form: text before the system message.
    pub pre_prompt: Option<String>,
    /// Nitro's template form: text before each user message.
    pub user_prompt: Option<String>,
    /// Nitro's template form: text before each assistant message.
    pub ai_prompt: Option<String>,
    /// Serve `/v1/embeddings` for this model.
    pub embedding: bool,
    /// Share of a prompt that an idle slot's cache must hold for the slot to be
    /// reused for it (llama-server's `--slot-prompt-similarity`); 0 takes any
    /// shared prefix.
    pub slot_prompt_similarity: f32,
    /// Host memory, in MiB, for the KV states of conversations that had to leave
    /// their slot (llama-server's `--cache-ram`); 0 disables it.
    pub cache_ram_mib: u64,
}

impl Default for ModelSettings {
    fn default() -> Self {
        Self {
            model: None,
            model_id: None,
            ctx_len: 4096,
            n_parallel: 4,
            cont_batching: true,
            ngl: 0,
            threads: None,
            batch_size: 512,
            queue_size: 64,
            queue_timeout_ms: 30_000,
            chat_template: "auto".into(),
            pre_prompt: None,
            user_prompt: None,
            ai_prompt: None,
            embedding: false,
            slot_prompt_similarity: 0.1,
            cache_ram_mib: 8192,
        }
    }
}

/// A chat template as configured, before the model's metadata is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateChoice {
    /// Pick from the model's metadata.
    Auto,
    /// This one.
    Fixed(ChatTemplate),
}

impl ModelSettings {
    /// Checks every field; the error names the field and the reason.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad =
            |field: &str, reason: String| Err(EngineError::Setting { field: field.into(), reason });
        match &self.model {
            None => return bad("model", "a model path is required".into()),
            Some(path) if !path.is_file() => {
                return bad("model", format!("{} is not a readable file", path.display()));
            }
            Some(_) => {}
        }
        if self.model_id.as_deref().is_some_and(str::is_empty) {
            return bad("model_id", "must not be empty".into());
        }
        if !(1..=256).contains(&self.n_parallel) {
            return bad(
                "n_parallel",
                format!("must be between 1 and 256, got {}", self.n_parallel),
            );
        }
        if self.ctx_len < 32 {
            return bad("ctx_len", format!("must be at least 32, got {}", self.ctx_len));
        }
        if self.batch_size < 1 {
            return bad("batch_size", "must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.slot_prompt_similarity) {
            return bad(
                "slot_prompt_similarity",
                format!("must be between 0 and 1, got {}", self.slot_prompt_similarity),
            );
        }
        if self.threads == Some(0) {
            return bad("threads", "must be at least 1".into());
        }
        let prompts = [&self.pre_prompt, &self.user_prompt, &self.ai_prompt];
        let set = prompts.iter().filter(|p| p.is_some()).count();
        if set != 0 && set != 3 {
            return bad("user_prompt", "pre_prompt, user_prompt and ai_prompt go together".into());
        }
        if set == 0
            && self.chat_template != "auto"
            && ChatTemplate::by_name(&self.chat_template).is_none()
        {
            return bad(
                "chat_template",
                format!(
                    "unknown template `{}`; expected one of {}",
                    self.chat_template,
                    ChatTemplate::NAMES
                ),
            );
        }
        Ok(())
    }

    /// The path of the model file. Call after [`ModelSettings::validate`].
    pub fn path(&self) -> &Path {
        self.model.as_deref().unwrap_or(Path::new(""))
    }

    /// The name clients send: `model_id`, or the file name without `.gguf`.
    pub fn id(&self) -> String {
        if let Some(id) = &self.model_id {
            return id.clone();
        }
        let name = self.path().file_name().and_then(|n| n.to_str()).unwrap_or("model");
        name.strip_suffix(".gguf").unwrap_or(name).to_owned()
    }

    /// The chat template asked for.
    pub fn template(&self) -> TemplateChoice {
        if let (Some(pre), Some(user), Some(ai)) =
            (&self.pre_prompt, &self.user_prompt, &self.ai_prompt)
        {
            return TemplateChoice::Fixed(ChatTemplate::Prompts {
                pre_prompt: pre.clone(),
                user_prompt: user.clone(),
                ai_prompt: ai.clone(),
            });
        }
        match ChatTemplate::by_name(&self.chat_template) {
            Some(t) => TemplateChoice::Fixed(t),
            None => TemplateChoice::Auto,
        }
    }

    /// Decoding threads: `threads`, or every core.
    pub fn threads(&self) -> u32 {
        self.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(4)
        })
    }
}

/// The whole engine's settings: where it listens, and the model it starts with.
///
/// The model's settings sit at the top level of the file and the environment, next
/// to the server's. serde's `flatten` would hide the key of a bad value from
/// figment's errors, so [`EngineConfig::load`] extracts the two halves one by one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineConfig {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on; 0 picks a free one.
    pub port: u16,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// The model loaded at start.
    #[serde(flatten)]
    pub model: ModelSettings,
}

/// The server's half of [`EngineConfig`].
#[derive(Debug, Deserialize)]
struct ServerSettings {
    host: String,
    port: u16,
    max_body_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8081,
            max_body_bytes: 4 * 1024 * 1024,
            model: ModelSettings::default(),
        }
    }
}

/// Command-line flags; each overrides the file and the environment.
#[derive(Debug, Default, Parser, Serialize)]
#[command(name = "slotgate-engine", version, about = "llama.cpp behind OpenAI endpoints")]
pub struct Cli {
    /// A TOML file of settings.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Port to listen on; 0 picks a free one [default: 8081].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Largest request body accepted, in bytes [default: 4194304].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<usize>,
    /// Path of the GGUF model file.
    #[arg(long, short = 'm')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// Name clients send [default: the file name without .gguf].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// Context of each slot, in tokens [default: 4096].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctx_len: Option<u32>,
    /// Number of slots [default: 4].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_parallel: Option<u32>,
    /// Admit requests while others read their prompts [default: true].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cont_batching: Option<bool>,
    /// Layers on the GPU [default: 0].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngl: Option<u32>,
    /// Decoding threads [default: every core].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// Most tokens decoded in one step [default: 512].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    /// Requests that may wait for a slot; 0: none wait [default: 64].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_size: Option<u32>,
    /// How long a request may wait for a slot [default: 30000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_timeout_ms: Option<u64>,
    /// auto, gemma, chatml, llama3, or model (the GGUF's own) [default: auto].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// Nitro's template form: text before the system message.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pre_prompt: Option<String>,
    /// Nitro's template form: text before each user message.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_prompt: Option<String>,
    /// Nitro's template form: text before each assistant message.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ai_prompt: Option<String>,
    /// Serve /v1/embeddings [default: false].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding: Option<bool>,
    /// Share of a prompt an idle slot must hold to be reused for it [default: 0.1].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot_prompt_similarity: Option<f32>,
    /// MiB of host memory for conversations that left their slot; 0: off [default: 8192].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_ram_mib: Option<u64>,
}

impl EngineConfig {
    /// Layers defaults, the `--config` file, the environment and the flags, and
    /// validates the result.
    pub fn load(cli: &Cli) -> Result<Self, EngineError> {
        let mut figment = Figment::from(Serialized::defaults(Self::default()));
        if let Some(path) = &cli.config {
            if !path.is_file() {
                return Err(EngineError::Config(format!(
                    "config: {} is not a readable file",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file(path));
        }
        let figment =
            figment.merge(Env::prefixed("SLOTGATE_ENGINE_")).merge(Serialized::defaults(cli));
        let keys: figment::value::Dict =
            figment.extract().map_err(|e| EngineError::Config(e.to_string()))?;
        reject_unknown_keys(keys.keys().map(String::as_str), &Self::default())?;
        let err = |e: figment::Error| EngineError::Config(e.to_string());
        let server: ServerSettings = figment.extract().map_err(err)?;
        let model: ModelSettings = figment.extract().map_err(err)?;
        let config = Self {
            host: server.host,
            port: server.port,
            max_body_bytes: server.max_body_bytes,
            model,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks every field; the error names the field and the reason.
    pub fn validate(&self) -> Result<(), EngineError> {
        if self.host.is_empty() {
            return Err(EngineError::Setting {
                field: "host".into(),
                reason: "must not be empty".into(),
            });
        }
        if self.max_body_bytes < 1024 {
            return Err(EngineError::Setting {
                field: "max_body_bytes".into(),
                reason: format!("must be at least 1024, got {}", self.max_body_bytes),
            });
        }
        self.model.validate()
    }
}

/// Fails on the first key that `known` does not have when serialized: every field
/// of these structs serializes, so its keys are exactly the accepted ones.
pub fn reject_unknown_keys<'a, T: Serialize>(
    keys: impl IntoIterator<Item = &'a str>,
    known: &T,
) -> Result<(), EngineError> {
    let known = serde_json::to_value(known).map_err(|e| EngineError::Config(e.to_string()))?;
    for key in keys {
        if known.get(key).is_none() {
            return Err(EngineError::Config(format!("unknown setting `{key}`")));
        }
    }
    Ok(())
}

#[cfg(test)]
// figment's Jail returns its large error type from the test closures.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    fn model_file(dir: &Path) -> PathBuf {
        let path = dir.join("tiny-model.gguf");
        std::fs::write(&path, b"GGUF").unwrap();
        path
    }

    #[test]
    fn layers_file_env_and_flags_in_order() {
        figment::Jail::expect_with(|jail| {
            let model = model_file(jail.directory());
            jail.create_file(
                "engine.toml",
                &format!("model = {:?}\nn_parallel = 2\nqueue_size = 7\nport = 9000\n", model),
            )?;
            jail.set_env("SLOTGATE_ENGINE_N_PARALLEL", "3");
            jail.set_env("SLOTGATE_ENGINE_CTX_LEN", "1024");
            let cli =
                Cli { config: Some("engine.toml".into()), ctx_len: Some(2048), ..Cli::default() };
            let config = EngineConfig::load(&cli).unwrap();
            assert_eq!(config.port, 9000, "file");
            assert_eq!(config.model.queue_size, 7, "file");
            assert_eq!(config.model.n_parallel, 3, "env over file");
            assert_eq!(config.model.ctx_len, 2048, "flag over env");
            assert_eq!(config.model.batch_size, 512, "default");
            assert_eq!(config.model.id(), "tiny-model");
            Ok(())
        });
    }

    #[test]
    fn errors_name_the_field() {
        figment::Jail::expect_with(|jail| {
            let model = model_file(jail.directory());
            let base = || Cli { model: Some(model.clone()), ..Cli::default() };
            let cases = [
                (Cli { n_parallel: Some(0), ..base() }, "n_parallel: must be between 1 and 256"),
                (Cli { ctx_len: Some(4), ..base() }, "ctx_len: must be at least 32"),
                (
                    Cli { slot_prompt_similarity: Some(1.5), ..base() },
                    "slot_prompt_similarity: must be between 0 and 1",
                ),
                (
                    Cli { chat_template: Some("jinja".into()), ..base() },
                    "chat_template: unknown template `jinja`",
                ),
                (
                    Cli { pre_prompt: Some("x".into()), ..base() },
                    "pre_prompt, user_prompt and ai_prompt go together",
                ),
                (
                    Cli { model: Some("/nonexistent.gguf".into()), ..Cli::default() },
                    "model: /nonexistent.gguf is not a readable file",
                ),
                (Cli::default(), "model: a model path is required"),
            ];
            for (cli, want) in cases {
                let err = EngineConfig::load(&cli).unwrap_err().to_string();
                assert!(err.contains(want), "`{err}` lacks `{want}`");
            }
            jail.create_file("bad.toml", "n_paralel = 3\n")?;
            let cli = Cli { config: Some("bad.toml".into()), ..base() };
            let err = EngineConfig::load(&cli).unwrap_err().to_string();
            assert!(err.contains("unknown setting `n_paralel`"), "{err}");
            jail.set_env("SLOTGATE_ENGINE_QUEUE_SIZE", "many");
            let err = EngineConfig::load(&base()).unwrap_err().to_string();
            assert!(err.to_lowercase().contains("for key \"queue_size\""), "{err}");
            Ok(())
        });
    }
}

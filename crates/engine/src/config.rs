//! Settings of the engine: defaults, then a TOML file (`--config`), then
//! `SLOTGATE_ENGINE_*` environment variables, then CLI flags, layered with figment.
//!
//! Each setting is declared once, as a field that is also its flag: the flag's
//! `default_value` is the setting's default, its doc comment the help text and
//! the documentation. [`Cli`] records which flags were given, so that only those
//! override the file and the environment.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Tag};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::template::ChatTemplate;

/// Everything one model needs to be served: the file and its slots, queue and
/// template. `POST /v1/models/load` takes the same fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Args)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSettings {
    /// Path of the GGUF model file.
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// The name clients send [default: the file name without .gguf].
    #[arg(long)]
    pub model_id: Option<String>,
    /// Other names clients may send for this model (`gpt-4o-mini`, say); each is
    /// listed in `/v1/models` and answered as the model.
    #[arg(long = "alias", value_delimiter = ',')]
    pub aliases: Vec<String>,
    /// Context of each slot, in tokens.
    #[arg(long, default_value_t = 4096)]
    pub ctx_len: u32,
    /// Number of slots: requests decoded together.
    #[arg(long, default_value_t = 4)]
    pub n_parallel: u32,
    /// Admit new requests while others are still reading their prompts.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub cont_batching: bool,
    /// Layers offloaded to the GPU (needs the `cuda` feature).
    #[arg(long, default_value_t = 0)]
    pub ngl: u32,
    /// CPU threads for decoding [default: every core].
    #[arg(long)]
    pub threads: Option<u32>,
    /// Most tokens decoded in one step (prompt chunks included).
    #[arg(long, default_value_t = 512)]
    pub batch_size: u32,
    /// Requests that may wait for a slot; 0 means none wait.
    #[arg(long, default_value_t = 64)]
    pub queue_size: u32,
    /// How long a request may wait for a slot, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub queue_timeout_ms: u64,
    /// `auto`, a built-in name (`gemma`, `chatml`, `llama3`), `jinja` for the
    /// GGUF's own template rendered as Jinja, or `model` for the GGUF's template
    /// through llama.cpp's detection. `auto` is `jinja` when the GGUF has a
    /// template. Ignored when `chat_template_file` or the three prompts are set.
    #[arg(long, default_value = "auto")]
    pub chat_template: String,
    /// A Jinja chat template to render conversations with, from this file.
    #[arg(long)]
    pub chat_template_file: Option<PathBuf>,
    /// Nitro's template form: text before the system message.
    #[arg(long)]
    pub pre_prompt: Option<String>,
    /// Nitro's template form: text before each user message.
    #[arg(long)]
    pub user_prompt: Option<String>,
    /// Nitro's template form: text before each assistant message.
    #[arg(long)]
    pub ai_prompt: Option<String>,
    /// Serve `/v1/embeddings` for this model.
    #[arg(long, default_value_t = false, action = ArgAction::Set)]
    pub embedding: bool,
    /// Share of a prompt that an idle slot's cache must hold for the slot to be
    /// reused for it (llama-server's `--slot-prompt-similarity`); 0 takes any
    /// shared prefix.
    #[arg(long, default_value_t = 0.1)]
    pub slot_prompt_similarity: f32,
    /// Host memory, in MiB, for the KV states of conversations that had to leave
    /// their slot (llama-server's `--cache-ram`); 0 disables it.
    #[arg(long, default_value_t = 8192)]
    pub cache_ram_mib: u64,
}

impl Default for ModelSettings {
    fn default() -> Self {
        defaults()
    }
}

/// Where the engine listens and how it answers, apart from any model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Args)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 8081)]
    pub port: u16,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,
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
    /// The environment variable holding the admin key. When set, loading and
    /// unloading models and the detail of `/slots` (what each slot holds) need
    /// it, as `Authorization: Bearer KEY`. A gateway gives the engines it
    /// starts a key of its own.
    #[arg(long)]
    pub admin_key_env: Option<String>,
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
}

impl ServerSettings {
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

/// The defaults of a group of settings: their flags parsed from an empty command line.
fn defaults<T: Args + FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults"));
    let matches = command.try_get_matches_from(["defaults"]);
    // Cannot fail: every flag is optional, and every default parses (the unit
    // tests build every default).
    T::from_arg_matches(&matches.expect("settings without defaults"))
        .expect("settings without defaults")
}

/// The keys of a group of settings: the ids of its flags, which clap takes from
/// the field names, as serde does.
fn keys<T: Args>() -> BTreeSet<String> {
    T::augment_args(clap::Command::new("keys"))
        .get_arguments()
        .map(|arg| arg.get_id().as_str().to_owned())
        .collect()
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
        if let Some(alias) = self.aliases.iter().find(|a| a.is_empty() || **a == self.id()) {
            return bad("aliases", format!("`{alias}` is empty or the model's own name"));
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
        // llama.cpp reserves one output per sequence in every batch, and aborts
        // the whole process (`GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max)`)
        // when a batch cannot hold one token of each slot.
        if self.batch_size < self.n_parallel {
            return bad(
                "batch_size",
                format!(
                    "must be at least n_parallel ({}), since each step decodes one token of \
                     every slot; got {}",
                    self.n_parallel, self.batch_size
                ),
            );
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
        if let Some(file) = self.chat_template_file.as_ref().filter(|f| !f.is_file()) {
            return bad("chat_template_file", format!("{} is not a readable file", file.display()));
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
        if self.chat_template_file.is_some() {
            return TemplateChoice::Fixed(ChatTemplate::Jinja);
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

/// The whole engine's settings: how it serves, and the model it starts with.
///
/// Both halves sit at the top level of the file and the environment. serde's
/// `flatten` would hide the key of a bad value from figment's errors, so
/// [`EngineConfig::load`] extracts the two halves one by one, each from the keys
/// that are not the other's.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EngineConfig {
    /// Address, limits, drain and keep-alive.
    #[serde(flatten)]
    pub server: ServerSettings,
    /// The model loaded at start.
    #[serde(flatten)]
    pub model: ModelSettings,
}

/// Command-line flags; those given override the file and the environment.
#[derive(Debug, Parser)]
#[command(name = "slotgate-engine", version, about = "llama.cpp behind OpenAI endpoints")]
pub struct Cli {
    /// A TOML file of settings.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    server: ServerSettings,
    #[command(flatten)]
    model: ModelSettings,
    /// The settings given on the command line, by key.
    #[arg(skip)]
    given: BTreeSet<String>,
}

impl Cli {
    /// Parses a command line (the program's name first).
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Self::command().try_get_matches_from(args)?;
        let mut cli = Self::from_arg_matches(&matches)?;
        cli.given = matches
            .ids()
            .filter(|id| matches.value_source(id.as_str()) == Some(ValueSource::CommandLine))
            .map(|id| id.as_str().to_owned())
            .collect();
        Ok(cli)
    }

    /// The settings given on the command line, as figment data.
    fn given(&self) -> Result<Dict, EngineError> {
        let all = serde_json::to_value(EngineConfig {
            server: self.server.clone(),
            model: self.model.clone(),
        })
        .and_then(serde_json::from_value::<Dict>)
        .map_err(|e| EngineError::Config(e.to_string()))?;
        Ok(all.into_iter().filter(|(key, _)| self.given.contains(key)).collect())
    }
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
        let figment = figment
            .merge(Env::prefixed("SLOTGATE_ENGINE_"))
            .merge(Serialized::defaults(cli.given()?));
        let err = |e: figment::Error| EngineError::Config(e.to_string());
        let server_keys = keys::<ServerSettings>();
        // Keys of neither half go with the model's, whose serde denies them.
        let server = Figment::from(Only { figment: &figment, keys: &server_keys, keep: true })
            .extract()
            .map_err(err)?;
        let model = Figment::from(Only { figment: &figment, keys: &server_keys, keep: false })
            .extract()
            .map_err(err)?;
        let config = Self { server, model };
        config.validate()?;
        Ok(config)
    }

    /// Checks every field; the error names the field and the reason.
    pub fn validate(&self) -> Result<(), EngineError> {
        if self.server.host.is_empty() {
            return Err(EngineError::Setting {
                field: "host".into(),
                reason: "must not be empty".into(),
            });
        }
        self.server.admin_key()?;
        if self.server.max_body_bytes < 1024 {
            return Err(EngineError::Setting {
                field: "max_body_bytes".into(),
                reason: format!("must be at least 1024, got {}", self.server.max_body_bytes),
            });
        }
        self.model.validate()
    }
}

/// The keys of a figment that are in `keys` (`keep`) or not in them (`!keep`).
struct Only<'a> {
    figment: &'a Figment,
    keys: &'a BTreeSet<String>,
    keep: bool,
}

impl Provider for Only<'_> {
    fn metadata(&self) -> Metadata {
        Metadata::named("engine settings")
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut data = self.figment.data()?;
        for dict in data.values_mut() {
            dict.retain(|key, _| self.keys.contains(key) == self.keep);
        }
        Ok(data)
    }

    // Hands on where each value came from (file, variable, flag), so that errors
    // still name it; figment's own `Figment` provider does the same.
    fn __metadata_map(&self) -> Option<Map<Tag, Metadata>> {
        self.figment.__metadata_map()
    }
}

#[cfg(test)]
// figment's Jail returns its large error type from the test closures.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        let all = std::iter::once("slotgate-engine").chain(args.iter().copied());
        Cli::try_parse_args(all).unwrap()
    }

    #[test]
    fn every_default_parses_and_flags_match_keys() {
        let config = EngineConfig::default();
        assert_eq!(config.model.ctx_len, 4096);
        assert!(config.model.cont_batching);
        assert_eq!(config.server.port, 8081);
        let all: serde_json::Map<String, serde_json::Value> =
            serde_json::from_value(serde_json::to_value(&config).unwrap()).unwrap();
        let mut flags = keys::<ServerSettings>();
        flags.extend(keys::<ModelSettings>());
        // Options that are unset do not serialize; every other key is a flag.
        for key in all.keys() {
            assert!(flags.contains(key), "{key} has no flag");
        }
    }

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
            let cli = cli(&["--config", "engine.toml", "--ctx-len", "2048"]);
            let config = EngineConfig::load(&cli).unwrap();
            assert_eq!(config.server.port, 9000, "file");
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
            let model = model.to_str().unwrap();
            let with_model = |more: &[&str]| {
                let mut args = vec!["--model", model];
                args.extend_from_slice(more);
                cli(&args)
            };
            let cases = [
                (with_model(&["--n-parallel", "0"]), "n_parallel: must be between 1 and 256"),
                (with_model(&["--ctx-len", "4"]), "ctx_len: must be at least 32"),
                (
                    with_model(&["--n-parallel", "4", "--batch-size", "3"]),
                    "batch_size: must be at least n_parallel (4)",
                ),
                (
                    with_model(&["--slot-prompt-similarity", "1.5"]),
                    "slot_prompt_similarity: must be between 0 and 1",
                ),
                (
                    with_model(&["--chat-template", "jinja2"]),
                    "chat_template: unknown template `jinja2`",
                ),
                (
                    with_model(&["--chat-template-file", "/nonexistent.jinja"]),
                    "chat_template_file: /nonexistent.jinja is not a readable file",
                ),
                (
                    with_model(&["--pre-prompt", "x"]),
                    "pre_prompt, user_prompt and ai_prompt go together",
                ),
                (
                    cli(&["--model", "/nonexistent.gguf"]),
                    "model: /nonexistent.gguf is not a readable file",
                ),
                (cli(&[]), "model: a model path is required"),
            ];
            for (cli, want) in cases {
                let err = EngineConfig::load(&cli).unwrap_err().to_string();
                assert!(err.contains(want), "`{err}` lacks `{want}`");
            }
            jail.create_file("bad.toml", "n_paralel = 3\n")?;
            let err =
                EngineConfig::load(&with_model(&["--config", "bad.toml"])).unwrap_err().to_string();
            assert!(err.contains("unknown field: found `n_paralel`"), "{err}");
            jail.set_env("SLOTGATE_ENGINE_QUEUE_SIZE", "many");
            let err = EngineConfig::load(&with_model(&[])).unwrap_err().to_string();
            assert!(err.to_lowercase().contains("for key \"queue_size\""), "{err}");
            assert!(err.contains("SLOTGATE_ENGINE_"), "names the variables: {err}");
            Ok(())
        });
    }

    #[test]
    fn a_flag_given_overrides_and_one_not_given_does_not() {
        figment::Jail::expect_with(|jail| {
            let model = model_file(jail.directory());
            jail.create_file("e.toml", &format!("model = {model:?}\ncont_batching = false\n"))?;
            let config = EngineConfig::load(&cli(&["--config", "e.toml"])).unwrap();
            assert!(!config.model.cont_batching, "the file, not the flag's default");
            let config =
                EngineConfig::load(&cli(&["--config", "e.toml", "--cont-batching", "true"]))
                    .unwrap();
            assert!(config.model.cont_batching, "the flag given");
            Ok(())
        });
    }
}

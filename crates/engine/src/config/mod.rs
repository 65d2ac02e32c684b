//! Settings of the engine: defaults, then a TOML file (`--config`), then
//! `SLOTGATE_ENGINE_*` environment variables, then CLI flags, layered with figment.
//!
//! Each setting is declared once, as a field that is also its flag: the flag's
//! `default_value` is the setting's default, its doc comment the help text and
//! the documentation. [`Cli`] records which flags were given, so that only those
//! override the file and the environment.

mod model;
mod server;

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser};
use figment::providers::{Env, Serialized};
use figment::value::{Dict, Map, Tag};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Serialize;

use crate::error::EngineError;

pub use model::{ModelSettings, Pooling, TemplateChoice};
pub use server::ServerSettings;

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
        let figment =
            slotgate_http::settings::defaults_and_file(&Self::default(), cli.config.as_deref());
        let figment = figment.map_err(EngineError::Config)?;
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
        if self.server.host.split(',').all(|h| h.trim().is_empty()) {
            return Err(EngineError::Setting {
                field: "host".into(),
                reason: "names no address to listen on".into(),
            });
        }
        self.server.admin_key()?;
        self.server.api_keys()?;
        self.server.sampling_defaults()?;
        slotgate_http::cors::Cors::check(&self.server.cors_origins, "cors_origins")
            .map_err(|reason| EngineError::Setting { field: "cors_origins".into(), reason })?;
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
    use std::path::Path;

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
                    with_model(&["--chat-template", "Jinja 2"]),
                    "chat_template: unknown template `Jinja 2`",
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
                (with_model(&["--top-p", "0"]), "top_p: must be above 0 and at most 1"),
                (with_model(&["--top-k=-1"]), "top_k: must not be negative"),
                (with_model(&["--host", ","]), "host: names no address"),
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

//! The settings of one model: its file, slots, queue and template, checked
//! before anything is loaded.

use std::path::{Path, PathBuf};

use clap::{ArgAction, Args};
use serde::{Deserialize, Serialize};

use super::defaults;
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
    /// One KV cache of `ctx_len × n_parallel` tokens shared by every slot
    /// (llama-server's `--kv-unified`): a slot's sequence may then grow to the
    /// whole of it while the others are short. A request is admitted when its
    /// prompt and `max_tokens` (the rest of the cache when it sets none) fit
    /// beside what the running ones reserved; otherwise it waits in the queue,
    /// and idle slots' caches give way. Off: each slot has `ctx_len` of its own.
    #[arg(long, default_value_t = false, action = ArgAction::Set)]
    pub kv_unified: bool,
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
    /// How the embedding context pools an input's tokens into its vector
    /// (llama-server's `--pooling`): `mean`, `cls` (the first token's), `last`,
    /// or `none`: one vector per token, which only `/embeddings` (llama-server's
    /// shape) can carry; `/v1/embeddings` then refuses.
    #[arg(long, value_enum, default_value = "mean")]
    pub pooling: Pooling,
    /// Serve `/v1/rerank` for this model (llama-server's `--reranking`): a
    /// reranker's score of each document for a query, from its classifier head
    /// (rank pooling). Its `/v1/embeddings` are then refused.
    #[arg(long, default_value_t = false, action = ArgAction::Set)]
    pub reranking: bool,
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

/// How an embedding is pooled from its tokens' vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The mean of the tokens' vectors.
    #[default]
    Mean,
    /// The first token's vector.
    Cls,
    /// The last token's vector.
    Last,
    /// Every token's vector.
    None,
}

impl Default for ModelSettings {
    fn default() -> Self {
        defaults()
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
    /// The most tokens one slot's sequence may hold: `ctx_len`, or the whole
    /// shared cache with `kv_unified`.
    pub fn seq_len(&self) -> u32 {
        if self.kv_unified {
            self.ctx_len.saturating_mul(self.n_parallel)
        } else {
            self.ctx_len
        }
    }

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

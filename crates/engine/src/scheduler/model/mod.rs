//! One loaded model on the scheduler thread: its llama.cpp model and context, its
//! slots and its queue, and one step of continuous batching over them. Its jobs
//! have a file each: `reader` (rendering and tokenizing, off this thread),
//! `prompt` (a job cut into tasks), `admission` (queue, slot choice, host
//! cache) and `decode` (the batch and sampling).

mod admission;
mod decode;
mod kv_pool;
mod prompt;
mod reader;
mod slot_file;
mod templates;
mod vocab;

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::session::SeqState;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use slotgate_protocol::{ApiError, SlotPhase, SlotStatus};

use super::embed::EmbedWork;
use super::host_cache::HostCache;
use super::job::{Event, Outbox, Task};
use super::slot::Slot;
use crate::config::ModelSettings;
use crate::error::EngineError;
pub use reader::{ReadJob, Reader, Replay};
pub use vocab::{VocabAnswer, VocabOp};

/// The contexts of one model: one for generation, whose sequences are the slots,
/// and one for embeddings when they are enabled.
pub(crate) struct Contexts<'m> {
    gen: LlamaContext<'m>,
    embed: Option<LlamaContext<'m>>,
}

self_cell::self_cell!(
    /// A model and the contexts that borrow it, owned together so that a model can
    /// be loaded and unloaded at run time.
    struct Loaded {
        owner: std::sync::Arc<LlamaModel>,
        #[covariant]
        dependent: Contexts,
    }
);

/// What does not change while a model is loaded, for `/props`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// The GGUF file.
    pub path: String,
    /// Tokens of context one slot's sequence may hold.
    pub ctx_len: u32,
    /// Whether the slots share one KV cache (`kv_unified`).
    pub kv_unified: bool,
    /// Slots.
    pub n_parallel: u32,
    /// Most choices one request may ask for: its slots and queue together.
    pub max_choices: u32,
    /// Whether it has an embedding context.
    pub embedding: bool,
    /// Whether that context ranks (a reranker's) rather than embeds.
    pub reranking: bool,
    /// How it pools an input's tokens.
    pub pooling: crate::config::Pooling,
    /// The template in use: `gemma`, `chatml`, `llama3`, `prompts`, `jinja` or `model`.
    pub template_name: String,
    /// The Jinja template in use, else the GGUF's own, else empty.
    pub chat_template: String,
    /// How the template has the model write tool calls, when it has a tool
    /// section; without one, tools take the generic form.
    pub tool_format: Option<crate::tools::CallFormat>,
    /// Other names clients may send for the model.
    pub aliases: Vec<String>,
    /// What the model is, in llama-server's `meta` shape (`n_vocab`, `n_params`...).
    pub meta: serde_json::Value,
}

/// What `/slots`, `/v1/models`, `/props` and `/metrics` show of a model.
#[derive(Debug, Clone)]
pub struct ModelSnapshot {
    /// The name clients send.
    pub id: String,
    /// What does not change while it is loaded.
    pub info: std::sync::Arc<ModelInfo>,
    /// Unix seconds when it was loaded.
    pub created: u64,
    /// Every slot.
    pub slots: Vec<SlotStatus>,
    /// Tasks waiting for a slot.
    pub queue_depth: usize,
    /// Reads its requests into tokens, off the scheduler thread.
    pub reader: std::sync::Arc<Reader>,
    /// Of the running and waiting tasks, how many each gateway replica sent.
    pub replicas: std::collections::BTreeMap<String, u32>,
}

/// A model being served.
pub(crate) struct ModelRuntime {
    pub id: String,
    info: std::sync::Arc<ModelInfo>,
    settings: ModelSettings,
    created: u64,
    /// Its requests' reader; the HTTP side reads with it.
    reader: std::sync::Arc<Reader>,
    n_vocab: i32,
    loaded: Loaded,
    batch: LlamaBatch<'static>,
    slots: Vec<Slot>,
    queue: VecDeque<Task>,
    /// Embeddings jobs, oldest first.
    embeds: VecDeque<EmbedWork>,
    /// Where draws made beside the loop come back.
    aside: std::sync::mpsc::Sender<super::aside::Drew>,
    /// KV states of conversations that had to leave their slot.
    host_cache: HostCache<SeqState>,
}

impl ModelRuntime {
    /// Loads the file and creates its context. Runs on the scheduler thread: see
    /// `worker.rs` for why loading is not moved to another thread.
    pub fn load(
        backend: &LlamaBackend,
        settings: ModelSettings,
        aside: std::sync::mpsc::Sender<super::aside::Drew>,
    ) -> Result<Self, EngineError> {
        settings.validate()?;
        let path = settings.path().to_path_buf();
        let load_err =
            |reason: String| EngineError::Load { path: path.display().to_string(), reason };
        let model_params = LlamaModelParams::default().with_n_gpu_layers(settings.ngl);
        let model = LlamaModel::load_from_file(backend, &path, &model_params)
            .map_err(|e| load_err(format!("{e} (is it a GGUF model file?)")))?;
        let n_vocab = model.n_vocab();
        let architecture = model.meta_val_str("general.architecture").unwrap_or_default();
        // The GGUF's own template, read once: it picks `auto`, and `/props` shows it.
        let own_template = model.chat_template(None).ok();
        let own_template = own_template.and_then(|t| t.to_string().ok());
        let (template, jinja) =
            templates::choose(&model, &settings, own_template.as_deref(), &architecture)
                .map_err(load_err)?;
        let info = std::sync::Arc::new(ModelInfo {
            path: path.display().to_string(),
            ctx_len: settings.seq_len(),
            kv_unified: settings.kv_unified,
            n_parallel: settings.n_parallel,
            max_choices: settings.n_parallel.saturating_add(settings.queue_size),
            embedding: settings.embedding || settings.reranking,
            reranking: settings.reranking,
            pooling: settings.pooling,
            template_name: template.name().to_owned(),
            aliases: settings.aliases.clone(),
            meta: meta(&model, settings.seq_len()),
            tool_format: jinja
                .as_ref()
                .and_then(|j| crate::tools::CallFormat::of_template(j.source())),
            chat_template: match &jinja {
                Some(j) => j.source().to_owned(),
                None => own_template.unwrap_or_default(),
            },
        });
        let n_parallel = settings.n_parallel;
        let ctx_params = context_params(&settings);
        let embedding = settings.embedding || settings.reranking;
        let embed_params = super::embed::context_params(&settings);
        let model = std::sync::Arc::new(model);
        let reader = std::sync::Arc::new(Reader::new(
            model.clone(),
            template.clone(),
            jinja,
            (settings.seq_len(), settings.ctx_len),
        ));
        // Contexts are created one after the other: creating two from one model at
        // once is unsound in llama.cpp.
        let loaded = Loaded::try_new(model, |model| {
            let gen = model.new_context(backend, ctx_params)?;
            let embed =
                if embedding { Some(model.new_context(backend, embed_params)?) } else { None };
            Ok::<_, llama_cpp_2::LlamaContextLoadError>(Contexts { gen, embed })
        })
        .map_err(|e| load_err(format!("cannot create a context: {e}")))?;
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let id = settings.id();
        tracing::info!(model = %id, ?template, n_parallel, ctx_len = settings.ctx_len, "model loaded");
        Ok(Self {
            id,
            info,
            created,
            reader,
            n_vocab,
            loaded,
            batch: LlamaBatch::new(settings.batch_size as usize, 1),
            slots: (0..n_parallel).map(Slot::new).collect(),
            queue: VecDeque::new(),
            embeds: VecDeque::new(),
            aside,
            host_cache: HostCache::new(settings.cache_ram_mib as usize * 1024 * 1024),
            settings,
        })
    }

    /// Whether a step has work: a slot running (and not waiting for a draw
    /// beside the loop), a task waiting, or an input waiting to be embedded.
    pub fn is_busy(&self) -> bool {
        !self.queue.is_empty()
            || !self.embeds.is_empty()
            || self.slots.iter().any(|s| s.running.as_ref().is_some_and(|r| r.sampler.is_some()))
    }

    /// Whether a draw beside the loop is under way.
    pub fn is_drawing(&self) -> bool {
        self.slots.iter().any(|s| s.running.as_ref().is_some_and(|r| r.sampler.is_none()))
    }

    /// One step: drop cancelled and expired work, admit queued tasks into free
    /// slots, decode one batch, sample every slot that has logits. Returns whether
    /// anything was decoded, and the time spent inside llama.cpp.
    /// Events go to `outbox`, to be sent once the step's state is published.
    pub fn step(&mut self, step_no: u64, outbox: &mut Outbox) -> (bool, Duration) {
        self.reap_cancelled();
        self.expire_queue(outbox);
        self.admit(step_no, outbox);
        let (decoded, spent) = self.decode_and_sample(outbox);
        (decoded, spent + self.embed_one())
    }

    /// Queues an embeddings job, read into tokens by the model's reader. Its
    /// inputs are embedded one per step, between generation steps, so a job of
    /// many inputs never holds up the streams.
    pub fn queue_embed(&mut self, job: super::EmbedJob) {
        if !self.info.embedding {
            let _ = job.reply.send(Err(super::embed::not_enabled(&self.id)));
            return;
        }
        self.embeds.push_back(EmbedWork::new(job));
    }

    /// Embeds the next input of the oldest embeddings job; returns the time spent.
    fn embed_one(&mut self) -> Duration {
        let Some(work) = self.embeds.front_mut() else { return Duration::ZERO };
        let started = Instant::now();
        let read = super::embed::EmbedKind::of(&self.info);
        let result = self.loaded.with_dependent_mut(|_, c| match c.embed.as_mut() {
            Some(ctx) => work.step(ctx, read),
            None => Some(Err(ApiError::internal())),
        });
        if let Some(result) = result {
            if let Some(work) = self.embeds.pop_front() {
                work.answer(result);
            }
        }
        started.elapsed()
    }

    /// What it was loaded with.
    pub fn settings(&self) -> &ModelSettings {
        &self.settings
    }

    /// The model, for the scheduler to free once no reader holds it.
    pub fn model(&self) -> std::sync::Arc<LlamaModel> {
        self.loaded.borrow_owner().clone()
    }

    /// Fails every running and queued task, as when the model is unloaded.
    pub fn fail_all(&mut self, err: &ApiError, outbox: &mut Outbox) {
        for slot in &mut self.slots {
            if let Some(run) = slot.running.take() {
                run.task.send(outbox, Event::Error(err.clone()));
            }
        }
        for task in self.queue.drain(..) {
            task.send(outbox, Event::Error(err.clone()));
        }
        for work in self.embeds.drain(..) {
            work.answer(Err(err.clone()));
        }
    }

    /// The state shown to HTTP handlers.
    pub fn snapshot(&self) -> ModelSnapshot {
        let slots = self
            .slots
            .iter()
            .map(|s| SlotStatus {
                id: s.id,
                id_task: s.running.as_ref().map_or(-1, |r| r.task.id as i64),
                n_ctx: self.settings.seq_len(),
                is_processing: s.running.is_some(),
                model: Some(self.id.clone()),
                n_cached: Some(s.cache.len() as u32),
                phase: Some(match &s.running {
                    None => SlotPhase::Idle,
                    Some(r) if r.first_token.is_none() => SlotPhase::Prompt,
                    Some(_) => SlotPhase::Generating,
                }),
            })
            .collect();
        let mut replicas = std::collections::BTreeMap::new();
        let running = self.slots.iter().filter_map(|s| s.running.as_ref().map(|r| &r.task));
        for task in running.chain(self.queue.iter()) {
            if let Some(replica) = &task.replica {
                *replicas.entry(replica.to_string()).or_insert(0) += 1;
            }
        }
        ModelSnapshot {
            id: self.id.clone(),
            info: self.info.clone(),
            created: self.created,
            slots,
            queue_depth: self.queue.len(),
            reader: self.reader.clone(),
            replicas,
        }
    }
}

/// The generation context's settings: a window of `ctx_len` per slot, and as
/// many sequences as slots.
fn context_params(settings: &ModelSettings) -> LlamaContextParams {
    let threads = settings.threads() as i32;
    let n_parallel = settings.n_parallel;
    LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(settings.ctx_len * n_parallel))
        .with_n_seq_max(n_parallel)
        .with_kv_unified(settings.kv_unified)
        .with_n_batch(settings.batch_size)
        .with_n_ubatch(settings.batch_size)
        .with_n_threads(threads)
        .with_n_threads_batch(threads)
}

/// The model's `meta` as llama-server lists it in `/v1/models`.
fn meta(model: &LlamaModel, ctx_len: u32) -> serde_json::Value {
    let file_type = model.meta_val_str("general.file_type").ok().and_then(|t| t.parse().ok());
    serde_json::json!({
        "vocab_type": model.vocab().vocab_type() as i32,
        "n_vocab": model.n_vocab(),
        "n_ctx": ctx_len,
        "n_ctx_train": model.n_ctx_train(),
        "n_embd": model.n_embd(),
        "n_params": model.n_params(),
        "size": model.size(),
        "ftype": file_type.map_or("unknown", ftype_name),
    })
}

/// llama.cpp's name of a GGUF's `general.file_type` (`llama_model_ftype_name`).
fn ftype_name(file_type: u32) -> &'static str {
    match file_type {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        32 => "BF16",
        _ => "unknown",
    }
}

//! One loaded model on the scheduler thread: its llama.cpp model and context, its
//! slots and its queue, and one step of continuous batching over them.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use slotgate_protocol::{ApiError, ErrorType, FinishReason, PromptItem, SlotStatus};

use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};

use super::embed::Embedded;
use super::host_cache::HostCache;
use super::job::{ChoiceUsage, Event, Job, JobInput, Outbox, Task};
use super::sampler;
use super::slot::{common_prefix, pick_slot, Pick, Running, Slot, KEEP_SHARE};
use super::text::TextStream;
use crate::config::{ModelSettings, TemplateChoice};
use crate::error::EngineError;
use crate::metrics as m;
use crate::template::ChatTemplate;

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
        owner: LlamaModel,
        #[covariant]
        dependent: Contexts,
    }
);

/// What `/slots`, `/v1/models` and `/metrics` show of a model.
#[derive(Debug, Clone)]
pub struct ModelSnapshot {
    /// The name clients send.
    pub id: String,
    /// Unix seconds when it was loaded.
    pub created: u64,
    /// Every slot.
    pub slots: Vec<SlotStatus>,
    /// Tasks waiting for a slot.
    pub queue_depth: usize,
}

/// A model being served.
pub(crate) struct ModelRuntime {
    pub id: String,
    settings: ModelSettings,
    created: u64,
    template: ChatTemplate,
    n_vocab: i32,
    loaded: Loaded,
    batch: LlamaBatch<'static>,
    slots: Vec<Slot>,
    queue: VecDeque<Task>,
    /// KV states of conversations that had to leave their slot.
    host_cache: HostCache<SeqState>,
}

/// Caches shorter than this are not worth a copy in host memory: re-reading them
/// costs less than a step.
const MIN_SAVED_TOKENS: usize = 16;

impl ModelRuntime {
    /// Loads the file and creates its context. Runs on the scheduler thread: see
    /// `worker.rs` for why loading is not moved to another thread.
    pub fn load(backend: &LlamaBackend, settings: ModelSettings) -> Result<Self, EngineError> {
        settings.validate()?;
        let path = settings.path().to_path_buf();
        let load_err =
            |reason: String| EngineError::Load { path: path.display().to_string(), reason };
        let model_params = LlamaModelParams::default().with_n_gpu_layers(settings.ngl);
        let model = LlamaModel::load_from_file(backend, &path, &model_params)
            .map_err(|e| load_err(format!("{e} (is it a GGUF model file?)")))?;
        let n_vocab = model.n_vocab();
        let architecture = model.meta_val_str("general.architecture").unwrap_or_default();
        let template = match settings.template() {
            TemplateChoice::Fixed(t) => t,
            TemplateChoice::Auto => {
                ChatTemplate::auto(model.chat_template(None).is_ok(), &architecture)
            }
        };
        if template == ChatTemplate::Model && model.chat_template(None).is_err() {
            return Err(load_err("chat_template `model`: the GGUF has no chat template".into()));
        }
        let n_parallel = settings.n_parallel;
        let threads = settings.threads() as i32;
        let ctx_params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(settings.ctx_len * n_parallel))
            .with_n_seq_max(n_parallel)
            .with_n_batch(settings.batch_size)
            .with_n_ubatch(settings.batch_size)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let embedding = settings.embedding;
        let embed_params = super::embed::context_params(&settings);
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
            created,
            template,
            n_vocab,
            loaded,
            batch: LlamaBatch::new(settings.batch_size as usize, 1),
            slots: (0..n_parallel).map(Slot::new).collect(),
            queue: VecDeque::new(),
            host_cache: HostCache::new(settings.cache_ram_mib as usize * 1024 * 1024),
            settings,
        })
    }

    /// Whether any slot is running or any task waits.
    pub fn is_busy(&self) -> bool {
        !self.queue.is_empty() || self.slots.iter().any(|s| s.running.is_some())
    }

    /// Turns a job into its tasks: renders and tokenizes the prompts and checks that
    /// they fit a slot.
    pub fn prepare(
        &self,
        job: Job,
        next_id: &mut impl FnMut() -> u64,
    ) -> Result<Vec<Task>, ApiError> {
        let model = self.loaded.borrow_owner();
        let vocab = model.vocab();
        let prompts: Vec<(Vec<LlamaToken>, String)> = match &job.input {
            JobInput::Chat(messages) => {
                let text = match self.template.render(messages) {
                    Some(text) => text,
                    None => apply_model_template(model, messages)?,
                };
                vec![(vocab.tokenize(text.as_bytes(), true, true), text)]
            }
            JobInput::Prompts(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    out.push(match item {
                        PromptItem::Text(text) => {
                            (vocab.tokenize(text.as_bytes(), true, true), text.clone())
                        }
                        PromptItem::Tokens(ids) => {
                            let tokens = self.check_token_ids(ids, i, items.len())?;
                            let text = if job.params.echo {
                                String::from_utf8_lossy(&vocab.detokenize(&tokens, false, false))
                                    .into_owned()
                            } else {
                                String::new()
                            };
                            (tokens, text)
                        }
                    });
                }
                out
            }
        };
        let ctx_len = self.settings.ctx_len as usize;
        for (i, (tokens, _)) in prompts.iter().enumerate() {
            if tokens.len() >= ctx_len {
                let which =
                    if prompts.len() > 1 { format!("prompt {i}") } else { "the prompt".into() };
                return Err(ApiError::new(
                    ErrorType::ExceedContextSizeError,
                    format!(
                        "{which} has {} tokens, but a slot's context holds {ctx_len} (ctx_len); \
                         shorten the prompt or start the engine with a larger ctx_len",
                        tokens.len()
                    ),
                )
                .with_param(if matches!(job.input, JobInput::Chat(_)) {
                    "messages"
                } else {
                    "prompt"
                })
                .with_code("context_length_exceeded"));
            }
        }
        let params = Arc::new(job.params);
        let enqueued = Instant::now();
        let mut tasks = Vec::with_capacity(prompts.len() * params.n as usize);
        for (p, (tokens, text)) in prompts.into_iter().enumerate() {
            let prompt = Arc::new(tokens);
            let echo_text = params.echo.then(|| Arc::new(text));
            for s in 0..params.n {
                let seed = match params.seed {
                    Some(seed) => (seed as u32).wrapping_add(s),
                    None => rand::random(),
                };
                tasks.push(Task {
                    id: next_id(),
                    index: p as u32 * params.n + s,
                    prompt: prompt.clone(),
                    params: params.clone(),
                    seed,
                    echo_text: echo_text.clone(),
                    events: job.events.clone(),
                    enqueued,
                });
            }
        }
        Ok(tasks)
    }

    fn check_token_ids(
        &self,
        ids: &[u32],
        i: usize,
        count: usize,
    ) -> Result<Vec<LlamaToken>, ApiError> {
        ids.iter()
            .map(|&id| match i32::try_from(id) {
                Ok(t) if t < self.n_vocab => Ok(LlamaToken(t)),
                _ => {
                    let param = if count > 1 { format!("prompt[{i}]") } else { "prompt".into() };
                    Err(ApiError::invalid(
                        param,
                        format!(
                            "token id {id} is out of range: the vocabulary has {} tokens",
                            self.n_vocab
                        ),
                    ))
                }
            })
            .collect()
    }

    /// Queues a job's tasks, or refuses them all with 503 when the queue cannot
    /// take those that will not find a free slot.
    pub fn enqueue(&mut self, tasks: Vec<Task>) -> Result<(), (ApiError, Vec<Task>)> {
        let free = self.slots.iter().filter(|s| s.running.is_none()).count();
        let waiting = (self.queue.len() + tasks.len()).saturating_sub(free);
        if waiting > self.settings.queue_size as usize {
            let err = ApiError::slot_unavailable(format!(
                "all {} slots of model `{}` are busy and its queue ({} requests) is full; retry later",
                self.slots.len(),
                self.id,
                self.settings.queue_size
            ));
            return Err((err, tasks));
        }
        self.queue.extend(tasks);
        Ok(())
    }

    /// One step: drop cancelled and expired work, admit queued tasks into free
    /// slots, decode one batch, sample every slot that has logits. Returns whether
    /// anything was decoded, and the time spent inside llama.cpp.
    /// Events go to `outbox`, to be sent once the step's state is published.
    pub fn step(&mut self, step_no: u64, outbox: &mut Outbox) -> (bool, Duration) {
        self.reap_cancelled();
        self.expire_queue(outbox);
        self.admit(step_no, outbox);
        self.decode_and_sample(outbox)
    }

    fn reap_cancelled(&mut self) {
        let Self { loaded, slots, id, .. } = self;
        for slot in slots.iter_mut() {
            if slot.running.as_ref().is_some_and(|r| r.task.cancelled()) {
                slot.running = None;
                // The issue asks for the sequence to be cleared; a cancelled prompt is
                // not worth keeping as a cache anyway.
                loaded.with_dependent_mut(|_, c| {
                    let _ = c.gen.clear_kv_cache_seq(Some(slot.id), None, None);
                });
                slot.cache.clear();
                metrics::counter!(m::CANCELLED, "model" => id.clone()).increment(1);
                tracing::debug!(model = %id, slot = slot.id, "client went away; slot freed");
            }
        }
        self.queue.retain(|t| !t.cancelled());
    }

    fn expire_queue(&mut self, outbox: &mut Outbox) {
        let timeout = Duration::from_millis(self.settings.queue_timeout_ms);
        if timeout.is_zero() {
            return;
        }
        let id = &self.id;
        self.queue.retain(|task| {
            if task.enqueued.elapsed() <= timeout {
                return true;
            }
            let err = ApiError::slot_unavailable(format!(
                "no slot of model `{id}` became free within queue_timeout_ms ({} ms); retry later",
                timeout.as_millis()
            ));
            task.send(outbox, Event::Error(err));
            false
        });
    }

    fn admit(&mut self, step_no: u64, outbox: &mut Outbox) {
        if !self.settings.cont_batching
            && self.slots.iter().any(|s| s.running.as_ref().is_some_and(Running::in_prompt))
        {
            return;
        }
        while !self.queue.is_empty() {
            let similarity = self.settings.slot_prompt_similarity;
            let Some((i, pick)) = pick_slot(&self.slots, &self.queue[0].prompt, similarity) else {
                return;
            };
            let Some(task) = self.queue.pop_front() else { return };
            self.start(i, pick, task, step_no, outbox);
        }
    }

    /// Puts `task` in slot `i`, keeping the longest cached prefix of its prompt:
    /// the slot's own, or one restored from the host cache when that is longer.
    /// What the slot held goes to the host cache first when most of it would be lost.
    fn start(&mut self, i: usize, pick: Pick, task: Task, step_no: u64, outbox: &mut Outbox) {
        let mut shared = common_prefix(&self.slots[i].cache, &task.prompt);
        if task.params.cache_prompt && self.host_cache.enabled() && pick != Pick::Warm {
            shared = self.restore_from_host(i, &task.prompt, shared);
        }
        let n_vocab = self.n_vocab;
        let slot = &mut self.slots[i];
        // At least one prompt token is decoded again, to get logits to sample from.
        let mut keep = if task.params.cache_prompt { shared.min(task.prompt.len() - 1) } else { 0 };
        if (keep as f32) < KEEP_SHARE * slot.cache.len() as f32 {
            Self::save_to_host(&mut self.loaded, &mut self.host_cache, slot, &self.id);
        }
        let removed = self.loaded.with_dependent_mut(|_, c| {
            c.gen.clear_kv_cache_seq(Some(slot.id), Some(keep as u32), None).unwrap_or(false)
        });
        if !removed {
            // Some caches (recurrent ones) cannot drop a tail: start this slot afresh.
            self.loaded.with_dependent_mut(|_, c| {
                let _ = c.gen.clear_kv_cache_seq(Some(slot.id), None, None);
            });
            keep = 0;
        }
        slot.cache.truncate(keep);
        slot.last_used = step_no;
        tracing::debug!(model = %self.id, slot = slot.id, ?pick, keep, prompt = task.prompt.len(), "admitted");
        let wait = task.enqueued.elapsed();
        metrics::histogram!(m::QUEUE_WAIT, "model" => self.id.clone()).record(wait.as_secs_f64());
        if let Some(text) = &task.echo_text {
            task.send(outbox, Event::Text { index: task.index, text: text.to_string() });
        }
        slot.running = Some(Running {
            sampler: sampler::build(&task.params, task.seed, n_vocab),
            text: TextStream::new(task.params.stop.clone()),
            n_prompt_done: keep,
            cached: keep,
            generated: 0,
            next: None,
            logits_at: None,
            admitted: Instant::now(),
            first_token: None,
            task,
        });
    }

    /// Restores into slot `i` the host-cache entry that shares the most with
    /// `prompt`, when it shares more than the slot's own `shared` tokens and a real
    /// part of the prompt. The slot's cache goes to the host cache first. Returns
    /// the shared prefix the slot now holds.
    fn restore_from_host(&mut self, i: usize, prompt: &[LlamaToken], shared: usize) -> usize {
        let need = (self.settings.slot_prompt_similarity * prompt.len() as f32).ceil() as usize;
        // A gain of one token is no gain: the last prompt token is decoded anyway.
        let min = need.max(shared + 2).max(MIN_SAVED_TOKENS);
        let Some(entry) = self.host_cache.take_best(prompt, min) else {
            metrics::counter!(m::HOST_CACHE_MISSES, "model" => self.id.clone()).increment(1);
            return shared;
        };
        let slot = &mut self.slots[i];
        Self::save_to_host(&mut self.loaded, &mut self.host_cache, slot, &self.id);
        let restored = self.loaded.with_dependent_mut(|_, c| {
            let _ = c.gen.clear_kv_cache_seq(Some(slot.id), None, None);
            c.gen.state_seq_set(&entry.state, slot.id as i32)
        });
        let id = self.id.clone();
        publish_host_cache(&self.host_cache, &id);
        match restored {
            Ok(()) => {
                metrics::counter!(m::HOST_CACHE_HITS, "model" => id).increment(1);
                let slot = &mut self.slots[i];
                slot.cache = entry.tokens;
                common_prefix(&slot.cache, prompt)
            }
            Err(err) => {
                // The saved state did not fit this context: start the slot afresh.
                tracing::warn!(model = %id, error = %err, "host cache restore failed");
                let slot = &mut self.slots[i];
                self.loaded.with_dependent_mut(|_, c| {
                    let _ = c.gen.clear_kv_cache_seq(Some(slot.id), None, None);
                });
                slot.cache.clear();
                0
            }
        }
    }

    /// Copies a slot's sequence into the host cache, if it is worth keeping.
    fn save_to_host(
        loaded: &mut Loaded,
        host_cache: &mut HostCache<SeqState>,
        slot: &Slot,
        id: &str,
    ) {
        if !host_cache.enabled() || slot.cache.len() < MIN_SAVED_TOKENS {
            return;
        }
        let state = loaded.with_dependent(|_, c| {
            c.gen.state_seq_get(slot.id as i32, LlamaStateSeqFlags::empty())
        });
        match state {
            Ok(state) => {
                let bytes = state.byte_len();
                let kept = host_cache.insert(slot.cache.clone(), state);
                tracing::debug!(model = %id, slot = slot.id, tokens = slot.cache.len(), bytes, kept, "saved to host cache");
            }
            Err(err) => tracing::warn!(model = %id, error = %err, "host cache save failed"),
        }
        publish_host_cache(host_cache, id);
    }

    /// Builds one batch from every running slot, decodes it, samples.
    fn decode_and_sample(&mut self, outbox: &mut Outbox) -> (bool, Duration) {
        let Self { loaded, batch, slots, settings, id, .. } = self;
        let capacity = settings.batch_size as usize;
        batch.clear();
        // Generating slots first, one token each: they keep streaming while long
        // prompts are read in chunks with whatever room is left.
        for slot in slots.iter_mut() {
            let pos = slot.cache.len() as i32;
            let Some(run) = slot.running.as_mut() else { continue };
            run.logits_at = None;
            if let Some(token) = run.next {
                if (batch.n_tokens() as usize) < capacity
                    && batch.add(token, pos, &[slot.id as i32], true).is_ok()
                {
                    run.logits_at = Some(batch.n_tokens() - 1);
                }
            }
        }
        let mut chunks: Vec<(usize, usize)> = Vec::new();
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(run) = slot.running.as_mut() else { continue };
            if !run.in_prompt() {
                continue;
            }
            let room = capacity - batch.n_tokens() as usize;
            if room == 0 {
                break;
            }
            let start = run.n_prompt_done;
            let end = run.task.prompt.len().min(start + room);
            for (k, &token) in run.task.prompt[start..end].iter().enumerate() {
                let last = start + k + 1 == run.task.prompt.len();
                // Cannot fail: room was counted above.
                let _ = batch.add(token, (start + k) as i32, &[slot.id as i32], last);
                if last {
                    run.logits_at = Some(batch.n_tokens() - 1);
                }
            }
            chunks.push((i, end - start));
        }
        if batch.n_tokens() == 0 {
            return (false, Duration::ZERO);
        }
        let llama_started = Instant::now();
        let decoded = loaded.with_dependent_mut(|_, c| c.gen.decode(batch));
        let mut in_llama = llama_started.elapsed();
        if let Err(err) = decoded {
            tracing::error!(model = %id, error = %err, tokens = batch.n_tokens(), "decode failed");
            for slot in slots.iter_mut() {
                if let Some(run) = slot.running.take() {
                    run.task.send(outbox, Event::Error(ApiError::internal()));
                    loaded.with_dependent_mut(|_, c| {
                        let _ = c.gen.clear_kv_cache_seq(Some(slot.id), None, None);
                    });
                    slot.cache.clear();
                }
            }
            return (true, in_llama);
        }
        // Record what is now in each sequence's cache.
        for (i, n) in chunks {
            let slot = &mut slots[i];
            if let Some(run) = slot.running.as_mut() {
                let start = run.n_prompt_done;
                slot.cache.extend_from_slice(&run.task.prompt[start..start + n]);
                run.n_prompt_done += n;
            }
        }
        let mut generated = 0u64;
        for slot in slots.iter_mut() {
            let Some(run) = slot.running.as_mut() else { continue };
            let Some(at) = run.logits_at else { continue };
            if let Some(token) = run.next.take() {
                slot.cache.push(token);
            }
            let sample_started = Instant::now();
            let token = loaded.with_dependent(|_, c| run.sampler.sample(&c.gen, at));
            in_llama += sample_started.elapsed();
            generated += 1;
            let finish = Self::accept(
                loaded.borrow_owner(),
                run,
                token,
                slot.cache.len(),
                settings.ctx_len as usize,
                id,
                outbox,
            );
            if let Some(reason) = finish {
                let run = slot.running.take();
                if let Some(run) = run {
                    Self::finish(run, reason, id, outbox);
                }
            }
        }
        metrics::counter!(m::GENERATED_TOKENS, "model" => id.clone()).increment(generated);
        (true, in_llama)
    }

    /// Takes one sampled token; returns why the choice ends, if it does.
    fn accept(
        model: &LlamaModel,
        run: &mut Running,
        token: LlamaToken,
        in_cache: usize,
        ctx_len: usize,
        id: &str,
        outbox: &mut Outbox,
    ) -> Option<FinishReason> {
        run.generated += 1;
        let now = Instant::now();
        if run.first_token.is_none() {
            run.first_token = Some(now);
            let ttft = now - run.task.enqueued;
            metrics::histogram!(m::TTFT, "model" => id.to_owned()).record(ttft.as_secs_f64());
        }
        let vocab = model.vocab();
        if vocab.is_eog(token) {
            return Some(FinishReason::Stop);
        }
        let pushed = run.text.push(&vocab.token_to_piece(token, false, None));
        if !pushed.text.is_empty() {
            run.task.send(outbox, Event::Text { index: run.task.index, text: pushed.text });
        }
        if pushed.stopped {
            return Some(FinishReason::Stop);
        }
        if run.task.params.max_tokens.is_some_and(|max| run.generated >= max) {
            return Some(FinishReason::Length);
        }
        if in_cache + 1 > ctx_len {
            return Some(FinishReason::Length);
        }
        run.next = Some(token);
        None
    }

    fn finish(mut run: Running, reason: FinishReason, id: &str, outbox: &mut Outbox) {
        let rest = run.text.finish();
        if !rest.is_empty() {
            run.task.send(outbox, Event::Text { index: run.task.index, text: rest });
        }
        let usage = ChoiceUsage {
            prompt_tokens: run.task.prompt.len() as u32,
            cached_tokens: run.cached as u32,
            completion_tokens: run.generated,
        };
        if let Some(first) = run.first_token {
            if run.generated > 1 {
                let per_token = first.elapsed() / (run.generated - 1);
                metrics::histogram!(m::TPOT, "model" => id.to_owned())
                    .record(per_token.as_secs_f64());
            }
        }
        metrics::counter!(m::PROMPT_TOKENS, "model" => id.to_owned())
            .increment(usage.prompt_tokens.into());
        metrics::counter!(m::PROMPT_TOKENS_CACHED, "model" => id.to_owned())
            .increment(usage.cached_tokens.into());
        metrics::counter!(m::PROMPT_TOKENS_COMPUTED, "model" => id.to_owned())
            .increment(u64::from(usage.prompt_tokens - usage.cached_tokens));
        tracing::debug!(model = %id, task = run.task.id, ?reason, ?usage, elapsed = ?run.admitted.elapsed(), "choice done");
        run.task.send(outbox, Event::Done { index: run.task.index, reason, usage });
    }

    /// Embeds `inputs` at once, between two generation steps.
    pub fn embed(&mut self, inputs: &[PromptItem]) -> Result<Vec<Embedded>, ApiError> {
        let id = self.id.clone();
        let n_vocab = self.n_vocab;
        let ctx_len = self.settings.ctx_len as usize;
        self.loaded.with_dependent_mut(|model, c| match c.embed.as_mut() {
            Some(ctx) => super::embed::run(model, ctx, inputs, n_vocab, ctx_len),
            None => Err(ApiError::invalid(
                "model",
                format!(
                    "embeddings are not enabled for model `{id}`; load it with embedding = true"
                ),
            )),
        })
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
    }

    /// The state shown to HTTP handlers.
    pub fn snapshot(&self) -> ModelSnapshot {
        let slots = self
            .slots
            .iter()
            .map(|s| SlotStatus {
                id: s.id,
                id_task: s.running.as_ref().map_or(-1, |r| r.task.id as i64),
                n_ctx: self.settings.ctx_len,
                is_processing: s.running.is_some(),
                model: Some(self.id.clone()),
                n_cached: Some(s.cache.len() as u32),
            })
            .collect();
        ModelSnapshot {
            id: self.id.clone(),
            created: self.created,
            slots,
            queue_depth: self.queue.len(),
        }
    }
}

/// Sets the host cache's gauges of model `id`.
fn publish_host_cache(host_cache: &HostCache<SeqState>, id: &str) {
    metrics::gauge!(m::HOST_CACHE_BYTES, "model" => id.to_owned()).set(host_cache.used() as f64);
    metrics::gauge!(m::HOST_CACHE_ENTRIES, "model" => id.to_owned()).set(host_cache.len() as f64);
}

/// Renders a conversation with the template stored in the GGUF, through llama.cpp.
fn apply_model_template(
    model: &LlamaModel,
    messages: &[slotgate_protocol::ChatMessage],
) -> Result<String, ApiError> {
    let template = model.chat_template(None).map_err(|_| ApiError::internal())?;
    let chat = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            LlamaChatMessage::new(m.role.as_str().to_owned(), m.text()).map_err(|_| {
                ApiError::invalid(
                    format!("messages[{i}].content"),
                    "message text must not contain NUL characters",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    model.apply_chat_template(&template, &chat, true).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("the model's chat template cannot render these messages: {e}"),
        )
    })
}

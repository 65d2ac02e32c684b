//! The scheduler thread: the one thread of the process that touches llama.cpp.
//!
//! It owns the backend, every model, context, batch and sampler. HTTP handlers
//! reach it only through a bounded command channel and hear back on per-job
//! channels. This is what makes the two-models-on-CUDA crash impossible: llama.cpp's
//! GPU state (the CUDA memory pool, streams) is only ever driven from this thread.
//!
//! Loading a model also runs here, between two steps. The other models' sequences
//! pause for the load (a fraction of a second for small models, seconds for large
//! ones) and then resume where they were: their KV caches are untouched. Loading
//! on a helper thread would overlap weight uploads with decodes of other contexts,
//! which is the cross-thread use of llama.cpp's CUDA backend this design rules out.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use llama_cpp_2::llama_backend::LlamaBackend;
use slotgate_protocol::ApiError;
use tokio::sync::oneshot;

use super::aside::Drew;
use super::job::{Event, Job, Outbox};
use super::model::{ModelRuntime, ModelSnapshot};
use super::sleep::{Dormant, Idle};
use super::{Command, Snapshot};
use crate::config::ModelSettings;
use crate::error::EngineError;
use crate::metrics as m;

pub(super) struct Worker {
    backend: LlamaBackend,
    models: Vec<ModelRuntime>,
    commands: Receiver<Command>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    /// Events of the current step, sent by `publish`.
    outbox: Outbox,
    next_task: u64,
    step_no: u64,
    /// Where the fair round starts this step, so no model always goes first.
    round: usize,
    /// Tells the HTTP side that the slots or queues changed, with the new `seq`.
    changed: tokio::sync::watch::Sender<u64>,
    /// What the last change showed: per model, each slot's task and the queue.
    shown: Vec<(String, Vec<i64>, usize)>,
    /// How long a step that decoded took, in microseconds (moving average).
    step_us: u64,
    /// Whether this thread comes round its loop, for `/health`.
    heart: Arc<super::heartbeat::Heartbeat>,
    /// Unloaded models that a reader on another thread still held: freed here,
    /// the only thread that touches llama.cpp's device state, once it lets go.
    unloaded: Vec<Arc<llama_cpp_2::model::LlamaModel>>,
    /// Draws made beside the loop come back on this channel.
    drawn: (Sender<Drew>, Receiver<Drew>),
    /// When to sleep (`sleep_idle_s`), shared with the HTTP side.
    idle: Arc<Idle>,
    /// The models unloaded by sleep, and what loads them again.
    sleeping: Vec<(ModelSettings, Dormant)>,
}

impl Worker {
    pub fn new(
        backend: LlamaBackend,
        commands: Receiver<Command>,
        snapshot: Arc<ArcSwap<Snapshot>>,
        changed: tokio::sync::watch::Sender<u64>,
        heart: Arc<super::heartbeat::Heartbeat>,
        idle: Arc<Idle>,
    ) -> Self {
        Self {
            backend,
            models: Vec::new(),
            commands,
            snapshot,
            outbox: Outbox::default(),
            next_task: 0,
            step_no: 0,
            round: 0,
            changed,
            shown: Vec::new(),
            step_us: 0,
            heart,
            unloaded: Vec::new(),
            drawn: std::sync::mpsc::channel(),
            idle,
            sleeping: Vec::new(),
        }
    }

    /// Runs until every command sender is gone.
    pub fn run(mut self) {
        loop {
            let busy = self.models.iter().any(ModelRuntime::is_busy);
            if !busy {
                // Nothing to decode: sleep until a command arrives, or while a
                // draw is made beside the loop, a millisecond at most. The state
                // is shown first; a wait for a draw follows a step, which showed it.
                let drawing = self.models.iter().any(ModelRuntime::is_drawing);
                if !drawing {
                    self.publish();
                }
                self.heart.rest(true);
                // Idle with models loaded: wait no longer than sleep is due.
                let sleep_due = (!self.models.is_empty()).then(|| self.idle.due_in()).flatten();
                let wait = if drawing { Some(Duration::from_millis(1)) } else { sleep_due };
                let cmd = match wait {
                    Some(wait) => match self.commands.recv_timeout(wait) {
                        Ok(cmd) => Ok(Some(cmd)),
                        Err(RecvTimeoutError::Timeout) => Ok(None),
                        Err(RecvTimeoutError::Disconnected) => Err(()),
                    },
                    None => self.commands.recv().map(Some).map_err(|_| ()),
                };
                self.heart.rest(false);
                match cmd {
                    Ok(Some(cmd)) => self.handle(cmd),
                    Ok(None) if !drawing => self.fall_asleep(),
                    Ok(None) => {}
                    Err(()) => return,
                }
            } else {
                self.idle.touch();
            }
            self.heart.beat();
            self.free_unloaded();
            loop {
                match self.commands.try_recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if !self.models.iter().any(ModelRuntime::is_busy) {
                            return;
                        }
                        break;
                    }
                }
            }
            self.step();
        }
    }

    /// One step over every model, in a rotating order.
    fn step(&mut self) {
        while let Ok(drew) = self.drawn.1.try_recv() {
            match self.models.iter_mut().find(|m| m.id == drew.model) {
                Some(model) => model.take_drawn(drew, &mut self.outbox),
                None => drop(drew),
            }
        }
        self.step_no += 1;
        let n = self.models.len();
        if n == 0 {
            return;
        }
        self.round = (self.round + 1) % n;
        let started = Instant::now();
        let mut in_llama = Duration::ZERO;
        let mut decoded = false;
        for k in 0..n {
            let i = (self.round + k) % n;
            let (did, spent) = self.models[i].step(self.step_no, &mut self.outbox);
            decoded |= did;
            in_llama += spent;
        }
        // Requests that arrived during the step are admitted (or refused) before
        // the state is published: the state then shows every request that
        // reached the engine before it, and gateways see their claims in it
        // one step sooner.
        while let Ok(cmd) = self.commands.try_recv() {
            self.handle(cmd);
        }
        if decoded {
            let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.step_us =
                if self.step_us == 0 { us } else { self.step_us - self.step_us / 8 + us / 8 };
        }
        self.publish();
        if decoded {
            let overhead = started.elapsed().saturating_sub(in_llama);
            metrics::histogram!(m::STEP_OVERHEAD).record(overhead.as_secs_f64());
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(job) => self.submit(job),
            Command::Embed(job) => match self.models.iter_mut().find(|m| m.id == job.model) {
                Some(model) => model.queue_embed(job),
                None => {
                    let _ = job.reply.send(Err(ApiError::model_not_found(&job.model)));
                }
            },
            Command::Load(settings, reply) => self.load(settings, reply),
            Command::Wake(reply) => {
                let _ = reply.send(self.wake());
            }
            Command::SlotFile(job) => {
                let done = match self.models.iter_mut().find(|m| m.id == job.model) {
                    Some(model) => model.slot_file(job.slot, &job.op),
                    None => Err(ApiError::model_not_found(&job.model)),
                };
                self.publish();
                let _ = job.reply.send(done);
            }
            Command::Unload(id, reply) => {
                let before = self.sleeping.len();
                self.sleeping.retain(|(_, d)| d.id != id);
                let result = match self.models.iter().position(|m| m.id == id) {
                    None if self.sleeping.len() < before => Ok(()),
                    Some(i) => {
                        let mut model = self.models.remove(i);
                        let err = ApiError::new(
                            slotgate_protocol::ErrorType::UnavailableError,
                            format!("model `{id}` was unloaded"),
                        );
                        model.fail_all(&err, &mut self.outbox);
                        // Its contexts go now; the model itself once no reader
                        // holds it, here on this thread.
                        self.unloaded.push(model.model());
                        drop(model);
                        self.free_unloaded();
                        tracing::info!(model = %id, "model unloaded");
                        metrics::counter!(m::MODEL_UNLOADS, "model" => id.clone(), "reason" => "admin")
                            .increment(1);
                        Ok(())
                    }
                    None => Err(EngineError::Api(ApiError::model_not_found(&id))),
                };
                self.publish();
                let _ = reply.send(result);
            }
        }
    }

    /// Frees the unloaded models no reader holds any more.
    fn free_unloaded(&mut self) {
        if !self.unloaded.is_empty() {
            self.unloaded.retain(|model| Arc::strong_count(model) > 1);
        }
    }

    fn submit(&mut self, job: Job) {
        let Some(model) = self.models.iter_mut().find(|m| m.id == job.model) else {
            let _ = job.events.send(Event::Error(ApiError::model_not_found(&job.model)));
            return;
        };
        let events = job.events.clone();
        let next_task = &mut self.next_task;
        let mut next_id = || {
            *next_task += 1;
            *next_task
        };
        let tasks = match model.prepare(job, &mut next_id) {
            Ok(tasks) => tasks,
            Err(err) => {
                let _ = events.send(Event::Error(err));
                return;
            }
        };
        if let Err((err, _)) = model.enqueue(tasks) {
            let _ = events.send(Event::Error(err));
        }
    }

    fn load(
        &mut self,
        settings: ModelSettings,
        reply: oneshot::Sender<Result<String, EngineError>>,
    ) {
        let id = settings.id();
        if self.models.iter().any(|m| m.id == id) || self.sleeping.iter().any(|(_, d)| d.id == id) {
            let err =
                ApiError::invalid("model_id", format!("a model named `{id}` is already loaded"));
            let _ = reply.send(Err(err.into()));
            return;
        }
        let result = self.load_model(settings, "start");
        self.publish();
        let _ = reply.send(result);
    }

    /// Loads a model and adds it to those served; `reason` labels the count.
    fn load_model(
        &mut self,
        settings: ModelSettings,
        reason: &'static str,
    ) -> Result<String, EngineError> {
        self.snapshot.rcu(|s| Snapshot { loading: s.loading + 1, ..(**s).clone() });
        let started = Instant::now();
        // A load takes as long as the file does: not stuck.
        self.heart.rest(true);
        let result = ModelRuntime::load(&self.backend, settings, self.drawn.0.clone());
        self.heart.rest(false);
        self.snapshot.rcu(|s| Snapshot { loading: s.loading.saturating_sub(1), ..(**s).clone() });
        result.map(|model| {
            tracing::info!(model = %model.id, elapsed = ?started.elapsed(), "load finished");
            let id = model.id.clone();
            metrics::counter!(m::MODEL_LOADS, "model" => id.clone(), "reason" => reason)
                .increment(1);
            self.models.push(model);
            id
        })
    }

    /// Unloads every model, keeping what loads it again, once the engine has
    /// been idle for `sleep_idle_s` with no request in flight.
    fn fall_asleep(&mut self) {
        if self.models.iter().any(ModelRuntime::is_busy) || !self.idle.fall_asleep() {
            return;
        }
        for model in std::mem::take(&mut self.models) {
            let s = model.snapshot();
            metrics::counter!(m::MODEL_UNLOADS, "model" => s.id.clone(), "reason" => "idle")
                .increment(1);
            let dormant = Dormant { id: s.id, info: s.info, created: s.created };
            self.sleeping.push((model.settings().clone(), dormant));
            self.unloaded.push(model.model());
        }
        // The published state lets go of the readers before the models go.
        self.publish();
        self.free_unloaded();
        tracing::info!(models = self.sleeping.len(), "idle: models unloaded until a request");
    }

    /// Loads the sleeping models again. One that fails to load stays asleep,
    /// for the next request to try again, and the request is refused.
    fn wake(&mut self) -> Result<(), ApiError> {
        let mut failed = None;
        for (settings, dormant) in std::mem::take(&mut self.sleeping) {
            if let Err(e) = self.load_model(settings.clone(), "wake") {
                tracing::error!(model = %dormant.id, error = %e, "waking: load failed");
                failed = Some(ApiError::new(
                    slotgate_protocol::ErrorType::UnavailableError,
                    format!("model `{}` could not be loaded again after sleeping", dormant.id),
                ));
                self.sleeping.push((settings, dormant));
            }
        }
        if self.sleeping.is_empty() {
            self.idle.woke();
        }
        self.publish();
        failed.map_or(Ok(()), Err)
    }

    /// Publishes the state of every model for the HTTP side, and the gauges; then
    /// sends the events that this state follows from.
    fn publish(&mut self) {
        let models: Vec<ModelSnapshot> = self.models.iter().map(ModelRuntime::snapshot).collect();
        let busy = models.iter().flat_map(|m| &m.slots).filter(|s| s.is_processing).count();
        let waiting = models.iter().map(|m| m.queue_depth).sum::<usize>();
        m::llama_server::TOTALS.load(busy, waiting);
        for model in &models {
            let busy = model.slots.iter().filter(|s| s.is_processing).count();
            metrics::gauge!(m::SLOTS, "model" => model.id.clone()).set(model.slots.len() as f64);
            metrics::gauge!(m::SLOTS_BUSY, "model" => model.id.clone()).set(busy as f64);
            metrics::gauge!(m::QUEUE_DEPTH, "model" => model.id.clone())
                .set(model.queue_depth as f64);
            // The same, as vLLM names them, for schedulers that read vLLM's.
            // A shared cache's slots each show the whole of it.
            let per_slot = model.slots.iter().map(|s| u64::from(s.n_ctx));
            let cells =
                if model.info.kv_unified { per_slot.max().unwrap_or(0) } else { per_slot.sum() };
            let used: u64 = model.slots.iter().filter_map(|s| s.n_cached).map(u64::from).sum();
            let name = || ("model_name", model.id.clone());
            metrics::gauge!(m::VLLM_RUNNING, &[name()]).set(busy as f64);
            metrics::gauge!(m::VLLM_WAITING, &[name()]).set(model.queue_depth as f64);
            let usage = if cells == 0 { 0.0 } else { used as f64 / cells as f64 };
            metrics::gauge!(m::VLLM_KV_USAGE, &[name()]).set(usage.min(1.0));
            // llama.cpp's KV cells hold one token each: blocks of one.
            let config = [
                name(),
                ("block_size", "1".to_owned()),
                ("num_gpu_blocks", cells.to_string()),
                ("cache_dtype", "f16".to_owned()),
                ("enable_prefix_caching", "True".to_owned()),
            ];
            metrics::gauge!(m::VLLM_CACHE_CONFIG, &config).set(1.0);
        }
        let previous = self.snapshot.load();
        let shown: Vec<(String, Vec<i64>, usize)> = models
            .iter()
            .map(|m| (m.id.clone(), m.slots.iter().map(|s| s.id_task).collect(), m.queue_depth))
            .collect();
        let mut seq = previous.seq;
        if shown != self.shown {
            seq += 1;
            self.shown = shown;
        }
        let loading = previous.loading;
        let step_us = self.step_us;
        let sleeping = self.sleeping.iter().map(|(_, d)| d.clone()).collect();
        self.snapshot.store(Arc::new(Snapshot { models, sleeping, loading, seq, step_us }));
        if seq != previous.seq {
            self.changed.send_replace(seq);
        }
        self.outbox.flush();
    }
}

//! The scheduler: one thread that owns llama.cpp, and the handle HTTP handlers use
//! to reach it.
//!
//! Every request, streamed or not, becomes the same [`Job`]; the same queue and the
//! same decode loop run it. Only the response writer differs.

mod aside;
mod embed;
mod grammar;
mod heartbeat;
mod host_cache;
mod job;
mod model;
mod sampler;
mod sleep;
mod slot;
mod snapshot;
pub mod text;
mod worker;

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

use arc_swap::ArcSwap;
use llama_cpp_2::llama_backend::LlamaBackend;
use slotgate_protocol::ApiError;
use tokio::sync::{mpsc, oneshot};

pub use embed::{EmbedKind, Embedded};
pub use job::{
    ChoiceIndex, ChoiceUsage, Event, GenParams, Job, JobInput, Opening, PromptProgress, Render,
};
pub use model::{ModelInfo, ModelSnapshot, Reader, VocabAnswer, VocabOp};
pub use sleep::{Dormant, Idle, Visit};
pub use snapshot::{Served, Snapshot};

use crate::config::ModelSettings;
use crate::error::EngineError;

/// How many commands may wait for the scheduler thread. Jobs beyond it are refused
/// with 503 at once: the thread drains this channel every step, so it only fills
/// under a burst far larger than any queue.
const COMMAND_CAPACITY: usize = 1024;

/// The scheduler thread's stack, in bytes.
const SCHEDULER_STACK: usize = 64 << 20;

/// Commands to the scheduler thread.
pub(crate) enum Command {
    Submit(Job),
    Embed(EmbedJob),
    Load(ModelSettings, oneshot::Sender<Result<String, EngineError>>),
    Unload(String, oneshot::Sender<Result<(), EngineError>>),
    /// Load the models that sleep again.
    Wake(oneshot::Sender<Result<(), ApiError>>),
    SlotFile(SlotFileJob),
}

/// A slot's sequence saved to a file, restored from one, or erased
/// (llama-server's `/slots/{id}?action=`).
pub struct SlotFileJob {
    /// The model whose slot it is.
    pub model: String,
    /// The slot.
    pub slot: u32,
    /// What to do.
    pub op: SlotOp,
    /// Tokens and bytes moved, or why not.
    pub reply: oneshot::Sender<Result<SlotFileDone, ApiError>>,
}

/// What to do with a slot's sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotOp {
    /// Write its tokens and KV state to this file, in llama.cpp's format.
    Save(std::path::PathBuf),
    /// Replace them with those of this file.
    Restore(std::path::PathBuf),
    /// Forget them.
    Erase,
}

/// What a slot file operation moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotFileDone {
    /// Tokens saved, restored or erased.
    pub tokens: usize,
    /// Bytes written or read.
    pub bytes: usize,
    /// How long it took on the scheduler thread.
    pub elapsed: std::time::Duration,
}

/// An embeddings request: the inputs, and where the vectors go.
pub struct EmbedJob {
    /// The model asked for.
    pub model: String,
    /// The inputs as tokens ([`Reader::read_inputs`]), in the order of the answer.
    pub inputs: Vec<Vec<llama_cpp_2::token::LlamaToken>>,
    /// Each input's vector and token count, or why there are none.
    pub reply: oneshot::Sender<Result<Vec<Embedded>, ApiError>>,
}

/// A handle to the scheduler thread. Cheap to clone; the thread stops when the last
/// handle is dropped and its running work is done.
#[derive(Clone)]
pub struct Scheduler {
    commands: SyncSender<Command>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    /// The `seq` of the last published change, for those who wait for the next.
    changes: tokio::sync::watch::Receiver<u64>,
    /// Whether the thread still comes round its loop.
    heart: Arc<heartbeat::Heartbeat>,
    /// Permits to read a request off the loop: one per core.
    readers: Arc<tokio::sync::Semaphore>,
    /// Whether the models sleep, and the requests that keep them awake.
    idle: Arc<Idle>,
}

impl Scheduler {
    /// Initializes llama.cpp and starts the scheduler thread with no model
    /// loaded; after `sleep_after` without work, it unloads the models until a
    /// request needs one ([`Scheduler::wake`]).
    pub fn start(sleep_after: Option<std::time::Duration>) -> Result<Self, EngineError> {
        let idle = Arc::new(Idle::new(sleep_after));
        let idle_there = idle.clone();
        let (commands, receiver) = sync_channel(COMMAND_CAPACITY);
        let snapshot = Arc::new(ArcSwap::from_pointee(Snapshot::default()));
        let shared = snapshot.clone();
        let (changed, changes) = tokio::sync::watch::channel(0);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let heart = Arc::new(heartbeat::Heartbeat::default());
        let beating = heart.clone();
        // A large stack: llama.cpp recurses over a grammar's rules, and while
        // `constrain::budget` bounds that depth, a margin costs only address space.
        std::thread::Builder::new().name("scheduler".into()).stack_size(SCHEDULER_STACK).spawn(
            move || {
                let _alive = beating.alive();
                // The backend is created on this thread and never leaves it.
                let mut backend = match LlamaBackend::init() {
                    Ok(backend) => backend,
                    Err(e) => {
                        let _ = ready_tx.send(Err(EngineError::Llama(e.to_string())));
                        return;
                    }
                };
                backend.void_logs();
                let _ = ready_tx.send(Ok(()));
                worker::Worker::new(backend, receiver, shared, changed, beating, idle_there).run();
            },
        )?;
        ready_rx.recv().map_err(|_| EngineError::SchedulerGone)??;
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let readers = Arc::new(tokio::sync::Semaphore::new(cores.max(2)));
        Ok(Self { commands, snapshot, changes, heart, readers, idle })
    }

    /// Marks a request that needs a model in flight (the models do not fall
    /// asleep until it ends), and wakes them if they sleep: the request waits
    /// for the load. Every request that reads a model comes through here first.
    pub async fn wake(&self) -> Result<Visit, ApiError> {
        let visit = self.idle.visit();
        if self.idle.is_asleep() {
            let (tx, rx) = oneshot::channel();
            self.send(Command::Wake(tx)).await.map_err(|e| e.to_api())?;
            rx.await.map_err(|_| EngineError::SchedulerGone.to_api())??;
        }
        Ok(visit)
    }

    /// Sends a job. Its events, errors included, arrive on the job's channel.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        match self.commands.try_send(Command::Submit(job)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                Err(ApiError::slot_unavailable("the engine is overloaded; retry later"))
            }
            Err(TrySendError::Disconnected(_)) => Err(EngineError::SchedulerGone.to_api()),
        }
    }

    /// Embeds inputs with a model whose embeddings are enabled. They are
    /// tokenized and measured on a blocking thread first, as prompts are.
    pub async fn embed(
        &self,
        served: &Served,
        inputs: Vec<slotgate_protocol::PromptItem>,
    ) -> Result<Vec<Embedded>, ApiError> {
        if served.info.reranking {
            let why = format!(
                "model `{}` is loaded for reranking (/v1/rerank), not embeddings",
                served.id
            );
            return Err(ApiError::invalid("model", why));
        }
        if !served.info.embedding {
            return Err(embed::not_enabled(&served.id));
        }
        let reader = served.reader.clone();
        let inputs = self.off_loop(move || reader.read_inputs(&inputs)).await??;
        let (reply, rx) = oneshot::channel();
        let model = served.id.clone();
        self.ask(Command::Embed(EmbedJob { model, inputs, reply }), rx).await
    }

    /// Scores each of `documents` for `query` with a reranker (a model loaded
    /// with `reranking`): one value each, in order, with its token count.
    pub async fn rerank(
        &self,
        served: &Served,
        query: String,
        documents: Vec<String>,
    ) -> Result<Vec<Embedded>, ApiError> {
        if !served.info.reranking {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "reranking is not enabled for model `{}`; load it with reranking = true",
                    served.id
                ),
            ));
        }
        let reader = served.reader.clone();
        let inputs = self.off_loop(move || reader.read_rerank(&query, &documents)).await??;
        let (reply, rx) = oneshot::channel();
        let model = served.id.clone();
        self.ask(Command::Embed(EmbedJob { model, inputs, reply }), rx).await
    }

    /// Tokenizes, detokenizes or renders a chat with `model`'s vocabulary and
    /// template (the only model's, when `None`), on a blocking thread.
    pub async fn vocab(&self, model: Option<String>, op: VocabOp) -> Result<VocabAnswer, ApiError> {
        let reader = self.snapshot().pick(model.as_deref())?.reader.clone();
        self.off_loop(move || reader.vocab_op(op)).await?
    }

    /// Runs `read` (rendering, tokenizing, compiling: work as large as a
    /// request) on a blocking thread, never the scheduler's, and at most one per
    /// core at once: a crowd of large requests waits here, in arrival order,
    /// rather than crowding the decode loop off its cores. A caller that goes
    /// away while waiting gives its turn up.
    pub async fn off_loop<T: Send + 'static>(
        &self,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let _turn = self.readers.acquire().await.map_err(|_| ApiError::internal())?;
        tokio::task::spawn_blocking(read).await.map_err(|_| ApiError::internal())
    }

    /// Sends `cmd`, whose answer comes back on `rx`; refused at once when the
    /// thread's channel is full.
    async fn ask<T>(
        &self,
        cmd: Command,
        rx: oneshot::Receiver<Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        match self.commands.try_send(cmd) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(ApiError::slot_unavailable("the engine is overloaded; retry later"));
            }
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::SchedulerGone.to_api()),
        }
        rx.await.map_err(|_| EngineError::SchedulerGone.to_api())?
    }

    /// Loads a model and returns its id once it serves.
    pub async fn load(&self, settings: ModelSettings) -> Result<String, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Load(settings, tx)).await?;
        rx.await.map_err(|_| EngineError::SchedulerGone)?
    }

    /// Saves, restores or erases a slot's sequence.
    pub async fn slot_file(
        &self,
        model: String,
        slot: u32,
        op: SlotOp,
    ) -> Result<SlotFileDone, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::SlotFile(SlotFileJob { model, slot, op, reply })).await?;
        Ok(rx.await.map_err(|_| EngineError::SchedulerGone)??)
    }

    /// Unloads a model; its running and queued requests fail with 503.
    pub async fn unload(&self, id: String) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Unload(id, tx)).await?;
        rx.await.map_err(|_| EngineError::SchedulerGone)?
    }

    /// Sends a load or unload, waiting for room: they are rare and must not be
    /// refused as a job is. The wait is on one of tokio's blocking threads
    /// (pooled, and bounded in number), never a new one per command.
    async fn send(&self, cmd: Command) -> Result<(), EngineError> {
        let cmd = match self.commands.try_send(cmd) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(cmd)) => cmd,
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::SchedulerGone),
        };
        let commands = self.commands.clone();
        let sent = tokio::task::spawn_blocking(move || commands.send(cmd).is_ok()).await;
        match sent {
            Ok(true) => Ok(()),
            _ => Err(EngineError::SchedulerGone),
        }
    }

    /// Why the scheduler thread is not serving: stuck in one turn of its loop for
    /// longer than `bound`, or ended; `None` while it serves.
    pub fn failure(&self, bound: std::time::Duration) -> Option<String> {
        self.heart.failed(bound)
    }

    /// The state of all models as last published.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Resolves at each published change of the slots or queues.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.clone()
    }

    /// A new job of prompts read by the model's [`Reader`], sent by gateway
    /// replica `replica` if one said, and the receiver of its events.
    pub fn job(
        model: String,
        read: model::ReadJob,
        params: GenParams,
        replica: Option<Arc<str>>,
    ) -> (Job, mpsc::UnboundedReceiver<Event>) {
        let (events, rx) = mpsc::unbounded_channel();
        let grammar = read.grammar.map(Arc::new);
        let replay = read.replay;
        (Job { model, prompts: read.prompts, params, grammar, events, replica, replay }, rx)
    }
}

//! What HTTP handlers hand to the scheduler, and what they hear back.
//!
//! A job is one request. It becomes one task per choice (prompt × sample), each of
//! which runs in a slot of its own; all tasks of a job report through the job's one
//! event channel, tagged with the choice index. When the receiver of that channel is
//! dropped (the client went away), every task of the job is cancelled.

use std::sync::Arc;
use std::time::Instant;

use slotgate_protocol::{ApiError, ChatMessage, FinishReason, PromptItem, TokenLogprob, Tool};
use tokio::sync::mpsc;

/// What to generate from.
#[derive(Debug, Clone)]
pub enum JobInput {
    /// A conversation, rendered with the model's chat template, and the tools
    /// a Jinja template with a tool section is given.
    Chat(Vec<ChatMessage>, Option<Vec<Tool>>, Render),
    /// Text completion prompts; choice indexes run prompt-major.
    Prompts(Vec<PromptItem>),
}

/// How a conversation is rendered, beside its messages and tools.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Render {
    /// How the prompt ends.
    pub opening: Opening,
    /// More variables for a Jinja template (`enable_thinking`, a request's
    /// `chat_template_kwargs`); other templates have none.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// How a rendered conversation ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Opening {
    /// With the assistant's turn opened, for the model to write it.
    #[default]
    Assistant,
    /// With the assistant's turn opened and this text already in it: the model
    /// goes on from it (a prefill, vLLM's `continue_final_message`).
    Continue(String),
    /// With the last message closed and nothing opened
    /// (`add_generation_prompt: false`).
    Closed,
}

impl Opening {
    /// Whether the template opens the assistant's turn.
    pub fn opens(&self) -> bool {
        !matches!(self, Self::Closed)
    }
}

/// How to sample, the same for every choice of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Most tokens per choice; `None` runs until the end of the slot's context.
    pub max_tokens: Option<u32>,
    /// Stop strings, never part of the output.
    pub stop: Vec<String>,
    /// Choices per prompt.
    pub n: u32,
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus sampling mass.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: i32,
    /// Minimum probability relative to the best token.
    pub min_p: f32,
    /// Sampler seed; choice `i` of a prompt uses `seed + i`. Random when `None`.
    pub seed: Option<i64>,
    /// OpenAI's presence penalty.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty.
    pub frequency_penalty: f32,
    /// Token id and bias.
    pub logit_bias: Vec<(i32, f32)>,
    /// Never end at an end-of-generation token (they are banned by
    /// `logit_bias` once the request is read).
    pub ignore_eos: bool,
    /// Text and bias (llama-server's form): each token of the text gets the
    /// bias; moved into `logit_bias` when the request is read.
    pub logit_bias_text: Vec<(String, f32)>,
    /// Send the prompt before the generated text (text completions).
    pub echo: bool,
    /// Reuse the longest cached prefix of the prompt.
    pub cache_prompt: bool,
    /// Only caches made under the same salt are reused (`None` is a salt too).
    pub cache_salt: Option<Arc<str>>,
    /// A GBNF grammar (root rule `root`) that the output must match.
    pub grammar: Option<String>,
    /// Report each token's log probability with this many alternatives.
    pub logprobs: Option<u32>,
    /// Send [`Event::Progress`] while the prompt is read (llama-server's
    /// `return_progress`, on streams).
    pub return_progress: bool,
    /// Log probabilities of the distribution drawn from, after the chain,
    /// rather than the model's own (llama-server's `post_sampling_probs`).
    pub post_sampling_probs: bool,
    /// Each text event carries the choice's counts and times so far
    /// (llama-server's `timings_per_token`).
    pub timings_per_token: bool,
    /// Where a stream that began on another engine goes on from.
    pub resume: Option<slotgate_protocol::resume::Resume>,
}

impl Default for GenParams {
    /// llama.cpp's server defaults.
    fn default() -> Self {
        Self {
            max_tokens: None,
            stop: Vec::new(),
            n: 1,
            temperature: 0.8,
            top_p: 0.95,
            top_k: 40,
            min_p: 0.05,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            ignore_eos: false,
            logit_bias_text: Vec::new(),
            echo: false,
            cache_prompt: true,
            cache_salt: None,
            grammar: None,
            logprobs: None,
            return_progress: false,
            post_sampling_probs: false,
            timings_per_token: false,
            resume: None,
        }
    }
}

impl GenParams {
    /// Reads the OpenAI sampling fields: what `sampling` asks for, `d`'s
    /// settings (the engine's defaults) where it sends none.
    pub fn from_sampling(
        sampling: &slotgate_protocol::Sampling,
        max_tokens: Option<u32>,
        d: &Self,
    ) -> Self {
        Self {
            max_tokens,
            stop: sampling.stop_strings(),
            n: sampling.n(),
            temperature: sampling.temperature.unwrap_or(d.temperature),
            top_p: sampling.top_p.unwrap_or(d.top_p),
            top_k: sampling.top_k.unwrap_or(d.top_k),
            min_p: sampling.min_p.unwrap_or(d.min_p),
            seed: sampling.seed,
            presence_penalty: sampling.presence_penalty.unwrap_or(0.0),
            frequency_penalty: sampling.frequency_penalty.unwrap_or(0.0),
            logit_bias: sampling.logit_bias_pairs(),
            ignore_eos: sampling.ignore_eos.unwrap_or(false),
            logit_bias_text: Vec::new(),
            echo: false,
            cache_prompt: sampling.cache_prompt.unwrap_or(true),
            cache_salt: sampling.cache_salt.as_deref().map(Arc::from),
            grammar: None,
            logprobs: None,
            return_progress: sampling.return_progress.unwrap_or(false),
            post_sampling_probs: sampling.post_sampling_probs.unwrap_or(false),
            timings_per_token: sampling.timings_per_token.unwrap_or(false),
            resume: sampling.slotgate_resume.clone(),
        }
    }
}

/// Which choice of a job: its prompt, and which of that prompt's `n` samples.
/// Built where a job becomes tasks, read where the answer is written; nothing
/// between does arithmetic on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChoiceIndex {
    /// The prompt, in the request's order.
    pub prompt: u32,
    /// The sample of that prompt, `0..n`.
    pub sample: u32,
    /// Samples per prompt (`n`).
    n: u32,
}

impl ChoiceIndex {
    /// Sample `sample` of prompt `prompt`, of `n` per prompt.
    pub fn new(prompt: u32, sample: u32, n: u32) -> Self {
        Self { prompt, sample, n }
    }

    /// OpenAI's `index`: the samples of one prompt numbered together, prompt
    /// after prompt.
    pub fn flat(self) -> u32 {
        self.prompt * self.n + self.sample
    }
}

/// What one finished choice used: its token counts, its slot and its time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChoiceUsage {
    /// Tokens of the choice's prompt.
    pub prompt_tokens: u32,
    /// Prompt tokens found in the slot's cache and not decoded again.
    pub cached_tokens: u32,
    /// Tokens sampled, the end-of-generation token included.
    pub completion_tokens: u32,
    /// The slot that served it (llama-server's `id_slot`).
    pub slot: u32,
    /// From its admission to a slot to its first sampled token: reading the prompt.
    pub prompt_time: std::time::Duration,
    /// From its first sampled token to its end.
    pub generation_time: std::time::Duration,
}

/// What the scheduler tells a job, on the job's own channel.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New text of choice `index`; never a broken character or part of a stop string.
    Text {
        /// The choice.
        index: ChoiceIndex,
        /// The text.
        text: String,
        /// The log probabilities of the tokens sampled since the last event, when
        /// asked for (a token's text may come in a later event than its entry).
        logprobs: Vec<TokenLogprob>,
        /// The ids of the tokens sampled since the last event.
        tokens: Vec<i32>,
        /// The choice's counts and times so far, when asked for
        /// (`timings_per_token`).
        so_far: Option<ChoiceUsage>,
    },
    /// The text of the tokens a resumed choice began with, which its client
    /// already has: a writer reads it to stand where the first engine stood,
    /// and sends nothing for it.
    Replayed {
        /// The choice.
        index: ChoiceIndex,
        /// The text those tokens made, as the client got it.
        text: String,
    },
    /// Choice `index` is complete.
    Done {
        /// The choice.
        index: ChoiceIndex,
        /// Why it stopped.
        reason: FinishReason,
        /// The stop string that stopped it, if one did.
        stop: Option<String>,
        /// Its token counts.
        usage: ChoiceUsage,
    },
    /// How far choice `index` has read its prompt, when asked for
    /// (`return_progress`): once when it gets its slot, then after each chunk.
    Progress {
        /// The choice.
        index: ChoiceIndex,
        /// Its prompt's reading so far.
        progress: PromptProgress,
    },
    /// The job failed; no more events follow.
    Error(ApiError),
}

/// llama-server's `prompt_progress`: a prompt's tokens, those its slot had
/// cached, those read since, and the time that took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptProgress {
    /// Tokens of the prompt.
    pub total: u32,
    /// Tokens found in the slot's cache.
    pub cache: u32,
    /// Tokens read (decoded) so far.
    pub processed: u32,
    /// Since the slot took the prompt.
    pub time: std::time::Duration,
}

/// One request, as sent to the scheduler.
#[derive(Debug)]
pub struct Job {
    /// The model asked for.
    pub model: String,
    /// Its prompts, read into tokens before the job was handed over
    /// ([`super::Reader`]), each with the text an echo sends.
    pub prompts: Vec<(Vec<llama_cpp_2::token::LlamaToken>, String)>,
    /// How to sample.
    pub params: GenParams,
    /// `params.grammar`, compiled by the reader; choices sample with copies.
    pub grammar: Option<Arc<super::grammar::Grammar>>,
    /// Where events go; dropping its receiver cancels the job.
    pub events: mpsc::UnboundedSender<Event>,
    /// The gateway replica that sent it (`x-slotgate-replica`), if one said.
    pub replica: Option<Arc<str>>,
    /// Of a resumed stream: the answer so far, read after its one prompt.
    pub replay: Option<super::model::Replay>,
}

/// One choice of a job, waiting for or running in a slot.
#[derive(Debug)]
pub(crate) struct Task {
    /// A process-wide id, shown as `id_task` in `/slots`.
    pub id: u64,
    /// Which choice of the job it is.
    pub index: ChoiceIndex,
    /// The prompt, tokenized.
    pub prompt: Arc<Vec<llama_cpp_2::token::LlamaToken>>,
    /// The job's sampling settings.
    pub params: Arc<GenParams>,
    /// The job's compiled grammar, shared by its choices.
    pub grammar: Option<Arc<super::grammar::Grammar>>,
    /// The sampler seed of this choice.
    pub seed: u32,
    /// The prompt's text, sent first when `params.echo` is set.
    pub echo_text: Option<Arc<String>>,
    /// The job's event channel.
    pub events: mpsc::UnboundedSender<Event>,
    /// When the job reached the scheduler.
    pub enqueued: Instant,
    /// The gateway replica that sent the job, if one said.
    pub replica: Option<Arc<str>>,
    /// Of a resumed stream: the answer so far, whose tokens end `prompt`.
    pub replay: Option<Box<super::model::Replay>>,
}

impl Task {
    /// Whether the client has gone away.
    pub fn cancelled(&self) -> bool {
        self.events.is_closed()
    }

    /// Queues an event in `outbox`; a closed channel is noticed by `cancelled` on the
    /// next step.
    pub fn send(&self, outbox: &mut Outbox, event: Event) {
        outbox.0.push((self.events.clone(), event));
    }
}

/// Events of one step, held back until the state they follow from is published.
/// A client then never knows more than `/slots` shows: a slot is busy there before
/// its first token leaves, and free before its last. The gateway's reconciliation
/// relies on this, and so does anyone reading `/slots` after an answer.
#[derive(Debug, Default)]
pub(crate) struct Outbox(Vec<(mpsc::UnboundedSender<Event>, Event)>);

impl Outbox {
    /// Sends every held event, in order.
    pub fn flush(&mut self) {
        for (events, event) in self.0.drain(..) {
            let _ = events.send(event);
        }
    }
}

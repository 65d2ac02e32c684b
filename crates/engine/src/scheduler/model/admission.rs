//! Admission: the model's queue, and how a queued task gets a slot: which slot,
//! how much of its cache is kept, and what moves to and from the host cache.

use std::time::{Duration, Instant};

use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::token::LlamaToken;
use slotgate_protocol::{ApiError, FinishReason};

use super::{kv_pool, Loaded, ModelRuntime};
use crate::metrics as m;
use crate::scheduler::host_cache::HostCache;
use crate::scheduler::job::{Event, Outbox, PromptProgress, Task};
use crate::scheduler::model::Replay;
use crate::scheduler::sampler::ChoiceSampler;
use crate::scheduler::slot::{common_prefix, pick_slot, Pick, Running, Slot, KEEP_SHARE};
use crate::scheduler::text::TextStream;

/// Caches shorter than this are not worth a copy in host memory: re-reading them
/// costs less than a step.
const MIN_SAVED_TOKENS: usize = 16;

impl ModelRuntime {
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

    pub(super) fn reap_cancelled(&mut self) {
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

    pub(super) fn expire_queue(&mut self, outbox: &mut Outbox) {
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

    pub(super) fn admit(&mut self, step_no: u64, outbox: &mut Outbox) {
        if !self.settings.cont_batching
            && self.slots.iter().any(|s| s.running.as_ref().is_some_and(Running::in_prompt))
        {
            return;
        }
        while !self.queue.is_empty() {
            let similarity = self.settings.slot_prompt_similarity;
            let next = &self.queue[0];
            let salt = next.params.cache_salt.as_deref();
            let Some((i, pick)) = pick_slot(&self.slots, &next.prompt, salt, similarity) else {
                return;
            };
            if self.settings.kv_unified && !self.room_in_pool(i) {
                return;
            }
            let Some(task) = self.queue.pop_front() else { return };
            self.start(i, pick, task, step_no, outbox);
        }
    }

    /// Whether the task at the head of the queue fits the shared KV cache in
    /// slot `chosen`, once the idle caches that must give way have gone (to
    /// the host cache); false leaves it waiting (see `kv_pool`).
    fn room_in_pool(&mut self, chosen: usize) -> bool {
        let pool = self.settings.seq_len() as usize;
        let reserve = |t: &Task| kv_pool::reservation(t.prompt.len(), t.params.max_tokens, pool);
        let Some(next) = self.queue.front() else { return false };
        let need = reserve(next);
        let held: Vec<kv_pool::Held> = self
            .slots
            .iter()
            .map(|s| kv_pool::Held {
                reserved: s.running.as_ref().map(|r| reserve(&r.task)),
                cached: s.cache.len(),
                last_used: s.last_used,
            })
            .collect();
        let Some(dropped) = kv_pool::make_room(pool, need, &held, chosen) else { return false };
        for i in dropped {
            let slot = &mut self.slots[i];
            Self::save_to_host(&mut self.loaded, &mut self.host_cache, slot, &self.id);
            self.loaded.with_dependent_mut(|_, c| {
                let _ = c.gen.clear_kv_cache_seq(Some(slot.id), None, None);
            });
            slot.cache.clear();
            tracing::debug!(model = %self.id, slot = slot.id, "idle cache gave way in the shared KV cache");
        }
        true
    }

    /// Puts `task` in slot `i`, keeping the longest cached prefix of its prompt:
    /// the slot's own, or one restored from the host cache when that is longer.
    /// What the slot held goes to the host cache first when most of it would be lost.
    fn start(&mut self, i: usize, pick: Pick, mut task: Task, step_no: u64, outbox: &mut Outbox) {
        let mut sampler =
            ChoiceSampler::new(&task.params, task.seed, self.n_vocab, task.grammar.as_deref());
        let replay = task.replay.take();
        let answered = replay.as_ref().map_or(0, |r| r.tokens);
        sampler.recall(&task.prompt[task.prompt.len() - answered as usize..]);
        let salt = &task.params.cache_salt;
        let mut shared = self.slots[i].shared(&task.prompt, salt.as_deref());
        if task.params.cache_prompt && self.host_cache.enabled() && pick != Pick::Warm {
            shared = self.restore_from_host(i, &task.prompt, salt.as_deref(), shared);
        }
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
        // What the slot holds from here on is this task's, under its salt.
        slot.salt.clone_from(salt);
        slot.last_used = step_no;
        tracing::debug!(model = %self.id, slot = slot.id, ?pick, keep, prompt = task.prompt.len(), "admitted");
        let wait = task.enqueued.elapsed();
        metrics::histogram!(m::QUEUE_WAIT, "model" => self.id.clone()).record(wait.as_secs_f64());
        Self::opening(&task, replay.as_deref(), keep, outbox);
        // A resumed answer that was already whole ends here, with nothing decoded.
        let whole = match &replay {
            Some(r) if r.stopped => Some(FinishReason::Stop),
            _ if task.params.max_tokens.is_some_and(|max| answered >= max) => {
                Some(FinishReason::Length)
            }
            _ => None,
        };
        let text = match replay {
            Some(replay) => replay.text,
            None => TextStream::new(task.params.stop.clone()),
        };
        let run = Running {
            sampler: Some(sampler),
            text,
            logprobs: Vec::new(),
            ids: Vec::new(),
            n_prompt_done: keep,
            cached: keep,
            generated: answered,
            answered,
            next: None,
            logits_at: None,
            admitted: Instant::now(),
            first_token: None,
            task,
        };
        match whole {
            Some(reason) => super::decode::finish(run, reason, (&self.id, slot.id), outbox),
            None => slot.running = Some(run),
        }
    }

    /// The events a task sends when it gets its slot: the prompt of an echo,
    /// the text a resumed choice began with, the prompt's progress.
    fn opening(task: &Task, replay: Option<&Replay>, keep: usize, outbox: &mut Outbox) {
        if let Some(text) = &task.echo_text {
            task.send(
                outbox,
                Event::Text {
                    index: task.index,
                    text: text.to_string(),
                    logprobs: Vec::new(),
                    tokens: Vec::new(),
                    so_far: None,
                },
            );
        }
        if let Some(replay) = replay.filter(|r| r.opened) {
            let text = replay.sent.clone();
            task.send(outbox, Event::Replayed { index: task.index, text });
        }
        if task.params.return_progress {
            let progress = PromptProgress {
                total: task.prompt.len() as u32,
                cache: keep as u32,
                processed: 0,
                time: std::time::Duration::ZERO,
            };
            task.send(outbox, Event::Progress { index: task.index, progress });
        }
    }

    /// Restores into slot `i` the host-cache entry of `salt` that shares the most
    /// with `prompt`, when it shares more than the slot's own `shared` tokens and a
    /// real part of the prompt. The slot's cache goes to the host cache first.
    /// Returns the shared prefix the slot now holds.
    fn restore_from_host(
        &mut self,
        i: usize,
        prompt: &[LlamaToken],
        salt: Option<&str>,
        shared: usize,
    ) -> usize {
        let need = (self.settings.slot_prompt_similarity * prompt.len() as f32).ceil() as usize;
        // A gain of one token is no gain: the last prompt token is decoded anyway.
        let min = need.max(shared + 2).max(MIN_SAVED_TOKENS);
        let Some(entry) = self.host_cache.take_best(prompt, salt, min) else {
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
                slot.salt = entry.salt;
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
                let kept = host_cache.insert(slot.cache.clone(), slot.salt.clone(), state);
                tracing::debug!(model = %id, slot = slot.id, tokens = slot.cache.len(), bytes, kept, "saved to host cache");
            }
            Err(err) => tracing::warn!(model = %id, error = %err, "host cache save failed"),
        }
        publish_host_cache(host_cache, id);
    }
}

/// Sets the host cache's gauges of model `id`.
fn publish_host_cache(host_cache: &HostCache<SeqState>, id: &str) {
    metrics::gauge!(m::HOST_CACHE_BYTES, "model" => id.to_owned()).set(host_cache.used() as f64);
    metrics::gauge!(m::HOST_CACHE_ENTRIES, "model" => id.to_owned()).set(host_cache.len() as f64);
}

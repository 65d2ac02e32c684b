//! The decode step: one batch built from every running slot (generating slots
//! first, then prompt chunks), decoded, and every slot with logits sampled, here
//! or, when the draw needs every logit in hand, beside the loop.

use std::time::{Duration, Instant};

use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use slotgate_protocol::{ApiError, FinishReason, TokenLogprob, TopLogprob};

use super::ModelRuntime;
use crate::metrics as m;
use crate::scheduler::aside::{draw_aside, Draw, Drew};
use crate::scheduler::job::{Event, Outbox, PromptProgress};
use crate::scheduler::sampler::Drawn;
use crate::scheduler::slot::{Running, Slot};

impl ModelRuntime {
    /// Builds one batch from every running slot, decodes it, samples.
    pub(super) fn decode_and_sample(&mut self, outbox: &mut Outbox) -> (bool, Duration) {
        let Self { loaded, batch, slots, settings, id, aside, .. } = self;
        let capacity = settings.batch_size as usize;
        let chunks = fill(batch, slots, capacity);
        if batch.n_tokens() == 0 {
            return (false, Duration::ZERO);
        }
        let llama_started = Instant::now();
        let decoded = loaded.with_dependent_mut(|_, c| c.gen.decode(batch));
        let mut in_llama = llama_started.elapsed();
        if let Err(err) = decoded {
            tracing::error!(model = %id, error = %err, tokens = batch.n_tokens(), "decode failed");
            fail_all(loaded, slots, outbox);
            return (true, in_llama);
        }
        let busy = slots.iter().filter(|s| s.running.is_some()).count();
        m::llama_server::TOTALS.decoded(busy);
        // Record what is now in each sequence's cache.
        for (i, n) in chunks {
            let slot = &mut slots[i];
            if let Some(run) = slot.running.as_mut() {
                let start = run.n_prompt_done;
                slot.cache.extend_from_slice(&run.task.prompt[start..start + n]);
                run.n_prompt_done += n;
                if run.task.params.return_progress {
                    let progress = PromptProgress {
                        total: run.task.prompt.len() as u32,
                        cache: run.cached as u32,
                        processed: (run.n_prompt_done - run.cached) as u32,
                        time: run.admitted.elapsed(),
                    };
                    run.task.send(outbox, Event::Progress { index: run.task.index, progress });
                }
            }
        }
        let mut generated = 0u64;
        let model =
            Sampled { model: loaded.borrow_owner(), ctx_len: settings.seq_len() as usize, id };
        for slot in slots.iter_mut() {
            let Some(run) = slot.running.as_mut() else { continue };
            let Some(at) = run.logits_at else { continue };
            if let Some(token) = run.next.take() {
                slot.cache.push(token);
            }
            if run.sampler.as_ref().is_some_and(|s| s.needs_logits()) {
                // Drawn beside the loop from a copy of its logits; the slot sits
                // out of the batch until the token comes back.
                let logits = loaded.with_dependent(|_, c| c.gen.get_logits_ith(at).to_vec());
                if let Some(sampler) = run.sampler.take() {
                    let keep = loaded.borrow_owner().clone();
                    let draw = Draw { model: id.clone(), task: run.task.id, sampler, logits, keep };
                    draw_aside(draw, aside);
                }
                continue;
            }
            let Some(sampler) = run.sampler.as_mut() else { continue };
            let sample_started = Instant::now();
            let drawn = loaded.with_dependent(|_, c| sampler.draw(&c.gen, at));
            in_llama += sample_started.elapsed();
            generated += 1;
            model.settle(slot, drawn, outbox);
        }
        metrics::counter!(m::GENERATED_TOKENS, "model" => id.clone()).increment(generated);
        (true, in_llama)
    }

    /// Takes a token drawn beside the loop: the choice gets its samplers back
    /// and goes on as if it had been drawn in the step. A choice that ended
    /// meanwhile (its client left) drops it.
    pub fn take_drawn(&mut self, drew: Drew, outbox: &mut Outbox) {
        let Drew { task, sampler, drawn, keep, .. } = drew;
        let Self { loaded, slots, settings, id, .. } = self;
        let waiting = |r: &Running| r.task.id == task && r.sampler.is_none();
        if let Some(slot) = slots.iter_mut().find(|s| s.running.as_ref().is_some_and(waiting)) {
            if let Some(run) = slot.running.as_mut() {
                run.sampler = Some(sampler);
            }
            metrics::counter!(m::GENERATED_TOKENS, "model" => id.clone()).increment(1);
            let model =
                Sampled { model: loaded.borrow_owner(), ctx_len: settings.seq_len() as usize, id };
            model.settle(slot, drawn, outbox);
        }
        // The model is let go of here, on the scheduler thread.
        drop(keep);
    }
}

/// Fills `batch` from `slots`: generating slots first, one token each, so that
/// they keep streaming while long prompts are read in chunks with whatever
/// room is left. The prompt chunks added, as (slot, tokens).
fn fill(
    batch: &mut LlamaBatch<'static>,
    slots: &mut [Slot],
    capacity: usize,
) -> Vec<(usize, usize)> {
    batch.clear();
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
    chunks
}

/// A failed decode: every running choice gets an error, and its sequence is
/// cleared, since what the failed batch left in the cache is unknown.
fn fail_all(loaded: &mut super::Loaded, slots: &mut [Slot], outbox: &mut Outbox) {
    for slot in slots.iter_mut() {
        if let Some(run) = slot.running.take() {
            run.task.send(outbox, Event::Error(ApiError::internal()));
            loaded.with_dependent_mut(|_, c| {
                let _ = c.gen.clear_kv_cache_seq(Some(slot.id), None, None);
            });
            slot.cache.clear();
        }
    }
}

/// What sampling needs of the model while its slots are borrowed.
struct Sampled<'a> {
    model: &'a LlamaModel,
    ctx_len: usize,
    id: &'a str,
}

impl Sampled<'_> {
    /// Takes the token drawn for `slot`'s choice, and ends the choice if it must.
    fn settle(&self, slot: &mut Slot, drawn: Drawn, outbox: &mut Outbox) {
        let in_cache = slot.cache.len();
        let Some(run) = slot.running.as_mut() else { return };
        let ended = if drawn.dead_end {
            // The grammar allows nothing more: what was made is all it allows.
            Some(FinishReason::Stop)
        } else {
            self.accept(run, drawn, (in_cache, slot.id), outbox)
        };
        if let Some(reason) = ended {
            if let Some(run) = slot.running.take() {
                finish(run, reason, (self.id, slot.id), outbox);
            }
        }
    }

    /// Takes one sampled token; returns why the choice ends, if it does.
    fn accept(
        &self,
        run: &mut Running,
        drawn: Drawn,
        (in_cache, slot_id): (usize, u32),
        outbox: &mut Outbox,
    ) -> Option<FinishReason> {
        let token = drawn.token;
        let Self { model, ctx_len, id } = *self;
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
        let piece = vocab.token_to_piece(token, false, None);
        if let Some((logprob, top)) = drawn.logprobs {
            let top_logprobs = top
                .into_iter()
                .map(|(t, logprob)| {
                    let bytes = vocab.token_to_piece(t, false, None);
                    TopLogprob {
                        token: String::from_utf8_lossy(&bytes).into_owned(),
                        logprob,
                        bytes: Some(bytes),
                        id: Some(t.0),
                    }
                })
                .collect();
            run.logprobs.push(TokenLogprob {
                token: String::from_utf8_lossy(&piece).into_owned(),
                logprob,
                bytes: Some(piece.clone()),
                top_logprobs,
            });
        }
        run.ids.push(token.0);
        let pushed = run.text.push(&piece);
        if !pushed.text.is_empty() {
            let logprobs = std::mem::take(&mut run.logprobs);
            let tokens = std::mem::take(&mut run.ids);
            let index = run.task.index;
            let so_far = run.task.params.timings_per_token.then(|| run.usage(slot_id));
            let text = pushed.text;
            run.task.send(outbox, Event::Text { index, text, logprobs, tokens, so_far });
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
}

/// Ends a choice: the held-back text, its usage and its metrics.
/// `at` is the model's id and the slot's.
pub(super) fn finish(mut run: Running, reason: FinishReason, at: (&str, u32), outbox: &mut Outbox) {
    let (id, slot) = at;
    let rest = run.text.finish();
    if !rest.is_empty() || !run.logprobs.is_empty() || !run.ids.is_empty() {
        let logprobs = std::mem::take(&mut run.logprobs);
        let tokens = std::mem::take(&mut run.ids);
        let index = run.task.index;
        let so_far = run.task.params.timings_per_token.then(|| run.usage(slot));
        run.task.send(outbox, Event::Text { index, text: rest, logprobs, tokens, so_far });
    }
    let usage = run.usage(slot);
    if let Some(first) = run.first_token {
        let sampled = run.generated - run.answered;
        if sampled > 1 {
            let per_token = first.elapsed() / (sampled - 1);
            metrics::histogram!(m::TPOT, "model" => id.to_owned()).record(per_token.as_secs_f64());
        }
    }
    metrics::counter!(m::PROMPT_TOKENS, "model" => id.to_owned())
        .increment(usage.prompt_tokens.into());
    metrics::counter!(m::PROMPT_TOKENS_CACHED, "model" => id.to_owned())
        .increment(usage.cached_tokens.into());
    metrics::counter!(m::PROMPT_TOKENS_COMPUTED, "model" => id.to_owned())
        .increment(u64::from(usage.prompt_tokens - usage.cached_tokens));
    m::llama_server::TOTALS.choice(
        (usage.prompt_tokens, usage.cached_tokens, usage.prompt_time),
        (usage.completion_tokens, usage.generation_time),
    );
    tracing::debug!(model = %id, task = run.task.id, ?reason, ?usage, elapsed = ?run.admitted.elapsed(), "choice done");
    let stop = run.text.matched().map(str::to_owned);
    run.task.send(outbox, Event::Done { index: run.task.index, reason, stop, usage });
}

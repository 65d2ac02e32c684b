//! A slot: one sequence of a model's context, the task running in it, and the tokens
//! its part of the KV cache holds (kept after a task ends, as the prompt cache).

use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::token::LlamaToken;

use slotgate_protocol::TokenLogprob;

use super::job::{ChoiceUsage, Task};
use super::sampler::ChoiceSampler;
use super::text::TextStream;

/// A task admitted into a slot.
pub(crate) struct Running {
    pub task: Task,
    /// `None` while a draw is made beside the loop ([`super::aside`]): the
    /// slot then waits out of the batch.
    pub sampler: Option<ChoiceSampler>,
    pub text: TextStream,
    /// Log probabilities of tokens whose text has not gone out yet.
    pub logprobs: Vec<TokenLogprob>,
    /// Ids of the tokens sampled since the last text went out.
    pub ids: Vec<i32>,
    /// Prompt tokens decoded so far (cached ones included).
    pub n_prompt_done: usize,
    /// Prompt tokens that were already in the cache.
    pub cached: usize,
    /// Tokens sampled so far, a resumed answer's first ones included.
    pub generated: u32,
    /// Tokens at the end of the prompt that are a resumed answer's.
    pub answered: u32,
    /// The last sampled token, to be decoded in the next step.
    pub next: Option<LlamaToken>,
    /// Index in the current batch of this slot's logits, if it asked for any.
    pub logits_at: Option<i32>,
    pub admitted: Instant,
    pub first_token: Option<Instant>,
}

impl Running {
    /// Whether the slot is still reading its prompt.
    pub fn in_prompt(&self) -> bool {
        self.n_prompt_done < self.task.prompt.len()
    }

    /// The choice's counts and times until now, in slot `slot`.
    pub fn usage(&self, slot: u32) -> ChoiceUsage {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let prompt_tokens = self.task.prompt.len() as u32 - self.answered;
        ChoiceUsage {
            prompt_tokens,
            cached_tokens: (self.cached as u32).min(prompt_tokens),
            completion_tokens: self.generated,
            slot,
            prompt_time: first.saturating_duration_since(self.admitted),
            generation_time: now.saturating_duration_since(first),
        }
    }
}

/// One slot of a model.
pub(crate) struct Slot {
    /// Number within the model, from 0; also the sequence id in the context.
    pub id: u32,
    /// Exactly the tokens in this slot's sequence of the KV cache.
    pub cache: Vec<LlamaToken>,
    /// The `cache_salt` of the requests that made that cache: only a request
    /// with the same salt may reuse any of it.
    pub salt: Option<Arc<str>>,
    pub running: Option<Running>,
    /// Step number of the last admission, for least-recently-used choice.
    pub last_used: u64,
}

impl Slot {
    pub fn new(id: u32) -> Self {
        Self { id, cache: Vec::new(), salt: None, running: None, last_used: 0 }
    }

    /// How much of `prompt`, made under `salt`, this slot's cache holds.
    pub fn shared(&self, prompt: &[LlamaToken], salt: Option<&str>) -> usize {
        if self.salt.as_deref() == salt {
            common_prefix(&self.cache, prompt)
        } else {
            0
        }
    }
}

/// Length of the common prefix of two token lists.
pub(crate) fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A slot that keeps less than this share of its cache when reused has been
/// taken from another conversation: its state goes to the host cache first
/// (llama-server saves a slot's prompt under the same rule).
pub(crate) const KEEP_SHARE: f32 = 0.5;

/// Why a slot was chosen for a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// Its cache is a real share of the prompt and it keeps most of that cache:
    /// the same conversation, or a shared opening.
    Warm,
    /// It held nothing.
    Empty,
    /// Shares a real part of the prompt, but reusing it gives up most of what it
    /// held; taken only when no slot is empty.
    Shared,
    /// The least recently used slot, when nothing else fits.
    Oldest,
}

/// The idle slot to run `prompt` in, and why; `None` when all are busy.
///
/// A slot is a candidate for reuse when the prefix it shares with the prompt is at
/// least `similarity` of the prompt (llama-server's `--slot-prompt-similarity`).
/// Among candidates, one that also keeps at least [`KEEP_SHARE`] of its own cache
/// wins outright (the longest share first). Otherwise an empty slot is taken, so a
/// new conversation never evicts a warm one while a slot is free; then a candidate
/// that must give up its cache; then the least recently used slot. Ties go to the
/// least recently used. A slot whose cache was made under another salt shares
/// nothing with the prompt.
pub(crate) fn pick_slot(
    slots: &[Slot],
    prompt: &[LlamaToken],
    salt: Option<&str>,
    similarity: f32,
) -> Option<(usize, Pick)> {
    let idle = || slots.iter().enumerate().filter(|(_, s)| s.running.is_none());
    let need = ((similarity * prompt.len() as f32).ceil() as usize).max(1);
    let mut warm: Option<(usize, usize, bool)> = None;
    for (i, slot) in idle() {
        let shared = slot.shared(prompt, salt);
        if shared < need {
            continue;
        }
        let keeps = shared as f32 >= KEEP_SHARE * slot.cache.len() as f32;
        let better = match warm {
            None => true,
            Some((j, best, best_keeps)) => {
                (keeps, shared, std::cmp::Reverse(slot.last_used))
                    > (best_keeps, best, std::cmp::Reverse(slots[j].last_used))
            }
        };
        if better {
            warm = Some((i, shared, keeps));
        }
    }
    if let Some((i, _, true)) = warm {
        return Some((i, Pick::Warm));
    }
    if let Some((i, _)) =
        idle().filter(|(_, s)| s.cache.is_empty()).min_by_key(|(_, s)| s.last_used)
    {
        return Some((i, Pick::Empty));
    }
    if let Some((i, _, false)) = warm {
        return Some((i, Pick::Shared));
    }
    idle().min_by_key(|(_, s)| s.last_used).map(|(i, _)| (i, Pick::Oldest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().map(|&i| LlamaToken(i)).collect()
    }

    fn slots(caches: &[&[i32]]) -> Vec<Slot> {
        caches
            .iter()
            .enumerate()
            .map(|(i, c)| Slot { cache: toks(c), last_used: i as u64 + 1, ..Slot::new(i as u32) })
            .collect()
    }

    #[test]
    fn the_next_turn_goes_back_to_its_warm_slot() {
        let s = slots(&[&[1, 2, 3, 4], &[1, 2, 9, 9], &[]]);
        assert_eq!(pick_slot(&s, &toks(&[1, 2, 3, 4, 5, 6]), None, 0.1), Some((0, Pick::Warm)));
        assert_eq!(pick_slot(&s, &toks(&[1, 2, 9, 9, 7]), None, 0.1), Some((1, Pick::Warm)));
    }

    #[test]
    fn a_new_conversation_takes_an_empty_slot_not_a_warm_one() {
        // Both share the template's first two tokens with the prompt: enough by the
        // similarity rule, but reusing either would throw away a conversation.
        let s = slots(&[&[1, 2, 3, 4, 5, 6], &[], &[1, 2, 7, 8, 9, 9]]);
        assert_eq!(pick_slot(&s, &toks(&[1, 2, 40, 41]), None, 0.1), Some((1, Pick::Empty)));
    }

    #[test]
    fn without_an_empty_slot_a_shared_prefix_then_the_oldest() {
        let mut s = slots(&[&[1, 2, 3, 4, 5, 6], &[8, 8, 8]]);
        assert_eq!(pick_slot(&s, &toks(&[1, 2, 40, 41]), None, 0.1), Some((0, Pick::Shared)));
        assert_eq!(pick_slot(&s, &toks(&[1, 2, 40, 41]), None, 0.9), Some((0, Pick::Oldest)));
        s[0].last_used = 10;
        assert_eq!(pick_slot(&s, &toks(&[5, 5]), None, 0.1), Some((1, Pick::Oldest)));
    }

    #[test]
    fn a_share_below_the_similarity_does_not_count() {
        // 2 of 10 prompt tokens shared is below 0.5: the empty slot wins.
        let s = slots(&[&[1, 2], &[]]);
        let prompt = toks(&[1, 2, 3, 3, 3, 3, 3, 3, 3, 3]);
        assert_eq!(pick_slot(&s, &prompt, None, 0.5), Some((1, Pick::Empty)));
        assert_eq!(pick_slot(&s, &prompt, None, 0.1), Some((0, Pick::Warm)));
    }

    #[test]
    fn a_cache_made_under_another_salt_shares_nothing() {
        let mut s = slots(&[&[1, 2, 3, 4], &[]]);
        s[0].salt = Some("tenant-a".into());
        let prompt = toks(&[1, 2, 3, 4, 5]);
        assert_eq!(pick_slot(&s, &prompt, Some("tenant-a"), 0.1), Some((0, Pick::Warm)));
        assert_eq!(pick_slot(&s, &prompt, Some("tenant-b"), 0.1), Some((1, Pick::Empty)));
        assert_eq!(pick_slot(&s, &prompt, None, 0.1), Some((1, Pick::Empty)), "no salt is a salt");
        assert_eq!(s[0].shared(&prompt, Some("tenant-b")), 0);
        assert_eq!(s[0].shared(&prompt, Some("tenant-a")), 4);
    }

    #[test]
    fn busy_slots_are_never_picked() {
        let mut s = slots(&[&[1, 2, 3], &[]]);
        assert_eq!(pick_slot(&s, &toks(&[1, 2, 3, 4]), None, 0.1), Some((0, Pick::Warm)));
        s[0].running = Some(test_running());
        assert_eq!(pick_slot(&s, &toks(&[1, 2, 3, 4]), None, 0.1), Some((1, Pick::Empty)));
        s[1].running = Some(test_running());
        assert_eq!(pick_slot(&s, &toks(&[1, 2, 3, 4]), None, 0.1), None);
        assert_eq!(common_prefix(&toks(&[1, 2]), &toks(&[1, 3])), 1);
    }

    fn test_running() -> Running {
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        let task = Task {
            id: 1,
            index: crate::scheduler::job::ChoiceIndex::default(),
            prompt: std::sync::Arc::new(toks(&[1])),
            params: std::sync::Arc::default(),
            grammar: None,
            seed: 0,
            echo_text: None,
            events,
            enqueued: Instant::now(),
            replica: None,
            replay: None,
        };
        Running {
            task,
            sampler: Some(ChoiceSampler::greedy()),
            text: TextStream::new(Vec::new()),
            logprobs: Vec::new(),
            ids: Vec::new(),
            n_prompt_done: 0,
            cached: 0,
            generated: 0,
            answered: 0,
            next: None,
            logits_at: None,
            admitted: Instant::now(),
            first_token: None,
        }
    }
}

//! A slot: one sequence of a model's context, the task running in it, and the tokens
//! its part of the KV cache holds (kept after a task ends, as the prompt cache).

use std::time::Instant;

use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

use super::job::Task;
use super::text::TextStream;

/// A task admitted into a slot.
pub(crate) struct Running {
    pub task: Task,
    pub sampler: LlamaSampler,
    pub text: TextStream,
    /// Prompt tokens decoded so far (cached ones included).
    pub n_prompt_done: usize,
    /// Prompt tokens that were already in the cache.
    pub cached: usize,
    /// Tokens sampled so far.
    pub generated: u32,
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
}

/// One slot of a model.
pub(crate) struct Slot {
    /// Number within the model, from 0; also the sequence id in the context.
    pub id: u32,
    /// Exactly the tokens in this slot's sequence of the KV cache.
    pub cache: Vec<LlamaToken>,
    pub running: Option<Running>,
    /// Step number of the last admission, for least-recently-used choice.
    pub last_used: u64,
}

impl Slot {
    pub fn new(id: u32) -> Self {
        Self { id, cache: Vec::new(), running: None, last_used: 0 }
    }
}

/// Length of the common prefix of two token lists.
pub(crate) fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The idle slot to run `prompt` in: the one whose cache shares the longest prefix
/// with it, and among equals the least recently used. `None` when all are busy.
pub(crate) fn pick_slot(slots: &[Slot], prompt: &[LlamaToken]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.running.is_none())
        .max_by_key(|(_, s)| (common_prefix(&s.cache, prompt), std::cmp::Reverse(s.last_used)))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().map(|&i| LlamaToken(i)).collect()
    }

    #[test]
    fn picks_the_longest_shared_prefix_then_the_least_recently_used() {
        let mut slots: Vec<Slot> = (0..3).map(Slot::new).collect();
        slots[0].cache = toks(&[1, 2, 9]);
        slots[0].last_used = 5;
        slots[1].cache = toks(&[1, 2, 3, 4]);
        slots[1].last_used = 9;
        slots[2].last_used = 1;
        assert_eq!(pick_slot(&slots, &toks(&[1, 2, 3, 7])), Some(1));
        assert_eq!(pick_slot(&slots, &toks(&[5])), Some(2), "no prefix anywhere: LRU");
        slots[2].last_used = 10;
        assert_eq!(pick_slot(&slots, &toks(&[5])), Some(0));
    }

    #[test]
    fn busy_slots_are_never_picked() {
        let slots: Vec<Slot> = (0..2).map(Slot::new).collect();
        assert_eq!(pick_slot(&slots[..0], &toks(&[1])), None);
        assert_eq!(common_prefix(&toks(&[1, 2]), &toks(&[1, 3])), 1);
    }
}

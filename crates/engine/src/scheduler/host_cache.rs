//! The host-memory prompt cache: KV states of sequences that had to leave their
//! slot, kept in RAM under a byte bound and evicted least recently used first, so
//! that more conversations than slots stay warm (llama-server's `--cache-ram`).
//!
//! Generic over the saved state so that the bookkeeping is tested without a model;
//! the scheduler stores llama.cpp's opaque per-sequence states here.

use std::sync::Arc;

use llama_cpp_2::token::LlamaToken;

use super::slot::common_prefix;

/// What the cache needs of a saved state: its size.
pub(crate) trait StateSize {
    /// Bytes it holds.
    fn byte_len(&self) -> usize;
}

impl StateSize for llama_cpp_2::context::session::SeqState {
    fn byte_len(&self) -> usize {
        llama_cpp_2::context::session::SeqState::byte_len(self)
    }
}

/// One saved sequence: exactly the tokens its state holds, the salt they were
/// made under (only a prompt of the same salt may reuse them), and the state.
pub(crate) struct Entry<S> {
    pub tokens: Vec<LlamaToken>,
    pub salt: Option<Arc<str>>,
    pub state: S,
    last_used: u64,
}

impl<S: StateSize> Entry<S> {
    fn bytes(&self) -> usize {
        self.state.byte_len() + self.tokens.len() * std::mem::size_of::<LlamaToken>()
    }
}

/// Saved sequences under a byte bound.
pub(crate) struct HostCache<S> {
    entries: Vec<Entry<S>>,
    capacity: usize,
    used: usize,
    clock: u64,
}

impl<S: StateSize> HostCache<S> {
    /// A cache of at most `capacity` bytes; 0 disables it.
    pub fn new(capacity: usize) -> Self {
        Self { entries: Vec::new(), capacity, used: 0, clock: 0 }
    }

    /// Whether it keeps anything at all.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Bytes held.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Stores a sequence made under `salt`. Entries of that salt whose tokens are
    /// a prefix of the new ones are dropped (an older turn of the same
    /// conversation); if a stored entry already extends the new tokens, the new
    /// one adds nothing and is dropped instead. Then the least recently used
    /// entries go until the bound holds. Returns whether it was kept.
    pub fn insert(&mut self, tokens: Vec<LlamaToken>, salt: Option<Arc<str>>, state: S) -> bool {
        let entry = Entry { tokens, salt, state, last_used: 0 };
        let size = entry.bytes();
        if size > self.capacity || entry.tokens.is_empty() {
            return false;
        }
        let same = |e: &Entry<S>| e.salt == entry.salt;
        if self.entries.iter().any(|e| same(e) && e.tokens.starts_with(&entry.tokens)) {
            self.touch_prefix_of(&entry.tokens, entry.salt.as_deref());
            return false;
        }
        self.remove_where(|e| same(e) && entry.tokens.starts_with(&e.tokens));
        while self.used + size > self.capacity {
            let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)
            else {
                break;
            };
            let gone = self.entries.swap_remove(oldest);
            self.used -= gone.bytes();
        }
        self.clock += 1;
        self.used += size;
        self.entries.push(Entry { last_used: self.clock, ..entry });
        true
    }

    /// Takes out the entry of `salt` sharing the longest prefix with `prompt`, if
    /// that prefix has at least `min_shared` tokens. The caller restores it into a
    /// slot; it comes back here when that slot is reused.
    pub fn take_best(
        &mut self,
        prompt: &[LlamaToken],
        salt: Option<&str>,
        min_shared: usize,
    ) -> Option<Entry<S>> {
        let (i, shared) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.salt.as_deref() == salt)
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt)))
            .max_by_key(|&(i, shared)| (shared, self.entries[i].last_used))?;
        if shared == 0 || shared < min_shared {
            return None;
        }
        let entry = self.entries.swap_remove(i);
        self.used -= entry.bytes();
        Some(entry)
    }

    /// The longest prefix of `prompt` that some entry holds.
    #[cfg(test)]
    pub fn best_shared(&self, prompt: &[LlamaToken]) -> usize {
        self.entries.iter().map(|e| common_prefix(&e.tokens, prompt)).max().unwrap_or(0)
    }

    fn touch_prefix_of(&mut self, tokens: &[LlamaToken], salt: Option<&str>) {
        self.clock += 1;
        let now = self.clock;
        let extends = |e: &&mut Entry<S>| e.salt.as_deref() == salt && e.tokens.starts_with(tokens);
        for e in self.entries.iter_mut().filter(extends) {
            e.last_used = now;
        }
    }

    fn remove_where(&mut self, mut gone: impl FnMut(&Entry<S>) -> bool) {
        let mut freed = 0;
        self.entries.retain(|e| {
            let remove = gone(e);
            if remove {
                freed += e.bytes();
            }
            !remove
        });
        self.used -= freed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in state of a given size.
    struct Blob(usize);

    impl StateSize for Blob {
        fn byte_len(&self) -> usize {
            self.0
        }
    }

    fn toks(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().map(|&i| LlamaToken(i)).collect()
    }

    /// Bytes of an entry of `n` tokens and a `state`-byte blob.
    fn size(n: usize, state: usize) -> usize {
        state + n * 4
    }

    #[test]
    fn the_longest_shared_prefix_is_taken_out() {
        let mut cache = HostCache::new(10_000);
        assert!(cache.insert(toks(&[1, 2, 3]), None, Blob(100)));
        assert!(cache.insert(toks(&[7, 8, 9, 10]), None, Blob(100)));
        assert_eq!(cache.best_shared(&toks(&[7, 8, 1])), 2);
        let got = cache.take_best(&toks(&[7, 8, 9, 10, 11]), None, 1).unwrap();
        assert_eq!(got.tokens, toks(&[7, 8, 9, 10]));
        assert_eq!(cache.len(), 1, "taken out, not copied");
        assert_eq!(cache.used(), size(3, 100));
        assert!(cache.take_best(&toks(&[5, 6]), None, 1).is_none(), "nothing shared");
        assert!(cache.take_best(&toks(&[1, 2, 9]), None, 3).is_none(), "too little shared");
    }

    #[test]
    fn the_bound_evicts_least_recently_used_first() {
        let one = size(2, 100);
        let mut cache = HostCache::new(one * 2);
        cache.insert(toks(&[1, 1]), None, Blob(100));
        cache.insert(toks(&[2, 2]), None, Blob(100));
        // Storing the first again (a prefix of a stored entry) counts as a use of it.
        assert!(!cache.insert(toks(&[1]), None, Blob(1)));
        cache.insert(toks(&[3, 3]), None, Blob(100));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.best_shared(&toks(&[2, 2])), 0, "the oldest went");
        assert_eq!(cache.best_shared(&toks(&[1, 1])), 2);
        assert!(cache.used() <= one * 2);
        assert!(!cache.insert(toks(&[4]), None, Blob(one * 3)), "larger than the whole cache");
        assert!(!HostCache::new(0).insert(toks(&[1]), None, Blob(1)), "0 disables");
    }

    #[test]
    fn an_entry_is_reused_only_under_its_own_salt() {
        let mut cache = HostCache::new(10_000);
        let a: Option<Arc<str>> = Some("a".into());
        assert!(cache.insert(toks(&[1, 2, 3]), a.clone(), Blob(10)));
        // The same tokens under another salt are another entry, not a duplicate.
        assert!(cache.insert(toks(&[1, 2]), None, Blob(10)));
        assert_eq!(cache.len(), 2);
        assert!(cache.take_best(&toks(&[1, 2, 3, 4]), Some("b"), 1).is_none());
        let got = cache.take_best(&toks(&[1, 2, 3, 4]), None, 1).unwrap();
        assert_eq!((got.tokens, got.salt), (toks(&[1, 2]), None));
        let got = cache.take_best(&toks(&[1, 2, 3, 4]), Some("a"), 1).unwrap();
        assert_eq!(got.tokens, toks(&[1, 2, 3]));
    }

    #[test]
    fn a_later_turn_replaces_the_earlier_one() {
        let mut cache = HostCache::new(10_000);
        cache.insert(toks(&[1, 2]), None, Blob(10));
        cache.insert(toks(&[1, 2, 3, 4]), None, Blob(20));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.used(), size(4, 20));
    }
}

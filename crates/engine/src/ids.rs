//! Response ids (`chatcmpl-…`, `cmpl-…`): one atomic counter plus a nonce drawn at
//! process start, so ids are unique across threads and across restarts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// This process's random 64 bits: in every id it makes, and in `/health` as
/// `instance`, so that a gateway can send a stored response's follow-ups to
/// the engine that holds it.
pub fn nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(rand::random)
}

/// A new id with the given prefix, such as `chatcmpl`.
pub fn next(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{:016x}{n:08x}", nonce())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    #[test]
    fn ids_are_unique_across_threads() {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| (0..1000).map(|_| super::next("cmpl")).collect::<Vec<_>>())
            })
            .collect();
        let mut seen = HashSet::new();
        for t in threads {
            for id in t.join().unwrap() {
                assert!(id.starts_with("cmpl-"));
                assert!(seen.insert(id), "duplicate id");
            }
        }
        assert_eq!(seen.len(), 8000);
    }
}

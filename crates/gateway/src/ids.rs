//! Request ids for `x-request-id` when the client sent none: a counter plus a
//! nonce drawn at start, unique across threads and restarts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A new request id.
pub fn request_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static NONCE: OnceLock<u32> = OnceLock::new();
    let nonce = *NONCE.get_or_init(rand::random);
    format!("req-{nonce:08x}{:08x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

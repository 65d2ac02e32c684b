//! Request ids for `x-request-id` when the client sent none: a counter plus a
//! nonce drawn at start, unique across threads and restarts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use axum::http::HeaderValue;

/// A new request id: `req-` and 16 hex digits.
pub fn request_id() -> HeaderValue {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static NONCE: OnceLock<u32> = OnceLock::new();
    let nonce = *NONCE.get_or_init(rand::random);
    let n = (u64::from(nonce) << 32) | (COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff);
    // Written by hand: `format!` and a `String` per request showed in profiles.
    let mut id = *b"req-0000000000000000";
    for (i, byte) in id[4..].iter_mut().enumerate() {
        *byte = b"0123456789abcdef"[(n >> (60 - 4 * i)) as usize & 0xf];
    }
    HeaderValue::from_bytes(&id).expect("ASCII hex digits")
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_distinct_and_keep_their_shape() {
        let (a, b) = (super::request_id(), super::request_id());
        assert_ne!(a, b);
        let a = a.to_str().unwrap();
        assert_eq!(a.len(), 20, "{a}");
        assert!(a.starts_with("req-") && a[4..].bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    }
}

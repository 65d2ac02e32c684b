//! API keys as both servers check them: read from `Authorization: Bearer KEY`
//! (what the OpenAI SDKs send) or `x-api-key`, and compared by their SHA-256 in
//! a time that does not depend on where they differ. Only digests are kept.

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};

/// The SHA-256 of a secret.
pub fn digest(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

/// Whether two digests are equal, in constant time.
pub fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key a client sent: `Authorization: Bearer KEY`, or `x-api-key`.
pub fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let bytes = value.as_bytes();
        if bytes.len() > 7 && bytes[..7].eq_ignore_ascii_case(b"bearer ") {
            let key = bytes[7..].trim_ascii();
            return (!key.is_empty()).then_some(key);
        }
    }
    headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii()).filter(|k| !k.is_empty())
}

/// Whether `headers` carry the key whose digest is `expected`.
pub fn carries(headers: &HeaderMap, expected: &[u8; 32]) -> bool {
    presented(headers).is_some_and(|key| same(&digest(key), expected))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn keys_come_from_either_header() {
        let mut h = HeaderMap::new();
        assert!(presented(&h).is_none());
        h.insert("x-api-key", HeaderValue::from_static(" k1 "));
        assert_eq!(presented(&h), Some(&b"k1"[..]));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k2"));
        assert_eq!(presented(&h), Some(&b"k2"[..]), "Authorization first");
        assert!(carries(&h, &digest(b"k2")));
        assert!(!carries(&h, &digest(b"k1")));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic k2"));
        assert_eq!(presented(&h), Some(&b"k1"[..]));
    }
}

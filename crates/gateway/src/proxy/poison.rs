//! Requests that kill backends. A request whose backend died under it (the
//! connection lost after the request was sent, before its answer ended) is
//! sent once more; if that backend dies too, the request is the likely cause,
//! and it is answered 502 rather than sent on to kill every engine in turn.
//! Its body is remembered for a while, so that a client that retries it (the
//! OpenAI SDKs retry a 502 twice) is answered at once instead.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use slotgate_protocol::{ApiError, ErrorType};

/// Backends a request may see die under it before it is refused.
pub const DEATHS: u32 = 2;

/// How long a poisonous body is refused at once.
const REMEMBERED: Duration = Duration::from_secs(600);

/// Bodies remembered at most; the oldest goes first.
const CAPACITY: usize = 1024;

/// The bodies that killed [`DEATHS`] backends, by keyed hash (an outsider cannot
/// make another body's hash collide with theirs and so have it refused).
#[derive(Default)]
pub struct Poisons {
    hasher: std::collections::hash_map::RandomState,
    seen: Mutex<HashMap<u64, Instant>>,
    /// Whether any is remembered: ordinary requests then hash nothing.
    any: AtomicBool,
}

impl Poisons {
    /// The 502 for `body`, if it killed backends lately.
    pub fn check(&self, body: &[u8]) -> Result<(), ApiError> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(());
        }
        let hash = self.hasher.hash_one(body);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|_, at| at.elapsed() < REMEMBERED);
        self.any.store(!seen.is_empty(), Ordering::Release);
        match seen.get(&hash) {
            Some(_) => Err(refusal("the same request killed backends moments ago")),
            None => Ok(()),
        }
    }

    /// `body` killed [`DEATHS`] backends: counted, and refused for a while. The
    /// error is the answer to send.
    pub fn remember(&self, body: &[u8]) -> ApiError {
        metrics::counter!(crate::metrics::POISON).increment(1);
        let hash = self.hasher.hash_one(body);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= CAPACITY {
            let oldest = seen.iter().min_by_key(|(_, at)| **at).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                seen.remove(&oldest);
            }
        }
        seen.insert(hash, Instant::now());
        self.any.store(true, Ordering::Release);
        refusal(&format!("{DEATHS} backends died while serving this request"))
    }
}

fn refusal(what: &str) -> ApiError {
    ApiError::new(
        ErrorType::UpstreamError,
        format!(
            "{what}: it is not sent to another, so that one request cannot take the \
             fleet down; if it is valid, report it with its x-request-id"
        ),
    )
    .with_code("poison_request")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_body_is_refused_and_others_pass() {
        let poisons = Poisons::default();
        assert!(poisons.check(b"a").is_ok());
        let err = poisons.remember(b"a");
        assert_eq!((err.status(), err.code.as_deref()), (502, Some("poison_request")));
        assert_eq!(poisons.check(b"a").unwrap_err().status(), 502);
        assert!(poisons.check(b"b").is_ok());
    }

    #[test]
    fn the_memory_is_bounded() {
        let poisons = Poisons::default();
        for i in 0..CAPACITY + 10 {
            poisons.remember(&i.to_le_bytes());
        }
        assert_eq!(poisons.seen.lock().unwrap().len(), CAPACITY);
        assert!(poisons.check(&(CAPACITY + 9).to_le_bytes()).is_err(), "the newest stays");
    }
}

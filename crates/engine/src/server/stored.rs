//! Stored responses (`store: true`, OpenAI's default): each response and the
//! conversation it ends, for `GET /v1/responses/{id}` and for the follow-ups
//! that name it as `previous_response_id`. Bounded in count and bytes, the
//! least recently used first out, and kept at most a time to live.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use slotgate_protocol::ChatMessage;

/// Responses kept at most.
pub const MAX_RESPONSES: usize = 1024;
/// Bytes of responses and conversations kept at most.
pub const MAX_BYTES: usize = 64 << 20;
/// How long a response is kept after it was last used.
pub const TIME_TO_LIVE: Duration = Duration::from_secs(3600);

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response, as `GET` answers it.
    pub response: Value,
    /// The conversation it ends (without instructions): what a follow-up continues.
    pub conversation: Vec<ChatMessage>,
    /// Whose it is, as the gateway said; `None`: anyone's who holds the id.
    pub owner: Option<String>,
}

#[derive(Debug)]
struct Entry {
    stored: std::sync::Arc<Stored>,
    bytes: usize,
    used: Instant,
}

/// The store.
#[derive(Debug, Default)]
pub struct Store {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Store {
    /// Keeps `stored` as `id`, dropping the least recently used past the bounds.
    pub fn put(&self, id: String, stored: Stored) {
        let bytes = stored.response.to_string().len()
            + serde_json::to_string(&stored.conversation).map_or(0, |s| s.len());
        if bytes > MAX_BYTES {
            return;
        }
        let mut entries = self.lock();
        let now = Instant::now();
        entries.retain(|_, e| now.duration_since(e.used) < TIME_TO_LIVE);
        entries.insert(id, Entry { stored: std::sync::Arc::new(stored), bytes, used: now });
        let mut total: usize = entries.values().map(|e| e.bytes).sum();
        while entries.len() > MAX_RESPONSES || total > MAX_BYTES {
            let Some(oldest) = entries.iter().min_by_key(|(_, e)| e.used).map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = entries.remove(&oldest) {
                total -= e.bytes;
            }
        }
    }

    /// The response stored as `id`, if it is still there and `owner`'s.
    pub fn get(&self, id: &str, owner: &Option<String>) -> Option<std::sync::Arc<Stored>> {
        let mut entries = self.lock();
        let entry = entries.get_mut(id).filter(|e| e.stored.owner == *owner)?;
        if entry.used.elapsed() >= TIME_TO_LIVE {
            entries.remove(id);
            return None;
        }
        entry.used = Instant::now();
        Some(entry.stored.clone())
    }

    /// Forgets `id`, if it is `owner`'s; whether it was there.
    pub fn delete(&self, id: &str, owner: &Option<String>) -> bool {
        let mut entries = self.lock();
        if entries.get(id).is_none_or(|e| e.stored.owner != *owner) {
            return false;
        }
        entries.remove(id).is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Nothing is left half-done under this lock.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_goes_first() {
        let store = Store::default();
        let one =
            || Stored { response: serde_json::json!({}), conversation: Vec::new(), owner: None };
        for i in 0..MAX_RESPONSES {
            store.put(format!("r{i}"), one());
        }
        let anyone = None;
        assert!(store.get("r0", &anyone).is_some(), "used now: the most recent");
        store.put("new".into(), one());
        assert!(store.get("r0", &anyone).is_some() && store.get("new", &anyone).is_some());
        assert!(store.get("r1", &anyone).is_none(), "the least recently used went");
        assert!(store.delete("new", &anyone) && !store.delete("new", &anyone));
        let theirs = Stored { owner: Some("a".into()), ..one() };
        store.put("theirs".into(), theirs);
        let other = Some("b".to_owned());
        assert!(store.get("theirs", &other).is_none() && !store.delete("theirs", &other));
        assert!(store.get("theirs", &Some("a".into())).is_some());
    }
}

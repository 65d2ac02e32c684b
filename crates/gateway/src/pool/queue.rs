//! The per-model FIFO queues of requests waiting for a slot. A freed slot wakes
//! the first waiter that can use the backend it freed on: a request that has
//! already failed on that backend (and excludes it) lets the next one have it,
//! rather than taking the wake-up and leaving the slot idle until a health poll.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

/// One queued request.
struct Waiter {
    id: u64,
    /// Backends this request may not be sent to (it failed there).
    exclude: Vec<usize>,
    /// Told which backend freed a slot, or `None` for "look again".
    wake: oneshot::Sender<Option<usize>>,
}

/// A place in a queue, and the wake-up that ends the wait.
pub struct Ticket {
    /// Identifies the waiter, to leave the queue.
    pub id: u64,
    /// Resolves when a slot may be free.
    pub woken: oneshot::Receiver<Option<usize>>,
}

/// Every model's queue. A std mutex, held only to push, pop or scan.
#[derive(Default)]
pub struct Queues {
    queues: Mutex<HashMap<String, VecDeque<Waiter>>>,
    next: AtomicU64,
    /// Waiters in all queues, changed under the lock and read without it: most
    /// releases find nobody waiting, and then take no lock that every worker
    /// thread contends for.
    waiting: AtomicUsize,
}

impl Queues {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Waiter>>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins `model`'s queue at the back, or at the front for a request that was
    /// woken and lost the slot to another. `None` when the queue already holds
    /// `limit` requests (the front is always allowed: the request was in line).
    pub fn join(
        &self,
        model: &str,
        exclude: &[usize],
        front: bool,
        limit: usize,
    ) -> Option<Ticket> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (wake, woken) = oneshot::channel();
        let waiter = Waiter { id, exclude: exclude.to_vec(), wake };
        let mut queues = self.lock();
        let queue = queues.entry(model.to_owned()).or_default();
        if front {
            queue.push_front(waiter);
        } else if queue.len() >= limit {
            return None;
        } else {
            queue.push_back(waiter);
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        drop(queues);
        // Pairs with the fence in `wake`: the caller looks for a free slot once
        // more after joining, and a release frees its slot before it reads
        // `waiting`. Of the two, at least one sees the other.
        fence(Ordering::SeqCst);
        Some(Ticket { id, woken })
    }

    /// Leaves the queue. False when the waiter was no longer in it: it had been
    /// woken, and the caller passes the wake-up on.
    pub fn leave(&self, model: &str, id: u64) -> bool {
        let mut queues = self.lock();
        let Some(queue) = queues.get_mut(model) else { return false };
        let before = queue.len();
        queue.retain(|w| w.id != id);
        let left = queue.len() != before;
        if left {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        left
    }

    /// Wakes the first live waiter for `model` that may use backend `freed` (any
    /// waiter when `None`). Waiters whose request has gone are dropped on the way.
    pub fn wake(&self, model: &str, freed: Option<usize>) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut queues = self.lock();
        let Some(queue) = queues.get_mut(model) else { return };
        let mut at = 0;
        while at < queue.len() {
            let waiter = &queue[at];
            if waiter.wake.is_closed() {
                queue.remove(at);
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            if freed.is_some_and(|b| waiter.exclude.contains(&b)) {
                at += 1;
                continue;
            }
            let waiter = queue.remove(at).expect("index is in bounds");
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            if waiter.wake.send(freed).is_ok() {
                return;
            }
        }
    }

    /// Requests waiting for `model`.
    pub fn depth(&self, model: &str) -> usize {
        self.lock().get(model).map_or(0, VecDeque::len)
    }

    /// Every model with a queue, and its depth.
    pub fn depths(&self) -> Vec<(String, usize)> {
        self.lock().iter().map(|(k, v)| (k.clone(), v.len())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_up_skips_waiters_that_exclude_the_freed_backend() {
        let q = Queues::default();
        let mut first = q.join("m", &[0], false, 8).unwrap();
        let mut second = q.join("m", &[], false, 8).unwrap();
        q.wake("m", Some(0));
        assert!(first.woken.try_recv().is_err(), "backend 0 is no use to the first");
        assert_eq!(second.woken.try_recv().unwrap(), Some(0));
        q.wake("m", Some(1));
        assert_eq!(first.woken.try_recv().unwrap(), Some(1));
        assert_eq!(q.depth("m"), 0);
        assert_eq!(q.waiting.load(Ordering::Relaxed), 0, "releases may skip the lock again");
    }

    #[test]
    fn the_front_is_always_open_and_the_back_has_a_limit() {
        let q = Queues::default();
        let _a = q.join("m", &[], false, 1).unwrap();
        assert!(q.join("m", &[], false, 1).is_none());
        let b = q.join("m", &[], true, 1).unwrap();
        assert!(q.leave("m", b.id));
        assert!(!q.leave("m", b.id), "gone already");
        assert_eq!(q.waiting.load(Ordering::Relaxed), 1, "`_a` still waits");
    }
}

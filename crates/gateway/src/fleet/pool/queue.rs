//! The per-model queues of requests waiting for a slot. A freed slot wakes the
//! waiter that should go next and can use the backend it freed on: a request
//! that has already failed on that backend (and excludes it) lets the next one
//! have it, rather than taking the wake-up and leaving the slot idle until a
//! health poll.
//!
//! Who goes next: interactive requests before batch ones, and within a
//! priority, the key served longest ago (round robin over keys), so that one
//! key's thousand queued requests do not delay another key's one; within a key,
//! arrival order. A full queue makes room for a key with fewer queued requests
//! by turning away the newest request of the key with the most, as fair
//! queueing drops from the fattest flow.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

pub use super::priority::Priority;

/// Whose request it is, for the order of the queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Class {
    /// Interactive before batch.
    pub priority: Priority,
    /// The key's number; 0 for requests without a key.
    pub tenant: u32,
}

/// What ends a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A slot may be free: on this backend, or (`None`) anywhere.
    Look(Option<usize>),
    /// The queue was full and made room for another key's request.
    Evicted,
}

/// One queued request.
struct Waiter {
    id: u64,
    class: Class,
    /// Backends this request may not be sent to (it failed there).
    exclude: Vec<usize>,
    wake: oneshot::Sender<Wake>,
}

/// A place in a queue, and the wake-up that ends the wait.
pub struct Ticket {
    /// Identifies the waiter, to leave the queue.
    pub id: u64,
    /// Resolves when a slot may be free, or the request is turned away.
    pub woken: oneshot::Receiver<Wake>,
}

/// One model's waiters, and when each key was last served.
#[derive(Default)]
struct Queue {
    waiters: VecDeque<Waiter>,
    /// Per key, the turn at which it was last served; keys not here never were.
    served: HashMap<u32, u64>,
    turn: u64,
}

impl Queue {
    fn len(&self) -> usize {
        self.waiters.len()
    }

    /// The waiter that goes next among those that may use `freed`.
    fn next(&self, freed: Option<usize>) -> Option<usize> {
        let mut best: Option<(usize, (Priority, u64))> = None;
        for (at, w) in self.waiters.iter().enumerate() {
            if freed.is_some_and(|b| w.exclude.contains(&b)) || w.wake.is_closed() {
                continue;
            }
            let rank = (w.class.priority, self.served.get(&w.class.tenant).copied().unwrap_or(0));
            if best.is_none_or(|(_, r)| rank < r) {
                best = Some((at, rank));
            }
        }
        best.map(|(at, _)| at)
    }

    /// The newest waiter of the key with the most waiters, when `tenant` has
    /// fewer than that key even after joining.
    fn victim(&self, tenant: u32) -> Option<usize> {
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for w in &self.waiters {
            *counts.entry(w.class.tenant).or_default() += 1;
        }
        let own = counts.get(&tenant).copied().unwrap_or(0);
        let (&fattest, &most) = counts.iter().max_by_key(|(t, n)| (**n, **t))?;
        if fattest == tenant || own + 1 >= most {
            return None;
        }
        self.waiters.iter().rposition(|w| w.class.tenant == fattest)
    }
}

/// Every model's queue. A std mutex, held only to push, pop or scan.
#[derive(Default)]
pub struct Queues {
    queues: Mutex<HashMap<String, Queue>>,
    next: AtomicU64,
    /// Waiters in all queues, changed under the lock and read without it: most
    /// releases find nobody waiting, and then take no lock that every worker
    /// thread contends for.
    waiting: AtomicUsize,
}

impl Queues {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins `model`'s queue at the back, or at the front for a request that was
    /// woken and lost the slot to another. `None` when the queue already holds
    /// `limit` requests and no key has more of them than this one's (the front
    /// is always allowed: the request was in line).
    pub fn join(
        &self,
        model: &str,
        class: Class,
        exclude: &[usize],
        front: bool,
        limit: usize,
    ) -> Option<Ticket> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (wake, woken) = oneshot::channel();
        let waiter = Waiter { id, class, exclude: exclude.to_vec(), wake };
        let mut queues = self.lock();
        let queue = queues.entry(model.to_owned()).or_default();
        if front {
            queue.waiters.push_front(waiter);
        } else if queue.len() >= limit {
            let at = queue.victim(class.tenant)?;
            let evicted = queue.waiters.remove(at).expect("index is in bounds");
            let _ = evicted.wake.send(Wake::Evicted);
            // One left, one joins: `waiting` stays as it was.
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            queue.waiters.push_back(waiter);
        } else {
            queue.waiters.push_back(waiter);
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
        queue.waiters.retain(|w| w.id != id);
        let left = queue.len() != before;
        if left {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        left
    }

    /// Wakes the waiter for `model` that goes next among those that may use
    /// backend `freed` (any waiter when `None`). Waiters whose request has gone
    /// are dropped on the way.
    pub fn wake(&self, model: &str, freed: Option<usize>) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut queues = self.lock();
        let Some(queue) = queues.get_mut(model) else { return };
        let before = queue.len();
        queue.waiters.retain(|w| !w.wake.is_closed());
        self.waiting.fetch_sub(before - queue.len(), Ordering::Relaxed);
        while let Some(at) = queue.next(freed) {
            let waiter = queue.waiters.remove(at).expect("index is in bounds");
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            if waiter.wake.send(Wake::Look(freed)).is_ok() {
                return;
            }
        }
    }

    /// `tenant`'s request was given a slot for `model`, from the queue or at
    /// once: it goes behind the keys served less recently. Charged for the slot
    /// and not for the wake-up, because a woken request may find the slot not
    /// yet free (the engine has not shown it so), and must not then lose its
    /// turn to the key it was woken ahead of.
    pub fn served(&self, model: &str, tenant: u32) {
        if tenant == 0 {
            // Without keys every request is of one key, and there are no turns to
            // keep: no lock that every worker thread contends for on each request.
            return;
        }
        let mut queues = self.lock();
        if !queues.contains_key(model) {
            queues.insert(model.to_owned(), Queue::default());
        }
        let queue = queues.get_mut(model).expect("inserted above");
        queue.turn += 1;
        queue.served.insert(tenant, queue.turn);
    }

    /// Requests waiting for `model`.
    pub fn depth(&self, model: &str) -> usize {
        self.lock().get(model).map_or(0, Queue::len)
    }

    /// Requests waiting for `model` that go before one of `priority`: those of
    /// the same priority or a higher one.
    pub fn ahead(&self, model: &str, priority: Priority) -> usize {
        self.lock()
            .get(model)
            .map_or(0, |q| q.waiters.iter().filter(|w| w.class.priority <= priority).count())
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
        let c = Class::default();
        let mut first = q.join("m", c, &[0], false, 8).unwrap();
        let mut second = q.join("m", c, &[], false, 8).unwrap();
        q.wake("m", Some(0));
        assert!(first.woken.try_recv().is_err(), "backend 0 is no use to the first");
        assert_eq!(second.woken.try_recv().unwrap(), Wake::Look(Some(0)));
        q.wake("m", Some(1));
        assert_eq!(first.woken.try_recv().unwrap(), Wake::Look(Some(1)));
        assert_eq!(q.depth("m"), 0);
        assert_eq!(q.waiting.load(Ordering::Relaxed), 0, "releases may skip the lock again");
    }

    #[test]
    fn the_front_is_always_open_and_the_back_has_a_limit() {
        let q = Queues::default();
        let c = Class::default();
        let _a = q.join("m", c, &[], false, 1).unwrap();
        assert!(q.join("m", c, &[], false, 1).is_none());
        let b = q.join("m", c, &[], true, 1).unwrap();
        assert!(q.leave("m", b.id));
        assert!(!q.leave("m", b.id), "gone already");
        assert_eq!(q.waiting.load(Ordering::Relaxed), 1, "`_a` still waits");
    }

    fn class(priority: Priority, tenant: u32) -> Class {
        Class { priority, tenant }
    }

    /// Wakes one waiter, gives it the slot, and says whose it was.
    fn served(q: &Queues, tickets: &mut Vec<(u32, Ticket)>) -> u32 {
        q.wake("m", None);
        let at = tickets.iter_mut().position(|(_, t)| t.woken.try_recv().is_ok()).unwrap();
        let tenant = tickets.remove(at).0;
        q.served("m", tenant);
        tenant
    }

    #[test]
    fn keys_take_turns_and_interactive_goes_first() {
        let q = Queues::default();
        let mut tickets = Vec::new();
        // Key 1 floods the queue, then key 2 and key 3 send one each.
        for _ in 0..5 {
            tickets
                .push((1, q.join("m", class(Priority::Interactive, 1), &[], false, 64).unwrap()));
        }
        tickets.push((2, q.join("m", class(Priority::Interactive, 2), &[], false, 64).unwrap()));
        tickets.push((3, q.join("m", class(Priority::Batch, 3), &[], false, 64).unwrap()));
        tickets.push((4, q.join("m", class(Priority::Interactive, 4), &[], false, 64).unwrap()));
        let order: Vec<u32> = (0..8).map(|_| served(&q, &mut tickets)).collect();
        // 1 first (all tie, it came first), then 2 and 4 that were never served,
        // then 1 again; batch only when no interactive request is left.
        assert_eq!(order, vec![1, 2, 4, 1, 1, 1, 1, 3]);
    }

    #[test]
    fn a_woken_request_that_finds_no_slot_keeps_its_turn() {
        let q = Queues::default();
        // Key 1 has a request running and three queued; key 2 has one queued.
        q.served("m", 1);
        let mut flood: Vec<Ticket> = (0..3)
            .map(|_| q.join("m", class(Priority::Interactive, 1), &[], false, 8).unwrap())
            .collect();
        let mut other = q.join("m", class(Priority::Interactive, 2), &[], false, 8).unwrap();
        q.wake("m", Some(0));
        assert_eq!(other.woken.try_recv().unwrap(), Wake::Look(Some(0)));
        // The engine has not shown the slot free yet: key 2 waits again, at the
        // front, and the next wake-up is still its own.
        let mut again = q.join("m", class(Priority::Interactive, 2), &[], true, 8).unwrap();
        q.wake("m", Some(0));
        assert!(flood.iter_mut().all(|t| t.woken.try_recv().is_err()), "key 1 went first");
        assert_eq!(again.woken.try_recv().unwrap(), Wake::Look(Some(0)));
    }

    #[test]
    fn a_full_queue_turns_away_the_fattest_keys_newest() {
        let q = Queues::default();
        let mut flood: Vec<Ticket> = (0..4)
            .map(|_| q.join("m", class(Priority::Interactive, 1), &[], false, 4).unwrap())
            .collect();
        assert!(
            q.join("m", class(Priority::Interactive, 1), &[], false, 4).is_none(),
            "no room for more of 1"
        );
        let _other = q.join("m", class(Priority::Interactive, 2), &[], false, 4).unwrap();
        assert_eq!(flood.pop().unwrap().woken.try_recv().unwrap(), Wake::Evicted);
        assert!(flood[0].woken.try_recv().is_err(), "the oldest keep their place");
        assert_eq!(q.depth("m"), 4);
        assert_eq!(q.waiting.load(Ordering::Relaxed), 4);
    }
}

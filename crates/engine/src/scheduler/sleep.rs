//! Sleep when idle (llama-server's `--sleep-idle-seconds`): after
//! `sleep_idle_s` without a request, the scheduler thread unloads every model,
//! freeing its weights and KV cache, and keeps what it needs to load it again;
//! the next request that needs a model wakes it and waits for the load.
//!
//! The HTTP side and the scheduler thread agree through [`Idle`] without a
//! lock: a request marks itself in flight before it looks whether the engine
//! sleeps, and the thread marks itself asleep before it looks whether a request
//! is in flight. Of two that cross, at least one sees the other (sequentially
//! consistent atomics), so either the thread stays awake or the request asks it
//! to wake; no request ever reads a model that is being unloaded.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether the engine sleeps, how long it has been idle, and the requests
/// that need a model now.
#[derive(Debug)]
pub struct Idle {
    /// Idle this long, the engine sleeps; never when `None`.
    after: Option<Duration>,
    /// What `last_ms` counts from.
    epoch: Instant,
    /// When the last request that needed a model ended, or the last step ran.
    last_ms: AtomicU64,
    /// Requests that need a model, being answered now.
    in_flight: AtomicUsize,
    asleep: AtomicBool,
}

impl Idle {
    /// Sleeps after `after` without work; never with `None`.
    pub fn new(after: Option<Duration>) -> Self {
        Self {
            after,
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            asleep: AtomicBool::new(false),
        }
    }

    /// Marks a request that needs a model in flight until the guard drops; the
    /// engine does not fall asleep meanwhile.
    pub fn visit(self: &Arc<Self>) -> Visit {
        self.in_flight.fetch_add(1, SeqCst);
        Visit(self.clone())
    }

    /// Whether the models sleep (or are about to): a request must wake them.
    pub fn is_asleep(&self) -> bool {
        self.asleep.load(SeqCst)
    }

    /// Notes work done now.
    pub(super) fn touch(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, SeqCst);
    }

    /// How long the thread may wait for a command before it should try to fall
    /// asleep; `None` when it never sleeps or already does.
    pub(super) fn due_in(&self) -> Option<Duration> {
        let after = self.after?;
        if self.is_asleep() {
            return None;
        }
        if self.in_flight.load(SeqCst) > 0 {
            // The request notes its end; the earliest sleep is `after` past it.
            return Some(after);
        }
        Some(after.saturating_sub(self.idle_for()))
    }

    /// Marks the engine asleep when it has been idle long enough and no
    /// request is in flight; the caller then unloads. False leaves it awake.
    pub(super) fn fall_asleep(&self) -> bool {
        let Some(after) = self.after else { return false };
        self.asleep.store(true, SeqCst);
        if self.in_flight.load(SeqCst) == 0 && self.idle_for() >= after {
            return true;
        }
        self.asleep.store(false, SeqCst);
        false
    }

    /// Marks the engine awake, its models loaded again.
    pub(super) fn woke(&self) {
        self.touch();
        self.asleep.store(false, SeqCst);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(SeqCst));
        self.epoch.elapsed().saturating_sub(last)
    }
}

/// A model that sleeps, as the HTTP side sees it: listed, described, not served.
#[derive(Debug, Clone)]
pub struct Dormant {
    /// The name clients send.
    pub id: String,
    /// What it was loaded with.
    pub info: Arc<super::model::ModelInfo>,
    /// Unix seconds when it was first loaded.
    pub created: u64,
}

/// A request that needs a model, in flight: see [`Idle::visit`].
#[derive(Debug)]
pub struct Visit(Arc<Idle>);

impl Drop for Visit {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_sleeps_without_a_bound() {
        let idle = Idle::new(None);
        assert_eq!(idle.due_in(), None);
        assert!(!idle.fall_asleep());
        assert!(!idle.is_asleep());
    }

    #[test]
    fn a_request_in_flight_keeps_it_awake() {
        let idle = Arc::new(Idle::new(Some(Duration::ZERO)));
        let visit = idle.visit();
        assert!(!idle.fall_asleep());
        assert!(!idle.is_asleep());
        drop(visit);
        assert!(idle.fall_asleep());
        assert!(idle.is_asleep());
        assert_eq!(idle.due_in(), None, "asleep: nothing to wait for");
        idle.woke();
        assert!(!idle.is_asleep());
    }

    #[test]
    fn sleeps_only_once_idle_long_enough() {
        let idle = Idle::new(Some(Duration::from_secs(3600)));
        idle.touch();
        assert!(!idle.fall_asleep());
        let due = idle.due_in().unwrap();
        assert!(due > Duration::from_secs(3500), "{due:?}");
    }
}

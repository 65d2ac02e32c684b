//! The scheduler thread's heartbeat: whether the one thread that runs llama.cpp
//! still comes round its loop. An HTTP server that answers while that thread is
//! stuck (in a call that never returns) or gone (it panicked) looks healthy and
//! serves nothing; `/health` reads this instead, and the process exits so that
//! whoever supervises it (the gateway, Kubernetes) starts it again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the thread was last seen doing.
#[derive(Debug)]
pub struct Heartbeat {
    born: Instant,
    /// Milliseconds after `born` of the last turn of the loop.
    beat: AtomicU64,
    /// Waiting for work, or loading a model: time passes without turns, rightly.
    resting: AtomicBool,
    /// False once the thread has ended.
    alive: AtomicBool,
}

/// The thread's state as `/health` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pulse {
    /// Coming round, or resting.
    Steady,
    /// No turn for this long while it had work.
    Stuck(Duration),
    /// The thread has ended (a panic).
    Gone,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            born: Instant::now(),
            beat: AtomicU64::new(0),
            resting: AtomicBool::new(true),
            alive: AtomicBool::new(true),
        }
    }
}

impl Heartbeat {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A turn of the loop.
    pub fn beat(&self) {
        self.beat.store(self.now_ms(), Ordering::Release);
    }

    /// The thread starts (`true`) or stops resting; either is a turn.
    pub fn rest(&self, resting: bool) {
        self.beat();
        self.resting.store(resting, Ordering::Release);
    }

    /// What the thread is doing, as of now.
    pub fn pulse(&self) -> Pulse {
        if !self.alive.load(Ordering::Acquire) {
            return Pulse::Gone;
        }
        if self.resting.load(Ordering::Acquire) {
            return Pulse::Steady;
        }
        let since = self.now_ms().saturating_sub(self.beat.load(Ordering::Acquire));
        Pulse::Stuck(Duration::from_millis(since))
    }

    /// Whether the thread is stuck for longer than `bound`, or gone.
    pub fn failed(&self, bound: Duration) -> Option<String> {
        match self.pulse() {
            Pulse::Steady => None,
            Pulse::Stuck(for_) if for_ <= bound => None,
            Pulse::Stuck(for_) => Some(format!(
                "the scheduler thread has not come round its loop for {} ms",
                for_.as_millis()
            )),
            Pulse::Gone => Some("the scheduler thread has ended".into()),
        }
    }

    /// A guard the thread holds: when it drops (the thread ends, by a panic
    /// too), the heartbeat says so.
    pub fn alive(self: &Arc<Self>) -> Alive {
        Alive(self.clone())
    }
}

/// Held by the scheduler thread for its whole life.
#[derive(Debug)]
pub struct Alive(Arc<Heartbeat>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resting_thread_is_steady_and_a_working_one_must_come_round() {
        let heart = Arc::new(Heartbeat::default());
        assert_eq!(heart.pulse(), Pulse::Steady, "resting at birth");
        heart.rest(false);
        std::thread::sleep(Duration::from_millis(30));
        assert!(heart.failed(Duration::from_secs(5)).is_none());
        let stuck = heart.failed(Duration::from_millis(10)).expect("stuck");
        assert!(stuck.contains("has not come round"), "{stuck}");
        heart.beat();
        assert!(heart.failed(Duration::from_millis(10)).is_none(), "came round");
        heart.rest(true);
        std::thread::sleep(Duration::from_millis(30));
        assert!(heart.failed(Duration::from_millis(10)).is_none(), "resting");
    }

    #[test]
    fn a_thread_that_panics_is_gone() {
        let heart = Arc::new(Heartbeat::default());
        let alive = heart.alive();
        let thread = std::thread::spawn(move || {
            let _alive = alive;
            panic!("on purpose");
        });
        assert!(thread.join().is_err());
        assert_eq!(heart.pulse(), Pulse::Gone);
        assert!(heart.failed(Duration::from_secs(60)).unwrap().contains("ended"));
    }
}

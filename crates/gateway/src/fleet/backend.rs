//! A backend as the gateway sees it: where it is, what it serves, how many slots it
//! has, how many the gateway has claimed, and whether it is healthy.
//!
//! Counts are atomics read on every request and written by claims, releases and
//! the health loop; nothing here is locked across an await.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::config::BackendConfig;

/// One backend.
#[derive(Debug)]
pub struct Backend {
    /// Its position in the gateway's list; stable.
    pub index: usize,
    /// Where it comes from: configured, or an engine this gateway started.
    pub origin: Origin,
    /// Base URL; `None` until a supervised engine has printed its address.
    address: ArcSwapOption<String>,
    /// The engine process it is now (its `/health` `instance`): the stored
    /// responses whose ids name it are there.
    instance: ArcSwapOption<String>,
    /// Relative share of traffic among equals.
    pub weight: u32,
    /// `Bearer` and its own API key, sent instead of any client's key.
    pub api_key: Option<axum::http::HeaderValue>,
    /// Stable identity for rendezvous hashing: from its origin, not from the
    /// address of a supervised engine (whose port changes on restart).
    pub id: u64,
    /// Models it serves: configured, or discovered from `/v1/models`.
    models: ArcSwap<Vec<String>>,
    /// Whether `models` came from the configuration (then never rediscovered).
    pub fixed_models: bool,
    /// Slots it has: configured, or read from `/slots`.
    slots: AtomicU32,
    /// Whether `slots` came from the configuration.
    pub fixed_slots: bool,
    /// Requests this gateway has in flight there.
    in_flight: AtomicU32,
    /// How long a claim on it lasts, in microseconds: a moving average.
    hold_us: AtomicU64,
    /// Slots busy there for others (other gateways, or llama.cpp slots kept busy
    /// after a client left), as of the last reconciliation with `/slots`.
    foreign_busy: AtomicU32,
    /// `foreign_busy` as the backend last reported it, restored when a full mark
    /// expires.
    reported_busy: AtomicU32,
    /// Counts full marks and reconciliations: a mark expires only if nothing
    /// newer came since.
    marks: AtomicU64,
    healthy: AtomicBool,
    /// Set by the admin API or a reload: no new requests; removed once idle.
    draining: AtomicBool,
    /// Whether its slot state is pushed to this gateway (`/slots/events`), and
    /// need not be polled.
    pushed: AtomicBool,
    /// Whether a task follows its slot events.
    pub followed: AtomicBool,
    /// This replica's turns at its free slots, dealt at each pushed event.
    pub turns: crate::fleet::turns::Turns,
    /// The number of the last pushed event.
    seq: AtomicU64,
    successes: AtomicU32,
    failures: AtomicU32,
}

/// Where a backend comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A `[[backends]]` entry, one added by the admin API or discovered: its
    /// base URL, without a trailing `/`.
    Configured(String),
    /// The engine of `[[engines]]` entry `place`, started by this gateway; its
    /// address is known once it has started, and changes when it restarts.
    Supervised(usize),
}

impl Origin {
    /// What names it where it has no address: its URL, or `engine-<place>`.
    fn label(&self) -> String {
        match self {
            Self::Configured(url) => url.clone(),
            Self::Supervised(place) => format!("engine-{place}"),
        }
    }
}

impl Backend {
    /// A backend from its configuration. Unhealthy until it passes a check.
    pub fn new(index: usize, config: &BackendConfig) -> Self {
        let url = config.url.trim_end_matches('/').to_owned();
        let origin = Origin::Configured(url.clone());
        let mut backend =
            Self::of(index, origin, config.weight, config.models.clone(), config.slots);
        backend.address = ArcSwapOption::from_pointee(url);
        backend.api_key = config.api_key_env.as_ref().and_then(|var| {
            let key = std::env::var(var).ok()?;
            axum::http::HeaderValue::from_str(&format!("Bearer {key}")).ok()
        });
        backend
    }

    /// The engine of `[[engines]]` entry `place`, with `slots` slots and the
    /// admin key it is started with; it has no address until it has started.
    pub fn supervised(index: usize, place: usize, slots: u32, admin_key: &str) -> Self {
        // Its models are set as it starts; its slots are those it is started with.
        let mut backend = Self::of(index, Origin::Supervised(place), 1, None, Some(slots));
        backend.api_key = axum::http::HeaderValue::from_str(&format!("Bearer {admin_key}")).ok();
        backend
    }

    fn of(
        index: usize,
        origin: Origin,
        weight: u32,
        models: Option<Vec<String>>,
        slots: Option<u32>,
    ) -> Self {
        Self {
            index,
            id: crate::fleet::hash::backend_id(&origin.label()),
            origin,
            address: ArcSwapOption::empty(),
            instance: ArcSwapOption::empty(),
            weight,
            api_key: None,
            fixed_models: models.is_some(),
            models: ArcSwap::from_pointee(models.unwrap_or_default()),
            fixed_slots: slots.is_some(),
            slots: AtomicU32::new(slots.unwrap_or(0)),
            in_flight: AtomicU32::new(0),
            hold_us: AtomicU64::new(0),
            foreign_busy: AtomicU32::new(0),
            reported_busy: AtomicU32::new(0),
            marks: AtomicU64::new(0),
            healthy: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            pushed: AtomicBool::new(false),
            followed: AtomicBool::new(false),
            turns: crate::fleet::turns::Turns::default(),
            seq: AtomicU64::new(0),
            successes: AtomicU32::new(0),
            failures: AtomicU32::new(0),
        }
    }

    /// Base URL, where it can be reached now; `None` while a supervised engine
    /// has not started.
    pub fn address(&self) -> Option<Arc<String>> {
        self.address.load_full()
    }

    /// Its name in logs, metrics and the operator's view: its base URL, or
    /// `engine-<place>` while a supervised engine has none.
    pub fn url(&self) -> Arc<String> {
        self.address().unwrap_or_else(|| Arc::new(self.origin.label()))
    }

    /// Sets the address of a supervised engine (a restarted one listens on a new port).
    pub fn set_address(&self, url: String) {
        self.address.store(Some(Arc::new(url)));
    }

    /// Models it serves.
    pub fn models(&self) -> Arc<Vec<String>> {
        self.models.load_full()
    }

    /// Sets the models it serves.
    pub fn set_models(&self, models: Vec<String>) {
        self.models.store(Arc::new(models));
    }

    /// Whether it serves `model`.
    pub fn serves(&self, model: &str) -> bool {
        self.models.load().iter().any(|m| m == model)
    }

    /// Whether it takes traffic.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire) && !self.draining.load(Ordering::Acquire)
    }

    /// Takes no new requests from now on; those in flight finish.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether it is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The engine process it is now, as its last health check said.
    pub fn instance(&self) -> Option<Arc<String>> {
        self.instance.load_full()
    }

    /// Sets the engine process it is (a restarted engine is a new one).
    pub fn set_instance(&self, instance: Option<String>) {
        self.instance.store(instance.map(Arc::new));
    }

    /// Whether it is an engine this gateway started.
    pub fn is_supervised(&self) -> bool {
        matches!(self.origin, Origin::Supervised(_))
    }

    /// Its configured URL, if it has one.
    pub fn configured_url(&self) -> Option<&str> {
        match &self.origin {
            Origin::Configured(url) => Some(url),
            Origin::Supervised(_) => None,
        }
    }

    /// Slots it has.
    pub fn slots(&self) -> u32 {
        self.slots.load(Ordering::Acquire)
    }

    /// Requests this gateway has in flight there.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Slots busy for others.
    pub fn foreign_busy(&self) -> u32 {
        self.foreign_busy.load(Ordering::Acquire)
    }

    /// Slots free for this gateway, as far as its turn allows.
    pub fn free(&self) -> u32 {
        self.unheld_free().min(self.turns.left())
    }

    /// Slots free for this gateway, turns aside.
    pub fn unheld_free(&self) -> u32 {
        self.slots().saturating_sub(self.in_flight() + self.foreign_busy())
    }

    /// Claims a slot if one is free; atomic against concurrent claims.
    pub fn try_claim(&self) -> bool {
        self.turns.take(|| {
            let limit = self.slots().saturating_sub(self.foreign_busy());
            self.in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
                .is_ok()
        })
    }

    /// Counts a request without a slot check (the comparison policies).
    pub fn claim_unchecked(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// Folds a claim's length into the average (weight 1/8 for the newest).
    pub fn held(&self, held: std::time::Duration) {
        let us = u64::try_from(held.as_micros()).unwrap_or(u64::MAX);
        let _ = self.hold_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
            Some(if avg == 0 { us } else { avg - avg / 8 + us / 8 })
        });
    }

    /// How long a claim on it lasts, on average; zero before the first ends.
    pub fn hold(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.hold_us.load(Ordering::Relaxed))
    }

    /// Gives back a claimed slot. Never goes below zero.
    pub fn release(&self) {
        let _ =
            self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Reconciles with what the backend's `/slots` says: its slot count, and how
    /// many are busy beyond this gateway's own requests. `in_flight_before` is this
    /// gateway's count when `/slots` was asked: a request released while the answer
    /// was on its way is still in that answer, and must not count as someone else's.
    pub fn reconcile(&self, total: u32, busy: u32, in_flight_before: u32) {
        if !self.fixed_slots {
            self.slots.store(total, Ordering::Release);
        }
        let ours = self.in_flight().max(in_flight_before);
        self.reported(busy.saturating_sub(ours));
    }

    /// What the backend reported supersedes any full mark.
    fn reported(&self, others: u32) {
        self.marks.fetch_add(1, Ordering::AcqRel);
        self.reported_busy.store(others, Ordering::Release);
        self.foreign_busy.store(others, Ordering::Release);
    }

    /// The engine pushed its state: `total` slots, of which `others` are taken by
    /// requests this gateway did not send (running or queued there).
    pub fn pushed(&self, total: u32, others: u32, seq: u64) {
        self.pushed.store(true, Ordering::Release);
        self.seq.store(seq, Ordering::Release);
        if !self.fixed_slots {
            self.slots.store(total, Ordering::Release);
        }
        self.reported(others);
    }

    /// The number of the last pushed event.
    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Whether its slot state is pushed (and need not be polled).
    pub fn is_pushed(&self) -> bool {
        self.pushed.load(Ordering::Acquire)
    }

    /// Its slot state is no longer pushed: the health checks poll it again.
    pub fn set_pushed(&self, pushed: bool) {
        self.pushed.store(pushed, Ordering::Release);
        if !pushed {
            self.turns.clear();
        }
    }

    /// The backend said it is full: treat every slot as busy until the next
    /// reconciliation, or until [`Backend::unmark_full`] with the mark returned
    /// here, whichever comes first. The mark must expire by itself: an idle
    /// engine that pushes its state sends nothing more, so without the expiry a
    /// refusal that raced with its last event would leave it marked full for good.
    pub fn mark_full(&self) -> u64 {
        let mark = self.marks.fetch_add(1, Ordering::AcqRel) + 1;
        self.foreign_busy.store(self.slots(), Ordering::Release);
        mark
    }

    /// Ends full mark `mark`, if nothing newer came since: the slots count as the
    /// backend last reported them. Returns whether it ended it.
    pub fn unmark_full(&self, mark: u64) -> bool {
        if self.marks.compare_exchange(mark, mark + 1, Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            return false;
        }
        self.foreign_busy.store(self.reported_busy.load(Ordering::Acquire), Ordering::Release);
        true
    }

    /// A passing check. Returns true when this made it healthy.
    pub fn check_passed(&self, threshold: u32) -> bool {
        self.failures.store(0, Ordering::Release);
        let n = self.successes.fetch_add(1, Ordering::AcqRel) + 1;
        n >= threshold && !self.healthy.swap(true, Ordering::AcqRel)
    }

    /// A failing check. Returns true when this made it unhealthy.
    pub fn check_failed(&self, threshold: u32) -> bool {
        self.successes.store(0, Ordering::Release);
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        n >= threshold && self.healthy.swap(false, Ordering::AcqRel)
    }

    /// Ejects it at once (a refused connection, a process that exited).
    pub fn eject(&self) -> bool {
        self.successes.store(0, Ordering::Release);
        self.healthy.swap(false, Ordering::AcqRel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(slots: u32) -> Backend {
        Backend::new(0, &BackendConfig { slots: Some(slots), ..BackendConfig::at("http://x") })
    }

    #[test]
    fn claims_stop_at_free_slots_and_release_never_goes_negative() {
        let b = backend(2);
        assert!(b.try_claim() && b.try_claim());
        assert!(!b.try_claim());
        b.release();
        b.release();
        b.release();
        assert_eq!(b.in_flight(), 0);
        b.reconcile(2, 1, 0);
        assert_eq!(b.free(), 1);
        assert!(b.try_claim());
        assert!(!b.try_claim(), "a slot busy for others is not claimed");
    }

    #[test]
    fn a_release_during_reconciliation_is_not_taken_for_a_foreign_slot() {
        let b = backend(1);
        assert!(b.try_claim());
        let before = b.in_flight();
        // /slots answers "1 busy" (ours), but the request ends before the answer lands.
        b.release();
        b.reconcile(1, 1, before);
        assert_eq!(b.free(), 1);
    }

    #[test]
    fn concurrent_claims_never_overcommit() {
        let b = Arc::new(backend(5));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..1000).filter(|_| b.try_claim()).count())
            })
            .collect();
        let claimed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(claimed, 5);
        assert_eq!(b.in_flight(), 5);
    }

    #[test]
    fn a_full_mark_ends_by_itself_unless_the_backend_reported_since() {
        let b = backend(2);
        b.reconcile(2, 1, 0);
        let mark = b.mark_full();
        assert_eq!(b.free(), 0);
        assert!(b.unmark_full(mark));
        assert_eq!(b.free(), 1, "back to what the backend last reported");
        assert!(!b.unmark_full(mark), "once");
        let mark = b.mark_full();
        b.pushed(2, 2, 7);
        assert!(!b.unmark_full(mark), "a report came since: it stands");
        assert_eq!(b.free(), 0);
    }

    #[test]
    fn health_thresholds() {
        let b = backend(1);
        assert!(!b.check_passed(2));
        assert!(b.check_passed(2), "second pass admits");
        assert!(!b.check_failed(2));
        assert!(b.check_failed(2), "second failure ejects");
        assert!(!b.is_healthy());
    }
}

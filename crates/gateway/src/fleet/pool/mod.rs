//! The backends together: picking one for a request, claiming its slot, and the
//! per-model queues of requests waiting for a slot. The queues are woken by
//! releases (and by backends turning healthy), never by polling.

pub mod priority;
mod queue;
mod retire;
mod spill;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use slotgate_protocol::{ApiError, ErrorType};
use tokio::time::Instant;

use crate::config::{BackendConfig, Routing};
use crate::fleet::backend::Backend;
use crate::fleet::balancer::{pick, Affinity, Policy, View};
use crate::metrics as m;
pub use priority::Priority;
pub use queue::Class;
use queue::{Queues, Wake};
use spill::Spills;

/// What a request brings to the queue: whose it is, and by when it must start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Wait {
    /// Its place in the order of the queue.
    pub class: Class,
    /// When it must have started (`x-slotgate-deadline-ms`), if it says.
    pub deadline: Option<Instant>,
}

/// All backends, the policy, and the queues. Backends come and go (the admin
/// API, a reload) and the routing settings change on reload: each request reads
/// the versions in force when it looks.
pub struct Pool {
    backends: ArcSwap<Vec<Arc<Backend>>>,
    /// The next backend's `index`: never reused, so that a request's list of
    /// backends it failed on cannot name a newcomer.
    next_index: AtomicUsize,
    settings: ArcSwap<Settings>,
    turn: AtomicU64,
    queues: Queues,
    spills: Spills,
}

/// A claimed slot on a backend; released when dropped, which wakes the next
/// request waiting that can use the backend. It rides on the response body, so a
/// finished stream and a client that went away both release it.
pub struct Claim {
    pool: Arc<Pool>,
    /// The backend claimed.
    pub backend: Arc<Backend>,
    since: Instant,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.backend.held(self.since.elapsed());
        self.backend.release();
        self.pool.wake_backend(&self.backend);
    }
}

/// The routing settings the pool applies.
#[derive(Debug, Clone, Copy)]
struct Settings {
    policy: Policy,
    load_factor: f64,
    queue_size: usize,
    queue_timeout: Duration,
}

impl Settings {
    fn of(routing: &Routing) -> Self {
        Self {
            policy: routing.policy,
            load_factor: routing.cache_load_factor,
            queue_size: routing.queue_size as usize,
            queue_timeout: Duration::from_millis(routing.queue_timeout_ms),
        }
    }
}

impl Pool {
    /// A pool over `backends`, whose indexes are their places in the list.
    pub fn new(backends: Vec<Arc<Backend>>, routing: &Routing) -> Arc<Self> {
        let next = backends.iter().map(|b| b.index + 1).max().unwrap_or(0);
        Arc::new(Self {
            backends: ArcSwap::from_pointee(backends),
            next_index: AtomicUsize::new(next),
            settings: ArcSwap::from_pointee(Settings::of(routing)),
            turn: AtomicU64::new(0),
            queues: Queues::default(),
            spills: Spills::default(),
        })
    }

    /// Every backend, as of now.
    pub fn backends(&self) -> Arc<Vec<Arc<Backend>>> {
        self.backends.load_full()
    }

    /// The backend numbered `index`, if it is still in the pool.
    pub fn find(&self, index: usize) -> Option<Arc<Backend>> {
        self.backends.load().iter().find(|b| b.index == index).cloned()
    }

    /// Adds a backend; it takes requests once its health checks pass.
    pub fn add(&self, config: &BackendConfig) -> Arc<Backend> {
        let index = self.next_index.fetch_add(1, Ordering::Relaxed);
        let backend = Arc::new(Backend::new(index, config));
        self.backends.rcu(|list| {
            let mut list = Vec::clone(list);
            list.push(backend.clone());
            list
        });
        backend
    }

    /// Takes the backend numbered `index` out of the pool; requests still on it
    /// keep it until they end.
    pub fn remove(&self, index: usize) -> bool {
        let mut found = false;
        self.backends.rcu(|list| {
            found = list.iter().any(|b| b.index == index);
            list.iter().filter(|b| b.index != index).cloned().collect::<Vec<_>>()
        });
        found
    }

    /// Applies `routing`'s policy and queue settings to the requests that look
    /// from now on.
    pub fn set_routing(&self, routing: &Routing) {
        self.settings.store(Arc::new(Settings::of(routing)));
    }

    /// Whether the policy routes by a request's affinity key (`cache_aware`).
    pub fn uses_affinity(&self) -> bool {
        self.settings.load().policy == Policy::CacheAware
    }

    /// Whether any backend, healthy or not, serves `model`.
    pub fn knows(&self, model: &str) -> bool {
        self.backends.load().iter().any(|b| b.serves(model))
    }

    /// The one model every backend serves, when the backends serve only one.
    pub fn only_model(&self) -> Option<String> {
        let backends = self.backends.load();
        let mut models = backends.iter().flat_map(|b| b.models().to_vec());
        let first = models.next()?;
        models.all(|m| m == first).then_some(first)
    }

    /// Whether a healthy backend outside `exclude` serves `model`.
    pub fn has_other(&self, model: &str, exclude: &[usize]) -> bool {
        self.backends
            .load()
            .iter()
            .any(|b| b.is_healthy() && b.serves(model) && !exclude.contains(&b.index))
    }

    /// Requests waiting for `model`.
    pub fn queue_depth(&self, model: &str) -> usize {
        self.queues.depth(model)
    }

    /// Every model served or queued for, and its queue's depth (0 before its
    /// first wait).
    pub fn queue_depths(&self) -> Vec<(String, usize)> {
        let backends = self.backends.load();
        let mut depths: std::collections::BTreeMap<String, usize> =
            backends.iter().flat_map(|b| b.models().to_vec()).map(|m| (m, 0)).collect();
        depths.extend(self.queues.depths());
        depths.into_iter().collect()
    }

    /// Claims a slot for `model` now, if the policy finds one, avoiding `exclude`;
    /// `affinity` is the request's affinity key, if it has one.
    pub fn try_acquire(
        self: &Arc<Self>,
        model: &str,
        exclude: &[usize],
        affinity: Option<u64>,
    ) -> Option<Claim> {
        let settings = **self.settings.load();
        let cache_aware = settings.policy == Policy::CacheAware;
        let backends = self.backends.load();
        loop {
            let views: Vec<View> = backends
                .iter()
                .map(|b| View {
                    healthy: b.is_healthy() && !exclude.contains(&b.index),
                    serves: b.serves(model),
                    free: b.free(),
                    in_flight: b.in_flight(),
                    weight: b.weight,
                    slots: b.slots(),
                    id: b.id,
                })
                .collect();
            let turn = self.turn.fetch_add(1, Ordering::Relaxed);
            let sticky = affinity.filter(|_| cache_aware).and_then(|key| self.spills.get(key));
            let rule =
                affinity.map(|key| Affinity { key, sticky, load_factor: settings.load_factor });
            let (i, decision) = pick(&views, settings.policy, rule, turn, &mut |n| {
                rand::random_range(0..n.max(1))
            })?;
            let backend = &backends[i];
            if settings.policy.claims_slots() {
                if !backend.try_claim() {
                    // Another request took the last slot between look and claim: look again.
                    continue;
                }
            } else {
                backend.claim_unchecked();
            }
            m::routed(decision.label());
            if let (Some(key), true) = (affinity, cache_aware) {
                self.spills.remember(key, decision, sticky, backend.id);
            }
            return Some(Claim {
                pool: self.clone(),
                backend: backend.clone(),
                since: Instant::now(),
            });
        }
    }

    /// Claims a slot for `model`, waiting in the model's queue (in the order of
    /// [`queue`]) until one frees, the queue timeout passes, or the request's
    /// deadline does. A request whose deadline the expected wait already
    /// exceeds is refused at once.
    pub async fn acquire(
        self: &Arc<Self>,
        model: &str,
        exclude: &[usize],
        affinity: Option<u64>,
        wait: Wait,
    ) -> Result<Claim, ApiError> {
        if let Some(claim) = self.try_acquire(model, exclude, affinity) {
            self.queues.served(model, wait.class.tenant);
            return Ok(claim);
        }
        let started = Instant::now();
        let Settings { queue_timeout, queue_size, .. } = **self.settings.load();
        let mut deadline = started + queue_timeout;
        if let Some(must_start) = wait.deadline {
            if let Some(expected) = self.expected_wait(model, wait.class) {
                if started + expected > must_start {
                    return Err(late(model, expected));
                }
            }
            deadline = deadline.min(must_start);
        }
        let mut front = false;
        loop {
            let Some(ticket) = self.queues.join(model, wait.class, exclude, front, queue_size)
            else {
                return Err(self.unavailable(model, "its queue is full"));
            };
            self.set_depth(model);
            // A release between the first look and joining the queue would be missed:
            // look once more now that this request is in the queue.
            if let Some(claim) = self.try_acquire(model, exclude, affinity) {
                if !self.queues.leave(model, ticket.id) {
                    self.queues.wake(model, None);
                }
                self.queues.served(model, wait.class.tenant);
                self.record_wait(model, started);
                return Ok(claim);
            }
            match tokio::time::timeout_at(deadline, ticket.woken).await {
                Ok(Ok(Wake::Evicted)) => {
                    self.record_wait(model, started);
                    return Err(self.unavailable(
                        model,
                        "its queue is full and made room for another key's request",
                    ));
                }
                Ok(_) => {
                    if let Some(claim) = self.try_acquire(model, exclude, affinity) {
                        self.queues.served(model, wait.class.tenant);
                        self.record_wait(model, started);
                        return Ok(claim);
                    }
                    // Someone else took the slot, or the engine has not shown it
                    // free yet: wait again, at the head of the line, and with the
                    // key's turn kept (it was charged only for a slot it got).
                    front = true;
                }
                Err(_) => {
                    if !self.queues.leave(model, ticket.id) {
                        // Woken as the time ran out: the wake-up is another's now.
                        self.queues.wake(model, None);
                    }
                    self.record_wait(model, started);
                    if wait.deadline.is_some_and(|d| d <= deadline) {
                        return Err(late(model, started.elapsed()));
                    }
                    return Err(self.unavailable(
                        model,
                        "no slot became free within routing.queue_timeout_ms",
                    ));
                }
            }
        }
    }

    /// How long a request of `class` would wait for `model` now: the requests
    /// ahead of it, over the slots, times how long a slot is held on average.
    /// `None` before any claim has ended.
    fn expected_wait(&self, model: &str, class: Class) -> Option<Duration> {
        let backends = self.backends.load();
        let serving: Vec<&Arc<Backend>> =
            backends.iter().filter(|b| b.is_healthy() && b.serves(model)).collect();
        let slots: u32 = serving.iter().map(|b| b.slots()).sum();
        let held: Vec<Duration> =
            serving.iter().map(|b| b.hold()).filter(|h| !h.is_zero()).collect();
        if slots == 0 || held.is_empty() {
            return None;
        }
        let hold = held.iter().sum::<Duration>() / u32::try_from(held.len()).unwrap_or(1);
        let ahead = u32::try_from(self.queues.ahead(model, class.priority)).unwrap_or(u32::MAX);
        Some(hold * ahead.saturating_add(1) / slots)
    }

    fn set_depth(&self, model: &str) {
        metrics::gauge!(m::QUEUE_DEPTH, "model" => model.to_owned())
            .set(self.queue_depth(model) as f64);
    }

    fn record_wait(&self, model: &str, started: Instant) {
        metrics::histogram!(m::QUEUE_WAIT, "model" => model.to_owned())
            .record(started.elapsed().as_secs_f64());
        self.set_depth(model);
    }

    fn unavailable(&self, model: &str, why: &str) -> ApiError {
        if !self.backends.load().iter().any(|b| b.serves(model) && b.is_healthy()) {
            return ApiError::new(
                ErrorType::UnavailableError,
                format!("no healthy backend serves model `{model}` right now; retry later"),
            )
            .with_code(slotgate_protocol::SLOT_UNAVAILABLE);
        }
        ApiError::slot_unavailable(format!(
            "every slot for model `{model}` is busy and {why}; retry later"
        ))
    }

    /// A slot may be free on `backend`: wakes, for each model it serves, the first
    /// waiter that may use it.
    pub fn wake_backend(&self, backend: &Backend) {
        for model in backend.models().iter() {
            self.queues.wake(model, Some(backend.index));
        }
    }
}

/// A 503 for a request that cannot start before its deadline; `Retry-After`
/// is the expected wait.
fn late(model: &str, expected: Duration) -> ApiError {
    let seconds = u32::try_from(expected.as_secs().max(1)).unwrap_or(u32::MAX);
    ApiError::slot_unavailable(format!(
        "no slot for model `{model}` can be free before the request's deadline (x-slotgate-deadline-ms); retry later"
    ))
    .with_code("deadline_exceeded")
    .with_retry_after(seconds)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::config::BackendConfig;

    #[test]
    fn the_only_model_is_the_one_every_backend_serves() {
        let serving = |models: &[&[&str]]| {
            let backends = models
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let config = BackendConfig {
                        models: Some(m.iter().map(|s| s.to_string()).collect()),
                        slots: Some(1),
                        ..BackendConfig::at(format!("http://x{i}"))
                    };
                    Arc::new(Backend::new(i, &config))
                })
                .collect();
            Pool::new(backends, &Routing::default()).only_model()
        };
        assert_eq!(serving(&[&["m"], &["m"]]).as_deref(), Some("m"));
        assert_eq!(serving(&[&["m"], &["n"]]), None);
        assert_eq!(serving(&[&["m", "n"]]), None);
        assert_eq!(serving(&[]), None);
    }

    fn pool(slots: u32, queue_size: u32, timeout_ms: u64) -> Arc<Pool> {
        let config = BackendConfig {
            models: Some(vec!["m".into()]),
            slots: Some(slots),
            ..BackendConfig::at("http://x")
        };
        let backend = Arc::new(Backend::new(0, &config));
        backend.check_passed(1);
        let routing = Routing { queue_size, queue_timeout_ms: timeout_ms, ..Routing::default() };
        Pool::new(vec![backend], &routing)
    }

    /// Two healthy backends of model `m`, one slot each.
    fn two_backends_of_one_slot() -> Vec<Arc<Backend>> {
        (0..2)
            .map(|i| {
                let config = BackendConfig {
                    models: Some(vec!["m".into()]),
                    slots: Some(1),
                    ..BackendConfig::at(format!("http://127.0.0.1:{}", 9000 + i))
                };
                let backend = Arc::new(Backend::new(i, &config));
                backend.check_passed(1);
                backend
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_times_out_after_the_queue_timeout() {
        let pool = pool(1, 4, 500);
        let held = pool.acquire("m", &[], None, Wait::default()).await.unwrap();
        let started = Instant::now();
        let err = pool.acquire("m", &[], None, Wait::default()).await.err().unwrap();
        assert_eq!(err.code.as_deref(), Some("slot_unavailable"));
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert_eq!(pool.queue_depth("m"), 0, "a timed-out waiter leaves the queue");
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_wakes_waiters_in_order() {
        let pool = pool(1, 4, 60_000);
        let held = pool.acquire("m", &[], None, Wait::default()).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..3 {
            let (pool, order) = (pool.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let claim = pool.acquire("m", &[], None, Wait::default()).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(claim);
            }));
            // Queue them in a known order.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(pool.queue_depth("m"), 3);
        let started = Instant::now();
        drop(held);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        // Woken by releases: no polling interval shows up in the elapsed time.
        assert_eq!(started.elapsed(), Duration::from_millis(30));
        assert_eq!(pool.backends()[0].in_flight(), 0);
    }

    #[tokio::test]
    async fn a_spilled_conversation_stays_on_the_backend_it_spilled_to() {
        let backends = two_backends_of_one_slot();
        let pool = Pool::new(backends, &Routing::default());
        let key = Some(11);
        let home = pool.acquire("m", &[], key, Wait::default()).await.unwrap();
        let home_index = home.backend.index;
        // Its first choice is full: spilled to the other.
        let away = pool.acquire("m", &[], key, Wait::default()).await.unwrap();
        assert_ne!(away.backend.index, home_index);
        drop(home);
        drop(away);
        // Both free again: it stays where its newest turn is cached.
        let next = pool.acquire("m", &[], key, Wait::default()).await.unwrap();
        assert_ne!(next.backend.index, home_index);
        drop(next);
        // Until that backend is gone: back to its first choice, and forgotten.
        pool.backends()[1 - home_index].eject();
        assert_eq!(
            pool.acquire("m", &[], key, Wait::default()).await.unwrap().backend.index,
            home_index
        );
        pool.backends()[1 - home_index].check_passed(1);
        assert_eq!(
            pool.acquire("m", &[], key, Wait::default()).await.unwrap().backend.index,
            home_index
        );
    }

    /// A request that excludes backend A (it failed there) is queued before one
    /// that does not; A frees a slot: the second is served at once, at the release,
    /// and the first keeps waiting for a backend it can use.
    #[tokio::test(start_paused = true)]
    async fn a_freed_slot_goes_to_the_first_waiter_that_can_use_it() {
        let backends = two_backends_of_one_slot();
        let routing = Routing { policy: Policy::Slots, ..Routing::default() };
        let pool = Pool::new(backends, &routing);
        let a = pool.acquire("m", &[], None, Wait::default()).await.unwrap();
        let b = pool.acquire("m", &[], None, Wait::default()).await.unwrap();
        let (index_a, index_b) = (a.backend.index, b.backend.index);
        let excluding_a = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.acquire("m", &[index_a], None, Wait::default()).await.map(|c| c.backend.index)
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let any = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.acquire("m", &[], None, Wait::default())
                    .await
                    .map(|c| (c.backend.index, Instant::now()))
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(pool.queue_depth("m"), 2);
        let released = Instant::now();
        drop(a);
        let (got, at) = any.await.unwrap().unwrap();
        assert_eq!((got, at), (index_a, released), "served at the release, not later");
        assert!(!excluding_a.is_finished(), "A is no use to it: it still waits");
        drop(b);
        assert_eq!(excluding_a.await.unwrap().unwrap(), index_b);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once() {
        let pool = pool(1, 0, 60_000);
        let _held = pool.acquire("m", &[], None, Wait::default()).await.unwrap();
        let started = Instant::now();
        let err = pool.acquire("m", &[], None, Wait::default()).await.err().unwrap();
        assert_eq!(err.code.as_deref(), Some("slot_unavailable"));
        assert!(err.message.contains("queue is full"), "{}", err.message);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}

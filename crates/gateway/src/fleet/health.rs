//! Active health checks: every interval each backend's `/health`, then its
//! `/slots` (to reconcile slot counts; for vLLM, which has none, the load in its
//! `/metrics`) and, unless configured, its `/v1/models`.
//! A backend is admitted after `healthy_threshold` passes in a row and ejected
//! after `unhealthy_threshold` failures; a loading backend (503) fails the check.

use std::sync::Arc;
use std::time::Duration;

use slotgate_protocol::{ModelList, SlotCounts, SlotStatus};
use tokio_util::sync::CancellationToken;

use crate::config::Routing;
use crate::fleet::backend::Backend;
use crate::fleet::pool::Pool;
use crate::proxy::upstream::{BackendClient, FetchError};

/// The most of a backend's `/slots`, `/metrics` or `/v1/models` read at once:
/// far above what any engine lists, so that a broken one cannot fill memory.
pub const READ_LIMIT: usize = 8 << 20;

/// Checks every backend until `stop` is cancelled, and has a task follow the
/// slot events of each (see [`crate::fleet::slot_events`]) when `routing.slot_events`.
pub async fn run(
    pool: Arc<Pool>,
    client: Arc<BackendClient>,
    routing: Routing,
    replica: Arc<str>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(routing.health_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let backends = pool.backends();
        for b in backends.iter().filter(|_| routing.slot_events) {
            if !b.followed.swap(true, std::sync::atomic::Ordering::AcqRel) {
                let follow = crate::fleet::slot_events::follow(
                    pool.clone(),
                    b.clone(),
                    client.clone(),
                    replica.clone(),
                    stop.clone(),
                );
                tokio::spawn(follow);
            }
        }
        let checks = backends.iter().map(|b| check(&pool, &client, &routing, b.clone()));
        futures::future::join_all(checks).await;
    }
}

async fn check(pool: &Arc<Pool>, client: &BackendClient, routing: &Routing, backend: Arc<Backend>) {
    // A supervised engine that has not started yet has nothing to check.
    let Some(url) = backend.address() else { return };
    let timeout = crate::proxy::Timeouts::of(routing).read;
    let health = read(client, &backend, &url, "/health", timeout).await;
    let ok = matches!(&health, Ok((s, _)) if s.is_success());
    if let (true, Ok((_, body))) = (ok, &health) {
        // A slotgate engine names its process; others do not. A failing check
        // (a loading or stuck engine) says nothing of it.
        let said = serde_json::from_slice::<serde_json::Value>(body).ok();
        let instance = said.as_ref().and_then(|v| v["instance"].as_str()).map(str::to_owned);
        backend.set_instance(instance);
    }
    if !ok {
        if backend.check_failed(routing.unhealthy_threshold) {
            tracing::warn!(backend = %url, "ejected: failing health checks");
        }
        return;
    }
    if !backend.fixed_models {
        if let Ok((status, body)) = read(client, &backend, &url, "/v1/models", timeout).await {
            if let Ok(list) = serde_json::from_slice::<ModelList>(&body) {
                if status.is_success() {
                    backend.set_models(list.data.into_iter().map(|m| m.id).collect());
                }
            }
        }
    }
    if backend.is_pushed() {
        // Its slot state arrives as it changes: nothing to poll.
        admit(pool, routing, &backend, &url);
        return;
    }
    let in_flight = backend.in_flight();
    match slot_state(client, &backend, &url, timeout).await {
        Some((total, busy)) => backend.reconcile(total, busy, in_flight),
        // Neither /slots nor load metrics: count it as one slot rather than none.
        None if !backend.fixed_slots && backend.slots() == 0 => backend.reconcile(1, 0, in_flight),
        None => {}
    }
    admit(pool, routing, &backend, &url);
}

/// Its slots and how many are busy: from `/slots` (slotgate, llama.cpp's server),
/// or else from the load in its `/metrics` (vLLM) over its configured slot count.
async fn slot_state(
    client: &BackendClient,
    backend: &Backend,
    url: &str,
    timeout: Duration,
) -> Option<(u32, u32)> {
    if let Ok((status, body)) = read(client, backend, url, "/slots", timeout).await {
        if status.is_success() {
            if let Ok(slots) = serde_json::from_slice::<Vec<SlotStatus>>(&body) {
                let counts = SlotCounts::of(&slots, None);
                return Some((counts.total, counts.busy));
            }
        }
    }
    let (status, body) = read(client, backend, url, "/metrics", timeout).await.ok()?;
    if !status.is_success() {
        return None;
    }
    let load = crate::fleet::load_metrics::Load::parse(std::str::from_utf8(&body).ok()?)?;
    // Its capacity is what `slots` says (vLLM's `max_num_seqs`); unset, one.
    Some((backend.slots().max(1), load.busy()))
}

/// GETs `path` of `backend` at `url` whole, with the engine's own key where it
/// has one (what each slot holds is shown only with it).
pub async fn read(
    client: &BackendClient,
    backend: &Backend,
    url: &str,
    path: &str,
    timeout: Duration,
) -> Result<(axum::http::StatusCode, axum::body::Bytes), FetchError> {
    let key = backend.api_key.clone().map(|key| (axum::http::header::AUTHORIZATION, key));
    client.fetch(url, path, key, timeout, READ_LIMIT).await
}

/// A passing check: admitted after enough of them; waiting requests look again.
fn admit(pool: &Arc<Pool>, routing: &Routing, backend: &Arc<Backend>, url: &str) {
    let was_free = backend.free();
    if backend.check_passed(routing.healthy_threshold) {
        tracing::info!(backend = %url, models = ?backend.models(), slots = backend.slots(), "admitted");
    }
    if backend.is_healthy() {
        // Slots may have freed outside this gateway: let waiting requests look again.
        for _ in 0..was_free.max(1) {
            pool.wake_backend(backend);
        }
    }
}

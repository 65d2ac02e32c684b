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

/// Checks every backend until `stop` is cancelled, and has a task follow the
/// slot events of each (see [`crate::fleet::slot_events`]) when `routing.slot_events`.
pub async fn run(
    pool: Arc<Pool>,
    client: reqwest::Client,
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

async fn check(
    pool: &Arc<Pool>,
    client: &reqwest::Client,
    routing: &Routing,
    backend: Arc<Backend>,
) {
    let url = backend.url();
    if url.is_empty() {
        return;
    }
    let timeout = Duration::from_millis(routing.health_interval_ms.max(500));
    let ok = match client.get(format!("{url}/health")).timeout(timeout).send().await {
        Ok(r) => r.status().is_success(),
        Err(_) => false,
    };
    if !ok {
        if backend.check_failed(routing.unhealthy_threshold) {
            tracing::warn!(backend = %url, "ejected: failing health checks");
        }
        return;
    }
    if !backend.fixed_models {
        if let Ok(r) = client.get(format!("{url}/v1/models")).timeout(timeout).send().await {
            if let Ok(list) = r.json::<ModelList>().await {
                backend.set_models(list.data.into_iter().map(|m| m.id).collect());
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
    client: &reqwest::Client,
    backend: &Backend,
    url: &str,
    timeout: Duration,
) -> Option<(u32, u32)> {
    let mut slots = client.get(format!("{url}/slots")).timeout(timeout);
    if let Some(key) = &backend.api_key {
        // The engine's own key: what each slot holds is shown only with it.
        slots = slots.header(axum::http::header::AUTHORIZATION, key.clone());
    }
    let r = slots.send().await.ok()?;
    if r.status().is_success() {
        if let Ok(slots) = r.json::<Vec<SlotStatus>>().await {
            let counts = SlotCounts::of(&slots, None);
            return Some((counts.total, counts.busy));
        }
    }
    let mut metrics = client.get(format!("{url}/metrics")).timeout(timeout);
    if let Some(key) = &backend.api_key {
        metrics = metrics.header(axum::http::header::AUTHORIZATION, key.clone());
    }
    let r = metrics.send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    let load = crate::fleet::load_metrics::Load::parse(&r.text().await.ok()?)?;
    // Its capacity is what `slots` says (vLLM's `max_num_seqs`); unset, one.
    Some((backend.slots().max(1), load.busy()))
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

//! Following each backend's slot state as the engine pushes it
//! (`GET /slots/events`), so that this gateway's view is within one decode step
//! of the engine's and several replicas agree on which slots are taken.
//!
//! What a slot counts as, here: taken by this replica from the moment it claims
//! it (its in-flight count), and taken by others as the engine last said
//! (running and queued requests, less those the engine says this replica sent,
//! by the `x-slotgate-replica` header). The window left is another replica's
//! request between its send and the engine's next event (the engine admits it,
//! then publishes, within one step): a request sent into that window meets the
//! engine's own queue, or a `slot_unavailable` answer that is retried elsewhere;
//! none is lost. Backends that offer no stream (llama.cpp's server, vLLM) are
//! polled by the health checks, as before, and asked again every 30 s.
//!
//! Every replica hears of a freed slot at once, and each would send a waiting
//! request to it. They take turns instead: the engine lists the replicas that
//! follow its events, and at each event every replica ranks them alike (by a
//! stable hash of the replica's name, the backend and the event's number). The
//! first may claim free slots at once, the second after one turn, and so
//! on; by the second's turn, the first's requests show in the next event. The
//! order changes with every event, so no replica always goes last.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use slotgate_protocol::{SlotState, SseDecoder};
use tokio_util::sync::CancellationToken;

use crate::fleet::backend::Backend;
use crate::fleet::pool::Pool;
use crate::proxy::upstream::BackendClient;

/// How long to wait before asking a backend without the stream again.
const NOT_OFFERED_RETRY: Duration = Duration::from_secs(30);

/// The shortest turn at a backend's free slots. A turn lasts three of the
/// engine's decode steps (it reports how long they take), claims are open in
/// its first half, and the engine admits the requests that arrived during a
/// step before it publishes: a replica's claim shows in an event before the
/// turn of the next replica begins.
const MIN_TURN: Duration = Duration::from_millis(5);

/// A turn while the engine has not yet said how long its steps take.
const UNKNOWN_STEP_TURN: Duration = Duration::from_secs(1);

/// Why a subscription ended.
enum Ended {
    /// The stream closed (the engine restarted or drains): connect again soon.
    Closed,
    /// The backend has no such stream: poll it instead.
    NotOffered,
    /// It could not be reached.
    Failed,
}

/// Follows `backend`'s stream until `stop`, or until the backend leaves the pool.
pub async fn follow(
    pool: Arc<Pool>,
    backend: Arc<Backend>,
    client: Arc<BackendClient>,
    replica: Arc<str>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    while !stop.is_cancelled() && pool.find(backend.index).is_some() {
        let pause = if let Some(url) = backend.address() {
            let ended = subscribe(&pool, &backend, &client, &url, &replica, &stop).await;
            backend.set_pushed(false);
            match ended {
                Ended::Closed => Duration::from_millis(100),
                Ended::NotOffered => NOT_OFFERED_RETRY,
                Ended::Failed => {
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    backoff
                }
            }
        } else {
            // A supervised engine still starting.
            Duration::from_millis(100)
        };
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
    }
    backend.set_pushed(false);
}

async fn subscribe(
    pool: &Arc<Pool>,
    backend: &Arc<Backend>,
    client: &BackendClient,
    url: &str,
    replica: &str,
    stop: &CancellationToken,
) -> Ended {
    // The client names this replica in every request (`x-slotgate-replica`).
    let key = backend.api_key.clone().map(|key| (axum::http::header::AUTHORIZATION, key));
    let mut body = match client.get(url, "/slots/events", key).await {
        Ok(r) if r.status.is_success() => r.body,
        Ok(r) if r.status == axum::http::StatusCode::NOT_FOUND => return Ended::NotOffered,
        _ => return Ended::Failed,
    };
    tracing::debug!(backend = %url, "following its slot events");
    let mut decoder = SseDecoder::new();
    loop {
        let frame = tokio::select! {
            () = stop.cancelled() => return Ended::Closed,
            frame = body.frame() => frame,
        };
        let Some(Ok(frame)) = frame else { return Ended::Closed };
        let Ok(chunk) = frame.into_data() else { continue };
        for event in decoder.push(&chunk) {
            if let Ok(state) = serde_json::from_str::<SlotState>(&event.data) {
                apply(pool, backend, &state, replica);
            }
        }
    }
}

/// Takes the engine's word for its slots: how many, and how many are taken by
/// requests that this replica did not send; then waits for this replica's
/// turn at the free ones.
fn apply(pool: &Arc<Pool>, backend: &Arc<Backend>, state: &SlotState, replica: &str) {
    let total: u32 = state.models.iter().map(|m| m.slots).sum();
    let taken: u32 = state.models.iter().map(|m| m.busy + m.queued).sum();
    let ours: u32 = state.models.iter().filter_map(|m| m.replicas.get(replica)).sum();
    backend.pushed(total, taken.saturating_sub(ours), state.seq);
    let rank = rank(replica, &state.followers, backend.id, state.seq);
    let replicas = u32::try_from(state.followers.len()).unwrap_or(u32::MAX);
    let turn = match state.step_us {
        // No step yet (an idle engine): a turn long enough for a slow one.
        0 => UNKNOWN_STEP_TURN,
        us => (Duration::from_micros(us) * 3).max(MIN_TURN),
    };
    // Every replica deals the same number, the engine's free slots, so that
    // each is one replica's alone; what this replica has in flight that the
    // engine did not yet show (sent and not admitted, or finished and not yet
    // released) still bounds its own claims through `unheld_free`. Dealing
    // `unheld_free` instead would strand a slot whose request ended in the
    // engine before this replica released it, if the engine then went idle.
    backend.turns.deal(total.saturating_sub(taken), rank, replicas, turn);
    tracing::debug!(backend = %backend.url(), seq = state.seq, free = backend.unheld_free(), rank, ?turn, in_flight = backend.in_flight(), "dealt");
    for _ in 0..backend.free() {
        pool.wake_backend(backend);
    }
    // Slots that pass to this replica in a later turn wake its requests then,
    // until the next event deals again.
    let (pool, backend, seq) = (pool.clone(), backend.clone(), state.seq);
    tokio::spawn(async move {
        while let Some(at) = backend.turns.next_turn() {
            tokio::time::sleep_until(at.into()).await;
            if backend.seq() != seq {
                return;
            }
            for _ in 0..backend.free() {
                pool.wake_backend(&backend);
            }
        }
    });
}

/// This replica's place in the order of `followers` for event `seq` of
/// backend `id`; 0 when it is not among them (an engine that does not list
/// its followers).
fn rank(replica: &str, followers: &[String], id: u64, seq: u64) -> u32 {
    let key = |name: &str| {
        let mut h = crate::fleet::hash::Fnv::default();
        h.write(name.as_bytes()).write(&id.to_le_bytes()).write(&seq.to_le_bytes());
        h.finish()
    };
    let own = key(replica);
    if !followers.iter().any(|f| f == replica) {
        return 0;
    }
    let before = followers.iter().filter(|f| f.as_str() != replica && key(f) < own).count();
    u32::try_from(before).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every replica computes the same order, a different one for each event,
    /// and each replica is sometimes first.
    #[test]
    fn replicas_take_turns_in_one_order() {
        let followers: Vec<String> = ["gw-a", "gw-b", "gw-c"].map(String::from).to_vec();
        let mut firsts = std::collections::BTreeSet::new();
        for seq in 0..30 {
            let mut ranks: Vec<u32> =
                followers.iter().map(|f| rank(f, &followers, 7, seq)).collect();
            ranks.sort_unstable();
            assert_eq!(ranks, vec![0, 1, 2], "one order, no ties");
            firsts.extend(followers.iter().filter(|f| rank(f, &followers, 7, seq) == 0).cloned());
        }
        assert_eq!(firsts.len(), 3, "each is first sometimes");
        assert_eq!(rank("gw-x", &followers, 7, 1), 0, "not listed: no turn to wait");
    }
}

//! `GET /slots/events`: the engine's slot state as server-sent events, so that
//! gateways know within one decode step what every slot is doing instead of
//! polling `/slots`. The whole state goes first, then again at each change, each
//! with its sequence number (the one `/slots` carries in `x-slotgate-slots-seq`).
//! The stream ends when the engine starts draining.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use slotgate_protocol::{ModelSlots, SlotState};

use super::AppState;
use crate::scheduler::Snapshot;

/// The gateway replicas following the events now, and a signal when they change.
#[derive(Debug)]
pub struct Followers {
    names: std::sync::Mutex<std::collections::BTreeMap<String, u32>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for Followers {
    fn default() -> Self {
        Self { names: std::sync::Mutex::default(), changed: tokio::sync::watch::channel(0).0 }
    }
}

impl Followers {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, u32>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every follower's name, once each.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn join(self: &std::sync::Arc<Self>, name: String) -> Following {
        *self.lock().entry(name.clone()).or_insert(0) += 1;
        self.changed.send_modify(|n| *n += 1);
        Following { followers: self.clone(), name }
    }
}

/// One replica's place among the followers, given up when its stream ends.
struct Following {
    followers: std::sync::Arc<Followers>,
    name: String,
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut names = self.followers.lock();
        if let Some(n) = names.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                names.remove(&self.name);
            }
        }
        drop(names);
        self.followers.changed.send_modify(|n| *n += 1);
    }
}

/// A comment this often keeps idle proxies from closing a quiet stream.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// The slot state of `snapshot`, as the events carry it.
fn state_of(snapshot: &Snapshot, followers: Vec<String>) -> SlotState {
    let models = snapshot
        .models
        .iter()
        .map(|m| ModelSlots {
            id: m.id.clone(),
            slots: m.slots.len() as u32,
            busy: m.slots.iter().filter(|s| s.is_processing).count() as u32,
            queued: m.queue_depth as u32,
            replicas: m.replicas.clone(),
        })
        .collect();
    SlotState { seq: snapshot.seq, models, followers, step_us: snapshot.step_us }
}

/// What one stream carries from event to event.
struct Watch {
    /// The scheduler's changes, as last seen.
    changes: tokio::sync::watch::Receiver<u64>,
    /// The followers' changes, as last seen.
    joined: tokio::sync::watch::Receiver<u64>,
    /// This stream's place among the followers, if its reader named itself.
    _following: Option<Following>,
    first: bool,
}

/// `GET /slots/events`. A reader that names itself in `x-slotgate-replica` (and,
/// when the engine has an admin key, presents it) is listed among the followers
/// while its stream lasts.
pub async fn slot_events(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> Response {
    // Followers take turns at freed slots: with an admin key, only its holders
    // (the gateways) may join them; anyone else gets the stream, and no turn.
    let name = headers
        .get(slotgate_protocol::REPLICA_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .filter(|_| super::admin::admin_only(&state, &headers).is_ok());
    let mut joined = state.followers.changed.subscribe();
    let following = name.map(|n| state.followers.join(n.to_owned()));
    joined.mark_unchanged();
    let mut changes = state.scheduler.changes();
    changes.mark_unchanged();
    let watch = Watch { changes, joined, _following: following, first: true };
    let (draining, scheduler, followers) =
        (state.draining.clone(), state.scheduler.clone(), state.followers.clone());
    let events = futures::stream::unfold(watch, move |mut watch| {
        let (draining, scheduler, followers) =
            (draining.clone(), scheduler.clone(), followers.clone());
        async move {
            if !watch.first {
                tokio::select! {
                    () = draining.cancelled() => return None,
                    changed = tokio::time::timeout(KEEPALIVE, watch.changes.changed()) => match changed {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return None,
                        Err(_) => return Some((Bytes::from_static(b": keep-alive\n\n"), watch)),
                    },
                    joined = watch.joined.changed() => if joined.is_err() { return None },
                }
            }
            watch.first = false;
            let state = state_of(&scheduler.snapshot(), followers.names());
            let json = serde_json::to_string(&state).unwrap_or_default();
            Some((Bytes::from(format!("data: {json}\n\n")), watch))
        }
    });
    let mut response =
        Response::new(Body::from_stream(futures::StreamExt::map(events, Ok::<_, Infallible>)));
    slotgate_http::event_stream(&mut response);
    response
}

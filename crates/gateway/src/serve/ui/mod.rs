//! The live dashboard: `GET /ui` is one page built into the binary (no CDN, no
//! request leaves the gateway's origin), and `GET /ui/events` streams what it
//! shows, once a second, as server-sent events: each backend and each of its
//! slots (idle, reading a prompt, generating; tokens cached), the queue of each
//! model, the last minute's rates and percentiles, and the latest refusals.
//! `GET /ui/state` is one such snapshot as JSON.
//!
//! All three need the admin key (or, without one, `auth.admin_loopback` and a
//! caller on the loopback address). A browser cannot set a
//! header on a page load or an `EventSource`, so the key is also taken as the
//! password of HTTP Basic authentication, which the browser asks for once and
//! then sends with every request to the page's origin.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use serde_json::{json, Value};
use slotgate_protocol::SlotStatus;

use crate::fleet::backend::Backend;
use crate::proxy::Forwarder;
use crate::serve::app::{peer, App, AppState, Peer};

/// The page, built in.
const PAGE: &str = include_str!("page.html");
/// How often the stream sends a snapshot.
const EVERY: Duration = Duration::from_secs(1);

/// The dashboard's routes.
pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/state", get(state))
        .route("/ui/events", get(events))
}

/// `None` when the caller may see the dashboard, else the refusal: a 401 that
/// makes a browser ask for the key.
fn refuse(app: &App, headers: &HeaderMap, from: Peer) -> Option<Response> {
    let auth = &app.forwarder.live().auth;
    let mut presented = headers.clone();
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok())
        .and_then(|raw| String::from_utf8(raw).ok());
    if let Some(user_and_key) = basic {
        // Any user name; the password is the key.
        let key = user_and_key.split_once(':').map_or(user_and_key.as_str(), |(_, k)| k);
        if let Ok(bearer) = HeaderValue::from_str(&format!("Bearer {key}")) {
            presented.insert(header::AUTHORIZATION, bearer);
        }
    }
    let err = auth.admin(&axum::http::Method::GET, &presented, peer(from)).err()?;
    if matches!(err.code.as_deref(), Some("admin_closed" | "cross_origin")) {
        // No key would open it: asking for one would only mislead.
        return Some(slotgate_http::api_response(err));
    }
    let mut response = slotgate_http::api_response(err);
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"slotgate admin\", charset=\"UTF-8\""),
    );
    Some(response)
}

async fn page(State(app): AppState, from: Peer, headers: HeaderMap) -> Response {
    if let Some(refused) = refuse(&app, &headers, from) {
        return refused;
    }
    let headers = [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        // Nothing but this origin: the page is self-contained.
        (header::CONTENT_SECURITY_POLICY, "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"),
        (header::CACHE_CONTROL, "no-cache"),
    ];
    (headers, PAGE).into_response()
}

async fn state(State(app): AppState, from: Peer, headers: HeaderMap) -> Response {
    if let Some(refused) = refuse(&app, &headers, from) {
        return refused;
    }
    axum::Json(snapshot(&app.forwarder).await).into_response()
}

async fn events(State(app): AppState, from: Peer, headers: HeaderMap) -> Response {
    if let Some(refused) = refuse(&app, &headers, from) {
        return refused;
    }
    let stream = futures::stream::unfold((app, true), |(app, first)| async move {
        if !first {
            tokio::time::sleep(EVERY).await;
        }
        let event = format!("data: {}\n\n", snapshot(&app.forwarder).await);
        Some((Ok::<_, Infallible>(axum::body::Bytes::from(event)), (app, false)))
    });
    let mut response = axum::body::Body::from_stream(stream).into_response();
    slotgate_http::event_stream(&mut response);
    response
}

/// What the dashboard shows now.
pub async fn snapshot(forwarder: &Forwarder) -> Value {
    let pool = forwarder.pool();
    let backends = pool.backends();
    let read = |b| slots_of(forwarder, b);
    let slots = futures::future::join_all(backends.iter().map(|b| read(b))).await;
    let backends: Vec<Value> = backends
        .iter()
        .zip(slots)
        .map(|(b, slots)| {
            json!({
                "id": b.index,
                "url": b.url().as_str(),
                "healthy": b.is_healthy(),
                "draining": b.is_draining(),
                "models": b.models().as_slice(),
                "weight": b.weight,
                "slots_total": b.slots(),
                "slots_busy": b.in_flight() + b.foreign_busy(),
                "slots": slots,
            })
        })
        .collect();
    let queues: serde_json::Map<String, Value> =
        pool.queue_depths().into_iter().map(|(model, n)| (model, json!(n))).collect();
    let (summary, refusals) = crate::proxy::recent::RECENT.summary();
    json!({
        "backends": backends,
        "queues": queues,
        "summary": summary,
        "refusals": refusals,
    })
}

/// Each slot of `backend`, as its `/slots` says (with its own key, which shows
/// what each slot holds); `null` when it does not answer.
async fn slots_of(forwarder: &Forwarder, backend: &Backend) -> Value {
    let Some(url) = backend.address() else { return Value::Null };
    let timeout = forwarder.timeouts().read;
    let read = crate::fleet::health::read(forwarder.client(), backend, &url, "/slots", timeout);
    let Ok((status, body)) = read.await else { return Value::Null };
    let Ok(slots) = serde_json::from_slice::<Vec<SlotStatus>>(&body) else { return Value::Null };
    if !status.is_success() {
        return Value::Null;
    }
    slots
        .iter()
        .map(|s| {
            // llama.cpp's server says only busy or not.
            let phase = match (s.phase, s.is_processing) {
                (Some(phase), _) => json!(phase),
                (None, true) => json!("busy"),
                (None, false) => json!("idle"),
            };
            json!({"id": s.id, "model": s.model, "phase": phase, "n_cached": s.n_cached, "n_ctx": s.n_ctx})
        })
        .collect()
}

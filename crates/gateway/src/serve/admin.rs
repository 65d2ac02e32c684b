//! The admin API (admin key only): backends listed, added, drained and removed
//! at run time, keys with their limits and usage, and the reload of the
//! configuration ([`crate::serve::reload`]), which `SIGHUP` also triggers.
//! Supervised engines, the listen address, workers, health and retry settings
//! are read at start only; a reload that changes them says so in its log.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use slotgate_protocol::{ApiError, ErrorType};

use crate::config::error::GatewayError;
use crate::config::{BackendConfig, GatewayConfig};
use crate::fleet::backend::Backend;
use crate::fleet::pool::Pool;
use crate::serve::app::{peer, App, AppState, Peer};

/// The admin routes.
pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/admin/backends", get(list).post(add))
        .route("/admin/backends/{id}", axum::routing::delete(remove))
        .route("/admin/backends/{id}/drain", post(drain))
        .route("/admin/keys", get(keys))
        .route("/admin/reload", post(reload))
}

fn admin(app: &App, method: Method, headers: &HeaderMap, from: Peer) -> Result<(), GatewayError> {
    app.forwarder.live().auth.admin(&method, headers, peer(from)).map_err(GatewayError::Api)
}

fn describe(pool: &Pool, b: &Backend) -> Value {
    let queue: std::collections::BTreeMap<_, _> =
        b.models().iter().map(|m| (m.clone(), pool.queue_depth(m))).collect();
    json!({
        "id": b.index,
        "url": b.url().as_str(),
        "models": b.models().as_slice(),
        "healthy": b.is_healthy(),
        "draining": b.is_draining(),
        "supervised": b.is_supervised(),
        "slots_total": b.slots(),
        "slots_busy": b.in_flight() + b.foreign_busy(),
        "in_flight": b.in_flight(),
        "weight": b.weight,
        "queue": queue,
    })
}

/// `GET /admin/backends`: each backend's state.
async fn list(
    State(app): AppState,
    from: Peer,
    headers: HeaderMap,
) -> Result<Json<Value>, GatewayError> {
    admin(&app, Method::GET, &headers, from)?;
    let pool = app.forwarder.pool();
    let backends: Vec<Value> = pool.backends().iter().map(|b| describe(pool, b)).collect();
    Ok(Json(json!({ "backends": backends })))
}

/// `POST /admin/backends`: adds a backend, as a `[[backends]]` entry is written.
async fn add(
    State(app): AppState,
    from: Peer,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, GatewayError> {
    admin(&app, Method::POST, &headers, from)?;
    let config: BackendConfig = slotgate_protocol::parse_json(&body)?;
    if let Some(var) = &config.api_key_env {
        // Else an admin call could have any of the gateway's environment sent to
        // an address of its choosing.
        if !app.reload.declares_backend_key(var) {
            return Err(ApiError::new(
                ErrorType::PermissionError,
                format!(
                    "api_key_env `{var}` is not the key of a configured backend: a backend added \
                     here may only use a key that [[backends]] in the configuration already use"
                ),
            )
            .with_param("api_key_env")
            .into());
        }
    }
    let check = GatewayConfig { backends: vec![config.clone()], ..GatewayConfig::default() };
    check
        .validate()
        .map_err(|e| ApiError::invalid("url", e.to_string().replace("backends[0].", "")))?;
    let pool = app.forwarder.pool();
    let backend = pool.add(&config);
    tracing::info!(backend = %backend.url(), id = backend.index, "added by the admin API");
    Ok((StatusCode::CREATED, Json(describe(pool, &backend))).into_response())
}

fn find(app: &App, id: usize) -> Result<Arc<Backend>, ApiError> {
    app.forwarder
        .pool()
        .find(id)
        .ok_or_else(|| ApiError::new(ErrorType::NotFoundError, format!("no backend has id {id}")))
}

/// `POST /admin/backends/{id}/drain`: no new requests; those in flight finish.
async fn drain(
    State(app): AppState,
    from: Peer,
    headers: HeaderMap,
    Path(id): Path<usize>,
) -> Result<Json<Value>, GatewayError> {
    admin(&app, Method::POST, &headers, from)?;
    let backend = find(&app, id)?;
    backend.drain();
    tracing::info!(backend = %backend.url(), "draining, by the admin API");
    Ok(Json(describe(app.forwarder.pool(), &backend)))
}

/// `DELETE /admin/backends/{id}`: drains the backend, and removes it once its
/// requests have ended (202 while some remain).
async fn remove(
    State(app): AppState,
    from: Peer,
    headers: HeaderMap,
    Path(id): Path<usize>,
) -> Result<Response, GatewayError> {
    admin(&app, Method::DELETE, &headers, from)?;
    let backend = find(&app, id)?;
    if backend.is_supervised() {
        return Err(ApiError::invalid(
            "id",
            "a supervised engine: take it out of [[engines]] and restart, or drain it",
        )
        .into());
    }
    let pool = app.forwarder.pool();
    let status = if backend.in_flight() == 0 {
        backend.drain();
        pool.remove(id);
        StatusCode::OK
    } else {
        pool.retire(backend.clone(), Duration::from_secs(3600));
        StatusCode::ACCEPTED
    };
    Ok((status, Json(describe(pool, &backend))).into_response())
}

/// `GET /admin/keys`: each key's name, limits and usage; never its secret.
async fn keys(
    State(app): AppState,
    from: Peer,
    headers: HeaderMap,
) -> Result<Json<Value>, GatewayError> {
    admin(&app, Method::GET, &headers, from)?;
    let live = app.forwarder.live();
    let minute = app.forwarder.book().minute();
    let keys: Vec<Value> = live
        .auth
        .tenants()
        .iter()
        .map(|t| {
            let u = &t.usage;
            let window = u.window(minute);
            let load =
                |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
            json!({
                "name": &*t.name,
                "priority": t.priority.label(),
                "cache_isolation": t.cache_isolation,
                "models": t.models(),
                "limits": t.limits,
                "usage": {
                    "in_flight": u.in_flight.load(std::sync::atomic::Ordering::Relaxed),
                    "requests": load(&u.requests),
                    "prompt_tokens": load(&u.prompt_tokens),
                    "completion_tokens": load(&u.completion_tokens),
                    "this_minute": {"requests": window.requests, "tokens": window.tokens},
                    "refusals": u.refusals(),
                },
            })
        })
        .collect();
    Ok(Json(json!({ "keys": keys })))
}

/// `POST /admin/reload`: as `SIGHUP`.
async fn reload(
    State(app): AppState,
    from: Peer,
    headers: HeaderMap,
) -> Result<Json<Value>, GatewayError> {
    admin(&app, Method::POST, &headers, from)?;
    app.reload.apply().map(Json).map_err(|e| match e {
        GatewayError::Config(reason) => GatewayError::Api(ApiError::invalid(
            "config",
            format!("reload refused, the old configuration stays: {reason}"),
        )),
        other => other,
    })
}

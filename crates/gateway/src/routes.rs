//! The gateway's HTTP routes: the OpenAI endpoints (forwarded), `/v1/models`,
//! `/health`, `/metrics` and `/admin/backends`. Every error leaves in the OpenAI
//! envelope, axum's own rejections included.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use slotgate_protocol::{ApiError, ErrorType, Model, ModelList};

use crate::error::GatewayError;
use crate::metrics as m;
use crate::proxy::Forwarder;

/// What the routes share.
pub struct App {
    /// Forwards the OpenAI requests, and holds the pool.
    pub forwarder: Forwarder,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
}

type Shared = State<Arc<App>>;

/// The routes, with request bodies limited to `max_body_bytes`.
pub fn router(app: Arc<App>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/admin/backends", get(admin_backends))
        .fallback(|| async {
            GatewayError::Api(ApiError::new(ErrorType::NotFoundError, "no such endpoint"))
        })
        .method_not_allowed_fallback(|| async {
            slotgate_http::rejection_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "this endpoint does not take that method".into(),
            )
        })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(app)
}

type Body = Result<Bytes, BytesRejection>;

async fn chat(
    State(app): Shared,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, GatewayError> {
    Ok(app.forwarder.forward("/v1/chat/completions", &headers, body?).await)
}

async fn completions(
    State(app): Shared,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, GatewayError> {
    Ok(app.forwarder.forward("/v1/completions", &headers, body?).await)
}

async fn embeddings(
    State(app): Shared,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, GatewayError> {
    Ok(app.forwarder.forward("/v1/embeddings", &headers, body?).await)
}

/// `GET /v1/models`: the union of what healthy backends serve.
async fn models(State(app): Shared) -> Json<ModelList> {
    let mut ids: Vec<String> = app
        .forwarder
        .pool()
        .backends()
        .iter()
        .filter(|b| b.is_healthy())
        .flat_map(|b| b.models().to_vec())
        .collect();
    ids.sort();
    ids.dedup();
    Json(ModelList::new(ids.into_iter().map(|id| Model::new(id, 0, "slotgate")).collect()))
}

/// `GET /health`: 200 when some backend takes traffic.
async fn health(State(app): Shared) -> Result<Response, GatewayError> {
    if app.forwarder.pool().backends().iter().any(|b| b.is_healthy()) {
        Ok(Json(json!({"status": "ok"})).into_response())
    } else {
        Err(ApiError::new(ErrorType::UnavailableError, "no healthy backend").into())
    }
}

/// `GET /admin/backends`: each backend's state.
async fn admin_backends(State(app): Shared) -> Json<serde_json::Value> {
    let pool = app.forwarder.pool();
    let backends: Vec<_> = pool
        .backends()
        .iter()
        .map(|b| {
            let queue: BTreeMap<_, _> =
                b.models().iter().map(|m| (m.clone(), pool.queue_depth(m))).collect();
            json!({
                "url": b.url().as_str(),
                "models": b.models().as_slice(),
                "healthy": b.is_healthy(),
                "slots_total": b.slots(),
                "slots_busy": b.in_flight() + b.foreign_busy(),
                "in_flight": b.in_flight(),
                "weight": b.weight,
                "queue": queue,
            })
        })
        .collect();
    Json(json!({ "backends": backends }))
}

/// `GET /metrics`: gauges are brought up to date, then everything is rendered.
async fn metrics(State(app): Shared) -> Response {
    let pool = app.forwarder.pool();
    for b in pool.backends() {
        let url = b.url().to_string();
        let up = if b.is_healthy() { 1.0 } else { 0.0 };
        metrics::gauge!(m::BACKEND_UP, "backend" => url.clone()).set(up);
        for model in b.models().iter() {
            let labels = [("backend", url.clone()), ("model", model.clone())];
            metrics::gauge!(m::SLOTS_TOTAL, &labels).set(f64::from(b.slots()));
            metrics::gauge!(m::SLOTS_BUSY, &labels)
                .set(f64::from(b.in_flight() + b.foreign_busy()));
        }
    }
    for (model, depth) in pool.queue_depths() {
        metrics::gauge!(m::QUEUE_DEPTH, "model" => model).set(depth as f64);
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.metrics.render())
        .into_response()
}

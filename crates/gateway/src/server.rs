//! The gateway's HTTP side: the OpenAI endpoints (forwarded), `/v1/models`,
//! `/health`, `/metrics`, `/admin/backends`; and starting and stopping it all.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use slotgate_protocol::{ApiError, ErrorType, Model, ModelList};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::Backend;
use crate::config::{BackendConfig, GatewayConfig};
use crate::error::{api_response, GatewayError};
use crate::metrics as m;
use crate::pool::Pool;
use crate::retry::RetryBudget;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Backends, picker and queues.
    pub pool: Arc<Pool>,
    /// Pooled, kept-alive connections to backends.
    pub client: reqwest::Client,
    /// The settings.
    pub config: Arc<GatewayConfig>,
    /// The retry budget.
    pub budget: Arc<RetryBudget>,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
}

/// The routes.
pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/admin/backends", get(admin_backends))
        .fallback(|| async {
            api_response(ApiError::new(ErrorType::NotFoundError, "no such endpoint"))
        })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn chat(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    crate::proxy::forward(s, "/v1/chat/completions", headers, body).await
}

async fn completions(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    crate::proxy::forward(s, "/v1/completions", headers, body).await
}

async fn embeddings(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    crate::proxy::forward(s, "/v1/embeddings", headers, body).await
}

/// `GET /v1/models`: the union of what healthy backends serve.
async fn models(State(s): State<AppState>) -> Json<ModelList> {
    let mut ids: Vec<String> = s
        .pool
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
async fn health(State(s): State<AppState>) -> Response {
    if s.pool.backends().iter().any(|b| b.is_healthy()) {
        Json(json!({"status": "ok"})).into_response()
    } else {
        api_response(ApiError::new(ErrorType::UnavailableError, "no healthy backend"))
    }
}

/// `GET /admin/backends`: each backend's state.
async fn admin_backends(State(s): State<AppState>) -> Json<serde_json::Value> {
    let backends: Vec<_> = s
        .pool
        .backends()
        .iter()
        .map(|b| {
            json!({
                "url": b.url().as_str(),
                "models": b.models().as_slice(),
                "healthy": b.is_healthy(),
                "slots_total": b.slots(),
                "slots_busy": b.in_flight() + b.foreign_busy(),
                "in_flight": b.in_flight(),
                "weight": b.weight,
                "queue": b.models().iter().map(|m| (m.clone(), s.pool.queue_depth(m))).collect::<std::collections::BTreeMap<_, _>>(),
            })
        })
        .collect();
    Json(json!({ "backends": backends }))
}

/// `GET /metrics`: gauges are brought up to date, then everything is rendered.
async fn metrics(State(s): State<AppState>) -> Response {
    for b in s.pool.backends() {
        let url = b.url().to_string();
        metrics::gauge!(m::BACKEND_UP, "backend" => url.clone()).set(if b.is_healthy() {
            1.0
        } else {
            0.0
        });
        for model in b.models().iter() {
            let labels = [("backend", url.clone()), ("model", model.clone())];
            metrics::gauge!(m::SLOTS_TOTAL, &labels).set(f64::from(b.slots()));
            metrics::gauge!(m::SLOTS_BUSY, &labels)
                .set(f64::from(b.in_flight() + b.foreign_busy()));
        }
    }
    for (model, depth) in s.pool.queue_depths() {
        metrics::gauge!(m::QUEUE_DEPTH, "model" => model).set(depth as f64);
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render())
        .into_response()
}

/// A running gateway. Not `Clone`: it owns the shutdown of everything it started.
pub struct Gateway {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Stops the engines and the health checks.
    stop: CancellationToken,
    /// Cancelled by the shutdown signal: stop accepting, drain.
    draining: CancellationToken,
    tasks: TaskTracker,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    drain: Duration,
}

impl Gateway {
    /// Binds, starts the supervised engines and the health checks, and serves
    /// until `shutdown` resolves.
    pub async fn start(
        config: GatewayConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, GatewayError> {
        let listener = TcpListener::bind(&config.listen).await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let mut backends: Vec<Arc<Backend>> =
            config.backends.iter().enumerate().map(|(i, b)| Arc::new(Backend::new(i, b))).collect();
        let mut engines = Vec::new();
        for spec in &config.engines {
            let id = spec.model_id.clone().unwrap_or_else(|| {
                let name = spec.model.file_name().and_then(|n| n.to_str()).unwrap_or("model");
                name.strip_suffix(".gguf").unwrap_or(name).to_owned()
            });
            let seed = BackendConfig {
                url: String::new(),
                models: None,
                slots: Some(spec.n_parallel),
                weight: 1,
            };
            let backend = Arc::new(Backend::new(backends.len(), &seed));
            backend.set_models(vec![id]);
            backends.push(backend.clone());
            engines.push((spec.clone(), backend));
        }
        let routing = config.routing.clone();
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_millis(routing.pool_idle_timeout_ms))
            .connect_timeout(Duration::from_millis(routing.connect_timeout_ms))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| GatewayError::Config(format!("http client: {e}")))?;
        let pool = Pool::new(backends, &routing);
        for (spec, backend) in engines {
            tasks.spawn(crate::supervisor::supervise(spec, backend, stop.clone()));
        }
        tasks.spawn(crate::health::run(
            pool.clone(),
            client.clone(),
            routing.clone(),
            stop.clone(),
        ));
        let drain = Duration::from_millis(config.drain_timeout_ms);
        let state = AppState {
            pool,
            client,
            budget: Arc::new(RetryBudget::new(routing.retry_budget, routing.retry_budget_min)),
            config: Arc::new(config),
            metrics: m::handle(),
        };
        let app = router(state);
        let draining = CancellationToken::new();
        let signal = draining.clone();
        tokio::spawn(async move {
            shutdown.await;
            signal.cancel();
        });
        let stop_accepting = draining.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop_accepting.cancelled_owned())
                .await
        });
        Ok(Self { addr, stop, draining, tasks, server, drain })
    }

    /// Waits for the server to stop accepting (on the shutdown signal), lets
    /// in-flight requests finish up to the drain timeout, then stops the engines.
    pub async fn run(self) -> Result<(), GatewayError> {
        let Self { stop, draining, tasks, mut server, drain, .. } = self;
        let result = tokio::select! {
            r = &mut server => Some(r),
            () = draining.cancelled() => None,
        };
        let result = match result {
            Some(r) => r,
            None => match tokio::time::timeout(drain, &mut server).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!("drain timeout passed; closing remaining connections");
                    server.abort();
                    Ok(Ok(()))
                }
            },
        };
        stop.cancel();
        tasks.close();
        tasks.wait().await;
        result.map_err(|e| GatewayError::Io(std::io::Error::other(e)))??;
        Ok(())
    }
}

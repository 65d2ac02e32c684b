//! The HTTP side of the engine: OpenAI endpoints, `/health`, `/slots`, `/metrics`
//! and model loading. Handlers never touch llama.cpp; they talk to the scheduler.

mod admin;
mod answer;
mod body;
mod generate;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use slotgate_protocol::{ApiError, ErrorType};
use tokio::net::TcpListener;

use crate::config::{EngineConfig, ModelSettings};
use crate::error::{api_response, EngineError};
use crate::scheduler::Scheduler;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The scheduler thread's handle.
    pub scheduler: Scheduler,
    /// Defaults for models loaded at run time, and the body limit.
    pub config: Arc<EngineConfig>,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
}

/// The engine's routes.
pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/embeddings", post(generate::embeddings))
        .route("/v1/models", get(admin::models))
        .route("/v1/models/load", post(admin::load))
        .route("/v1/models/unload", post(admin::unload))
        .route("/inferences/llamacpp/loadmodel", post(admin::load))
        .route("/inferences/llamacpp/unloadmodel", post(admin::unload))
        .route("/health", get(admin::health))
        .route("/slots", get(admin::slots))
        .route("/metrics", get(admin::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // The body extractor turns an oversized body into the OpenAI envelope.
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found() -> axum::response::Response {
    api_response(ApiError::new(ErrorType::NotFoundError, "no such endpoint"))
}

async fn method_not_allowed() -> axum::response::Response {
    let err = ApiError::new(ErrorType::InvalidRequestError, "method not allowed on this endpoint");
    let mut response = api_response(err);
    *response.status_mut() = axum::http::StatusCode::METHOD_NOT_ALLOWED;
    response
}

/// A running engine: the address it listens on and the task serving it.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Ends when the server stops.
    pub task: tokio::task::JoinHandle<Result<(), EngineError>>,
}

/// Binds, starts serving (answering 503 on `/health` until the model is loaded),
/// loads the configured model, and returns once it is ready.
pub async fn start(
    config: EngineConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, EngineError> {
    let listener = TcpListener::bind((config.host.as_str(), config.port)).await?;
    let addr = listener.local_addr()?;
    let scheduler = Scheduler::start()?;
    let settings: ModelSettings = config.model.clone();
    let state = AppState {
        scheduler: scheduler.clone(),
        config: Arc::new(config),
        metrics: crate::metrics::handle(),
    };
    let app = router(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(EngineError::from)
    });
    if settings.model.is_some() {
        scheduler.load(settings).await?;
    }
    Ok(Running { addr, task })
}

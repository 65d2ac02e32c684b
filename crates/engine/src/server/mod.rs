//! The HTTP side of the engine: OpenAI endpoints, `/health`, `/slots` and its event stream, `/metrics`,
//! llama-server's `/props`, `/tokenize`, `/detokenize` and `/apply-template`, and
//! model loading. Handlers never touch llama.cpp; they talk to the scheduler.

mod admin;
mod answer;
mod awake;
mod body;
mod chat;
mod chat_job;
mod collected;
mod events;
mod generate;
mod keys;
mod messages;
mod native;
mod opening;
mod predict;
mod recorded;
mod rerank;
mod responses;
mod restream;
mod resumable;
mod slot_files;
mod stored;
mod tokens;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use slotgate_protocol::{ApiError, ErrorType};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
    /// The admin key's SHA-256: loading, unloading and `/slots` detail need it.
    pub admin_key: Option<[u8; 32]>,
    /// The API keys' SHA-256s: every endpoint but the open ones needs one, when
    /// there are any.
    pub api_keys: Arc<Vec<[u8; 32]>>,
    /// Cancelled when the engine starts draining: long-lived streams end.
    pub draining: CancellationToken,
    /// The gateway replicas following `/slots/events`.
    pub followers: Arc<events::Followers>,
    /// Stored responses of the Responses API.
    pub responses: Arc<stored::Store>,
    /// Which web pages may call it from a browser.
    pub cors: Arc<slotgate_http::cors::Cors>,
    /// How requests sample where they send nothing (llama-server's `--temp`...).
    pub sampling: Arc<crate::scheduler::GenParams>,
    /// Streams kept under their conversation id (`/v1/stream`).
    pub streams: Arc<resumable::Sessions>,
}

/// The engine's routes.
pub fn router(state: AppState) -> Router {
    let limit = state.config.server.max_body_bytes;
    // Every answer of these is counted once (`recorded.rs`).
    // Anthropic's Messages API, its errors in Anthropic's envelope.
    let messages = Router::new()
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route_layer(axum::middleware::map_response(slotgate_http::anthropic_errors));
    let generation = Router::new()
        .merge(messages)
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/chat/completions/input_tokens", post(tokens::chat_input_tokens))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/embeddings", post(generate::embeddings))
        .route("/v1/rerank", post(rerank::rerank))
        .route("/v1/reranking", post(rerank::rerank))
        .route("/rerank", post(rerank::rerank))
        .route("/reranking", post(rerank::rerank))
        // llama-server's aliases, which clients written for it send.
        .route("/chat/completions", post(chat::chat))
        .route("/chat/completions/input_tokens", post(tokens::chat_input_tokens))
        // llama-server's `/completions` is its own API, as `/completion` is.
        .route("/completions", post(native::completion))
        .route("/embeddings", post(generate::native_embeddings))
        .route("/completion", post(native::completion))
        .route("/responses", post(responses::create))
        .route("/responses/input_tokens", post(responses::input_tokens))
        .route_layer(axum::middleware::from_fn(recorded::record))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), resumable::keep));
    let keyed = Router::new()
        .merge(generation)
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/v1/models/load", post(admin::load))
        .route("/v1/models/unload", post(admin::unload))
        .route("/inferences/llamacpp/loadmodel", post(admin::load))
        .route("/inferences/llamacpp/unloadmodel", post(admin::unload))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/apply-template", post(tokens::apply_template))
        .route("/slots", get(admin::slots))
        .route("/slots/{id}", post(slot_files::slot_action))
        .route("/slots/events", get(events::slot_events))
        .route("/v1/stream", get(resumable::replay).delete(resumable::stop))
        .route("/props", get(admin::props))
        .route("/metrics", get(admin::metrics));
    // Vertex AI's prediction route, where its variables ask for one.
    let vertex = predict::routes();
    let keyed = match &vertex {
        Some((path, _)) => keyed.route(path, post(predict::predict)),
        None => keyed,
    };
    let keyed = keyed
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), awake::wake))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), keys::require));
    let open = match vertex.and_then(|(_, health)| health) {
        Some(path) => Router::new().route(&path, get(admin::health)),
        None => Router::new(),
    };
    // Open with API keys too, as llama-server's are: liveness and the model list.
    Router::new()
        .merge(keyed)
        .merge(open)
        .route("/health", get(admin::health))
        .route("/v1/health", get(admin::health))
        .route("/v1/models", get(admin::models))
        .route("/models", get(admin::models))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // The body extractor turns an oversized body into the OpenAI envelope.
        .layer(DefaultBodyLimit::max(limit))
        // Outermost: a preflight is answered before any key is asked for.
        .layer(axum::middleware::from_fn_with_state(state.clone(), keys::cors))
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
    /// Where it listens (the first address, where it has several).
    pub addr: SocketAddr,
    /// Its scheduler, for the watchdog.
    pub scheduler: Scheduler,
    /// Ends when the server has stopped: once the requests that were running at
    /// the shutdown signal are done, or at `drain_timeout_ms`, whichever is first.
    pub task: tokio::task::JoinHandle<Result<(), EngineError>>,
}

/// Binds each address of `host` (several are separated by commas, as
/// llama-server takes them) on one port, then as [`serve`]. With port 0 the
/// first address picks a free port and the others take the same.
pub async fn start(
    config: EngineConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, EngineError> {
    let mut listeners = Vec::new();
    // Vertex AI names the port its container must listen on.
    let mut port = predict::port().unwrap_or(config.server.port);
    for host in config.server.host.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        // `[::1]`, as URLs write it, is `::1` to bind.
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let listener = TcpListener::bind((host, port)).await?;
        port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    if listeners.is_empty() {
        let reason = "names no address to listen on".to_owned();
        return Err(EngineError::Setting { field: "host".into(), reason });
    }
    serve(listeners, config, shutdown).await
}

/// Serves on `listeners` (answering 503 on `/health` until the model is
/// loaded), loads the configured model, and returns once it is ready.
pub async fn serve(
    listeners: Vec<TcpListener>,
    config: EngineConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, EngineError> {
    let addrs = listeners.iter().map(TcpListener::local_addr).collect::<Result<Vec<_>, _>>()?;
    let addr = *addrs.first().ok_or_else(|| EngineError::Setting {
        field: "host".into(),
        reason: "names no address to listen on".into(),
    })?;
    for extra in &addrs[1..] {
        tracing::info!(addr = %extra, "also listening");
    }
    let sleep_after =
        (config.server.sleep_idle_s > 0).then(|| Duration::from_secs(config.server.sleep_idle_s));
    let scheduler = Scheduler::start(sleep_after)?;
    let settings: ModelSettings = config.model.clone();
    let drain = Duration::from_millis(config.server.drain_timeout_ms);
    let state_limits = config.server.limits();
    let draining = CancellationToken::new();
    crate::metrics::llama_server::TOTALS.start();
    let state = AppState {
        scheduler: scheduler.clone(),
        admin_key: config.server.admin_key()?,
        api_keys: Arc::new(config.server.api_keys()?),
        cors: Arc::new(slotgate_http::cors::Cors::new(&config.server.cors_origins, 600)),
        sampling: Arc::new(config.server.sampling_defaults()?),
        config: Arc::new(config),
        metrics: crate::metrics::handle(),
        draining: draining.clone(),
        followers: Arc::default(),
        responses: Arc::default(),
        streams: Arc::default(),
    };
    let app = router(state);
    let signal = draining.clone();
    tokio::spawn(async move {
        shutdown.await;
        signal.cancel();
    });
    let limits = state_limits;
    let task = tokio::spawn(async move {
        // One accept loop per address, each bounded by `max_connections`.
        let each = listeners.into_iter().map(|listener| {
            let stop = draining.clone().cancelled_owned();
            slotgate_http::conn::serve(listener, app.clone(), limits, stop)
        });
        let server = futures::future::join_all(each);
        let mut server = std::pin::pin!(server);
        tokio::select! {
            _ = &mut server => return Ok(()),
            () = draining.cancelled() => {}
        }
        // A stream can run for minutes; the process that sent SIGTERM (a
        // supervisor, Kubernetes) waits only so long, as the gateway does.
        if tokio::time::timeout(drain, server).await.is_err() {
            tracing::warn!(?drain, "drain timeout passed; cutting off running requests");
        }
        Ok(())
    });
    if settings.model.is_some() {
        scheduler.load(settings).await?;
    }
    Ok(Running { addr, scheduler, task })
}

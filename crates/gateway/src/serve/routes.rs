//! The gateway's HTTP routes: the OpenAI endpoints (forwarded), `/v1/models`,
//! `/props`, `/health`, `/metrics`, the admin API (in [`crate::serve::admin`]) and the
//! dashboard (in [`crate::serve::ui`]). Every
//! error leaves in the OpenAI envelope, axum's own rejections included. With
//! client keys configured, the OpenAI endpoints need one; `/health` and
//! `/metrics` stay open for load balancers and Prometheus.
//!
//! The forwarded endpoints are served straight from hyper's request; the rest go
//! through an axum router. Axum's routing, extractors and response layers cost
//! a tenth of the proxy's own time per request (see BENCHMARKS.md, gateway
//! overhead), which only the forwarded endpoints take often enough to matter.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use slotgate_protocol::{ApiError, ErrorType, Model, ModelList};

use crate::config::error::GatewayError;
use crate::config::live::Live;
use crate::metrics as m;
use crate::proxy::Caller;
use crate::serve::app::{App, AppState};

/// The endpoints forwarded to a backend, by path, and the path they are sent to;
/// POST only. The paths without `/v1` are llama-server's aliases, which clients
/// written for it send (its `/completions` is its own API, `/completion`);
/// `/completion`, `/tokenize`, `/detokenize` and `/apply-template` are its own
/// endpoints.
/// `/v1/messages` is Anthropic's Messages API and `/v1/responses` OpenAI's
/// Responses API, which the engines serve; `/v1/rerank` (and llama-server's
/// names for it) a reranker's scores.
pub(crate) const FORWARDED: [(&str, &str); 22] = [
    ("/v1/chat/completions", "/v1/chat/completions"),
    ("/v1/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"),
    ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"),
    ("/v1/completions", "/v1/completions"),
    ("/v1/embeddings", "/v1/embeddings"),
    ("/chat/completions", "/v1/chat/completions"),
    ("/completions", "/completion"),
    ("/embeddings", "/v1/embeddings"),
    ("/tokenize", "/tokenize"),
    ("/detokenize", "/detokenize"),
    ("/apply-template", "/apply-template"),
    ("/v1/messages", "/v1/messages"),
    ("/v1/messages/count_tokens", "/v1/messages/count_tokens"),
    ("/v1/responses", "/v1/responses"),
    ("/v1/responses/input_tokens", "/v1/responses/input_tokens"),
    ("/responses", "/v1/responses"),
    ("/responses/input_tokens", "/v1/responses/input_tokens"),
    ("/completion", "/completion"),
    ("/v1/rerank", "/v1/rerank"),
    ("/v1/reranking", "/v1/rerank"),
    ("/rerank", "/v1/rerank"),
    ("/reranking", "/v1/rerank"),
];

/// The gateway's HTTP service, one per worker thread.
#[derive(Clone)]
pub struct Routes {
    app: Arc<App>,
    max_body_bytes: usize,
    /// A forwarded request's body must have arrived within this.
    body_timeout: std::time::Duration,
    router: TowerToHyperService<Router>,
    /// The client's address, on a connection's own copy.
    peer: Option<SocketAddr>,
}

impl Routes {
    /// The routes, with request bodies limited to `max_body_bytes`, and a
    /// forwarded one to `body_timeout`.
    pub fn new(app: Arc<App>, max_body_bytes: usize, body_timeout: std::time::Duration) -> Self {
        let router = TowerToHyperService::new(router(app.clone(), max_body_bytes));
        Self { app, max_body_bytes, body_timeout, router, peer: None }
    }

    /// The routes for one connection from `peer`: the admin routes read it.
    pub fn from(&self, peer: Option<SocketAddr>) -> Self {
        Self { peer, ..self.clone() }
    }
}

impl Service<Request<Incoming>> for Routes {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let live = self.app.forwarder.live();
        if let Some(answer) = live.cors.preflight(request.method(), request.headers()) {
            return Box::pin(std::future::ready(Ok(answer)));
        }
        let origin = (!live.cors.is_off()).then(|| request.headers().get(header::ORIGIN).cloned());
        let path = request.uri().path();
        let forwarded = FORWARDED.into_iter().find(|(alias, _)| *alias == path).map(|(_, to)| to);
        // Anthropic's clients read errors in Anthropic's envelope.
        let anthropic = path.starts_with("/v1/messages");
        let answer: Self::Future = match forwarded.filter(|_| request.method() == Method::POST) {
            Some(path) => {
                let (app, limit) = (self.app.clone(), (self.max_body_bytes, self.body_timeout));
                let live = live.clone();
                Box::pin(async move { Ok(forward(&app, path, request, limit, live).await) })
            }
            None => {
                let mut request = request;
                if let Some(peer) = self.peer {
                    request.extensions_mut().insert(ConnectInfo(peer));
                }
                let answer = self.router.call(request);
                Box::pin(async move { answer.await.map(IntoResponse::into_response) })
            }
        };
        let answer: Self::Future = if anthropic {
            Box::pin(async move { Ok(slotgate_http::anthropic_errors(answer.await?).await) })
        } else {
            answer
        };
        match origin {
            None => answer,
            Some(origin) => Box::pin(async move {
                let mut response = answer.await?;
                live.cors.decorate(origin.as_ref(), &mut response);
                Ok(response)
            }),
        }
    }
}

/// Checks the caller's key, reads the body, up to `limit` bytes, and forwards
/// it to `path`. An unknown key is refused before the body is read.
async fn forward(
    app: &App,
    path: &'static str,
    request: Request<Incoming>,
    (limit, timeout): (usize, std::time::Duration),
    live: Arc<Live>,
) -> Response {
    let (head, body) = request.into_parts();
    let tenant = match live.auth.identify(&head.headers) {
        Ok(tenant) => tenant,
        Err(err) => return slotgate_http::api_response(err),
    };
    let caller = Caller { live, tenant };
    let Ok(body) = tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await else {
        return slotgate_http::rejection_response(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive within connections.body_timeout_ms".into(),
        );
    };
    match body {
        Ok(body) => app.forwarder.forward(path, &head.headers, body.to_bytes(), caller).await,
        // Worded as axum's own body rejections, which the other routes give.
        Err(e) if e.is::<LengthLimitError>() => slotgate_http::rejection_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Failed to buffer the request body: length limit exceeded".into(),
        ),
        Err(e) => slotgate_http::rejection_response(
            StatusCode::BAD_REQUEST,
            format!("Failed to buffer the request body: {e}"),
        ),
    }
}

/// The routes that are not forwarded. A forwarded endpoint reaches it only with
/// another method than POST, and answers 405.
fn router(app: Arc<App>, max_body_bytes: usize) -> Router {
    let forwarded =
        FORWARDED.into_iter().fold(Router::new(), |r, (path, _)| r.route(path, post(not_here)));
    forwarded
        .route(
            "/v1/responses/{id}",
            get(crate::serve::stored::stored).delete(crate::serve::stored::stored),
        )
        .route("/props", get(props))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(crate::serve::admin::routes())
        .merge(crate::serve::ui::routes())
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

/// POST to a forwarded endpoint, which [`Routes`] takes before the router.
async fn not_here() -> GatewayError {
    GatewayError::Api(ApiError::internal())
}

/// `GET /v1/models`: the union of what healthy backends serve, and their
/// aliases; of those, what the caller's key may use.
async fn models(State(app): AppState, headers: HeaderMap) -> Result<Json<ModelList>, GatewayError> {
    let live = app.forwarder.live();
    let tenant = live.auth.identify(&headers)?;
    let mut ids: Vec<String> = app
        .forwarder
        .pool()
        .backends()
        .iter()
        .filter(|b| b.is_healthy())
        .flat_map(|b| b.models().to_vec())
        .collect();
    let aliases = &live.aliases;
    let named: Vec<String> =
        aliases.iter().filter(|(_, target)| ids.contains(target)).map(|(a, _)| a.clone()).collect();
    ids.extend(named);
    ids.sort();
    ids.dedup();
    if let Some(tenant) = tenant {
        ids.retain(|id| tenant.may_use(id, aliases.get(id).unwrap_or(id)));
    }
    Ok(Json(ModelList::new(ids.into_iter().map(|id| Model::new(id, 0, "slotgate")).collect())))
}

/// Query of `GET /props`.
#[derive(Debug, serde::Deserialize)]
struct PropsQuery {
    model: Option<String>,
}

/// `GET /props`: llama-server's properties of the model named in `?model=` (or
/// the only one), as a healthy backend serving it answers them.
async fn props(
    State(app): AppState,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<PropsQuery>,
) -> Result<Response, GatewayError> {
    let live = app.forwarder.live();
    let tenant = live.auth.identify(&headers)?;
    let pool = app.forwarder.pool();
    let named = q.model.filter(|m| !m.is_empty());
    let model = match named {
        Some(m) => live.aliases.get(&m).cloned().unwrap_or(m),
        None => pool.only_model().ok_or_else(|| {
            ApiError::invalid("model", "several models are served here: name one in `?model=`")
        })?,
    };
    if !pool.knows(&model) || tenant.is_some_and(|t| !t.may_use(&model, &model)) {
        return Err(ApiError::model_not_found(&model).into());
    }
    let backends = pool.backends();
    let (backend, url) = backends
        .iter()
        .filter(|b| b.is_healthy() && b.serves(&model))
        .find_map(|b| Some((b, b.address()?)))
        .ok_or_else(|| {
            ApiError::new(ErrorType::UnavailableError, "no healthy backend serves it")
        })?;
    let forwarder = &app.forwarder;
    let key = backend.api_key.clone().map(|key| (header::AUTHORIZATION, key));
    let path = format!("/props?model={}", query_value(&model));
    // A client's request: the whole answer within the first-byte timeout, as
    // for any answer that is not streamed.
    let timeout = forwarder.timeouts().first_byte;
    let read =
        forwarder.client().fetch(&url, &path, key, timeout, crate::fleet::health::READ_LIMIT);
    let (status, body) = read
        .await
        .map_err(|_| ApiError::new(ErrorType::UnavailableError, "the backend did not answer"))?;
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// `value` as a URL query's value: every byte but the unreserved ones escaped.
fn query_value(value: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `GET /health`: 200 when some backend takes traffic.
async fn health(State(app): AppState) -> Result<Response, GatewayError> {
    if app.forwarder.pool().backends().iter().any(|b| b.is_healthy()) {
        Ok(Json(json!({"status": "ok"})).into_response())
    } else {
        Err(ApiError::new(ErrorType::UnavailableError, "no healthy backend").into())
    }
}

/// `GET /metrics`: gauges are brought up to date, then everything is rendered.
async fn metrics(State(app): AppState) -> Response {
    let pool = app.forwarder.pool();
    for b in pool.backends().iter() {
        let url = b.url().to_string();
        let up = if b.is_healthy() { 1.0 } else { 0.0 };
        metrics::gauge!(m::BACKEND_UP, "backend" => url.clone()).set(up);
        for model in b.models().iter() {
            let labels = [("backend", url.clone()), ("model", model.clone())];
            metrics::gauge!(m::SLOTS, &labels).set(f64::from(b.slots()));
            metrics::gauge!(m::SLOTS_BUSY, &labels)
                .set(f64::from(b.in_flight() + b.foreign_busy()));
        }
    }
    for (model, depth) in pool.queue_depths() {
        metrics::gauge!(m::QUEUE_DEPTH, "model" => model).set(depth as f64);
    }
    for (worker, open) in app.spread.open().into_iter().enumerate() {
        metrics::gauge!(m::WORKER_CONNECTIONS, "worker" => worker.to_string()).set(open as f64);
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.metrics.render())
        .into_response()
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::config::GatewayConfig;
    use crate::serve::server::Gateway;

    /// Forwarded endpoints are served before the router, the rest by it; each
    /// refusal in the envelope, and a forwarded answer with its request id.
    #[tokio::test]
    async fn every_route_answers_in_the_envelope() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = GatewayConfig { max_body_bytes: 64, workers: 1, ..GatewayConfig::default() };
        let gateway = Gateway::serve(listener, config, std::future::pending()).await.unwrap();
        let base = format!("http://{}", gateway.addr);
        let client = reqwest::Client::new();
        let post = |path: &str, body: String| {
            client
                .post(format!("{base}{path}"))
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        let code = |v: &Value| v["error"]["code"].as_str().map(str::to_owned);

        let big = post("/v1/chat/completions", format!(r#"{{"model":"{}"}}"#, "m".repeat(100)));
        let big = big.await.unwrap();
        assert_eq!(big.status(), 413);
        assert_eq!(code(&big.json().await.unwrap()).as_deref(), Some("request_too_large"));

        for (path, _) in super::FORWARDED {
            // Anthropic's routes answer in its envelope, by type.
            let anthropic = path.starts_with("/v1/messages");
            let small = post(path, r#"{"model":"m"}"#.into()).await.unwrap();
            assert_eq!(small.status(), 404, "{path}: no backend serves `m`");
            assert!(small.headers().contains_key(crate::proxy::REQUEST_ID), "{path}");
            let v: Value = small.json().await.unwrap();
            if anthropic {
                assert_eq!(
                    (&v["type"], &v["error"]["type"]),
                    (&json!("error"), &json!("not_found_error")),
                    "{v}"
                );
            } else {
                assert_eq!(code(&v).as_deref(), Some("model_not_found"), "{path}: {v}");
            }

            let get = client.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(get.status(), 405, "{path}");
            let v: Value = get.json().await.unwrap();
            if anthropic {
                assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            } else {
                assert_eq!(code(&v).as_deref(), Some("method_not_allowed"), "{path}");
            }
        }
        let bad = post("/v1/completions", "{".into()).await.unwrap();
        assert_eq!(bad.status(), 400);
        let nowhere = client.get(format!("{base}/v1/nowhere")).send().await.unwrap();
        assert_eq!(nowhere.status(), 404);
        let v: Value = nowhere.json().await.unwrap();
        assert!(v["error"]["message"].is_string(), "{v}");
        let models: Value =
            client.get(format!("{base}/models")).send().await.unwrap().json().await.unwrap();
        assert_eq!(models["object"], "list", "llama-server's alias of /v1/models");
        let health = client.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(health.status(), 503, "no backend is healthy");
    }
}

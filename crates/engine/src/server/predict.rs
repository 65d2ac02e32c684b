//! Vertex AI's prediction route, as llama-server serves it for Google Cloud's
//! custom containers: on when `AIP_MODE=PREDICTION` (which Vertex sets), at
//! `AIP_PREDICT_ROUTE` (`/predict` by default), with `/health` also at
//! `AIP_HEALTH_ROUTE`. Its body is `{"instances": [...]}`, each instance a
//! request to the route its `@requestFormat` names (`chatCompletions`,
//! `completions`, `embeddings`...); the answer is `{"predictions": [...]}` in
//! the same order, an instance that failed holding its error. Instances run
//! side by side through the same queue and slots as any request; none streams.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, Request};
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Value};
use slotgate_protocol::ApiError;
use tower_service::Service;

use super::body::JsonBody;
use super::AppState;
use crate::error::EngineError;

/// Instances one prediction may hold, as llama-server bounds them.
const MAX_INSTANCES: usize = 128;
/// Instances of one prediction in flight at once: the queue and slots bound
/// the work, this the answers held in memory.
const AT_ONCE: usize = 16;
/// The largest answer of one instance that is read back.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Each `@requestFormat` and the route it calls. `predict` itself is not one:
/// an instance never recurses.
const FORMATS: &[(&str, &str)] = &[
    ("chatCompletions", "/v1/chat/completions"),
    ("completions", "/v1/completions"),
    ("completion", "/completion"),
    ("embeddings", "/v1/embeddings"),
    ("responses", "/v1/responses"),
    ("messages", "/v1/messages"),
    ("tokenize", "/tokenize"),
    ("detokenize", "/detokenize"),
    ("applyTemplate", "/apply-template"),
];

/// Where Vertex wants the prediction and health routes, when it does
/// (`AIP_MODE=PREDICTION`), from its variables.
pub fn routes() -> Option<(String, Option<String>)> {
    if std::env::var("AIP_MODE").ok().as_deref() != Some("PREDICTION") {
        return None;
    }
    let route = |var: &str| std::env::var(var).ok().filter(|r| r.starts_with('/'));
    Some((
        route("AIP_PREDICT_ROUTE").unwrap_or_else(|| "/predict".into()),
        route("AIP_HEALTH_ROUTE"),
    ))
}

/// The port Vertex tells the container to listen on, when it does.
pub fn port() -> Option<u16> {
    routes()?;
    std::env::var("AIP_HTTP_PORT").ok()?.parse().ok()
}

/// `POST` at the prediction route.
pub async fn predict(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<Value>, EngineError> {
    let Some(instances) = body.get("instances").and_then(Value::as_array) else {
        let why = "the body must hold an array named `instances`";
        return Err(ApiError::invalid("instances", why).into());
    };
    if instances.len() > MAX_INSTANCES {
        let why = format!("{} instances; at most {MAX_INSTANCES}", instances.len());
        return Err(ApiError::invalid("instances", why).into());
    }
    // The engine's own routes, keys and limits, as if each instance came
    // alone: built once for all of them.
    let routes = super::router(state);
    // Owned, so that the stream of answers borrows nothing of the body.
    let each = instances.iter().cloned().enumerate().map(|(i, instance)| {
        let routes = routes.clone();
        let headers = headers.clone();
        async move {
            match one(routes, &headers, &instance).await {
                Ok(answer) => answer,
                Err(err) => {
                    tracing::debug!(instance = i, error = %err.message, "prediction refused");
                    json!(err.into_envelope())
                }
            }
        }
    });
    let predictions: Vec<Value> = futures::stream::iter(each).buffered(AT_ONCE).collect().await;
    Ok(Json(json!({"predictions": predictions})))
}

/// One instance, answered by the route its format names.
async fn one(
    mut routes: axum::Router,
    headers: &HeaderMap,
    instance: &Value,
) -> Result<Value, ApiError> {
    let mut payload = instance
        .as_object()
        .cloned()
        .ok_or_else(|| ApiError::invalid("instance", "each instance must be a JSON object"))?;
    let format = payload.remove("@requestFormat");
    let format = format.as_ref().and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid("@requestFormat", "each instance must name its @requestFormat")
    })?;
    let path = FORMATS
        .iter()
        .find(|(name, path)| *name == format || *path == format)
        .map(|(_, path)| *path)
        .ok_or_else(|| {
            ApiError::invalid(
                "@requestFormat",
                format!("`{format}` is not a format this server takes"),
            )
        })?;
    // Never a stream: a prediction is one JSON answer.
    payload.insert("stream".into(), Value::Bool(false));
    let body = serde_json::to_vec(&payload).map_err(|_| ApiError::internal())?;
    let mut request = Request::builder().method(Method::POST).uri(path);
    for name in [header::AUTHORIZATION, "x-api-key".parse().map_err(|_| ApiError::internal())?] {
        if let Some(value) = headers.get(&name) {
            request = request.header(name, value);
        }
    }
    let request = request
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .map_err(|_| ApiError::internal())?;
    let response = routes.call(request).await.map_err(|_| ApiError::internal())?;
    let bytes =
        axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES).await.map_err(|_| {
            ApiError::invalid("instance", "the answer is larger than a prediction may carry")
        })?;
    serde_json::from_slice(&bytes).map_err(|_| ApiError::internal())
}

//! Requests that need a model wake the engine from its idle sleep
//! (`sleep_idle_s`) and keep it awake while they are answered; those that only
//! read its state (`/props`, `/slots`, `/metrics`, stored responses) do not.

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;
use crate::error::api_response;

/// Routes that are POSTed to but need no model loaded: they load and unload.
const NO_MODEL: [&str; 4] = [
    "/v1/models/load",
    "/v1/models/unload",
    "/inferences/llamacpp/loadmodel",
    "/inferences/llamacpp/unloadmodel",
];

/// Wakes the models for a request that needs one, then answers it.
pub async fn wake(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST || NO_MODEL.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let _visit = match state.scheduler.wake().await {
        Ok(visit) => visit,
        Err(err) if request.uri().path().starts_with("/v1/messages") => {
            return slotgate_http::anthropic_errors(api_response(err)).await;
        }
        Err(err) => return api_response(err),
    };
    next.run(request).await
}

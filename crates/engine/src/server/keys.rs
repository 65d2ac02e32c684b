//! Who may call the engine: its API keys (llama-server's `--api-key`): with
//! any configured, every endpoint but `/health` and the model list needs one
//! of them, or the admin key, as `Authorization: Bearer KEY` or `x-api-key`;
//! without, a 401 in the envelope of the route's API. And which web pages may
//! (CORS, `cors_origins`).

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use slotgate_protocol::{ApiError, ErrorType};

use super::AppState;
use crate::error::api_response;

/// Lets a request through when it carries a key, or when the engine has none.
pub async fn require(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let keys = state.api_keys.iter().chain(state.admin_key.iter());
    if state.api_keys.is_empty()
        || keys.into_iter().any(|k| slotgate_http::keys::carries(request.headers(), k))
    {
        return next.run(request).await;
    }
    let err = ApiError::new(
        ErrorType::AuthenticationError,
        "Invalid API Key: send one of the engine's keys (api_key_env, api_key_file) as \
         `Authorization: Bearer KEY` or `x-api-key`",
    )
    .with_code("invalid_api_key");
    let response = api_response(err);
    if request.uri().path().starts_with("/v1/messages") {
        return slotgate_http::anthropic_errors(response).await;
    }
    response
}

/// Answers a CORS preflight from an allowed page, and marks the answers to
/// such pages; off without `cors_origins`.
pub async fn cors(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.cors.is_off() {
        return next.run(request).await;
    }
    if let Some(answer) = state.cors.preflight(request.method(), request.headers()) {
        return answer;
    }
    let origin = request.headers().get(axum::http::header::ORIGIN).cloned();
    let mut response = next.run(request).await;
    state.cors.decorate(origin.as_ref(), &mut response);
    response
}

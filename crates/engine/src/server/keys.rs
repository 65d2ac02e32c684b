//! The engine's API keys (llama-server's `--api-key`): with any configured,
//! every endpoint but `/health` and the model list needs one of them, or the
//! admin key, as `Authorization: Bearer KEY` or `x-api-key`; without, a 401 in
//! the envelope of the route's API.

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

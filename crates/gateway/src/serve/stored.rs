//! `GET` and `DELETE /v1/responses/{id}`: a stored response is read from, or
//! deleted on, the engine that holds it (its instance is in the id), as the
//! key that made it; another key finds nothing.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use slotgate_protocol::{ApiError, ErrorType};

use crate::config::error::GatewayError;
use crate::fleet::health::READ_LIMIT;
use crate::proxy::upstream::Method as Verb;
use crate::serve::app::AppState;

/// `GET` or `DELETE /v1/responses/{id}`.
pub async fn stored(
    State(app): AppState,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, GatewayError> {
    let live = app.forwarder.live();
    let tenant = live.auth.identify(&headers)?;
    let not_found =
        || ApiError::new(ErrorType::NotFoundError, format!("no stored response `{id}`"));
    // Only ids an engine makes go into the path sent on (`resp_` and 48 hex
    // digits; a little room for other ids' lengths).
    let plain =
        id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let instance = slotgate_protocol::responses::instance_of(&id).filter(|_| plain);
    let instance = instance.ok_or_else(not_found)?;
    let backends = app.forwarder.pool().backends();
    let (backend, url) = backends
        .iter()
        .filter(|b| b.instance().as_deref().map(String::as_str) == Some(instance))
        .find_map(|b| Some((b, b.address()?)))
        .ok_or_else(not_found)?;
    let mut ask: Vec<(HeaderName, HeaderValue)> = Vec::new();
    if let Some(key) = &backend.api_key {
        ask.push((header::AUTHORIZATION, key.clone()));
    }
    if let Some(owner) = tenant.and_then(|t| HeaderValue::from_str(&t.cache_salt).ok()) {
        ask.push((HeaderName::from_static(slotgate_protocol::OWNER_HEADER), owner));
    }
    let verb = if method == Method::DELETE { Verb::Delete } else { Verb::Get };
    let forwarder = &app.forwarder;
    let path = format!("/v1/responses/{id}");
    let timeout = forwarder.timeouts().first_byte;
    let read = forwarder.client().fetch_as(verb, &url, &path, ask, timeout, READ_LIMIT);
    let (status, body) = read
        .await
        .map_err(|_| ApiError::new(ErrorType::UnavailableError, "the backend did not answer"))?;
    let mut response = axum::body::Body::from(body).into_response();
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

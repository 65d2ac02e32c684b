//! Before a request's first attempt: its body read and made what the backends
//! get (alias, usage, salt), its model settled, and its key's permission,
//! limits and deadline checked. Everything here is refused before any slot is
//! claimed.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue};
use slotgate_protocol::{ApiError, ErrorType};

use crate::fleet::pool::{Class, Wait};
use crate::proxy::peek::{self, Peek};
use crate::proxy::record::Record;
use crate::proxy::{Caller, Forwarder, DEADLINE};

/// A request ready for its backends.
pub(super) struct Ready {
    /// What routing reads of it; its model is the backends' name of it.
    pub peek: Peek,
    /// The model as the client named it.
    pub asked: String,
    /// The body as the backends get it.
    pub body: Bytes,
    /// The body as the client sent it, which a poisonous one is remembered by.
    pub sent: Bytes,
    /// Whether the usage in a stream was asked for here, and is taken out again
    /// before the client sees it.
    pub strip_usage: bool,
    /// The API it speaks, as its metrics label it.
    pub api: &'static str,
}

/// Reads `body` and makes it what the backends get; refuses a request that
/// killed backends lately, and one for a model that is not served.
pub(super) fn prepare(
    forwarder: &Forwarder,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
    request_id: &HeaderValue,
    caller: &Caller,
) -> Result<Ready, ApiError> {
    let pool = &forwarder.pool;
    let mut peek = peek::peek(&body, headers, pool.uses_affinity())?;
    forwarder.poisons.check(&body).inspect_err(|_| {
        tracing::warn!(request_id = ?request_id, "refused: this request killed backends lately");
    })?;
    let asked = peek.model.clone();
    let target = caller.live.aliases.get(&peek.model);
    // Keys are charged for tokens, so a stream must report them: asked for
    // here when the client did not, and taken out again before it sees them.
    // A Messages or Responses stream always reports them, as does
    // llama-server's `/completion`.
    let reports = matches!(path, "/v1/messages" | "/v1/responses" | "/completion");
    let strip_usage = caller.tenant.is_some() && peek.stream && !peek.usage_asked && !reports;
    // Salts are the key's (only generation reads a prompt cache): with cache
    // isolation, its prompts share cached prefixes with no other key's.
    let generates = matches!(path, "/v1/chat/completions" | "/v1/completions") || reports;
    let tenant = caller.tenant.as_ref().filter(|_| generates);
    let changes = peek::Changes {
        // The backend knows the model by its own name: the body says that one.
        model: target.map(String::as_str),
        ask_usage: strip_usage,
        salt: tenant.map(|t| &*t.cache_salt),
        isolate: tenant.is_some_and(|t| t.cache_isolation),
    };
    let sent = body.clone();
    let body = if changes.any(&body) { peek::rewrite(&body, &changes)? } else { body };
    if let (Some(salt), true, Some(key)) = (changes.salt, changes.isolate, peek.affinity.as_mut()) {
        // Its prompts are warm only where its own went.
        *key = crate::fleet::hash::Fnv::default()
            .write(&key.to_le_bytes())
            .write(salt.as_bytes())
            .finish();
    }
    if let Some(target) = target {
        peek.model.clone_from(target);
    }
    if peek.model.is_empty() {
        // Clients written for llama-server name no model: the only one, if
        // there is only one. The backend, serving just that one, does the same.
        peek.model = pool.only_model().ok_or_else(|| {
            ApiError::invalid("model", "several models are served here: name one in `model`")
        })?;
    }
    if !pool.knows(&peek.model) {
        tracing::info!(request_id = ?request_id, model = peek.model, "unknown model");
        return Err(ApiError::model_not_found(&peek.model));
    }
    Ok(Ready { peek, asked, body, sent, strip_usage, api: crate::metrics::api(path) })
}

/// Checks that the caller's key may use the model and is within its limits,
/// and reads the request's deadline: its record, and how it waits for a slot.
pub(super) async fn admit(
    forwarder: &Forwarder,
    ready: &Ready,
    headers: &HeaderMap,
    request_id: &HeaderValue,
    started: Instant,
    caller: &Caller,
) -> Result<(Record, Wait), ApiError> {
    let model = ready.peek.model.as_str();
    let mut record = Record::new(model, ready.api, request_id, started);
    let mut wait = Wait { class: Class::default(), deadline: deadline(headers, started)? };
    if let Some(tenant) = &caller.tenant {
        record.key(tenant.name.clone());
        let asked = &ready.asked;
        if !tenant.may_use(asked, model) {
            record.refused(403);
            return Err(ApiError::new(
                ErrorType::PermissionError,
                format!("the key `{}` may not use the model `{asked}`", tenant.name),
            )
            .with_param("model")
            .with_code("model_not_allowed"));
        }
        let permit =
            forwarder.book.admit(tenant).await.inspect_err(|e| record.refused(e.status()))?;
        record.permit(permit);
        wait.class = Class { priority: tenant.priority, tenant: tenant.id };
    }
    Ok((record, wait))
}

/// The deadline a request set with `x-slotgate-deadline-ms`, from its arrival.
fn deadline(
    headers: &HeaderMap,
    started: Instant,
) -> Result<Option<tokio::time::Instant>, ApiError> {
    let Some(value) = headers.get(DEADLINE) else { return Ok(None) };
    let ms: u64 = value.to_str().ok().and_then(|v| v.trim().parse().ok()).ok_or_else(|| {
        ApiError::invalid(DEADLINE, format!("{DEADLINE} must be a whole number of milliseconds"))
    })?;
    Ok(Some(tokio::time::Instant::from_std(started) + Duration::from_millis(ms)))
}

//! `/v1/models`, model loading and unloading, `/health`, `/slots`, `/props`,
//! `/metrics`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use slotgate_protocol::{ApiError, ErrorType, Model, ModelList, SlotStatus};

use super::body::JsonBody;
use super::AppState;
use crate::config::ModelSettings;
use crate::error::api_response;

/// `GET /v1/models`.
pub async fn models(State(state): State<AppState>) -> Json<ModelList> {
    let snapshot = state.scheduler.snapshot();
    // Sleeping models are listed too: a request for one wakes it.
    let loaded = snapshot.models.iter().map(|m| (&m.id, &m.info, m.created));
    let asleep = snapshot.sleeping.iter().map(|d| (&d.id, &d.info, d.created));
    let names = loaded.chain(asleep).flat_map(|(id, info, created)| {
        std::iter::once(id).chain(&info.aliases).map(move |name| Model {
            aliases: Some(info.aliases.clone()),
            tags: Some(Vec::new()),
            meta: Some(info.meta.clone()),
            ..Model::new(name.clone(), created, "slotgate")
        })
    });
    Json(ModelList::new(names.collect()))
}

/// `GET /health`: 200 when a model serves, 503 while loading or with none, and
/// 503 when the scheduler thread is stuck or gone (the process then exits).
pub async fn health(State(state): State<AppState>) -> Response {
    if let Some(why) = state.config.server.stuck_bound().and_then(|b| state.scheduler.failure(b)) {
        return api_response(ApiError::new(ErrorType::UnavailableError, why).with_code("stuck"));
    }
    let snapshot = state.scheduler.snapshot();
    // A sleeping engine is healthy: its next request loads the models again.
    if !snapshot.models.is_empty() || snapshot.is_sleeping() {
        let instance = format!("{:016x}", crate::ids::nonce());
        return Json(json!({"status": "ok", "instance": instance})).into_response();
    }
    let message = if snapshot.loading > 0 { "Loading model" } else { "no model is loaded" };
    api_response(ApiError::new(ErrorType::UnavailableError, message))
}

/// Query of `GET /props`.
#[derive(Debug, Deserialize)]
pub struct PropsQuery {
    model: Option<String>,
}

/// `GET /props`: a model's settings in llama-server's shape (`total_slots`,
/// `default_generation_settings.n_ctx`, `chat_template`...), for tools written
/// for it. `model` may be left out while one model serves. `chat_template` is the
/// GGUF's own template, empty when it has none; `chat_template_name` says which
/// template renders chats.
pub async fn props(State(state): State<AppState>, Query(q): Query<PropsQuery>) -> Response {
    let snapshot = state.scheduler.snapshot();
    let (id, info) = match snapshot.describe(q.model.as_deref()) {
        Ok(model) => model,
        Err(err) => return api_response(err),
    };
    let d = &state.sampling;
    let seed = u32::try_from(state.config.server.seed).unwrap_or(u32::MAX);
    let params = json!({
        "seed": seed, "temperature": d.temperature, "top_k": d.top_k, "top_p": d.top_p,
        "min_p": d.min_p, "presence_penalty": d.presence_penalty,
        "frequency_penalty": d.frequency_penalty, "repeat_last_n": 64, "max_tokens": -1,
        "n_predict": -1, "n_probs": 0, "stream": false, "cache_prompt": d.cache_prompt,
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
    });
    // Tools work on every template here (the generic form where it has none).
    let caps = json!({
        "supports_tools": true, "supports_tool_calls": true,
        "supports_parallel_tool_calls": true, "supports_system_role": true,
        "supports_string_content": true, "supports_typed_content": true,
        "supports_object_arguments": info.tool_format.is_some(),
        "supports_preserve_reasoning": false, "supports_reasoning_effort": false,
    });
    Json(json!({
        "default_generation_settings": {"n_ctx": info.ctx_len, "params": params},
        "model_ftype": info.meta["ftype"],
        "chat_template_caps": caps,
        "total_slots": info.n_parallel,
        "model_alias": id,
        "model_path": info.path,
        "modalities": {"vision": false, "audio": false},
        "chat_template": info.chat_template,
        "chat_template_name": info.template_name,
        "build_info": crate::SYSTEM_FINGERPRINT,
        "is_sleeping": snapshot.is_sleeping(),
    }))
    .into_response()
}

/// Query of `GET /slots`.
#[derive(Debug, Deserialize)]
pub struct SlotsQuery {
    model: Option<String>,
    #[serde(default)]
    fail_on_no_slot: Option<String>,
}

/// Lets in a load or unload: the admin key; without one, nobody, unless
/// `admin_loopback` serves loopback callers. Always JSON, never cross-origin.
fn admin_call(
    state: &AppState,
    headers: &HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
) -> Result<(), ApiError> {
    let gate = slotgate_http::admin::Gate {
        key: state.admin_key.as_ref(),
        loopback: state.config.server.admin_loopback,
        setting: "admin_key_env",
    };
    gate.check(&axum::http::Method::POST, headers, peer.map(|Extension(ConnectInfo(p))| p))
}

/// Refuses a caller without the admin key, when one is configured.
pub(super) fn admin_only(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    match &state.admin_key {
        Some(key) if !slotgate_http::keys::carries(headers, key) => Err(ApiError::new(
            ErrorType::AuthenticationError,
            "this endpoint needs the engine's admin key (admin_key_env), as `Authorization: Bearer KEY`",
        )
        .with_code("invalid_api_key")),
        _ => Ok(()),
    }
}

/// `GET /slots`: every slot, as llama.cpp's server lists them, each naming its
/// model. What a slot holds (`n_cached`) is shown only to the admin key's
/// holder when the engine has one; whether it is busy is shown to all.
pub async fn slots(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SlotsQuery>,
) -> Response {
    if !state.config.server.slots_endpoint {
        return switched_off("this server's slot list is off (`slots_endpoint`)");
    }
    let detail = admin_only(&state, &headers).is_ok();
    let snapshot = state.scheduler.snapshot();
    if let Some(model) = &q.model {
        if !snapshot.models.iter().any(|m| &m.id == model) {
            return api_response(ApiError::model_not_found(model));
        }
    }
    let slots: Vec<SlotStatus> = snapshot
        .models
        .iter()
        .filter(|m| q.model.as_ref().is_none_or(|want| &m.id == want))
        .flat_map(|m| m.slots.iter().cloned())
        .map(|s| if detail { s } else { SlotStatus { n_cached: None, ..s } })
        .collect();
    let fail = q.fail_on_no_slot.as_deref().is_some_and(|v| v == "1" || v == "true");
    if fail && slots.iter().all(|s| s.is_processing) {
        return api_response(ApiError::slot_unavailable("no slot is free"));
    }
    let mut response = Json(slots).into_response();
    // The same number as the events of `/slots/events`: a reader of both can
    // tell which is newer.
    response
        .headers_mut()
        .insert(slotgate_protocol::SLOTS_SEQ_HEADER, axum::http::HeaderValue::from(snapshot.seq));
    response
}

/// `GET /metrics`: Prometheus text, with llama-server's
/// `Process-Start-Time-Unix` header.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let server = &state.config.server;
    if !server.metrics_endpoint {
        return switched_off("this server's metrics are off (`metrics_endpoint`)");
    }
    let names = crate::metrics::Names {
        vllm: server.vllm_metrics,
        llama_server: server.llama_server_metrics,
    };
    let text = crate::metrics::render(&state.metrics, names);
    let started = crate::metrics::llama_server::TOTALS.started().to_string();
    let headers = [
        (axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4".to_owned()),
        (axum::http::HeaderName::from_static("process-start-time-unix"), started),
    ];
    (headers, text).into_response()
}

/// Names other servers use for the same settings, accepted in load bodies.
const ALIASES: &[(&str, &str)] = &[
    ("llama_model_path", "model"),
    ("model_path", "model"),
    ("path", "model"),
    ("cpu_threads", "threads"),
    ("n_batch", "batch_size"),
    ("n_ctx", "ctx_len"),
    ("system_prompt", "pre_prompt"),
];

/// `POST /v1/models/load` (and Nitro's `/inferences/llamacpp/loadmodel`): the
/// settings of a model, with the engine's own settings as defaults.
pub async fn load(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<BTreeMap<String, Value>>,
) -> Response {
    if let Err(err) = admin_call(&state, &headers, peer) {
        return api_response(err);
    }
    let mut fields = serde_json::Map::new();
    for (key, value) in body {
        let key = ALIASES
            .iter()
            .find(|(alias, _)| *alias == key)
            .map_or(key, |(_, name)| (*name).to_owned());
        fields.insert(key, value);
    }
    let defaults = ModelSettings { model: None, model_id: None, ..state.config.model.clone() };
    // An unknown key stays in `merged`, and serde refuses it, naming it.
    let mut merged = serde_json::to_value(&defaults).unwrap_or_default();
    for (k, v) in fields {
        merged[k] = v;
    }
    let settings: ModelSettings = match serde_path_value(merged) {
        Ok(s) => s,
        Err(err) => return api_response(err),
    };
    if let Err(err) = settings.validate() {
        return api_response(err.to_api());
    }
    if let Err(err) = inside_models_dir(&state, &settings) {
        return api_response(err);
    }
    match state.scheduler.load(settings).await {
        Ok(id) => {
            Json(json!({"message": "Model loaded successfully", "model": id})).into_response()
        }
        Err(err) => err.into_response(),
    }
}

/// Refuses a model file outside `models_dir`, when one is set; links and `..`
/// are resolved first.
fn inside_models_dir(state: &AppState, settings: &ModelSettings) -> Result<(), ApiError> {
    let Some(dir) = &state.config.server.models_dir else { return Ok(()) };
    let refused = |param: &str| {
        ApiError::new(
            ErrorType::PermissionError,
            format!("{param}: files may only be read from the engine's models_dir"),
        )
        .with_param(param)
    };
    let Ok(dir) = dir.canonicalize() else { return Err(refused("model")) };
    // Every path a load names: the model, and the template file it may bring.
    let paths = [
        ("model", settings.model.as_ref()),
        ("chat_template_file", settings.chat_template_file.as_ref()),
    ];
    for (param, path) in paths {
        let Some(path) = path else {
            if param == "model" {
                return Err(refused(param));
            }
            continue;
        };
        match path.canonicalize() {
            Ok(path) if path.starts_with(&dir) => {}
            _ => return Err(refused(param)),
        }
    }
    Ok(())
}

fn serde_path_value(value: Value) -> Result<ModelSettings, ApiError> {
    let bytes = serde_json::to_vec(&value).map_err(|_| ApiError::internal())?;
    slotgate_protocol::parse_json(&bytes)
}

/// Body of an unload request.
#[derive(Debug, Default, Deserialize)]
pub struct UnloadBody {
    model: Option<String>,
    model_id: Option<String>,
    llama_model_path: Option<PathBuf>,
}

/// `POST /v1/models/unload` (and Nitro's `unloadmodel`): `{"model": ID}`; with no
/// id, the only loaded model.
pub async fn unload(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(err) = admin_call(&state, &headers, peer) {
        return api_response(err);
    }
    let body: UnloadBody = if body.iter().all(u8::is_ascii_whitespace) {
        UnloadBody::default()
    } else {
        match slotgate_protocol::parse_json(&body) {
            Ok(b) => b,
            Err(err) => return api_response(err),
        }
    };
    let snapshot = state.scheduler.snapshot();
    let id = match body.model.or(body.model_id) {
        Some(id) => id,
        None => match (body.llama_model_path, snapshot.models.as_slice()) {
            (Some(path), _) => ModelSettings { model: Some(path), ..ModelSettings::default() }.id(),
            (None, [only]) => only.id.clone(),
            (None, _) => {
                return api_response(ApiError::invalid("model", "name the model to unload"));
            }
        },
    };
    match state.scheduler.unload(id.clone()).await {
        Ok(()) => {
            (StatusCode::OK, Json(json!({"message": "Model unloaded successfully", "model": id})))
                .into_response()
        }
        Err(err) => err.into_response(),
    }
}

/// The 501 of an endpoint the settings switched off, as llama-server answers
/// `--no-slots` and a `/metrics` without `--metrics`.
fn switched_off(message: &str) -> Response {
    api_response(ApiError::new(ErrorType::NotSupportedError, message))
}

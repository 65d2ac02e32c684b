//! The fake backend of the gateway comparison: a fixed chat completion, in one
//! piece or streamed a word per chunk, served by axum in the bench's own process
//! or, as fixed bytes, by a static nginx.

use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

const ANSWER: &str = "This is a fixed answer from the fake backend.";

/// The fake: answers every chat completion at once, in one piece or as eight
/// chunks, a usage chunk and `[DONE]`.
pub async fn fake_backend() -> anyhow::Result<String> {
    let slots: Vec<Value> = (0..4096)
        .map(|i| json!({"id": i, "id_task": -1, "n_ctx": 4096, "is_processing": false}))
        .collect();
    let app = Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(|| async { Json(json!({"object": "list", "data": [{"id": "fake", "object": "model", "created": 0, "owned_by": "bench"}]})) }))
        .route("/slots", get(move || { let slots = slots.clone(); async move { Json(slots) } }))
        .route("/v1/chat/completions", post(fake_chat));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

async fn fake_chat(Json(body): Json<Value>) -> axum::response::Response {
    if body["stream"] != Value::Bool(true) {
        return Json(plain_answer()).into_response();
    }
    ([("content-type", "text/event-stream")], streamed_answer()).into_response()
}

fn usage() -> Value {
    json!({"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13})
}

/// The fixed answer, in one piece.
pub fn plain_answer() -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "logprobs": null, "finish_reason": "stop"}],
        "usage": usage()})
}

/// The fixed answer as server-sent events: a chunk per word, a usage chunk and `[DONE]`.
pub fn streamed_answer() -> String {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
    };
    let mut events = String::new();
    let words: Vec<&str> = ANSWER.split_inclusive(' ').collect();
    for (i, word) in words.iter().enumerate() {
        let delta = if i == 0 {
            json!({"role": "assistant", "content": word})
        } else {
            json!({"content": word})
        };
        events.push_str(&format!("data: {}\n\n", chunk(delta, Value::Null)));
    }
    events.push_str(&format!("data: {}\n\n", chunk(json!({}), json!("stop"))));
    events.push_str(&format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "fake", "choices": [], "usage": usage()})
    ));
    events.push_str("data: [DONE]\n\n");
    events
}

//! `POST /v1/rerank` (and `/rerank`, `/reranking`, `/v1/reranking`, as
//! llama-server routes them): a reranker's score of each document for a query.
//! Jina's and Cohere's shape (`documents`, answered as `results` of `index` and
//! `relevance_score`, best first, with `usage`), or Hugging Face TEI's (`texts`,
//! answered as a list of `index` and `score`, with `text` on `return_text`).
//! Each document is read by the model's reranking context, one per step
//! between generation steps, as embeddings are.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use slotgate_protocol::ApiError;

use super::body::JsonBody;
use super::generate::resolve_model;
use super::AppState;
use crate::error::EngineError;

/// Documents one request may rank.
const MAX_DOCUMENTS: usize = 1024;

/// What a rerank request asks.
struct Ask {
    query: String,
    documents: Vec<String>,
    /// TEI's shape, not Jina's.
    tei: bool,
    top_n: usize,
    return_text: bool,
}

/// `POST /v1/rerank`.
pub async fn rerank(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, EngineError> {
    let mut model = body.get("model").and_then(Value::as_str).unwrap_or_default().to_owned();
    let served = resolve_model(&state, &mut model)?;
    let ask = read(&body)?;
    let texts = ask.return_text.then(|| ask.documents.clone());
    let scores = state.scheduler.rerank(&served, ask.query, ask.documents).await?;
    let tokens: u32 = scores.iter().map(|s| s.tokens).sum();
    let label = if ask.tei { "score" } else { "relevance_score" };
    let mut ranked: Vec<(usize, f32)> = scores
        .iter()
        .map(|s| s.vectors.first().and_then(|v| v.first()).copied().unwrap_or(0.0))
        .enumerate()
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(ask.top_n);
    let results: Vec<Value> = ranked
        .into_iter()
        .map(|(index, score)| {
            let mut one = json!({"index": index, label: score});
            if let Some(texts) = &texts {
                one["text"] = json!(texts[index]);
            }
            one
        })
        .collect();
    if ask.tei {
        return Ok(Json(results).into_response());
    }
    Ok(Json(json!({"model": model, "object": "list", "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
    .into_response())
}

/// The request's query, documents and options, or a 400 naming the field.
fn read(body: &Value) -> Result<Ask, ApiError> {
    let query = match body.get("query") {
        Some(Value::String(query)) => query.clone(),
        Some(_) => return Err(ApiError::invalid("query", "query must be a string")),
        None => return Err(ApiError::invalid("query", "query must be given")),
    };
    let tei = body.get("texts").is_some();
    let field = if tei { "texts" } else { "documents" };
    let not_strings =
        || ApiError::invalid(field, format!("{field} must be a non-empty array of strings"));
    let items = body.get(field).and_then(Value::as_array).ok_or_else(not_strings)?;
    if items.is_empty() {
        return Err(not_strings());
    }
    if items.len() > MAX_DOCUMENTS {
        let why = format!("{field} has {} entries; at most {MAX_DOCUMENTS}", items.len());
        return Err(ApiError::invalid(field, why));
    }
    // A string, or Jina's and Cohere's `{"text": ...}`.
    let documents = items
        .iter()
        .map(|d| d.as_str().or_else(|| d.get("text").and_then(Value::as_str)).map(str::to_owned))
        .collect::<Option<Vec<String>>>()
        .ok_or_else(not_strings)?;
    let top_n = match body.get("top_n") {
        None | Some(Value::Null) => documents.len(),
        Some(n) => n
            .as_u64()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .ok_or_else(|| ApiError::invalid("top_n", "top_n must be a whole number"))?,
    };
    let return_text = tei && body.get("return_text").and_then(Value::as_bool).unwrap_or(false);
    Ok(Ask { query, documents, tei, top_n, return_text })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_as_llama_server_reads_them() {
        let ask = read(&json!({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1}));
        let ask = ask.unwrap();
        assert_eq!((ask.documents, ask.top_n, ask.tei), (vec!["a".into(), "b".into()], 1, false));
        let tei = read(&json!({"query": "q", "texts": ["a"], "return_text": true})).unwrap();
        assert!(tei.tei && tei.return_text && tei.top_n == 1);
        for (bad, param) in [
            (json!({"documents": ["a"]}), "query"),
            (json!({"query": 1, "documents": ["a"]}), "query"),
            (json!({"query": "q", "documents": []}), "documents"),
            (json!({"query": "q", "documents": null}), "documents"),
            (json!({"query": "q", "documents": 123}), "documents"),
            (json!({"query": "q", "documents": [1, 2]}), "documents"),
            (json!({"query": "q", "documents": ["a"], "top_n": -1}), "top_n"),
        ] {
            assert_eq!(read(&bad).err().and_then(|e| e.param).as_deref(), Some(param), "{bad}");
        }
        let many = json!({"query": "q", "documents": vec!["a"; MAX_DOCUMENTS + 1]});
        assert!(read(&many).is_err());
    }
}

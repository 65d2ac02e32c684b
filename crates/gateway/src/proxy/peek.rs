//! What the gateway reads of a request body; the rest is forwarded untouched.

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::Value;
use slotgate_protocol::ApiError;

use crate::affinity::Opening;

/// The fields routing needs.
#[derive(Debug)]
pub struct Peek {
    /// The model asked for.
    pub model: String,
    /// Whether the answer is streamed.
    pub stream: bool,
    /// The affinity key for `cache_aware` routing.
    pub affinity: Option<u64>,
    /// Whether a stream asked for its usage (`stream_options.include_usage`).
    pub usage_asked: bool,
}

/// The two fields every policy needs; the rest of the body is checked to be
/// JSON and skipped without building it.
#[derive(Deserialize)]
struct Head {
    model: Option<Value>,
    stream: Option<Value>,
    stream_options: Option<Value>,
}

/// [`Head`] and what the affinity key is derived from: of a chat, only its
/// opening messages are built.
#[derive(Deserialize)]
struct Keyed {
    model: Option<Value>,
    stream: Option<Value>,
    stream_options: Option<Value>,
    prompt_cache_key: Option<Value>,
    messages: Option<Opening>,
    prompt: Option<Value>,
}

/// Reads `body`, or says why it cannot be routed, in one pass that builds only
/// the fields it reads: a whole body as a `serde_json::Value` was the largest
/// cost of the proxy's own work. The affinity key is derived only when
/// `affinity` is asked for. A missing model is left empty, for the caller to
/// fill in when only one model is served.
pub fn peek(body: &[u8], headers: &HeaderMap, affinity: bool) -> Result<Peek, ApiError> {
    let (model, stream, options, keyed) = if affinity {
        let k: Keyed = slotgate_protocol::parse_json(body)?;
        let mut fields = serde_json::Map::new();
        let parts = [
            ("prompt_cache_key", k.prompt_cache_key),
            ("messages", k.messages.and_then(|o| o.0).map(Value::Array)),
            ("prompt", k.prompt),
        ];
        for (name, value) in parts {
            if let Some(value) = value {
                fields.insert(name.to_owned(), value);
            }
        }
        (k.model, k.stream, k.stream_options, Some(Value::Object(fields)))
    } else {
        let head: Head = slotgate_protocol::parse_json(body)?;
        (head.model, head.stream, head.stream_options, None)
    };
    let model = match model {
        Some(Value::String(m)) => m,
        Some(_) => return Err(ApiError::invalid("model", "model must be a string")),
        None => String::new(),
    };
    let affinity = keyed.and_then(|v| crate::affinity::key(&model, &v, headers));
    let stream = stream.as_ref().and_then(Value::as_bool).unwrap_or(false);
    let usage_asked =
        options.as_ref().and_then(|o| o.get("include_usage")).and_then(Value::as_bool)
            == Some(true);
    Ok(Peek { model, stream, affinity, usage_asked })
}

/// `body` with its `model` replaced by `model` (an alias resolved) and, with
/// `ask_usage`, `stream_options.include_usage` set; the rest of the body is
/// kept as sent.
pub fn rewrite(
    body: &axum::body::Bytes,
    model: Option<&str>,
    ask_usage: bool,
) -> Result<axum::body::Bytes, ApiError> {
    let mut value: Value = slotgate_protocol::parse_json(body)?;
    if let Some(object) = value.as_object_mut() {
        if let Some(model) = model {
            object.insert("model".into(), Value::String(model.to_owned()));
        }
        if ask_usage {
            let options = object.entry("stream_options").or_insert_with(|| serde_json::json!({}));
            if !options.is_object() {
                *options = serde_json::json!({});
            }
            options["include_usage"] = Value::Bool(true);
        }
    }
    Ok(axum::body::Bytes::from(serde_json::to_vec(&value).map_err(|_| ApiError::internal())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_reads_model_and_stream_only() {
        let h = HeaderMap::new();
        for affinity in [false, true] {
            let body = br#"{"model":"m","stream":true,"extra":{"kept":1},"prompt":"p"}"#;
            let p = peek(body, &h, affinity).unwrap();
            assert_eq!((p.model.as_str(), p.stream, p.affinity.is_some()), ("m", true, affinity));
            let p = peek(br#"{"model":"m","stream":"yes"}"#, &h, affinity).unwrap();
            assert!(!p.stream, "a stream that is not a boolean is not a stream");
            let missing = peek(br#"{"stream":true}"#, &h, affinity).unwrap();
            assert_eq!(missing.model, "", "left for the pool's only model");
            let wrong = peek(br#"{"model":5}"#, &h, affinity).unwrap_err();
            assert_eq!(wrong.param.as_deref(), Some("model"));
            // Broken JSON after the two fields is still refused, not skipped.
            assert_eq!(peek(br#"{"model":"m","x":[1,}"#, &h, affinity).unwrap_err().status(), 400);
            assert_eq!(peek(b"{", &h, affinity).unwrap_err().status(), 400);
        }
    }

    /// The key from the opening alone is the key of the whole body: later turns
    /// are skipped, and a `messages` that is no list falls back to `prompt`.
    #[test]
    fn the_opening_gives_the_whole_bodys_key() {
        let long = "y".repeat(crate::affinity::CHAT_PREFIX_BYTES + 10);
        let bodies = [
            serde_json::json!({"model": "m", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Tell me about Paris."},
                {"role": "assistant", "content": "A city."},
                {"role": "user", "content": [{"type": "text", "text": "And Rome?"}]}]}),
            serde_json::json!({"model": "m", "messages": [
                {"role": "system", "content": long}, {"role": "user", "content": "late"}]}),
            serde_json::json!({"model": "m", "messages": [{"role": "system", "content": "only"}]}),
            serde_json::json!({"model": "m", "messages": "not a list", "prompt": "p"}),
            serde_json::json!({"model": "m", "messages": [], "prompt": "p"}),
            serde_json::json!({"model": "m", "prompt_cache_key": "k", "messages": [1, 2]}),
            serde_json::json!({"model": "m", "prompt": ["abc", "def"]}),
        ];
        let h = HeaderMap::new();
        for body in bodies {
            let bytes = serde_json::to_vec(&body).unwrap();
            let whole = crate::affinity::key("m", &body, &h);
            assert_eq!(peek(&bytes, &h, true).unwrap().affinity, whole, "{body}");
        }
    }
}

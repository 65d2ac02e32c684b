//! What the gateway reads of a request body; the rest is forwarded untouched.

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::Value;
use slotgate_protocol::validate::MAX_N;
use slotgate_protocol::ApiError;

use crate::affinity::{Opening, Said};

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
    n: Option<Value>,
}

/// [`Head`] and what the affinity key is derived from ([`Said`]): of a chat,
/// only its opening messages are read, their text borrowed from the body.
/// `Said`'s fields are listed again rather than `#[serde(flatten)]`ed: flatten
/// buffers every other field of the body, the cost this pass exists to avoid.
#[derive(Deserialize)]
struct Keyed<'a> {
    model: Option<Value>,
    stream: Option<Value>,
    stream_options: Option<Value>,
    n: Option<Value>,
    prompt_cache_key: Option<Value>,
    #[serde(borrow)]
    messages: Option<Opening<'a>>,
    prompt: Option<Value>,
}

/// Reads `body`, or says why it cannot be routed, in one pass that builds only
/// the fields it reads: a whole body as a `serde_json::Value` was the largest
/// cost of the proxy's own work. The affinity key is derived only when
/// `affinity` is asked for. A missing model is left empty, for the caller to
/// fill in when only one model is served.
pub fn peek(body: &[u8], headers: &HeaderMap, affinity: bool) -> Result<Peek, ApiError> {
    let (model, stream, options, n, keyed) = if affinity {
        let k: Keyed = slotgate_protocol::parse_json(body)?;
        let said =
            Said { prompt_cache_key: k.prompt_cache_key, messages: k.messages, prompt: k.prompt };
        (k.model, k.stream, k.stream_options, k.n, Some(said))
    } else {
        let head: Head = slotgate_protocol::parse_json(body)?;
        (head.model, head.stream, head.stream_options, head.n, None)
    };
    // Refused before a slot is claimed for it; the backend checks the rest.
    if let Some(n) = n.as_ref().and_then(Value::as_u64).filter(|&n| n > u64::from(MAX_N)) {
        return Err(ApiError::invalid("n", format!("n must be at most {MAX_N}, got {n}")));
    }
    let model = match model {
        Some(Value::String(m)) => m,
        Some(_) => return Err(ApiError::invalid("model", "model must be a string")),
        None => String::new(),
    };
    let affinity = keyed.and_then(|said| crate::affinity::key(&model, &said, headers));
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
            let many = peek(br#"{"model":"m","n":129}"#, &h, affinity).unwrap_err();
            assert_eq!((many.status(), many.param.as_deref()), (400, Some("n")));
            assert!(peek(br#"{"model":"m","n":128}"#, &h, affinity).is_ok());
        }
    }

    /// The key comes from the body's opening: the same conversation with later
    /// turns keeps it, another one does not.
    #[test]
    fn the_key_is_read_from_the_opening() {
        let h = HeaderMap::new();
        let turn1 = br#"{"model":"m","messages":[{"role":"user","content":"Paris?"}]}"#;
        let turn2 = br#"{"model":"m","messages":[{"role":"user","content":"Paris?"},
            {"role":"assistant","content":"A city."},{"role":"user","content":"Rome?"}]}"#;
        let other = br#"{"model":"m","messages":[{"role":"user","content":"Oslo?"}]}"#;
        let key = |body: &[u8]| peek(body, &h, true).unwrap().affinity;
        assert!(key(turn1).is_some());
        assert_eq!(key(turn1), key(turn2));
        assert_ne!(key(turn1), key(other));
    }
}

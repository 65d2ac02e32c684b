//! What the gateway reads of a request body; the rest is forwarded untouched.

use axum::http::HeaderMap;
use serde_json::Value;
use slotgate_protocol::ApiError;

/// The fields routing needs.
#[derive(Debug)]
pub struct Peek {
    /// The model asked for.
    pub model: String,
    /// Whether the answer is streamed.
    pub stream: bool,
    /// The affinity key for `cache_aware` routing.
    pub affinity: Option<u64>,
}

/// Reads `body`, or says why it cannot be routed.
pub fn peek(body: &[u8], headers: &HeaderMap) -> Result<Peek, ApiError> {
    let value: Value = slotgate_protocol::parse_json(body)?;
    let model = match value.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => return Err(ApiError::invalid("model", "model must be a non-empty string")),
        None => return Err(ApiError::invalid("model", "missing field `model`")),
    };
    let affinity = crate::affinity::key(&model, &value, headers);
    let stream = value.get("stream").and_then(Value::as_bool).unwrap_or(false);
    Ok(Peek { model, stream, affinity })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_reads_model_and_stream_only() {
        let h = HeaderMap::new();
        let p = peek(br#"{"model":"m","stream":true,"extra":{"kept":1}}"#, &h).unwrap();
        assert_eq!((p.model.as_str(), p.stream, p.affinity), ("m", true, None));
        assert_eq!(peek(br#"{"stream":true}"#, &h).unwrap_err().param.as_deref(), Some("model"));
        assert_eq!(peek(b"{", &h).unwrap_err().status(), 400);
    }
}

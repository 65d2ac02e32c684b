//! The affinity key of a request: what says "this is the same conversation" to
//! the `cache_aware` policy, derived from the request alone so that every gateway
//! replica derives the same key.
//!
//! In order: OpenAI's `prompt_cache_key` field, then an `x-session-id` header,
//! then the start of the conversation itself: for chat, the system and developer
//! messages and the first user message (which every later turn resends
//! unchanged); for text completions, the first [`PROMPT_PREFIX_BYTES`] of the
//! prompt. Each is hashed with the model, since a prefix is only cached per model.

use axum::http::HeaderMap;
use serde_json::Value;

use crate::hash::Fnv;

/// The header clients may send to keep their requests together.
pub const SESSION_HEADER: &str = "x-session-id";

/// Bytes of a text prompt that name its conversation. Short enough to lie within
/// the first turn of most conversations, long enough to tell them apart; a first
/// prompt shorter than this hashes whole, so its second turn may move once.
pub const PROMPT_PREFIX_BYTES: usize = 256;

/// Most bytes of chat content hashed; a longer opening is cut here.
pub const CHAT_PREFIX_BYTES: usize = 4096;

/// The request's affinity key, or `None` when it has nothing to derive one from.
pub fn key(model: &str, body: &Value, headers: &HeaderMap) -> Option<u64> {
    let mut h = Fnv::default();
    h.write(model.as_bytes());
    if let Some(Value::String(k)) = body.get("prompt_cache_key") {
        if !k.is_empty() {
            return Some(h.write(b"prompt_cache_key").write(k.as_bytes()).finish());
        }
    }
    if let Some(session) = headers.get(SESSION_HEADER).filter(|v| !v.is_empty()) {
        return Some(h.write(b"session").write(session.as_bytes()).finish());
    }
    if let Some(Value::Array(messages)) = body.get("messages") {
        return chat_opening(&mut h, messages).then(|| h.finish());
    }
    // A batch names its conversation by its first prompt; a token list is a prompt.
    let prompt = match body.get("prompt")? {
        Value::Array(items) if items.first().is_some_and(|v| !v.is_number()) => &items[0],
        single => single,
    };
    match prompt {
        Value::String(text) if !text.is_empty() => {
            h.write(b"prompt").write(cut(text, PROMPT_PREFIX_BYTES).as_bytes());
        }
        Value::Array(tokens) if !tokens.is_empty() => {
            h.write(b"tokens");
            for t in tokens.iter().take(PROMPT_PREFIX_BYTES / 4) {
                h.write(t.to_string().as_bytes());
            }
        }
        _ => return None,
    }
    Some(h.finish())
}

/// Hashes the system and developer messages and the first user message; false
/// when there is no user message to name the conversation by.
fn chat_opening(h: &mut Fnv, messages: &[Value]) -> bool {
    let mut budget = CHAT_PREFIX_BYTES;
    for message in messages {
        let role = message.get("role").and_then(Value::as_str).unwrap_or_default();
        h.write(role.as_bytes());
        match message.get("content") {
            Some(Value::String(text)) => {
                let part = cut(text, budget);
                budget -= part.len();
                h.write(part.as_bytes());
            }
            Some(other) => {
                let text = other.to_string();
                let part = cut(&text, budget);
                budget -= part.len();
                h.write(part.as_bytes());
            }
            None => {}
        }
        if role == "user" {
            return true;
        }
        if budget == 0 {
            return true;
        }
    }
    false
}

/// The messages of a chat that [`key`] reads: those up to the first user message,
/// or up to [`CHAT_PREFIX_BYTES`] of content. The later turns that a long
/// conversation resends are checked to be JSON and skipped, not built.
#[derive(Debug, Default)]
pub struct Opening(pub Option<Vec<Value>>);

impl<'de> serde::Deserialize<'de> for Opening {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_any(OpeningVisitor)
    }
}

struct OpeningVisitor;

impl<'de> serde::de::Visitor<'de> for OpeningVisitor {
    type Value = Opening;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of messages")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Opening, A::Error> {
        let mut kept = Vec::new();
        let mut budget = CHAT_PREFIX_BYTES;
        let mut reading = true;
        while reading {
            let Some(message) = seq.next_element::<Value>()? else {
                return Ok(Opening(Some(kept)));
            };
            let content = match message.get("content") {
                Some(Value::String(text)) => text.len(),
                Some(other) => other.to_string().len(),
                None => 0,
            };
            budget = budget.saturating_sub(content);
            reading = budget > 0 && message.get("role").and_then(Value::as_str) != Some("user");
            kept.push(message);
        }
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Opening(Some(kept)))
    }

    // Anything else is not a chat: no opening, as when `messages` is absent (the
    // key then falls back to `prompt`); the engine judges the field itself.
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Opening, A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(Opening::default())
    }
    fn visit_bool<E>(self, _: bool) -> Result<Opening, E> {
        Ok(Opening::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Opening, E> {
        Ok(Opening::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Opening, E> {
        Ok(Opening::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Opening, E> {
        Ok(Opening::default())
    }
    fn visit_str<E>(self, _: &str) -> Result<Opening, E> {
        Ok(Opening::default())
    }
    fn visit_unit<E>(self) -> Result<Opening, E> {
        Ok(Opening::default())
    }
}

/// The longest start of `text` of at most `max` bytes that ends on a character.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use serde_json::json;

    use super::*;

    fn k(body: Value) -> Option<u64> {
        key("m", &body, &HeaderMap::new())
    }

    #[test]
    fn later_turns_of_a_chat_share_the_first_turns_key() {
        let turn1 = json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tell me about Paris."}]});
        let turn3 = json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tell me about Paris."},
            {"role": "assistant", "content": "A city."},
            {"role": "user", "content": "And Rome?"}]});
        let other = json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tell me about Oslo."}]});
        assert!(k(turn1.clone()).is_some());
        assert_eq!(k(turn1.clone()), k(turn3));
        assert_ne!(k(turn1.clone()), k(other));
        assert_ne!(key("m", &turn1, &HeaderMap::new()), key("n", &turn1, &HeaderMap::new()));
    }

    #[test]
    fn explicit_keys_win_over_the_content() {
        let mut headers = HeaderMap::new();
        headers.insert(SESSION_HEADER, HeaderValue::from_static("s1"));
        let a = json!({"messages": [{"role": "user", "content": "a"}]});
        let b = json!({"messages": [{"role": "user", "content": "b"}]});
        assert_eq!(key("m", &a, &headers), key("m", &b, &headers));
        let pa = json!({"prompt_cache_key": "k", "messages": [{"role": "user", "content": "a"}]});
        let pb = json!({"prompt_cache_key": "k", "messages": [{"role": "user", "content": "b"}]});
        assert_eq!(key("m", &pa, &headers), key("m", &pb, &HeaderMap::new()));
        assert_ne!(key("m", &pa, &headers), key("m", &a, &headers));
    }

    #[test]
    fn text_prompts_are_named_by_their_start() {
        let long = "x".repeat(PROMPT_PREFIX_BYTES);
        let a = k(json!({"prompt": format!("{long} first turn")}));
        assert_eq!(a, k(json!({"prompt": format!("{long} first turn, and the second")})));
        assert_ne!(a, k(json!({"prompt": "another"})));
        assert_eq!(k(json!({"prompt": ["abc", "def"]})), k(json!({"prompt": "abc"})));
        assert!(k(json!({"prompt": [1, 2, 3]})).is_some());
        assert_eq!(k(json!({"prompt": ""})), None);
        assert_eq!(k(json!({"messages": [{"role": "system", "content": "only"}]})), None);
        assert_eq!(cut("héllo", 2), "h");
    }
}

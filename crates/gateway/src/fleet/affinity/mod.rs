//! The affinity key of a request: what says "this is the same conversation" to
//! the `cache_aware` policy, derived from the request alone so that every gateway
//! replica derives the same key.
//!
//! In order: OpenAI's `prompt_cache_key` field, then an `x-session-id` header,
//! then the start of the conversation itself: for chat, the system and developer
//! messages and the first user message (which every later turn resends
//! unchanged); for text completions, the first [`PROMPT_PREFIX_BYTES`] of the
//! prompt. Each is hashed with the model, since a prefix is only cached per model.

mod prompt_head;
mod said;

use axum::http::HeaderMap;
use serde_json::Value;

use crate::fleet::hash::Fnv;
pub use prompt_head::PromptHead;
pub use said::{Opening, Said, Turn, CHAT_PREFIX_BYTES};

/// The header clients may send to keep their requests together.
pub const SESSION_HEADER: &str = "x-session-id";

/// Bytes of a text prompt that name its conversation. Short enough to lie within
/// the first turn of most conversations, long enough to tell them apart; a first
/// prompt shorter than this hashes whole, so its second turn may move once.
pub const PROMPT_PREFIX_BYTES: usize = 256;

/// The request's affinity key, or `None` when it has nothing to derive one from.
pub fn key(model: &str, said: &Said, headers: &HeaderMap) -> Option<u64> {
    let mut h = Fnv::default();
    h.write(model.as_bytes());
    if let Some(Value::String(k)) = &said.prompt_cache_key {
        if !k.is_empty() {
            return Some(h.write(b"prompt_cache_key").write(k.as_bytes()).finish());
        }
    }
    if let Some(session) = headers.get(SESSION_HEADER).filter(|v| !v.is_empty()) {
        return Some(h.write(b"session").write(session.as_bytes()).finish());
    }
    if let Some(Opening(Some(turns))) = &said.messages {
        return chat_opening(&mut h, turns).then(|| h.finish());
    }
    // A batch names its conversation by its first prompt; a token list is a prompt.
    match said.prompt.as_ref()? {
        PromptHead::Text(text) if !text.is_empty() => {
            h.write(b"prompt").write(text.as_bytes());
        }
        PromptHead::Tokens(tokens) => {
            h.write(b"tokens");
            for t in tokens {
                h.write(t.as_bytes());
            }
        }
        _ => return None,
    }
    Some(h.finish())
}

/// Hashes the system and developer messages and the first user message; false
/// when there is no user message to name the conversation by.
fn chat_opening(h: &mut Fnv, turns: &[Turn]) -> bool {
    let mut budget = CHAT_PREFIX_BYTES;
    for turn in turns {
        let role = turn.role().unwrap_or_default();
        h.write(role.as_bytes());
        if let Some(content) = &turn.content {
            let part = cut(content.as_str(), budget);
            budget -= part.len();
            h.write(part.as_bytes());
        }
        if role == "user" || budget == 0 {
            return true;
        }
    }
    false
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

    /// The key of `body` as the gateway reads it: from its bytes.
    fn key_of(model: &str, body: &Value, headers: &HeaderMap) -> Option<u64> {
        let bytes = serde_json::to_vec(body).unwrap();
        let said: Said = serde_json::from_slice(&bytes).unwrap();
        key(model, &said, headers)
    }

    fn k(body: Value) -> Option<u64> {
        key_of("m", &body, &HeaderMap::new())
    }

    /// The key as earlier versions derived it, from the whole body built as
    /// JSON: replicas of either version must send a conversation to the same
    /// backend, so the two must agree.
    fn built_key(model: &str, body: &Value) -> Option<u64> {
        if let Some(Value::String(k)) = body.get("prompt_cache_key") {
            if !k.is_empty() {
                // The client's own key, as earlier versions hashed it.
                let mut h = Fnv::default();
                h.write(model.as_bytes());
                return Some(h.write(b"prompt_cache_key").write(k.as_bytes()).finish());
            }
        }
        let Some(Value::Array(messages)) = body.get("messages") else {
            // The prompt, as earlier versions hashed it from the built value.
            let mut h = Fnv::default();
            h.write(model.as_bytes());
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
            return Some(h.finish());
        };
        let mut h = Fnv::default();
        h.write(model.as_bytes());
        let mut budget = CHAT_PREFIX_BYTES;
        for message in messages {
            let role = message.get("role").and_then(Value::as_str).unwrap_or_default();
            h.write(role.as_bytes());
            if let Some(content) = message.get("content") {
                let text = match content {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                let part = cut(&text, budget);
                budget -= part.len();
                h.write(part.as_bytes());
            }
            if role == "user" || budget == 0 {
                return Some(h.finish());
            }
        }
        None
    }

    /// Read from the bytes, with later turns skipped and text borrowed, the key
    /// is the key of the whole body built as JSON, whatever shape its messages
    /// have.
    #[test]
    fn the_opening_read_gives_the_whole_bodys_key() {
        let long = "y".repeat(CHAT_PREFIX_BYTES + 10);
        let bodies = [
            json!({"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Tell me about Paris."},
                {"role": "assistant", "content": "A city."},
                {"role": "user", "content": [{"type": "text", "text": "And Rome?"}]}]}),
            json!({"messages": [{"role": "system", "content": long}, {"role": "user", "content": "late"}]}),
            json!({"messages": [{"role": "system", "content": "only"}]}),
            json!({"messages": "not a list", "prompt": "p"}),
            json!({"messages": {"role": "user"}, "prompt": "p"}),
            json!({"messages": null, "prompt": "p"}),
            json!({"messages": [], "prompt": "p"}),
            json!({"prompt_cache_key": "k", "messages": [1, 2]}),
            json!({"prompt_cache_key": "", "prompt": "p"}),
            json!({"prompt_cache_key": 5, "messages": [{"role": "user", "content": "u"}]}),
            json!({"prompt": ["abc", "def"]}),
            json!({"prompt": [1, 2, 3]}),
            json!({"prompt": null}),
            json!({"prompt": [[7, 8], [9]]}),
            json!({"prompt": [1.5, -2, 3]}),
            json!({"prompt": []}),
            json!({"prompt": {"a": 1}}),
            json!({"prompt": 5}),
            json!({"prompt": [null, "a"]}),
            json!({"prompt": ["é".repeat(200), "b"]}),
            json!({"prompt": (0..100).collect::<Vec<u32>>()}),
            // Escaped text (read into an owned string), content of every JSON
            // type, roles that are no string, messages that are no object.
            json!({"messages": [{"role": "system", "content": "line\nbreak \"quoted\" é"},
                {"role": "user", "content": "x"}]}),
            json!({"messages": [{"role": "developer", "content": null},
                {"role": "tool", "content": 1.5}, {"role": "tool", "content": -3},
                {"role": "tool", "content": true}, {"role": "tool", "content": {"a": [1, {"b": null}]}},
                {"role": "user", "name": "n", "content": "z"}]}),
            json!({"messages": [{"role": 5, "content": "a"}, "text", 7, [1, 2], null,
                {"content": "no role"}, {"role": ["user"], "content": "b"}, {"role": "user"}]}),
            json!({"messages": [{"role": "system", "content": "first", "role": "user"}]}),
        ];
        for body in bodies {
            assert_eq!(k(body.clone()), built_key("m", &body), "{body}");
        }
        // Repeated keys in the text of a body: the last one counts, as when built.
        let repeated =
            br#"{"messages":[{"role":"system","role":"user","content":"a","content":"b"}]}"#;
        let said: Said = serde_json::from_slice(repeated).unwrap();
        let built: Value = serde_json::from_slice(repeated).unwrap();
        assert_eq!(key("m", &said, &HeaderMap::new()), built_key("m", &built));
        assert_ne!(
            key("m", &said, &HeaderMap::new()),
            k(json!({"messages": [{"role": "user", "content": "a"}]}))
        );
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
        assert_ne!(key_of("m", &turn1, &HeaderMap::new()), key_of("n", &turn1, &HeaderMap::new()));
    }

    #[test]
    fn explicit_keys_win_over_the_content() {
        let mut headers = HeaderMap::new();
        headers.insert(SESSION_HEADER, HeaderValue::from_static("s1"));
        let a = json!({"messages": [{"role": "user", "content": "a"}]});
        let b = json!({"messages": [{"role": "user", "content": "b"}]});
        assert_eq!(key_of("m", &a, &headers), key_of("m", &b, &headers));
        let pa = json!({"prompt_cache_key": "k", "messages": [{"role": "user", "content": "a"}]});
        let pb = json!({"prompt_cache_key": "k", "messages": [{"role": "user", "content": "b"}]});
        assert_eq!(key_of("m", &pa, &headers), key_of("m", &pb, &HeaderMap::new()));
        assert_ne!(key_of("m", &pa, &headers), key_of("m", &a, &headers));
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

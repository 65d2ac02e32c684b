//! How a chat prompt ends: the assistant's turn opened for a new message (the
//! default), its last message continued (a prefill), or nothing opened.
//!
//! The rule is llama-server's, which its clients and Anthropic's rely on: a
//! conversation whose last message is the assistant's is continued from that
//! message's text, unless `continue_final_message` is `false` (vLLM's explicit
//! flag, which a client sets to have the message closed instead).

use serde_json::Value;
use slotgate_protocol::{ApiError, ChatCompletionRequest, ChatMessage, MessageContent, Role};

use crate::scheduler::Opening;

/// The opening `req` asks for; a continued message is taken off `messages`,
/// its text becoming the prefill.
pub(super) fn read(
    req: &ChatCompletionRequest,
    messages: &mut Vec<ChatMessage>,
) -> Result<Opening, ApiError> {
    let explicit = match &req.continue_final_message {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::String(s)) if s == "content" => Some(true),
        Some(_) => {
            return Err(ApiError::invalid(
                "continue_final_message",
                "continue_final_message must be true, false or \"content\"",
            ))
        }
    };
    let last_is_assistant = messages.last().is_some_and(|m| m.role == Role::Assistant);
    let continued = match explicit {
        Some(true) => true,
        Some(false) => false,
        None => last_is_assistant,
    };
    if !continued {
        return Ok(if req.add_generation_prompt == Some(false) {
            Opening::Closed
        } else {
            Opening::Assistant
        });
    }
    // Explicitly asked for, the continuation must be told not to open a new
    // turn as well, as vLLM and llama-server require.
    if explicit == Some(true) && req.add_generation_prompt != Some(false) {
        return Err(ApiError::invalid(
            "continue_final_message",
            "add_generation_prompt and continue_final_message cannot both be true",
        ));
    }
    if !last_is_assistant {
        return Err(ApiError::invalid(
            "continue_final_message",
            "continue_final_message needs the last message to be the assistant's",
        ));
    }
    if messages.len() >= 2 && messages[messages.len() - 2].role == Role::Assistant {
        let at = messages.len() - 1;
        return Err(ApiError::invalid(
            format!("messages[{at}]"),
            "two assistant messages end the conversation; only the last can be continued",
        ));
    }
    let last = messages.pop().unwrap_or_else(|| ChatMessage::new(Role::Assistant, ""));
    if last.tool_calls.as_ref().and_then(Value::as_array).is_some_and(|c| !c.is_empty()) {
        let at = messages.len();
        return Err(ApiError::invalid(
            format!("messages[{at}].tool_calls"),
            "an assistant message that calls tools cannot be continued",
        ));
    }
    Ok(Opening::Continue(text(last.content.as_ref())))
}

/// The text a continued message goes on from: its parts joined by a blank
/// line, as llama-server joins them.
fn text(content: Option<&MessageContent>) -> String {
    match content {
        None => String::new(),
        Some(MessageContent::Text(text)) => text.clone(),
        Some(MessageContent::Parts(parts)) => {
            let texts: Vec<&str> = parts.iter().filter_map(|p| p.text.as_deref()).collect();
            texts.join("\n\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(extra: Value) -> ChatCompletionRequest {
        let mut body = json!({"model": "m", "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Wh"},
                                              {"type": "text", "text": "ill"}]}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(body).unwrap()
    }

    fn opening(extra: Value) -> (Result<Opening, ApiError>, usize) {
        let req = request(extra);
        let mut messages = req.messages.clone();
        (read(&req, &mut messages), messages.len())
    }

    #[test]
    fn a_last_assistant_message_is_continued_by_default() {
        let (got, left) = opening(json!({}));
        assert_eq!(got.unwrap(), Opening::Continue("Wh\n\nill".into()));
        assert_eq!(left, 1);
    }

    #[test]
    fn continuing_explicitly_needs_the_generation_prompt_off() {
        let (got, _) = opening(json!({"continue_final_message": true}));
        assert!(got.unwrap_err().message.contains("cannot both be true"));
        let both = json!({"continue_final_message": true, "add_generation_prompt": true});
        assert!(opening(both).0.is_err());
        let (got, _) =
            opening(json!({"continue_final_message": true, "add_generation_prompt": false}));
        assert!(matches!(got.unwrap(), Opening::Continue(_)));
    }

    #[test]
    fn false_closes_the_message_instead() {
        let (got, left) = opening(json!({"continue_final_message": false}));
        assert_eq!((got.unwrap(), left), (Opening::Assistant, 2));
        let (got, _) =
            opening(json!({"continue_final_message": false, "add_generation_prompt": false}));
        assert_eq!(got.unwrap(), Opening::Closed);
    }

    #[test]
    fn what_cannot_be_continued_is_refused() {
        let mut req = request(json!({}));
        req.messages.insert(1, ChatMessage::new(Role::Assistant, "Hello"));
        assert!(read(&req, &mut req.messages.clone()).is_err());
        let mut req = request(json!({}));
        req.messages[1].tool_calls = Some(json!([{"id": "c", "type": "function"}]));
        assert!(read(&req, &mut req.messages.clone()).is_err());
        let mut req = request(json!({"continue_final_message": "content",
            "add_generation_prompt": false}));
        req.messages.pop();
        assert!(read(&req, &mut req.messages.clone()).is_err());
        assert!(opening(json!({"continue_final_message": 3})).0.is_err());
    }
}

//! A chat completion as the Messages answer it means: its text as a `text`
//! block, each tool call as a `tool_use` block with its arguments parsed as the
//! input, the finish reason as a stop reason, the usage split as Anthropic
//! splits it.

use serde_json::Value;

use super::{Block, Message, Usage};
use crate::{ChatCompletion, FinishReason, StopReason};

/// The stop reason and stop sequence of a chat finish reason and the stop
/// string that ended the choice, if one did (vLLM's `stop_reason`, which the
/// engine sends): `end_turn` where it stopped by itself.
pub fn stop_reason(
    reason: Option<FinishReason>,
    stop: Option<&StopReason>,
) -> (&'static str, Option<String>) {
    match (reason, stop) {
        (Some(FinishReason::Length), _) => ("max_tokens", None),
        (Some(FinishReason::ToolCalls), _) => ("tool_use", None),
        (_, Some(StopReason::Text(text))) => ("stop_sequence", Some(text.clone())),
        _ => ("end_turn", None),
    }
}

/// A tool call's arguments as a `tool_use` input: the JSON object they hold,
/// or, should they not parse (a call cut off by `max_tokens`), an empty one.
pub fn input_of(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => Value::Object(serde_json::Map::new()),
    }
}

/// The id of a Messages answer made from the chat answer `id`.
pub fn message_id(id: &str) -> String {
    format!("msg_{}", id.strip_prefix("chatcmpl-").unwrap_or(id))
}

impl Message {
    /// The Messages answer of a chat completion's first choice.
    pub fn from_chat(chat: &ChatCompletion) -> Self {
        let choice = chat.choices.first();
        let mut content = Vec::new();
        let text = choice.and_then(|c| c.message.content.clone()).unwrap_or_default();
        if !text.is_empty() {
            content.push(Block::Text { text: text.clone() });
        }
        for call in choice.and_then(|c| c.message.tool_calls.as_deref()).unwrap_or_default() {
            content.push(Block::ToolUse {
                id: call.id.clone(),
                name: call.function.name.clone(),
                input: input_of(&call.function.arguments),
            });
        }
        let stop = choice.and_then(|c| c.stop_reason.as_ref());
        let (stop_reason, stop_sequence) = stop_reason(choice.and_then(|c| c.finish_reason), stop);
        Self {
            id: message_id(&chat.id),
            kind: "message".into(),
            role: "assistant".into(),
            content,
            model: chat.model.clone(),
            stop_reason: Some(stop_reason.into()),
            stop_sequence,
            usage: chat.usage.as_ref().map(Usage::of).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chat(choice: serde_json::Value) -> ChatCompletion {
        serde_json::from_value(json!({"id": "chatcmpl-9", "object": "chat.completion",
            "created": 0, "model": "m", "choices": [choice],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}))
        .unwrap()
    }

    #[test]
    fn text_and_calls_become_blocks_and_the_stop_string_its_sequence() {
        let answer = Message::from_chat(&chat(json!({"index": 0, "finish_reason": "stop",
            "stop_reason": "END", "message": {"role": "assistant", "content": "1 2 3"}})));
        assert_eq!(answer.id, "msg_9");
        assert_eq!(answer.content, [Block::Text { text: "1 2 3".into() }]);
        assert_eq!(answer.stop_reason.as_deref(), Some("stop_sequence"));
        assert_eq!(answer.stop_sequence.as_deref(), Some("END"));
        assert_eq!((answer.usage.input_tokens, answer.usage.output_tokens), (7, 3));

        let answer = Message::from_chat(&chat(json!({"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
            "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}})));
        assert_eq!(
            answer.content,
            [Block::ToolUse { id: "call_1".into(), name: "f".into(), input: json!({"a": 1}) }]
        );
        assert_eq!(answer.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!(answer.stop_sequence, None);

        let answer = Message::from_chat(&chat(json!({"index": 0, "finish_reason": "length",
            "message": {"role": "assistant", "content": "1"}})));
        assert_eq!(answer.stop_reason.as_deref(), Some("max_tokens"));
    }
}

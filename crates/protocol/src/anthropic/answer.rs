//! A chat completion as the Messages answer it means: its text as a `text`
//! block, each tool call as a `tool_use` block with its arguments parsed as the
//! input, the finish reason as a stop reason, the usage split as Anthropic
//! splits it.

use serde_json::Value;

use super::{Block, Message, Usage};
use crate::{ChatCompletion, FinishReason};

/// The stop reason of a chat finish reason. A chat answer does not say whether
/// it stopped at the end of its turn or at a stop sequence: both are
/// `end_turn` here, and `stop_sequence` is never reported.
pub fn stop_reason(reason: Option<FinishReason>) -> &'static str {
    match reason {
        Some(FinishReason::Length) => "max_tokens",
        Some(FinishReason::ToolCalls) => "tool_use",
        _ => "end_turn",
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
        let reason = choice.and_then(|c| c.finish_reason);
        Self {
            id: message_id(&chat.id),
            kind: "message".into(),
            role: "assistant".into(),
            content,
            model: chat.model.clone(),
            stop_reason: Some(stop_reason(reason).into()),
            stop_sequence: None,
            usage: chat.usage.as_ref().map(Usage::of).unwrap_or_default(),
        }
    }
}

//! A Responses answer, built from what the chat produced ([`Outcome`]) and
//! what the request said ([`Echo`]): its `output` items (a `message` with its
//! `output_text`, then each `function_call`), its status, and its usage.

use serde_json::{json, Value};

use super::ResponsesRequest;
use crate::{ChatCompletion, ChatMessage, FinishReason, Role, ToolCall, Usage};

/// What the chat produced: its text, its calls, why it stopped, its tokens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// The answer's text.
    pub text: String,
    /// The calls it made.
    pub calls: Vec<ToolCall>,
    /// Why it stopped; `None` while it runs.
    pub reason: Option<FinishReason>,
    /// Its token counts, once known.
    pub usage: Option<Usage>,
}

impl Outcome {
    /// The outcome of a chat completion's first choice.
    pub fn of_chat(chat: &ChatCompletion) -> Self {
        let choice = chat.choices.first();
        Self {
            text: choice.and_then(|c| c.message.content.clone()).unwrap_or_default(),
            calls: choice.and_then(|c| c.message.tool_calls.clone()).unwrap_or_default(),
            reason: choice.and_then(|c| c.finish_reason),
            usage: chat.usage.clone(),
        }
    }

    /// The assistant's turn, as a follow-up's conversation carries it.
    pub fn as_message(&self) -> ChatMessage {
        let mut message = ChatMessage::new(Role::Assistant, self.text.clone());
        if !self.calls.is_empty() {
            message.tool_calls = serde_json::to_value(&self.calls).ok();
            if self.text.is_empty() {
                message.content = None;
            }
        }
        message
    }
}

/// What a response says of its request, and its own id and time.
#[derive(Debug, Clone, PartialEq)]
pub struct Echo {
    /// `resp_...`.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The model that answers, by its own name.
    pub model: String,
    /// The request's fields a response repeats.
    request: Value,
}

impl Echo {
    /// The echo of `req`, answered by `model` as `id` at `created_at`.
    pub fn of(req: &ResponsesRequest, id: String, created_at: u64, model: String) -> Self {
        let format = req.text.clone().unwrap_or_else(|| json!({"format": {"type": "text"}}));
        let request = json!({
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata.clone().unwrap_or_else(|| json!({})),
            "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(false),
            "previous_response_id": req.previous_response_id,
            "store": req.stores(),
            "temperature": req.temperature.unwrap_or(1.0),
            "text": format,
            "tool_choice": req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            "tools": req.tools.clone().unwrap_or_default(),
            "top_p": req.top_p.unwrap_or(1.0),
        });
        Self { id, created_at, model, request }
    }

    /// The id of the message item.
    pub fn message_id(&self) -> String {
        format!("msg_{}", self.suffix())
    }

    /// The id of function call item `k`.
    pub fn call_id(&self, k: usize) -> String {
        format!("fc_{}_{k}", self.suffix())
    }

    fn suffix(&self) -> &str {
        self.id.strip_prefix("resp_").unwrap_or(&self.id)
    }

    /// The whole response: `status` `in_progress` (no output yet), or from
    /// `outcome` `completed`, `incomplete` (cut off by `max_output_tokens`).
    pub fn response(&self, outcome: Option<&Outcome>) -> Value {
        let (status, incomplete) = match outcome.and_then(|o| o.reason) {
            None => ("in_progress", Value::Null),
            Some(FinishReason::Length) => ("incomplete", json!({"reason": "max_output_tokens"})),
            Some(_) => ("completed", Value::Null),
        };
        let mut response = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": (status == "completed").then(unix_now),
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": outcome.map(|o| self.items(o)).unwrap_or_default(),
            "truncation": "disabled",
        });
        // No usage until it is known: the schema has no null for it.
        if let Some(u) = outcome.and_then(|o| o.usage.as_ref()) {
            response["usage"] = usage(u);
        }
        if let (Value::Object(out), Value::Object(echo)) = (&mut response, &self.request) {
            out.extend(echo.clone());
        }
        response
    }

    /// The output items of `outcome`: its text as a message, then its calls.
    pub fn items(&self, outcome: &Outcome) -> Vec<Value> {
        let mut items = Vec::with_capacity(1 + outcome.calls.len());
        if !outcome.text.is_empty() || outcome.calls.is_empty() {
            items.push(self.message(&outcome.text, "completed"));
        }
        for (k, call) in outcome.calls.iter().enumerate() {
            items.push(self.call(k, call, "completed"));
        }
        items
    }

    /// The message item with `text`.
    pub fn message(&self, text: &str, status: &str) -> Value {
        let content = if status == "completed" { vec![text_part(text)] } else { Vec::new() };
        json!({"type": "message", "id": self.message_id(), "status": status, "role": "assistant",
            "content": content})
    }

    /// Function call item `k`.
    pub fn call(&self, k: usize, call: &ToolCall, status: &str) -> Value {
        json!({"type": "function_call", "id": self.call_id(k), "call_id": call.id,
            "name": call.function.name, "arguments": call.function.arguments, "status": status})
    }
}

/// Unix seconds now: a response's `completed_at`, which only a completed one has.
fn unix_now() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_secs())
}

/// An `output_text` part.
pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// Chat's usage as a response's.
pub fn usage(u: &Usage) -> Value {
    let cached = u.prompt_tokens_details.as_ref().map_or(0, |d| d.cached_tokens);
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

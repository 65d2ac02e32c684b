//! A streamed chat completion as the Messages events it means, chunk by chunk:
//! `message_start` and a `ping` first, each run of text a `text` block and each
//! tool call a `tool_use` block (its arguments as `input_json_delta`s), each
//! block opened and closed, then `message_delta` (stop reason and usage) and
//! `message_stop`. An error becomes an `error` event.

use serde_json::{json, Value};

use super::answer::{message_id, stop_reason};
use super::Usage;
use crate::{ApiError, ChatCompletionChunk, FinishReason, StopReason};

/// Turns the chunks of one streamed chat answer (its first choice) into
/// Messages events.
#[derive(Debug, Default)]
pub struct Translator {
    /// Whether `message_start` was sent.
    started: bool,
    /// The block open now, and what it is.
    open: Option<Open>,
    /// The index of the next block.
    next: u32,
    reason: Option<FinishReason>,
    /// The stop string that ended the answer, if one did.
    stop: Option<StopReason>,
    usage: Usage,
    /// Whether `message_stop` (or an error) was sent.
    ended: bool,
    /// The prompt's tokens, for `message_start`.
    input_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text(u32),
    /// A tool call, by its position among the answer's calls.
    Tool(u32, u32),
}

/// One server-sent event of the Messages stream.
fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

impl Translator {
    /// A translator whose `message_start` says the prompt has `input_tokens`
    /// (all of them: which were cached is known at the end, and
    /// `message_delta` then counts the others as `input_tokens`).
    pub fn with_input_tokens(input_tokens: u32) -> Self {
        Self { input_tokens, ..Self::default() }
    }

    /// The events of `chunk`.
    pub fn chunk(&mut self, chunk: &ChatCompletionChunk) -> String {
        let mut out = self.start(&chunk.id, &chunk.model);
        if let Some(usage) = &chunk.usage {
            self.usage = Usage::of(usage);
        }
        let Some(choice) = chunk.choices.iter().find(|c| c.index == 0) else { return out };
        if let Some(text) = choice.delta.content.as_deref().filter(|t| !t.is_empty()) {
            let index = match self.open {
                Some(Open::Text(index)) => index,
                _ => {
                    let block = json!({"type": "text", "text": ""});
                    out.push_str(&self.open_block(Open::Text(self.next), block));
                    self.next - 1
                }
            };
            let delta = json!({"type": "text_delta", "text": text});
            out.push_str(&delta_event(index, delta));
        }
        for call in choice.delta.tool_calls.as_deref().unwrap_or_default() {
            let index = match self.open {
                Some(Open::Tool(index, position)) if position == call.index => index,
                _ => {
                    let id = call.id.clone().unwrap_or_else(|| format!("toolu_{}", call.index));
                    let name = call.function.name.clone().unwrap_or_default();
                    let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                    out.push_str(&self.open_block(Open::Tool(self.next, call.index), block));
                    self.next - 1
                }
            };
            if let Some(part) = call.function.arguments.as_deref().filter(|a| !a.is_empty()) {
                let delta = json!({"type": "input_json_delta", "partial_json": part});
                out.push_str(&delta_event(index, delta));
            }
        }
        if let Some(reason) = choice.finish_reason {
            self.reason = Some(reason);
            self.stop = choice.stop_reason.clone();
            out.push_str(&self.close());
        }
        out
    }

    /// The last events, once the chat stream has ended.
    pub fn finish(&mut self) -> String {
        if self.ended {
            return String::new();
        }
        self.ended = true;
        let mut out = self.start("", "");
        out.push_str(&self.close());
        let usage = self.usage;
        let (reason, sequence) = stop_reason(self.reason, self.stop.as_ref());
        let delta = json!({"stop_reason": reason, "stop_sequence": sequence});
        let data = json!({"type": "message_delta", "delta": delta, "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens,
            "cache_creation_input_tokens": 0,
        }});
        out.push_str(&event("message_delta", &data));
        out.push_str(&event("message_stop", &json!({"type": "message_stop"})));
        out
    }

    /// The event of an error that ended the stream.
    pub fn error(&mut self, err: &ApiError) -> String {
        self.ended = true;
        let (_, envelope) = super::error(err);
        event("error", &serde_json::to_value(envelope).unwrap_or(Value::Null))
    }

    /// `message_start` and a `ping`, once.
    fn start(&mut self, id: &str, model: &str) -> String {
        if self.started {
            return String::new();
        }
        self.started = true;
        let message = json!({
            "id": message_id(id), "type": "message", "role": "assistant", "content": [],
            "model": model, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0,
                "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
        });
        event("message_start", &json!({"type": "message_start", "message": message}))
            + &event("ping", &json!({"type": "ping"}))
    }

    /// Closes the open block, if any, and opens `open` as `block`.
    fn open_block(&mut self, open: Open, block: Value) -> String {
        let mut out = self.close();
        let index = self.next;
        self.next += 1;
        self.open = Some(open);
        let data = json!({"type": "content_block_start", "index": index, "content_block": block});
        out.push_str(&event("content_block_start", &data));
        out
    }

    fn close(&mut self) -> String {
        match self.open.take() {
            Some(Open::Text(index) | Open::Tool(index, _)) => {
                event("content_block_stop", &json!({"type": "content_block_stop", "index": index}))
            }
            None => String::new(),
        }
    }
}

fn delta_event(index: u32, delta: Value) -> String {
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(value: Value) -> ChatCompletionChunk {
        let mut base = json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 0,
            "model": "m", "choices": []});
        for (k, v) in value.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    fn names(events: &str) -> Vec<&str> {
        events.lines().filter_map(|l| l.strip_prefix("event: ")).collect()
    }

    /// Text then a call: each its own block, opened and closed in order, the
    /// arguments as JSON pieces, then the stop reason and the usage.
    #[test]
    fn text_then_a_call_make_two_blocks() {
        let mut t = Translator::default();
        let mut out = t.chunk(&chunk(json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": null}]})));
        out += &t.chunk(&chunk(json!({"choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": null}]})));
        out += &t.chunk(&chunk(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]}, "finish_reason": null}]})));
        out += &t.chunk(&chunk(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":1}"}}]}, "finish_reason": "tool_calls"}]})));
        out += &t.chunk(&chunk(json!({"usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14, "prompt_tokens_details": {"cached_tokens": 6}}})));
        out += &t.finish();
        assert_eq!(
            names(&out),
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert!(out.contains(r#""id":"msg_7""#), "{out}");
        assert!(
            out.contains(r#"{"partial_json":"{\"a\":1}","type":"input_json_delta"}"#)
                || out.contains(r#""partial_json":"{\"a\":1}""#),
            "{out}"
        );
        assert!(out.contains(r#""stop_reason":"tool_use""#), "{out}");
        assert!(
            out.contains(r#""input_tokens":4"#) && out.contains(r#""cache_read_input_tokens":6"#),
            "{out}"
        );
        assert_eq!(t.finish(), "", "once");
    }

    /// A stop string that ended the answer is its stop sequence; a finish by
    /// itself is the end of the turn.
    #[test]
    fn a_stop_string_is_the_stop_sequence() {
        let mut t = Translator::default();
        let mut out = t.chunk(&chunk(
            json!({"choices": [{"index": 0, "delta": {"content": "1 2"}, "finish_reason": null}]}),
        ));
        out += &t.chunk(&chunk(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]})));
        out += &t.finish();
        assert!(out.contains(r#""stop_reason":"stop_sequence","stop_sequence":"END""#), "{out}");
        let mut t = Translator::default();
        let out = t.chunk(&chunk(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        )) + &t.finish();
        assert!(out.contains(r#""stop_reason":"end_turn","stop_sequence":null"#), "{out}");
    }

    #[test]
    fn an_error_is_an_error_event() {
        let mut t = Translator::default();
        let out = t.error(&ApiError::new(crate::ErrorType::UnavailableError, "full"));
        assert_eq!(out, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"full\"}}\n\n");
    }
}

//! A streamed chat completion as the Responses events it means, each numbered
//! by `sequence_number`: `response.created` and `response.in_progress`; for
//! text, `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`s and their `.done`s; for each call,
//! `response.output_item.added`, `response.function_call_arguments.delta`s and
//! their `.done`s; then `response.completed` (or `response.incomplete`) with the
//! whole response, or `error` and `response.failed`.

use serde_json::{json, Value};

use super::output::{text_part, Echo, Outcome};
use crate::{ApiError, ChatCompletionChunk, FinishReason, ToolCall};

/// Turns the chunks of one streamed chat answer (its first choice) into
/// Responses events, keeping the outcome for the final response.
#[derive(Debug)]
pub struct Translator {
    echo: Echo,
    seq: u64,
    outcome: Outcome,
    /// The output item open now.
    open: Option<Open>,
    /// The index of the next output item.
    next: u32,
    ended: bool,
    /// llama-server's latest `timings`, for the completed response.
    timings: Option<crate::native::Timings>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Message(u32),
    /// Call `k` of the outcome, at output index `.0`, by its position in the chat's calls.
    Call(u32, usize, u32),
}

impl Translator {
    /// A translator for the response `echo` describes.
    pub fn new(echo: Echo) -> Self {
        let outcome = Outcome::default();
        Self { echo, seq: 0, outcome, open: None, next: 0, ended: false, timings: None }
    }

    /// What was produced so far.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    fn event(&mut self, kind: &str, mut data: Value) -> String {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        format!("event: {kind}\ndata: {data}\n\n")
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> String {
        let response = self.echo.response(None);
        self.event("response.created", json!({"response": response.clone()}))
            + &self.event("response.in_progress", json!({"response": response}))
    }

    /// The events of `chunk`.
    pub fn chunk(&mut self, chunk: &ChatCompletionChunk) -> String {
        let mut out = String::new();
        if let Some(usage) = &chunk.usage {
            self.outcome.usage = Some(usage.clone());
        }
        self.timings = chunk.timings.or(self.timings);
        if let Some(progress) = &chunk.prompt_progress {
            // llama-server's telemetry: how far the prompt has been read.
            let response = self.echo.response(None);
            out.push_str(&self.event(
                "response.in_progress",
                json!({"response": response, "prompt_progress": progress, "timings": chunk.timings}),
            ));
        }
        let Some(choice) = chunk.choices.iter().find(|c| c.index == 0) else { return out };
        if let Some(text) = choice.delta.content.as_deref().filter(|t| !t.is_empty()) {
            let index = match self.open {
                Some(Open::Message(index)) => index,
                _ => {
                    let (events, index) = self.open_message();
                    out.push_str(&events);
                    index
                }
            };
            self.outcome.text.push_str(text);
            let item_id = self.echo.message_id();
            let mut delta = json!({"item_id": item_id,
                "output_index": index, "content_index": 0, "delta": text, "logprobs": []});
            if let Some(timings) = chunk.timings {
                delta["timings"] = json!(timings);
            }
            out.push_str(&self.event("response.output_text.delta", delta));
        }
        for call in choice.delta.tool_calls.as_deref().unwrap_or_default() {
            let (index, k) = match self.open {
                Some(Open::Call(index, k, position)) if position == call.index => (index, k),
                _ => {
                    out.push_str(&self.close());
                    let k = self.outcome.calls.len();
                    let id = call.id.clone().unwrap_or_else(|| format!("call_{k}"));
                    let name = call.function.name.clone().unwrap_or_default();
                    self.outcome.calls.push(ToolCall::new(id, name, String::new()));
                    let index = self.next;
                    self.next += 1;
                    self.open = Some(Open::Call(index, k, call.index));
                    let item = self.echo.call(k, &self.outcome.calls[k], "in_progress");
                    out.push_str(&self.event(
                        "response.output_item.added",
                        json!({"output_index": index, "item": item}),
                    ));
                    (index, k)
                }
            };
            if let Some(piece) = call.function.arguments.as_deref().filter(|a| !a.is_empty()) {
                self.outcome.calls[k].function.arguments.push_str(piece);
                let item_id = self.echo.call_id(k);
                out.push_str(&self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": index, "delta": piece}),
                ));
            }
        }
        if let Some(reason) = choice.finish_reason {
            self.outcome.reason = Some(reason);
            out.push_str(&self.close());
        }
        out
    }

    /// The last events once the chat stream has ended, and the whole response
    /// (for the store); nothing the second time.
    pub fn finish(&mut self) -> (String, Option<Value>) {
        if self.ended {
            return (String::new(), None);
        }
        self.ended = true;
        let mut out = self.close();
        if self.next == 0 {
            // An empty answer is still one message, as the whole response says.
            let (events, _) = self.open_message();
            out.push_str(&events);
            out.push_str(&self.close());
        }
        self.outcome.reason.get_or_insert(FinishReason::Stop);
        let response = self.echo.response(Some(&self.outcome));
        let kind = if response["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let mut data = json!({"response": response.clone()});
        if let Some(timings) = self.timings {
            data["timings"] = json!(timings);
        }
        out.push_str(&self.event(kind, data));
        (out, Some(response))
    }

    /// `error` and `response.failed`, for an error that ended the stream.
    pub fn error(&mut self, err: &ApiError) -> String {
        self.ended = true;
        let error = error_event(err, self.seq);
        self.seq += 1;
        let mut out = format!("event: error\ndata: {error}\n\n");
        let mut response = self.echo.response(Some(&self.outcome));
        response["status"] = json!("failed");
        response["error"] = json!({"code": "server_error", "message": err.message});
        out.push_str(&self.event("response.failed", json!({"response": response})));
        out
    }

    /// Opens the message item: its `added` events, and its output index.
    fn open_message(&mut self) -> (String, u32) {
        let mut out = self.close();
        let index = self.next;
        self.next += 1;
        self.open = Some(Open::Message(index));
        let item = self.echo.message("", "in_progress");
        let item_id = self.echo.message_id();
        out.push_str(
            &self.event("response.output_item.added", json!({"output_index": index, "item": item})),
        );
        out.push_str(&self.event(
            "response.content_part.added",
            json!({"item_id": item_id,
            "output_index": index, "content_index": 0, "part": text_part("")}),
        ));
        (out, index)
    }

    /// Closes the open item with its `done` events.
    fn close(&mut self) -> String {
        match self.open.take() {
            Some(Open::Message(index)) => {
                let (item_id, text) = (self.echo.message_id(), self.outcome.text.clone());
                self.event(
                    "response.output_text.done",
                    json!({"item_id": item_id,
                    "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                ) + &self.event(
                    "response.content_part.done",
                    json!({"item_id": item_id,
                        "output_index": index, "content_index": 0, "part": text_part(&text)}),
                ) + &self.event(
                    "response.output_item.done",
                    json!({"output_index": index,
                        "item": self.echo.message(&text, "completed")}),
                )
            }
            Some(Open::Call(index, k, _)) => {
                let call = self.outcome.calls[k].clone();
                self.event("response.function_call_arguments.done", json!({"item_id": self.echo.call_id(k),
                    "output_index": index, "name": call.function.name, "arguments": call.function.arguments}))
                    + &self.event("response.output_item.done", json!({"output_index": index,
                        "item": self.echo.call(k, &call, "completed")}))
            }
            None => String::new(),
        }
    }
}

/// The data of the `error` event numbered `sequence_number` that reports `err`;
/// also what a gateway sends when it cuts a Responses stream short.
pub fn error_event(err: &ApiError, sequence_number: u64) -> Value {
    let code = err.code.clone().unwrap_or_else(|| "server_error".into());
    json!({"type": "error", "code": code, "message": err.message, "param": err.param,
        "sequence_number": sequence_number})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::ResponsesRequest;

    fn chunk(value: Value) -> ChatCompletionChunk {
        let mut base = json!({"id": "c", "object": "chat.completion.chunk", "created": 0,
            "model": "m", "choices": []});
        for (k, v) in value.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    /// Text then a call, numbered in order, ending with the whole response,
    /// whose output is what the events built.
    #[test]
    fn text_then_a_call_are_two_items_and_the_response_holds_both() {
        let req: ResponsesRequest =
            serde_json::from_value(json!({"model": "m", "input": "x"})).unwrap();
        let mut t = Translator::new(Echo::of(&req, "resp_1".into(), 0, "m".into()));
        let mut out = t.start();
        out += &t.chunk(&chunk(
            json!({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]}),
        ));
        out += &t.chunk(&chunk(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{\"a\""}}]}, "finish_reason": null}]})));
        out += &t.chunk(&chunk(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}, "finish_reason": "tool_calls"}]})));
        out += &t.chunk(&chunk(
            json!({"usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}),
        ));
        let (last, response) = t.finish();
        out += &last;
        let kinds: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = out
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str::<Value>(d).unwrap()["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers, (0..14).collect::<Vec<_>>());
        let response = response.unwrap();
        assert_eq!(response["status"], "completed");
        assert_eq!(response["output"][0]["content"][0]["text"], "Hi");
        assert_eq!(response["output"][1]["call_id"], "call_9");
        assert_eq!(response["output"][1]["arguments"], "{\"a\":1}");
        assert_eq!(response["usage"]["total_tokens"], 8);
    }
}

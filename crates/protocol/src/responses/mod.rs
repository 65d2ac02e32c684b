//! OpenAI's Responses API (`POST /v1/responses` and its stored responses) as
//! the official SDKs send and read it, and its one translation to and from
//! Chat Completions: a request is the chat its input (after the conversation
//! of `previous_response_id`) translates to ([`ResponsesRequest::to_chat`]),
//! and the answer is built from what the chat produced ([`output`], [`stream`]).

pub mod output;
pub mod stream;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::{
    ApiError, ChatCompletionRequest, ChatMessage, FunctionDef, ResponseFormat, Role, Sampling,
    StreamOptions, Tool,
};

/// Chat's names of the fields a Responses request sets, and the request's own:
/// a refusal of the chat it translates to names them so
/// ([`ApiError::renamed`]).
pub const FIELD_NAMES: &[(&str, &str)] = &[
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("messages", "input"),
    (".function.parameters", ".parameters"),
];

/// The header with which a gateway tells an engine whose a request is (a
/// digest of its key): a stored response is found again only by its owner.
pub const OWNER_HEADER: &str = "x-slotgate-owner";

/// The engine instance a response id names (`resp_` and the 16 hex digits of
/// the engine's `/health` `instance`), for a gateway to send its follow-ups to.
pub fn instance_of(id: &str) -> Option<&str> {
    let hex = id.strip_prefix("resp_")?.get(..16)?;
    hex.bytes().all(|b| b.is_ascii_hexdigit()).then_some(hex)
}

/// The body of `POST /v1/responses`. Fields this server does not use
/// (`reasoning`, `include`, `truncation`, `user`, ...) are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponsesRequest {
    /// The model asked for; left out, the only one served.
    #[serde(default)]
    pub model: String,
    /// A string (one user message) or a list of input items.
    #[serde(default)]
    pub input: Value,
    /// A system message put first; not carried on to follow-up responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Tools: function tools only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// `auto`, `none`, `required`, or `{"type": "function", "name": ...}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Whether several calls may come in one answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {...}}`: `text`, `json_object` or `json_schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Value>,
    /// The caller's labels, echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Whether the response is kept for `previous_response_id` and `GET`
    /// (default true, as OpenAI's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// The response this one continues: its conversation comes first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    /// Whether the answer is streamed as events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// vLLM's extension, as on chat: the prompt cache's salt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    /// llama-server's `timings_per_token` (its Responses stream carries them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings_per_token: Option<bool>,
    /// llama-server's `return_progress`: `response.in_progress` events with
    /// `prompt_progress` while the prompt is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_progress: Option<bool>,
}

impl ResponsesRequest {
    /// Whether the response is kept.
    pub fn stores(&self) -> bool {
        self.store.unwrap_or(true)
    }

    /// This request's input as chat messages, after `previous` (the stored
    /// conversation it continues); a 400 naming the item chat cannot carry.
    pub fn conversation(&self, previous: &[ChatMessage]) -> Result<Vec<ChatMessage>, ApiError> {
        let mut messages = previous.to_vec();
        match &self.input {
            Value::String(text) => messages.push(ChatMessage::new(Role::User, text.clone())),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    input_item(&mut messages, item, i)?;
                }
            }
            Value::Null if !messages.is_empty() => {}
            _ => {
                return Err(ApiError::invalid("input", "input must be a string or a list of items"))
            }
        }
        Ok(messages)
    }

    /// The chat request for `conversation` (from [`Self::conversation`]), with
    /// the instructions first.
    pub fn to_chat(
        &self,
        conversation: Vec<ChatMessage>,
    ) -> Result<ChatCompletionRequest, ApiError> {
        let mut messages = Vec::with_capacity(conversation.len() + 1);
        if let Some(instructions) = self.instructions.as_ref().filter(|i| !i.is_empty()) {
            messages.push(ChatMessage::new(Role::System, instructions.clone()));
        }
        messages.extend(conversation);
        let mut chat = ChatCompletionRequest::new(self.model.clone(), messages);
        chat.max_completion_tokens = self.max_output_tokens;
        let stream = self.stream.unwrap_or(false);
        chat.sampling = Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            stream: self.stream,
            stream_options: stream.then_some(StreamOptions { include_usage: Some(true) }),
            cache_salt: self.cache_salt.clone(),
            timings_per_token: self.timings_per_token,
            return_progress: self.return_progress,
            ..Sampling::default()
        };
        if let Some(tools) = &self.tools {
            chat.tools =
                Some(tools.iter().enumerate().map(|(i, t)| tool(t, i)).collect::<Result<_, _>>()?);
        }
        chat.tool_choice = match &self.tool_choice {
            Some(Value::Object(choice)) if choice.get("type") == Some(&json!("function")) => {
                Some(json!({"type": "function", "function": {"name": choice.get("name")}}))
            }
            other => other.clone(),
        };
        chat.parallel_tool_calls = self.parallel_tool_calls;
        chat.response_format = self.format()?;
        Ok(chat)
    }

    /// `text.format` as chat's `response_format`.
    fn format(&self) -> Result<Option<ResponseFormat>, ApiError> {
        let Some(format) = self.text.as_ref().and_then(|t| t.get("format")) else {
            return Ok(None);
        };
        let kind = format.get("type").and_then(Value::as_str).unwrap_or("text");
        match kind {
            "text" => Ok(None),
            "json_object" => Ok(Some(ResponseFormat { kind: kind.into(), rest: Map::new() })),
            "json_schema" => {
                let mut schema = format.as_object().cloned().unwrap_or_default();
                schema.remove("type");
                let mut rest = Map::new();
                rest.insert("json_schema".into(), Value::Object(schema));
                Ok(Some(ResponseFormat { kind: kind.into(), rest }))
            }
            other => Err(ApiError::invalid(
                "text.format.type",
                format!("`{other}` is not a known format"),
            )),
        }
    }
}

/// Appends one input item as chat messages.
fn input_item(out: &mut Vec<ChatMessage>, item: &Value, i: usize) -> Result<(), ApiError> {
    let at = |field: &str| format!("input[{i}]{field}");
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
    match kind {
        "message" => {
            let role = match item.get("role").and_then(Value::as_str) {
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                Some("system" | "developer") => Role::System,
                _ => {
                    return Err(ApiError::invalid(
                        at(".role"),
                        "a message's role must be user, assistant, system or developer",
                    ))
                }
            };
            let text = content_text(item.get("content"), &at(".content"))?;
            out.push(ChatMessage::new(role, text));
        }
        "function_call" => {
            let field = |name: &str| {
                item.get(name).and_then(Value::as_str).map(str::to_owned).ok_or_else(|| {
                    ApiError::invalid(
                        at(&format!(".{name}")),
                        format!("a function_call needs `{name}`"),
                    )
                })
            };
            let call = json!({"id": field("call_id")?, "type": "function",
                "function": {"name": field("name")?, "arguments": field("arguments")?}});
            // Calls that follow one another are one assistant message's calls.
            match out.last_mut() {
                Some(last) if last.role == Role::Assistant && last.tool_calls.is_some() => {
                    if let Some(Value::Array(calls)) = last.tool_calls.as_mut() {
                        calls.push(call);
                    }
                }
                _ => {
                    let mut message = ChatMessage::new(Role::Assistant, "");
                    message.content = None;
                    message.tool_calls = Some(json!([call]));
                    out.push(message);
                }
            }
        }
        "function_call_output" => {
            let call_id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(at(".call_id"), "a function_call_output needs `call_id`")
            })?;
            let output = content_text(item.get("output"), &at(".output"))?;
            let mut message = ChatMessage::new(Role::Tool, output);
            message.tool_call_id = Some(call_id.to_owned());
            out.push(message);
        }
        // A reasoning model's summary, sent back by clients such as Codex:
        // this server's models write none, and it adds nothing to the prompt.
        "reasoning" => {}
        other => {
            return Err(ApiError::invalid(
                at(".type"),
                format!("input items of type `{other}` are not supported by this server"),
            ))
        }
    }
    Ok(())
}

/// The text of a message's content: a string, or its text parts joined.
fn content_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match content {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        text.push(part.get("text").and_then(Value::as_str).unwrap_or_default());
                    }
                    kind => {
                        return Err(ApiError::invalid(
                            format!("{at}[{j}]"),
                            format!(
                                "content parts of type `{}` are not supported by this server; only text",
                                kind.unwrap_or("?")
                            ),
                        ))
                    }
                }
            }
            Ok(text.join(""))
        }
        _ => Err(ApiError::invalid(at, "content must be a string or a list of text parts")),
    }
}

/// A function tool (`{"type": "function", "name", "parameters", ...}`) as chat's.
fn tool(value: &Value, i: usize) -> Result<Tool, ApiError> {
    if value.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            "only function tools are supported by this server",
        ));
    }
    let name = value.get("name").and_then(Value::as_str).unwrap_or_default();
    Ok(Tool {
        kind: "function".into(),
        function: FunctionDef {
            name: name.to_owned(),
            description: value.get("description").and_then(Value::as_str).map(str::to_owned),
            parameters: value.get("parameters").cloned(),
            strict: value.get("strict").and_then(Value::as_bool),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Input items read as chat: messages, consecutive calls on one assistant
    /// message, outputs as tool messages; function tools, tool choice and the
    /// text format as chat's.
    #[test]
    fn items_tools_and_format_become_chats() {
        let req: ResponsesRequest = serde_json::from_value(json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 30,
            "input": [
                {"role": "developer", "content": "Answer in English."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "reasoning", "summary": []}
            ],
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "w"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}
        })).unwrap();
        let previous = [ChatMessage::new(Role::User, "Hi")];
        let conversation = req.conversation(&previous).unwrap();
        let chat = serde_json::to_value(req.to_chat(conversation).unwrap()).unwrap();
        let messages = chat["messages"].as_array().unwrap();
        assert_eq!(messages[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(messages[1], json!({"role": "user", "content": "Hi"}));
        assert_eq!(messages[2]["role"], "system");
        assert_eq!(messages[3], json!({"role": "user", "content": "Weather?"}));
        assert_eq!(messages[4]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(messages[5], json!({"role": "tool", "content": "sunny", "tool_call_id": "c1"}));
        assert_eq!(messages.len(), 6);
        assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "w"}}));
        assert_eq!(chat["tools"][0]["function"]["strict"], true);
        assert_eq!(chat["response_format"]["json_schema"]["schema"], json!({"type": "object"}));
        assert_eq!(chat["max_completion_tokens"], 30);
    }

    #[test]
    fn images_and_other_tools_are_refused_by_name() {
        let image: ResponsesRequest = serde_json::from_value(json!({"model": "m", "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}))
        .unwrap();
        assert_eq!(
            image.conversation(&[]).unwrap_err().param.as_deref(),
            Some("input[0].content[0]")
        );
        let search: ResponsesRequest = serde_json::from_value(json!({"model": "m", "input": "x",
            "tools": [{"type": "web_search"}]}))
        .unwrap();
        let conversation = search.conversation(&[]).unwrap();
        assert_eq!(
            search.to_chat(conversation).unwrap_err().param.as_deref(),
            Some("tools[0].type")
        );
    }
}

//! A Messages request as the Chat Completions request it means: the system
//! prompt first, each `tool_use` block an assistant's tool call, each
//! `tool_result` block a tool message, `tools` as functions and `tool_choice`
//! as chat's. What chat cannot say (images, documents, extended thinking,
//! server tools) is refused by name.

use serde_json::{json, Value};

use super::{Block, Content, MessagesRequest, ToolChoice};
use crate::{
    ApiError, ChatCompletionRequest, ChatMessage, FunctionDef, Role, Sampling, Stop, StreamOptions,
    Tool,
};

/// Chat's names of the fields a Messages request sets, and the request's own:
/// a refusal of the chat it translates to names them so
/// ([`ApiError::renamed`]).
pub const FIELD_NAMES: &[(&str, &str)] = &[
    ("max_completion_tokens", "max_tokens"),
    ("stop", "stop_sequences"),
    (".function.parameters", ".input_schema"),
];

impl MessagesRequest {
    /// The chat request it means; a 400 naming the field chat cannot carry.
    pub fn to_chat(&self) -> Result<ChatCompletionRequest, ApiError> {
        if self.max_tokens == 0 {
            return Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1"));
        }
        thinking(self.thinking.as_ref(), self.max_tokens)?;
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        if let Some(system) = &self.system {
            refuse_other(system, "system")?;
            messages.push(ChatMessage::new(Role::System, system.text()));
        }
        for (i, message) in self.messages.iter().enumerate() {
            let role = match message.role.as_str() {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => {
                    return Err(ApiError::invalid(
                        format!("messages.{i}.role"),
                        format!("role `{other}` is not `user` or `assistant`"),
                    ))
                }
            };
            turn(&mut messages, role, &message.content, i)?;
        }
        let mut chat = ChatCompletionRequest::new(self.model.clone(), messages);
        chat.max_tokens = Some(self.max_tokens);
        chat.sampling = Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop_sequences.clone().map(Stop::Many),
            stream: self.stream,
            // The usage of a stream, for `message_delta`.
            stream_options: self
                .stream
                .unwrap_or(false)
                .then_some(StreamOptions { include_usage: Some(true) }),
            cache_salt: self.cache_salt.clone(),
            ..Sampling::default()
        };
        if let Some(tools) = &self.tools {
            chat.tools = Some(tools.iter().map(tool).collect::<Result<_, _>>()?);
        }
        if let Some(choice) = &self.tool_choice {
            let (value, parallel) = match choice {
                ToolChoice::Auto { disable_parallel_tool_use } => {
                    (json!("auto"), disable_parallel_tool_use)
                }
                ToolChoice::Any { disable_parallel_tool_use } => {
                    (json!("required"), disable_parallel_tool_use)
                }
                ToolChoice::Tool { name, disable_parallel_tool_use } => (
                    json!({"type": "function", "function": {"name": name}}),
                    disable_parallel_tool_use,
                ),
                ToolChoice::None => (json!("none"), &None),
            };
            chat.tool_choice = Some(value);
            chat.parallel_tool_calls = parallel.map(|disable| !disable);
        }
        Ok(chat)
    }
}

/// Appends one turn: its text and calls as one message, each tool result as a
/// tool message of its own (before the turn's text, which follows them).
fn turn(
    out: &mut Vec<ChatMessage>,
    role: Role,
    content: &Content,
    i: usize,
) -> Result<(), ApiError> {
    let blocks = match content {
        Content::Text(text) => {
            out.push(ChatMessage::new(role, text.clone()));
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = || format!("messages.{i}.content.{j}");
        match block {
            Block::Text { text: t } => text.push(t.as_str()),
            Block::Thinking { thinking, .. } if role == Role::Assistant => {
                reasoning.push(thinking.as_str());
            }
            Block::RedactedThinking { .. } if role == Role::Assistant => {}
            Block::Thinking { .. } | Block::RedactedThinking { .. } => {
                return Err(ApiError::invalid(
                    at(),
                    "a thinking block belongs to an assistant turn",
                ))
            }
            Block::ToolUse { id, name, input } if role == Role::Assistant => {
                let arguments = serde_json::to_string(input).unwrap_or_default();
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": arguments}}));
            }
            Block::ToolResult { tool_use_id, content, is_error } if role == Role::User => {
                let mut result = content.as_ref().map(Content::text).unwrap_or_default();
                if let Some(content) = content {
                    refuse_other(content, &at())?;
                }
                if *is_error == Some(true) {
                    result = format!("error: {result}");
                }
                let mut message = ChatMessage::new(Role::Tool, result);
                message.tool_call_id = Some(tool_use_id.clone());
                out.push(message);
            }
            Block::ToolUse { .. } => {
                return Err(ApiError::invalid(
                    at(),
                    "a `tool_use` block belongs to an assistant turn",
                ))
            }
            Block::ToolResult { .. } => {
                return Err(ApiError::invalid(at(), "a `tool_result` block belongs to a user turn"))
            }
            Block::Other => return Err(unsupported(&at())),
        }
    }
    if !text.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
        let mut message = ChatMessage::new(role, text.join("\n"));
        if !calls.is_empty() {
            message.tool_calls = Some(Value::Array(calls));
            if text.is_empty() {
                message.content = None;
            }
        }
        if !reasoning.is_empty() {
            message.reasoning_content = Some(reasoning.join("\n"));
        }
        out.push(message);
    } else if blocks.is_empty() {
        out.push(ChatMessage::new(role, String::new()));
    }
    Ok(())
}

/// Checks `thinking` as Anthropic does (`enabled` with a `budget_tokens` below
/// `max_tokens`, `disabled` or `adaptive`). A model that does not reason apart
/// answers without thinking blocks, as llama-server does.
fn thinking(thinking: Option<&Value>, max_tokens: u32) -> Result<(), ApiError> {
    let Some(thinking) = thinking else { return Ok(()) };
    let bad = |message: String| Err(ApiError::invalid("thinking", message));
    match thinking["type"].as_str() {
        Some("disabled" | "adaptive") => Ok(()),
        Some("enabled") => match thinking["budget_tokens"].as_u64() {
            Some(budget) if budget >= 1 && budget < u64::from(max_tokens) => Ok(()),
            Some(budget) => bad(format!(
                "thinking.budget_tokens ({budget}) must be at least 1 and less than max_tokens \
                 ({max_tokens})"
            )),
            None => bad("thinking.budget_tokens must be a whole number of tokens".into()),
        },
        _ => bad("thinking.type must be `enabled`, `disabled` or `adaptive`".into()),
    }
}

/// A client tool as a chat function; server tools are refused.
fn tool(def: &super::ToolDef) -> Result<Tool, ApiError> {
    if def.kind.as_deref().is_some_and(|k| k != "custom") {
        return Err(ApiError::invalid(
            "tools",
            format!("the server tool `{}` is not supported; only client tools are", def.name),
        ));
    }
    Ok(Tool {
        kind: "function".into(),
        function: FunctionDef {
            name: def.name.clone(),
            description: def.description.clone(),
            parameters: Some(def.input_schema.clone()),
            strict: None,
        },
    })
}

/// Refuses content with blocks that are not text.
fn refuse_other(content: &Content, at: &str) -> Result<(), ApiError> {
    match content {
        Content::Blocks(blocks) if blocks.iter().any(|b| !matches!(b, Block::Text { .. })) => {
            Err(unsupported(at))
        }
        _ => Ok(()),
    }
}

fn unsupported(at: &str) -> ApiError {
    ApiError::invalid(
        at,
        format!(
            "{at}: only `text`, `tool_use` and `tool_result` blocks are supported by this server"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> MessagesRequest {
        serde_json::from_value(body).unwrap()
    }

    /// A tool round trip reads as chat's: the call on the assistant's message,
    /// the result as a tool message naming it, the tools as functions.
    #[test]
    fn a_tool_round_trip_becomes_chats() {
        let req = request(json!({
            "model": "m", "max_tokens": 20, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5, "stream": true,
            "tools": [{"name": "weather", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "And tomorrow?"}]}
            ]
        }));
        let chat = serde_json::to_value(req.to_chat().unwrap()).unwrap();
        assert_eq!(chat["messages"][0], json!({"role": "system", "content": "Be brief."}));
        let call = &chat["messages"][2]["tool_calls"][0];
        assert_eq!(call["function"]["arguments"], r#"{"city":"Paris"}"#);
        assert_eq!(
            chat["messages"][3],
            json!({"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"})
        );
        assert_eq!(chat["messages"][4], json!({"role": "user", "content": "And tomorrow?"}));
        assert_eq!(chat["tools"][0]["function"]["parameters"], json!({"type": "object"}));
        assert_eq!(chat["tool_choice"]["function"]["name"], "weather");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!((chat["max_tokens"].clone(), chat["stop"].clone()), (json!(20), json!(["END"])));
        assert_eq!(chat["stream_options"]["include_usage"], true);
    }

    /// What chat cannot carry is refused, naming where it is.
    #[test]
    fn images_thinking_and_misplaced_blocks_are_refused_by_name() {
        let image = request(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user",
            "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]}));
        assert_eq!(image.to_chat().unwrap_err().param.as_deref(), Some("messages.0.content.0"));
        let thinking =
            request(json!({"model": "m", "max_tokens": 5, "thinking": {"type": "enabled",
            "budget_tokens": 1024}, "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(thinking.to_chat().unwrap_err().param.as_deref(), Some("thinking"));
        let misplaced =
            request(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}));
        assert!(misplaced.to_chat().is_err());
        let role = request(
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
        );
        assert_eq!(role.to_chat().unwrap_err().param.as_deref(), Some("messages.0.role"));
    }

    /// Thinking is accepted as Anthropic bounds it, and earlier turns' thinking
    /// goes back to the model as their reasoning.
    #[test]
    fn thinking_is_bounded_and_earlier_thinking_becomes_reasoning() {
        let with = |thinking: Value| {
            request(json!({"model": "m", "max_tokens": 100, "thinking": thinking,
                "messages": [{"role": "user", "content": "hi"}]}))
            .to_chat()
        };
        assert!(with(json!({"type": "enabled", "budget_tokens": 50})).is_ok());
        assert!(with(json!({"type": "disabled"})).is_ok());
        for bad in [
            json!({"type": "enabled"}),
            json!({"type": "enabled", "budget_tokens": 100}),
            json!({"type": "sometimes"}),
        ] {
            assert_eq!(with(bad).unwrap_err().param.as_deref(), Some("thinking"));
        }
        let history = request(json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": "Fix it"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Look first.", "signature": "s"},
                {"type": "redacted_thinking", "data": "xx"},
                {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                "content": "main.py"}]}]}));
        let chat = serde_json::to_value(history.to_chat().unwrap()).unwrap();
        assert_eq!(chat["messages"][1]["reasoning_content"], "Look first.");
        assert_eq!(chat["messages"][1]["tool_calls"][0]["id"], "t1");
        let misplaced = request(json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]}));
        assert_eq!(misplaced.to_chat().unwrap_err().param.as_deref(), Some("messages.0.content.0"));
    }
}

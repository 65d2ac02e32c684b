//! Tool calling on the wire: the functions a request offers, which one it wants
//! called, and the calls an answer makes, whole or streamed in pieces.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema of its arguments; none means no arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// OpenAI's strict schema adherence; arguments are always constrained here
    /// when a call is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// One entry of `tools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

/// `tool_choice`, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool.
    None,
    /// Call tools or answer, as the model decides.
    Auto,
    /// Call at least one tool.
    Required,
    /// Call this function.
    Function(String),
}

impl ToolChoice {
    /// Reads `tool_choice` as sent; absent is `auto` (with tools), as OpenAI has it.
    pub fn read(value: Option<&Value>) -> Result<Self, ApiError> {
        let bad = || {
            ApiError::invalid(
                "tool_choice",
                "tool_choice must be `none`, `auto`, `required` or \
                 {\"type\": \"function\", \"function\": {\"name\": ...}}",
            )
        };
        match value {
            None | Some(Value::Null) => Ok(Self::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "none" => Ok(Self::None),
                "auto" => Ok(Self::Auto),
                "required" => Ok(Self::Required),
                _ => Err(bad()),
            },
            Some(v) => v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .map(|name| Self::Function(name.to_owned()))
                .ok_or_else(bad),
        }
    }
}

/// A function call made by the model: its name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function called.
    pub name: String,
    /// Its arguments, a JSON object written as a string.
    pub arguments: String,
}

/// One call in an answer's `message.tool_calls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// `call_...`, unique; a `tool` message answers it by this id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The call.
    pub function: FunctionCall,
}

impl ToolCall {
    /// A call of `name` with `arguments`, under `id`.
    pub fn new(id: String, name: String, arguments: String) -> Self {
        Self { id, kind: "function".into(), function: FunctionCall { name, arguments } }
    }
}

/// The part of a streamed call a chunk adds: the id, type and name first, then
/// the arguments in pieces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which call of the choice this adds to.
    pub index: u32,
    /// Sent with the first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, with the first piece.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The name (first piece) or a piece of the arguments.
    pub function: FunctionCallDelta,
}

/// A piece of a streamed function call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// Sent with the first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the arguments' text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

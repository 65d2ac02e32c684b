//! Tool calling for any model: the tools a request offers become part of the
//! prompt and, in the generic form, a grammar over the answer's JSON; the model's
//! text is read back into OpenAI's `tool_calls`.
//!
//! The generic form is llama-server's answer for templates without a tool section
//! (the built-in ones, and the default model's): the definitions go into a system
//! message, and the answer is one JSON object, `{"tool_calls": [...]}` or
//! `{"response": "..."}`, always constrained by a grammar made from the tools'
//! parameter schemas. So with `tool_choice: "required"` (or a named function)
//! every call names an offered function and its arguments match its schema.

pub mod calls;
pub mod parse;
pub mod reply;

use serde_json::{json, Value};
use slotgate_protocol::{
    ApiError, ChatCompletionRequest, ChatMessage, MessageContent, Role, Tool, ToolCall, ToolChoice,
};

pub use parse::{CallFormat, Parsed};

/// What a request asks of tools, when it may call any.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The tools the model may call (only the named one, for a named choice).
    pub tools: Vec<Tool>,
    /// Whether the answer must call a tool.
    pub required: bool,
    /// Whether one answer may make several calls.
    pub parallel: bool,
    /// How the model writes calls.
    pub format: CallFormat,
}

impl ToolPlan {
    /// The plan of a validated request; `None` when no tool may be called.
    pub fn read(req: &ChatCompletionRequest) -> Result<Option<Self>, ApiError> {
        let tools = req.tools.clone().unwrap_or_default();
        let choice = ToolChoice::read(req.tool_choice.as_ref())?;
        if tools.is_empty() || choice == ToolChoice::None {
            return Ok(None);
        }
        let (tools, required) = match choice {
            ToolChoice::Function(name) => {
                (tools.into_iter().filter(|t| t.function.name == name).collect(), true)
            }
            ToolChoice::Required => (tools, true),
            _ => (tools, false),
        };
        // Off unless asked for, as llama-server has it: a small model asked for
        // "one or more" calls tends to repeat its call until `max_tokens`.
        let parallel = req.parallel_tool_calls.unwrap_or(false);
        Ok(Some(Self { tools, required, parallel, format: CallFormat::Generic }))
    }

    /// The conversation with the generic form's instructions in front, as a system
    /// message of its own or joined to the first one.
    pub fn generic_messages(&self, mut messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
        let definitions: Vec<Value> = self
            .tools
            .iter()
            .map(|t| {
                json!({"name": t.function.name, "description": t.function.description,
                       "parameters": t.function.parameters.clone().unwrap_or_else(|| json!({}))})
            })
            .collect();
        let shape = r#"{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]}"#;
        let mut text = format!(
            "You can call these tools:\n{}\n\nAnswer with one JSON object: {shape} to call tools",
            Value::Array(definitions)
        );
        if !self.required {
            text.push_str(r#", or {"response": "<your answer>"} to reply without them"#);
        }
        text.push('.');
        match messages.first_mut() {
            Some(first) if matches!(first.role, Role::System | Role::Developer) => {
                let own = first.text();
                first.content = Some(MessageContent::Text(format!("{own}\n\n{text}")));
            }
            _ => messages.insert(0, ChatMessage::new(Role::System, text)),
        }
        messages
    }

    /// The grammar of the generic form's answer; a parameter schema the converter
    /// cannot enforce is a 400 naming the tool.
    pub fn generic_grammar(&self) -> Result<String, ApiError> {
        let calls = self.call_schemas("arguments")?;
        let mut list = json!({"type": "array", "items": {"anyOf": calls}, "minItems": 1});
        if !self.parallel {
            list["maxItems"] = json!(1);
        }
        let call = json!({"type": "object", "properties": {"tool_calls": list}, "required": ["tool_calls"]});
        let schema = if self.required {
            call
        } else {
            json!({"anyOf": [call, {"type": "object", "properties": {"response": {"type": "string"}},
                                    "required": ["response"]}]})
        };
        crate::constrain::from_schema(&schema, "tools")
    }

    /// The grammar of a required call in the template's own format (Hermes
    /// tags, Llama 3's object, Mistral's list); `None` for the generic form.
    pub fn native_grammar(&self) -> Result<Option<String>, ApiError> {
        let key = match self.format {
            CallFormat::Generic => return Ok(None),
            CallFormat::Llama3 => "parameters",
            CallFormat::Hermes | CallFormat::Mistral => "arguments",
        };
        let calls = self.call_schemas(key)?;
        let call = crate::constrain::from_schema(&json!({"anyOf": calls}), "tools")?;
        // The call's grammar under another root name, inside the format's markers.
        let call = call.replacen("root ::= ", "call ::= ", 1);
        // Further calls, when several are allowed.
        let more = |separator: &str, one: &str| {
            if self.parallel {
                format!(" ({separator} {one})*")
            } else {
                String::new()
            }
        };
        let root = match self.format {
            CallFormat::Hermes => {
                let tag = r#""<tool_call>\n" call "\n</tool_call>""#;
                format!("root ::= {tag}{}", more(r#""\n""#, tag))
            }
            CallFormat::Mistral => {
                format!(r#"root ::= "[TOOL_CALLS][" call{} "]""#, more(r#""," ws"#, "call"))
            }
            _ => format!("root ::= call{}", more(r#""; ""#, "call")),
        };
        Ok(Some(format!("{root}\n{call}")))
    }

    /// One schema per tool of a call to it, `{"name": ..., key: <its parameters>}`;
    /// a parameter schema the converter cannot enforce is a 400 naming the tool
    /// (checked on its own, so that the error points into that schema).
    fn call_schemas(&self, key: &str) -> Result<Vec<Value>, ApiError> {
        let mut calls = Vec::with_capacity(self.tools.len());
        for tool in &self.tools {
            let parameters =
                tool.function.parameters.clone().unwrap_or_else(|| json!({"type": "object"}));
            crate::constrain::from_schema(&parameters, &self.param_of(&tool.function.name))?;
            calls.push(json!({"type": "object", "properties": {
                "name": {"const": tool.function.name}, key: parameters}, "required": ["name", key]}));
        }
        Ok(calls)
    }

    /// Where a tool's parameters are, for error messages.
    fn param_of(&self, name: &str) -> String {
        format!("tools.{name}.function.parameters")
    }

    /// The answer's content and calls, from the model's whole text; each call gets
    /// an id of its own.
    pub fn read_answer(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        let parsed = parse::parse(self.format, text);
        let calls = parsed
            .calls
            .into_iter()
            .map(|c| ToolCall::new(crate::ids::next("call"), c.name, c.arguments))
            .collect();
        (parsed.content, calls)
    }
}

/// A conversation whose earlier tool calls and results are written as the
/// generic form shows them, for templates that know nothing of tools: an
/// assistant's calls as its JSON, a tool's result as a `tool_response` object.
pub fn generic_history(messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
    messages
        .into_iter()
        .map(|mut m| {
            if let Some(calls) = m.tool_calls.take() {
                let calls: Vec<Value> = calls
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let f = &c["function"];
                        let arguments = f["arguments"]
                            .as_str()
                            .and_then(|a| serde_json::from_str(a).ok())
                            .unwrap_or_else(|| f["arguments"].clone());
                        json!({"name": f["name"], "arguments": arguments})
                    })
                    .collect();
                let text = json!({"tool_calls": calls}).to_string();
                m.content = Some(MessageContent::Text(text));
            }
            if m.role == Role::Tool {
                let response = json!({"tool_response": {
                    "tool_call_id": m.tool_call_id, "content": m.text()}});
                m.content = Some(MessageContent::Text(response.to_string()));
            }
            m
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(extra: Value) -> ChatCompletionRequest {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}},
                      {"type": "function", "function": {"name": "now"}}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn choices_become_plans() {
        assert!(ToolPlan::read(&request(json!({"tool_choice": "none"}))).unwrap().is_none());
        let auto = ToolPlan::read(&request(json!({"parallel_tool_calls": true}))).unwrap().unwrap();
        assert_eq!((auto.tools.len(), auto.required, auto.parallel), (2, false, true));
        let named =
            request(json!({"tool_choice": {"type": "function", "function": {"name": "now"}},
                                   "parallel_tool_calls": false}));
        let named = ToolPlan::read(&named).unwrap().unwrap();
        assert_eq!((named.tools.len(), named.required, named.parallel), (1, true, false));
        assert!(named.generic_grammar().unwrap().contains(r#""\"now\"""#));
        let mut hermes = named.clone();
        hermes.format = CallFormat::Hermes;
        let grammar = hermes.native_grammar().unwrap().unwrap();
        assert!(
            grammar.starts_with("root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall ::= "),
            "{grammar}"
        );
        hermes.parallel = true;
        let grammar = hermes.native_grammar().unwrap().unwrap();
        assert!(grammar.lines().next().unwrap().ends_with(")*"), "{grammar}");
    }

    #[test]
    fn the_generic_prompt_lists_the_tools_and_the_history_is_json() {
        let plan = ToolPlan::read(&request(json!({"tool_choice": "required"}))).unwrap().unwrap();
        let messages = plan.generic_messages(vec![ChatMessage::new(Role::User, "Hi")]);
        assert_eq!(messages[0].role, Role::System);
        assert!(messages[0].text().contains(r#""name":"get_weather""#), "{}", messages[0].text());
        assert!(!messages[0].text().contains("response"), "required: no reply without a call");
        let history: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "now", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "noon"}]))
        .unwrap();
        let history = generic_history(history);
        assert_eq!(history[0].text(), r#"{"tool_calls":[{"name":"now","arguments":{}}]}"#);
        assert_eq!(
            history[1].text(),
            r#"{"tool_response":{"tool_call_id":"call_1","content":"noon"}}"#
        );
    }

    #[test]
    fn an_unenforceable_parameter_schema_names_its_tool() {
        let req = request(json!({"tools": [{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}}}}]}));
        let err = ToolPlan::read(&req).unwrap().unwrap().generic_grammar().unwrap_err();
        assert_eq!(
            err.param.as_deref(),
            Some("tools.f.function.parameters.properties.x"),
            "{err:?}"
        );
    }
}

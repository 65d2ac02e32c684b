//! Tool calls read out of a model's text, in the formats models are trained on:
//! the generic JSON form (any model, grammar-constrained), Hermes/Qwen's
//! `<tool_call>` tags, Llama 3.x's bare JSON object, and Mistral's `[TOOL_CALLS]`.

use serde_json::Value;

/// How a model writes its tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFormat {
    /// `{"tool_calls": [{"name": ..., "arguments": {...}}]}` or `{"response": "..."}`,
    /// as the engine's own prompt asks (llama-server's generic format).
    Generic,
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, once per call.
    Hermes,
    /// `{"name": ..., "parameters": {...}}`, maybe after `<|python_tag|>`.
    Llama3,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` or `[TOOL_CALLS]name[ARGS]{...}`.
    Mistral,
}

impl CallFormat {
    /// The format a chat template's source was written for, judged by the markers
    /// it uses; `None` when it has no tool section of a known kind.
    pub fn of_template(source: &str) -> Option<Self> {
        if source.contains("<tool_call>") {
            Some(Self::Hermes)
        } else if source.contains("[TOOL_CALLS]") {
            Some(Self::Mistral)
        } else if source.contains("<|python_tag|>") || source.contains("ipython") {
            Some(Self::Llama3)
        } else {
            None
        }
    }
}

/// One call read from the text: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The function called.
    pub name: String,
    /// Its arguments, as compact JSON text.
    pub arguments: String,
}

/// What a model's text says: plain content, calls, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Text meant for the user; `None` when there is none.
    pub content: Option<String>,
    /// The calls, in the order written.
    pub calls: Vec<Call>,
}

/// Reads `text` as written in `format`. Text that holds no well-formed call is
/// all content: a call cut short by `max_tokens` is not invented into one.
pub fn parse(format: CallFormat, text: &str) -> Parsed {
    let parsed = match format {
        CallFormat::Generic => generic(text),
        CallFormat::Hermes => hermes(text),
        CallFormat::Llama3 => llama3(text),
        CallFormat::Mistral => mistral(text),
    };
    parsed.unwrap_or_else(|| content_only(text))
}

fn content_only(text: &str) -> Parsed {
    Parsed { content: non_empty(text), calls: Vec::new() }
}

fn non_empty(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// A call from `{"name": ..., "arguments" | "parameters": ...}`.
fn call(value: &Value) -> Option<Call> {
    let name = value.get("name")?.as_str()?.to_owned();
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(_) => return None,
    };
    Some(Call { name, arguments })
}

fn generic(text: &str) -> Option<Parsed> {
    let value: Value = serde_json::from_str(text.trim()).ok()?;
    if let Some(calls) = value.get("tool_calls").and_then(Value::as_array) {
        let calls: Option<Vec<Call>> = calls.iter().map(call).collect();
        return Some(Parsed { content: None, calls: calls? });
    }
    if let Some(one) = value.get("tool_call") {
        return Some(Parsed { content: None, calls: vec![call(one)?] });
    }
    let response = value.get("response")?;
    let content = match response {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some(Parsed { content: Some(content), calls: Vec::new() })
}

fn hermes(text: &str) -> Option<Parsed> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        let end = after.find(CLOSE)?;
        calls.push(call(&serde_json::from_str(after[..end].trim()).ok()?)?);
        rest = &after[end + CLOSE.len()..];
    }
    content.push_str(rest);
    (!calls.is_empty()).then(|| Parsed { content: non_empty(&content), calls })
}

fn llama3(text: &str) -> Option<Parsed> {
    let body = text.trim();
    let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
    // Several calls come separated by `;`.
    let mut calls = Vec::new();
    for part in body.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let value: Value = serde_json::from_str(part).ok()?;
        value.get("parameters").or_else(|| value.get("arguments"))?;
        calls.push(call(&value)?);
    }
    (!calls.is_empty()).then_some(Parsed { content: None, calls })
}

fn mistral(text: &str) -> Option<Parsed> {
    const MARK: &str = "[TOOL_CALLS]";
    let start = text.find(MARK)?;
    let content = non_empty(&text[..start]);
    let rest = text[start + MARK.len()..].trim();
    let calls = if rest.starts_with('[') {
        let value: Value = serde_json::from_str(rest).ok()?;
        value.as_array()?.iter().map(call).collect::<Option<Vec<_>>>()?
    } else {
        // The newer form: `name[ARGS]{...}`, repeated after further marks.
        let mut calls = Vec::new();
        for part in rest.split(MARK).map(str::trim).filter(|p| !p.is_empty()) {
            let (name, arguments) = part.split_once("[ARGS]")?;
            let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
            calls.push(Call { name: name.trim().to_owned(), arguments: arguments.to_string() });
        }
        calls
    };
    (!calls.is_empty()).then_some(Parsed { content, calls })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(parsed: &Parsed) -> Vec<(&str, &str)> {
        parsed.calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect()
    }

    #[test]
    fn generic_calls_and_responses() {
        let p = parse(
            CallFormat::Generic,
            r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "now", "arguments": {}}]}"#,
        );
        assert_eq!(names(&p), vec![("get_weather", r#"{"city":"Oslo"}"#), ("now", "{}")]);
        assert_eq!(p.content, None);
        let p = parse(CallFormat::Generic, r#"{"response": "It is sunny."}"#);
        assert_eq!((p.content.as_deref(), p.calls.len()), (Some("It is sunny."), 0));
        // Cut short by max_tokens: content, not a half call.
        let p = parse(CallFormat::Generic, r#"{"tool_calls": [{"name": "get_wea"#);
        assert!(p.calls.is_empty());
        assert_eq!(p.content.as_deref(), Some(r#"{"tool_calls": [{"name": "get_wea"#));
    }

    #[test]
    fn hermes_tags_with_text_around_them() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let p = parse(CallFormat::Hermes, text);
        assert_eq!(names(&p), vec![("get_weather", r#"{"city":"Paris"}"#), ("now", "{}")]);
        assert_eq!(p.content.as_deref(), Some("Let me check."));
        let p = parse(CallFormat::Hermes, "No tools needed.");
        assert_eq!((p.content.as_deref(), p.calls.len()), (Some("No tools needed."), 0));
        let unclosed = "<tool_call>\n{\"name\": \"now\"";
        assert_eq!(parse(CallFormat::Hermes, unclosed).content.as_deref(), Some(unclosed));
    }

    #[test]
    fn llama3_json_objects_and_the_python_tag() {
        let p = parse(
            CallFormat::Llama3,
            r#"{"name": "get_weather", "parameters": {"city": "Rome", "unit": "celsius"}}"#,
        );
        assert_eq!(names(&p), vec![("get_weather", r#"{"city":"Rome","unit":"celsius"}"#)]);
        let p = parse(
            CallFormat::Llama3,
            r#"<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}"#,
        );
        assert_eq!(names(&p), vec![("a", "{}"), ("b", r#"{"x":1}"#)]);
        // A JSON answer that is not a call stays content.
        let p = parse(CallFormat::Llama3, r#"{"name": "Ada"}"#);
        assert!(p.calls.is_empty());
    }

    #[test]
    fn mistral_both_forms() {
        let p = parse(
            CallFormat::Mistral,
            r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Bern"}}]"#,
        );
        assert_eq!(names(&p), vec![("get_weather", r#"{"city":"Bern"}"#)]);
        let p = parse(
            CallFormat::Mistral,
            r#"[TOOL_CALLS]get_weather[ARGS]{"city": "Bern"}[TOOL_CALLS]now[ARGS]{}"#,
        );
        assert_eq!(names(&p), vec![("get_weather", r#"{"city":"Bern"}"#), ("now", "{}")]);
        assert!(parse(CallFormat::Mistral, "plain").calls.is_empty());
    }

    #[test]
    fn formats_are_told_by_their_templates() {
        assert_eq!(CallFormat::of_template("{{ '<tool_call>' }}"), Some(CallFormat::Hermes));
        assert_eq!(CallFormat::of_template("[TOOL_CALLS] {{ x }}"), Some(CallFormat::Mistral));
        assert_eq!(CallFormat::of_template("<|python_tag|>"), Some(CallFormat::Llama3));
        assert_eq!(CallFormat::of_template("{{ messages }}"), None);
    }
}

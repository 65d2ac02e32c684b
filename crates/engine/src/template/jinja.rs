//! Jinja chat templates, as Hugging Face writes them and GGUF files carry them
//! (`tokenizer.chat_template`), rendered with minijinja.
//!
//! The environment is set up as `transformers` sets up its own, so that a
//! template renders here as it does there: blocks trimmed, Python's string and
//! dict methods (`.strip()`, `.items()`), `raise_exception`, `strftime_now`, and
//! a `tojson` that writes as Python's `json.dumps` does (`", "` and `": "`, no
//! HTML escaping). Messages reach the template as OpenAI sends them, except that
//! a call's `arguments` string is given as the object it encodes, which is what
//! templates that write calls (`arguments | tojson`) expect.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value as JinjaValue};
use serde_json::{json, Value};
use slotgate_protocol::{ApiError, ChatMessage, Tool};

/// A compiled template with the special tokens it may name.
pub struct JinjaTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// Whether the template reads `functions` without setting it.
    reads_functions: bool,
}

impl std::fmt::Debug for JinjaTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JinjaTemplate").field("bytes", &self.source.len()).finish()
    }
}

impl JinjaTemplate {
    /// Compiles `source`; the error says where it does not parse.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_function("strftime_now", |format: String| strftime(&format, now_secs()));
        env.add_template_owned("chat", source.clone()).map_err(|e| e.to_string())?;
        let template = env.get_template("chat").map_err(|e| e.to_string())?;
        let reads_functions = template.undeclared_variables(false).contains("functions");
        Ok(Self { env, source, bos_token, eos_token, reads_functions })
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The conversation as a prompt, with the opening of the assistant's turn
    /// when `open`, and `kwargs` as more variables. Templates also get
    /// `enable_thinking` (true unless `kwargs` say) and today's date as
    /// `date_string` and `datetime`, as llama.cpp gives them, and, where the
    /// template reads `functions` (OpenAI's old name for tools, as Firefunction
    /// v2's template does) the tools as indented JSON text, empty without any,
    /// as llama.cpp gave them to it. A template that fails (`raise_exception`
    /// included) is a 400 that carries its message.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Tool]>,
        open: bool,
        kwargs: &serde_json::Map<String, Value>,
    ) -> Result<String, ApiError> {
        let messages: Vec<Value> = messages.iter().map(message).collect();
        let tools = tools.map(|t| serde_json::to_value(t).unwrap_or(Value::Null));
        let now = now_secs();
        let mut context = json!({
            "enable_thinking": true,
            "date_string": strftime("%d %b %Y", now).unwrap_or_default(),
            "datetime": strftime("%b %d %Y", now).unwrap_or_default(),
        });
        if let Value::Object(context) = &mut context {
            if self.reads_functions {
                let text = match &tools {
                    Some(tools) if tools.as_array().is_some_and(|t| !t.is_empty()) => {
                        serde_json::to_string_pretty(tools).unwrap_or_default()
                    }
                    _ => String::new(),
                };
                context.insert("functions".into(), Value::String(text));
            }
            context.extend(kwargs.iter().map(|(k, v)| (k.clone(), v.clone())));
            // What the request itself says, never a variable's.
            context.insert("messages".into(), Value::Array(messages));
            context.insert("tools".into(), tools.unwrap_or(Value::Null));
            context.insert("add_generation_prompt".into(), Value::Bool(open));
            context.insert("bos_token".into(), json!(self.bos_token));
            context.insert("eos_token".into(), json!(self.eos_token));
        }
        let template = self.env.get_template("chat").map_err(|e| template_error(&e))?;
        template.render(JinjaValue::from_serialize(&context)).map_err(|e| template_error(&e))
    }
}

fn template_error(err: &Error) -> ApiError {
    let detail = match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.to_string(),
    };
    let line = err.line().map(|l| format!(" (line {l})")).unwrap_or_default();
    ApiError::invalid(
        "messages",
        format!("the chat template cannot render these messages{line}: {detail}"),
    )
}

/// A message as templates read it. A message that only calls tools has empty
/// text rather than none: templates test its text (`'</think>' in
/// message.content`), as llama.cpp found and works around the same way.
fn message(m: &ChatMessage) -> Value {
    let content = match (&m.content, &m.tool_calls) {
        (None, None) => Value::Null,
        _ => Value::String(m.text()),
    };
    let mut out = json!({"role": m.role.as_str(), "content": content});
    if let Some(reasoning) = &m.reasoning_content {
        out["reasoning_content"] = json!(reasoning);
    }
    if let Some(name) = &m.name {
        out["name"] = json!(name);
    }
    if let Some(id) = &m.tool_call_id {
        out["tool_call_id"] = json!(id);
    }
    if let Some(calls) = m.tool_calls.as_ref().and_then(Value::as_array) {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let mut c = c.clone();
                let parsed = c["function"]["arguments"]
                    .as_str()
                    .and_then(|a| serde_json::from_str::<Value>(a).ok());
                if let Some(parsed) = parsed {
                    c["function"]["arguments"] = parsed;
                }
                c
            })
            .collect();
        out["tool_calls"] = Value::Array(calls);
    }
    out
}

/// `tojson` as Python's `json.dumps` writes: `", "` and `": "` between items, or
/// with `indent`, one item per line.
fn tojson(value: JinjaValue, indent: Option<usize>, kwargs: Kwargs) -> Result<String, Error> {
    // `tojson(4)` or, as Llama 3's templates write it, `tojson(indent=4)`.
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    kwargs.assert_all_used()?;
    let value: Value = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out);
    Ok(out)
}

fn write_json(value: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let separator = if indent.is_some() { "," } else { ", " };
    match value {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(": ");
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// `strftime` for the fields chat templates use (`%Y %m %d %b %B %H %M %S %%`), UTC.
fn strftime(format: &str, secs: i64) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let (year, month, day) = civil(secs.div_euclid(86_400));
    let time = secs.rem_euclid(86_400);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('b') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('H') => out.push_str(&format!("{:02}", time / 3600)),
            Some('M') => out.push_str(&format!("{:02}", time / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", time % 60)),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: `%{}` is not supported", other.unwrap_or(' ')),
                ))
            }
        }
    }
    Ok(out)
}

/// The civil date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_kwargs() -> Kwargs {
        Kwargs::from_iter(std::iter::empty::<(&str, JinjaValue)>())
    }

    #[test]
    fn dates_and_json_as_python_writes_them() {
        assert_eq!(strftime("%d %b %Y", 1_796_400_000).unwrap(), "04 Dec 2026");
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S %B", 0).unwrap(), "1970-01-01 00:00:00 January");
        assert!(strftime("%j", 0).is_err());
        let v = JinjaValue::from_serialize(json!({"a": [1, "<b>"], "c": {}}));
        assert_eq!(tojson(v.clone(), None, no_kwargs()).unwrap(), r#"{"a": [1, "<b>"], "c": {}}"#);
        assert_eq!(
            tojson(v, Some(2), no_kwargs()).unwrap(),
            "{\n  \"a\": [\n    1,\n    \"<b>\"\n  ],\n  \"c\": {}\n}"
        );
    }
}

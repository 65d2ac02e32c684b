//! What a request constrains its output to, as one GBNF grammar: llama.cpp's own
//! `grammar` and `json_schema` fields, and OpenAI's `response_format`. The
//! scheduler puts the grammar first in the choice's sampler chain, so every
//! token sampled keeps the output inside it.

pub mod budget;
mod gbnf;
pub mod schema;

use serde_json::Value;
use slotgate_protocol::{ApiError, ResponseFormat};

/// The grammar a request asks for, if any; several ways at once are refused.
pub fn grammar(
    grammar: Option<&str>,
    json_schema: Option<&Value>,
    response_format: Option<&ResponseFormat>,
) -> Result<Option<String>, ApiError> {
    let format = match response_format.map(|f| f.kind.as_str()) {
        None | Some("text") => None,
        // llama-server's extension: a `schema` beside `json_object` shapes it.
        Some("json_object") => match response_format.and_then(|f| f.rest.get("schema")) {
            Some(schema) => {
                Some(("response_format", from_schema(schema, "response_format.schema")?))
            }
            None => Some(("response_format", gbnf::any_object())),
        },
        Some("json_schema") => {
            let format = response_format.expect("matched above");
            let schema =
                format.rest.get("json_schema").and_then(|j| j.get("schema")).ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema.schema",
                        "`json_schema` needs a `schema`",
                    )
                })?;
            Some(("response_format", from_schema(schema, "response_format.json_schema.schema")?))
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "response_format.type",
                format!("`{other}` is not one of `text`, `json_object`, `json_schema`"),
            ))
        }
    };
    let mut asked = Vec::new();
    if let Some(text) = grammar.filter(|g| !g.trim().is_empty()) {
        asked.push(("grammar", text.to_owned()));
    }
    if let Some(schema) = json_schema {
        asked.push(("json_schema", from_schema(schema, "json_schema")?));
    }
    asked.extend(format);
    match asked.len() {
        0 | 1 => asked.pop().map(|(param, g)| bounded(g, param)).transpose(),
        _ => Err(ApiError::invalid(
            asked[1].0,
            format!("`{}` and `{}` cannot both constrain one answer", asked[0].0, asked[1].0),
        )),
    }
}

/// `grammar` if its cost is within [`budget`]'s limits, else a 400 naming `param`,
/// the field it came from.
pub fn bounded(grammar: String, param: &str) -> Result<String, ApiError> {
    match budget::check(&grammar) {
        Ok(()) => Ok(grammar),
        Err(budget::Refused(why)) => Err(ApiError::invalid(param, why)),
    }
}

/// The grammar of `schema`, or a 400 naming the part of it under `param`.
pub fn from_schema(schema: &Value, param: &str) -> Result<String, ApiError> {
    schema::to_gbnf(schema).map_err(|e| {
        let at = if e.path.is_empty() { param.to_owned() } else { format!("{param}.{}", e.path) };
        ApiError::invalid(
            at.clone(),
            format!("the schema cannot be turned into a grammar at `{at}`: {}", e.message),
        )
    })
}

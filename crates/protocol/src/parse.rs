//! Reading a JSON request body into a typed request, with errors that name the
//! parameter at fault as a path (`messages[0].role`).

use serde::Deserialize;

use crate::error::{ApiError, ErrorType};

/// Parses a request body. Malformed JSON and wrong types become a 400 whose `param`
/// is the path of the offending field.
pub fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    // Most bodies are valid: read them without tracking the path, which costs a
    // visible share of the gateway's time per request, and read a body again
    // with it only to say where it went wrong.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::new(
                ErrorType::InvalidRequestError,
                format!("request body is not valid JSON: {inner}"),
            );
        }
        let message = strip_position(&inner.to_string());
        if path == "." {
            if let Some(err) = locate_in_sampling(body) {
                return err;
            }
            let err = ApiError::new(
                ErrorType::InvalidRequestError,
                format!("invalid request body: {message}"),
            );
            match missing_field(&message) {
                Some(field) => err.with_param(field),
                None => err,
            }
        } else {
            ApiError::invalid(path.clone(), format!("invalid value for `{path}`: {message}"))
        }
    })
}

/// serde_json appends " at line L column C"; the path already says where.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// `Sampling` is flattened into the chat and completion requests, and serde loses
/// the path of an error inside a flattened struct. Reading the body as `Sampling`
/// alone finds it again.
fn locate_in_sampling(body: &[u8]) -> Option<ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let err = serde_path_to_error::deserialize::<_, crate::common::Sampling>(de).err()?;
    let path = err.path().to_string();
    if path == "." {
        return None;
    }
    let message = strip_position(&err.into_inner().to_string());
    Some(ApiError::invalid(path.clone(), format!("invalid value for `{path}`: {message}")))
}

/// The field named by serde's "missing field `x`" message.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatCompletionRequest;

    #[test]
    fn wrong_type_names_the_path() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"wizard","content":"x"}]}"#;
        let err = parse_json::<ChatCompletionRequest>(body).unwrap_err();
        assert_eq!(err.status(), 400);
        assert_eq!(err.param.as_deref(), Some("messages[1].role"));
        assert!(err.message.contains("wizard"), "{}", err.message);
    }

    #[test]
    fn missing_field_is_named() {
        let err = parse_json::<ChatCompletionRequest>(br#"{"model":"m"}"#).unwrap_err();
        assert!(err.message.contains("missing field `messages`"), "{}", err.message);
        assert_eq!(err.param.as_deref(), Some("messages"));
    }

    #[test]
    fn malformed_json_is_a_400_without_param() {
        let err = parse_json::<ChatCompletionRequest>(b"{\"model\":").unwrap_err();
        assert_eq!(err.status(), 400);
        assert_eq!(err.param, None);
        assert!(err.message.starts_with("request body is not valid JSON"), "{}", err.message);
    }
}

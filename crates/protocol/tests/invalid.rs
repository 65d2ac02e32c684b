//! A table of invalid requests with the `param` and message each must be refused with.

use slotgate_protocol::*;

fn chat(extra: &str) -> String {
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
}

fn chat_error(body: &str) -> ApiError {
    match parse_json::<ChatCompletionRequest>(body.as_bytes()) {
        Ok(req) => req.validate().expect_err(body),
        Err(err) => err,
    }
}

fn completion_error(body: &str) -> ApiError {
    match parse_json::<CompletionRequest>(body.as_bytes()) {
        Ok(req) => req.validate().expect_err(body),
        Err(err) => err,
    }
}

fn embedding_error(body: &str) -> ApiError {
    match parse_json::<EmbeddingRequest>(body.as_bytes()) {
        Ok(req) => req.validate().expect_err(body),
        Err(err) => err,
    }
}

fn check(err: ApiError, param: Option<&str>, message: &str, body: &str) {
    assert_eq!(err.status(), 400, "{body}");
    assert_eq!(err.kind, ErrorType::InvalidRequestError, "{body}");
    assert_eq!(err.param.as_deref(), param, "{body}: {}", err.message);
    assert!(err.message.contains(message), "{body}: `{}` lacks `{message}`", err.message);
}

#[test]
fn invalid_chat_requests() {
    let cases: &[(String, Option<&str>, &str)] = &[
        (chat(r#","temperature":2.5"#), Some("temperature"), "temperature must be between 0 and 2"),
        (chat(r#","temperature":-0.1"#), Some("temperature"), "temperature must be between 0 and 2"),
        (chat(r#","top_p":1.5"#), Some("top_p"), "top_p must be between 0 and 1"),
        (chat(r#","n":0"#), Some("n"), "n must be at least 1"),
        (chat(r#","n":129"#), Some("n"), "n must be at most 128"),
        (chat(r#","n":-1"#), Some("n"), "invalid value"),
        (chat(r#","max_tokens":0"#), Some("max_tokens"), "max_tokens must be at least 1"),
        (chat(r#","max_completion_tokens":0"#), Some("max_completion_tokens"), "at least 1"),
        (chat(r#","presence_penalty":3"#), Some("presence_penalty"), "between -2 and 2"),
        (chat(r#","frequency_penalty":-3"#), Some("frequency_penalty"), "between -2 and 2"),
        (chat(r#","stop":["a","b","c","d","e"]"#), Some("stop"), "at most 4"),
        (chat(r##","stop":"""##), Some("stop"), "must not be empty"),
        (chat(r#","stop":5"#), Some("stop"), "invalid value"),
        (chat(r#","logit_bias":{"abc":1}"#), Some("logit_bias"), "token ids"),
        (chat(r#","logit_bias":{"5":101}"#), Some("logit_bias"), "between -100 and 100"),
        (chat(r#","stream_options":{"include_usage":true}"#), Some("stream_options"), "only allowed when stream is true"),
        (chat(r#","stream":"yes""#), Some("stream"), "invalid type"),
        (chat(r#","top_k":-2"#), Some("top_k"), "top_k must be at least 0"),
        (chat(r#","cache_salt":"""#), Some("cache_salt"), "non-empty"),
        (chat(&format!(r#","cache_salt":"{}""#, "s".repeat(1025))), Some("cache_salt"), "at most 1024 bytes"),
        (chat(r#","cache_salt":7"#), Some("cache_salt"), "invalid type"),
        (r#"{"model":"m","messages":[]}"#.into(), Some("messages"), "at least one message"),
        (r#"{"model":"m"}"#.into(), Some("messages"), "missing field `messages`"),
        // A missing model reads as empty (a server fills in its only model first).
        (r#"{"messages":[{"role":"user","content":"x"}]}"#.into(), Some("model"), "model must not be empty"),
        (r#"{"model":"","messages":[{"role":"user","content":"x"}]}"#.into(), Some("model"), "model must not be empty"),
        (r#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#.into(), Some("messages[0].role"), "robot"),
        (r#"{"model":"m","messages":[{"role":"user"}]}"#.into(), Some("messages[0].content"), "required for user"),
        (r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x"}}]}]}"#.into(),
            Some("messages[0].content[1]"), "content part type `image_url` is not supported"),
        (r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}"#.into(), Some("messages[0].content[0].text"), "required"),
        (r#"{"model":"m","messages":"hello"}"#.into(), Some("messages"), "invalid type"),
        (chat(r#","top_logprobs":2"#), Some("top_logprobs"), "needs `logprobs: true`"),
        (chat(r#","logprobs":true,"top_logprobs":21"#), Some("top_logprobs"), "between 0 and 20"),
        (chat(r#","tools":[{"type":"retrieval","function":{"name":"f"}}]"#), Some("tools[0].type"), "only `function`"),
        (chat(r#","tools":[{"type":"function","function":{"name":"a b"}}]"#), Some("tools[0].function.name"), "letters"),
        (chat(r#","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#), Some("tool_choice"), "no tool named `g`"),
        (chat(r#","tool_choice":"required""#), Some("tool_choice"), "needs `tools`"),
        (chat(r#","tool_choice":"sometimes""#), Some("tool_choice"), "must be"),
        (r#"{"model":"m","messages":[{"role":"tool","content":"42"}]}"#.into(), Some("messages[0].tool_call_id"), "tool_call_id"),
        ("[1,2]".into(), None, "invalid request body"),
    ];
    for (body, param, message) in cases {
        check(chat_error(body), *param, message, body);
    }
}

#[test]
fn malformed_json_is_named() {
    for body in ["", "{", "{\"model\":\"m\",}", "not json"] {
        check(chat_error(body), None, "request body is not valid JSON", body);
    }
}

#[test]
fn invalid_completion_requests() {
    let cases: &[(&str, Option<&str>, &str)] = &[
        (r#"{"model":"m","prompt":[]}"#, Some("prompt"), "prompt must not be empty"),
        (r#"{"model":"m","prompt":[[1],[]]}"#, Some("prompt"), "prompt must not be empty"),
        (r#"{"model":"m","prompt":{"a":1}}"#, Some("prompt"), "did not match any variant"),
        (r#"{"model":"m","prompt":"x","suffix":"y"}"#, Some("suffix"), "suffix is not supported"),
        (r#"{"model":"m","prompt":"x","logprobs":6}"#, Some("logprobs"), "between 0 and 5"),
        (r#"{"model":"m","prompt":"x","best_of":3}"#, Some("best_of"), "unless it equals n"),
        (r#"{"model":"m","prompt":"x","max_tokens":0}"#, Some("max_tokens"), "at least 1"),
        (r#"{"model":"m","prompt":"x","temperature":9}"#, Some("temperature"), "between 0 and 2"),
    ];
    for (body, param, message) in cases {
        check(completion_error(body), *param, message, body);
    }
}

#[test]
fn invalid_embedding_requests() {
    let cases: &[(&str, Option<&str>, &str)] = &[
        (r#"{"model":"m","input":""}"#, Some("input"), "input must not be empty"),
        (r#"{"model":"m","input":[]}"#, Some("input"), "input must not be empty"),
        (r#"{"model":"m","input":["a",""]}"#, Some("input[1]"), "input[1] must not be empty"),
        (
            r#"{"model":"m","input":"a","encoding_format":"hex"}"#,
            Some("encoding_format"),
            "unknown variant `hex`",
        ),
        (r#"{"model":"m","input":"a","dimensions":8}"#, Some("dimensions"), "not supported"),
    ];
    for (body, param, message) in cases {
        check(embedding_error(body), *param, message, body);
    }
}

/// What is not refused: logprobs on or off, structured output (the engine reads
/// the schema), and tools the model is told not to call.
#[test]
fn requests_that_ask_for_nothing_unsupported_pass() {
    for extra in [
        r#","logprobs":false"#,
        r#","logprobs":true,"top_logprobs":20"#,
        r#","response_format":{"type":"json_object"}"#,
        r#","logprobs":false,"top_logprobs":0"#,
        r#","tools":[]"#,
        r#","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none""#,
        r#","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required""#,
    ] {
        let body = chat(extra);
        let req: slotgate_protocol::ChatCompletionRequest = serde_json::from_str(&body).unwrap();
        assert!(req.validate().is_ok(), "{body}");
    }
}

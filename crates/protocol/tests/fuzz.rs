//! Bounded fuzzing of the request parsers: any bytes, any JSON (deeply nested
//! too), any shape near a valid request is read and validated without a panic
//! and within a time bound per case; what is refused is a 4xx.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{json, Value};
use slotgate_protocol::*;

/// Any JSON value, nested up to a few levels, with the request fields' names
/// among the keys so that the parsers get past their first field.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        let key = prop::sample::select(vec![
            "model",
            "messages",
            "prompt",
            "role",
            "content",
            "n",
            "stream",
            "tools",
            "type",
            "function",
            "name",
            "parameters",
            "max_tokens",
            "stop",
            "logit_bias",
            "text",
            "tool_choice",
            "response_format",
            "input",
            "x",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..6).prop_map(|m| Value::Object(
                m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
            )),
        ]
    })
}

/// Reads `bytes` as every request type, and validates what parses.
fn read_all(bytes: &[u8]) {
    let started = Instant::now();
    if let Ok(r) = parse_json::<ChatCompletionRequest>(bytes) {
        if let Err(e) = r.validate() {
            assert!((400..500).contains(&e.status()), "{e:?}");
        }
    }
    if let Ok(r) = parse_json::<CompletionRequest>(bytes) {
        let _ = r.validate();
    }
    if let Ok(r) = parse_json::<EmbeddingRequest>(bytes) {
        let _ = r.validate();
    }
    if let Err(e) = parse_json::<ChatCompletionRequest>(bytes) {
        assert_eq!(e.status(), 400);
    }
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        read_all(&bytes);
    }

    #[test]
    fn any_json_value(value in any_json()) {
        read_all(value.to_string().as_bytes());
    }

    #[test]
    fn near_valid_requests(messages in prop::collection::vec(any_json(), 0..4), extra in any_json()) {
        let mut body = json!({"model": "m", "messages": messages, "prompt": extra.clone()});
        if let Value::Object(fields) = extra {
            body.as_object_mut().unwrap().extend(fields);
        }
        read_all(body.to_string().as_bytes());
    }
}

/// Nesting far past any request's: refused by the JSON reader's depth limit, not
/// a stack overflow.
#[test]
fn deep_nesting_is_refused_not_overflowed() {
    for depth in [200, 10_000, 1_000_000] {
        let body =
            format!("{{\"model\":\"m\",\"messages\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
        read_all(body.as_bytes());
        let err = parse_json::<ChatCompletionRequest>(body.as_bytes()).unwrap_err();
        assert_eq!(err.status(), 400);
    }
}

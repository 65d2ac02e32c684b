//! Bounded fuzzing of what a request makes the engine build before any llama.cpp
//! call: the JSON-schema converter, the grammar budget that every grammar passes
//! (the GBNF builder's literals included), and chat templates (the built-in ones
//! and the shipped Jinja fixtures). No input may panic, overflow the stack or
//! take longer than its bound; what is refused is refused as an error.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{json, Value};
use slotgate_engine::constrain::{budget, schema};
use slotgate_engine::template::jinja::JinjaTemplate;
use slotgate_engine::template::ChatTemplate;
use slotgate_protocol::{ChatMessage, Tool};

/// Schema-shaped JSON: the converter's keywords, nested, with `$ref`s into
/// `$defs` that may loop or chain.
fn schema_like() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        prop::sample::select(vec![
            "string", "integer", "number", "boolean", "null", "object", "array", "bogus"
        ])
        .prop_map(|t| json!({"type": t})),
        (0u32..6).prop_map(|i| json!({"$ref": format!("#/$defs/d{i}")})),
        Just(json!(true)),
        Just(json!(false)),
        Just(json!({"enum": [1, "a", null]})),
        Just(json!({"const": {"k": [1]}})),
        Just(json!({"type": "string", "minLength": 2, "maxLength": 1})),
        Just(json!({"pattern": "x"})),
        Just(json!(7)),
    ];
    leaf.prop_recursive(6, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 1..4).prop_map(|v| json!({"anyOf": v})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"oneOf": v})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"allOf": v})),
            (inner.clone(), 0u64..4, prop::option::of(0u64..6)).prop_map(|(items, min, max)| {
                json!({"type": "array", "items": items, "minItems": min, "maxItems": max})
            }),
            (prop::collection::btree_map("[a-c]{1,2}", inner.clone(), 0..4), any::<bool>())
                .prop_map(|(props, all)| {
                    let required: Vec<&String> = if all { props.keys().collect() } else { vec![] };
                    json!({"type": "object", "properties": props, "required": required})
                }),
            (inner.clone(), prop::collection::vec(inner, 0..6)).prop_map(|(root, defs)| {
                let defs: serde_json::Map<String, Value> =
                    defs.into_iter().enumerate().map(|(i, d)| (format!("d{i}"), d)).collect();
                let mut root = if root.is_object() { root } else { json!({"anyOf": [root]}) };
                root["$defs"] = Value::Object(defs);
                root
            }),
        ]
    })
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    assert!(started.elapsed() < Duration::from_secs(1), "{what} took {:?}", started.elapsed());
    out
}

fn fixture(name: &str) -> JinjaTemplate {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/templates")
        .join(name);
    let source = std::fs::read_to_string(&path).unwrap();
    JinjaTemplate::new(source, "<s>".into(), "</s>".into()).unwrap()
}

/// A message of any role and shape that the request parser lets through.
fn message() -> impl Strategy<Value = Value> {
    let text = ".{0,40}";
    prop_oneof![
        (prop::sample::select(vec!["system", "developer", "user", "assistant"]), text)
            .prop_map(|(role, content)| json!({"role": role, "content": content})),
        prop::collection::vec(text, 1..3).prop_map(|parts| json!({"role": "user",
            "content": parts.into_iter().map(|t| json!({"type": "text", "text": t})).collect::<Vec<_>>()})),
        (text, "[a-z_]{1,8}").prop_map(|(args, name)| json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}]})),
        text.prop_map(|t| json!({"role": "tool", "tool_call_id": "c1", "content": t})),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn any_schema_converts_or_is_refused_within_the_budget(schema in schema_like()) {
        let grammar = timed("the converter", || schema::to_gbnf(&schema));
        if let Ok(grammar) = grammar {
            timed("the budget", || { let _ = budget::check(&grammar); });
        }
    }

    #[test]
    fn every_literal_is_a_grammar(text in any::<String>()) {
        let schema = json!({"const": text});
        let grammar = schema::to_gbnf(&schema).unwrap();
        prop_assert!(budget::check(&grammar).is_ok(), "{grammar}");
    }

    #[test]
    fn any_conversation_renders_or_is_refused(messages in prop::collection::vec(message(), 1..6)) {
        let messages: Vec<ChatMessage> = serde_json::from_value(Value::Array(messages)).unwrap();
        let tools: Vec<Tool> = serde_json::from_value(json!([{"type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}}}])).unwrap();
        for template in ["gemma", "chatml", "llama3"] {
            let template = ChatTemplate::by_name(template).unwrap();
            timed("a built-in template", || template.render(&messages, true));
        }
        for name in ["qwen2.5-tools.jinja", "llama3.jinja"] {
            let template = fixture(name);
            timed("a Jinja template", || { let _ = template.render(&messages, Some(&tools), true, &Default::default()); });
        }
    }
}

/// Schemas nested or chained far past the converter's depth are refused, never
/// overflow the stack.
#[test]
fn deep_schemas_are_refused_not_overflowed() {
    let mut nested = json!({"type": "string"});
    for _ in 0..2_000 {
        nested = json!({"type": "array", "items": nested});
    }
    assert!(schema::to_gbnf(&nested).is_err());
    let mut defs = serde_json::Map::new();
    for i in 0..50_000 {
        defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
    }
    defs.insert("d50000".into(), json!({"type": "null"}));
    assert!(schema::to_gbnf(&json!({"$ref": "#/$defs/d0", "$defs": defs})).is_err());
}

//! The Jinja templates shipped as fixtures (a Qwen 2.5-style one with tools, a
//! Llama 3-style one), rendered to the exact strings those templates produce.

use serde_json::json;
use slotgate_engine::template::jinja::JinjaTemplate;
use slotgate_protocol::{ChatMessage, Role, Tool};

fn fixture(name: &str) -> JinjaTemplate {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/templates")
        .join(name);
    let source = std::fs::read_to_string(&path).unwrap();
    JinjaTemplate::new(source, "<|begin_of_text|>".into(), "<|eot_id|>".into()).unwrap()
}

#[test]
fn qwen_style_template_writes_tools_calls_and_results() {
    let tools: Vec<Tool> = serde_json::from_value(json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]))
    .unwrap();
    let messages: Vec<ChatMessage> = serde_json::from_value(json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}
    ]))
    .unwrap();
    let prompt = fixture("qwen2.5-tools.jinja")
        .render(&messages, Some(&tools), true, &Default::default())
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
         {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", \
         \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}\n</tool_call><|im_end|>\n\
         <|im_start|>user\nWeather in Paris?<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\nSunny\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let plain = fixture("qwen2.5-tools.jinja")
        .render(&[ChatMessage::new(Role::User, "Hi")], None, true, &Default::default())
        .unwrap();
    assert_eq!(
        plain,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn llama3_style_template_with_its_date_and_its_own_errors() {
    let template = fixture("llama3.jinja");
    let messages =
        [ChatMessage::new(Role::System, " Be brief. "), ChatMessage::new(Role::User, "Hi")];
    let prompt = template.render(&messages, None, true, &Default::default()).unwrap();
    let (head, rest) = prompt.split_once("Today Date: ").unwrap();
    assert_eq!(
        head,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    );
    let (date, tail) = rest.split_once("\n\n").unwrap();
    assert_eq!(date.len(), "04 Dec 2026".len(), "{date}");
    assert_eq!(
        tail,
        "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    // The template's own raise_exception is a 400 that carries its message.
    let err = template
        .render(&[ChatMessage::new(Role::Developer, "x")], None, true, &Default::default())
        .unwrap_err();
    assert_eq!(err.status(), 400);
    assert!(err.message.contains("Conversation roles must be"), "{}", err.message);
}

#[test]
fn a_template_that_does_not_parse_says_where() {
    let err = JinjaTemplate::new("{% for m in messages %}".into(), String::new(), String::new())
        .unwrap_err();
    assert!(err.contains("line 1") || err.contains("unexpected end"), "{err}");
}

/// A reasoning model's template (Qwen 3's) is given each turn's reasoning back,
/// and a turn that only calls tools has empty text rather than none, which the
/// template tests with `in` (and fails on none).
#[test]
fn reasoning_goes_back_to_the_template_and_call_only_turns_have_text() {
    let call = |id: &str, name: &str| json!([{"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}}]);
    let messages: Vec<ChatMessage> = serde_json::from_value(json!([
        {"role": "user", "content": "Fix the bug"},
        {"role": "assistant", "content": null, "reasoning_content": "List the files first.",
            "tool_calls": call("c1", "ls")},
        {"role": "tool", "tool_call_id": "c1", "content": "main.py"},
        {"role": "assistant", "content": null, "reasoning_content": "Now read main.py.",
            "tool_calls": call("c2", "read")},
        {"role": "tool", "tool_call_id": "c2", "content": "print('hi')"}
    ]))
    .unwrap();
    let prompt = fixture("qwen3.jinja").render(&messages, None, true, &Default::default()).unwrap();
    for reasoning in
        ["<think>\nList the files first.\n</think>", "<think>\nNow read main.py.\n</think>"]
    {
        assert!(prompt.contains(reasoning), "{reasoning} missing from {prompt}");
    }
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    // Closed: no turn opened after the last message.
    let closed =
        fixture("qwen3.jinja").render(&messages, None, false, &Default::default()).unwrap();
    assert!(closed.ends_with("</tool_response><|im_end|>\n"), "{closed}");
}

/// `enable_thinking` (true unless a request's `chat_template_kwargs` say) and
/// today's date reach templates as llama.cpp gives them; a variable never
/// replaces what the request itself says.
#[test]
fn template_variables_come_from_the_request_and_the_clock() {
    let hi = [ChatMessage::new(Role::User, "Hi")];
    let qwen3 = fixture("qwen3.jinja");
    let default = qwen3.render(&hi, None, true, &Default::default()).unwrap();
    assert!(default.ends_with("<|im_start|>assistant\n"), "{default}");
    let off: serde_json::Map<String, serde_json::Value> =
        serde_json::from_value(json!({"enable_thinking": false})).unwrap();
    let without = qwen3.render(&hi, None, true, &off).unwrap();
    assert!(without.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{without}");

    let probe = JinjaTemplate::new(
        "{{ date_string }}|{{ datetime }}|{{ enable_thinking }}|{{ messages|length }}|{{ custom }}"
            .into(),
        String::new(),
        String::new(),
    )
    .unwrap();
    let kwargs = serde_json::from_value(json!({"messages": "overridden?", "custom": 7})).unwrap();
    let text = probe.render(&hi, None, true, &kwargs).unwrap();
    let parts: Vec<&str> = text.split('|').collect();
    let year = parts[0].rsplit(' ').next().unwrap().parse::<u32>().unwrap();
    assert!(year >= 2025 && parts[1].ends_with(&year.to_string()), "{text}");
    assert_eq!(&parts[2..], ["True", "1", "7"], "{text}");
}

/// What templates in the wild write: `tojson(indent=4)` (Llama 3's) and
/// `{% break %}` (Command R7B's).
#[test]
fn keyword_indent_and_loop_controls_render() {
    let source = "{{ x | tojson(indent=2) }}|{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}\
                  {% endif %}{{ i }}{% endfor %}|{{ x | tojson(2) }}";
    let template = JinjaTemplate::new(source.into(), String::new(), String::new()).unwrap();
    let kwargs = serde_json::from_value(json!({"x": {"a": 1}})).unwrap();
    let text = template.render(&[ChatMessage::new(Role::User, "Hi")], None, true, &kwargs).unwrap();
    assert_eq!(text, "{\n  \"a\": 1\n}|1|{\n  \"a\": 1\n}");
}

/// Firefunction v2's template reads `functions` (the tools as JSON text, as
/// llama.cpp gives them to it) without setting it: with tools, without, and
/// with none at all it renders, with today's date in its system prompt.
#[test]
fn a_template_that_reads_functions_gets_the_tools_as_text() {
    let template = fixture("firefunction-v2.jinja");
    let hi = [ChatMessage::new(Role::User, "What is today?")];
    let tools: Vec<Tool> = serde_json::from_value(json!([{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}}]))
    .unwrap();
    for tools in [None, Some(&[][..]), Some(&tools[..])] {
        let prompt = template.render(&hi, tools, true, &Default::default()).unwrap();
        assert!(prompt.contains("Available functions as JSON spec:\n"), "{prompt}");
        assert!(prompt.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"), "{prompt}");
        let listed = prompt.contains("\"name\": \"get_weather\"");
        assert_eq!(listed, tools.is_some_and(|t| !t.is_empty()), "{prompt}");
    }
}

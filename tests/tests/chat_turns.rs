//! How a chat prompt ends, on the real model: a last assistant message is
//! continued (a prefill, as llama-server and Anthropic's API do it), closed on
//! request (vLLM's `continue_final_message: false`, `add_generation_prompt`),
//! shown in llama-server's `__verbose`; and llama-server's switches for
//! `/slots` and `/metrics`.

use serde_json::{json, Value};
use slotgate_tests::*;

fn conversation(last: Value) -> Value {
    json!([{"role": "system", "content": "Book"},
           {"role": "user", "content": "What is the best book"},
           {"role": "assistant", "content": last}])
}

/// The prompt the engine rendered for `extra`, from `__verbose`.
async fn rendered(client: &reqwest::Client, url: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({"max_tokens": 4, "temperature": 0, "verbose": true,
        "messages": conversation(json!("Whill"))});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    post(client, url, &body).await
}

#[tokio::test]
async fn a_last_assistant_message_is_continued_unless_closed() {
    let engine = engine(&["--chat-template", "chatml"]);
    let client = client();
    let url = format!("{}/v1/chat/completions", engine.url);
    let turns = "<|im_start|>system\nBook<|im_end|>\n<|im_start|>user\nWhat is the best book\
                 <|im_end|>\n<|im_start|>assistant\n";

    let (status, answer) = rendered(&client, &url, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let verbose = &answer["__verbose"];
    assert_eq!(verbose["prompt"], format!("{turns}Whill"), "{answer}");
    // The native result's fields, counted as the answer counts them.
    assert_eq!(verbose["content"], answer["choices"][0]["message"]["content"]);
    assert_eq!(verbose["tokens_predicted"], answer["usage"]["completion_tokens"]);
    assert_eq!(verbose["tokens_evaluated"], answer["usage"]["prompt_tokens"]);

    // Parts are joined by a blank line, as llama-server joins them.
    let parts = json!([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]);
    let (_, answer) = rendered(&client, &url, json!({"messages": conversation(parts)})).await;
    assert_eq!(answer["__verbose"]["prompt"], format!("{turns}Wh\n\nill"));

    let explicit = json!({"continue_final_message": true, "add_generation_prompt": false});
    let (_, answer) = rendered(&client, &url, explicit).await;
    assert_eq!(answer["__verbose"]["prompt"], format!("{turns}Whill"));

    // Closed: the message ends, and a new turn opens unless told not to.
    let (_, answer) = rendered(&client, &url, json!({"continue_final_message": false})).await;
    let prompt = format!("{turns}Whill<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(answer["__verbose"]["prompt"], prompt);
    let closed = json!({"continue_final_message": false, "add_generation_prompt": false});
    let (_, answer) = rendered(&client, &url, closed).await;
    assert_eq!(answer["__verbose"]["prompt"], format!("{turns}Whill<|im_end|>\n"));

    // Contradictions are refused in OpenAI's envelope, naming the field.
    for bad in [
        json!({"continue_final_message": true}),
        json!({"continue_final_message": true, "add_generation_prompt": true}),
        json!({"continue_final_message": "reasoning_content", "add_generation_prompt": false}),
    ] {
        let (status, answer) = rendered(&client, &url, bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {answer}");
        assert_eq!(answer["error"]["param"], "continue_final_message", "{answer}");
    }
    let twice = json!({"messages": [{"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "assistant", "content": "Again"}]});
    let (status, answer) = rendered(&client, &url, twice).await;
    assert_eq!((status, answer["error"]["param"].as_str()), (400, Some("messages[2]")));

    // `__verbose` only when asked for; a stream's role chunk has no text yet.
    let (_, answer) = rendered(&client, &url, json!({"verbose": false})).await;
    assert!(answer.get("__verbose").is_none(), "{answer}");
    let body = json!({"max_tokens": 2, "stream": true, "messages": conversation(json!("Wh"))});
    let (status, streamed) = stream(&client, &url, &body).await;
    assert_eq!(status, 200);
    let first = &streamed.chunks[0]["choices"][0]["delta"];
    assert_eq!(first, &json!({"role": "assistant", "content": null}), "{first}");
}

/// llama-server's `--no-slots` and its `/metrics` without `--metrics`: a 501 in
/// the error envelope; on by default.
#[tokio::test]
async fn slots_and_metrics_can_be_switched_off() {
    let client = client();
    let off = engine(&["--slots-endpoint", "false", "--metrics-endpoint", "false"]);
    for path in ["/slots", "/metrics"] {
        let (status, body) = get(&client, &format!("{}{path}", off.url)).await;
        assert_eq!(status, 501, "{path}: {body}");
        assert_eq!(body["error"]["type"], "not_supported_error", "{body}");
    }
    drop(off);
    let on = engine(&[]);
    let (status, slots) = get(&client, &format!("{}/slots", on.url)).await;
    assert_eq!((status, slots.as_array().is_some_and(|s| !s.is_empty())), (200, true), "{slots}");
    let text = metrics(&client, &on.url).await;
    assert!(text.contains("slotgate_engine_"), "{text}");
}

/// A template file that does not parse is refused at start, naming why: the
/// default model has no template of its own to fall back on, and a chat must
/// never find that out as a 500.
#[test]
fn a_template_file_that_does_not_parse_fails_the_start() {
    let bad = TempFile::new("bad.jinja", "{% for m in messages %}{{ m.content }");
    let model = model_path();
    let mut child = std::process::Command::new(binary("slotgate-engine"))
        .args(["--model", model.to_str().unwrap(), "--port", "0", "--threads", "2"])
        .args(["--chat-template-file", bad.path.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the engine");
    // Bounded: an engine that started anyway is stopped and fails the test.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the engine started with a template that does not parse");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut said = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut said).unwrap();
    assert!(said.contains("does not parse as Jinja"), "{said}");
}

//! Streams that outlive their engine: real engines on the real default model
//! behind the gateway, one killed and one frozen mid-answer; every stream goes
//! on at another engine and ends as if nothing had happened. And the engine's
//! side of a move, alone: a stream resumed from any mark comes out the same.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use slotgate_tests::*;

/// A text that a grammar forces, long enough to be mid-answer at the kill.
const FORCED: &str = "Once upon a time a small robot counted the stars, one by one, every \
                      night, and wrote each number in a book that nobody else would ever read.";

/// What a client saw of one stream.
#[derive(Debug, Default)]
struct Seen {
    content: String,
    /// The bytes of each token, from the chunks' log probabilities.
    token_bytes: Vec<u8>,
    tokens: usize,
    ids: std::collections::BTreeSet<String>,
    finish: Option<String>,
    usage: Value,
    errors: Vec<String>,
    done: bool,
}

fn gbnf_literal(text: &str) -> String {
    format!("root ::= \"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Streams `body` to `url`, telling `started` once its first text came.
async fn watch(
    client: reqwest::Client,
    url: String,
    body: Value,
    started: tokio::sync::mpsc::UnboundedSender<()>,
) -> Seen {
    let response = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut seen = Seen::default();
    let mut decoder = slotgate_protocol::SseDecoder::new();
    let mut bytes = response.bytes_stream();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while let Some(chunk) = bytes.next().await {
        assert!(std::time::Instant::now() < deadline, "the stream did not end in time");
        for event in decoder.push(&chunk.expect("a clean stream")) {
            if event.is_done() {
                seen.done = true;
                continue;
            }
            let chunk: Value = serde_json::from_str(&event.data).expect("JSON");
            if chunk.get("error").is_some() {
                seen.errors.push(event.data.clone());
                continue;
            }
            seen.ids.insert(chunk["id"].as_str().unwrap_or_default().to_owned());
            if !chunk["usage"].is_null() {
                seen.usage = chunk["usage"].clone();
            }
            for choice in chunk["choices"].as_array().into_iter().flatten() {
                if let Some(text) = choice["delta"]["content"].as_str() {
                    if seen.content.is_empty() && !text.is_empty() {
                        let _ = started.send(());
                    }
                    seen.content.push_str(text);
                }
                for lp in choice["logprobs"]["content"].as_array().into_iter().flatten() {
                    seen.tokens += 1;
                    let bytes = lp["bytes"].as_array().cloned().unwrap_or_default();
                    seen.token_bytes.extend(bytes.iter().map(|b| b.as_u64().unwrap() as u8));
                }
                if let Some(reason) = choice["finish_reason"].as_str() {
                    seen.finish = Some(reason.to_owned());
                }
            }
        }
    }
    seen
}

#[tokio::test]
async fn streams_go_on_when_their_engines_are_killed_or_frozen_mid_answer() {
    let args = ["--n-parallel", "2", "--ctx-len", "512", "--threads", "1"];
    let (mut a, b, c) = (engine(&args), engine(&args), engine(&args));
    let env = [
        ("SLOTGATE_ROUTING__CHUNK_TIMEOUT_MS", "3000"),
        ("SLOTGATE_ROUTING__QUEUE_TIMEOUT_MS", "120000"),
        ("SLOTGATE_ROUTING__POLICY", "slots"),
    ];
    let gw = gateway(&[&a.url, &b.url, &c.url], &env);
    let client = client();
    ready(&client, &gw, 3).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    const LONG: u64 = 120;
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let streams: Vec<_> = (0..6)
        .map(|i| {
            let messages = json!([{"role": "user", "content": format!("Story number {i}:")}]);
            let body = if i % 3 == 0 {
                json!({"model": MODEL, "messages": messages, "stream": true,
                    "grammar": gbnf_literal(FORCED), "max_tokens": 200})
            } else {
                json!({"model": MODEL, "messages": messages, "stream": true, "temperature": 0,
                    "ignore_eos": true, "max_tokens": LONG, "logprobs": true,
                    "stream_options": {"include_usage": true}})
            };
            tokio::spawn(watch(client.clone(), url.clone(), body, started_tx.clone()))
        })
        .collect();
    for _ in 0..6 {
        tokio::time::timeout(Duration::from_secs(120), started.recv())
            .await
            .expect("every stream started");
    }
    // Every slot of the three engines holds one stream: two die, two freeze.
    for e in [&a, &b, &c] {
        let (_, slots) = get(&client, &format!("{}/slots", e.url)).await;
        let busy = slots.as_array().unwrap().iter().filter(|s| s["is_processing"] == true).count();
        assert_eq!(busy, 2, "{}: {slots}", e.url);
    }
    let frozen = b.pid().to_string();
    std::process::Command::new("kill").args(["-STOP", &frozen]).status().unwrap();
    a.kill();
    let mut all = Vec::new();
    for s in streams {
        all.push(s.await.unwrap());
    }
    std::process::Command::new("kill").args(["-CONT", &frozen]).status().unwrap();
    for (i, seen) in all.iter().enumerate() {
        assert!(seen.errors.is_empty(), "stream {i} saw an error: {:?}", seen.errors);
        assert!(seen.done && seen.finish.is_some(), "stream {i} ended: {seen:?}");
        assert_eq!(seen.ids.len(), 1, "stream {i} kept its id: {:?}", seen.ids);
        if i % 3 == 0 {
            assert_eq!(seen.content, FORCED, "stream {i}: a forced answer comes out exactly");
            continue;
        }
        // Every token once: as many as asked for, each in the text once.
        assert_eq!(seen.finish.as_deref(), Some("length"), "stream {i}");
        assert_eq!(seen.usage["completion_tokens"], LONG, "stream {i}: {}", seen.usage);
        assert_eq!(seen.tokens as u64, LONG, "stream {i}: each token's log probability once");
        assert_eq!(
            String::from_utf8_lossy(&seen.token_bytes),
            seen.content,
            "stream {i}: the text is its tokens, none repeated or lost"
        );
    }
    let m = metrics(&client, &gw.url).await;
    assert!(metric_sum_where(&m, "slotgate_stream_resumes_total", "reason=\"died\"") >= 2.0, "{m}");
    assert!(
        metric_sum_where(&m, "slotgate_stream_resumes_total", "reason=\"stalled\"") >= 2.0,
        "{m}"
    );
    assert!(metric_sum(&m, "slotgate_stream_resume_gap_seconds_count") >= 4.0, "{m}");
}

/// Streams `body` straight to an engine, marked: the events' text and the
/// marks' tokens, per mark.
async fn marked(client: &reqwest::Client, url: &str, body: &Value) -> Vec<(String, Vec<i64>)> {
    let response = client
        .post(url)
        .header(slotgate_protocol::resume::MARK_HEADER, "1")
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key(slotgate_protocol::resume::MARK_HEADER));
    let text = response.text().await.unwrap();
    let mut steps = Vec::new();
    let mut pending = String::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        if let Some(mark) = block.strip_prefix(slotgate_protocol::resume::MARK_PREFIX) {
            let ids = mark.split_once(' ').map_or("", |(_, ids)| ids);
            let ids = ids.split(',').filter_map(|t| t.parse().ok()).collect();
            steps.push((std::mem::take(&mut pending), ids));
        } else if let Some(data) = block.strip_prefix("data: ") {
            if let Ok(chunk) = serde_json::from_str::<Value>(data) {
                for choice in chunk["choices"].as_array().into_iter().flatten() {
                    pending.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
                }
            }
        }
    }
    steps
}

#[tokio::test]
async fn an_engine_goes_on_from_any_mark_of_a_stream_exactly() {
    let e = engine(&["--n-parallel", "1", "--ctx-len", "512"]);
    let client = client();
    let url = format!("{}/v1/chat/completions", e.url);
    // A stop string that the forced text reaches, and a JSON answer its schema forces.
    let forced = json!({"model": MODEL, "stream": true, "max_tokens": 100, "stop": ["robot counted"],
        "messages": [{"role": "user", "content": "Go on:"}], "grammar": gbnf_literal(FORCED)});
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false});
    let json_answer = json!({"model": MODEL, "stream": true, "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content": "A person:"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}});
    // A seeded draw at random: each token's draw comes from the seed and its
    // position, so a move does not start the random sequence over.
    let seeded = json!({"model": MODEL, "stream": true, "max_tokens": 40, "temperature": 1.0,
        "seed": 42, "messages": [{"role": "user", "content": "Tell me about the sea."}]});
    for body in [forced, json_answer, seeded] {
        let whole = marked(&client, &url, &body).await;
        let text: String = whole.iter().map(|(t, _)| t.as_str()).collect();
        assert!(!text.is_empty(), "{body}");
        // Resumed at every mark, the rest continues the text that came before.
        for k in 1..whole.len() {
            let tokens: Vec<i64> = whole[..k].iter().flat_map(|(_, ids)| ids.clone()).collect();
            let before: String = whole[..k].iter().map(|(t, _)| t.as_str()).collect();
            let mut resumed = body.clone();
            resumed["slotgate_resume"] =
                json!({"tokens": tokens, "id": "chatcmpl-moved", "created": 7, "opened": true});
            let (status, rest) = stream(&client, &url, &resumed).await;
            assert_eq!(status, 200);
            assert!(rest.chunks.iter().all(|c| c["id"] == "chatcmpl-moved"), "{:?}", rest.chunks);
            assert!(rest.chunks.iter().all(|c| c["choices"][0]["delta"]["role"].is_null()));
            let joined = format!("{before}{}", rest.text(0));
            if body["response_format"].is_object() {
                // Greedy draws may part at a near tie (the prompt is read in
                // one batch, not token by token), but the grammar goes on
                // from where it stood: the answer is one valid object.
                let value: Value = serde_json::from_str(&joined).expect("the answer is JSON");
                assert!(value["name"].is_string() && value["age"].is_i64(), "{value}");
            } else {
                assert_eq!(joined, text, "resumed at mark {k} of {body}");
            }
        }
    }
    // The stop string ended the forced answer before it: across any join.
    let (_, whole) = stream(
        &client,
        &url,
        &json!({"model": MODEL, "stream": true, "max_tokens": 100, "stop": ["robot counted"],
            "messages": [{"role": "user", "content": "Go on:"}], "grammar": gbnf_literal(FORCED)}),
    )
    .await;
    assert_eq!(whole.text(0), "Once upon a time a small ");
}

//! The engine, started as a binary on the real default model.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use slotgate_tests::*;

fn chat_body(content: &str, max_tokens: u32, stream: bool) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "stream": stream, "temperature": 0})
}

fn assert_envelope(body: &Value, kind: &str) {
    let err = &body["error"];
    assert_eq!(err["type"], kind, "{body}");
    assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(err.get("param").is_some() && err.get("code").is_some(), "{body}");
}

/// The first seed bug: a long stream, a plain request while it runs, then another
/// stream, all in one engine with a single slot and a queue. All succeed.
#[tokio::test]
async fn non_streamed_request_during_a_stream_waits_and_succeeds() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "512", "--queue-size", "4"]);
    let client = client();
    let url = format!("{}/v1/chat/completions", engine.url);

    let long = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move {
            stream(&client, &url, &chat_body("Tell me a long story about the sea.", 80, true)).await
        }
    });
    // Let the stream take the slot first.
    wait_slot_busy(&client, &engine.url).await;
    let plain = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { post(&client, &url, &chat_body("What is two plus two?", 8, false)).await }
    });
    let second = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { stream(&client, &url, &chat_body("Name a color.", 8, true)).await }
    });

    let (status, long) = long.await.unwrap();
    assert_eq!(status, 200);
    assert!(long.done, "first stream ended with [DONE]");
    assert_eq!(long.finish_reason(0).as_deref(), Some("length"));
    let (status, plain) = plain.await.unwrap();
    assert_eq!(status, 200, "{plain}");
    assert_eq!(plain["object"], "chat.completion");
    assert_eq!(plain["usage"]["completion_tokens"], 8);
    let (status, second) = second.await.unwrap();
    assert_eq!(status, 200);
    assert!(second.done);
}

/// What clients written for llama-server, or validating against OpenAI's
/// schema, expect: the paths without `/v1`, `refusal` in every chat message
/// (the schema requires it), and a `system_fingerprint`.
#[tokio::test]
async fn llama_server_paths_and_the_fields_openai_requires() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "512"]);
    let client = client();
    for path in ["/chat/completions", "/v1/chat/completions"] {
        let (status, chat) =
            post(&client, &format!("{}{path}", engine.url), &chat_body("Hi", 2, false)).await;
        assert_eq!(status, 200, "{path}: {chat}");
        let message = &chat["choices"][0]["message"];
        assert!(message.get("refusal").is_some_and(Value::is_null), "{path}: {chat}");
        assert!(chat["system_fingerprint"].as_str().is_some_and(|f| f.starts_with("slotgate-")));
    }
    // No `model`: the only one loaded, as llama-server serves what it has.
    let (status, unnamed) = post(
        &client,
        &format!("{}/v1/chat/completions", engine.url),
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    )
    .await;
    assert_eq!((status, unnamed["model"].as_str()), (200, Some(MODEL)), "{unnamed}");
    // llama-server's `/completions` is its own API, as `/completion` is.
    let body = json!({"model": MODEL, "prompt": "One, two,", "n_predict": 2});
    let (status, text) = post(&client, &format!("{}/completions", engine.url), &body).await;
    assert_eq!((status, text["tokens_predicted"].as_u64()), (200, Some(2)), "{text}");
    let body = json!({"model": MODEL, "input": "Hi", "max_output_tokens": 2, "store": false});
    let (status, answer) = post(&client, &format!("{}/responses", engine.url), &body).await;
    assert_eq!((status, answer["object"].as_str()), (200, Some("response")), "{answer}");
    let body = json!({"model": MODEL, "input": "Hi"});
    let url = format!("{}/responses/input_tokens", engine.url);
    let (status, count) = post(&client, &url, &body).await;
    assert!(status == 200 && count["input_tokens"].as_u64() > Some(0), "{count}");
    let models: Value =
        client.get(format!("{}/models", engine.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);

    // `/tokenize` and `/detokenize`, in llama-server's shapes, round trip.
    let text = "Hello, world! <start_of_turn>";
    let tokenize = format!("{}/tokenize", engine.url);
    let (status, plain) = post(&client, &tokenize, &json!({"content": text})).await;
    assert_eq!(status, 200, "{plain}");
    let ids: Vec<i64> =
        plain["tokens"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect();
    assert!(ids.len() >= 4, "{plain}");
    let (_, bos) = post(&client, &tokenize, &json!({"content": text, "add_special": true})).await;
    assert_eq!(bos["tokens"].as_array().unwrap().len(), ids.len() + 1, "BOS added: {bos}");
    let (_, unparsed) =
        post(&client, &tokenize, &json!({"content": text, "parse_special": false})).await;
    assert!(unparsed["tokens"].as_array().unwrap().len() > ids.len(), "the marker read as text");
    let (_, pieces) =
        post(&client, &tokenize, &json!({"content": text, "with_pieces": true})).await;
    let joined: String =
        pieces["tokens"].as_array().unwrap().iter().map(|t| t["piece"].as_str().unwrap()).collect();
    assert_eq!(joined, text, "{pieces}");
    let detokenize = format!("{}/detokenize", engine.url);
    let (status, back) = post(&client, &detokenize, &json!({"tokens": ids})).await;
    assert_eq!((status, back["content"].as_str()), (200, Some(text)), "{back}");
    let (status, bad) = post(&client, &detokenize, &json!({"tokens": [1, 99999999]})).await;
    assert_eq!((status, bad["error"]["param"].as_str()), (400, Some("tokens")), "{bad}");
    let (status, bad) = post(&client, &tokenize, &json!({"content": "x", "model": "nope"})).await;
    assert_eq!(status, 404, "{bad}");

    // `/apply-template`: the prompt a chat request would decode (the default
    // model has no template of its own: Gemma's, by its architecture).
    let apply = format!("{}/apply-template", engine.url);
    let messages =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]);
    let (status, rendered) = post(&client, &apply, &json!({"messages": messages})).await;
    assert_eq!(status, 200, "{rendered}");
    assert_eq!(
        rendered["prompt"],
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    let (status, empty) = post(&client, &apply, &json!({"messages": []})).await;
    assert_eq!((status, empty["error"]["param"].as_str()), (400, Some("messages")), "{empty}");
    // `/props`, in llama-server's shape.
    let (status, props) = get(&client, &format!("{}/props", engine.url)).await;
    assert_eq!(status, 200, "{props}");
    assert_eq!(props["total_slots"], 1);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 512);
    assert_eq!(
        (props["chat_template_name"].as_str(), props["chat_template"].as_str()),
        (Some("gemma"), Some(""))
    );
    assert_eq!(props["model_alias"], MODEL);
    let (status, _) = get(&client, &format!("{}/props?model=nope", engine.url)).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn full_queue_is_a_clean_503_with_retry_after() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "512", "--queue-size", "0"]);
    let client = client();
    let url = format!("{}/v1/chat/completions", engine.url);
    let running = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { stream(&client, &url, &chat_body("Count to one hundred.", 60, true)).await }
    });
    wait_slot_busy(&client, &engine.url).await;
    for stream_it in [false, true] {
        let response = client.post(&url).json(&chat_body("Hi", 4, stream_it)).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
        let body: Value = response.json().await.unwrap();
        assert_envelope(&body, "unavailable_error");
        assert_eq!(body["error"]["code"], "slot_unavailable");
    }
    let (status, done) = running.await.unwrap();
    assert_eq!((status, done.done), (200, true), "the running stream was not disturbed");
}

#[tokio::test]
async fn queued_request_that_waits_too_long_gets_503() {
    let engine = engine(&[
        "--n-parallel",
        "1",
        "--ctx-len",
        "512",
        "--queue-size",
        "4",
        "--queue-timeout-ms",
        "300",
    ]);
    let client = client();
    let url = format!("{}/v1/chat/completions", engine.url);
    let running = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { stream(&client, &url, &chat_body("Count to one hundred.", 150, true)).await }
    });
    wait_slot_busy(&client, &engine.url).await;
    let started = Instant::now();
    let (status, body) = post(&client, &url, &chat_body("Hi", 4, false)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "slot_unavailable");
    assert!(body["error"]["message"].as_str().unwrap().contains("queue_timeout_ms"), "{body}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    let (status, done) = running.await.unwrap();
    assert_eq!((status, done.done), (200, true));
}

#[tokio::test]
async fn client_disconnect_frees_the_slot_and_clears_its_cache() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "1024"]);
    let client = client();
    let url = format!("{}/v1/chat/completions", engine.url);
    let response = client
        .post(&url)
        .json(&chat_body("Tell me a very long story.", 900, true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    // The slot shows busy before its first token leaves.
    let slots_url = format!("{}/slots", engine.url);
    assert_eq!(get(&client, &slots_url).await.1[0]["is_processing"], true);
    drop(body);

    let freed = eventually(Duration::from_secs(10), || async {
        let slot = get(&client, &slots_url).await.1[0].clone();
        slot["is_processing"] == json!(false) && slot["n_cached"] == json!(0)
    })
    .await;
    assert!(freed, "slot still busy or cached: {}", get(&client, &slots_url).await.1);
    let metrics =
        client.get(format!("{}/metrics", engine.url)).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("slotgate_engine_cancelled_total{model=\"gemma-3-270m-q4_k_m\"} 1"),
        "{metrics}"
    );
    let (status, _) = post(&client, &url, &chat_body("Hi", 4, false)).await;
    assert_eq!(status, 200, "the freed slot serves the next request");
    // `/slots` is published before an answer's events are sent: once the answer is
    // here, the slot shows free at once, with that answer's prompt cached.
    let slot = get(&client, &slots_url).await.1[0].clone();
    assert_eq!(slot["is_processing"], false, "{slot}");
    assert!(slot["n_cached"].as_u64().is_some_and(|n| n > 0), "{slot}");
}

/// The third seed bug: concurrent callers with several prompts and `n > 1` each get
/// their own answers, every choice at the index of its prompt and sample.
#[tokio::test]
async fn choices_carry_the_index_of_their_prompt_under_concurrency() {
    let engine = engine(&["--n-parallel", "4", "--ctx-len", "256", "--batch-size", "256"]);
    let client = client();
    let url = format!("{}/v1/completions", engine.url);
    let mut calls = Vec::new();
    for caller in 0..4u64 {
        let (client, url) = (client.clone(), url.clone());
        calls.push(tokio::spawn(async move {
            // Each prompt counts on from its own number; its answer names the next.
            let bases: Vec<u64> = (0..3).map(|p| 10 * (caller + 1) + 100 * p).collect();
            let prompts: Vec<String> =
                bases.iter().map(|b| format!("{}, {}, {}, {},", b, b + 1, b + 2, b + 3)).collect();
            let body = json!({"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 6,
                              "temperature": 0, "stream": caller % 2 == 1});
            let texts: Vec<String> = if caller % 2 == 1 {
                let (status, s) = stream(&client, &url, &body).await;
                assert_eq!(status, 200);
                assert!(s.done);
                let ids: HashSet<_> = s.chunks.iter().map(|c| c["id"].clone()).collect();
                assert_eq!(ids.len(), 1, "one id per stream");
                (0..6).map(|i| s.text(i)).collect()
            } else {
                let (status, r) = post(&client, &url, &body).await;
                assert_eq!(status, 200, "{r}");
                let choices = r["choices"].as_array().unwrap();
                assert_eq!(choices.len(), 6);
                for (i, c) in choices.iter().enumerate() {
                    assert_eq!(c["index"], i, "choices are in index order");
                }
                choices.iter().map(|c| c["text"].as_str().unwrap().to_owned()).collect()
            };
            for (i, text) in texts.iter().enumerate() {
                let want = bases[i / 2] + 4;
                assert!(
                    text.trim_start().starts_with(&want.to_string()),
                    "caller {caller} choice {i}: {text:?} should continue with {want}"
                );
            }
            caller
        }));
    }
    for call in calls {
        call.await.unwrap();
    }
}

#[tokio::test]
async fn stop_strings_max_tokens_usage_and_seeds() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "256"]);
    let client = client();
    let url = format!("{}/v1/completions", engine.url);

    // A stop string ends the text before it, streamed or not, and never leaks.
    let body = json!({"model": MODEL, "prompt": "1, 2, 3, 4,", "max_tokens": 12, "temperature": 0, "stop": [" 7"]});
    let (status, r) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{r}");
    let text = r["choices"][0]["text"].as_str().unwrap();
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert!(text.contains('5') && !text.contains('7'), "{text:?}");
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (_, s) = stream(&client, &url, &streamed_body).await;
    assert_eq!(s.text(0), text, "streamed text equals the plain text");
    assert_eq!(s.finish_reason(0).as_deref(), Some("stop"));

    // max_tokens: exactly that many tokens, finish_reason length.
    let body =
        json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 7, "temperature": 0});
    let (_, r) = post(&client, &url, &body).await;
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 7);
    let prompt_tokens = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(r["usage"]["total_tokens"], prompt_tokens + 7);

    // A prompt of token ids counts exactly those tokens.
    let body = json!({"model": MODEL, "prompt": [2, 818, 5279, 529, 496, 990], "max_tokens": 2, "temperature": 0});
    let (status, r) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], 6);

    // The same seed gives the same text at temperature 1; the seed matters. The
    // prompt cache is off: logits are not bit-identical across batch shapes (as in
    // llama.cpp's server), so only a fresh decode is reproducible token for token.
    let seeded = |seed: u64| {
        json!({"model": MODEL, "prompt": "My favourite animal is", "max_tokens": 16,
                                    "temperature": 1.0, "seed": seed, "cache_prompt": false})
    };
    let a = post(&client, &url, &seeded(7)).await.1["choices"][0]["text"].clone();
    for _ in 0..2 {
        let b = post(&client, &url, &seeded(7)).await.1["choices"][0]["text"].clone();
        assert_eq!(a, b, "same seed, same text");
    }
    let mut texts = HashSet::new();
    for seed in 1..=4u64 {
        texts.insert(post(&client, &url, &seeded(seed)).await.1["choices"][0]["text"].to_string());
    }
    assert!(texts.len() > 1, "four seeds gave one text: {texts:?}");
}

#[tokio::test]
async fn context_limits_prompt_too_long_and_generation_to_the_end() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "64"]);
    let client = client();
    let url = format!("{}/v1/completions", engine.url);
    let long = "word ".repeat(200);
    let (status, r) = post(&client, &url, &json!({"model": MODEL, "prompt": long})).await;
    assert_eq!(status, 400, "{r}");
    assert_envelope(&r, "exceed_context_size_error");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("202 tokens") && message.contains("holds 64"), "{message}");
    // llama-server's two fields, which clients read to trim the prompt.
    assert_eq!(
        (r["error"]["n_prompt_tokens"].as_u64(), r["error"]["n_ctx"].as_u64()),
        (Some(202), Some(64))
    );

    // With no max_tokens limit, generation stops at the end of the slot's context.
    let body = json!({"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 1000, "temperature": 0});
    let (status, r) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    let total = r["usage"]["total_tokens"].as_u64().unwrap();
    assert!((60..=65).contains(&total), "prompt and answer fill the context: {total}");
}

#[tokio::test]
async fn multi_turn_chat_reuses_the_cached_prompt() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let client = client();
    let url = format!("{}/v1/chat/completions", engine.url);
    let mut messages =
        vec![json!({"role": "user", "content": "Describe a lighthouse in two sentences."})];
    let (_, first) = post(
        &client,
        &url,
        &json!({"model": MODEL, "messages": messages, "max_tokens": 30, "temperature": 0}),
    )
    .await;
    let first_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    messages
        .push(json!({"role": "assistant", "content": first["choices"][0]["message"]["content"]}));
    messages.push(json!({"role": "user", "content": "Now describe a harbour."}));
    let (_, second) = post(
        &client,
        &url,
        &json!({"model": MODEL, "messages": messages, "max_tokens": 10, "temperature": 0}),
    )
    .await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= first_prompt,
        "turn two reused {cached} of {prompt} tokens; turn one's prompt had {first_prompt}"
    );
    assert!(cached < prompt);
    let metrics =
        client.get(format!("{}/metrics", engine.url)).send().await.unwrap().text().await.unwrap();
    for name in [
        "slotgate_engine_slots",
        "slotgate_engine_slots_busy",
        "slotgate_engine_queue_depth",
        "slotgate_engine_requests_total",
        "slotgate_engine_prompt_tokens_total",
        "slotgate_engine_prompt_tokens_cached_total",
        "slotgate_engine_generated_tokens_total",
        "slotgate_engine_time_to_first_token_seconds_bucket",
        "slotgate_engine_time_per_output_token_seconds_bucket",
        "slotgate_engine_queue_wait_seconds_bucket",
    ] {
        assert!(metrics.contains(&format!("{name}{{")), "{name} missing from /metrics");
    }
    assert!(
        metrics.contains(&format!(
            "slotgate_engine_prompt_tokens_cached_total{{model=\"{MODEL}\"}} {cached}"
        )),
        "{metrics}"
    );
}

/// Bad input gets a 4xx in the envelope while other clients stream undisturbed.
#[tokio::test]
async fn bad_input_is_refused_while_others_stream() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "256", "--max-body-bytes", "4096"]);
    let client = client();
    let chat = format!("{}/v1/chat/completions", engine.url);
    let streams: Vec<_> = (0..2)
        .map(|i| {
            let (client, url) = (client.clone(), chat.clone());
            tokio::spawn(async move {
                stream(&client, &url, &chat_body(&format!("Story number {i}:"), 40, true)).await
            })
        })
        .collect();
    let raw = |body: &'static str| {
        let (client, url) = (client.clone(), chat.clone());
        async move {
            let r = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let cases: Vec<(u16, Value, &str, Option<&str>)> = vec![
        {
            let (s, b) = raw("{not json").await;
            (s, b, "invalid_request_error", None)
        },
        {
            let (s, b) = raw(r#"{"model":5,"messages":[]}"#).await;
            (s, b, "invalid_request_error", Some("model"))
        },
        {
            let (s, b) = post(
                &client,
                &chat,
                &json!({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}),
            )
            .await;
            (s, b, "not_found_error", Some("model"))
        },
        {
            let (s, b) = post(
                &client,
                &chat,
                &json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}),
            )
            .await;
            (s, b, "invalid_request_error", Some("n"))
        },
        {
            let (s, b) = post(&client, &chat, &json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0})).await;
            (s, b, "invalid_request_error", Some("max_tokens"))
        },
        {
            let (s, b) = post(&client, &chat, &json!({"model": MODEL, "messages": []})).await;
            (s, b, "invalid_request_error", Some("messages"))
        },
        {
            let (s, b) = post(&client, &chat, &json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(5000)}]})).await;
            (s, b, "invalid_request_error", None)
        },
        {
            let (s, b) = post(&client, &chat, &json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]})).await;
            (s, b, "invalid_request_error", Some("messages[0].content[0]"))
        },
    ];
    for (i, (status, body, kind, param)) in cases.iter().enumerate() {
        assert!((400..500).contains(status), "case {i}: {status} {body}");
        assert_envelope(body, kind);
        if let Some(param) = param {
            assert_eq!(body["error"]["param"], *param, "case {i}: {body}");
        }
    }
    assert_eq!(cases[6].0, 413, "an oversized body is 413");
    let (status, body) = get(&client, &format!("{}/v1/nothing", engine.url)).await;
    assert_eq!(status, 404);
    assert_envelope(&body, "not_found_error");
    for s in streams {
        let (status, s) = s.await.unwrap();
        assert_eq!(status, 200);
        assert!(s.done, "stream finished");
        assert_eq!(s.finish_reason(0).as_deref(), Some("length"));
    }
}

#[tokio::test]
async fn models_load_and_unload_at_run_time() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let client = client();
    let model = model_path();
    let load = format!("{}/v1/models/load", engine.url);

    // A missing file is a clear 400 and the loaded model keeps serving.
    let (status, body) =
        post(&client, &load, &json!({"model": "/nonexistent/x.gguf", "model_id": "x"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("/nonexistent/x.gguf"), "{body}");
    assert_eq!(body["error"]["param"], "model", "{body}");
    let not_gguf =
        std::env::temp_dir().join(format!("slotgate-not-a-model-{}.gguf", std::process::id()));
    std::fs::write(&not_gguf, b"this is not a model").unwrap();
    let (status, body) =
        post(&client, &load, &json!({"model": not_gguf, "model_id": "junk"})).await;
    std::fs::remove_file(&not_gguf).unwrap();
    assert_eq!(status, 400, "{body}");

    // Nitro's body form loads a second copy under another name.
    let (status, body) = post(
        &client,
        &format!("{}/inferences/llamacpp/loadmodel", engine.url),
        &json!({"llama_model_path": model, "model_id": "second", "ctx_len": 256, "n_parallel": 1}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, models) = get(&client, &format!("{}/v1/models", engine.url)).await;
    let ids: HashSet<_> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, HashSet::from([MODEL.to_owned(), "second".to_owned()]));

    // Both models answer at once, from the one scheduler thread.
    let url = format!("{}/v1/chat/completions", engine.url);
    let calls: Vec<_> = [MODEL, "second", MODEL, "second"]
        .into_iter()
        .map(|m| {
            let (client, url) = (client.clone(), url.clone());
            let body = json!({"model": m, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "stream": true});
            tokio::spawn(async move { (m, stream(&client, &url, &body).await) })
        })
        .collect();
    for call in calls {
        let (m, (status, s)) = call.await.unwrap();
        assert_eq!(status, 200);
        assert!(s.done);
        assert_eq!(s.chunks[0]["model"], m);
    }
    let (_, slots) = get(&client, &format!("{}/slots?model=second", engine.url)).await;
    assert_eq!(slots.as_array().unwrap().len(), 1);
    assert_eq!(slots[0]["model"], "second");

    let (status, _) =
        post(&client, &format!("{}/v1/models/unload", engine.url), &json!({"model": "second"}))
            .await;
    assert_eq!(status, 200);
    let (status, body) = post(
        &client,
        &url,
        &json!({"model": "second", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = post(&client, &url, &chat_body("Hi", 3, false)).await;
    assert_eq!(status, 200);
    let (status, health) = get(&client, &format!("{}/health", engine.url)).await;
    assert_eq!((status, &health["status"]), (200, &json!("ok")), "{health}");
    // The process it is, which names its stored responses: 16 hex digits.
    let instance = health["instance"].as_str().unwrap_or_default();
    assert!(instance.len() == 16 && instance.bytes().all(|b| b.is_ascii_hexdigit()), "{health}");
}

#[tokio::test]
async fn openai_python_sdk_chats_streamed_and_not() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "256"]);
    let out = tokio::task::spawn_blocking(move || {
        let out = python_client("openai_client.py", &[&engine.url, MODEL]);
        drop(engine);
        out
    })
    .await
    .unwrap();
    assert!(out.contains("openai sdk: ok"), "{out}");
}

/// Anthropic's Python SDK, unchanged, against the engine: messages whole and
/// streamed, a tool called and its result sent back, tokens counted, and the
/// SDK's own exceptions for bad requests.
#[tokio::test]
async fn anthropic_python_sdk_messages_tools_and_errors() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "1024"]);
    let out = tokio::task::spawn_blocking(move || {
        let out = python_client("anthropic_client.py", &[&engine.url, MODEL]);
        drop(engine);
        out
    })
    .await
    .unwrap();
    assert!(out.contains("anthropic sdk: ok"), "{out}");
}

/// OpenAI's Python SDK's Responses API, unchanged, against the engine:
/// whole and streamed, stored and continued warm by `previous_response_id`,
/// a function tool's call and output, input tokens, delete, and its errors.
#[tokio::test]
async fn openai_python_sdk_responses_store_continue_and_call_tools() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "1024"]);
    let out = tokio::task::spawn_blocking(move || {
        let out = python_client("responses_client.py", &[&engine.url, MODEL]);
        drop(engine);
        out
    })
    .await
    .unwrap();
    assert!(out.contains("responses sdk: ok"), "{out}");
}

/// The official Node SDKs, unchanged: one streamed call each (OpenAI's
/// Responses, Anthropic's Messages), checked against what the SDK assembles.
#[tokio::test]
async fn node_sdks_stream_a_response_and_a_message() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let out = tokio::task::spawn_blocking(move || {
        let out = node_client("sdk_stream.mjs", &[&engine.url, MODEL]);
        drop(engine);
        out
    })
    .await
    .unwrap();
    assert!(out.contains("node sdks: ok"), "{out}");
}

/// Every kind of answer validates against OpenAI's published OpenAPI document
/// (a copy in `tests/openai-openapi`): required fields such as a chat
/// message's `refusal` included.
#[tokio::test]
async fn answers_validate_against_openais_openapi_document() {
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openai-openapi/openapi.yaml");
    assert!(spec.is_file(), "{} is missing", spec.display());
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let out = tokio::task::spawn_blocking(move || {
        let out = python_client("openapi_check.py", &[&engine.url, MODEL, spec.to_str().unwrap()]);
        drop(engine);
        out
    })
    .await
    .unwrap();
    assert!(out.contains("valid: chat"), "{out}");
}

#[tokio::test]
async fn embeddings_in_both_encodings() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256", "--embedding", "true"]);
    let client = client();
    let url = format!("{}/v1/embeddings", engine.url);
    let body = json!({"model": MODEL, "input": ["a cat", "a dog", "a cat"]});
    let (status, r) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{r}");
    let data = r["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let vectors: Vec<Vec<f64>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
        })
        .collect();
    assert_eq!(vectors[0].len(), 640, "Gemma 3 270M is 640 wide");
    let norm: f64 = vectors[0].iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-3, "normalized: {norm}");
    assert_eq!(vectors[0], vectors[2], "same input, same vector");
    assert_ne!(vectors[0], vectors[1]);
    assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() >= 6);

    let (_, b64) = post(
        &client,
        &url,
        &json!({"model": MODEL, "input": "a cat", "encoding_format": "base64"}),
    )
    .await;
    let encoded: slotgate_protocol::EmbeddingVector =
        serde_json::from_value(b64["data"][0]["embedding"].clone()).unwrap();
    assert!(matches!(encoded, slotgate_protocol::EmbeddingVector::Base64(_)));
    let floats: Vec<f64> = encoded.to_floats().unwrap().into_iter().map(f64::from).collect();
    assert_eq!(floats.len(), 640);
    assert!(floats.iter().zip(&vectors[0]).all(|(a, b)| (a - b).abs() < 1e-6));
}

#[tokio::test]
async fn embeddings_are_refused_when_not_enabled() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "128"]);
    let (status, r) = post(
        &client(),
        &format!("{}/v1/embeddings", engine.url),
        &json!({"model": MODEL, "input": "x"}),
    )
    .await;
    assert_eq!(status, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("embedding"), "{r}");
}

/// When the first `data:` event of a streamed completion arrives.
async fn first_data_at(client: reqwest::Client, url: String, body: Value) -> Instant {
    let response = client.post(&url).json(&body).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 200);
    let mut bytes = response.bytes_stream();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Some(chunk) = bytes.next().await {
        assert!(Instant::now() < deadline, "no data within 60 s");
        seen.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        if seen.contains("data: ") {
            let at = Instant::now();
            while bytes.next().await.is_some() {}
            return at;
        }
    }
    panic!("the stream ended without data: {seen}");
}

/// A short request sent while a long prompt is being read, in chunks of 32
/// tokens: with `cont_batching` it takes the second slot at once, before the long
/// prompt's first token; without it, it waits until the long prompt is read.
/// Either way both complete.
#[tokio::test]
async fn cont_batching_decides_whether_a_request_joins_while_a_prompt_is_read() {
    let long_prompt = "The quick brown fox jumps over the lazy dog. ".repeat(80);
    for cont_batching in ["true", "false"] {
        let engine = engine(&[
            "--n-parallel",
            "2",
            "--ctx-len",
            "1024",
            "--cont-batching",
            cont_batching,
            "--batch-size",
            "32",
        ]);
        let client = client();
        let url = format!("{}/v1/completions", engine.url);
        let body = |prompt: &str, max_tokens: u32| {
            json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                   "temperature": 0, "stream": true, "cache_prompt": false})
        };
        let long = tokio::spawn(first_data_at(client.clone(), url.clone(), body(&long_prompt, 24)));
        wait_slot_busy(&client, &engine.url).await;
        // Watches for the moment both slots are busy.
        let both_busy = tokio::spawn({
            let (client, slots) = (client.clone(), format!("{}/slots", engine.url));
            async move {
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline {
                    let (_, s) = get(&client, &slots).await;
                    let busy = s
                        .as_array()
                        .map_or(0, |s| s.iter().filter(|x| x["is_processing"] == true).count());
                    if busy == 2 {
                        return Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                None
            }
        });
        let short = tokio::spawn(first_data_at(client.clone(), url.clone(), body("Hello", 4)));
        let long_first = long.await.unwrap();
        short.await.unwrap();
        let both = both_busy.await.unwrap().expect("both slots were busy at some point");
        eprintln!(
            "{cont_batching}: both {:?} long_first {:?}",
            both.elapsed(),
            long_first.elapsed()
        );
        if cont_batching == "true" {
            assert!(both < long_first, "the short request joined while the prompt was read");
        } else {
            assert!(both > long_first, "the short request waited until the prompt was read");
        }
    }
}

/// Every answer of the generation endpoints is counted once, by status: the
/// handler's, a body refused before the handler ran, and a model not served
/// (with an empty model label: a client's made-up names never become labels).
#[tokio::test]
async fn every_answer_is_counted_once_in_the_metrics() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let client = client();
    let url = |path: &str| format!("{}{path}", engine.url);
    let raw = |path: &str, body: &'static str| {
        client.post(url(path)).header("content-type", "application/json").body(body).send()
    };
    assert_eq!(raw("/v1/chat/completions", "{").await.unwrap().status(), 400);
    assert_eq!(
        raw("/v1/completions", r#"{"model":"nope","prompt":"x"}"#).await.unwrap().status(),
        404
    );
    let completion = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2});
    let (status, _) = post(&client, &url("/v1/completions"), &completion).await;
    assert_eq!(status, 200);
    let mut hot = completion.clone();
    hot["temperature"] = json!(5);
    assert_eq!(post(&client, &url("/completions"), &hot).await.0, 400);
    let embed = json!({"model": MODEL, "input": "x"});
    assert_eq!(post(&client, &url("/v1/embeddings"), &embed).await.0, 400, "not enabled");
    let metrics = client.get(url("/metrics")).send().await.unwrap().text().await.unwrap();
    let counted = |model: &str, status: u16| {
        let line =
            format!("slotgate_engine_requests_total{{model=\"{model}\",status=\"{status}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&line)).unwrap_or("0").to_owned()
    };
    assert_eq!(counted("", 400), "1", "the body refused before the handler\n{metrics}");
    assert_eq!(counted("", 404), "1", "the model not served");
    assert_eq!(counted(MODEL, 200), "1");
    assert_eq!(counted(MODEL, 400), "2", "refusals of a served model's requests");
    assert!(!metrics.contains("model=\"nope\""), "a client's name became a label");
}

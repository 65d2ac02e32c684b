//! llama-server's own API on the engine, as tools written for llama-server
//! call it, on the real default model: `/completion` in its prompt forms,
//! streamed and not, with the fields those tools read.

use serde_json::{json, Value};
use slotgate_tests::*;

/// The head of the answer to `request`, sent as it is written.
fn raw_head(url: &str, request: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap() == 1 {
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// The `data:` events of a llama-server stream, and whether a `[DONE]` came.
async fn events(client: &reqwest::Client, url: &str, body: &Value) -> (Vec<Value>, bool) {
    let text = client.post(url).json(body).send().await.unwrap().text().await.unwrap();
    let data = text.lines().filter_map(|l| l.strip_prefix("data: "));
    let done = data.clone().any(|d| d == "[DONE]");
    (data.filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect(), done)
}

/// `/completion` answers as llama-server does: the text, the ids of its
/// tokens (which detokenize to that text), why it stopped, its counts and
/// times, the slot that served it; streamed, one event per piece with its
/// token ids and a last one with everything, and no `[DONE]`.
#[tokio::test]
async fn completion_answers_in_llama_servers_shape() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let client = client();
    let url = format!("{}/completion", engine.url);
    let body = json!({"prompt": "I believe the meaning of life is", "n_predict": 8,
        "return_tokens": true, "temperature": 0});
    let (status, answer) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["stop"].as_bool(), answer["stop_type"].as_str()),
        (Some(true), Some("limit"))
    );
    assert_eq!(answer["tokens_predicted"], 8, "{answer}");
    assert_eq!(answer["timings"]["predicted_n"], 8, "{answer}");
    assert_eq!(answer["model"], MODEL);
    assert_eq!(answer["generation_settings"]["n_predict"], 8);
    assert!(answer["id_slot"].as_u64().is_some_and(|s| s < 2), "{answer}");
    let tokens = answer["tokens"].as_array().unwrap().clone();
    assert_eq!(tokens.len(), 8, "{answer}");
    let (_, text) =
        post(&client, &format!("{}/detokenize", engine.url), &json!({"tokens": tokens})).await;
    assert_eq!(text["content"], answer["content"], "the ids are the text's");
    let (_, prompt) = post(
        &client,
        &format!("{}/tokenize", engine.url),
        &json!({"content": "I believe the meaning of life is", "add_special": true}),
    )
    .await;
    let prompt_ids = prompt["tokens"].as_array().unwrap().len();
    assert_eq!(answer["tokens_evaluated"], prompt_ids, "{answer}");

    // Streamed: the same greedy text, piece by piece.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (events, done) = events(&client, &url, &streamed).await;
    assert!(!done, "llama-server's stream has no [DONE]");
    let (last, pieces) = events.split_last().unwrap();
    assert_eq!((last["stop"].as_bool(), last["tokens_predicted"].as_u64()), (Some(true), Some(8)));
    assert!(pieces
        .iter()
        .all(|e| e["stop"] == false && !e["tokens"].as_array().unwrap().is_empty()));
    let text: String = pieces.iter().map(|e| e["content"].as_str().unwrap()).collect();
    assert_eq!(text, answer["content"].as_str().unwrap());
    let ids: usize = pieces.iter().map(|e| e["tokens"].as_array().unwrap().len()).sum();
    assert_eq!(ids, 8);

    // `n_probs`: each token, and each of its alternatives, by id, text and
    // log probability; the greedy token is the likeliest.
    let probed = json!({"prompt": "I believe the meaning of life is", "n_predict": 3,
        "n_probs": 4, "temperature": 0});
    let (_, probed) = post(&client, &url, &probed).await;
    let probabilities = probed["completion_probabilities"].as_array().unwrap();
    assert_eq!(probabilities.len(), 3, "{probed}");
    for token in probabilities {
        let top = token["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 4, "{token}");
        assert!(top
            .iter()
            .all(|a| a["id"].as_i64().is_some() && a["logprob"].as_f64() <= Some(0.0)));
        assert_eq!(top[0]["id"], token["id"], "greedy: the likeliest: {token}");
    }

    // A stop string: the text before it, `word`, and which one.
    let body = json!({"prompt": "One, two, three,", "n_predict": 40, "stop": [",", " "],
        "temperature": 0});
    let (_, stopped) = post(&client, &url, &body).await;
    assert_eq!(stopped["stop_type"], "word", "{stopped}");
    let word = stopped["stopping_word"].as_str().unwrap();
    assert!([",", " "].contains(&word), "{stopped}");
    assert!(!stopped["content"].as_str().unwrap().contains([',', ' ']), "{stopped}");
}

/// llama-server's prompt forms: ids, ids and text mixed in one prompt, and
/// several prompts of different forms, which answer a list in prompt order.
#[tokio::test]
async fn completion_reads_every_prompt_form() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let client = client();
    let url = format!("{}/completion", engine.url);
    let text = "I believe the meaning of life is";
    let (_, prompt) = post(
        &client,
        &format!("{}/tokenize", engine.url),
        &json!({"content": text, "add_special": true}),
    )
    .await;
    let ids = prompt["tokens"].clone();
    let greedy = |prompt: Value| json!({"prompt": prompt, "n_predict": 4, "temperature": 0});
    let (status, by_text) = post(&client, &url, &greedy(json!(text))).await;
    assert_eq!(status, 200, "{by_text}");
    let (_, by_ids) = post(&client, &url, &greedy(ids.clone())).await;
    assert_eq!(by_ids["content"], by_text["content"], "ids read as the text's");
    assert_eq!(by_ids["tokens_evaluated"], by_text["tokens_evaluated"]);
    // The BOS id, then the text: the same prompt.
    let mixed = json!([ids[0], text]);
    let (status, by_mixed) = post(&client, &url, &greedy(mixed)).await;
    assert_eq!(status, 200, "{by_mixed}");
    assert_eq!(by_mixed["tokens_evaluated"], by_text["tokens_evaluated"], "{by_mixed}");
    let several = json!([ids, text, {"prompt_string": text}]);
    let (status, list) = post(&client, &url, &greedy(several)).await;
    assert_eq!(status, 200, "{list}");
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 3);
    for (i, one) in list.iter().enumerate() {
        assert_eq!(one["index"], i, "{one}");
        assert_eq!(one["tokens_evaluated"], by_text["tokens_evaluated"], "{one}");
    }
    // Refused clearly: media for a text model, an empty prompt, `n_predict: 0`.
    for (body, param) in [
        (greedy(json!([{"prompt_string": text, "multimodal_data": ["aGk="]}])), "prompt"),
        (greedy(json!([])), "prompt"),
        (json!({"prompt": text, "n_predict": 0}), "n_predict"),
    ] {
        let (status, refused) = post(&client, &url, &body).await;
        assert_eq!((status, refused["error"]["param"].as_str()), (400, Some(param)), "{refused}");
    }
}

/// With API keys (llama-server's `--api-key`, here from a key file), every
/// endpoint but `/health` and the model list needs one, as `Authorization:
/// Bearer` or `x-api-key`; without, a 401 in the route's own API's envelope.
#[tokio::test]
async fn api_keys_close_everything_but_health_and_the_model_list() {
    let keys = TempFile::new("keys.txt", "# the engine's keys\nsk-one\n\nsk-two\n");
    let file = keys.path.to_str().unwrap();
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256", "--api-key-file", file]);
    let client = client();
    let url = |path: &str| format!("{}{path}", engine.url);
    for path in ["/health", "/v1/health", "/v1/models", "/models"] {
        assert_eq!(get(&client, &url(path)).await.0, 200, "{path} stays open");
    }
    let body = json!({"prompt": "Hi", "n_predict": 2});
    let send = |path: &str, header: Option<(&str, &str)>| {
        let mut request = client.post(url(path)).json(&body);
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    for path in ["/completion", "/v1/completions", "/tokenize"] {
        for header in [None, Some(("authorization", "Bearer sk-three"))] {
            let (status, refused) = send(path, header).await;
            assert_eq!(status, 401, "{path}: {refused}");
            assert_eq!(refused["error"]["type"], "authentication_error", "{refused}");
        }
    }
    let (status, refused) = send("/v1/messages", Some(("x-api-key", "sk-three"))).await;
    assert_eq!((status, refused["type"].as_str()), (401, Some("error")), "{refused}");
    assert_eq!(refused["error"]["type"], "authentication_error", "Anthropic's envelope");
    let (status, metrics) = (client.get(url("/metrics")).send().await.unwrap().status(), ());
    assert_eq!((status.as_u16(), metrics), (401, ()), "metrics too, as llama-server's");
    for header in [("authorization", "Bearer sk-one"), ("x-api-key", "sk-two")] {
        let (status, answer) = send("/completion", Some(header)).await;
        assert_eq!(status, 200, "{header:?}: {answer}");
    }
}

/// `any_model_name`: while one model serves, any name gets it, as llama-server
/// answers the OpenAI library's default names; off (the default), a 404.
#[tokio::test]
async fn any_model_name_serves_the_only_model() {
    let body = json!({"model": "gpt-3.5-turbo", "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hi"}]});
    let client = client();
    let strict = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let (status, refused) =
        post(&client, &format!("{}/v1/chat/completions", strict.url), &body).await;
    assert_eq!(status, 404, "{refused}");
    drop(strict);
    let args = ["--n-parallel", "1", "--ctx-len", "256", "--any-model-name", "true"];
    let lenient = engine(&[&args[..], &["--n-predict", "3"]].concat());
    let (status, answer) =
        post(&client, &format!("{}/v1/chat/completions", lenient.url), &body).await;
    assert_eq!((status, answer["model"].as_str()), (200, Some(MODEL)), "{answer}");
    // The engine's own `n_predict` (llama-server's `--n-predict`): the default
    // of `/completion`, which a request's own overrides, as llama-server's does.
    let url = format!("{}/completion", lenient.url);
    let ask = |n: Option<u32>| json!({"prompt": "Once upon", "n_predict": n, "ignore_eos": true});
    for (body, n) in [(ask(None), 3), (ask(Some(12)), 12)] {
        let (status, answer) = post(&client, &url, &body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["tokens_predicted"], n, "{answer}");
        assert_eq!(answer["generation_settings"]["n_predict"], n, "{answer}");
    }
}

/// CORS (`cors_origins`): an allowed page's preflight is answered before any
/// key is asked for, and its answers carry its origin; another page's get no
/// CORS header; without the setting, no page gets one.
#[tokio::test]
async fn cors_lets_in_the_allowed_pages_only() {
    let keys = TempFile::new("keys.txt", "sk-one\n");
    let file = keys.path.to_str().unwrap();
    let args = ["--n-parallel", "1", "--ctx-len", "256", "--api-key-file", file];
    let engine =
        engine(&[&args[..], &["--cors-origins", "localhost,https://chat.example.com"]].concat());
    let client = client();
    let url = format!("{}/completion", engine.url);
    let preflight = |origin: &'static str| {
        client
            .request(reqwest::Method::OPTIONS, &url)
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization")
            .send()
    };
    for origin in ["http://localhost:3000", "http://[::1]", "https://chat.example.com"] {
        let r = preflight(origin).await.unwrap();
        assert_eq!(r.status(), 200, "{origin}");
        assert_eq!(r.headers()["access-control-allow-origin"], origin);
        assert_eq!(r.headers()["access-control-allow-credentials"], "true");
        assert!(r.headers()["access-control-allow-methods"].to_str().unwrap().contains("POST"));
    }
    for origin in ["http://localhost.evil.com", "https://evil.example.com"] {
        let r = preflight(origin).await.unwrap();
        assert_eq!(r.status(), 200, "answered as llama-server answers: {origin}");
        assert!(!r.headers().contains_key("access-control-allow-origin"), "{origin}");
    }
    // Header names go out as llama-server writes them, for the clients that
    // look them up as written.
    let head = raw_head(
        &engine.url,
        "OPTIONS /completion HTTP/1.1\r\nHost: x\r\n\
        Origin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\n\r\n",
    );
    assert!(head.contains("\r\nAccess-Control-Allow-Origin: http://localhost:3000\r\n"), "{head}");
    let body = json!({"prompt": "Hi", "n_predict": 1});
    let send = |origin: &'static str| {
        client.post(&url).bearer_auth("sk-one").header("origin", origin).json(&body).send()
    };
    let ok = send("http://127.0.0.1:5173").await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["access-control-allow-origin"], "http://127.0.0.1:5173");
    let other = send("https://evil.example.com").await.unwrap();
    assert!(!other.headers().contains_key("access-control-allow-origin"));
    drop(engine);

    let closed = slotgate_tests::engine(&args);
    let r = client
        .request(reqwest::Method::OPTIONS, format!("{}/completion", closed.url))
        .header("origin", "http://localhost:3000")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"), "off by default");
}

/// Slot files (`slot_save_path`, llama-server's `/slots/{id}?action=`): a
/// slot's sequence saved to a file, erased (the same prompt then finds nothing
/// cached), restored (it then finds its whole prompt cached); names that would
/// leave the directory refused.
#[tokio::test]
async fn a_slot_is_saved_erased_and_restored() {
    let dir = std::env::temp_dir().join(format!("slotgate-slots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = ["--n-parallel", "1", "--ctx-len", "512", "--slot-save-path", dir.to_str().unwrap()];
    let engine = engine(&args);
    let client = client();
    let url = |path: &str| format!("{}{path}", engine.url);
    let body = json!({"prompt": "Once upon a time there was a small town by the sea, where",
        "n_predict": 4, "temperature": 0});
    let (status, first) = post(&client, &url("/completion"), &body).await;
    assert_eq!(status, 200, "{first}");
    let prompt = first["tokens_evaluated"].as_u64().unwrap();
    let file = json!({"filename": "town.bin"});
    let (status, saved) = post(&client, &url("/slots/0?action=save"), &file).await;
    assert_eq!(status, 200, "{saved}");
    assert!(saved["n_saved"].as_u64().unwrap() >= prompt, "{saved}");
    let on_disk = std::fs::metadata(dir.join("town.bin")).unwrap().len();
    assert_eq!(saved["n_written"].as_u64(), Some(on_disk), "{saved}");
    let (_, erased) = post(&client, &url("/slots/0?action=erase"), &json!({})).await;
    assert_eq!(erased["n_erased"], saved["n_saved"], "{erased}");
    let (_, cold) = post(&client, &url("/completion"), &body).await;
    assert_eq!(cold["timings"]["cache_n"], 0, "erased: {cold}");
    post(&client, &url("/slots/0?action=erase"), &json!({})).await;
    let (status, restored) = post(&client, &url("/slots/0?action=restore"), &file).await;
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["n_restored"], saved["n_saved"], "{restored}");
    let (_, warm) = post(&client, &url("/completion"), &body).await;
    assert!(warm["timings"]["cache_n"].as_u64() >= Some(prompt - 1), "restored: {warm}");

    for (path, body, param) in [
        ("/slots/0?action=save", json!({"filename": "../escape.bin"}), "filename"),
        ("/slots/0?action=save", json!({"filename": "/tmp/x.bin"}), "filename"),
        ("/slots/0?action=restore", json!({"filename": "missing.bin"}), "filename"),
        ("/slots/0?action=burn", json!({}), "action"),
        ("/slots/7?action=erase", json!({}), "id_slot"),
    ] {
        let (status, refused) = post(&client, &url(path), &body).await;
        assert_eq!((status, refused["error"]["param"].as_str()), (400, Some(param)), "{refused}");
    }
    assert!(!dir.join("../escape.bin").exists());
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);

    let closed = slotgate_tests::engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let (status, refused) =
        post(&client, &format!("{}/slots/0?action=save", closed.url), &json!({"filename": "a"}))
            .await;
    assert_eq!((status, refused["error"]["param"].as_str()), (400, Some("action")), "{refused}");
}

/// llama-server's `timings` come with OpenAI's answers too (tools written for
/// llama-server read its rates there): with a whole chat or text completion,
/// with each streamed choice's last chunk and with the usage chunk; counted as
/// `usage` counts. Anthropic's Messages answers carry none.
#[tokio::test]
async fn openai_answers_carry_llama_servers_timings() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let client = client();
    let chat = json!({"model": MODEL, "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": "Count to ten"}]});
    let text = json!({"model": MODEL, "max_tokens": 6, "temperature": 0,
        "prompt": "One, two, three"});
    for (path, body) in [("/v1/chat/completions", &chat), ("/v1/completions", &text)] {
        let url = format!("{}{path}", engine.url);
        let (status, answer) = post(&client, &url, body).await;
        assert_eq!(status, 200, "{answer}");
        let (timings, usage) = (&answer["timings"], &answer["usage"]);
        assert_eq!(timings["predicted_n"], usage["completion_tokens"], "{answer}");
        let read = timings["prompt_n"].as_u64().unwrap() + timings["cache_n"].as_u64().unwrap();
        assert_eq!(read, usage["prompt_tokens"].as_u64().unwrap(), "{answer}");
        assert!(timings["predicted_per_second"].as_f64().unwrap() > 0.0, "{answer}");

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let (events, done) = events(&client, &url, &streamed).await;
        assert!(done);
        let (usage_chunk, chunks) = events.split_last().unwrap();
        let generated = &usage_chunk["usage"]["completion_tokens"];
        assert_eq!(&usage_chunk["timings"]["predicted_n"], generated, "{usage_chunk}");
        let (last, rest) = chunks.split_last().unwrap();
        assert!(last["choices"][0]["finish_reason"].is_string(), "{last}");
        assert_eq!(&last["timings"]["predicted_n"], generated, "{last}");
        assert!(rest.iter().all(|c| c.get("timings").is_none()), "only the last chunks");
    }
    let messages = json!({"model": MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}]});
    let (status, message) = post(&client, &format!("{}/v1/messages", engine.url), &messages).await;
    assert_eq!(status, 200, "{message}");
    assert!(message.get("timings").is_none(), "{message}");
}

/// The engine's `seed` (llama-server's `--seed`) is the seed of requests that
/// send none, so that they sample alike, and `/props` shows it; a request's
/// own seed still wins.
#[tokio::test]
async fn the_engines_seed_is_the_default_of_requests() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256", "--seed", "42"]);
    let client = client();
    let (_, props) = get(&client, &format!("{}/props", engine.url)).await;
    assert_eq!(props["default_generation_settings"]["params"]["seed"], 42, "{props}");
    let url = format!("{}/completion", engine.url);
    let body = json!({"prompt": "Once upon a time", "n_predict": 24, "temperature": 1.5,
        "cache_prompt": false});
    let (_, first) = post(&client, &url, &body).await;
    let (_, again) = post(&client, &url, &body).await;
    assert_eq!(first["content"], again["content"], "one seed, one draw");
    assert_eq!(first["generation_settings"]["seed"], 42, "{first}");
    let mut own = body.clone();
    own["seed"] = json!(7);
    let (_, seven) = post(&client, &url, &own).await;
    assert_eq!(seven["generation_settings"]["seed"], 7, "{seven}");
}

/// llama-server's `logit_bias` forms on `/completion`: `[[id, false]]` bans a
/// token, and a text key biases each token of that text; OpenAI's routes
/// keep OpenAI's form (token ids only).
#[tokio::test]
async fn completion_takes_llama_servers_logit_bias_forms() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let client = client();
    let url = format!("{}/completion", engine.url);
    let greedy = |bias: Value| {
        json!({"prompt": "I believe the meaning of life is", "n_predict": 1, "temperature": 0,
            "return_tokens": true, "logit_bias": bias})
    };
    let (_, free) = post(&client, &url, &greedy(json!([]))).await;
    let first = free["tokens"][0].clone();
    let piece = free["content"].as_str().unwrap().to_owned();
    for bias in [json!([[first, false]]), json!({ piece.clone(): -100 }), json!([[piece, -100]])] {
        let (status, banned) = post(&client, &url, &greedy(bias.clone())).await;
        assert_eq!(status, 200, "{banned}");
        assert_ne!(banned["tokens"][0], first, "{bias}: {banned}");
    }
    let (status, refused) = post(&client, &url, &greedy(json!([["", 1]]))).await;
    assert_eq!((status, refused["error"]["param"].as_str()), (400, Some("logit_bias")));
    // Texts that make more tokens than the sampler should go over at each step,
    // each within the bound on a text (256 bytes).
    let many: Vec<Value> = (0..1024)
        .map(|i| json!([(0..25).map(|j| format!(" w{i}x{j}")).collect::<String>(), -1]))
        .collect();
    let (status, refused) = post(&client, &url, &greedy(json!(many))).await;
    assert_eq!(
        (status, refused["error"]["param"].as_str()),
        (400, Some("logit_bias")),
        "{refused}"
    );
    let openai = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1,
        "logit_bias": {" the": -100}});
    let (status, refused) = post(&client, &format!("{}/v1/completions", engine.url), &openai).await;
    assert_eq!(
        (status, refused["error"]["param"].as_str()),
        (400, Some("logit_bias")),
        "{refused}"
    );
}

/// `ignore_eos` (llama-server's and vLLM's): the model's end-of-generation
/// tokens are banned, so an answer runs to its limit; the bans show in
/// `generation_settings.logit_bias`, a ban's bias written as null.
#[tokio::test]
async fn ignore_eos_runs_to_the_limit() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let client = client();
    let url = format!("{}/completion", engine.url);
    // Pushed to end at once: Gemma's <eos> (1) and <end_of_turn> (106).
    let body = |ignore: bool| {
        json!({"prompt": "Once upon a time", "n_predict": 8, "temperature": 0,
            "logit_bias": [[1, 100], [106, 100]], "ignore_eos": ignore})
    };
    let (_, ended) = post(&client, &url, &body(false)).await;
    assert_eq!(
        (ended["stop_type"].as_str(), ended["tokens_predicted"].as_u64()),
        (Some("eos"), Some(1))
    );
    let (_, ran) = post(&client, &url, &body(true)).await;
    assert_eq!(
        (ran["stop_type"].as_str(), ran["tokens_predicted"].as_u64()),
        (Some("limit"), Some(8))
    );
    let biases = ran["generation_settings"]["logit_bias"].as_array().unwrap();
    assert!(biases.iter().any(|b| b["token"] == 1 && b["bias"].is_null()), "{biases:?}");
    assert_eq!(ran["generation_settings"]["ignore_eos"], true);
    // The same on OpenAI's routes.
    let chat = json!({"model": MODEL, "max_tokens": 8, "temperature": 0, "ignore_eos": true,
        "logit_bias": {"1": 100, "106": 100}, "messages": [{"role": "user", "content": "Hi"}]});
    let (_, answer) = post(&client, &format!("{}/v1/chat/completions", engine.url), &chat).await;
    assert_eq!(answer["usage"]["completion_tokens"], 8, "{answer}");
}

/// llama-server's `/v1/chat/completions/input_tokens` (and without `/v1`):
/// the tokens the chat's prompt renders to, as its answer's usage counts them.
#[tokio::test]
async fn chat_input_tokens_count_the_prompt() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let client = client();
    let messages = json!([{"role": "system", "content": "Book"},
        {"role": "user", "content": "What is the best book"}]);
    let (_, answer) = post(
        &client,
        &format!("{}/v1/chat/completions", engine.url),
        &json!({"model": MODEL, "max_tokens": 1, "messages": messages}),
    )
    .await;
    let prompt = &answer["usage"]["prompt_tokens"];
    for path in ["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"] {
        let (status, count) =
            post(&client, &format!("{}{path}", engine.url), &json!({"messages": messages})).await;
        assert_eq!(status, 200, "{count}");
        assert_eq!(&count["input_tokens"], prompt, "{path}");
    }
}

/// llama.cpp's built-in templates by name (llama-server's `--chat-template
/// command-r`), applied by llama.cpp; a name it does not know fails the load.
#[tokio::test]
async fn llama_cpp_templates_serve_by_name() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256", "--chat-template", "command-r"]);
    let client = client();
    let messages = json!([{"role": "system", "content": "You are a test."},
        {"role": "user", "content": "Hi there"}]);
    let (status, applied) =
        post(&client, &format!("{}/apply-template", engine.url), &json!({"messages": messages}))
            .await;
    assert_eq!(status, 200, "{applied}");
    assert_eq!(
        applied["prompt"],
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    );
    let (_, props) = get(&client, &format!("{}/props", engine.url)).await;
    assert_eq!(props["chat_template_name"], "command-r");
    let load = json!({"model": model_path(), "model_id": "other", "ctx_len": 256,
        "n_parallel": 1, "chat_template": "no-such-template"});
    let (status, refused) = post(&client, &format!("{}/v1/models/load", engine.url), &load).await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]["message"].as_str().unwrap().contains("no-such-template"),
        "{refused}"
    );
}

/// llama-server's `--host 127.0.0.1,::1`: one port on each address, the same
/// routes and keys on both.
#[tokio::test]
async fn several_addresses_serve_on_one_port() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: this machine has no IPv6 loopback");
        return;
    }
    let engine = engine(&["--host", "127.0.0.1,[::1]"]);
    let port = engine.url.rsplit(':').next().unwrap();
    let client = client();
    for base in [engine.url.clone(), format!("http://[::1]:{port}")] {
        let (status, body) = get(&client, &format!("{base}/health")).await;
        assert_eq!(status, 200, "{base}: {body}");
        let body = json!({"prompt": "Hello", "n_predict": 2});
        let (status, answer) = post(&client, &format!("{base}/completion"), &body).await;
        assert_eq!((status, answer["tokens_predicted"].as_u64()), (200, Some(2)), "{answer}");
    }
}

/// llama-server's `--temp`, `--top-k`, `--top-p` and `--min-p`: what a request
/// that sends none samples with, shown in `/props`; a request's own wins.
#[tokio::test]
async fn sampling_defaults_are_the_engines_settings() {
    let engine = engine(&["--temperature", "0", "--top-k", "7", "--top-p", "0.5"]);
    let client = client();
    let (_, props) = get(&client, &format!("{}/props", engine.url)).await;
    let params = &props["default_generation_settings"]["params"];
    assert_eq!((params["temperature"].as_f64(), params["top_k"].as_i64()), (Some(0.0), Some(7)));
    assert_eq!(params["top_p"].as_f64(), Some(0.5));
    let url = format!("{}/completion", engine.url);
    let prompt = "The capital of France is";
    let body = json!({"prompt": prompt, "n_predict": 12, "cache_prompt": false});
    let (_, settled) = post(&client, &url, &body).await;
    assert_eq!(settled["generation_settings"]["temperature"], 0.0, "{settled}");
    assert_eq!(settled["generation_settings"]["top_k"], 7, "{settled}");
    // Greedy: every answer the same, as an explicitly greedy one.
    for body in [body.clone(), json!({"prompt": prompt, "n_predict": 12, "temperature": 0})] {
        let (_, again) = post(&client, &url, &body).await;
        assert_eq!(again["content"], settled["content"]);
    }
    let hot = json!({"prompt": prompt, "n_predict": 1, "temperature": 1.5, "seed": 3});
    let (_, own) = post(&client, &url, &hot).await;
    assert_eq!(own["generation_settings"]["temperature"], 1.5, "{own}");
}

/// llama-server's `return_progress`: a `/completion` stream reports how far its
/// prompt has been read, from nothing (before any token is decoded) to all of
/// it, in chunks of `batch_size`, before its first token; time never goes back.
#[tokio::test]
async fn a_stream_reports_its_prompts_progress() {
    let engine = engine(&["--n-parallel", "1", "--batch-size", "16"]);
    let client = client();
    let url = format!("{}/completion", engine.url);
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(8);
    let body = json!({"prompt": prompt, "n_predict": 2, "stream": true, "return_progress": true,
        "cache_prompt": false});
    let (streamed, _) = events(&client, &url, &body).await;
    let progress: Vec<&Value> =
        streamed.iter().filter(|e| e.get("prompt_progress").is_some()).collect();
    let total = progress[0]["prompt_progress"]["total"].as_u64().unwrap();
    assert!(total > 32, "{total}");
    assert_eq!(progress[0]["prompt_progress"]["processed"], 0);
    assert_eq!(progress[0]["timings"]["prompt_n"], 0);
    let last = &progress.last().unwrap()["prompt_progress"];
    assert_eq!(last["processed"].as_u64().unwrap() + last["cache"].as_u64().unwrap(), total);
    assert!(progress.len() as u64 > total.div_ceil(16), "{} events", progress.len());
    let times: Vec<f64> =
        progress.iter().map(|e| e["prompt_progress"]["time_ms"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // Progress comes before the text, and only when asked for.
    let first_text = streamed.iter().position(|e| e["content"] != "").unwrap();
    let last_progress = streamed.iter().rposition(|e| e.get("prompt_progress").is_some()).unwrap();
    assert!(last_progress < first_text);
    let mut quiet = body.clone();
    quiet["return_progress"] = json!(false);
    let (quiet, _) = events(&client, &url, &quiet).await;
    assert!(quiet.iter().all(|e| e.get("prompt_progress").is_none()));
}

/// llama-server's `post_sampling_probs`: the probabilities of the distribution
/// each token was drawn from, after the chain (here top-k 3), so no more than
/// three alternatives, none of them zero, summing to at most one.
#[tokio::test]
async fn post_sampling_probabilities_are_what_the_draw_saw() {
    let engine = engine(&["--n-parallel", "1"]);
    let client = client();
    let url = format!("{}/completion", engine.url);
    let body = json!({"prompt": "Today was the day. Today I would finally become a",
        "n_probs": 10, "n_predict": 4, "temperature": 1.0, "top_k": 3, "seed": 7,
        "post_sampling_probs": true});
    let (status, answer) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{answer}");
    let tokens = answer["completion_probabilities"].as_array().unwrap();
    assert_eq!(tokens.len(), 4, "{answer}");
    for token in tokens {
        let p = token["prob"].as_f64().unwrap();
        assert!(p > 0.0 && p <= 1.0, "{token}");
        let top = token["top_probs"].as_array().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{token}");
        let sum: f64 = top.iter().map(|t| t["prob"].as_f64().unwrap()).sum();
        assert!(sum <= 1.0 + 1e-4 && top.iter().all(|t| t["prob"].as_f64().unwrap() > 0.0));
        assert!(top.iter().any(|t| t["id"] == token["id"]), "the drawn token is among them");
    }
    // Without it, the model's own: ten alternatives, as log probabilities.
    let mut own = body.clone();
    own["post_sampling_probs"] = json!(false);
    let (_, answer) = post(&client, &url, &own).await;
    let first = &answer["completion_probabilities"][0];
    assert_eq!(first["top_logprobs"].as_array().map(Vec::len), Some(10), "{first}");
}

/// Vertex AI's prediction route (`AIP_MODE=PREDICTION`, as Google Cloud starts
/// a custom container): each instance is a request to the route its
/// `@requestFormat` names, answered in order; one that fails holds its error,
/// and the route never calls itself.
#[tokio::test]
async fn vertex_predictions_answer_each_instance_in_order() {
    let model = model_path();
    let args = ["--model", model.to_str().unwrap(), "--port", "0", "--threads", "2"];
    let env = [("AIP_MODE", "PREDICTION"), ("AIP_HEALTH_ROUTE", "/vertex-health")];
    let engine = Process::start_with_env(&binary("slotgate-engine"), &args, &env);
    let client = client();
    let (status, _) = get(&client, &format!("{}/vertex-health", engine.url)).await;
    assert_eq!(status, 200);
    let chat = json!({"@requestFormat": "chatCompletions", "max_tokens": 3, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello"}], "stream": true});
    let body = json!({"instances": [chat, {"@requestFormat": "/completion", "prompt": "Hi",
        "n_predict": 2}, {"@requestFormat": "predict", "instances": []}, 7,
        {"@requestFormat": "chatCompletions", "messages": []}]});
    let (status, answer) = post(&client, &format!("{}/predict", engine.url), &body).await;
    assert_eq!(status, 200, "{answer}");
    let predictions = answer["predictions"].as_array().unwrap();
    assert_eq!(predictions.len(), 5);
    assert_eq!(predictions[0]["object"], "chat.completion", "never a stream: {answer}");
    assert_eq!(predictions[0]["choices"][0]["message"]["role"], "assistant");
    assert_eq!(predictions[1]["tokens_predicted"], 2, "{answer}");
    for refused in &predictions[2..] {
        assert_eq!(refused["error"]["type"], "invalid_request_error", "{refused}");
    }
    let many = json!({"instances": vec![json!({"@requestFormat": "tokenize"}); 129]});
    let (status, _) = post(&client, &format!("{}/predict", engine.url), &many).await;
    assert_eq!(status, 400);
}

/// llama.cpp's web UI asks chat streams for `return_progress` and
/// `timings_per_token`: chunks of no choices report the prompt's reading, each
/// text chunk its timings so far; the Responses stream carries the same
/// (`response.in_progress` with `prompt_progress`, timings on each delta and on
/// the final event), as llama-server's does.
#[tokio::test]
async fn chat_and_responses_streams_carry_llama_servers_telemetry() {
    let engine = engine(&["--n-parallel", "1", "--batch-size", "16"]);
    let client = client();
    let long = "This is a test. ".repeat(12);
    let body = json!({"messages": [{"role": "user", "content": long}], "max_tokens": 6,
        "stream": true, "return_progress": true, "timings_per_token": true,
        "cache_prompt": false, "logit_bias": {"1": -100, "106": -100}});
    let (chunks, _) = events(&client, &format!("{}/v1/chat/completions", engine.url), &body).await;
    let progress: Vec<&Value> =
        chunks.iter().filter(|c| c.get("prompt_progress").is_some()).collect();
    assert!(progress.len() >= 3, "{chunks:?}");
    assert!(progress.iter().all(|c| c["choices"] == json!([]) && c["timings"].is_object()));
    let texts: Vec<&Value> =
        chunks.iter().filter(|c| c["choices"][0]["delta"]["content"].is_string()).collect();
    let predicted: Vec<u64> =
        texts.iter().map(|c| c["timings"]["predicted_n"].as_u64().unwrap()).collect();
    assert!(!predicted.is_empty() && predicted.windows(2).all(|w| w[0] <= w[1]), "{predicted:?}");

    let body = json!({"input": long, "max_output_tokens": 6, "stream": true,
        "return_progress": true, "timings_per_token": true});
    let (events, _) = events(&client, &format!("{}/v1/responses", engine.url), &body).await;
    let with_progress: Vec<&Value> =
        events.iter().filter(|e| e.get("prompt_progress").is_some()).collect();
    assert!(!with_progress.is_empty(), "{events:?}");
    assert!(with_progress.iter().all(|e| e["type"] == "response.in_progress"));
    let deltas = events.iter().filter(|e| e["type"] == "response.output_text.delta");
    assert!(deltas.clone().count() > 0 && deltas.clone().all(|d| d["timings"].is_object()));
    let last = events.last().unwrap();
    assert!(last["timings"]["predicted_n"].as_u64().is_some(), "{last}");
}

/// llama-server's reranking (`--reranking`): each document scored for the
/// query by the model's rank-pooled context, best first, cut to `top_n`, in
/// Jina's shape or TEI's; bad requests are 400s naming the field. The default
/// model has no classifier head, so its scores mean nothing; the order, the
/// counts and the shapes are what is checked.
#[tokio::test]
async fn reranking_scores_documents_in_jinas_and_teis_shapes() {
    let reranker = engine(&["--n-parallel", "1", "--reranking", "true"]);
    let client = client();
    let url = format!("{}/v1/rerank", reranker.url);
    let documents = [
        "A machine is a physical system.",
        "Machine learning is a field of AI.",
        "Paris est une grande ville.",
        "Learning is acquiring knowledge.",
    ];
    let body = json!({"query": "Machine learning is", "documents": documents});
    let (status, answer) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().unwrap();
    let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().unwrap()).collect();
    assert_eq!(scores.len(), 4);
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "best first: {scores:?}");
    let mut indexes: Vec<u64> = results.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    indexes.sort_unstable();
    assert_eq!(indexes, [0, 1, 2, 3]);
    assert!(answer["usage"]["prompt_tokens"].as_u64().unwrap() > 20, "{answer}");
    // The same request scores the same; `top_n` keeps the best.
    let (_, two) = post(
        &client,
        &url,
        &json!({"query": "Machine learning is",
        "documents": documents, "top_n": 2}),
    )
    .await;
    assert_eq!(two["results"].as_array().unwrap()[..], results[..2], "{two}");
    let tei = json!({"query": "Machine learning is", "texts": documents, "return_text": true});
    let (status, listed) = post(&client, &format!("{}/rerank", reranker.url), &tei).await;
    assert_eq!(status, 200, "{listed}");
    let first = &listed[0];
    assert_eq!(first["score"], results[0]["relevance_score"]);
    assert_eq!(first["text"], documents[first["index"].as_u64().unwrap() as usize]);
    for (bad, param) in [
        (json!({"query": "q", "documents": []}), "documents"),
        (json!({"query": "q", "documents": [1, 2]}), "documents"),
        (json!({"documents": ["a"]}), "query"),
    ] {
        let (status, refused) = post(&client, &url, &bad).await;
        assert_eq!((status, refused["error"]["param"].as_str()), (400, Some(param)), "{bad}");
    }
    let (status, _) =
        post(&client, &format!("{}/v1/embeddings", reranker.url), &json!({"input": "x"})).await;
    assert_eq!(status, 400, "a reranker does not embed");
    drop(reranker);
    let plain = engine(&["--n-parallel", "1"]);
    let (status, refused) = post(&client, &format!("{}/v1/rerank", plain.url), &body).await;
    assert_eq!((status, refused["error"]["param"].as_str()), (400, Some("model")), "{refused}");
}

/// llama-server's `/embeddings` answers in its own shape (`[{"index", "embedding":
/// [[...]]}]`), the pooled vector being `/v1/embeddings`' own; with `pooling none`
/// it gives one vector per token, as the model gives them (not normalized),
/// which `/v1/embeddings` refuses with a 400.
#[tokio::test]
async fn native_embeddings_in_llama_servers_shape_and_per_token_without_pooling() {
    let client = client();
    let body = json!({"model": MODEL, "input": "a cat sat"});
    let pooled = engine(&["--n-parallel", "1", "--ctx-len", "256", "--embedding", "true"]);
    let (status, native) = post(&client, &format!("{}/embeddings", pooled.url), &body).await;
    assert_eq!(status, 200, "{native}");
    let (_, oai) = post(&client, &format!("{}/v1/embeddings", pooled.url), &body).await;
    assert_eq!(native[0]["index"], 0, "{native}");
    let vectors = native[0]["embedding"].as_array().unwrap();
    assert_eq!(vectors.len(), 1, "pooled: one vector");
    let (a, b) = (vectors[0].as_array().unwrap(), oai["data"][0]["embedding"].as_array().unwrap());
    assert_eq!(a.len(), 640);
    assert!(a.iter().zip(b).all(|(x, y)| (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-6));
    drop(pooled);

    let none = engine(&[
        "--n-parallel",
        "1",
        "--ctx-len",
        "256",
        "--embedding",
        "true",
        "--pooling",
        "none",
    ]);
    let (status, refused) = post(&client, &format!("{}/v1/embeddings", none.url), &body).await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("pooling"), "{refused}");
    let (status, native) = post(&client, &format!("{}/embeddings", none.url), &body).await;
    assert_eq!(status, 200, "{native}");
    let tokenized = json!({"content": "a cat sat", "add_special": true});
    let (_, tokens) = post(&client, &format!("{}/tokenize", none.url), &tokenized).await;
    let per_token = native[0]["embedding"].as_array().unwrap();
    assert_eq!(per_token.len(), tokens["tokens"].as_array().unwrap().len(), "{tokens}");
    assert!(per_token.len() >= 3);
    for vector in per_token {
        let v = vector.as_array().unwrap();
        assert_eq!(v.len(), 640);
        let norm: f64 = v.iter().map(|x| x.as_f64().unwrap().powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() > 1e-3, "as the model gives it, not normalized: {norm}");
    }
    assert_ne!(per_token[0], per_token[1]);
}

/// A stream asked for with `X-Conversation-Id` is kept and runs to its end
/// after its client goes away; `GET /v1/stream` sends it again from any byte
/// offset and `DELETE` forgets it (llama-server's resumable streams).
#[tokio::test]
async fn a_kept_stream_outlives_its_client_and_replays_from_any_offset() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "512"]);
    let client = client();
    let id = "conv/with slashes::1";
    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 40,
                      "stream": true, "logit_bias": {"1": -100, "106": -100}});
    let response = client
        .post(format!("{}/v1/completions", engine.url))
        .header("X-Conversation-Id", id)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Read the first chunk, then go away, as a reloaded page does.
    let mut chunks = response.bytes_stream();
    let first = futures::StreamExt::next(&mut chunks).await.unwrap().unwrap();
    drop(chunks);
    let stream = |query: String| {
        let url = format!("{}/v1/stream?{query}", engine.url);
        let client = client.clone();
        async move {
            let response = client.get(url).send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    let q = |from: usize| format!("conv_id={}&from={from}", urlencode(id));
    let (status, whole) = stream(q(0)).await;
    assert_eq!(status, 200, "{whole}");
    assert!(whole.as_bytes().starts_with(&first), "the replay starts where the stream did");
    assert!(whole.trim_end().ends_with("data: [DONE]"), "it ran to its end: {whole}");
    let texts: usize = whole
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|c| c["choices"][0]["text"].is_string())
        .count();
    assert!(texts >= 10, "{texts} chunks of text: {whole}");
    let (status, tail) = stream(q(first.len())).await;
    assert_eq!((status, tail.as_str()), (200, &whole[first.len()..]));

    let (status, refused) = stream(format!("conv_id={}", "x".repeat(300))).await;
    assert_eq!(status, 400, "{refused}");
    let deleted = client
        .delete(format!("{}/v1/stream?conv_id={}", engine.url, urlencode(id)))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(stream(q(0)).await.0, 404, "forgotten");
}

/// `s` with every byte but letters and digits percent-encoded.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(
            |b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            },
        )
        .collect()
}

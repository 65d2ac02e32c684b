//! Sharing a gateway between teams, on the real default model: API keys and
//! their limits through OpenAI's SDK, fair queueing between keys, deadlines, the
//! admin API (reload, drain), the engine's admin key, and limits shared by two
//! replicas through a real Redis.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use slotgate_tests::*;

const ADMIN: &str = "sk-admin-test";

/// The SHA-256 of `sk-team-b`, as an operator writes it in `key_sha256`.
const TEAM_B_SHA256: &str = "292d075b18c9240a48b848c521422c5f418f7dd16b5c66755fe58d0fb6a43e1f";

/// The start of a gateway's settings: a free port, the admin key from
/// `SLOTGATE_TEST_ADMIN_KEY`, and `backends`; keys and the rest follow.
fn settings(backends: &[&str]) -> String {
    let mut text =
        "listen = \"127.0.0.1:0\"\n[auth]\nadmin_key_env = \"SLOTGATE_TEST_ADMIN_KEY\"\n"
            .to_owned();
    for b in backends {
        text.push_str(&format!("[[backends]]\nurl = \"{b}\"\n"));
    }
    text
}

/// A gateway started from `settings` (the test's admin key, and `env`, in its
/// environment), once `backends` backends are healthy.
async fn keyed_gateway(
    settings: &str,
    backends: usize,
    env: &[(&str, &str)],
) -> (TempFile, Process) {
    let config = TempFile::new("gateway.toml", settings);
    let mut env = env.to_vec();
    env.push(("SLOTGATE_TEST_ADMIN_KEY", ADMIN));
    let gateway = gateway_with_config(&config.path, &env);
    ready_as(&client(), &gateway, backends, Some(ADMIN)).await;
    (config, gateway)
}

/// A streamed story of `max_tokens` tokens, read to its end in a task.
fn story(
    client: &reqwest::Client,
    url: &str,
    max_tokens: u32,
) -> tokio::task::JoinHandle<(u16, Streamed)> {
    let (client, url) = (client.clone(), url.to_owned());
    let mut body = completion("Once upon a time", max_tokens);
    body["stream"] = json!(true);
    tokio::spawn(async move { stream(&client, &url, &body).await })
}

fn completion(prompt: &str, max_tokens: u32) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

/// Posts with a bearer key (and more headers); returns status, headers and body.
async fn post_as(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = client.post(url).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let head = response.headers().clone();
    (status, head, response.json().await.unwrap_or(Value::Null))
}

async fn get_as(client: &reqwest::Client, url: &str, key: &str) -> Value {
    client.get(url).bearer_auth(key).send().await.expect("request").json().await.expect("json")
}

/// `env` and a wall clock at a minute's start
/// ([`clock_at_a_minutes_start`]), for a gateway whose per-minute limits a
/// test counts.
fn in_one_minute<'a>(
    clock: &'a [(&'static str, String)],
    env: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = env.to_vec();
    env.extend(clock.iter().map(|(k, v)| (*k, v.as_str())));
    env
}

/// The SDK's errors for each refusal, Retry-After honoured, tokens counted from
/// streams, the admin API closed to client keys, CORS (see tenants.py).
#[tokio::test]
async fn keys_and_limits_through_the_openai_sdk() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let keys = format!(
        r#"[[keys]]
name = "team-a"
key = "sk-team-a"
max_concurrent = 1
[[keys]]
name = "team-b"
key_sha256 = "{TEAM_B_SHA256}"
models = ["another-model"]
[[keys]]
name = "team-c"
key_env = "SLOTGATE_TEST_TEAM_C_KEY"
tokens_per_minute = 60
priority = "batch"
[cors]
allowed_origins = ["http://127.0.0.1:3000"]
"#
    );
    let clock = clock_at_a_minutes_start();
    let env = in_one_minute(&clock, &[("SLOTGATE_TEST_TEAM_C_KEY", "sk-team-c")]);
    let (_config, gateway) = keyed_gateway(&(settings(&[&engine.url]) + &keys), 1, &env).await;
    let url = gateway.url.clone();
    let out =
        tokio::task::spawn_blocking(move || python_client("tenants.py", &[&url, MODEL, ADMIN]))
            .await
            .unwrap();
    assert!(out.contains("tenants: ok"), "{out}");
    drop(gateway);
    drop(engine);
}

/// Anthropic's SDK through the gateway with a key in `x-api-key`: everything
/// it does against the engine, and the gateway's own refusals in Anthropic's
/// envelope; the key is charged for the tokens of its Messages requests.
#[tokio::test]
async fn anthropic_sdk_through_the_gateway_with_a_key() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "1024"]);
    let key = "[[keys]]\nname = \"team-a\"\nkey = \"sk-team-a\"\n";
    let (_config, gateway) = keyed_gateway(&(settings(&[&engine.url]) + key), 1, &[]).await;
    let url = gateway.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        python_client("anthropic_client.py", &[&url, MODEL, "sk-team-a"])
    })
    .await
    .unwrap();
    assert!(out.contains("anthropic sdk: ok"), "{out}");
    let client = client();
    let body =
        json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let messages = format!("{}/v1/messages", gateway.url);
    let (status, _, refused) = post_as(&client, &messages, None, &[], &body).await;
    assert_eq!(status, 401, "{refused}");
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["error"]["type"], "authentication_error", "{refused}");
    let keys = get_as(&client, &format!("{}/admin/keys", gateway.url), ADMIN).await;
    let usage = &keys["keys"][0]["usage"];
    assert!(usage["prompt_tokens"].as_u64() > Some(0), "{keys}");
    assert!(usage["completion_tokens"].as_u64() > Some(0), "{keys}");
    // Its answers are counted as the Messages API's, none as chat's.
    let m = metrics(&client, &gateway.url).await;
    let answered =
        |api: &str| metric_sum_where(&m, "slotgate_requests_total", &format!("api=\"{api}\""));
    assert!(answered("messages") >= 5.0, "{m}");
    assert_eq!(answered("chat"), 0.0, "{m}");
    assert!(m.contains("slotgate_time_to_first_token_seconds_bucket{model=\""), "{m}");
    assert!(m.contains(",api=\"messages\",le="), "{m}");
}

/// llama-server's `/completion` through a keyed gateway: forwarded with the
/// key's checks, and its tokens, read from llama-server's own fields, charged
/// to the key, streamed and not.
#[tokio::test]
async fn llama_server_completions_through_the_gateway_are_charged_to_their_key() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let key = "[[keys]]\nname = \"team-a\"\nkey = \"sk-team-a\"\n";
    let (_config, gateway) = keyed_gateway(&(settings(&[&engine.url]) + key), 1, &[]).await;
    let client = client();
    let url = format!("{}/completion", gateway.url);
    let body = json!({"prompt": "Once upon a time", "n_predict": 5, "temperature": 0});
    let (status, _, refused) = post_as(&client, &url, None, &[], &body).await;
    assert_eq!(status, 401, "{refused}");
    let (status, _, answer) = post_as(&client, &url, Some("sk-team-a"), &[], &body).await;
    assert_eq!((status, answer["tokens_predicted"].as_u64()), (200, Some(5)), "{answer}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let response = client.post(&url).bearer_auth("sk-team-a").json(&streamed).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.contains("\"stop\":true") && !text.contains("[DONE]"), "{text}");
    let keys = get_as(&client, &format!("{}/admin/keys", gateway.url), ADMIN).await;
    let usage = &keys["keys"][0]["usage"];
    let prompt = answer["tokens_evaluated"].as_u64().unwrap();
    assert_eq!(usage["completion_tokens"].as_u64(), Some(10), "{keys}");
    assert_eq!(usage["prompt_tokens"].as_u64(), Some(2 * prompt), "{keys}");
}

/// OpenAI's Responses API through a keyed gateway over two engines: the SDK
/// works unchanged, every follow-up goes to the engine that stored the
/// response it continues (and is served warm there), and a stored response is
/// found only by the key that made it.
#[tokio::test]
async fn responses_follow_their_engine_and_their_key_through_the_gateway() {
    let one = engine(&["--n-parallel", "2", "--ctx-len", "1024"]);
    let two = engine(&["--n-parallel", "2", "--ctx-len", "1024"]);
    let keys = "[[keys]]\nname = \"team-a\"\nkey = \"sk-team-a\"\n\
                [[keys]]\nname = \"team-b\"\nkey = \"sk-team-b\"\n";
    let (_config, gateway) = keyed_gateway(&(settings(&[&one.url, &two.url]) + keys), 2, &[]).await;
    let url = gateway.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        python_client("responses_client.py", &[&url, MODEL, "sk-team-a"])
    })
    .await
    .unwrap();
    assert!(out.contains("responses sdk: ok"), "{out}");
    let client = client();
    let create = format!("{}/v1/responses", gateway.url);
    let ask = |previous: Option<&str>| {
        json!({"model": MODEL, "input": "Tell me more.", "max_output_tokens": 3,
            "temperature": 0, "previous_response_id": previous})
    };
    let (status, _, first) = post_as(&client, &create, Some("sk-team-a"), &[], &ask(None)).await;
    assert_eq!(status, 200, "{first}");
    let mut previous = first["id"].as_str().unwrap().to_owned();
    for turn in 0..4 {
        let (status, _, next) =
            post_as(&client, &create, Some("sk-team-a"), &[], &ask(Some(&previous))).await;
        assert_eq!(status, 200, "turn {turn}: {next}");
        let cached = &next["usage"]["input_tokens_details"]["cached_tokens"];
        assert!(cached.as_u64() > Some(0), "turn {turn} was not warm: {next}");
        previous = next["id"].as_str().unwrap().to_owned();
    }
    let stored = format!("{}/v1/responses/{previous}", gateway.url);
    let mine = client.get(&stored).bearer_auth("sk-team-a").send().await.unwrap();
    assert_eq!(mine.status(), 200);
    let theirs = client.get(&stored).bearer_auth("sk-team-b").send().await.unwrap();
    assert_eq!(theirs.status(), 404, "another key reads nothing");
    let (status, _, refused) =
        post_as(&client, &create, Some("sk-team-b"), &[], &ask(Some(&previous))).await;
    assert_eq!((status, &refused["error"]["code"]), (404, &json!("previous_response_not_found")));
    let gone = ask(Some("resp_0123456789abcdef0000"));
    let (status, _, refused) = post_as(&client, &create, Some("sk-team-a"), &[], &gone).await;
    assert_eq!((status, &refused["error"]["param"]), (404, &json!("previous_response_id")));
}

/// One slot, one key with six requests queued, then another key's one: the
/// other key's request is served at the next release, not after the six.
#[tokio::test]
async fn a_flooding_key_does_not_delay_another() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "512"]);
    let keys = "[[keys]]\nname = \"flood\"\nkey = \"sk-flood\"\n\
                [[keys]]\nname = \"other\"\nkey = \"sk-other\"\n";
    let (_config, gateway) = keyed_gateway(&(settings(&[&engine.url]) + keys), 1, &[]).await;
    let client = client();
    let url = format!("{}/v1/completions", gateway.url);
    let finished = Arc::new(Mutex::new(Vec::new()));
    let send = |key: &'static str, i: usize| {
        let (client, url, finished) = (client.clone(), url.clone(), finished.clone());
        tokio::spawn(async move {
            let body = completion(&format!("Story number {i}: once upon a time"), 24);
            let (status, _, answer) = post_as(&client, &url, Some(key), &[], &body).await;
            assert_eq!(status, 200, "{answer}");
            finished.lock().unwrap().push((key, Instant::now()));
        })
    };
    let mut tasks: Vec<_> = (0..6).map(|i| send("sk-flood", i)).collect();
    let backends = format!("{}/admin/backends", gateway.url);
    let queued = eventually(Duration::from_secs(30), || async {
        get_as(&client, &backends, ADMIN).await["backends"][0]["queue"][MODEL] == 5
    })
    .await;
    assert!(queued, "five of the flood never queued");
    let sent = Instant::now();
    tasks.push(send("sk-other", 6));
    for task in tasks {
        task.await.unwrap();
    }
    let order = finished.lock().unwrap().clone();
    let (_, other) = *order.iter().find(|(k, _)| *k == "sk-other").unwrap();
    // Only the flood's request that held the slot when the other key's arrived
    // may end between the two: one that ended after the look at the queue and
    // before the other was sent had handed its slot on to the flood already.
    let ahead = order.iter().filter(|(k, at)| *k == "sk-flood" && *at > sent && *at < other);
    let keys: Vec<_> = order.iter().map(|(k, _)| *k).collect();
    assert_eq!(ahead.count(), 1, "the other key waited behind the flood: {keys:?}");
}

/// A request whose deadline the expected wait exceeds is refused at once; one
/// whose deadline passes in the queue is refused then, not when a slot frees.
#[tokio::test]
async fn a_request_that_cannot_meet_its_deadline_is_refused() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "512"]);
    let gateway = gateway(&[&engine.url], &[]);
    let client = client();
    ready(&client, &gateway, 1).await;
    let url = format!("{}/v1/completions", gateway.url);
    // One request ends: the gateway now knows how long a slot is held.
    let (status, _, _) = post_as(&client, &url, None, &[], &completion("Hello", 8)).await;
    assert_eq!(status, 200);
    let long = story(&client, &url, 160);
    wait_slot_busy(&client, &engine.url).await;
    let started = Instant::now();
    let deadline = [("x-slotgate-deadline-ms", "1")];
    let (status, head, body) = post_as(&client, &url, None, &deadline, &completion("Hi", 2)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "deadline_exceeded", "{body}");
    assert!(head.contains_key("retry-after"));
    assert!(started.elapsed() < Duration::from_millis(500), "refused at once");

    let started = Instant::now();
    let deadline = [("x-slotgate-deadline-ms", "600")];
    let (status, _, body) = post_as(&client, &url, None, &deadline, &completion("Hi", 2)).await;
    let waited = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(!long.is_finished(), "refused before the slot freed");
    assert!(waited < Duration::from_millis(1500), "refused at its deadline, after {waited:?}");
    let bad = [("x-slotgate-deadline-ms", "soon")];
    let (status, _, body) = post_as(&client, &url, None, &bad, &completion("Hi", 2)).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("x-slotgate-deadline-ms")));
    let (status, streamed) = long.await.unwrap();
    assert_eq!(status, 200);
    assert!(streamed.done);
}

/// SIGHUP while a stream runs: the new backend is admitted and the key's new
/// limit applies, the stream ends whole; a bad configuration is refused by
/// `POST /admin/reload` with the reason, and the old one stays.
#[tokio::test]
async fn a_reload_adds_a_backend_and_changes_a_limit_while_a_stream_runs() {
    let one = engine(&["--n-parallel", "1", "--ctx-len", "512", "--threads", "1"]);
    let two = engine(&["--n-parallel", "1", "--ctx-len", "512", "--threads", "1"]);
    let write = |backends: &[&str], rpm: u32| {
        let key = "[[keys]]\nname = \"team-a\"\nkey = \"sk-team-a\"\n";
        settings(backends) + key + &format!("requests_per_minute = {rpm}\n")
    };
    let clock = clock_at_a_minutes_start();
    let env = in_one_minute(&clock, &[]);
    let (config, gateway) = keyed_gateway(&write(&[&one.url], 1000), 1, &env).await;
    let client = client();
    let url = format!("{}/v1/completions", gateway.url);
    let running = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            let mut body = completion("Once upon a time", 120);
            body["stream"] = json!(true);
            let response =
                client.post(&url).bearer_auth("sk-team-a").json(&body).send().await.unwrap();
            assert_eq!(response.status(), 200);
            response.text().await.unwrap()
        })
    };
    wait_slot_busy(&client, &one.url).await;
    config.write(&write(&[&one.url, &two.url], 2));
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &gateway.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    ready_as(&client, &gateway, 2, Some(ADMIN)).await;
    let keys = get_as(&client, &format!("{}/admin/keys", gateway.url), ADMIN).await;
    assert_eq!(keys["keys"][0]["limits"]["requests_per_minute"], 2, "{keys}");
    assert!(!running.is_finished(), "the reload came while the stream ran");
    let text = running.await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "the stream ended whole: {text}");
    // One request of the minute is spent (the stream): one more, then refusals.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let answer = post_as(&client, &url, Some("sk-team-a"), &[], &completion("Hi", 1)).await;
        statuses.push(answer.0);
    }
    assert_eq!(statuses, vec![200, 429]);

    config.write(&(write(&[&one.url], 2) + "tokens_per_minute = 0\n"));
    let reload = format!("{}/admin/reload", gateway.url);
    let (status, _, body) = post_as(&client, &reload, Some(ADMIN), &[], &json!({})).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("keys[0].tokens_per_minute"), "{message}");
    let (status, _, _) = post_as(&client, &reload, Some("sk-team-a"), &[], &json!({})).await;
    assert_eq!(status, 403, "a client key never opens the admin API");
    let backends = get_as(&client, &format!("{}/admin/backends", gateway.url), ADMIN).await;
    assert_eq!(backends["backends"].as_array().unwrap().len(), 2, "the old configuration stays");
    // A change a reload cannot apply is named in its answer; the rest applies.
    config.write(&(write(&[&one.url, &two.url], 3) + "[routing]\nmax_attempts = 5\n"));
    let (status, _, body) = post_as(&client, &reload, Some(ADMIN), &[], &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["needs_restart"], json!(["routing.max_attempts"]), "{body}");
    let keys = get_as(&client, &format!("{}/admin/keys", gateway.url), ADMIN).await;
    assert_eq!(keys["keys"][0]["limits"]["requests_per_minute"], 3, "{keys}");
}

/// A stream its client abandons is still charged to its key: the tokens it was
/// sent count against `tokens_per_minute`.
#[tokio::test]
async fn an_abandoned_stream_is_charged_to_its_key() {
    let one = engine(&["--n-parallel", "1", "--ctx-len", "512", "--threads", "1"]);
    let key = "[[keys]]\nname = \"team-a\"\nkey = \"sk-team-a\"\n";
    let clock = clock_at_a_minutes_start();
    let env = in_one_minute(&clock, &[]);
    let (_config, gateway) = keyed_gateway(&(settings(&[&one.url]) + key), 1, &env).await;
    let client = client();
    let url = format!("{}/v1/completions", gateway.url);
    let mut body = completion("Once upon a time", 200);
    body["stream"] = json!(true);
    body["logit_bias"] = json!({"1": -100, "106": -100});
    let mut response = client.post(&url).bearer_auth("sk-team-a").json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut events = 0;
    while events < 10 {
        let chunk = response.chunk().await.unwrap().expect("more of the stream");
        events += String::from_utf8_lossy(&chunk).matches("data: ").count();
    }
    drop(response);
    let keys = format!("{}/admin/keys", gateway.url);
    let charged = eventually(Duration::from_secs(10), || async {
        let keys = get_as(&client, &keys, ADMIN).await;
        keys["keys"][0]["usage"]["completion_tokens"].as_u64().is_some_and(|n| n >= 10)
    })
    .await;
    assert!(charged, "{}", get_as(&client, &keys, ADMIN).await);
}

/// A drained backend takes no new request and finishes its stream; then it is
/// removed, and added again through the admin API.
#[tokio::test]
async fn a_drained_backend_finishes_its_stream_and_takes_no_more() {
    let one = engine(&["--n-parallel", "1", "--ctx-len", "512", "--threads", "1"]);
    let two = engine(&["--n-parallel", "1", "--ctx-len", "512", "--threads", "1"]);
    let gateway = gateway(&[&one.url, &two.url], &[]);
    let client = client();
    ready(&client, &gateway, 2).await;
    let url = format!("{}/v1/completions", gateway.url);
    let running = story(&client, &url, 120);
    let admin = format!("{}/admin/backends", gateway.url);
    let busy = eventually(Duration::from_secs(30), || async {
        get(&client, &admin).await.1["backends"]
            .as_array()
            .is_some_and(|bs| bs.iter().any(|b| b["in_flight"] == 1))
    })
    .await;
    assert!(busy);
    let list = get(&client, &admin).await.1;
    let held = list["backends"].as_array().unwrap().iter().find(|b| b["in_flight"] == 1).unwrap();
    let (id, held_url) = (held["id"].as_u64().unwrap(), held["url"].as_str().unwrap().to_owned());
    let (status, drained) = post(&client, &format!("{admin}/{id}/drain"), &json!({})).await;
    assert_eq!((status, &drained["draining"]), (200, &json!(true)), "{drained}");
    for _ in 0..3 {
        let (status, answer) = post(&client, &url, &completion("Hi", 2)).await;
        assert_eq!(status, 200, "the other backend serves: {answer}");
    }
    let list = get(&client, &admin).await.1;
    let held = list["backends"].as_array().unwrap().iter().find(|b| b["id"] == id).unwrap().clone();
    assert_eq!(held["in_flight"], 1, "only the stream, no new request: {held}");
    let (status, streamed) = running.await.unwrap();
    assert!(status == 200 && streamed.done, "the drained backend's stream ended whole");
    let removed = client.delete(format!("{admin}/{id}")).send().await.unwrap();
    assert_eq!(removed.status(), 200);
    assert_eq!(get(&client, &admin).await.1["backends"].as_array().unwrap().len(), 1);
    let (status, added) = post(&client, &admin, &json!({"url": held_url})).await;
    assert_eq!(status, 201, "{added}");
    assert_ne!(added["id"].as_u64(), Some(id), "a new id, never a reused one");
    ready(&client, &gateway, 2).await;
    let (status, _) = post(&client, &admin, &json!({"url": "ftp://nowhere"})).await;
    assert_eq!(status, 400);
}

/// With an admin key, an engine loads and unloads only for its holder, only
/// from its models directory, and shows what its slots hold only to it.
#[tokio::test]
async fn the_engines_admin_key_guards_loading_and_slot_detail() {
    let model = model_path();
    let dir = model.parent().unwrap().to_str().unwrap().to_owned();
    let elsewhere = std::env::temp_dir().join(format!("slotgate-models-{}", std::process::id()));
    std::fs::create_dir_all(&elsewhere).unwrap();
    let engine = Process::start_with_env(
        &binary("slotgate-engine"),
        &[
            "--model",
            model.to_str().unwrap(),
            "--port",
            "0",
            "--threads",
            "2",
            "--n-parallel",
            "1",
            "--ctx-len",
            "512",
            "--admin-key-env",
            "SLOTGATE_TEST_ENGINE_KEY",
            "--models-dir",
            elsewhere.to_str().unwrap(),
        ],
        &[("SLOTGATE_TEST_ENGINE_KEY", "sk-engine")],
    );
    let client = client();
    let (status, _) =
        post(&client, &format!("{}/v1/completions", engine.url), &completion("Hi", 2)).await;
    assert_eq!(status, 200, "inference needs no key");
    let load = format!("{}/v1/models/load", engine.url);
    let body = json!({"model": model, "model_id": "second"});
    let (status, _, answer) = post_as(&client, &load, None, &[], &body).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("invalid_api_key")));
    let (status, _, _) = post_as(&client, &load, Some("sk-wrong"), &[], &body).await;
    assert_eq!(status, 401);
    let (status, _, answer) = post_as(&client, &load, Some("sk-engine"), &[], &body).await;
    assert_eq!(status, 403, "{} is outside the models directory: {answer}", dir);
    assert_eq!(answer["error"]["param"], "model");
    // A model inside, with a template file outside: the template is refused too.
    let inside = elsewhere.join("inside.gguf");
    std::fs::write(&inside, b"not loaded").unwrap();
    let template =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/templates/llama3.jinja");
    let body = json!({"model": inside, "model_id": "third", "chat_template_file": template});
    let (status, _, answer) = post_as(&client, &load, Some("sk-engine"), &[], &body).await;
    assert_eq!(
        (status, answer["error"]["param"].as_str()),
        (403, Some("chat_template_file")),
        "{answer}"
    );
    let _ = std::fs::remove_file(&inside);
    let unload = format!("{}/v1/models/unload", engine.url);
    let (status, _, _) = post_as(&client, &unload, None, &[], &json!({"model": MODEL})).await;
    assert_eq!(status, 401);
    let slots = format!("{}/slots", engine.url);
    let open = get(&client, &slots).await.1;
    assert!(open[0].get("n_cached").is_none(), "{open}");
    assert_eq!(open[0]["is_processing"], false, "busy or not is shown to all");
    let detail = get_as(&client, &slots, "sk-engine").await;
    assert!(detail[0]["n_cached"].as_u64().is_some_and(|n| n > 0), "{detail}");
    // Only the key's holders follow the slot events with a turn at free slots.
    let events = format!("{}/slots/events", engine.url);
    let followers = |key: Option<&'static str>, name: &'static str| {
        let (client, events) = (client.clone(), events.clone());
        async move {
            let mut request = client.get(&events).header("x-slotgate-replica", name);
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            let mut response = request.send().await.unwrap();
            let mut text = String::new();
            while !text.contains("\n\n") {
                let chunk = response.chunk().await.unwrap().expect("a first event");
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap().to_owned();
            serde_json::from_str::<Value>(&data).unwrap()["followers"].clone()
        }
    };
    assert_eq!(followers(None, "intruder").await, json!([]), "no key, no turn");
    assert_eq!(followers(Some("sk-engine"), "gateway-1").await, json!(["gateway-1"]));
    let _ = std::fs::remove_dir(&elsewhere);
}

/// A `redis-server` started by the test, stopped when dropped.
struct Redis {
    child: std::process::Child,
    url: String,
}

impl Redis {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed by scripts/install-deps");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, url: format!("redis://127.0.0.1:{port}") }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two replicas on one Redis enforce one limit between them; without Redis
/// each goes on serving on its own counters, and says so in a metric.
#[tokio::test]
async fn two_replicas_on_one_redis_enforce_one_limit() {
    let mut redis = Redis::start();
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let config = TempFile::new(
        "gateway.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\n[auth]\nredis_url = \"{}\"\n[[backends]]\nurl = \"{}\"\n\
             [[keys]]\nname = \"team-a\"\nkey = \"sk-team-a\"\nrequests_per_minute = 4\n",
            redis.url, engine.url
        ),
    );
    let clock = clock_at_a_minutes_start();
    let env = in_one_minute(&clock, &[]);
    let replicas =
        [gateway_with_config(&config.path, &env), gateway_with_config(&config.path, &env)];
    let client = client();
    let metrics = |g: &Process| format!("{}/metrics", g.url);
    for g in &replicas {
        let up = eventually(Duration::from_secs(30), || async {
            let text = client.get(metrics(g)).send().await.unwrap().text().await.unwrap();
            metric_sum(&text, "slotgate_limits_redis_up") == 1.0
        })
        .await;
        assert!(up, "the replica reached Redis");
        let models = client.get(format!("{}/v1/models", g.url)).bearer_auth("sk-team-a");
        let healthy = eventually(Duration::from_secs(30), || async {
            let list: Value =
                models.try_clone().unwrap().send().await.unwrap().json().await.unwrap();
            list["data"].as_array().is_some_and(|d| !d.is_empty())
        })
        .await;
        assert!(healthy);
    }
    let mut statuses = Vec::new();
    for i in 0..6 {
        let url = format!("{}/v1/completions", replicas[i % 2].url);
        statuses.push(post_as(&client, &url, Some("sk-team-a"), &[], &completion("Hi", 1)).await.0);
    }
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(served, 4, "one limit of 4 between the two replicas: {statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 2, "{statuses:?}");

    let _ = redis.child.kill();
    let _ = redis.child.wait();
    let url = format!("{}/v1/completions", replicas[0].url);
    let (status, _, body) =
        post_as(&client, &url, Some("sk-team-a"), &[], &completion("Hi", 1)).await;
    assert_eq!(status, 200, "served on local limits without Redis: {body}");
    let text = client.get(metrics(&replicas[0])).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric_sum(&text, "slotgate_limits_redis_up"), 0.0);
}

/// The `cache_salt` a gateway gives the key `key`: SHA-256 of a label and the
/// key's SHA-256, in hex (derived here independently of the gateway's code).
fn salt_of_key(key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut input = b"slotgate cache_salt\0".to_vec();
    input.extend_from_slice(&Sha256::digest(key.as_bytes()));
    Sha256::digest(&input).iter().map(|b| format!("{b:02x}")).collect()
}

/// With `cache_isolation`, a key's prompts share no cached prefix with another
/// key's, so `cached_tokens` cannot tell it what others sent; its own prompts
/// stay cached, and keys without it share as before. No client can name
/// another key's salt: a salt it sends is salted again with its own key.
#[tokio::test]
async fn cache_isolation_keeps_one_keys_prompts_from_anothers() {
    let engine = engine(&["--n-parallel", "4", "--ctx-len", "1024"]);
    let keys = "[[keys]]\nname = \"iso-a\"\nkey = \"sk-iso-a\"\ncache_isolation = true\n\
                [[keys]]\nname = \"iso-c\"\nkey = \"sk-iso-c\"\ncache_isolation = true\n\
                [[keys]]\nname = \"open-b\"\nkey = \"sk-open-b\"\n\
                [[keys]]\nname = \"open-d\"\nkey = \"sk-open-d\"\n";
    let (_config, gateway) = keyed_gateway(&(settings(&[&engine.url]) + keys), 1, &[]).await;
    let client = client();
    let url = format!("{}/v1/completions", gateway.url);
    let secret = "The launch code of project Bluebird is 7-4-1-9, and the meeting moved \
                  to Thursday at noon in the north building, room twelve.";
    let cached = |key: &'static str, extra: Value| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let mut body = completion(secret, 1);
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let (status, _, answer) = post_as(&client, &url, Some(key), &[], &body).await;
            assert_eq!(status, 200, "{key}: {answer}");
            answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
        }
    };
    let none = json!({});
    assert_eq!(cached("sk-open-b", none.clone()).await, 0, "a cold engine");
    assert!(cached("sk-open-d", none.clone()).await > 0, "keys without isolation share");
    assert_eq!(cached("sk-iso-a", none.clone()).await, 0, "another key's prompt is not seen");
    assert!(cached("sk-iso-a", none.clone()).await > 0, "its own prompt is cached");
    assert_eq!(cached("sk-iso-c", none.clone()).await, 0, "nor another isolated key's");
    // Naming iso-a's salt gets open-b a salt of its own, not iso-a's cache.
    let stolen = json!({"cache_salt": salt_of_key("sk-iso-a")});
    assert_eq!(cached("sk-open-b", stolen.clone()).await, 0, "a salt is its key's");
    assert!(cached("sk-open-b", stolen).await > 0, "and caches under it");
    // Straight to the engine, the salt is vLLM's: the same salt shares, another does not.
    let direct = format!("{}/v1/completions", engine.url);
    let mut body = completion(secret, 1);
    body["cache_salt"] = json!("engine-salt");
    let (status, _, answer) = post_as(&client, &direct, None, &[], &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, _, answer) = post_as(&client, &direct, None, &[], &body).await;
    assert!(answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0));
    body["cache_salt"] = json!("");
    let (status, _, answer) = post_as(&client, &direct, None, &[], &body).await;
    assert_eq!((status, answer["error"]["param"].as_str()), (400, Some("cache_salt")), "{answer}");
}

//! The gateway, started as a binary in front of real engines on the real default
//! model, and in front of scripted fakes to force exact failures.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use slotgate_tests::fake::{Fake, Step};
use slotgate_tests::*;

fn chat(model: &str, content: &str, max_tokens: u32, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "stream": stream, "temperature": 0})
}

async fn metrics(client: &reqwest::Client, url: &str) -> String {
    client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap()
}

/// The value of the first sample whose line starts with `prefix`, or 0.
fn sample(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn two_engines_share_the_load_and_slots_are_never_overcommitted() {
    // Engines that refuse instead of queueing: an overcommit would show up as a
    // slot_unavailable retry in the gateway's metrics.
    let a =
        engine(&["--n-parallel", "2", "--ctx-len", "256", "--threads", "1", "--queue-size", "0"]);
    let b =
        engine(&["--n-parallel", "2", "--ctx-len", "256", "--threads", "1", "--queue-size", "0"]);
    let gw = gateway(&[&a.url, &b.url], &[]);
    let client = client();
    ready(&client, &gw, 2).await;
    // One model served: llama-server's `/tokenize` needs no `model`, here too.
    let (status, t) =
        post(&client, &format!("{}/tokenize", gw.url), &json!({"content": "Hi"})).await;
    assert!(status == 200 && t["tokens"].as_array().is_some_and(|t| !t.is_empty()), "{t}");
    let url = format!("{}/v1/chat/completions", gw.url);
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let body =
                    chat(MODEL, &format!("Say something about the number {i}."), 12, i % 2 == 0);
                if i % 2 == 0 {
                    let (status, s) = stream(&client, &url, &body).await;
                    assert_eq!(status, 200);
                    assert!(s.done, "stream {i} ended with [DONE]");
                } else {
                    let (status, r) = post(&client, &url, &body).await;
                    assert_eq!(status, 200, "{r}");
                    assert_eq!(r["usage"]["completion_tokens"], 12);
                }
            })
        })
        .collect();
    // While they run, the gateway never claims more slots of a backend than it
    // has, and no engine ever has more busy slots than it has. The watcher runs
    // until the calls end and is awaited, so that its assertions count.
    let calls_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        let (client, done) = (client.clone(), calls_done.clone());
        let admin = format!("{}/admin/backends", gw.url);
        let urls = [a.url.clone(), b.url.clone()];
        tokio::spawn(async move {
            let (mut most_claimed, mut most_busy) = (0, 0);
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !done.load(std::sync::atomic::Ordering::Relaxed)
                && std::time::Instant::now() < deadline
            {
                let (_, backends) = get(&client, &admin).await;
                for b in backends["backends"].as_array().into_iter().flatten() {
                    let claimed = b["in_flight"].as_u64().unwrap_or(0);
                    assert!(claimed <= 2, "gateway over-claimed: {backends}");
                    most_claimed = most_claimed.max(claimed);
                }
                for u in &urls {
                    let (_, slots) = get(&client, &format!("{u}/slots")).await;
                    let busy = slots
                        .as_array()
                        .map_or(0, |s| s.iter().filter(|x| x["is_processing"] == true).count());
                    assert!(busy <= 2, "{u}: {slots}");
                    most_busy = most_busy.max(busy);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (most_claimed, most_busy)
        })
    };
    for c in calls {
        c.await.unwrap();
    }
    calls_done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most_claimed, most_busy) = watch.await.expect("the watcher's checks held");
    // Ten requests on four slots: the watcher saw backends full, not idle.
    assert_eq!(most_claimed, 2, "the watcher saw a full backend");
    assert!(most_busy >= 1, "the watcher saw engines working");
    let m = metrics(&client, &gw.url).await;
    assert_eq!(sample(&m, "slotgate_retries_total{reason=\"slot_unavailable\"}"), 0.0, "{m}");
    for e in [&a, &b] {
        let served = sample(
            &metrics(&client, &e.url).await,
            &format!("slotgate_engine_requests_total{{model=\"{MODEL}\",status=\"200\"}}"),
        );
        assert!(served >= 1.0, "both engines took work");
    }
    let (_, admin) = get(&client, &format!("{}/admin/backends", gw.url)).await;
    for b in admin["backends"].as_array().unwrap() {
        assert_eq!(b["in_flight"], 0, "every claim released: {admin}");
        assert_eq!(b["slots_total"], 2);
    }
    for name in [
        "slotgate_backend_up{",
        "slotgate_backend_slots{",
        "slotgate_backend_slots_busy{",
        "slotgate_requests_total{",
        "slotgate_request_duration_seconds_bucket{",
        "slotgate_time_to_first_token_seconds_bucket{",
    ] {
        assert!(m.contains(name), "{name} missing");
    }
}

#[tokio::test]
async fn requests_for_two_models_go_to_the_engines_that_serve_them() {
    let alpha =
        engine(&["--n-parallel", "1", "--ctx-len", "256", "--threads", "1", "--model-id", "alpha"]);
    let beta =
        engine(&["--n-parallel", "1", "--ctx-len", "256", "--threads", "1", "--model-id", "beta"]);
    let gw = gateway(&[&alpha.url, &beta.url], &[]);
    let client = client();
    ready(&client, &gw, 2).await;
    let (_, models) = get(&client, &format!("{}/v1/models", gw.url)).await;
    let ids: Vec<&str> =
        models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["alpha", "beta"]);
    let url = format!("{}/v1/chat/completions", gw.url);
    let calls: Vec<_> = ["alpha", "beta", "alpha", "beta"]
        .into_iter()
        .map(|m| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { (m, post(&client, &url, &chat(m, "Hello", 6, false)).await) })
        })
        .collect();
    for c in calls {
        let (m, (status, r)) = c.await.unwrap();
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["model"], m);
    }
    for (engine, id) in [(&alpha, "alpha"), (&beta, "beta")] {
        let served = sample(
            &metrics(&client, &engine.url).await,
            &format!("slotgate_engine_requests_total{{model=\"{id}\",status=\"200\"}}"),
        );
        assert_eq!(served, 2.0, "{id} served its own two");
    }
    let (status, r) = post(&client, &url, &chat("gamma", "x", 1, false)).await;
    assert_eq!(status, 404);
    assert_eq!(r["error"]["type"], "not_found_error");
    assert!(!r.to_string().contains("127.0.0.1"), "no internals: {r}");
    // llama-server's tokenizer endpoints go to an engine of the model named, and
    // without a model only where the gateway serves just one.
    let tokenize = format!("{}/tokenize", gw.url);
    let (status, named) =
        post(&client, &tokenize, &json!({"model": "beta", "content": "Hello"})).await;
    assert_eq!(status, 200, "{named}");
    let direct =
        post(&client, &format!("{}/tokenize", beta.url), &json!({"content": "Hello"})).await;
    assert_eq!(named, direct.1, "the gateway's answer is the engine's");
    let (status, r) = post(&client, &tokenize, &json!({"content": "Hello"})).await;
    assert_eq!((status, r["error"]["param"].as_str()), (400, Some("model")), "{r}");
}

#[tokio::test]
async fn a_killed_engine_s_stream_and_queued_work_go_on_at_the_other() {
    let mut a = engine(&["--n-parallel", "1", "--ctx-len", "512", "--threads", "1"]);
    let b = engine(&["--n-parallel", "1", "--ctx-len", "512", "--threads", "1"]);
    let gw = gateway(&[&a.url, &b.url], &[("SLOTGATE_ROUTING__QUEUE_TIMEOUT_MS", "60000")]);
    let client = client();
    ready(&client, &gw, 2).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let streams: Vec<_> = (0..2)
        .map(|i| {
            let (client, url, started) = (client.clone(), url.clone(), started_tx.clone());
            tokio::spawn(async move {
                let response = client
                    .post(&url)
                    .json(&chat(MODEL, &format!("Long story {i}:"), 400, true))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                let mut decoder = slotgate_protocol::SseDecoder::new();
                let (mut done, mut error) = (false, false);
                let mut body = response.bytes_stream();
                while let Some(chunk) = body.next().await {
                    let Ok(chunk) = chunk else { break };
                    for event in decoder.push(&chunk) {
                        done |= event.is_done();
                        error |= event.data.contains("\"error\"");
                    }
                    let _ = started.send(i);
                }
                (done, error)
            })
        })
        .collect();
    // Both engines are streaming, one each; two more requests wait in the queue.
    let mut streaming = std::collections::HashSet::new();
    while streaming.len() < 2 {
        streaming.insert(started_rx.recv().await.unwrap());
    }
    let (_, admin) = get(&client, &format!("{}/admin/backends", gw.url)).await;
    assert!(admin["backends"].as_array().unwrap().iter().all(|b| b["in_flight"] == 1), "{admin}");
    let queued: Vec<_> = (0..2)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                post(&client, &url, &chat(MODEL, &format!("Queued {i}"), 6, false)).await
            })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(10), || async {
            sample(
                &metrics(&client, &gw.url).await,
                &format!("slotgate_queue_depth{{model=\"{MODEL}\"}}"),
            ) == 2.0
        })
        .await
    );
    a.kill();
    let mut outcomes = Vec::new();
    for s in streams {
        outcomes.push(s.await.unwrap());
    }
    outcomes.sort();
    assert_eq!(
        outcomes,
        [(true, false), (true, false)],
        "both streams complete: the killed engine's went on at the other"
    );
    for q in queued {
        let (status, r) = q.await.unwrap();
        assert_eq!(status, 200, "queued request completed elsewhere: {r}");
    }
}

#[tokio::test]
async fn a_full_gateway_queue_is_a_clean_503_and_disconnects_free_the_engine_slot() {
    let e = engine(&["--n-parallel", "1", "--ctx-len", "1024", "--threads", "2"]);
    let gw = gateway(&[&e.url], &[("SLOTGATE_ROUTING__QUEUE_SIZE", "0")]);
    let client = client();
    ready(&client, &gw, 1).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let response = client
        .post(&url)
        .json(&chat(MODEL, "Tell me a very long story.", 900, true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("x-request-id"));
    let mut body = response.bytes_stream();
    body.next().await.unwrap().unwrap();

    let refused = client
        .post(&url)
        .header("x-request-id", "mine-42")
        .json(&chat(MODEL, "Hi", 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["x-request-id"], "mine-42", "the client's id comes back");
    let r: Value = refused.json().await.unwrap();
    assert_eq!(r["error"]["code"], "slot_unavailable");

    drop(body);
    let slots = format!("{}/slots", e.url);
    let freed = eventually(Duration::from_secs(10), || async {
        get(&client, &slots).await.1[0]["is_processing"] == json!(false)
    })
    .await;
    assert!(freed, "the engine freed the slot of the client that left");
    // The gateway's view converges within a health interval.
    let admin = format!("{}/admin/backends", gw.url);
    let released = eventually(Duration::from_secs(5), || async {
        get(&client, &admin).await.1["backends"][0]["slots_busy"] == 0
    })
    .await;
    assert!(released, "{}", get(&client, &admin).await.1);
    let (status, _) = post(&client, &url, &chat(MODEL, "Hi", 4, false)).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn refusals_and_resets_before_the_first_byte_are_retried_invisibly() {
    let fake = Fake::start("fake", 1).await;
    fake.push(&[Step::SlotUnavailable, Step::Reset]);
    let gw = gateway(&[&fake.url], &[]);
    let client = client();
    ready(&client, &gw, 1).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let (status, r) = post(&client, &url, &json!({"model": "fake", "messages": [{"role": "user", "content": "x"}], "extra_field": {"kept": true}})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], "ok");
    assert_eq!(fake.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    let m = metrics(&client, &gw.url).await;
    assert_eq!(sample(&m, "slotgate_retries_total{reason=\"slot_unavailable\"}"), 1.0, "{m}");
    assert_eq!(sample(&m, "slotgate_retries_total{reason=\"before_first_byte\"}"), 1.0, "{m}");
}

/// The last event of a stream to `path` of a gateway over a fake whose
/// backend dies after `events` events: its name line and its data.
async fn last_event_when_cut_off(path: &str, events: u32, body: Value) -> (String, Value) {
    let fake = Fake::start("fake", 1).await;
    fake.push(&[Step::DieMidStream(events)]);
    let gw = gateway(&[&fake.url], &[]);
    let client = client();
    ready(&client, &gw, 1).await;
    let response = client.post(format!("{}{path}", gw.url)).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let (name, data) = last.split_once('\n').unwrap();
    let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
    (name.to_owned(), data)
}

/// A Messages stream whose backend dies ends with an `error` event in
/// Anthropic's shape, which its SDK raises.
#[tokio::test]
async fn a_messages_stream_cut_off_ends_with_an_anthropic_error_event() {
    let body = json!({"model": "fake", "max_tokens": 5, "stream": true,
        "messages": [{"role": "user", "content": "x"}]});
    let (name, data) = last_event_when_cut_off("/v1/messages", 2, body).await;
    assert_eq!(name, "event: error", "{data}");
    assert_eq!((&data["type"], &data["error"]["type"]), (&json!("error"), &json!("api_error")));
}

/// A Responses stream whose backend dies ends with an `error` event of the
/// Responses API, numbered after the last event relayed, as its SDKs read it.
#[tokio::test]
async fn a_responses_stream_cut_off_ends_with_a_numbered_error_event() {
    let body = json!({"model": "fake", "input": "x", "stream": true});
    let (name, data) = last_event_when_cut_off("/v1/responses", 3, body).await;
    assert_eq!(name, "event: error", "{data}");
    assert_eq!((&data["type"], &data["code"]), (&json!("error"), &json!("server_error")));
    // The fake's three events were numbered 0 to 2 (as an engine numbers them).
    assert_eq!(data["sequence_number"], 3, "{data}");
}

/// A conversation of the Responses API over two engines and two gateway
/// replicas: each turn goes to a replica other than the last one's, and still
/// to the engine that stored the response it continues, where it is warm.
#[tokio::test]
async fn responses_follow_their_engine_through_any_replica() {
    let one = engine(&["--n-parallel", "2", "--ctx-len", "1024"]);
    let two = engine(&["--n-parallel", "2", "--ctx-len", "1024"]);
    let replicas = [gateway(&[&one.url, &two.url], &[]), gateway(&[&one.url, &two.url], &[])];
    let client = client();
    for replica in &replicas {
        ready(&client, replica, 2).await;
    }
    let ask = |previous: Option<&str>| {
        json!({"model": MODEL, "input": "And then?", "max_output_tokens": 3, "temperature": 0,
            "previous_response_id": previous})
    };
    let url = |turn: usize| format!("{}/v1/responses", replicas[turn % 2].url);
    let (status, first) = post(&client, &url(0), &ask(None)).await;
    assert_eq!(status, 200, "{first}");
    let mut previous = first["id"].as_str().unwrap().to_owned();
    for turn in 1..6 {
        let (status, next) = post(&client, &url(turn), &ask(Some(&previous))).await;
        assert_eq!(status, 200, "turn {turn}: {next}");
        let cached = next["usage"]["input_tokens_details"]["cached_tokens"].as_u64();
        assert!(cached > Some(0), "turn {turn} was not warm: {next}");
        previous = next["id"].as_str().unwrap().to_owned();
    }
}

/// `/props` is read through the gateway's one backend client: its query
/// escaped, its whole answer due within `routing.first_byte_timeout_ms`.
#[tokio::test]
async fn props_are_read_within_the_first_byte_timeout() {
    let fake = Fake::start("a b/c", 1).await;
    fake.push(&[Step::Stall(Duration::from_secs(5))]);
    let gw = gateway(&[&fake.url], &[("SLOTGATE_ROUTING__FIRST_BYTE_TIMEOUT_MS", "300")]);
    let client = client();
    ready(&client, &gw, 1).await;
    let started = std::time::Instant::now();
    let (status, r) = get(&client, &format!("{}/props", gw.url)).await;
    assert_eq!(status, 503, "{r}");
    assert_eq!(r["error"]["type"], "unavailable_error", "{r}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let (status, r) = get(&client, &format!("{}/props", gw.url)).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["query"], "model=a%20b%2Fc", "{r}");
}

#[tokio::test]
async fn a_backend_dying_mid_stream_ends_the_stream_with_an_error_event() {
    let fake = Fake::start("fake", 1).await;
    fake.push(&[Step::DieMidStream(3)]);
    let gw = gateway(&[&fake.url], &[]);
    let client = client();
    ready(&client, &gw, 1).await;
    let response = client
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&json!({"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut decoder = slotgate_protocol::SseDecoder::new();
    let mut events = Vec::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        events.extend(decoder.push(&chunk.expect("the stream closes cleanly")));
    }
    assert_eq!(events.len(), 4, "{events:?}");
    assert!(events[..3].iter().all(|e| e.data.contains("\"content\"")));
    let last: Value = serde_json::from_str(&events[3].data).unwrap();
    assert_eq!(last["error"]["type"], "server_error");
    assert_eq!(
        fake.requests.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "a started stream is never retried"
    );
}

#[tokio::test]
async fn sigterm_drains_in_flight_streams_then_stops() {
    let e = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let mut gw = gateway(&[&e.url], &[]);
    let client = client();
    ready(&client, &gw, 1).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let running = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { stream(&client, &url, &chat(MODEL, "Count slowly.", 40, true)).await }
    });
    let slots = format!("{}/slots", e.url);
    assert!(
        eventually(Duration::from_secs(20), || async {
            get(&client, &slots).await.1[0]["is_processing"] == json!(true)
        })
        .await
    );
    let status =
        tokio::task::spawn_blocking(move || gw.terminate(Duration::from_secs(30))).await.unwrap();
    assert!(status.is_some_and(|s| s.success()), "gateway exited cleanly: {status:?}");
    let (code, s) = running.await.unwrap();
    assert_eq!(code, 200);
    assert!(s.done, "the in-flight stream finished before the gateway stopped");
}

#[tokio::test]
async fn supervised_engines_start_serve_and_restart() {
    let dir = std::env::temp_dir().join(format!("slotgate-gw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gateway.toml");
    let engine_bin = binary("slotgate-engine");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\n[auth]\nadmin_loopback = true\n\
             [routing]\nhealth_interval_ms = 100\nhealthy_threshold = 1\n\
             [[engines]]\nmodel = {:?}\nn_parallel = 1\nctx_len = 256\nbinary = {:?}\nargs = [\"--threads\", \"2\"]\n",
            model_path(),
            engine_bin
        ),
    )
    .unwrap();
    let gw = Process::start(&binary("slotgate"), &["--config", config.to_str().unwrap()]);
    let client = client();
    ready(&client, &gw, 1).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let (status, _) = post(&client, &url, &chat(MODEL, "Hi", 4, false)).await;
    assert_eq!(status, 200);

    // Kill the engine behind the gateway's back: it is restarted and serves again.
    let (_, admin) = get(&client, &format!("{}/admin/backends", gw.url)).await;
    let old_url = admin["backends"][0]["url"].as_str().unwrap().to_owned();
    // The engine was given an admin key that only the gateway knows.
    let load = format!("{old_url}/v1/models/load");
    let (status, _) = post(&client, &load, &json!({"model": model_path()})).await;
    assert_eq!(status, 401, "a supervised engine loads models only for its gateway");
    // And answers only its gateway: nothing on the host goes around the
    // gateway's keys and limits.
    let direct = format!("{old_url}/v1/chat/completions");
    let (status, refused) = post(&client, &direct, &chat(MODEL, "Hi", 4, false)).await;
    assert_eq!(status, 401, "{refused}");
    assert_eq!(get(&client, &format!("{old_url}/health")).await.0, 200, "health stays open");
    let killed = std::process::Command::new("pkill")
        .args(["-KILL", "-P", &gw.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let restarted = eventually(Duration::from_secs(60), || async {
        let (_, admin) = get(&client, &format!("{}/admin/backends", gw.url)).await;
        admin["backends"][0]["healthy"] == true && admin["backends"][0]["url"] != json!(old_url)
    })
    .await;
    assert!(restarted, "engine restarted");
    let (status, _) = post(&client, &url, &chat(MODEL, "Hi again", 4, false)).await;
    assert_eq!(status, 200);

    // OpenAI's Python SDK chats through the gateway, streamed and not.
    let gw_url = gw.url.clone();
    let out =
        tokio::task::spawn_blocking(move || python_client("openai_client.py", &[&gw_url, MODEL]))
            .await
            .unwrap();
    assert!(out.contains("openai sdk: ok"), "{out}");
    drop(gw);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn when_every_attempt_is_refused_the_client_gets_slot_unavailable() {
    let fake = Fake::start("fake", 1).await;
    fake.push(&[Step::SlotUnavailable, Step::SlotUnavailable, Step::SlotUnavailable]);
    let gw = gateway(
        &[&fake.url],
        &[("SLOTGATE_ROUTING__MAX_ATTEMPTS", "3"), ("SLOTGATE_ROUTING__QUEUE_TIMEOUT_MS", "2000")],
    );
    let client = client();
    ready(&client, &gw, 1).await;
    let response = client
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&json!({"model": "fake", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "slot_unavailable", "{body}");
    assert_eq!(
        fake.requests.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "max_attempts tries, no more"
    );
}

#[tokio::test]
async fn a_vllm_backend_is_scheduled_by_the_load_in_its_metrics() {
    // vLLM has no /slots: its load is read from /metrics over the configured slots.
    let fake = Fake::start_vllm("fake").await;
    fake.set_load(2, 1);
    let config =
        TempFile::new("vllm.toml", &format!("[[backends]]\nurl = \"{}\"\nslots = 2\n", fake.url));
    let gw = gateway_with_config(&config.path, &[]);
    let client = client();
    ready(&client, &gw, 1).await;
    let admin = format!("{}/admin/backends", gw.url);
    let full = eventually(Duration::from_secs(5), || async {
        get(&client, &admin).await.1["backends"][0]["slots_busy"] == 3
    })
    .await;
    assert!(full, "{}", get(&client, &admin).await.1);
    let url = format!("{}/v1/chat/completions", gw.url);
    let pending = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { post(&client, &url, &chat("fake", "x", 4, false)).await })
    };
    // The request is seen waiting in the gateway's queue, not sent.
    let queued = eventually(Duration::from_secs(5), || async {
        metric_sum(&metrics(&client, &gw.url).await, "slotgate_queue_depth") == 1.0
    })
    .await;
    assert!(queued, "{}", metrics(&client, &gw.url).await);
    assert_eq!(
        fake.requests.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a full vLLM backend is not sent more: the request waits in the gateway"
    );
    assert!(!pending.is_finished());
    fake.set_load(1, 0);
    let (status, r) = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("served once the metrics show a free slot")
        .unwrap();
    assert_eq!(status, 200, "{r}");
    assert_eq!(fake.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A kept-alive connection that the backend closed while it lay idle is sent
/// again at once, on a new connection to the same backend: the client never
/// knows, and the resend is an attempt that `slotgate_retries_total` counts.
#[tokio::test]
async fn a_stale_pooled_connection_is_sent_again_and_counted() {
    let fake = Fake::start("fake", 1).await;
    fake.push(&[Step::KeepAliveThenClose]);
    let gw = gateway(&[&fake.url], &[]);
    let client = client();
    ready(&client, &gw, 1).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let body = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post(&client, &url, &body).await.0, 200);
    // Closed by now, and idle for too short a time to be looked at first.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (status, answer) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{answer}");
    let text = metrics(&client, &gw.url).await;
    let stale = metric_sum_where(&text, "slotgate_retries_total", "reason=\"stale_connection\"");
    assert_eq!(stale, 1.0, "{text}");
    assert_eq!(fake.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
}

//! The engine's streams over time: keep-alive comments while a stream waits for
//! its first token, and a shutdown that does not wait for a stream without bound.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use slotgate_tests::*;

/// Gemma 3's end-of-generation tokens (`<eos>`, `<end_of_turn>`), banned so that a
/// request runs for all of its `max_tokens`.
fn long_completion(max_tokens: u32, stream: bool) -> Value {
    json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens,
           "stream": stream, "temperature": 0, "logit_bias": {"1": -100, "106": -100}})
}

/// Posts a streamed request and reads its body as text until it ends or breaks;
/// returns the status, the text, and whether it ended cleanly.
async fn read_stream(client: &reqwest::Client, url: &str, body: &Value) -> (u16, String, bool) {
    let response = client.post(url).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    let mut bytes = response.bytes_stream();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        match tokio::time::timeout_at(deadline, bytes.next()).await {
            Ok(Some(Ok(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(None) => return (status, text, true),
            Ok(Some(Err(_))) | Err(_) => return (status, text, false),
        }
    }
}

/// A streamed request queued behind a long one gets its headers and `: keep-alive`
/// comments at once, then its tokens when the slot frees.
#[tokio::test]
async fn a_queued_stream_is_kept_alive_until_its_first_token() {
    let engine = engine(&[
        "--n-parallel",
        "1",
        "--ctx-len",
        "1024",
        "--queue-size",
        "4",
        "--sse-keepalive-ms",
        "200",
    ]);
    let client = client();
    let url = format!("{}/v1/completions", engine.url);
    let long = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { post(&client, &url, &long_completion(400, false)).await }
    });
    wait_slot_busy(&client, &engine.url).await;

    let started = Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(2),
        client.post(&url).json(&long_completion(4, true)).send(),
    )
    .await
    .expect("headers within 2 s although the only slot is busy")
    .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(2), body.next())
        .await
        .expect("a first chunk within 2 s")
        .unwrap()
        .unwrap();
    assert!(first.starts_with(b": keep-alive"), "{:?}", String::from_utf8_lossy(&first));
    let mut text = String::from_utf8_lossy(&first).into_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Ok(Some(chunk)) = tokio::time::timeout_at(deadline.into(), body.next()).await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let (status, long) = long.await.unwrap();
    assert_eq!(status, 200, "{long}");
    assert_eq!(long["usage"]["completion_tokens"], 400, "the long request ran to its end");
    assert!(started.elapsed() > Duration::from_millis(400), "it did wait for the slot");
    let keepalives = text.matches(": keep-alive").count();
    assert!(keepalives >= 2, "one at once and more while it waited: {text}");
    let data_at = text.find("data: ").expect("tokens after the keep-alives");
    assert!(!text[data_at..].contains(": keep-alive"), "none after the first token: {text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
}

/// A stream answered before the interval passes has no keep-alive at all, and a
/// refusal is still a plain 503 (the gateway retries those elsewhere).
#[tokio::test]
async fn a_prompt_answer_has_no_keep_alive_and_a_refusal_stays_a_503() {
    let engine = engine(&["--n-parallel", "1", "--queue-size", "0", "--sse-keepalive-ms", "5000"]);
    let client = client();
    let url = format!("{}/v1/completions", engine.url);
    let (status, text, ended) = read_stream(&client, &url, &long_completion(4, true)).await;
    assert_eq!((status, ended), (200, true));
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(!text.contains("keep-alive"), "{text}");

    let long = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { post(&client, &url, &long_completion(200, false)).await }
    });
    wait_slot_busy(&client, &engine.url).await;
    let (status, body) = post(&client, &url, &long_completion(4, true)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "slot_unavailable");
    assert_eq!(long.await.unwrap().0, 200);
}

/// SIGTERM with a stream running: the engine waits for it only `drain_timeout_ms`.
#[tokio::test]
async fn shutdown_cuts_off_a_stream_after_the_drain_timeout() {
    let mut engine =
        engine(&["--n-parallel", "1", "--ctx-len", "4096", "--drain-timeout-ms", "500"]);
    let client = client();
    let url = format!("{}/v1/completions", engine.url);
    // About a minute of tokens on two cores: far longer than the drain.
    let running = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { read_stream(&client, &url, &long_completion(3000, true)).await }
    });
    wait_slot_busy(&client, &engine.url).await;
    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || engine.terminate(Duration::from_secs(15)))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(status.is_some(), "the engine did not exit within 15 s of SIGTERM");
    assert!(took < Duration::from_secs(5), "exit took {took:?}, drain timeout 500 ms");
    let (status, text, _) =
        tokio::time::timeout(Duration::from_secs(10), running).await.unwrap().unwrap();
    assert_eq!(status, 200);
    assert!(!text.contains("[DONE]"), "the stream was cut off, not finished");
}

/// The engine's resident memory, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .expect("VmRSS");
    kib / 1024.0
}

/// With `--sleep-idle-s`, an idle engine unloads its model and gives its memory
/// back, while `/health`, `/props`, the model list, `/slots` and `/metrics` still
/// answer without waking it; a burst of requests that need the model wakes it
/// with one load and all are served; a stream longer than the idle time is not
/// cut by it; then it sleeps again.
#[tokio::test]
async fn an_idle_engine_sleeps_and_a_burst_wakes_it_with_one_load() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512", "--sleep-idle-s", "1"]);
    let client = client();
    let props = format!("{}/props", engine.url);
    let sleeping = |client: reqwest::Client, url: String| async move {
        get(&client, &url).await.1["is_sleeping"] == json!(true)
    };
    assert!(!sleeping(client.clone(), props.clone()).await, "awake right after start");
    let awake_mib = rss_mib(engine.pid());
    assert!(
        eventually(Duration::from_secs(15), || sleeping(client.clone(), props.clone())).await,
        "not asleep within 15 s of idle"
    );
    let asleep_mib = rss_mib(engine.pid());
    assert!(
        asleep_mib + 100.0 < awake_mib,
        "asleep {asleep_mib:.0} MiB, awake {awake_mib:.0} MiB: the model's memory was not freed"
    );
    for path in ["/health", "/v1/models", "/slots", "/metrics"] {
        let response = client.get(format!("{}{path}", engine.url)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path} while asleep");
    }
    let (_, models) = get(&client, &format!("{}/v1/models", engine.url)).await;
    assert_eq!(models["data"][0]["id"], MODEL, "{models}");
    assert!(sleeping(client.clone(), props.clone()).await, "reading the state woke it");

    let url = format!("{}/v1/completions", engine.url);
    let burst = (0..4).map(|i| {
        let (client, url) = (client.clone(), url.clone());
        let body = json!({"model": MODEL, "prompt": format!("Count to {i}:"), "max_tokens": 4});
        async move { post(&client, &url, &body).await }
    });
    for (status, body) in futures::future::join_all(burst).await {
        assert_eq!(status, 200, "{body}");
        assert!(body["choices"][0]["text"].is_string(), "{body}");
    }
    assert!(!sleeping(client.clone(), props.clone()).await, "awake after the burst");
    let text = metrics(&client, &engine.url).await;
    let loads = |reason: &str| {
        metric_sum_where(
            &text,
            "slotgate_engine_model_loads_total",
            &format!("reason=\"{reason}\""),
        )
    };
    assert_eq!(loads("wake"), 1.0, "one load for the whole burst:\n{text}");
    assert_eq!(loads("start"), 1.0);

    // A stream that outlasts the idle time is not cut off by sleep.
    let started = Instant::now();
    let (status, streamed, clean) = read_stream(&client, &url, &long_completion(200, true)).await;
    assert_eq!(status, 200);
    assert!(clean && streamed.contains("[DONE]"), "the stream did not finish: {streamed}");
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "the stream was shorter than the idle time"
    );
    assert!(
        eventually(Duration::from_secs(15), || sleeping(client.clone(), props.clone())).await,
        "not asleep again"
    );
    let text = metrics(&client, &engine.url).await;
    let unloads = metric_sum_where(&text, "slotgate_engine_model_unloads_total", "reason=\"idle\"");
    assert_eq!(unloads, 2.0, "{text}");
}

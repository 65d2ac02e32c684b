//! Several gateway replicas in front of the same engines: with the slot state
//! pushed by the engines (`/slots/events`, naming whose requests are whose),
//! replicas stop handing out the same slot; measured against polling alone, on
//! the same engines in the same run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use slotgate_tests::*;

const REQUESTS: usize = 96;
const CLIENTS: usize = 18;

/// What one run of the load came to.
#[derive(Debug)]
struct Run {
    /// Requests an engine refused as full (retried by a gateway).
    refused: f64,
    /// The status each client got, in the order they came.
    statuses: Vec<u16>,
}

/// Three replicas in front of `engines`, polling each `/slots` every second
/// (the default) or following the pushed state; 18 clients send 96 requests,
/// spread over the replicas.
async fn fleet(engines: &[&str], push: bool) -> Run {
    let mut args = vec!["--listen", "127.0.0.1:0"];
    for e in engines {
        args.extend_from_slice(&["--backend", e]);
    }
    let env = [
        ("SLOTGATE_ROUTING__SLOT_EVENTS", if push { "true" } else { "false" }),
        ("SLOTGATE_AUTH__ADMIN_LOOPBACK", "true"),
    ];
    let replicas: Vec<Process> =
        (0..3).map(|_| Process::start_with_env(&binary("slotgate"), &args, &env)).collect();
    let client = client();
    for r in &replicas {
        ready(&client, r, engines.len()).await;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let urls: Arc<Vec<String>> =
        Arc::new(replicas.iter().map(|r| format!("{}/v1/completions", r.url)).collect());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (client, next, statuses, urls) =
                (client.clone(), next.clone(), statuses.clone(), urls.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= REQUESTS {
                        return;
                    }
                    let body = json!({"model": MODEL, "prompt": format!("Fact number {i}:"),
                        "max_tokens": 12, "temperature": 0});
                    let (status, _) = post(&client, &urls[i % urls.len()], &body).await;
                    statuses.lock().unwrap().push(status);
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let mut refused = 0.0;
    for r in &replicas {
        let text = client.get(format!("{}/metrics", r.url)).send().await.unwrap();
        let text = text.text().await.unwrap();
        refused += metric_sum_where(&text, "slotgate_retries_total", "reason=\"slot_unavailable\"");
    }
    let statuses = statuses.lock().unwrap().clone();
    Run { refused, statuses }
}

/// Three replicas, three engines of two slots with no queue of their own (so
/// any over-commit is an engine-side 503), more clients than slots: polling,
/// the replicas keep sending to slots that another replica already took; with
/// the pushed state at most a tenth as often, and every request is served.
#[tokio::test]
async fn replicas_agree_through_the_engines_pushed_state() {
    let flags = ["--n-parallel", "2", "--ctx-len", "256", "--threads", "1", "--queue-size", "0"];
    let engines: Vec<Process> = (0..3).map(|_| engine(&flags)).collect();
    let urls: Vec<&str> = engines.iter().map(|e| e.url.as_str()).collect();
    let polled = fleet(&urls, false).await;
    let pushed = fleet(&urls, true).await;
    println!(
        "engine-side refusals for {REQUESTS} requests: polling {} ({:.2} per request), pushed {} ({:.2} per request)",
        polled.refused,
        polled.refused / REQUESTS as f64,
        pushed.refused,
        pushed.refused / REQUESTS as f64
    );
    assert_eq!(pushed.statuses.len(), REQUESTS);
    assert!(pushed.statuses.iter().all(|s| *s == 200), "{:?}", pushed.statuses);
    assert!(polled.refused >= 10.0, "the load over-commits when polling: {polled:?}");
    assert!(
        pushed.refused * 10.0 <= polled.refused,
        "pushed {} against polled {}: not a tenth",
        pushed.refused,
        polled.refused
    );
}

/// A stream of slot states, read one at a time.
struct Events {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    decoder: slotgate_protocol::SseDecoder,
    pending: std::collections::VecDeque<serde_json::Value>,
}

impl Events {
    async fn next(&mut self) -> serde_json::Value {
        use futures::StreamExt;
        loop {
            if let Some(state) = self.pending.pop_front() {
                return state;
            }
            let chunk = tokio::time::timeout(std::time::Duration::from_secs(30), self.body.next())
                .await
                .expect("an event within 30 s")
                .expect("the stream goes on")
                .unwrap();
            for event in self.decoder.push(&chunk) {
                self.pending.push_back(serde_json::from_str(&event.data).unwrap());
            }
        }
    }
}

/// The engine's event stream: the whole state first (naming its follower),
/// then each change with a larger number; `/slots` carries the same number.
#[tokio::test]
async fn the_engine_pushes_its_slot_state_with_sequence_numbers() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let client = client();
    let events = client
        .get(format!("{}/slots/events", engine.url))
        .header("x-slotgate-replica", "gw-test")
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let mut events = Events {
        body: Box::pin(events.bytes_stream()),
        decoder: slotgate_protocol::SseDecoder::new(),
        pending: std::collections::VecDeque::new(),
    };
    let first = events.next().await;
    assert_eq!(first["followers"], json!(["gw-test"]), "{first}");
    assert_eq!(first["models"][0]["slots"], 1);
    let url = format!("{}/v1/completions", engine.url);
    let body_json = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 4});
    let answer = client.post(&url).header("x-slotgate-replica", "gw-test").json(&body_json).send();
    let answer = tokio::spawn(answer);
    let busy = events.next().await;
    assert!(busy["seq"].as_u64() > first["seq"].as_u64(), "{busy}");
    assert_eq!(busy["models"][0]["busy"], 1, "{busy}");
    assert_eq!(busy["models"][0]["replicas"]["gw-test"], 1, "{busy}");
    assert_eq!(answer.await.unwrap().unwrap().status(), 200);
    let free = events.next().await;
    assert_eq!(free["models"][0]["busy"], 0, "{free}");
    let slots = client.get(format!("{}/slots", engine.url)).send().await.unwrap();
    let seq: u64 = slots.headers()["x-slotgate-slots-seq"].to_str().unwrap().parse().unwrap();
    assert_eq!(Some(seq), free["seq"].as_u64(), "/slots says the same number");
}

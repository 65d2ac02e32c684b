//! The load generator: closed-loop (N clients, each sending its next request when
//! the last one ends) or open-loop (a fixed arrival rate, whatever the answers do)
//! load against one OpenAI-compatible endpoint, streamed or not, bounded in count
//! and in time. Each request becomes a [`Sample`] or an error kind; a run becomes a
//! [`Report`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;
use slotgate_protocol::SseDecoder;

use crate::stats::{Percentiles, Report};

pub use crate::arrival::Arrival;

/// One run's shape and bounds: it ends at `requests` requests or `duration`,
/// whichever comes first, and no request waits longer than `timeout`.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// How requests arrive.
    pub arrival: Arrival,
    /// At most this many requests.
    pub requests: usize,
    /// No request starts after this long.
    pub duration: Duration,
    /// Per-request limit, counted as a `timeout` error when passed.
    pub timeout: Duration,
}

/// Where requests go.
#[derive(Debug, Clone)]
pub struct Target {
    /// A short name for tables and charts ("slotgate", "nginx", ...).
    pub name: String,
    /// The full endpoint, `http://127.0.0.1:PORT/v1/chat/completions`.
    pub url: String,
    /// Sent as `Authorization: Bearer ...` when set.
    pub bearer: Option<String>,
}

impl Target {
    /// A target without credentials.
    pub fn new(name: &str, url: String) -> Self {
        Self { name: name.to_owned(), url, bearer: None }
    }
}

/// The body of the `i`-th request of a run. A body with `"stream": true` is read
/// as server-sent events; one without, as a single JSON answer.
pub type Bodies = Arc<dyn Fn(usize) -> Value + Send + Sync>;

/// What one successful request measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// From sending to the first chunk with text (streamed), or to the whole
    /// answer (not streamed).
    pub ttft: Duration,
    /// From sending to the end of the answer.
    pub total: Duration,
    /// Gaps between chunks with text, after the first.
    pub gaps: Vec<Duration>,
    /// Generated tokens: from `usage.completion_tokens`, or, for a stream that
    /// carries no usage, the number of chunks with text (one token per chunk).
    pub tokens: u64,
    /// The generated text.
    #[serde(skip)]
    pub text: String,
    /// Prompt tokens and those of them served from the engine's prompt cache, as
    /// the answer's usage reports them (llama-server's `timings.cache_n` when its
    /// usage lacks the detail); 0 when the answer carries no usage.
    pub prompt_tokens: u64,
    /// See `prompt_tokens`.
    pub cached_tokens: u64,
}

impl Sample {
    fn read_usage(&mut self, value: &Value) {
        if let Some(prompt) = value["usage"]["prompt_tokens"].as_u64() {
            self.prompt_tokens = prompt;
        }
        let cached = value["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .or(value["timings"]["cache_n"].as_u64());
        if let Some(cached) = cached {
            self.cached_tokens = self.cached_tokens.max(cached);
        }
    }
}

/// Sends one request and measures it; the error is its kind, for counting.
pub async fn request(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    timeout: Duration,
) -> Result<Sample, String> {
    let started = Instant::now();
    let mut builder = client.post(&target.url).json(body).timeout(timeout);
    if let Some(key) = &target.bearer {
        builder = builder.bearer_auth(key);
    }
    let response = builder.send().await.map_err(|e| transport_kind(&e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("http_{}", status.as_u16()));
    }
    if body["stream"] == Value::Bool(true) {
        read_stream(response, started).await
    } else {
        let value: Value = response.json().await.map_err(|e| transport_kind(&e))?;
        let total = started.elapsed();
        let text = value["choices"][0]["message"]["content"]
            .as_str()
            .or(value["choices"][0]["text"].as_str())
            .unwrap_or_default()
            .to_owned();
        let mut sample = Sample {
            ttft: total,
            total,
            gaps: Vec::new(),
            tokens: value["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            text,
            ..Sample::default()
        };
        sample.read_usage(&value);
        Ok(sample)
    }
}

fn transport_kind(e: &reqwest::Error) -> String {
    // The kind is what is counted; the first error's whole cause chain is printed
    // once, so that a kind such as `transport` can be told apart.
    static SHOWN: std::sync::Once = std::sync::Once::new();
    SHOWN.call_once(|| {
        let mut cause = format!("{e}");
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            cause.push_str(&format!(": {s}"));
            source = s.source();
        }
        eprintln!("first transport error of this process: {cause}");
    });
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_decode() {
        "bad_body"
    } else {
        "transport"
    }
    .to_owned()
}

async fn read_stream(response: reqwest::Response, started: Instant) -> Result<Sample, String> {
    let mut sample = Sample::default();
    let mut usage = None;
    let mut chunks_with_text = 0;
    let mut last: Option<Instant> = None;
    let mut decoder = SseDecoder::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            if e.is_timeout() {
                "timeout".to_owned()
            } else {
                "stream_cut".to_owned()
            }
        })?;
        for event in decoder.push(&chunk) {
            if event.is_done() {
                sample.total = started.elapsed();
                sample.tokens = usage.unwrap_or(chunks_with_text);
                return Ok(sample);
            }
            let value: Value =
                serde_json::from_str(&event.data).map_err(|_| "bad_chunk".to_owned())?;
            if value.get("error").is_some() {
                return Err("stream_error".to_owned());
            }
            if let Some(tokens) = value["usage"]["completion_tokens"].as_u64() {
                usage = Some(tokens);
            }
            sample.read_usage(&value);
            let text: String = value["choices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["delta"]["content"].as_str().or(c["text"].as_str()))
                .collect();
            if !text.is_empty() {
                let now = Instant::now();
                match last {
                    None => sample.ttft = now - started,
                    Some(prev) => sample.gaps.push(now - prev),
                }
                last = Some(now);
                chunks_with_text += 1;
                sample.text.push_str(&text);
            }
        }
    }
    Err("stream_cut".to_owned())
}

/// Runs one load against one target and reports it.
pub async fn run(client: &reqwest::Client, target: &Target, load: Load, bodies: &Bodies) -> Report {
    let started = Instant::now();
    let outcomes = match load.arrival {
        Arrival::Closed { clients } => closed(client, target, load, bodies, clients).await,
        Arrival::Open { rate } => open(client, target, load, bodies, rate).await,
    };
    let seconds = started.elapsed().as_secs_f64();
    let stream = bodies(0)["stream"] == Value::Bool(true);
    summarize(target, load.arrival, stream, seconds, outcomes)
}

type Outcome = Result<Sample, String>;

async fn closed(
    client: &reqwest::Client,
    target: &Target,
    load: Load,
    bodies: &Bodies,
    clients: usize,
) -> Vec<Outcome> {
    let next = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + load.duration;
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (client, target, bodies, next) =
            (client.clone(), target.clone(), bodies.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= load.requests || Instant::now() >= deadline {
                    return outcomes;
                }
                outcomes.push(request(&client, &target, &bodies(i), load.timeout).await);
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap_or_default());
    }
    all
}

async fn open(
    client: &reqwest::Client,
    target: &Target,
    load: Load,
    bodies: &Bodies,
    rate: f64,
) -> Vec<Outcome> {
    let interval = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..load.requests {
        let at = started + interval.mul_f64(i as f64);
        if at - started >= load.duration {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        let (client, target, body) = (client.clone(), target.clone(), bodies(i));
        tasks.push(tokio::spawn(
            async move { request(&client, &target, &body, load.timeout).await },
        ));
    }
    let mut all = Vec::with_capacity(tasks.len());
    for task in tasks {
        all.push(task.await.unwrap_or_else(|_| Err("panicked".to_owned())));
    }
    all
}

fn summarize(
    target: &Target,
    arrival: Arrival,
    stream: bool,
    seconds: f64,
    outcomes: Vec<Outcome>,
) -> Report {
    let sent = outcomes.len();
    let mut errors = BTreeMap::new();
    let mut samples = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(sample) => samples.push(sample),
            Err(kind) => *errors.entry(kind).or_insert(0) += 1,
        }
    }
    let tokens: u64 = samples.iter().map(|s| s.tokens).sum();
    let ttft: Vec<Duration> = samples.iter().map(|s| s.ttft).collect();
    let e2e: Vec<Duration> = samples.iter().map(|s| s.total).collect();
    let gaps: Vec<Duration> = samples.iter().flat_map(|s| s.gaps.iter().copied()).collect();
    Report {
        target: target.name.clone(),
        arrival,
        stream,
        sent,
        ok: samples.len(),
        errors,
        seconds,
        requests_per_second: samples.len() as f64 / seconds,
        generated_tokens: tokens,
        tokens_per_second: tokens as f64 / seconds,
        ttft_ms: Percentiles::of(&ttft),
        itl_ms: Percentiles::of(&gaps),
        e2e_ms: Percentiles::of(&e2e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use serde_json::json;

    /// A server that streams three words for requests with `"stream": true`, answers
    /// once otherwise, and refuses requests whose `n` is odd.
    async fn server() -> String {
        let app = Router::new().route(
            "/v1/completions",
            post(|axum::Json(body): axum::Json<Value>| async move {
                use axum::response::IntoResponse;
                if body["n"].as_u64().unwrap_or(0) % 2 == 1 {
                    return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
                }
                if body["stream"] == Value::Bool(true) {
                    let events = ["a", "b", "c"]
                        .iter()
                        .map(|t| format!("data: {}\n\n", json!({"choices": [{"index": 0, "text": t}]})))
                        .chain(["data: [DONE]\n\n".to_owned()])
                        .collect::<String>();
                    return ([("content-type", "text/event-stream")], events).into_response();
                }
                axum::Json(json!({"choices": [{"index": 0, "text": "abc"}], "usage": {"completion_tokens": 3}}))
                    .into_response()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/completions", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn load(arrival: Arrival, requests: usize) -> Load {
        Load {
            arrival,
            requests,
            duration: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn closed_loop_counts_tokens_and_errors_by_kind() {
        let target = Target::new("t", server().await);
        let bodies: Bodies = Arc::new(|i| json!({"n": i, "stream": true}));
        let report = run(
            &reqwest::Client::new(),
            &target,
            load(Arrival::Closed { clients: 3 }, 10),
            &bodies,
        )
        .await;
        assert_eq!(report.sent, 10);
        assert_eq!(report.ok, 5);
        assert_eq!(report.errors.get("http_503"), Some(&5));
        // Three text chunks per stream and no usage chunk: three tokens each.
        assert_eq!(report.generated_tokens, 15);
        assert!(report.stream);
    }

    #[tokio::test]
    async fn open_loop_stops_at_its_count_and_reads_usage() {
        let target = Target::new("t", server().await);
        let bodies: Bodies = Arc::new(|i| json!({"n": 2 * i}));
        let report =
            run(&reqwest::Client::new(), &target, load(Arrival::Open { rate: 200.0 }, 8), &bodies)
                .await;
        assert_eq!((report.sent, report.ok), (8, 8));
        assert_eq!(report.generated_tokens, 24);
        assert!(report.errors.is_empty());
        assert!(!report.stream);
    }

    #[tokio::test]
    async fn a_dead_target_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/completions", listener.local_addr().unwrap());
        drop(listener);
        let bodies: Bodies = Arc::new(|_| json!({}));
        let report = run(
            &reqwest::Client::new(),
            &Target::new("dead", url),
            load(Arrival::Closed { clients: 1 }, 2),
            &bodies,
        )
        .await;
        assert_eq!(report.errors.get("connect"), Some(&2));
    }
}

//! Gateway overhead: the same fast fake backend (a fixed chat completion, plain or
//! streamed) reached directly and through `slotgate`, under the same closed-loop
//! load. Reports latency p50/p99, the latency the gateway adds, and throughput as
//! ratios against the direct path.
//!
//! `cargo build --release --bins && cargo run --release -p slotgate-benches --bin gateway-overhead`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use serde::Serialize;
use serde_json::{json, Value};
use slotgate_benches::percentile_ms;
use slotgate_tests::Process;

#[derive(Parser)]
struct Args {
    /// Concurrent clients, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    clients: Vec<usize>,
    /// Requests per run.
    #[arg(long, default_value_t = 4000)]
    requests: usize,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/gateway-overhead.json")]
    out: PathBuf,
}

const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":0,"model":"fake","choices":[{"index":0,"message":{"role":"assistant","content":"This is a fixed answer from the fake backend."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":10,"total_tokens":15}}"#;

async fn fake_backend() -> anyhow::Result<String> {
    let slots: Vec<Value> = (0..4096)
        .map(|i| json!({"id": i, "id_task": -1, "n_ctx": 4096, "is_processing": false}))
        .collect();
    let app = Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(|| async { Json(json!({"object": "list", "data": [{"id": "fake", "object": "model", "created": 0, "owned_by": "bench"}]})) }))
        .route("/slots", get(move || { let slots = slots.clone(); async move { Json(slots) } }))
        .route("/v1/chat/completions", post(|| async { ([("content-type", "application/json")], ANSWER) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

#[derive(Serialize, Clone)]
struct Run {
    path: &'static str,
    clients: usize,
    requests: usize,
    errors: usize,
    seconds: f64,
    requests_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn load(
    path: &'static str,
    url: &str,
    clients: usize,
    requests: usize,
) -> anyhow::Result<Run> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .timeout(Duration::from_secs(30))
        .build()?;
    let body =
        json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10});
    let started = Instant::now();
    let per_client = requests / clients;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, url, body) =
            (client.clone(), format!("{url}/v1/chat/completions"), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_client);
            let mut errors = 0;
            for _ in 0..per_client {
                let t = Instant::now();
                match client.post(&url).json(&body).send().await {
                    Ok(r) if r.status().is_success() => {
                        let _ = r.bytes().await;
                        latencies.push(t.elapsed());
                    }
                    _ => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await?;
        latencies.extend(l);
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Run {
        path,
        clients,
        requests: latencies.len(),
        errors,
        seconds,
        requests_per_second: latencies.len() as f64 / seconds,
        p50_ms: percentile_ms(&latencies, 50.0),
        p99_ms: percentile_ms(&latencies, 99.0),
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let backend = fake_backend().await?;
    let gateway_bin = std::env::current_exe()?.with_file_name("slotgate");
    anyhow::ensure!(
        gateway_bin.is_file(),
        "{} missing: cargo build --release --bins",
        gateway_bin.display()
    );
    let gateway = Process::start_with_env(
        &gateway_bin,
        &["--listen", "127.0.0.1:0", "--backend", &backend],
        &[
            ("SLOTGATE_ROUTING__HEALTH_INTERVAL_MS", "200"),
            ("SLOTGATE_ROUTING__HEALTHY_THRESHOLD", "1"),
            ("RUST_LOG", "warn"),
        ],
    );
    let probe = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while probe
        .get(format!("{}/health", gateway.url))
        .send()
        .await
        .map(|r| r.status().is_success())
        .ok()
        != Some(true)
    {
        anyhow::ensure!(Instant::now() < deadline, "gateway never became healthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Warm both paths.
    load("direct", &backend, 4, 400).await?;
    load("gateway", &gateway.url, 4, 400).await?;

    let mut runs = Vec::new();
    println!("gateway overhead, fake backend, {} requests per run", args.requests);
    println!("clients | path    | req/s   | p50 ms | p99 ms | added p50 ms | added p99 ms | throughput vs direct");
    for &clients in &args.clients {
        let direct = load("direct", &backend, clients, args.requests).await?;
        let via = load("gateway", &gateway.url, clients, args.requests).await?;
        for r in [&direct, &via] {
            let (added50, added99, ratio) = if r.path == "gateway" {
                (
                    format!("{:.3}", r.p50_ms - direct.p50_ms),
                    format!("{:.3}", r.p99_ms - direct.p99_ms),
                    format!("{:.2}x", r.requests_per_second / direct.requests_per_second),
                )
            } else {
                ("-".into(), "-".into(), "1.00x".into())
            };
            println!(
                "{:>7} | {:<7} | {:>7.0} | {:>6.3} | {:>6.3} | {:>12} | {:>12} | {}",
                r.clients,
                r.path,
                r.requests_per_second,
                r.p50_ms,
                r.p99_ms,
                added50,
                added99,
                ratio
            );
        }
        runs.push(direct);
        runs.push(via);
    }
    drop(gateway);
    slotgate_benches::write_results(&args.out, &json!({ "runs": runs }))
}

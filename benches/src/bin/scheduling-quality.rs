//! Scheduling quality: fake backends of different speeds and slot counts (each
//! request holds a slot for `tokens / rate` seconds and `/slots` reports it), driven
//! below and above capacity through `slotgate` with each routing policy. Reports
//! p50/p99 latency, the 503 rate, and how evenly slots were used.
//!
//! `cargo build --release --bins && cargo run --release -p slotgate-benches --bin scheduling-quality`

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use serde::Serialize;
use serde_json::{json, Value};
use slotgate_benches::percentile_ms;
use slotgate_tests::Process;

#[derive(Parser)]
struct Args {
    /// Seconds of open-loop load per run.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Tokens each request "generates".
    #[arg(long, default_value_t = 20)]
    tokens: u32,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/scheduling-quality.json")]
    out: PathBuf,
}

/// A backend that generates at `rate` tokens/s per slot with `slots` slots; refuses
/// with 503 `slot_unavailable` when all are busy, as an engine with no queue does.
struct Sim {
    slots: u32,
    rate: f64,
    busy: AtomicU32,
    served: AtomicU64,
    refused: AtomicU64,
}

async fn sim_chat(
    State(sim): State<Arc<Sim>>,
    Json(body): Json<Value>,
) -> axum::response::Response {
    let claimed = sim
        .busy
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| (b < sim.slots).then_some(b + 1));
    if claimed.is_err() {
        sim.refused.fetch_add(1, Ordering::Relaxed);
        let err = json!({"error": {"message": "all slots busy", "type": "unavailable_error", "param": null, "code": "slot_unavailable"}});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(err)).into_response();
    }
    let tokens = body["max_tokens"].as_u64().unwrap_or(20) as f64;
    tokio::time::sleep(Duration::from_secs_f64(tokens / sim.rate)).await;
    sim.busy.fetch_sub(1, Ordering::AcqRel);
    sim.served.fetch_add(1, Ordering::Relaxed);
    Json(json!({"id": "x", "object": "chat.completion", "created": 0, "model": "sim",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "logprobs": null, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": tokens as u32, "total_tokens": tokens as u32 + 1}}))
    .into_response()
}

async fn start_sim(slots: u32, rate: f64) -> anyhow::Result<(String, Arc<Sim>)> {
    let sim = Arc::new(Sim {
        slots,
        rate,
        busy: AtomicU32::new(0),
        served: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(|| async { Json(json!({"object": "list", "data": [{"id": "sim", "object": "model", "created": 0, "owned_by": "bench"}]})) }))
        .route(
            "/slots",
            get(|State(sim): State<Arc<Sim>>| async move {
                let busy = sim.busy.load(Ordering::Acquire);
                Json((0..sim.slots).map(|i| json!({"id": i, "id_task": -1, "n_ctx": 4096, "is_processing": i < busy})).collect::<Vec<_>>())
            }),
        )
        .route("/v1/chat/completions", post(sim_chat))
        .with_state(sim.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, sim))
}

#[derive(Serialize)]
struct Run {
    policy: &'static str,
    load: &'static str,
    offered_rps: f64,
    sent: usize,
    ok: usize,
    status_503: usize,
    p50_ms: f64,
    p99_ms: f64,
    share_of_requests: Vec<f64>,
    share_of_capacity: Vec<f64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let gateway_bin = std::env::current_exe()?.with_file_name("slotgate");
    anyhow::ensure!(
        gateway_bin.is_file(),
        "{} missing: cargo build --release --bins",
        gateway_bin.display()
    );
    // Three backends: fast with few slots, slow with many, medium.
    let shapes = [(2u32, 200.0f64), (6, 50.0), (4, 100.0)];
    let capacity_rps: f64 =
        shapes.iter().map(|(s, r)| f64::from(*s) * r / f64::from(args.tokens)).sum();
    let capacity_share: Vec<f64> = shapes
        .iter()
        .map(|(s, r)| f64::from(*s) * r / f64::from(args.tokens) / capacity_rps)
        .collect();
    let mut runs = Vec::new();
    println!("scheduling quality: 3 simulated backends (slots x tok/s: 2x200, 6x50, 4x100), capacity {capacity_rps:.0} req/s, {} tokens each", args.tokens);
    println!("policy         | load  | req/s offered | ok    | 503  | p50 ms | p99 ms | share of requests (capacity share {:.2}/{:.2}/{:.2})", capacity_share[0], capacity_share[1], capacity_share[2]);
    for (policy, label) in
        [("slots", "slots"), ("round_robin", "round_robin"), ("least_requests", "least_requests")]
    {
        for (load, factor) in [("below", 0.6), ("above", 1.3)] {
            let mut sims = Vec::new();
            let mut urls = Vec::new();
            for (slots, rate) in shapes {
                let (url, sim) = start_sim(slots, rate).await?;
                urls.push(url);
                sims.push(sim);
            }
            let mut cli = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
            for u in &urls {
                cli.push("--backend".into());
                cli.push(u.clone());
            }
            let cli_refs: Vec<&str> = cli.iter().map(String::as_str).collect();
            let gateway = Process::start_with_env(
                &gateway_bin,
                &cli_refs,
                &[
                    ("SLOTGATE_ROUTING__POLICY", policy),
                    ("SLOTGATE_ROUTING__HEALTH_INTERVAL_MS", "100"),
                    ("SLOTGATE_ROUTING__HEALTHY_THRESHOLD", "1"),
                    ("SLOTGATE_ROUTING__QUEUE_TIMEOUT_MS", "2000"),
                    ("RUST_LOG", "error"),
                ],
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
            let rps = capacity_rps * factor;
            let interval = Duration::from_secs_f64(1.0 / rps);
            let url = format!("{}/v1/chat/completions", gateway.url);
            let started = Instant::now();
            let mut tasks = Vec::new();
            let mut next = Instant::now();
            // Open loop: a fixed arrival rate, whatever the answers do.
            while started.elapsed() < Duration::from_secs(args.seconds) {
                let (client, url) = (client.clone(), url.clone());
                let body = json!({"model": "sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": args.tokens});
                tasks.push(tokio::spawn(async move {
                    let t = Instant::now();
                    let status = client
                        .post(&url)
                        .json(&body)
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                        .unwrap_or(0);
                    (status, t.elapsed())
                }));
                next += interval;
                tokio::time::sleep_until(next.into()).await;
            }
            let mut latencies = Vec::new();
            let (mut ok, mut unavailable) = (0, 0);
            for t in tasks.iter_mut() {
                let (status, latency) = t.await?;
                match status {
                    200 => {
                        ok += 1;
                        latencies.push(latency);
                    }
                    503 => unavailable += 1,
                    _ => {}
                }
            }
            let served: Vec<f64> =
                sims.iter().map(|s| s.served.load(Ordering::Relaxed) as f64).collect();
            let total: f64 = served.iter().sum::<f64>().max(1.0);
            let share: Vec<f64> = served.iter().map(|s| s / total).collect();
            let run = Run {
                policy: label,
                load,
                offered_rps: rps,
                sent: tasks.len(),
                ok,
                status_503: unavailable,
                p50_ms: percentile_ms(&latencies, 50.0),
                p99_ms: percentile_ms(&latencies, 99.0),
                share_of_requests: share.clone(),
                share_of_capacity: capacity_share.clone(),
            };
            println!(
                "{:<14} | {:<5} | {:>13.0} | {:>5} | {:>4} | {:>6.0} | {:>6.0} | {:.2}/{:.2}/{:.2}",
                run.policy,
                run.load,
                run.offered_rps,
                run.ok,
                run.status_503,
                run.p50_ms,
                run.p99_ms,
                share[0],
                share[1],
                share[2]
            );
            runs.push(run);
            drop(gateway);
        }
    }
    slotgate_benches::write_results(&args.out, &json!({ "runs": runs }))
}

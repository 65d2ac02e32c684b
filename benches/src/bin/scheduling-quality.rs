//! Scheduling quality: three simulated backends of different speeds and slot
//! counts (a request holds a slot for `tokens / rate` seconds; `/slots` reports the
//! busy ones; a full backend refuses with 503 `slot_unavailable`), driven through
//! `slotgate` by open-loop load below and above their capacity, once per routing
//! policy. Reports p50/p99 latency, time spent in the gateway's queue, the 503
//! rate, and how evenly each backend's slots were used.
//!
//! `scripts/bench scheduling` builds and runs this.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use serde::Serialize;
use serde_json::{json, Value};
use slotgate_benches::{
    fixed, metric_sum, run, Arrival, Bodies, Chart, Load, Output, Report, Table, Target,
};
use slotgate_tests::Process;

#[derive(Parser)]
struct Args {
    /// Seconds of load per run.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Tokens each request "generates".
    #[arg(long, default_value_t = 20)]
    tokens: u32,
    /// Offered load as fractions of the backends' total capacity, one run each.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.8,1.0,1.3")]
    loads: Vec<f64>,
    /// Folder for the results.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// A backend that generates at `rate` tokens/s per slot with `slots` slots.
struct Sim {
    slots: u32,
    rate: f64,
    busy: AtomicU32,
    served: AtomicU64,
    refused: AtomicU64,
    /// Slot-microseconds spent generating.
    busy_us: AtomicU64,
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
    let hold = Duration::from_secs_f64(tokens / sim.rate);
    tokio::time::sleep(hold).await;
    sim.busy.fetch_sub(1, Ordering::AcqRel);
    sim.served.fetch_add(1, Ordering::Relaxed);
    sim.busy_us.fetch_add(hold.as_micros() as u64, Ordering::Relaxed);
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
        busy_us: AtomicU64::new(0),
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
    load: f64,
    report: Report,
    /// Requests that waited in the gateway's queue, and their mean wait.
    queued: u64,
    queue_wait_mean_ms: f64,
    /// Refusals the backends sent (the gateway retries them elsewhere).
    backend_refusals: u64,
    /// Per backend: share of requests served, and busy slot-time over slots × run time.
    share: Vec<f64>,
    utilization: Vec<f64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let gateway_bin = slotgate_benches::sibling("slotgate")?;
    // Fast with few slots, slow with many, medium.
    let shapes = [(2u32, 200.0f64), (6, 50.0), (4, 100.0)];
    let per_request = f64::from(args.tokens);
    let capacity: f64 = shapes.iter().map(|(s, r)| f64::from(*s) * r / per_request).sum();
    let capacity_share: Vec<f64> =
        shapes.iter().map(|(s, r)| f64::from(*s) * r / per_request / capacity).collect();
    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    let tokens = args.tokens;
    let bodies: Bodies = Arc::new(
        move |_| json!({"model": "sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": tokens}),
    );

    let mut runs = Vec::new();
    for policy in ["slots", "least_requests", "round_robin"] {
        for &fraction in &args.loads {
            let mut sims = Vec::new();
            let mut cli = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
            for (slots, rate) in shapes {
                let (url, sim) = start_sim(slots, rate).await?;
                cli.extend(["--backend".to_owned(), url]);
                sims.push(sim);
            }
            let cli: Vec<&str> = cli.iter().map(String::as_str).collect();
            let gateway = Process::start_with_env(
                &gateway_bin,
                &cli,
                &[
                    ("SLOTGATE_ROUTING__POLICY", policy),
                    ("SLOTGATE_ROUTING__HEALTH_INTERVAL_MS", "100"),
                    ("SLOTGATE_ROUTING__HEALTHY_THRESHOLD", "1"),
                    // `ready` reads the admin API, closed without a key but for this.
                    ("SLOTGATE_AUTH__ADMIN_LOOPBACK", "true"),
                    ("SLOTGATE_ROUTING__QUEUE_TIMEOUT_MS", "2000"),
                    ("RUST_LOG", "error"),
                ],
            );
            slotgate_tests::ready(&client, &gateway, shapes.len()).await;
            let rate = capacity * fraction;
            let load = Load {
                arrival: Arrival::Open { rate },
                requests: (rate * args.seconds as f64).ceil() as usize,
                duration: Duration::from_secs(args.seconds),
                timeout: Duration::from_secs(30),
            };
            let target = Target::new(policy, format!("{}/v1/chat/completions", gateway.url));
            let report = run(&client, &target, load, &bodies).await;
            let metrics =
                client.get(format!("{}/metrics", gateway.url)).send().await?.text().await?;
            let queued = metric_sum(&metrics, "slotgate_queue_wait_seconds_count");
            let waited = metric_sum(&metrics, "slotgate_queue_wait_seconds_sum");
            let served: Vec<f64> =
                sims.iter().map(|s| s.served.load(Ordering::Relaxed) as f64).collect();
            let total = served.iter().sum::<f64>().max(1.0);
            let run = Run {
                policy,
                load: fraction,
                queued: queued as u64,
                queue_wait_mean_ms: if queued > 0.0 { waited / queued * 1000.0 } else { 0.0 },
                backend_refusals: sims.iter().map(|s| s.refused.load(Ordering::Relaxed)).sum(),
                share: served.iter().map(|s| s / total).collect(),
                utilization: sims
                    .iter()
                    .map(|s| {
                        s.busy_us.load(Ordering::Relaxed) as f64
                            / 1e6
                            / (f64::from(s.slots) * report.seconds)
                    })
                    .collect(),
                report,
            };
            eprintln!(
                "{policy} at {fraction}x: p99 {:.0} ms, {} errors, queued {}",
                run.report.e2e_ms.p99,
                run.report.error_count(),
                run.queued
            );
            runs.push(run);
            drop(gateway);
        }
    }

    let mut out = Output::new(&args.out, "scheduling-quality");
    let shape_text: Vec<String> =
        shapes.iter().map(|(s, r)| format!("{s} slots × {r} tok/s")).collect();
    out.text(&format!(
        "Backends: {}; {} tokens per request, so together they finish {capacity:.0} requests per \
         second (capacity shares {}). Open-loop arrivals for {} s per run; queue timeout 2 s.\n",
        shape_text.join(", "),
        args.tokens,
        capacity_share.iter().map(|s| fixed(*s, 2)).collect::<Vec<_>>().join(" / "),
        args.seconds
    ));
    let mut table = Table::new(&[
        "policy",
        "load",
        "req/s offered",
        "ok",
        "503 rate",
        "p50 ms",
        "p99 ms",
        "queued",
        "mean queue wait ms",
        "backend refusals",
        "share of requests",
        "slot utilization",
    ]);
    for r in &runs {
        let list = |v: &[f64]| v.iter().map(|x| fixed(*x, 2)).collect::<Vec<_>>().join(" / ");
        table.row(vec![
            r.policy.to_owned(),
            format!("{:.0}%", r.load * 100.0),
            fixed(r.report.arrival.x(), 0),
            r.report.ok.to_string(),
            format!(
                "{:.1}%",
                100.0 * r.report.errors.get("http_503").copied().unwrap_or(0) as f64
                    / r.report.sent.max(1) as f64
            ),
            fixed(r.report.e2e_ms.p50, 0),
            fixed(r.report.e2e_ms.p99, 0),
            r.queued.to_string(),
            fixed(r.queue_wait_mean_ms, 1),
            r.backend_refusals.to_string(),
            list(&r.share),
            list(&r.utilization),
        ]);
    }
    out.text(&table.markdown());
    let series = |value: fn(&Run) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        ["slots", "least_requests", "round_robin"]
            .iter()
            .map(|p| {
                let points = runs
                    .iter()
                    .filter(|r| r.policy == *p)
                    .map(|r| (r.load * 100.0, value(r)))
                    .collect();
                ((*p).to_owned(), points)
            })
            .collect()
    };
    out.chart(
        "answered",
        &Chart::new(
            "Requests answered per second by routing policy",
            "offered load, % of capacity",
            "req/s",
            false,
        )
        .lines(series(|r| r.report.requests_per_second)),
    )?;
    out.chart(
        "p99",
        &Chart::new("Latency p99 by routing policy", "offered load, % of capacity", "ms", false)
            .lines(series(|r| r.report.e2e_ms.p99)),
    )?;
    out.chart(
        "unavailable",
        &Chart::new(
            "Requests refused (503) by routing policy",
            "offered load, % of capacity",
            "% of requests",
            false,
        )
        .lines(series(|r| {
            100.0 * r.report.errors.get("http_503").copied().unwrap_or(0) as f64
                / r.report.sent.max(1) as f64
        })),
    )?;
    out.finish(&json!({"runs": runs, "capacity_rps": capacity, "capacity_share": capacity_share}))
}

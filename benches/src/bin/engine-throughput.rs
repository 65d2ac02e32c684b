//! Engine throughput: generated tokens per second and time to first token at 1, 4
//! and 8 concurrent streaming clients on the default model, and the scheduler's own
//! work per step. Starts the release `slotgate-engine` itself.
//!
//! `cargo build --release --bins && cargo run --release -p slotgate-benches --bin engine-throughput`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use serde::Serialize;
use serde_json::json;
use slotgate_benches::{percentile_ms, streamed, write_results, Sample};
use slotgate_tests::{model_path, Process, MODEL};

/// Reference figures from issue 3, measured on this kind of machine (2 cores) with
/// the default model and 2 threads: llama.cpp's llama-server and a bare batched
/// llama-cpp-2 loop, generated tokens per second at 1, 4 and 8 clients.
const LLAMA_SERVER: [(usize, f64); 3] = [(1, 47.0), (4, 65.0), (8, 86.0)];
const BARE_LOOP: [(usize, f64); 3] = [(1, 60.0), (4, 79.0), (8, 124.0)];

#[derive(Parser)]
struct Args {
    /// Concurrent clients, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    clients: Vec<usize>,
    /// Tokens each request generates.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Requests each client sends per run.
    #[arg(long, default_value_t = 4)]
    requests: usize,
    /// Decoding threads of the engine.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/engine-throughput.json")]
    out: PathBuf,
}

#[derive(Serialize)]
struct Run {
    clients: usize,
    requests: usize,
    generated_tokens: u64,
    seconds: f64,
    tokens_per_second: f64,
    ttft_p50_ms: f64,
    ttft_p90_ms: f64,
    ttft_p99_ms: f64,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
    e2e_p50_ms: f64,
    llama_server_reference: Option<f64>,
    bare_loop_reference: Option<f64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let exe = std::env::current_exe()?;
    let engine_bin = exe.with_file_name("slotgate-engine");
    anyhow::ensure!(
        engine_bin.is_file(),
        "{} missing: cargo build --release --bins",
        engine_bin.display()
    );
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    let model = model_path();
    let n_parallel = max_clients.to_string();
    let threads = args.threads.to_string();
    let engine = Process::start(
        &engine_bin,
        &[
            "--model",
            model.to_str().unwrap_or_default(),
            "--port",
            "0",
            "--threads",
            &threads,
            "--n-parallel",
            &n_parallel,
            "--ctx-len",
            "1024",
            "--queue-size",
            "64",
        ],
    );
    let client = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
    let url = format!("{}/v1/completions", engine.url);

    // Warm up once: the first decode allocates buffers.
    let warm = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 8, "stream": true,
                      "stream_options": {"include_usage": true}});
    streamed(&client, &url, &warm).await?;

    let mut runs = Vec::new();
    for &clients in &args.clients {
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (client, url) = (client.clone(), url.clone());
            let (requests, max_tokens) = (args.requests, args.max_tokens);
            tasks.push(tokio::spawn(async move {
                let mut samples = Vec::new();
                for r in 0..requests {
                    // Distinct prompts, so the prompt cache does not flatter the numbers;
                    // min_tokens-like behaviour comes from a prompt that rarely ends.
                    let body = json!({"model": MODEL, "max_tokens": max_tokens, "stream": true,
                        "stream_options": {"include_usage": true}, "cache_prompt": false,
                        "prompt": format!("Client {c} request {r}: here is a long list of fruits: apple, pear,")});
                    samples.push(streamed(&client, &url, &body).await?);
                }
                anyhow::Ok(samples)
            }));
        }
        let mut samples: Vec<Sample> = Vec::new();
        for t in tasks {
            samples.extend(t.await??);
        }
        let seconds = started.elapsed().as_secs_f64();
        let generated: u64 = samples.iter().map(|s| s.tokens).sum();
        let ttft: Vec<Duration> = samples.iter().map(|s| s.ttft).collect();
        let gaps: Vec<Duration> = samples.iter().flat_map(|s| s.gaps.iter().copied()).collect();
        let e2e: Vec<Duration> = samples.iter().map(|s| s.total).collect();
        let reference =
            |table: &[(usize, f64)]| table.iter().find(|(c, _)| *c == clients).map(|(_, v)| *v);
        runs.push(Run {
            clients,
            requests: samples.len(),
            generated_tokens: generated,
            seconds,
            tokens_per_second: generated as f64 / seconds,
            ttft_p50_ms: percentile_ms(&ttft, 50.0),
            ttft_p90_ms: percentile_ms(&ttft, 90.0),
            ttft_p99_ms: percentile_ms(&ttft, 99.0),
            itl_p50_ms: percentile_ms(&gaps, 50.0),
            itl_p99_ms: percentile_ms(&gaps, 99.0),
            e2e_p50_ms: percentile_ms(&e2e, 50.0),
            llama_server_reference: reference(&LLAMA_SERVER),
            bare_loop_reference: reference(&BARE_LOOP),
        });
    }

    let metrics = client.get(format!("{}/metrics", engine.url)).send().await?.text().await?;
    let metric = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()))
    };
    let overhead_us = match (
        metric("slotgate_engine_step_overhead_seconds_sum "),
        metric("slotgate_engine_step_overhead_seconds_count "),
    ) {
        (Some(sum), Some(count)) if count > 0.0 => Some(sum / count * 1e6),
        _ => None,
    };
    drop(engine);

    println!("engine throughput, default model, {} threads, n_parallel {max_clients}, {} tokens per request", args.threads, args.max_tokens);
    println!("clients | tok/s  | vs 1 client | vs llama-server | vs bare loop | TTFT p50/p90/p99 ms | ITL p50/p99 ms");
    let base = runs.first().map_or(1.0, |r| r.tokens_per_second);
    for r in &runs {
        let ratio = |reference: Option<f64>| {
            reference.map_or("-".to_owned(), |v| format!("{:.2}x", r.tokens_per_second / v))
        };
        println!(
            "{:>7} | {:>6.1} | {:>10.2}x | {:>15} | {:>12} | {:>6.0} / {:>5.0} / {:>5.0} | {:>5.1} / {:>5.1}",
            r.clients,
            r.tokens_per_second,
            r.tokens_per_second / base,
            ratio(r.llama_server_reference),
            ratio(r.bare_loop_reference),
            r.ttft_p50_ms,
            r.ttft_p90_ms,
            r.ttft_p99_ms,
            r.itl_p50_ms,
            r.itl_p99_ms,
        );
    }
    match overhead_us {
        Some(us) => println!("scheduler work per step outside llama.cpp (mean): {us:.1} µs"),
        None => println!("scheduler work per step: not reported"),
    }
    write_results(&args.out, &json!({"runs": runs, "step_overhead_us": overhead_us}))
}

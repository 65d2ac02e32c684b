//! Cross-checks the load generator against an independent one, NVIDIA's aiperf:
//! the same engine, the same prompts and request bodies, the same concurrency and
//! count, measured by ours, then aiperf, then ours again (so that the two runs of
//! ours show the run-to-run noise the comparison sits in).
//!
//! Both tools are heavy enough clients (aiperf is a set of Python processes) to
//! take CPU from an engine that wants every core, so the engine runs on one core
//! with one thread and the clients on another: what a client costs then does not
//! show up as engine slowness in its own figures.
//!
//! `scripts/bench crosscheck` installs aiperf and a local tokenizer and runs this.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::{json, Value};
use slotgate_benches::{fixed, ratio, run, Arrival, Bodies, Load, Output, Report, Table, Target};
use slotgate_tests::{model_path, Process, MODEL};

#[derive(Parser)]
struct Args {
    /// aiperf's command, from its own virtual environment.
    #[arg(long)]
    aiperf: PathBuf,
    /// A local tokenizer folder for aiperf (token counts come from the server's usage).
    #[arg(long)]
    tokenizer: PathBuf,
    /// Concurrent clients (and engine slots).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Requests per run.
    #[arg(long, default_value_t = 32)]
    requests: usize,
    /// Tokens each request generates.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// The core the engine runs on (one thread).
    #[arg(long, default_value_t = 0)]
    engine_cpu: usize,
    /// The core both load generators run on.
    #[arg(long, default_value_t = 1)]
    client_cpu: usize,
    /// Folder for the results.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

fn prompt(i: usize) -> String {
    format!("Request {i}: here is a long list of fruits: apple, pear,")
}

/// A table row: our label, our value, aiperf's metric and statistic.
type Row = (&'static str, fn(&Report) -> f64, &'static str, &'static str);

/// aiperf's summary: `METRIC.STAT` from its `profile_export_aiperf.json`.
struct Aiperf(Value);

impl Aiperf {
    fn get(&self, metric: &str, stat: &str) -> f64 {
        self.0[metric][stat].as_f64().unwrap_or(f64::NAN)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = std::fs::canonicalize(&args.out).unwrap_or(args.out.clone()).join("crosscheck");
    std::fs::create_dir_all(&dir)?;
    let bin = slotgate_benches::sibling("slotgate-engine")?;
    let client_cpu = args.client_cpu.to_string();
    let pinned = Command::new("taskset")
        .args(["-a", "-p", "-c", &client_cpu, &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(pinned.success(), "taskset could not pin the load generator");
    let model = model_path();
    let engine = Process::start(
        std::path::Path::new("taskset"),
        &[
            "-c",
            &args.engine_cpu.to_string(),
            bin.to_str().unwrap_or_default(),
            "--model",
            model.to_str().unwrap_or_default(),
            "--port",
            "0",
            "--threads",
            "1",
            "--n-parallel",
            &args.clients.to_string(),
            "--ctx-len",
            "1024",
        ],
    );
    let client = reqwest::Client::builder().pool_idle_timeout(Duration::from_secs(1)).build()?;
    let target = Target::new("loadgen", format!("{}/v1/completions", engine.url));
    let max_tokens = args.max_tokens;
    let bodies: Bodies = Arc::new(move |i| {
        json!({"model": MODEL, "prompt": prompt(i), "max_tokens": max_tokens, "stream": true,
            "stream_options": {"include_usage": true}, "cache_prompt": false})
    });
    let load = Load {
        arrival: Arrival::Closed { clients: args.clients },
        requests: args.requests,
        duration: Duration::from_secs(600),
        timeout: Duration::from_secs(300),
    };
    // Warm-up, as aiperf's own first requests would otherwise pay for it.
    run(&client, &target, Load { requests: args.clients, ..load }, &bodies).await;

    let first = run(&client, &target, load, &bodies).await;
    let prompts: String =
        (0..args.requests).map(|i| format!("{}\n", json!({"text": prompt(i)}))).collect();
    std::fs::write(dir.join("prompts.jsonl"), prompts)?;
    let artifacts = dir.join("aiperf");
    let status = Command::new("taskset")
        .args(["-c", &client_cpu])
        .arg(&args.aiperf)
        .args(["profile", "--model", MODEL, "--url", &engine.url, "--endpoint-type", "completions"])
        .args(["--streaming", "--concurrency", &args.clients.to_string()])
        .args(["--request-count", &args.requests.to_string()])
        .arg("--tokenizer")
        .arg(&args.tokenizer)
        .args(["--use-server-token-count", "--custom-dataset-type", "single_turn"])
        .arg("--input-file")
        .arg(dir.join("prompts.jsonl"))
        .args(["--extra-inputs", &format!("max_tokens:{max_tokens}")])
        .args(["--extra-inputs", "cache_prompt:false", "--ui-type", "none"])
        .arg("--artifact-dir")
        .arg(&artifacts)
        .stdout(std::fs::File::create(dir.join("aiperf.log"))?)
        .status()?;
    anyhow::ensure!(
        status.success(),
        "aiperf failed ({status}); see {}",
        dir.join("aiperf.log").display()
    );
    let aiperf = Aiperf(serde_json::from_str(&std::fs::read_to_string(
        artifacts.join("profile_export_aiperf.json"),
    )?)?);
    let second = run(&client, &target, load, &bodies).await;
    drop(engine);

    let mut out = Output::new(&args.out, "crosscheck");
    out.text(&format!(
        "slotgate-engine (1 thread on core {}, {} slots; both load generators on core {}), {} streamed completions of {} tokens at {} \
         concurrent clients, the same prompts and bodies for both tools. aiperf {}, token counts \
         from the server's usage (`--use-server-token-count`).\n",
        args.engine_cpu,
        args.clients,
        args.client_cpu,
        args.requests,
        args.max_tokens,
        args.clients,
        aiperf.0["aiperf_version"].as_str().unwrap_or("?")
    ));
    let mut table = Table::new(&[
        "metric",
        "loadgen, run 1",
        "aiperf",
        "loadgen, run 2",
        "aiperf vs loadgen mean",
    ]);
    let rows: [Row; 9] = [
        ("requests/s", |r| r.requests_per_second, "request_throughput", "avg"),
        ("output tokens/s", |r| r.tokens_per_second, "output_token_throughput", "avg"),
        ("TTFT p50 ms", |r| r.ttft_ms.p50, "time_to_first_token", "p50"),
        ("TTFT p90 ms", |r| r.ttft_ms.p90, "time_to_first_token", "p90"),
        ("TTFT p99 ms", |r| r.ttft_ms.p99, "time_to_first_token", "p99"),
        ("gap between chunks p50 ms", |r| r.itl_ms.p50, "inter_chunk_latency", "p50"),
        ("gap between chunks p99 ms", |r| r.itl_ms.p99, "inter_chunk_latency", "p99"),
        ("end-to-end p50 ms", |r| r.e2e_ms.p50, "request_latency", "p50"),
        ("end-to-end p99 ms", |r| r.e2e_ms.p99, "request_latency", "p99"),
    ];
    for (label, ours, metric, stat) in rows {
        let theirs = aiperf.get(metric, stat);
        let mean = (ours(&first) + ours(&second)) / 2.0;
        table.row(vec![
            label.to_owned(),
            fixed(ours(&first), 1),
            fixed(theirs, 1),
            fixed(ours(&second), 1),
            ratio(theirs, mean),
        ]);
    }
    out.text(&table.markdown());
    out.finish(&json!({"loadgen": [first, second], "aiperf": aiperf.0}))
}

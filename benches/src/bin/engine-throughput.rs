//! Engine throughput: `slotgate-engine` against llama.cpp's `llama-server` and
//! llama-cpp-python's server on the default model, one at a time, with the same
//! threads, per-slot context and (where the peer has them) parallel slots.
//! Measures generated tokens per second and time to first token at 1, 2, 4 and 8
//! concurrent streaming clients, and time to first token over the turns of a
//! multi-turn conversation with the prompt cache on and off.
//!
//! `scripts/bench engine` builds llama-server, installs llama-cpp-python and runs this.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;
use serde_json::{json, Value};
use slotgate_benches::conversation::opening;
use slotgate_benches::{
    by_target, fixed, free_port, group, metric_sum, ratio, request, run, runs_table, start_engine,
    start_llama_server, Arrival, Bodies, Chart, Load, Output, Peer, Report, Table, Target,
};
use slotgate_tests::{model_path, Process, MODEL};

#[derive(Parser)]
struct Args {
    /// Concurrent clients, one run each; the most of them is the number of slots.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    clients: Vec<usize>,
    /// Requests per client in each run.
    #[arg(long, default_value_t = 3)]
    requests_per_client: usize,
    /// Tokens each request generates.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Decoding threads, for every engine.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Context of one slot, in tokens, for every engine.
    #[arg(long, default_value_t = 1024)]
    ctx_len: u32,
    /// Turns of the multi-turn conversation.
    #[arg(long, default_value_t = 6)]
    turns: usize,
    /// llama.cpp's `llama-server`; skipped without it.
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// The llama.cpp commit `llama-server` was built from, for the report.
    #[arg(long, default_value = "unknown")]
    llama_commit: String,
    /// The Python of a virtual environment with `llama-cpp-python[server]`; skipped without it.
    #[arg(long)]
    llama_cpp_python: Option<PathBuf>,
    /// Folder with the `libllama.so` llama-cpp-python should load (`LLAMA_CPP_LIB_PATH`).
    #[arg(long)]
    llama_lib: Option<PathBuf>,
    /// Folder for the results.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// One turn of the conversation as one engine answered it.
#[derive(Serialize, Clone)]
struct Turn {
    target: String,
    cache: &'static str,
    turn: usize,
    prompt_chars: usize,
    ttft_ms: f64,
}

/// The running engine under test, whichever it is.
enum Running {
    Ours(Process),
    Peer(Peer),
}

impl Running {
    fn url(&self) -> &str {
        match self {
            Self::Ours(p) => &p.url,
            Self::Peer(p) => &p.url,
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let logs = args.out.join("logs");
    let model = model_path();
    let model_str = model.to_str().unwrap_or_default().to_owned();
    let slots = args.clients.iter().copied().max().unwrap_or(1);
    let (threads, ctx_len) = (args.threads.to_string(), args.ctx_len);
    // A fresh connection per request, for every engine: llama-server closes kept-alive
    // connections on its own terms, and a request sent on one it has just closed
    // fails ("connection closed before message completed"), which would count
    // against it. A connection costs well under a millisecond here; a request, a second.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build()?;

    let mut names = vec!["slotgate-engine"];
    if args.llama_server.is_some() {
        names.push("llama-server");
    }
    if args.llama_cpp_python.is_some() {
        names.push("llama-cpp-python");
    }
    let mut reports: Vec<Report> = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    let mut step_overhead_us = None;
    for name in names {
        let engine = match name {
            "slotgate-engine" => {
                Running::Ours(start_engine(slots, args.threads, ctx_len, &["--queue-size", "64"])?)
            }
            "llama-server" => {
                let binary = args.llama_server.as_deref().unwrap_or(std::path::Path::new(""));
                Running::Peer(
                    start_llama_server(binary, args.threads, slots, ctx_len, &logs).await?,
                )
            }
            _ => {
                let port = free_port()?;
                let mut command = std::process::Command::new(
                    args.llama_cpp_python.as_ref().unwrap_or(&PathBuf::new()),
                );
                // One context: llama-cpp-python's server answers one request at a time.
                // By default a new request interrupts the one being streamed (which
                // then ends early); turned off, so that every answer is whole.
                command.args([
                    "-m",
                    "llama_cpp.server",
                    "--model",
                    &model_str,
                    "--model_alias",
                    MODEL,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--n_threads",
                    &threads,
                    "--n_threads_batch",
                    &threads,
                    "--n_ctx",
                    &ctx_len.to_string(),
                    "--interrupt_requests",
                    "False",
                ]);
                if let Some(lib) = &args.llama_lib {
                    command.env("LLAMA_CPP_LIB_PATH", lib);
                }
                Running::Peer(
                    Peer::start(name, command, port, "/v1/models", &logs, Duration::from_secs(120))
                        .await?,
                )
            }
        };
        let target = Target::new(name, format!("{}/v1/completions", engine.url()));
        eprintln!("{name}: started at {}", engine.url());

        // Warm up: the first decode allocates buffers.
        let warm = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 8});
        request(&client, &target, &warm, Duration::from_secs(120))
            .await
            .map_err(|e| anyhow::anyhow!("{name} warm-up: {e}"))?;

        let max_tokens = args.max_tokens;
        // Distinct prompts, and no prompt cache, so that every request does the
        // same work on every engine; a list rarely ends before max_tokens.
        let bodies: Bodies = Arc::new(move |i| {
            json!({"model": MODEL, "max_tokens": max_tokens, "stream": true,
                "stream_options": {"include_usage": true}, "cache_prompt": false,
                "prompt": format!("Request {i}: here is a long list of fruits: apple, pear,")})
        });
        for &clients in &args.clients {
            let load = Load {
                arrival: Arrival::Closed { clients },
                // At least 8, so that one slow request does not make the figure.
                requests: (clients * args.requests_per_client).max(8),
                duration: Duration::from_secs(300),
                timeout: Duration::from_secs(300),
            };
            let report = run(&client, &target, load, &bodies).await;
            eprintln!(
                "{name} {clients} clients: {:.1} tok/s, TTFT p50 {:.0} ms, errors {}",
                report.tokens_per_second,
                report.ttft_ms.p50,
                report.errors_label()
            );
            reports.push(report);
        }

        // The multi-turn conversation: each turn sends the whole transcript so far.
        let caches: &[(&'static str, Option<bool>)] = if name == "llama-cpp-python" {
            &[("default", None)]
        } else {
            &[("on", Some(true)), ("off", Some(false))]
        };
        for (label, cache) in caches {
            let mut transcript = opening(label);
            for turn in 1..=args.turns {
                transcript
                    .push_str(&format!("User: What is in district {}?\nAssistant:", turn * 3));
                let mut body = json!({"model": MODEL, "prompt": transcript, "max_tokens": 24,
                    "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
                if let Some(cache) = cache {
                    body["cache_prompt"] = Value::Bool(*cache);
                }
                let sample = request(&client, &target, &body, Duration::from_secs(120))
                    .await
                    .map_err(|e| anyhow::anyhow!("{name} turn {turn}: {e}"))?;
                turns.push(Turn {
                    target: name.to_owned(),
                    cache: label,
                    turn,
                    prompt_chars: transcript.len(),
                    ttft_ms: sample.ttft.as_secs_f64() * 1000.0,
                });
                transcript.push_str(&sample.text);
                transcript.push('\n');
            }
        }
        if let Running::Ours(p) = &engine {
            step_overhead_us = step_overhead(&client, &p.url).await;
        }
        drop(engine);
    }

    let mut out = Output::new(&args.out, "engine-throughput");
    out.text(&format!(
        "Model `{MODEL}`, {} threads, {ctx_len} tokens of context per slot, {slots} slots \
         (llama-cpp-python: one context, `--interrupt_requests False`), {} tokens per request, streamed; \
         llama-server built from llama.cpp `{}`.\n",
        args.threads, args.max_tokens, args.llama_commit
    ));
    out.text(&runs_table(&reports).markdown());
    if let Some(us) = step_overhead_us {
        out.text(&format!(
            "slotgate-engine's own work per decode step, outside llama.cpp \
             (`slotgate_engine_step_overhead_seconds`, mean over the runs above): {us:.0} µs.\n"
        ));
    }
    let mut vs = Table::new(&[
        "clients",
        "slotgate-engine tok/s",
        "vs llama-server",
        "vs llama-cpp-python",
        "TTFT p50 vs llama-server",
    ]);
    let find = |name: &str, clients: usize| {
        reports.iter().find(|r| r.target == name && r.arrival.x() == clients as f64)
    };
    for &clients in &args.clients {
        let Some(ours) = find("slotgate-engine", clients) else { continue };
        let peer = |name: &str, value: fn(&Report) -> f64| {
            find(name, clients).map_or("-".to_owned(), |p| ratio(value(ours), value(p)))
        };
        vs.row(vec![
            clients.to_string(),
            fixed(ours.tokens_per_second, 1),
            peer("llama-server", |r| r.tokens_per_second),
            peer("llama-cpp-python", |r| r.tokens_per_second),
            peer("llama-server", |r| r.ttft_ms.p50),
        ]);
    }
    out.text(&vs.markdown());
    out.chart(
        "tokens",
        &Chart::new("Generated tokens per second", "concurrent clients", "tok/s", false)
            .lines(by_target(&reports, |r| r.tokens_per_second)),
    )?;
    out.chart(
        "ttft",
        &Chart::new("Time to first token, p50", "concurrent clients", "ms", true)
            .lines(by_target(&reports, |r| r.ttft_ms.p50)),
    )?;

    let mut cache_table = Table::new(&[
        "engine",
        "prompt cache",
        "TTFT turn 1 ms",
        "TTFT turns 2+ mean ms",
        "TTFT by turn ms",
    ]);
    let conversations =
        group(turns.iter().map(|t| ((t.target.as_str(), t.cache), (t.turn as f64, t.ttft_ms))));
    for ((engine, cache), points) in &conversations {
        let later: Vec<f64> = points.iter().skip(1).map(|p| p.1).collect();
        cache_table.row(vec![
            (*engine).to_owned(),
            (*cache).to_owned(),
            fixed(points.first().map_or(f64::NAN, |p| p.1), 0),
            fixed(later.iter().sum::<f64>() / later.len().max(1) as f64, 0),
            points.iter().map(|p| fixed(p.1, 0)).collect::<Vec<_>>().join(", "),
        ]);
    }
    out.text(&cache_table.markdown());
    out.chart(
        "turns",
        &Chart::new("Multi-turn chat: time to first token by turn", "turn", "ms", true).lines(
            conversations
                .into_iter()
                .map(|((engine, cache), points)| (format!("{engine}, cache {cache}"), points))
                .collect(),
        ),
    )?;
    out.finish(&json!({"runs": reports, "turns": turns, "llama_commit": args.llama_commit,
        "step_overhead_us": step_overhead_us}))
}

/// The mean of the engine's step-overhead histogram, in microseconds.
async fn step_overhead(client: &reqwest::Client, engine: &str) -> Option<f64> {
    let metrics = client.get(format!("{engine}/metrics")).send().await.ok()?.text().await.ok()?;
    let sum = metric_sum(&metrics, "slotgate_engine_step_overhead_seconds_sum");
    let count = metric_sum(&metrics, "slotgate_engine_step_overhead_seconds_count");
    (count > 0.0).then(|| sum / count * 1e6)
}

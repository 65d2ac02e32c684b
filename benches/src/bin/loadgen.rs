//! The load generator on its own, against any OpenAI-compatible endpoint: a sweep
//! of closed-loop client counts or open-loop arrival rates, streamed or not. Writes
//! `OUT/NAME.json`, `OUT/NAME.md` and charts of the sweep.
//!
//! ```sh
//! target/release/loadgen --url http://127.0.0.1:8080/v1/completions \
//!     --model gemma-3-270m-q4_k_m --clients 1,2,4,8 --stream --requests 32
//! target/release/loadgen --url http://127.0.0.1:8080/v1/chat/completions \
//!     --model gemma-3-270m-q4_k_m --rate 0.5,1,2 --duration-s 30
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::{json, Value};
use slotgate_benches::{by_target, run, runs_table, Arrival, Bodies, Chart, Load, Output, Target};

#[derive(Parser)]
struct Args {
    /// The endpoint: `.../v1/completions` or `.../v1/chat/completions` (127.0.0.1 only).
    #[arg(long)]
    url: String,
    /// The `model` field of each request.
    #[arg(long)]
    model: String,
    /// Closed loop: concurrent clients, one run each.
    #[arg(long, value_delimiter = ',', conflicts_with = "rate")]
    clients: Vec<usize>,
    /// Open loop: arrivals per second, one run each.
    #[arg(long, value_delimiter = ',')]
    rate: Vec<f64>,
    /// Stream the answers (time to first token and inter-token latency need it).
    #[arg(long)]
    stream: bool,
    /// At most this many requests per run.
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// No request starts after this many seconds of a run.
    #[arg(long, default_value_t = 60)]
    duration_s: u64,
    /// Per-request limit in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// `max_tokens` of each request.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// The prompt; each request prefixes it with its number so that prompts differ.
    #[arg(long, default_value = "Here is a long list of fruits: apple, pear,")]
    prompt: String,
    /// Sent as a bearer token.
    #[arg(long, env = "LOADGEN_API_KEY")]
    api_key: Option<String>,
    /// Name of the target in tables and charts, and of the output files.
    #[arg(long, default_value = "loadgen")]
    name: String,
    /// Folder for the results.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.url.starts_with("http://127.0.0.1:"),
        "the load generator only drives 127.0.0.1"
    );
    let arrivals: Vec<Arrival> = if args.rate.is_empty() {
        let clients = if args.clients.is_empty() { vec![1] } else { args.clients.clone() };
        clients.into_iter().map(|clients| Arrival::Closed { clients }).collect()
    } else {
        args.rate.iter().map(|&rate| Arrival::Open { rate }).collect()
    };
    let chat = args.url.ends_with("/chat/completions");
    let (model, prompt, stream, max_tokens) =
        (args.model.clone(), args.prompt.clone(), args.stream, args.max_tokens);
    let bodies: Bodies = Arc::new(move |i| {
        let text = format!("Request {i}. {prompt}");
        let mut body = json!({"model": model, "max_tokens": max_tokens, "stream": stream});
        if chat {
            body["messages"] = json!([{"role": "user", "content": text}]);
        } else {
            body["prompt"] = Value::String(text);
        }
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    });
    let target = Target { name: args.name.clone(), url: args.url.clone(), bearer: args.api_key };
    let client = reqwest::Client::new();
    let mut reports = Vec::new();
    for arrival in arrivals {
        let load = Load {
            arrival,
            requests: args.requests,
            duration: Duration::from_secs(args.duration_s),
            timeout: Duration::from_secs(args.timeout_s),
        };
        reports.push(run(&client, &target, load, &bodies).await);
    }
    let mut out = Output::new(&args.out, &args.name);
    out.text(&runs_table(&reports).markdown());
    let x = if args.rate.is_empty() { "concurrent clients" } else { "arrivals per second" };
    out.chart(
        "tokens",
        &Chart::new("Generated tokens per second", x, "tok/s", false)
            .lines(by_target(&reports, |r| r.tokens_per_second)),
    )?;
    out.chart(
        "ttft",
        &Chart::new("Time to first token, p50", x, "ms", false)
            .lines(by_target(&reports, |r| r.ttft_ms.p50)),
    )?;
    out.finish(&json!({ "runs": reports }))
}

//! Many conversations on few slots: does each later turn find its prompt cached?
//!
//! 1. One engine: N conversations taking turns (in a new order each round), on N slots and on N/2 slots, each
//!    turn resending the whole transcript; slotgate-engine against llama-server
//!    with the same slots, threads and context, and its prompt-cache defaults.
//! 2. Two slotgate engines behind the gateway, at light load (one conversation at
//!    a time) and full load (as many at once as there are slots): the
//!    `cache_aware`, `slots` and `round_robin` policies against the ideal of
//!    sending each conversation straight to a fixed engine.
//!
//! Reported per run: the share of later turns served from cache (see
//! `conversation::is_warm`), their time to first token, and, through the
//! gateway, how evenly the engines were loaded.
//!
//! `scripts/bench conversations` builds llama-server and runs this.

mod replay;
mod report;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde_json::json;
use slotgate_benches::{metric_sum, request, sibling, start_engine, start_llama_server, Target};
use slotgate_tests::{ready, Process, MODEL};

use replay::{replay, transcripts, Tag, Turn};
use report::{report, summary};

#[derive(Parser)]
struct Args {
    /// Conversations; also the slots of the larger engine run (at least 4).
    #[arg(long, default_value_t = 4)]
    conversations: usize,
    /// Turns of each conversation.
    #[arg(long, default_value_t = 6)]
    turns: usize,
    /// Tokens of each answer.
    #[arg(long, default_value_t = 24)]
    max_tokens: u32,
    /// Decoding threads of the single engine (the two behind the gateway get
    /// half each).
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Context of one slot, in tokens.
    #[arg(long, default_value_t = 1024)]
    ctx_len: u32,
    /// Skip part 1 (one engine), to rerun the gateway part alone.
    #[arg(long)]
    gateway_only: bool,
    /// llama.cpp's `llama-server`; its part is skipped without it.
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// The llama.cpp commit `llama-server` was built from, for the report.
    #[arg(long, default_value = "unknown")]
    llama_commit: String,
    /// Folder for the results.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// Requests each engine answered, from its `/metrics`.
async fn served(client: &reqwest::Client, engines: &[Process]) -> Vec<f64> {
    let mut out = Vec::new();
    for e in engines {
        let text = slotgate_tests::metrics(client, &e.url).await;
        out.push(metric_sum(&text, "slotgate_engine_requests_total"));
    }
    out
}

async fn warm_up(client: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let target = Target::new("warm-up", format!("{url}/v1/completions"));
    let body = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 4});
    request(client, &target, &body, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("warm-up of {url}: {e}"))?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.conversations >= 4, "--conversations must be at least 4");
    let n = args.conversations;
    let logs = args.out.join("logs");
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build()?;
    let mut turns: Vec<Turn> = Vec::new();

    // 1. One engine, N conversations on N and on N/2 slots.
    let mut engines = vec!["slotgate-engine"];
    if args.llama_server.is_some() {
        engines.push("llama-server");
    }
    for name in engines.iter().filter(|_| !args.gateway_only) {
        for slots in [n, n / 2] {
            let setting = format!("{slots} slots");
            let (url, _ours, _peer) = if *name == "slotgate-engine" {
                let p = start_engine(slots, args.threads, args.ctx_len, &[])?;
                (p.url.clone(), Some(p), None)
            } else {
                // The prompt cache keeps its defaults (--cache-ram 8192, similarity 0.1).
                let binary = args.llama_server.as_deref().unwrap_or(std::path::Path::new(""));
                let peer =
                    start_llama_server(binary, args.threads, slots, args.ctx_len, &logs).await?;
                (peer.url.clone(), None, Some(peer))
            };
            warm_up(&client, &url).await?;
            let target = Target::new(name, format!("{url}/v1/completions"));
            let run = replay(
                &client,
                &vec![target; n],
                transcripts(&format!("{name}-{slots}"), n),
                false,
                &args,
                Tag { part: "engine", target: (*name).to_owned(), setting: setting.clone() },
            )
            .await?;
            eprintln!("{name}, {setting}: {}", summary(&run));
            turns.extend(run);
        }
    }

    // 2. Two engines of N/2 slots each behind the gateway.
    let routes = ["fixed engine", "cache_aware", "slots", "round_robin"];
    let mut loads: Vec<(String, String, Vec<f64>)> = Vec::new();
    for load in ["light", "full"] {
        for route in routes {
            let half = (args.threads / 2).max(1);
            let fleet = [
                start_engine(n / 2, half, args.ctx_len, &[])?,
                start_engine(n / 2, half, args.ctx_len, &[])?,
            ];
            for e in &fleet {
                warm_up(&client, &e.url).await?;
            }
            let gateway = if route == "fixed engine" {
                None
            } else {
                let mut gw_args = vec!["--listen", "127.0.0.1:0"];
                for e in &fleet {
                    gw_args.extend_from_slice(&["--backend", &e.url]);
                }
                let gw = Process::start_with_env(
                    &sibling("slotgate")?,
                    &gw_args,
                    &[
                        ("SLOTGATE_ROUTING__POLICY", route),
                        ("SLOTGATE_ROUTING__HEALTH_INTERVAL_MS", "200"),
                        ("SLOTGATE_ROUTING__HEALTHY_THRESHOLD", "1"),
                        // `ready` reads the admin API, closed without a key but for this.
                        ("SLOTGATE_AUTH__ADMIN_LOOPBACK", "true"),
                    ],
                );
                ready(&client, &gw, 2).await;
                Some(gw)
            };
            let targets: Vec<Target> = (0..n)
                .map(|c| {
                    let base = gateway.as_ref().map_or(&fleet[c % 2].url, |g| &g.url);
                    Target::new(route, format!("{base}/v1/completions"))
                })
                .collect();
            let before = served(&client, &fleet).await;
            let run = replay(
                &client,
                &targets,
                transcripts(&format!("{route}-{load}"), n),
                load == "full",
                &args,
                Tag { part: "gateway", target: route.to_owned(), setting: load.to_owned() },
            )
            .await?;
            let after = served(&client, &fleet).await;
            let per_engine: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            eprintln!("{route}, {load}: {}, engines {per_engine:?}", summary(&run));
            loads.push((route.to_owned(), load.to_owned(), per_engine));
            turns.extend(run);
        }
    }
    report(&args, &turns, &loads)
}

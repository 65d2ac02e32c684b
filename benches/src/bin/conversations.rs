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

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;
use serde_json::json;
use slotgate_benches::conversation::{is_warm, Transcript};
use slotgate_benches::{
    fixed, group, metric_sum, percentile_ms, ratio, request, sibling, start_engine,
    start_llama_server, Chart, Output, Table, Target,
};
use slotgate_tests::{ready, Process, MODEL};

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

/// One turn of one conversation, as answered.
#[derive(Serialize, Clone)]
struct Turn {
    /// `engine` or `gateway`.
    part: &'static str,
    /// The engine, or the route through the gateway.
    target: String,
    /// `4 slots`, or `light` / `full`.
    setting: String,
    conversation: usize,
    turn: usize,
    ttft_ms: f64,
    prompt_tokens: u64,
    cached_tokens: u64,
    /// Later turns only: whether the whole previous prompt was reused.
    warm: Option<bool>,
}

/// Names one run: its part, target and setting.
#[derive(Clone)]
struct Tag {
    part: &'static str,
    target: String,
    setting: String,
}

/// Sends the next turn of `tr` to `t`; returns the transcript with the answer.
async fn one_turn(
    client: reqwest::Client,
    t: Target,
    mut tr: Transcript,
    c: usize,
    max_tokens: u32,
    tag: Tag,
) -> anyhow::Result<(Transcript, Turn)> {
    let body = json!({"model": MODEL, "prompt": tr.ask(), "max_tokens": max_tokens,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let turn = tr.turns();
    let sample = request(&client, &t, &body, Duration::from_secs(120)).await.map_err(|e| {
        anyhow::anyhow!("{} {} conversation {c} turn {turn}: {e}", tag.target, tag.setting)
    })?;
    let warm = (turn > 1).then(|| is_warm(sample.cached_tokens, tr.last_prompt_tokens));
    tr.answer(&sample.text, sample.prompt_tokens);
    let result = Turn {
        part: tag.part,
        target: tag.target,
        setting: tag.setting,
        conversation: c,
        turn,
        ttft_ms: sample.ttft.as_secs_f64() * 1000.0,
        prompt_tokens: sample.prompt_tokens,
        cached_tokens: sample.cached_tokens,
        warm,
    };
    Ok((tr, result))
}

/// Replays the turns of `transcripts[i]` against `targets[i]`: one conversation
/// at a time, or all at once (`concurrent`), each conversation's turns in order.
async fn replay(
    client: &reqwest::Client,
    targets: &[Target],
    mut transcripts: Vec<Transcript>,
    concurrent: bool,
    args: &Args,
    tag: Tag,
) -> anyhow::Result<Vec<Turn>> {
    let (n, max_tokens) = (args.turns, args.max_tokens);
    let mut turns = Vec::new();
    if concurrent {
        let tasks: Vec<_> = transcripts
            .into_iter()
            .enumerate()
            .map(|(c, mut tr)| {
                let (client, t, tag) = (client.clone(), targets[c].clone(), tag.clone());
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    for _ in 0..n {
                        let (next, turn) =
                            one_turn(client.clone(), t.clone(), tr, c, max_tokens, tag.clone())
                                .await?;
                        tr = next;
                        out.push(turn);
                    }
                    Ok::<_, anyhow::Error>(out)
                })
            })
            .collect();
        for task in tasks {
            turns.extend(task.await??);
        }
    } else {
        // Users do not take turns in a fixed order: each round goes through the
        // conversations in a new order (seeded, so every target gets the same
        // one). A fixed order would also let round robin keep each conversation
        // on one backend whenever the backends divide the conversations.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..n {
            let mut order: Vec<usize> = (0..transcripts.len()).collect();
            for i in (1..order.len()).rev() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                order.swap(i, (seed % (i as u64 + 1)) as usize);
            }
            for c in order {
                let (next, turn) = one_turn(
                    client.clone(),
                    targets[c].clone(),
                    transcripts[c].clone(),
                    c,
                    max_tokens,
                    tag.clone(),
                )
                .await?;
                transcripts[c] = next;
                turns.push(turn);
            }
        }
    }
    Ok(turns)
}

fn transcripts(run: &str, n: usize) -> Vec<Transcript> {
    (0..n).map(|c| Transcript::new(&format!("{run}-{c}"))).collect()
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

/// Later turns of a run: (warm share, TTFT p50, TTFT p99) in percent and ms.
fn later(turns: &[&Turn]) -> (f64, f64, f64) {
    let later: Vec<&&Turn> = turns.iter().filter(|t| t.warm.is_some()).collect();
    let warm = later.iter().filter(|t| t.warm == Some(true)).count();
    let ttft: Vec<Duration> =
        later.iter().map(|t| Duration::from_secs_f64(t.ttft_ms / 1000.0)).collect();
    (
        100.0 * warm as f64 / later.len().max(1) as f64,
        percentile_ms(&ttft, 50.0),
        percentile_ms(&ttft, 99.0),
    )
}

/// A table row's first cells: the run, its later turns, and its TTFT p50 against
/// the `baseline` run's.
fn cells(
    target: &str,
    setting: &str,
    (warm, p50, p99): (f64, f64, f64),
    base: (f64, f64, f64),
    baseline: &str,
) -> Vec<String> {
    vec![
        target.to_owned(),
        setting.to_owned(),
        format!("{warm:.0}%"),
        fixed(p50, 0),
        fixed(p99, 0),
        if target == baseline { "-".into() } else { ratio(p50, base.1) },
    ]
}

fn summary(run: &[Turn]) -> String {
    let (warm, p50, p99) = later(&run.iter().collect::<Vec<_>>());
    format!("{warm:.0}% of later turns warm, TTFT p50 {p50:.0} ms, p99 {p99:.0} ms")
}

fn report(args: &Args, turns: &[Turn], loads: &[(String, String, Vec<f64>)]) -> anyhow::Result<()> {
    let n = args.conversations;
    let mut out = Output::new(&args.out, "conversations");
    out.text(&format!(
        "Model `{MODEL}`, {n} conversations of {} turns, each turn resending the whole transcript \
         (about 720 tokens of opening, then a question and an answer of {} tokens per turn) as \
         a streamed text completion; {} tokens of context per slot. A later turn is warm when \
         the engine reused its whole previous prompt, less {} tokens (a re-tokenized boundary; \
         llama-server's host cache gives back a few tokens less than it saved); a turn that \
         found only an older turn misses over 30. llama-server built from llama.cpp `{}`, with \
         its prompt-cache defaults.\n",
        args.turns,
        args.max_tokens,
        args.ctx_len,
        slotgate_benches::conversation::WARM_SLACK,
        args.llama_commit
    ));
    let runs =
        group(turns.iter().map(|t| ((t.part, t.target.as_str(), t.setting.as_str()), (0.0, 0.0))));
    let of = |part: &str, target: &str, setting: &str| -> Vec<&Turn> {
        turns
            .iter()
            .filter(|t| t.part == part && t.target == target && t.setting == setting)
            .collect()
    };

    out.text(&format!("**One engine, {} threads.**\n", args.threads));
    let mut table = Table::new(&[
        "engine",
        "slots",
        "later turns warm",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "p50 vs llama-server",
    ]);
    for ((part, target, setting), _) in runs.iter().filter(|(k, _)| k.0 == "engine") {
        let peer = later(&of(part, "llama-server", setting));
        table.row(cells(target, setting, later(&of(part, target, setting)), peer, "llama-server"));
    }
    out.text(&table.markdown());

    out.text(&format!(
        "**Two slotgate engines of {} slots behind the gateway**, {} thread(s) each; light: one \
         conversation at a time; full: all {n} at once. Load: requests per engine, max over mean.\n",
        n / 2,
        (args.threads / 2).max(1)
    ));
    let mut table = Table::new(&[
        "route",
        "load",
        "later turns warm",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "p50 vs fixed",
        "requests per engine",
        "max / mean",
    ]);
    for ((part, target, setting), _) in runs.iter().filter(|(k, _)| k.0 == "gateway") {
        let ideal = later(&of(part, "fixed engine", setting));
        let per = loads
            .iter()
            .find(|(r, l, _)| r == target && l == setting)
            .map(|(_, _, v)| v.clone())
            .unwrap_or_default();
        let mean = per.iter().sum::<f64>() / per.len().max(1) as f64;
        let max = per.iter().copied().fold(0.0, f64::max);
        let mut row =
            cells(target, setting, later(&of(part, target, setting)), ideal, "fixed engine");
        row.push(per.iter().map(|v| fixed(*v, 0)).collect::<Vec<_>>().join(" / "));
        row.push(ratio(max, mean));
        table.row(row);
    }
    out.text(&table.markdown());

    let by_turn = |part: &'static str| {
        let mut series = Vec::new();
        for ((p, target, setting), _) in runs.iter().filter(|(k, _)| k.0 == part) {
            let all = of(p, target, setting);
            let points = (1..=args.turns)
                .map(|turn| {
                    let ttft: Vec<Duration> = all
                        .iter()
                        .filter(|t| t.turn == turn)
                        .map(|t| Duration::from_secs_f64(t.ttft_ms / 1000.0))
                        .collect();
                    (turn as f64, percentile_ms(&ttft, 50.0))
                })
                .collect();
            series.push((format!("{target}, {setting}"), points));
        }
        series
    };
    out.chart(
        "engine",
        &Chart::new("One engine: TTFT p50 by turn", "turn", "ms", true).lines(by_turn("engine")),
    )?;
    out.chart(
        "gateway",
        &Chart::new("Through the gateway: TTFT p50 by turn", "turn", "ms", true)
            .lines(by_turn("gateway")),
    )?;
    out.finish(&json!({"turns": turns, "loads": loads, "llama_commit": args.llama_commit}))
}

//! Gateway overhead: one fast fake backend (a fixed chat completion, plain or
//! streamed in eight chunks) reached directly, through `slotgate`, through nginx as
//! a plain reverse proxy, and through LiteLLM's proxy, under the same closed-loop
//! load. Reports the latency each path adds at p50 and p99, and the throughput
//! each sustains, as ratios against the direct path.
//!
//! `scripts/bench gateway` installs nginx and LiteLLM and runs this.

mod fake;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use fake::{fake_backend, plain_answer, streamed_answer};
use serde_json::json;
use slotgate_benches::wrk::{run_wrk, WrkRun};
use slotgate_benches::{
    by_target, fixed, free_port, nginx, ratio, run, Arrival, Bodies, Chart, Load, Output, Peer,
    Report, Table, Target,
};
use slotgate_tests::Process;

#[derive(Parser)]
struct Args {
    /// Concurrent clients of the plain (not streamed) runs.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    clients: Vec<usize>,
    /// Concurrent clients of the streamed runs.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    stream_clients: Vec<usize>,
    /// At most this many requests per run.
    #[arg(long, default_value_t = 3000)]
    requests: usize,
    /// No request starts after this many seconds of a run.
    #[arg(long, default_value_t = 15)]
    duration_s: u64,
    /// nginx's binary; its path is skipped without it.
    #[arg(long)]
    nginx: Option<PathBuf>,
    /// LiteLLM's `litellm` command, from its own virtual environment; skipped without it.
    #[arg(long)]
    litellm: Option<PathBuf>,
    /// wrk's binary: with it and nginx, the paths are also measured by wrk, plain and
    /// streamed, in front of a static nginx backend.
    #[arg(long)]
    wrk: Option<PathBuf>,
    /// Folder for the results.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

const LITELLM_KEY: &str = "sk-slotgate-bench";

async fn start_litellm(litellm: &Path, backend: &str, logs: &Path) -> anyhow::Result<Peer> {
    let port = free_port()?;
    let config = logs.join("litellm.yaml");
    std::fs::write(
        &config,
        format!(
            "model_list:\n  - model_name: fake\n    litellm_params:\n      model: openai/fake\n      \
             api_base: {backend}/v1\n      api_key: none\n"
        ),
    )?;
    let mut command = std::process::Command::new(litellm);
    command
        .arg("--config")
        .arg(&config)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .env("LITELLM_MASTER_KEY", LITELLM_KEY)
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_LOG", "ERROR");
    Peer::start("litellm", command, port, "/health/liveliness", logs, Duration::from_secs(240))
        .await
}

/// One path at one load, as either load generator measured it.
struct PathRun {
    stream: bool,
    clients: usize,
    path: String,
    requests_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: String,
}

/// Latency and throughput of each path, and what it adds to the direct path at
/// the same load; with a `stream` column when the runs mix both kinds.
fn overhead_table(runs: &[PathRun], show_stream: bool) -> Table {
    let mut headers = vec![
        "clients",
        "path",
        "req/s",
        "p50 ms",
        "p99 ms",
        "added p50 ms",
        "added p99 ms",
        "req/s vs direct",
        "errors",
    ];
    if show_stream {
        headers.insert(0, "stream");
    }
    let mut table = Table::new(&headers);
    for r in runs {
        let direct = runs
            .iter()
            .find(|d| d.path == "direct" && d.stream == r.stream && d.clients == r.clients)
            .unwrap_or(r);
        let added = |mine: f64, theirs: f64| {
            if r.path == "direct" {
                String::new()
            } else {
                fixed(mine - theirs, 3)
            }
        };
        let mut row = vec![
            r.clients.to_string(),
            r.path.clone(),
            fixed(r.requests_per_second, 0),
            fixed(r.p50_ms, 3),
            fixed(r.p99_ms, 3),
            added(r.p50_ms, direct.p50_ms),
            added(r.p99_ms, direct.p99_ms),
            ratio(r.requests_per_second, direct.requests_per_second),
            r.errors.clone(),
        ];
        if show_stream {
            row.insert(0, if r.stream { "yes" } else { "no" }.to_owned());
        }
        table.row(row);
    }
    table
}

/// Starts `slotgate` in front of `backend`, checking its health every
/// `health_ms`, and waits until it routes there.
async fn start_gateway(backend: &str, health_ms: &str) -> anyhow::Result<Process> {
    let gateway_bin = slotgate_benches::sibling("slotgate")?;
    let gateway = Process::start_with_env(
        &gateway_bin,
        &["--listen", "127.0.0.1:0", "--backend", backend],
        &[
            ("SLOTGATE_ROUTING__HEALTH_INTERVAL_MS", health_ms),
            ("SLOTGATE_ROUTING__HEALTHY_THRESHOLD", "1"),
            // `ready` reads the admin API, closed without a key but for this.
            ("SLOTGATE_AUTH__ADMIN_LOOPBACK", "true"),
            ("RUST_LOG", "warn"),
        ],
    );
    slotgate_tests::ready(&reqwest::Client::new(), &gateway, 1).await;
    Ok(gateway)
}

/// Seconds of each wrk run.
const WRK_SECONDS: u64 = 3;

/// Runs per path and load; the median is reported. Five, not three: at one
/// connection a run on this VM lands in one of two states (a third apart), and
/// the median of three alternated runs still flipped the ratio to nginx.
const WRK_ROUNDS: usize = 5;

/// The median of `runs` in each figure on its own (throughput and each
/// percentile), with every error counted.
fn median(runs: &mut [WrkRun]) -> WrkRun {
    let mid = runs.len() / 2;
    let mut out = runs[0].clone();
    out.errors = runs.iter().map(|r| r.errors).sum();
    runs.sort_by(|a, b| a.requests_per_second.total_cmp(&b.requests_per_second));
    out.requests_per_second = runs[mid].requests_per_second;
    runs.sort_by(|a, b| a.p50_ms.total_cmp(&b.p50_ms));
    out.p50_ms = runs[mid].p50_ms;
    runs.sort_by(|a, b| a.p99_ms.total_cmp(&b.p99_ms));
    out.p99_ms = runs[mid].p99_ms;
    out
}

/// wrk against a static nginx backend (one for plain answers, one for streamed),
/// directly, through slotgate and through nginx as a proxy; at each load the
/// three paths run one after the other, so that they share the machine's state.
async fn wrk_static(
    wrk: &Path,
    nginx: &Path,
    clients: &[usize],
    bodies: &dyn Fn(bool) -> Bodies,
    logs: &Path,
) -> anyhow::Result<Vec<WrkRun>> {
    let mut runs = Vec::new();
    for stream in [false, true] {
        let (name, answer, content_type) = if stream {
            ("static-streamed", streamed_answer(), "text/event-stream")
        } else {
            ("static-plain", plain_answer().to_string(), "application/json")
        };
        let backend = nginx::start_static(nginx, name, &answer, content_type, 64, logs).await?;
        // As deployed: the default health interval, and slots enough for every
        // connection (a backend that lists thousands makes each check cost more).
        let gateway = start_gateway(&backend.url, "1000").await?;
        let proxy = nginx::start_proxy(nginx, &format!("nginx-{name}"), &backend.url, logs).await?;
        let targets = [
            Target::new("direct", format!("{}/v1/chat/completions", backend.url)),
            Target::new("slotgate", format!("{}/v1/chat/completions", gateway.url)),
            Target::new("nginx", format!("{}/v1/chat/completions", proxy.url)),
        ];
        let body = bodies(stream)(0);
        for target in &targets {
            // Warm: connections, and the gateway's view of the backend's slots.
            run_wrk(wrk, target, &body, 8, Duration::from_secs(1), logs)?;
        }
        for &n in clients {
            // Rounds alternate the paths, and each path's median round is kept:
            // one run's p99 on this VM moves by more than a proxy adds.
            let mut rounds: Vec<Vec<WrkRun>> = vec![Vec::new(); targets.len()];
            for _ in 0..WRK_ROUNDS {
                for (t, target) in targets.iter().enumerate() {
                    let run =
                        run_wrk(wrk, target, &body, n, Duration::from_secs(WRK_SECONDS), logs)?;
                    rounds[t].push(run);
                }
            }
            for mut path in rounds {
                let run = median(&mut path);
                eprintln!(
                    "wrk {} stream={stream} clients={n}: {:.0} req/s, p99 {:.3} ms, errors {}",
                    run.target, run.requests_per_second, run.p99_ms, run.errors
                );
                runs.push(run);
            }
        }
    }
    Ok(runs)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let logs = args.out.join("logs");
    let bodies = |stream: bool| -> Bodies {
        Arc::new(move |_| {
            let mut body = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8, "stream": stream});
            if stream {
                body["stream_options"] = json!({"include_usage": true});
            }
            body
        })
    };
    // wrk's view, plain and streamed, against a static backend, first: in a run
    // that put it after LiteLLM's load, slotgate's and nginx's figures were half
    // of those of a run without LiteLLM, on the same build.
    let wrk_runs = match (&args.wrk, &args.nginx) {
        (Some(wrk), Some(nginx)) => wrk_static(wrk, nginx, &args.clients, &bodies, &logs).await?,
        (Some(_), None) => anyhow::bail!("the wrk runs need nginx, for their static backend"),
        _ => Vec::new(),
    };
    let backend = fake_backend().await?;
    let gateway = start_gateway(&backend, "200").await?;
    let nginx = match &args.nginx {
        Some(path) => Some(nginx::start_proxy(path, "nginx", &backend, &logs).await?),
        None => None,
    };
    let litellm = match &args.litellm {
        Some(path) => Some(start_litellm(path, &backend, &logs).await?),
        None => None,
    };

    let mut targets = vec![
        Target::new("direct", format!("{backend}/v1/chat/completions")),
        Target::new("slotgate", format!("{}/v1/chat/completions", gateway.url)),
    ];
    if let Some(nginx) = &nginx {
        targets.push(Target::new("nginx", format!("{}/v1/chat/completions", nginx.url)));
    }
    if let Some(litellm) = &litellm {
        let mut target = Target::new("litellm", format!("{}/v1/chat/completions", litellm.url));
        target.bearer = Some(LITELLM_KEY.to_owned());
        targets.push(target);
    }

    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    let load = |clients: usize, requests: usize| Load {
        arrival: Arrival::Closed { clients },
        requests,
        duration: Duration::from_secs(args.duration_s),
        timeout: Duration::from_secs(30),
    };
    // Warm every path: connections, LiteLLM's first-request set-up.
    for target in &targets {
        let warm = run(&client, target, load(4, 200), &bodies(false)).await;
        anyhow::ensure!(warm.ok > 0, "{} answers nothing: {:?}", target.name, warm.errors);
    }

    let mut sweeps: Vec<(bool, Vec<usize>)> = vec![(false, args.clients.clone())];
    if !args.stream_clients.is_empty() {
        sweeps.push((true, args.stream_clients.clone()));
    }
    let mut reports: Vec<Report> = Vec::new();
    for (stream, clients) in &sweeps {
        for &n in clients {
            for target in &targets {
                let report = run(&client, target, load(n, args.requests), &bodies(*stream)).await;
                eprintln!(
                    "{} stream={} clients={n}: {:.0} req/s, p99 {:.3} ms, errors {}",
                    target.name,
                    stream,
                    report.requests_per_second,
                    report.e2e_ms.p99,
                    report.errors_label()
                );
                reports.push(report);
            }
        }
    }
    drop(litellm);
    drop(nginx);
    drop(gateway);

    let mut out = Output::new(&args.out, "gateway-overhead");
    let ours: Vec<PathRun> = reports
        .iter()
        .map(|r| PathRun {
            stream: r.stream,
            clients: r.arrival.x() as usize,
            path: r.target.clone(),
            requests_per_second: r.requests_per_second,
            p50_ms: r.e2e_ms.p50,
            p99_ms: r.e2e_ms.p99,
            errors: r.errors_label(),
        })
        .collect();
    out.text(&overhead_table(&ours, true).markdown());
    // The most each path sustained without a single error, over the plain runs.
    let mut best =
        Table::new(&["path", "most req/s without errors (plain)", "vs direct", "vs slotgate"]);
    let sustained = |name: &str| {
        reports
            .iter()
            .filter(|r| r.target == name && !r.stream && r.error_count() == 0)
            .map(|r| r.requests_per_second)
            .fold(f64::NAN, f64::max)
    };
    for target in &targets {
        let v = sustained(&target.name);
        best.row(vec![
            target.name.clone(),
            fixed(v, 0),
            ratio(v, sustained("direct")),
            ratio(v, sustained("slotgate")),
        ]);
    }
    out.text(&best.markdown());
    if !wrk_runs.is_empty() {
        out.text(&format!(
            "The same paths measured by wrk (one thread; at each load {WRK_ROUNDS} rounds of \
             {WRK_SECONDS} s runs, the paths in turn, each figure the median of its rounds), \
             in front of a static backend (nginx answering every request with the same \
             bytes, streamed answers in one piece, 64 slots; the gateway checks its health \
             every second, its default), so that the backend's own cost does not hide what \
             a proxy adds:\n"
        ));
        let theirs: Vec<PathRun> = wrk_runs
            .iter()
            .map(|r| PathRun {
                stream: r.stream,
                clients: r.connections,
                path: r.target.clone(),
                requests_per_second: r.requests_per_second,
                p50_ms: r.p50_ms,
                p99_ms: r.p99_ms,
                errors: r.errors.to_string(),
            })
            .collect();
        out.text(&overhead_table(&theirs, true).markdown());
        // The yardstick: slotgate's requests per second over nginx's, by wrk.
        let mut versus =
            Table::new(&["stream", "clients", "slotgate req/s", "nginx req/s", "slotgate / nginx"]);
        let rate = |name: &str, stream: bool, n: usize| {
            wrk_runs
                .iter()
                .find(|r| r.target == name && r.stream == stream && r.connections == n)
                .map_or(f64::NAN, |r| r.requests_per_second)
        };
        for stream in [false, true] {
            for &n in &args.clients {
                let (ours, theirs) = (rate("slotgate", stream, n), rate("nginx", stream, n));
                versus.row(vec![
                    stream.to_string(),
                    n.to_string(),
                    fixed(ours, 0),
                    fixed(theirs, 0),
                    ratio(ours, theirs),
                ]);
            }
        }
        out.text(&versus.markdown());
    }
    let plain: Vec<Report> = reports.iter().filter(|r| !r.stream).cloned().collect();
    out.chart(
        "p99",
        &Chart::new("Latency p99, plain chat completions", "concurrent clients", "ms", true)
            .lines(by_target(&plain, |r| r.e2e_ms.p99)),
    )?;
    out.chart(
        "throughput",
        &Chart::new("Throughput, plain chat completions", "concurrent clients", "req/s", true)
            .lines(by_target(&plain, |r| r.requests_per_second)),
    )?;
    out.finish(&json!({ "runs": reports, "wrk": wrk_runs }))
}

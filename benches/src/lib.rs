//! Benchmarks for slotgate and the systems users would pick instead: a load
//! generator that speaks the OpenAI API over HTTP ([`load`]), what it reports
//! ([`stats`]), SVG charts ([`chart`]), result files ([`report`]), the peers a
//! comparison starts ([`peer`], [`nginx`]) and wrk as a second opinion ([`wrk`]). Each comparison is a binary under `src/bin`;
//! `scripts/bench` installs what it needs and runs it.

pub mod arrival;
pub mod chart;
pub mod conversation;
pub mod load;
pub mod nginx;
pub mod peer;
pub mod report;
pub mod stats;
pub mod wrk;

pub use chart::Chart;
pub use load::{request, run, Arrival, Bodies, Load, Sample, Target};
pub use peer::{free_port, start_llama_server, Peer};
pub use report::{by_target, fixed, group, ratio, runs_table, Output, Table};
/// A release binary of this workspace, built beside the running bench.
pub fn sibling(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let path = std::env::current_exe()?.with_file_name(name);
    anyhow::ensure!(path.is_file(), "{} missing: cargo build --release --bins", path.display());
    Ok(path)
}

/// Starts the release `slotgate-engine` on the default model with `slots` slots of
/// `ctx_len` tokens, `threads` decoding threads, and `extra` flags.
pub fn start_engine(
    slots: usize,
    threads: u32,
    ctx_len: u32,
    extra: &[&str],
) -> anyhow::Result<slotgate_tests::Process> {
    let model = slotgate_tests::model_path();
    let (threads, slots, ctx_len) = (threads.to_string(), slots.to_string(), ctx_len.to_string());
    let mut args = vec![
        "--model",
        model.to_str().unwrap_or_default(),
        "--port",
        "0",
        "--threads",
        &threads,
        "--n-parallel",
        &slots,
        "--ctx-len",
        &ctx_len,
    ];
    args.extend_from_slice(extra);
    Ok(slotgate_tests::Process::start(&sibling("slotgate-engine")?, &args))
}

pub use stats::{metric_sum, percentile_ms, Percentiles, Report};

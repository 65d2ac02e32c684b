//! The conversations bench's report: tables of warm turns and TTFT per run, the
//! load on each engine behind the gateway, and TTFT by turn as charts.

use std::time::Duration;

use serde_json::json;
use slotgate_benches::{fixed, group, percentile_ms, ratio, Chart, Output, Table};
use slotgate_tests::MODEL;

use crate::replay::Turn;
use crate::Args;

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

pub fn summary(run: &[Turn]) -> String {
    let (warm, p50, p99) = later(&run.iter().collect::<Vec<_>>());
    format!("{warm:.0}% of later turns warm, TTFT p50 {p50:.0} ms, p99 {p99:.0} ms")
}

pub fn report(
    args: &Args,
    turns: &[Turn],
    loads: &[(String, String, Vec<f64>)],
) -> anyhow::Result<()> {
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

//! wrk, a load generator written in C, as a second opinion on the gateway
//! figures: the same request bodies (plain or streamed), closed loop over
//! kept-alive connections,
//! its own latency percentiles parsed from `--latency` output.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::load::Target;

/// What one wrk run reported.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WrkRun {
    /// The target's name.
    pub target: String,
    /// Whether the requests asked for a streamed answer.
    pub stream: bool,
    /// Open connections (wrk's closed-loop clients).
    pub connections: usize,
    /// Requests per second, all responses counted.
    pub requests_per_second: f64,
    /// Latency percentiles, in milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, in milliseconds.
    pub p99_ms: f64,
    /// Responses that were not 2xx or 3xx, plus socket errors.
    pub errors: u64,
}

/// Runs wrk with one thread and `connections` connections for `duration`,
/// POSTing `body` to the target.
pub fn run_wrk(
    wrk: &Path,
    target: &Target,
    body: &Value,
    connections: usize,
    duration: Duration,
    scratch: &Path,
) -> anyhow::Result<WrkRun> {
    std::fs::create_dir_all(scratch)?;
    let script = scratch.join(format!("wrk-{}.lua", target.name));
    let mut lua = format!(
        "wrk.method = \"POST\"\nwrk.body = [[{body}]]\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
    );
    if let Some(key) = &target.bearer {
        lua.push_str(&format!("wrk.headers[\"Authorization\"] = \"Bearer {key}\"\n"));
    }
    std::fs::write(&script, lua)?;
    let output = Command::new(wrk)
        .args(["-t1", &format!("-c{connections}"), &format!("-d{}s", duration.as_secs())])
        .args(["--timeout", "30s", "--latency", "-s"])
        .arg(&script)
        .arg(&target.url)
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stream = body["stream"] == Value::Bool(true);
    parse(&target.name, connections, &text)
        .map(|run| WrkRun { stream, ..run })
        .ok_or_else(|| anyhow::anyhow!("could not read wrk's report:\n{text}"))
}

/// Reads wrk's `--latency` report.
pub fn parse(target: &str, connections: usize, text: &str) -> Option<WrkRun> {
    let mut run = WrkRun {
        target: target.to_owned(),
        stream: false,
        connections,
        requests_per_second: f64::NAN,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        errors: 0,
    };
    for line in text.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            run.requests_per_second = v.trim().parse().ok()?;
        } else if let Some(v) = line.strip_prefix("50%") {
            run.p50_ms = duration_ms(v.trim())?;
        } else if let Some(v) = line.strip_prefix("99%") {
            run.p99_ms = duration_ms(v.trim())?;
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            run.errors += v.trim().parse::<u64>().ok()?;
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            run.errors += v
                .split(',')
                .filter_map(|part| part.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    run.requests_per_second.is_finite().then_some(run)
}

/// `54.00us`, `1.20ms`, `2.00s`, `1.5m` in milliseconds.
fn duration_ms(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    Some(match unit {
        "us" => value / 1000.0,
        "ms" => value,
        "s" => value * 1000.0,
        "m" => value * 60_000.0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_latency_report() {
        let text = "Running 5s test @ http://127.0.0.1:1/v1/chat/completions
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   412.00us  100.00us   3.20ms   90.00%
  Latency Distribution
     50%  390.00us
     75%  420.00us
     90%  480.00us
     99%    1.25ms
  85000 requests in 5.00s, 20.00MB read
  Non-2xx or 3xx responses: 12
  Socket errors: connect 0, read 2, write 0, timeout 1
Requests/sec:  17000.50
Transfer/sec:      4.00MB
";
        let run = parse("slotgate", 8, text).unwrap();
        assert_eq!(run.requests_per_second, 17000.5);
        assert!((run.p50_ms - 0.39).abs() < 1e-9);
        assert_eq!(run.p99_ms, 1.25);
        assert_eq!(run.errors, 15);
        assert!(parse("x", 1, "garbage").is_none());
        assert_eq!(duration_ms("2.00s"), Some(2000.0));
    }
}

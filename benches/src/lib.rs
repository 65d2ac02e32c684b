//! A load generator that speaks the OpenAI API over HTTP, and the statistics it
//! reports: time to first token, inter-token latency, end-to-end latency and
//! generated tokens per second.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;
use slotgate_protocol::SseDecoder;

/// What one streamed request measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// From sending to the first chunk with text.
    pub ttft: Duration,
    /// From sending to `[DONE]`.
    pub total: Duration,
    /// Gaps between chunks with text, after the first.
    pub gaps: Vec<Duration>,
    /// Generated tokens, from the usage chunk.
    pub tokens: u64,
}

/// Sends one streamed request and measures it. The body must ask for a stream
/// with `stream_options.include_usage`.
pub async fn streamed(client: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<Sample> {
    let started = Instant::now();
    let response = client.post(url).json(body).send().await?;
    anyhow::ensure!(response.status().is_success(), "status {}", response.status());
    let mut sample = Sample::default();
    let mut last: Option<Instant> = None;
    let mut decoder = SseDecoder::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        for event in decoder.push(&chunk?) {
            if event.is_done() {
                sample.total = started.elapsed();
                return Ok(sample);
            }
            let value: Value = serde_json::from_str(&event.data)?;
            if let Some(tokens) = value["usage"]["completion_tokens"].as_u64() {
                sample.tokens = tokens;
            }
            let has_text = value["choices"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["delta"]["content"]
                        .as_str()
                        .or(c["text"].as_str())
                        .is_some_and(|t| !t.is_empty())
                })
            });
            if has_text {
                let now = Instant::now();
                match last {
                    None => sample.ttft = now - started,
                    Some(prev) => sample.gaps.push(now - prev),
                }
                last = Some(now);
            }
        }
    }
    anyhow::bail!("stream ended without [DONE]")
}

/// Writes a run's results as pretty JSON at `path`, creating its folder.
pub fn write_results(path: &std::path::Path, results: &Value) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(results)?)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The p-th percentile (0..=100) of durations, in milliseconds.
pub fn percentile_ms(values: &[Duration], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    sorted.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_by_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&v, 50.0), 51.0);
        assert_eq!(percentile_ms(&v, 99.0), 99.0);
        assert_eq!(percentile_ms(&v, 0.0), 1.0);
        assert!(percentile_ms(&[], 50.0).is_nan());
    }
}

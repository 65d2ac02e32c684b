//! llama-server's own `/metrics` series (`llamacpp:prompt_tokens_total` and
//! the rest), for the dashboards and alerts written for it: process totals
//! without labels, as llama-server, which serves one model, reports them.
//! Kept in atomics rather than in the `metrics` recorder: several of its
//! counters are fractional seconds, which that recorder's counters are not.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The process's totals.
pub static TOTALS: Totals = Totals::new();

/// What llama-server counts, summed over every model of the process.
#[derive(Debug)]
pub struct Totals {
    started: AtomicU64,
    prompt_tokens: AtomicU64,
    prompt_cached: AtomicU64,
    prompt_us: AtomicU64,
    predicted_tokens: AtomicU64,
    predicted_us: AtomicU64,
    decodes: AtomicU64,
    busy_per_decode: AtomicU64,
    tokens_max: AtomicU64,
    processing: AtomicU64,
    deferred: AtomicU64,
    /// Since the last scrape: prompt tokens and microseconds, generated
    /// tokens and microseconds, for the throughput gauges.
    bucket: [AtomicU64; 4],
}

impl Totals {
    const fn new() -> Self {
        Self {
            started: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            prompt_cached: AtomicU64::new(0),
            prompt_us: AtomicU64::new(0),
            predicted_tokens: AtomicU64::new(0),
            predicted_us: AtomicU64::new(0),
            decodes: AtomicU64::new(0),
            busy_per_decode: AtomicU64::new(0),
            tokens_max: AtomicU64::new(0),
            processing: AtomicU64::new(0),
            deferred: AtomicU64::new(0),
            bucket: [const { AtomicU64::new(0) }; 4],
        }
    }

    /// Notes when the process started (`Process-Start-Time-Unix`).
    pub fn start(&self) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let _ = self.started.compare_exchange(0, now.as_secs(), Relaxed, Relaxed);
    }

    /// The process's start, in Unix seconds.
    pub fn started(&self) -> u64 {
        self.started.load(Relaxed)
    }

    /// A finished choice: its prompt (tokens, those of them found in the
    /// cache, the time reading the rest took) and what it generated (tokens,
    /// time).
    pub fn choice(&self, prompt: (u32, u32, Duration), generated: (u32, Duration)) {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let ((tokens, cached, prompt_time), (predicted, generation_time)) = (prompt, generated);
        self.prompt_tokens.fetch_add(u64::from(tokens.saturating_sub(cached)), Relaxed);
        self.prompt_cached.fetch_add(u64::from(cached), Relaxed);
        self.prompt_us.fetch_add(micros(prompt_time), Relaxed);
        self.predicted_tokens.fetch_add(u64::from(predicted), Relaxed);
        self.predicted_us.fetch_add(micros(generation_time), Relaxed);
        self.tokens_max.fetch_max(u64::from(tokens + predicted), Relaxed);
        let added = [
            u64::from(tokens.saturating_sub(cached)),
            micros(prompt_time),
            u64::from(predicted),
            micros(generation_time),
        ];
        for (bucket, n) in self.bucket.iter().zip(added) {
            bucket.fetch_add(n, Relaxed);
        }
    }

    /// Embeddings inputs read: prompt tokens that sample nothing.
    pub fn embedded(&self, tokens: usize) {
        self.prompt_tokens.fetch_add(tokens as u64, Relaxed);
    }

    /// One `llama_decode` call, over `busy` slots.
    pub fn decoded(&self, busy: usize) {
        self.decodes.fetch_add(1, Relaxed);
        self.busy_per_decode.fetch_add(busy as u64, Relaxed);
    }

    /// Slots running a request and requests waiting for one, over every model.
    pub fn load(&self, processing: usize, deferred: usize) {
        self.processing.store(processing as u64, Relaxed);
        self.deferred.store(deferred as u64, Relaxed);
    }

    /// The series in Prometheus' text format, with llama-server's names,
    /// types and help texts. The throughput gauges cover the time since the
    /// last scrape, as llama-server's do: each scrape starts a new window.
    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Relaxed) as f64;
        let [b_prompt, b_prompt_s, b_predicted, b_predicted_s] =
            self.bucket.each_ref().map(|a| a.swap(0, Relaxed) as f64);
        let (b_prompt_s, b_predicted_s) = (b_prompt_s / 1e6, b_predicted_s / 1e6);
        let seconds = |a: &AtomicU64| get(a) / 1e6;
        let rate = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
        let decodes = get(&self.decodes);
        let (prompt_s, predicted_s) = (seconds(&self.prompt_us), seconds(&self.predicted_us));
        let counters = [
            (
                "prompt_tokens_total",
                "Number of prompt tokens processed, excluding cached tokens",
                get(&self.prompt_tokens),
            ),
            (
                "prompt_tokens_cached_total",
                "Number of prompt tokens reused from the cache",
                get(&self.prompt_cached),
            ),
            ("prompt_seconds_total", "Total time spent processing prompts", prompt_s),
            (
                "tokens_predicted_total",
                "Number of generation tokens processed",
                get(&self.predicted_tokens),
            ),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", predicted_s),
            ("n_decode_total", "Total number of llama_decode() calls", decodes),
            (
                "n_tokens_max",
                "Largest observed sequence length (prompt + generation)",
                get(&self.tokens_max),
            ),
            // slotgate drafts nothing; the series are there for the dashboards that read them.
            (
                "spec_decode_num_draft_tokens_total",
                "Speculative: Total draft tokens generated",
                0.0,
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "Speculative: Total draft tokens accepted by the target model",
                0.0,
            ),
            (
                "spec_decode_num_drafts_total",
                "Speculative: Total speculative decoding verification steps",
                0.0,
            ),
        ];
        let gauges = [
            (
                "prompt_tokens_seconds",
                "Average prompt throughput in tokens/s",
                rate(b_prompt, b_prompt_s),
            ),
            (
                "predicted_tokens_seconds",
                "Average generation throughput in tokens/s",
                rate(b_predicted, b_predicted_s),
            ),
            ("requests_processing", "Number of requests processing", get(&self.processing)),
            ("requests_deferred", "Number of requests deferred", get(&self.deferred)),
            (
                "n_busy_slots_per_decode",
                "Average number of busy slots per llama_decode() call",
                get(&self.busy_per_decode) / decodes.max(1.0),
            ),
        ];
        let mut out = String::new();
        for (kind, series) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
            for (name, help, value) in series {
                let _ = writeln!(out, "# HELP llamacpp:{name} {help}");
                let _ = writeln!(out, "# TYPE llamacpp:{name} {kind}");
                let _ = writeln!(out, "llamacpp:{name} {value}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each series once, typed and described, with what was counted.
    #[test]
    fn the_series_are_llama_servers_and_count_what_happened() {
        let totals = Totals::new();
        totals.choice((10, 4, Duration::from_millis(500)), (3, Duration::from_millis(250)));
        totals.decoded(2);
        totals.decoded(1);
        totals.load(1, 5);
        let text = totals.render();
        let value = |name: &str| {
            let line = text.lines().find(|l| l.starts_with(&format!("llamacpp:{name} "))).unwrap();
            line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
        };
        assert_eq!(value("prompt_tokens_total"), 6.0);
        assert_eq!(value("prompt_tokens_cached_total"), 4.0);
        assert_eq!(value("prompt_seconds_total"), 0.5);
        assert_eq!(value("tokens_predicted_total"), 3.0);
        assert_eq!(value("predicted_tokens_seconds"), 12.0);
        assert_eq!(value("n_decode_total"), 2.0);
        assert_eq!(value("n_busy_slots_per_decode"), 1.5);
        assert_eq!(value("n_tokens_max"), 13.0);
        assert_eq!((value("requests_processing"), value("requests_deferred")), (1.0, 5.0));
        assert!(text.contains("# TYPE llamacpp:prompt_tokens_total counter\n"));
        assert!(text.contains("# TYPE llamacpp:requests_deferred gauge\n"));
        assert_eq!(text.matches("# HELP ").count(), 15);
        // The throughput gauges cover one window; the totals stay.
        let text = totals.render();
        let value = |name: &str| {
            let line = text.lines().find(|l| l.starts_with(&format!("llamacpp:{name} "))).unwrap();
            line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
        };
        assert_eq!(value("predicted_tokens_seconds"), 0.0);
        assert_eq!(value("prompt_tokens_seconds"), 0.0);
        assert_eq!(value("tokens_predicted_total"), 3.0);
    }
}

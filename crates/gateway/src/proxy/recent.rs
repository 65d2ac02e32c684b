//! The last minute of requests, for the live dashboard (`/ui`): rates, latency
//! percentiles and the latest refusals. Prometheus keeps the history; this is
//! what a person watching the fleet right now wants without a query language.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// How far back rates and percentiles look.
const WINDOW: Duration = Duration::from_secs(60);
/// Most requests kept for the percentiles; beyond it, the oldest go first.
const SAMPLES: usize = 4096;
/// Refusals listed.
const REFUSALS: usize = 20;

/// One ended request.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    ttft_ms: Option<f64>,
    duration_ms: f64,
    completion_tokens: u64,
}

/// A request the gateway or a backend refused.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The model asked for.
    pub model: String,
    /// The HTTP status sent.
    pub status: u16,
    /// The backend that answered it, or `none` for the gateway itself.
    pub backend: String,
}

/// Shards of the record: each thread writes to its own, so that the worker
/// threads do not contend for one lock on every request; reading merges them.
const SHARDS: usize = 8;

/// The recent requests of this process.
#[derive(Debug)]
pub struct Recent {
    shards: [Mutex<Inner>; SHARDS],
    /// When the record began: rates over a process younger than the window
    /// are over its life.
    born: Instant,
}

impl Default for Recent {
    fn default() -> Self {
        Self { shards: Default::default(), born: Instant::now() }
    }
}

#[derive(Debug, Default)]
struct Inner {
    samples: VecDeque<Sample>,
    refusals: VecDeque<Refusal>,
}

/// What the last minute came to.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// Requests ended per second.
    pub requests_per_s: f64,
    /// Completion tokens per second.
    pub tokens_per_s: f64,
    /// Time to first byte: p50, p90, p99, in milliseconds.
    pub ttft_ms: [f64; 3],
    /// Whole request: p50, p90, p99, in milliseconds.
    pub latency_ms: [f64; 3],
}

/// The process's record of recent requests.
pub static RECENT: std::sync::LazyLock<Recent> = std::sync::LazyLock::new(Recent::default);

impl Recent {
    fn lock(&self, shard: usize) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the record inconsistent.
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calling thread's shard.
    fn own(&self) -> std::sync::MutexGuard<'_, Inner> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
        }
        self.lock(SHARD.with(|shard| *shard))
    }

    /// A request ended with `status`.
    pub fn ended(
        &self,
        model: &str,
        backend: &str,
        status: u16,
        ttft: Option<Duration>,
        duration: Duration,
        completion_tokens: u64,
    ) {
        let sample = Sample {
            at: Instant::now(),
            ttft_ms: ttft.map(|t| t.as_secs_f64() * 1000.0),
            duration_ms: duration.as_secs_f64() * 1000.0,
            completion_tokens,
        };
        // Refused: the gateway's own 503s and 429s, and a backend's.
        let refusal = matches!(status, 429 | 503).then(|| Refusal {
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            model: model.to_owned(),
            status,
            backend: backend.to_owned(),
        });
        let mut inner = self.own();
        if inner.samples.len() == SAMPLES {
            inner.samples.pop_front();
        }
        inner.samples.push_back(sample);
        if let Some(refusal) = refusal {
            if inner.refusals.len() == REFUSALS {
                inner.refusals.pop_front();
            }
            inner.refusals.push_back(refusal);
        }
    }

    /// The last minute's rates and percentiles, and the latest refusals, newest first.
    pub fn summary(&self) -> (Summary, Vec<Refusal>) {
        let now = Instant::now();
        let mut samples: Vec<Sample> = Vec::new();
        let mut refusals: Vec<Refusal> = Vec::new();
        let (mut requests_per_s, mut tokens_per_s) = (0.0, 0.0);
        for shard in 0..SHARDS {
            let mut inner = self.lock(shard);
            while inner.samples.front().is_some_and(|s| now.duration_since(s.at) > WINDOW) {
                inner.samples.pop_front();
            }
            // Each shard's rate over the time its samples cover: the window, the
            // process's life when shorter, or since its oldest sample when it is
            // full (a busy thread's shard holds less than the window, an idle
            // one's all of it). The rates add up.
            let full = inner.samples.len() == SAMPLES;
            let since = inner.samples.front().filter(|_| full).map_or(self.born, |s| s.at);
            let span = now.duration_since(since).clamp(Duration::from_secs(1), WINDOW);
            let tokens: u64 = inner.samples.iter().map(|s| s.completion_tokens).sum();
            requests_per_s += inner.samples.len() as f64 / span.as_secs_f64();
            tokens_per_s += tokens as f64 / span.as_secs_f64();
            samples.extend(inner.samples.iter());
            refusals.extend(inner.refusals.iter().cloned());
        }
        // Newest first, to the millisecond.
        refusals.sort_by_key(|r| r.at_ms);
        refusals.reverse();
        refusals.truncate(REFUSALS);
        let ttft: Vec<f64> = samples.iter().filter_map(|s| s.ttft_ms).collect();
        let latency: Vec<f64> = samples.iter().map(|s| s.duration_ms).collect();
        let summary = Summary {
            requests_per_s,
            tokens_per_s,
            ttft_ms: percentiles(ttft),
            latency_ms: percentiles(latency),
        };
        (summary, refusals)
    }
}

/// p50, p90 and p99 of `values` (nearest rank), zeros when there are none.
fn percentiles(mut values: Vec<f64>) -> [f64; 3] {
    if values.is_empty() {
        return [0.0; 3];
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = (q * values.len() as f64).ceil() as usize;
        (values[rank.clamp(1, values.len()) - 1] * 10.0).round() / 10.0
    };
    [at(0.5), at(0.9), at(0.99)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_rates_and_refusals() {
        let recent = Recent::default();
        for i in 1..=100u64 {
            let ms = Duration::from_millis(i);
            recent.ended("m", "b", 200, Some(ms), ms * 2, 3);
        }
        recent.ended("m", "none", 503, None, Duration::from_millis(1), 0);
        let (summary, refusals) = recent.summary();
        assert_eq!(summary.ttft_ms, [50.0, 90.0, 99.0]);
        assert_eq!(summary.latency_ms[2], 198.0);
        // All within the first second of the window: counted over one second.
        assert_eq!(summary.requests_per_s, 101.0);
        assert_eq!(summary.tokens_per_s, 300.0);
        assert_eq!(refusals.len(), 1);
        assert_eq!((refusals[0].status, refusals[0].backend.as_str()), (503, "none"));
    }

    /// Each thread records in its own shard; the summary reads them all.
    #[test]
    fn every_threads_requests_are_summed() {
        let recent = Recent::default();
        std::thread::scope(|scope| {
            for status in [429, 503, 429] {
                let recent = &recent;
                scope.spawn(move || {
                    for _ in 0..10 {
                        recent.ended("m", "b", 200, None, Duration::from_millis(1), 1);
                    }
                    recent.ended("m", "b", status, None, Duration::from_millis(1), 0);
                });
            }
        });
        let used = recent.shards.iter().filter(|s| !s.lock().unwrap().samples.is_empty()).count();
        assert_eq!(used, 3, "one shard per thread");
        let (summary, refusals) = recent.summary();
        assert_eq!(summary.requests_per_s, 33.0);
        assert_eq!(summary.tokens_per_s, 30.0);
        assert_eq!(refusals.iter().filter(|r| r.status == 429).count(), 2);
        assert_eq!(refusals.len(), 3);
        assert!(refusals.windows(2).all(|w| w[0].at_ms >= w[1].at_ms), "newest first");
    }

    /// A busy thread's full shard covers a second, an idle thread's shard the
    /// whole window: each rate is over its own span, not the oldest of all.
    #[test]
    fn a_full_shard_is_rated_over_what_it_holds() {
        let now = Instant::now();
        let ago = |secs| now.checked_sub(Duration::from_secs(secs)).unwrap();
        let recent = Recent { born: ago(55), ..Recent::default() };
        let sample = |at| Sample { at, ttft_ms: None, duration_ms: 1.0, completion_tokens: 2 };
        recent.shards[0].lock().unwrap().samples.extend((0..SAMPLES).map(|_| sample(now)));
        recent.shards[1].lock().unwrap().samples.push_back(sample(ago(50)));
        let (summary, _) = recent.summary();
        // 4096 in (at most) the last second, and 1 in the 55 s of the process.
        let busy = SAMPLES as f64;
        assert!(summary.requests_per_s > busy && summary.requests_per_s < busy + 1.0);
        assert!(summary.tokens_per_s > 2.0 * busy && summary.tokens_per_s < 2.0 * busy + 1.0);
    }
}

//! `[routing]`: how requests are routed, queued and retried, and how backends
//! are checked and reached. Its keys have four owners, as the field comments
//! say: the pool (`policy` to `queue_timeout_ms`), the retry policy
//! (`max_attempts` to `retry_budget_min`), the health checks (`health_*`,
//! thresholds, `slot_events`) and the backend client (timeouts); a reload
//! applies what [`crate::serve::reload`] lists as live.

use serde::{Deserialize, Serialize};

use crate::fleet::balancer::Policy;

/// How requests are routed, queued and retried, and how backends are checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Routing {
    /// How a backend is chosen.
    pub policy: Policy,
    /// `cache_aware`: a backend keeps its conversations while its busy slots stay
    /// within this factor of its share of all busy slots.
    pub cache_load_factor: f64,
    /// Requests that may wait for a slot, per model.
    pub queue_size: u32,
    /// How long one may wait.
    pub queue_timeout_ms: u64,
    /// Backends tried for one request, the first included.
    pub max_attempts: u32,
    /// Pause before a retry.
    pub retry_backoff_ms: u64,
    /// Retries allowed as a fraction of requests (plus `retry_budget_min` per second).
    pub retry_budget: f64,
    /// Retries always allowed per second, whatever the ratio.
    pub retry_budget_min: u32,
    /// Interval of the active health checks and `/slots` reconciliation.
    pub health_interval_ms: u64,
    /// Passing checks in a row that re-admit a backend.
    pub healthy_threshold: u32,
    /// Failing checks in a row that eject a backend.
    pub unhealthy_threshold: u32,
    /// Idle pooled connections are closed after this; below llama.cpp's 5 s.
    pub pool_idle_timeout_ms: u64,
    /// Connection timeout to a backend.
    pub connect_timeout_ms: u64,
    /// How long a backend may take to its answer's first byte (for an answer
    /// that is not streamed: to the whole answer); past it the attempt counts as
    /// failed, as if the backend had died under it.
    pub first_byte_timeout_ms: u64,
    /// How long a streaming backend may send nothing between two chunks; past it
    /// the backend counts as stalled: ejected, and the stream moves to another
    /// backend (or, if it cannot, ends with an error event).
    pub chunk_timeout_ms: u64,
    /// Times one stream may move to another backend when its own dies or
    /// stalls mid-answer; 0 never moves one.
    pub max_resumes: u32,
    /// Follow each backend's pushed slot state (`/slots/events`) where it offers
    /// one; off, every backend is polled each `health_interval_ms`.
    pub slot_events: bool,
}

impl Default for Routing {
    fn default() -> Self {
        Self {
            policy: Policy::CacheAware,
            cache_load_factor: 1.25,
            queue_size: 256,
            queue_timeout_ms: 30_000,
            max_attempts: 3,
            retry_backoff_ms: 25,
            retry_budget: 0.2,
            retry_budget_min: 10,
            health_interval_ms: 1_000,
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            pool_idle_timeout_ms: 4_000,
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 600_000,
            chunk_timeout_ms: 15_000,
            max_resumes: 2,
            slot_events: true,
        }
    }
}

impl Routing {
    /// Checks every field; the error names it.
    pub fn check(&self) -> Result<(), String> {
        let bad = |field: &str, reason: String| Err(format!("routing.{field}: {reason}"));
        if self.cache_load_factor.is_nan() || self.cache_load_factor < 1.0 {
            return bad(
                "cache_load_factor",
                format!("must be at least 1.0, got {}", self.cache_load_factor),
            );
        }
        if self.max_attempts == 0 {
            return bad("max_attempts", "must be at least 1".into());
        }
        if !(0.0..=10.0).contains(&self.retry_budget) {
            return bad(
                "retry_budget",
                format!("must be between 0 and 10, got {}", self.retry_budget),
            );
        }
        if self.max_resumes > 16 {
            return bad("max_resumes", format!("must be at most 16, got {}", self.max_resumes));
        }
        if self.health_interval_ms < 10 {
            return bad("health_interval_ms", "must be at least 10".into());
        }
        if self.healthy_threshold == 0 || self.unhealthy_threshold == 0 {
            return bad("healthy_threshold", "thresholds must be at least 1".into());
        }
        Ok(())
    }
}

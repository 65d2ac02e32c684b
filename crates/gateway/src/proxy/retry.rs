//! The one retry policy of the gateway: what a failed attempt means (may it be
//! retried, is its backend left out of the next attempt), whether there is a next
//! attempt at all (attempts left, and a retry budget), and how long to wait first.
//!
//! Only failures before anything reached the client are retried; the proxy never
//! asks about a stream that has started.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use slotgate_protocol::{ApiError, ErrorEnvelope, ErrorType};

use crate::config::Routing;

/// What went wrong with one attempt, as the `reason` label of the retry counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The backend said its slots and queue are full, or it is loading.
    SlotUnavailable,
    /// The connection was refused: the backend is down.
    Connect,
    /// The request failed before any byte of an answer came back.
    BeforeFirstByte,
    /// A non-streamed answer broke off before its end.
    BrokenBody,
    /// The backend sent nothing within `routing.first_byte_timeout_ms`.
    Silent,
    /// A kept-alive connection that the backend had closed while it lay idle
    /// answered nothing: the request never reached the backend's handler.
    Stale,
}

impl Failure {
    /// Every kind, for counters that start at zero.
    pub const ALL: [Self; 6] = [
        Self::SlotUnavailable,
        Self::Connect,
        Self::BeforeFirstByte,
        Self::BrokenBody,
        Self::Silent,
        Self::Stale,
    ];

    /// Whether the backend was lost after the request was sent: it may have died
    /// of the request itself.
    pub fn is_death(self) -> bool {
        matches!(self, Self::BeforeFirstByte | Self::BrokenBody | Self::Silent)
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::SlotUnavailable => "slot_unavailable",
            Self::Connect => "connect",
            Self::BeforeFirstByte => "before_first_byte",
            Self::BrokenBody => "broken_body",
            Self::Silent => "silent",
            Self::Stale => "stale_connection",
        }
    }
}

/// What one attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The backend answered, and its answer goes to the client as it is (an error
    /// of the request's own, such as a 400, included).
    Answered(u16),
    /// Nothing usable came back.
    Failed(Failure),
}

/// The policy's reading of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// What happened.
    pub outcome: Outcome,
    /// Whether another attempt may succeed.
    pub retryable: bool,
    /// Whether the next attempt must avoid this backend.
    pub exclude: bool,
    /// Whether the backend is taken out of rotation at once (until a health check
    /// admits it again).
    pub eject: bool,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Try again after this pause.
    RetryAfter(Duration),
    /// Stop: the client gets an error.
    GiveUp(GiveUp),
}

/// Why there is no next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// `routing.max_attempts` attempts were made.
    Attempts,
    /// The retry budget is spent: the fleet is sick, retries would bury it.
    Budget,
    /// The attempt was answered, or failed in a way another attempt cannot mend.
    NotRetryable,
}

/// Attempts, backoff and budget, from `[routing]`.
#[derive(Debug)]
pub struct RetryPolicy {
    max_attempts: u32,
    max_resumes: u32,
    backoff: Duration,
    budget: RetryBudget,
}

impl RetryPolicy {
    /// The policy of `routing`.
    pub fn new(routing: &Routing) -> Self {
        Self {
            max_attempts: routing.max_attempts,
            max_resumes: routing.max_resumes,
            backoff: Duration::from_millis(routing.retry_backoff_ms),
            budget: RetryBudget::new(routing.retry_budget, routing.retry_budget_min),
        }
    }

    /// Attempts a request may make, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Times one stream may move to another backend.
    pub fn max_resumes(&self) -> u32 {
        self.max_resumes
    }

    /// Takes one retry from the budget, for a stream's move; false when it is
    /// spent.
    pub(super) fn withdraw(&self) -> bool {
        self.budget.withdraw()
    }

    /// A request arrived: it earns the budget its share of retries.
    pub(super) fn arrived(&self) {
        self.budget.deposit();
    }

    /// Reads an attempt's outcome.
    pub(super) fn judge(&self, outcome: Outcome) -> Verdict {
        let failure = match outcome {
            Outcome::Answered(_) => {
                return Verdict { outcome, retryable: false, exclude: false, eject: false }
            }
            Outcome::Failed(failure) => failure,
        };
        let (exclude, eject) = match failure {
            Failure::SlotUnavailable => (true, false),
            Failure::Connect => (true, true),
            // A break on a connection that was not stale is the backend's
            // doing: it is left out, and its health checks judge it.
            Failure::BeforeFirstByte | Failure::BrokenBody | Failure::Silent => (true, false),
            // The pool's own leftover, as pingora reads a failure on a reused
            // connection: the same backend is fine for the next attempt.
            Failure::Stale => (false, false),
        };
        Verdict { outcome, retryable: true, exclude, eject }
    }

    /// Whether an attempt counts against `routing.max_attempts`: all do but a
    /// stale connection's, which was the pool's and not the backend's.
    pub(super) fn counts(&self, verdict: &Verdict) -> bool {
        verdict.outcome != Outcome::Failed(Failure::Stale)
    }

    /// Whether attempt number `made + 1` happens, and after what pause. Takes a
    /// retry from the budget when it does.
    /// A stale connection's attempt is sent again at once, outside the count
    /// and the budget: each takes one dead connection out of the pool, so
    /// there are no more of them than connections were kept.
    pub(super) fn next(&self, verdict: &Verdict, made: u32) -> Next {
        if !verdict.retryable {
            Next::GiveUp(GiveUp::NotRetryable)
        } else if verdict.outcome == Outcome::Failed(Failure::Stale) {
            Next::RetryAfter(Duration::ZERO)
        } else if made >= self.max_attempts {
            Next::GiveUp(GiveUp::Attempts)
        } else if !self.budget.withdraw() {
            Next::GiveUp(GiveUp::Budget)
        } else {
            Next::RetryAfter(self.backoff)
        }
    }
}

/// What a 503 (or 429) refusal says, in any of the forms slotgate engines and
/// llama.cpp's server use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its slots and queue are full (`slot_unavailable`): the backend's slots are
    /// all busy, until it reports otherwise.
    Full,
    /// Some other passing state (loading a model): try elsewhere, but its slots
    /// are as they were.
    Busy,
}

/// What a 503 (or 429) body says, or `None` when it is the request's own error,
/// to be answered as it is.
pub fn refusal(status: u16, body: &[u8]) -> Option<Refusal> {
    if status != 503 && status != 429 {
        return None;
    }
    if let Ok(envelope) = serde_json::from_slice::<ErrorEnvelope>(body) {
        let err: ApiError = envelope.error;
        if err.code.as_deref() == Some(slotgate_protocol::SLOT_UNAVAILABLE) {
            return Some(Refusal::Full);
        }
        if err.is_retryable() {
            return Some(Refusal::Busy);
        }
        if err.kind != ErrorType::Unknown {
            return None;
        }
    }
    let text = String::from_utf8_lossy(body).to_lowercase();
    if ["slot unavailable", "slot_unavailable", "no slot available"]
        .iter()
        .any(|s| text.contains(s))
    {
        return Some(Refusal::Full);
    }
    text.contains("loading model").then_some(Refusal::Busy)
}

/// A token bucket: retries may add at most `ratio` of the request rate, plus a
/// floor per second, so that a sick fleet is not buried in retries. The same
/// shape as Finagle's and tower's retry budgets, with a floor in tokens per second
/// rather than a sliding window, which needs no clock per request.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    floor: f64,
    state: Mutex<(f64, Instant)>,
    /// The balance is at its cap: a deposit would change nothing. Read without
    /// the lock, so that requests on a healthy fleet, which retry nothing, do not
    /// all take one lock. A deposit that reads it just before a withdrawal
    /// clears it is lost: a fraction of one retry, in the budget's favour.
    full: AtomicBool,
}

impl RetryBudget {
    /// A budget allowing `ratio` retries per request and `floor` per second.
    pub fn new(ratio: f64, floor: u32) -> Self {
        let floor = f64::from(floor);
        Self {
            ratio,
            floor,
            state: Mutex::new((floor, Instant::now())),
            full: AtomicBool::new(false),
        }
    }

    fn cap(&self) -> f64 {
        self.floor.max(1.0) * 10.0 + self.ratio * 100.0
    }

    /// A request arrived.
    pub fn deposit(&self) {
        if self.full.load(Ordering::Relaxed) {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 = (s.0 + self.ratio).min(self.cap());
        if s.0 >= self.cap() {
            self.full.store(true, Ordering::Relaxed);
        }
    }

    /// Takes one retry from the budget, if it has one.
    pub fn withdraw(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.full.store(false, Ordering::Relaxed);
        let now = Instant::now();
        let refill = now.duration_since(s.1).as_secs_f64() * self.floor;
        s.0 = (s.0 + refill).min(self.cap());
        s.1 = now;
        // Deposits of 0.1 or 0.2 do not add up to exactly 1.0 in binary.
        if s.0 >= 1.0 - 1e-9 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_bounds_retries_when_the_floor_is_zero() {
        let budget = RetryBudget::new(0.2, 0);
        assert!(!budget.withdraw());
        for _ in 0..10 {
            budget.deposit();
        }
        assert!(budget.withdraw() && budget.withdraw());
        assert!(!budget.withdraw(), "ten requests at 0.2 allow two retries");
    }

    /// A budget at its cap skips the lock on deposits, and takes them again once a
    /// retry is withdrawn.
    #[test]
    fn a_full_budget_fills_again_after_a_withdrawal() {
        let budget = RetryBudget::new(0.5, 0);
        for _ in 0..1000 {
            budget.deposit();
        }
        let cap = (0..1000).take_while(|_| budget.withdraw()).count();
        assert_eq!(cap, 60, "the cap: 10 for the floor, 100 requests' worth of ratio");
        budget.deposit();
        budget.deposit();
        assert!(budget.withdraw(), "two deposits at 0.5 after the budget ran dry");
        assert!(!budget.withdraw());
    }

    #[test]
    fn refusals_in_every_known_form_are_retryable_and_only_full_ones_mark() {
        let ours = br#"{"error":{"message":"full","type":"unavailable_error","param":null,"code":"slot_unavailable"}}"#;
        assert_eq!(refusal(503, ours), Some(Refusal::Full));
        let loading =
            br#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
        assert_eq!(refusal(503, loading), Some(Refusal::Busy));
        assert_eq!(refusal(503, b"slot unavailable"), Some(Refusal::Full));
        assert_eq!(refusal(503, b"Loading model"), Some(Refusal::Busy));
        assert_eq!(refusal(400, ours), None);
        assert_eq!(
            refusal(
                503,
                br#"{"error":{"message":"x","type":"server_error","param":null,"code":null}}"#
            ),
            None
        );
    }

    #[test]
    fn a_refused_or_dead_backend_is_left_out() {
        let policy = RetryPolicy::new(&Routing::default());
        let full = policy.judge(Outcome::Failed(Failure::SlotUnavailable));
        assert!(full.retryable && full.exclude && !full.eject);
        let dead = policy.judge(Outcome::Failed(Failure::Connect));
        assert!(dead.exclude && dead.eject);
        let died = policy.judge(Outcome::Failed(Failure::BeforeFirstByte));
        assert!(died.retryable && died.exclude && !died.eject, "died under the request");
        let answered = policy.judge(Outcome::Answered(400));
        assert!(!answered.retryable && !answered.exclude);
        assert_eq!(policy.next(&answered, 1), Next::GiveUp(GiveUp::NotRetryable));
    }

    #[test]
    fn attempts_and_the_budget_end_the_retries() {
        let routing = Routing { max_attempts: 3, retry_budget_min: 0, ..Routing::default() };
        let policy = RetryPolicy::new(&routing);
        let verdict = policy.judge(Outcome::Failed(Failure::SlotUnavailable));
        assert_eq!(policy.next(&verdict, 1), Next::GiveUp(GiveUp::Budget), "nothing deposited");
        for _ in 0..10 {
            policy.arrived();
        }
        assert!(matches!(policy.next(&verdict, 1), Next::RetryAfter(_)));
        assert_eq!(policy.next(&verdict, 3), Next::GiveUp(GiveUp::Attempts));
    }
}

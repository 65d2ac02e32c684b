//! The retry budget: retries may add at most a fraction of the request rate, plus
//! a small floor per second, so that a sick fleet is not buried in retries.

use std::sync::Mutex;
use std::time::Instant;

/// A token bucket refilled by requests (`ratio` each) and by time (`floor` a second).
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    floor: f64,
    state: Mutex<(f64, Instant)>,
}

impl RetryBudget {
    /// A budget allowing `ratio` retries per request and `floor` per second.
    pub fn new(ratio: f64, floor: u32) -> Self {
        let floor = f64::from(floor);
        Self { ratio, floor, state: Mutex::new((floor, Instant::now())) }
    }

    fn cap(&self) -> f64 {
        self.floor.max(1.0) * 10.0 + self.ratio * 100.0
    }

    /// A request arrived.
    pub fn deposit(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 = (s.0 + self.ratio).min(self.cap());
    }

    /// Takes one retry from the budget, if it has one.
    pub fn withdraw(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
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
}

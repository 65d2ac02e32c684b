//! One request's course under the retry policy ([`super::retry`]): the
//! attempts it made, the backends it leaves out (or the one it is pinned to),
//! and its failures; the proxy asks it where not to go and what comes next.

use std::time::Duration;

use slotgate_protocol::{ApiError, ErrorType};

use crate::proxy::retry::{Failure, GiveUp, Next, Outcome, RetryPolicy};

/// One request's course under the policy: the attempts it made, the backends
/// it leaves out, and what its failures were. The proxy asks it where not to go
/// and what to do after each attempt; it decides nothing of this itself.
#[derive(Debug)]
pub struct Course<'p> {
    policy: &'p RetryPolicy,
    /// Attempts that count against `routing.max_attempts`.
    made: u32,
    /// Attempts that failed.
    failed: u32,
    /// Backends the next attempt avoids, by index.
    exclude: Vec<usize>,
    /// Backends lost after the request was sent to them.
    deaths: u32,
    /// Whether the request may go to one backend only (it holds what the
    /// request continues): its failures leave it in, and the others stay out.
    pinned: bool,
    /// The last failure.
    last: Option<Failure>,
}

/// The ruling on one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ruling {
    /// Take its backend out of rotation at once (until a health check admits it).
    pub eject: bool,
    /// What failed, if the attempt did; counted in `slotgate_retries_total`.
    pub failure: Option<Failure>,
    /// What comes next.
    pub then: Then,
}

/// What comes after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Its answer goes to the client as it is.
    Deliver,
    /// Another attempt, after this pause.
    RetryAfter(Duration),
    /// No more attempts: the client gets an error.
    GiveUp(GiveUp),
}

impl RetryPolicy {
    /// A request arrived: its course, which earns the budget its share of retries.
    pub fn course(&self) -> Course<'_> {
        self.arrived();
        Course {
            policy: self,
            made: 0,
            failed: 0,
            exclude: Vec::new(),
            deaths: 0,
            last: None,
            pinned: false,
        }
    }
}

impl Course<'_> {
    /// The backends the next attempt avoids. When `has_other` says no backend
    /// outside them serves the model, none: the same backend again, on a
    /// fresh attempt, rather than nowhere.
    pub fn exclusions(&mut self, has_other: impl FnOnce(&[usize]) -> bool) -> &[usize] {
        if !self.pinned && !has_other(&self.exclude) {
            self.exclude.clear();
        }
        &self.exclude
    }

    /// Sends every attempt to the one backend that is not in `others`: it waits
    /// there for a slot, and is retried there.
    pub fn pin(&mut self, others: Vec<usize>) {
        self.exclude = others;
        self.pinned = true;
    }

    /// Rules on an attempt on backend `backend` that came to `outcome`, and
    /// counts it.
    pub fn rule(&mut self, backend: usize, outcome: Outcome) -> Ruling {
        let verdict = self.policy.judge(outcome);
        if self.policy.counts(&verdict) {
            self.made += 1;
        }
        let Outcome::Failed(failure) = outcome else {
            return Ruling { eject: false, failure: None, then: Then::Deliver };
        };
        self.failed += 1;
        self.last = Some(failure);
        if failure.is_death() {
            self.deaths += 1;
        }
        if verdict.exclude && !self.pinned {
            self.exclude.push(backend);
        }
        metrics::counter!(crate::metrics::RETRIES, "reason" => failure.label()).increment(1);
        let then = match self.policy.next(&verdict, self.made) {
            Next::RetryAfter(pause) => Then::RetryAfter(pause),
            Next::GiveUp(why) => Then::GiveUp(why),
        };
        Ruling { eject: verdict.eject, failure: Some(failure), then }
    }

    /// Attempts that counted so far.
    pub fn made(&self) -> u32 {
        self.made
    }

    /// Backends that died while this request was on them.
    pub fn deaths(&self) -> u32 {
        self.deaths
    }

    /// The error for a client whose every attempt failed.
    pub fn exhausted(&self) -> ApiError {
        let message =
            format!("no backend could answer after {} failed attempts; retry later", self.failed);
        match self.last {
            // Every backend said it was full: the client may retry, as with a full queue.
            Some(Failure::SlotUnavailable) => ApiError::slot_unavailable(message),
            _ => ApiError::new(ErrorType::UnavailableError, message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Routing;

    /// A course leaves out each backend that refused or died, until none other
    /// is left; a stale connection's attempt neither counts nor leaves its
    /// backend out; an answer is delivered.
    #[test]
    fn a_course_leaves_out_failed_backends_until_none_is_left() {
        let routing = Routing { max_attempts: 3, retry_budget_min: 100, ..Routing::default() };
        let policy = RetryPolicy::new(&routing);
        let mut course = policy.course();
        let served_by = [0usize, 1];
        let next = |course: &mut Course<'_>| {
            course.exclusions(|ex| served_by.iter().any(|b| !ex.contains(b))).to_vec()
        };
        assert_eq!(next(&mut course), Vec::<usize>::new());
        let stale = course.rule(0, Outcome::Failed(Failure::Stale));
        assert_eq!(stale.then, Then::RetryAfter(Duration::ZERO));
        assert_eq!((course.made(), next(&mut course)), (0, vec![]));
        let full = course.rule(0, Outcome::Failed(Failure::SlotUnavailable));
        assert!(matches!(full.then, Then::RetryAfter(_)) && !full.eject);
        assert_eq!(next(&mut course), vec![0]);
        let dead = course.rule(1, Outcome::Failed(Failure::Connect));
        assert!(dead.eject && matches!(dead.then, Then::RetryAfter(_)));
        assert_eq!(next(&mut course), Vec::<usize>::new(), "both left out: both again");
        let died = course.rule(0, Outcome::Failed(Failure::BeforeFirstByte));
        assert_eq!(died.then, Then::GiveUp(GiveUp::Attempts));
        assert_eq!((course.made(), course.deaths()), (3, 1));
        assert_eq!(course.exhausted().kind, ErrorType::UnavailableError);
        let mut answered = policy.course();
        let ruling = answered.rule(1, Outcome::Answered(400));
        assert_eq!(ruling, Ruling { eject: false, failure: None, then: Then::Deliver });
    }
}

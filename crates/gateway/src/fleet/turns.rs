//! Replicas' turns at one backend's free slots. At each event of the engine's
//! slot state, the free slots are dealt out among the replicas that follow the
//! events, in an order that every replica computes alike (see
//! [`crate::fleet::slot_events`]): free slot `j` belongs first to the replica ranked
//! `j mod n`, and after each turn to the next replica in the order, round and
//! round, until the next event deals again. At any moment each free slot is
//! one replica's alone, and only in the first half of each turn: a slot taken
//! then shows as taken in the engine's next event before the next turn begins
//! (a turn lasts three of the engine's steps), so a turn that ends without an
//! event means nobody took anything in it. Without events (a polled backend),
//! or as the only replica following them, every free slot is this replica's at
//! once, as before.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The deal of the last event, and what this replica has taken of it.
#[derive(Debug, Default)]
pub struct Turns {
    deal: Mutex<Option<Deal>>,
}

#[derive(Debug, Clone, Copy)]
struct Deal {
    at: Instant,
    /// Slots free for this replica when the event came.
    free: u32,
    rank: u32,
    replicas: u32,
    turn: Duration,
    /// Slots this replica has claimed in turn `taken_in`.
    taken: u32,
    taken_in: u64,
}

impl Deal {
    /// The turn under way at `now`, and whether claims are open in it (its
    /// first half; in the second, claims made in the first show in an event).
    fn turn_at(&self, now: Instant) -> (u64, bool) {
        let since = now.saturating_duration_since(self.at).as_nanos();
        let turn = self.turn.as_nanos().max(1);
        (u64::try_from(since / turn).unwrap_or(u64::MAX), since % turn < turn / 2)
    }

    /// How many free slots are this replica's in turn `k`.
    fn held(&self, k: u64) -> u32 {
        let n = u64::from(self.replicas.max(1));
        (0..u64::from(self.free)).filter(|j| (j % n + k) % n == u64::from(self.rank)).count() as u32
    }

    /// How many more slots this replica may claim in turn `k`.
    fn left(&self, k: u64) -> u32 {
        let taken = if self.taken_in == k { self.taken } else { 0 };
        self.held(k).saturating_sub(taken)
    }
}

impl Turns {
    fn lock(&self) -> MutexGuard<'_, Option<Deal>> {
        self.deal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An event dealt `free` slots; this replica is `rank` of `replicas`, and a
    /// turn lasts `turn`. The only replica following has no turns to wait for:
    /// its own claims already count every slot it takes.
    pub fn deal(&self, free: u32, rank: u32, replicas: u32, turn: Duration) {
        let at = Instant::now();
        *self.lock() = (replicas > 1).then_some(Deal {
            at,
            free,
            rank,
            replicas,
            turn,
            taken: 0,
            taken_in: 0,
        });
    }

    /// Events no longer come: every free slot is this replica's again.
    pub fn clear(&self) {
        *self.lock() = None;
    }

    /// How many more slots this replica may claim now (`u32::MAX` without a deal).
    pub fn left(&self) -> u32 {
        match *self.lock() {
            Some(deal) => match deal.turn_at(Instant::now()) {
                (k, true) => deal.left(k),
                (_, false) => 0,
            },
            None => u32::MAX,
        }
    }

    /// Takes one slot of the deal if this turn gives this replica one, then
    /// runs `claim`; nothing is taken if `claim` fails.
    pub fn take(&self, claim: impl FnOnce() -> bool) -> bool {
        let mut deal = self.lock();
        let Some(d) = deal.as_mut() else { return claim() };
        let (k, open) = d.turn_at(Instant::now());
        if !open || d.left(k) == 0 || !claim() {
            return false;
        }
        if d.taken_in != k {
            (d.taken, d.taken_in) = (0, k);
        }
        d.taken += 1;
        true
    }

    /// When the next turn begins, while there are free slots to pass on.
    pub fn next_turn(&self) -> Option<Instant> {
        let deal = (*self.lock())?;
        if deal.free == 0 || deal.replicas <= 1 {
            return None;
        }
        let (k, _) = deal.turn_at(Instant::now());
        let next = u32::try_from(k + 1).ok()?;
        Some(deal.at + deal.turn * next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_free_slot_is_one_replicas_at_a_time() {
        let long = Duration::from_secs(3600);
        let t = Turns::default();
        assert_eq!(t.left(), u32::MAX, "no deal: no limit");
        // Two free slots, three replicas: ranks 0 and 1 hold one each, 2 none.
        let held: Vec<u32> = (0..3)
            .map(|rank| {
                t.deal(2, rank, 3, long);
                t.left()
            })
            .collect();
        assert_eq!(held, vec![1, 1, 0]);
        t.deal(2, 0, 1, Duration::ZERO);
        assert_eq!(t.left(), u32::MAX, "the only replica is never kept waiting for a turn");
        t.deal(2, 0, 3, long);
        assert!(!t.take(|| false) && t.left() == 1, "a failed claim takes nothing");
        assert!(t.take(|| true));
        assert!(!t.take(|| true), "one slot was this replica's");
        // One free slot passes from rank to rank, one turn each, round and round.
        let deal = |rank| Deal {
            at: Instant::now(),
            free: 1,
            rank,
            replicas: 3,
            turn: long,
            taken: 0,
            taken_in: 0,
        };
        let owners: Vec<Vec<u32>> =
            (0..4).map(|k| (0..3).map(|r| deal(r).held(k)).collect()).collect();
        assert_eq!(owners, vec![vec![1, 0, 0], vec![0, 1, 0], vec![0, 0, 1], vec![1, 0, 0]]);
        let mut taken = deal(1);
        (taken.taken, taken.taken_in) = (1, 1);
        assert_eq!(
            (taken.left(1), taken.left(4)),
            (0, 1),
            "what was taken counts in its turn only"
        );
        t.deal(1, 2, 3, long);
        assert!(t.next_turn().is_some());
    }
}

//! Which worker thread serves a new client connection: the one with the fewest
//! open.
//!
//! Every worker accepts on the one listening socket, and a worker that wakes
//! for a burst of connections takes them all before the others run: a client
//! pool that opens 32 keep-alive connections at once had every one on the same
//! thread, which then bounded the whole gateway by one core (see BENCHMARKS.md,
//! gateway overhead). So the worker that accepts asks here which worker should
//! serve, and hands the connection over when it is another. Ties stay with the
//! worker that accepted, so that a balanced gateway hands nothing over.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Open client connections per worker.
#[derive(Debug)]
pub struct Spread {
    open: Box<[AtomicUsize]>,
}

impl Spread {
    /// Counts for `workers` workers (at least one).
    pub fn new(workers: usize) -> Arc<Self> {
        Arc::new(Self { open: (0..workers.max(1)).map(|_| AtomicUsize::new(0)).collect() })
    }

    /// The worker that should serve a connection accepted by worker `accepted`:
    /// the one with the fewest open, `accepted` among equals. The connection
    /// counts as open on it until the returned mark is dropped.
    pub fn pick(self: &Arc<Self>, accepted: usize) -> Open {
        let accepted = accepted.min(self.open.len() - 1);
        let mut best = accepted;
        let mut fewest = self.open[accepted].load(Ordering::Relaxed);
        for (worker, open) in self.open.iter().enumerate() {
            let open = open.load(Ordering::Relaxed);
            if open < fewest {
                best = worker;
                fewest = open;
            }
        }
        // Two workers picking at once may both choose the same one; the next
        // pick sees it and evens it out.
        self.open[best].fetch_add(1, Ordering::Relaxed);
        Open { spread: self.clone(), worker: best }
    }

    /// Open connections of each worker, in worker order.
    pub fn open(&self) -> Vec<usize> {
        self.open.iter().map(|open| open.load(Ordering::Relaxed)).collect()
    }
}

/// A connection counted as open on one worker, until dropped.
#[derive(Debug)]
pub struct Open {
    spread: Arc<Spread>,
    worker: usize,
}

impl Spread {
    /// Open connections on all workers together.
    pub fn total(&self) -> usize {
        self.open.iter().map(|open| open.load(Ordering::Relaxed)).sum()
    }
}

impl Open {
    /// The worker that serves the connection.
    pub fn worker(&self) -> usize {
        self.worker
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.spread.open[self.worker].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_to_the_worker_with_fewest_open() {
        let spread = Spread::new(3);
        // All accepted by worker 1, as a burst lands on one thread.
        let marks: Vec<Open> = (0..6).map(|_| spread.pick(1)).collect();
        assert_eq!(spread.open(), vec![2, 2, 2]);
        assert_eq!(marks[0].worker(), 1, "a tie stays where it was accepted");
        drop(marks);
        assert_eq!(spread.open(), vec![0, 0, 0], "closed connections are no longer counted");
    }

    #[test]
    fn a_closed_connection_makes_room_on_its_worker() {
        let spread = Spread::new(2);
        let a = spread.pick(0);
        let b = spread.pick(0);
        assert_eq!((a.worker(), b.worker()), (0, 1));
        drop(a);
        let c = spread.pick(1);
        assert_eq!(c.worker(), 0, "worker 0 has fewer open now");
        let d = spread.pick(1);
        assert_eq!(d.worker(), 1, "equal again: the accepting worker keeps it");
        assert_eq!(spread.open(), vec![1, 2]);
        drop((b, c, d));
    }
}

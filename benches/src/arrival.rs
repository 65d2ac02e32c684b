//! How requests arrive in a run: a fixed number of callers, or a fixed rate.

use serde::Serialize;

/// How requests arrive.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrival {
    /// `clients` callers, each sending its next request when its last one ends.
    Closed {
        /// Concurrent callers.
        clients: usize,
    },
    /// Requests start at a fixed rate, per second, whether earlier ones ended or not.
    Open {
        /// Arrivals per second.
        rate: f64,
    },
}

impl Arrival {
    /// The swept quantity: clients, or arrivals per second.
    pub fn x(&self) -> f64 {
        match *self {
            Self::Closed { clients } => clients as f64,
            Self::Open { rate } => rate,
        }
    }

    /// `8 clients` or `4 req/s`.
    pub fn label(&self) -> String {
        match *self {
            Self::Closed { clients } => format!("{clients} clients"),
            Self::Open { rate } => format!("{rate} req/s"),
        }
    }
}

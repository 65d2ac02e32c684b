//! Choosing a backend for a request. The choice is a pure function of what each
//! candidate looks like now, so it can be property-tested; claiming the slot is
//! the caller's, atomic on the backend.

pub mod cache_aware;
mod p2c;

pub use p2c::{pick, Affinity};

/// How a backend was chosen, as the `reason` label of the routing counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The first choice for the request's affinity key.
    Affinity,
    /// Another than the first choice: that one was full or above its load bound.
    Spilled,
    /// No affinity: another policy, or a request with nothing to derive a key from.
    NoAffinity,
}

impl Decision {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Affinity => "affinity",
            Self::Spilled => "spilled",
            Self::NoAffinity => "no_affinity",
        }
    }
}

/// What the picker sees of one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Takes traffic.
    pub healthy: bool,
    /// Serves the requested model.
    pub serves: bool,
    /// Slots free for this gateway.
    pub free: u32,
    /// Requests in flight from this gateway.
    pub in_flight: u32,
    /// Relative share among equals.
    pub weight: u32,
    /// Slots it has.
    pub slots: u32,
    /// Stable identity, the same on every gateway replica (see `cache_aware`).
    pub id: u64,
}

impl View {
    /// Whether it may be sent this model's request at all.
    pub fn eligible(&self) -> bool {
        self.healthy && self.serves
    }

    /// Slots not free for this request: this gateway's and everyone else's.
    pub fn busy(&self) -> u32 {
        self.slots.saturating_sub(self.free)
    }
}

//! Choosing a backend for a request. The choice is a pure function of what each
//! candidate looks like now, so it can be property-tested; claiming the slot is
//! the caller's, atomic on the backend.

mod p2c;

pub use p2c::pick;

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
}

impl View {
    /// Whether it may be sent this model's request at all.
    pub fn eligible(&self) -> bool {
        self.healthy && self.serves
    }
}

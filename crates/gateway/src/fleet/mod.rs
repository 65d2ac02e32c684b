//! The backends: where they are, what they can take now, and which one a
//! request goes to.

pub mod affinity;
pub mod backend;
pub mod balancer;
pub mod discovery;
pub mod hash;
pub mod health;
pub mod load_metrics;
pub mod pool;
pub mod slot_events;
pub mod supervisor;
pub mod target;
pub mod turns;

//! slotgate's engine: llama.cpp behind OpenAI endpoints, with `n_parallel` slots per
//! model and continuous batching in one decode loop on one thread.

pub mod config;
pub mod constrain;
pub mod error;
pub mod ids;
pub mod metrics;
pub mod scheduler;
pub mod server;
pub mod template;
pub mod tools;

pub use config::{Cli, EngineConfig, ModelSettings};
pub use error::EngineError;
pub use scheduler::Scheduler;

/// The `system_fingerprint` of every answer: the build that produced it, as
/// llama-server names its own (`b1234-abcdef`).
pub const SYSTEM_FINGERPRINT: &str = concat!("slotgate-", env!("CARGO_PKG_VERSION"));

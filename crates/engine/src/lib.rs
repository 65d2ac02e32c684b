//! slotgate's engine: llama.cpp behind OpenAI endpoints, with `n_parallel` slots per
//! model and continuous batching in one decode loop on one thread.

pub mod config;
pub mod error;
pub mod ids;
pub mod metrics;
pub mod scheduler;
pub mod server;
pub mod template;

pub use config::{Cli, EngineConfig, ModelSettings};
pub use error::EngineError;
pub use scheduler::Scheduler;

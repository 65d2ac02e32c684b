//! slotgate's gateway: one OpenAI address in front of many llama.cpp engines. It
//! sends each request to a healthy backend that serves its model and has a free
//! slot, queues it when none has, and retries elsewhere while nothing has reached
//! the client yet.

pub mod admin;
pub mod affinity;
pub mod auth;
pub mod backend;
pub mod balancer;
pub mod bounded;
pub mod config;
pub mod discovery;
pub mod error;
pub mod hash;
pub mod health;
pub mod ids;
pub mod live;
pub mod load_metrics;
pub mod metrics;
pub mod pool;
pub mod proxy;
pub mod recent;
pub mod retry;
pub mod routes;
pub mod server;
pub mod slot_events;
pub mod spread;
pub mod supervisor;
pub mod target;
pub mod turns;
pub mod ui;
pub mod upstream;
pub mod usage;
pub mod workers;

pub use config::{Cli, GatewayConfig};
pub use error::GatewayError;
pub use server::Gateway;

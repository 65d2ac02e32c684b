//! slotgate's gateway: one OpenAI address in front of many llama.cpp engines. It
//! sends each request to a healthy backend that serves its model and has a free
//! slot, queues it when none has, and retries elsewhere while nothing has reached
//! the client yet.
//!
//! The crate, in the order a request meets it; each folder uses only those
//! after it:
//!
//! - [`serve`]: the process: starting and stopping ([`serve::server`]), the
//!   worker threads that accept clients, the routes, the state they share
//!   ([`serve::app`]), the admin API, the reload and `/ui`.
//! - [`proxy`]: one request forwarded: its body peeked, a slot claimed, the
//!   attempts and their one retry policy, the HTTP client to the backends, the
//!   answer relayed, its usage charged and its metrics recorded.
//! - [`tenancy`]: who is calling: client keys, their limits (shared through
//!   Redis by replicas), the admin key, CORS.
//! - [`fleet`]: the backends: where they are (targets, DNS discovery, supervised
//!   engines), what they can take (health checks, pushed slot state, vLLM load),
//!   and which one a request goes to (the pool and its fair queues, the
//!   balancing policies, affinity).
//! - [`config`]: the settings, read and checked in one place (each section's
//!   type lives beside the code it configures), the part a reload swaps live,
//!   and the error type.
//! - [`metrics`]: the names of what is exported to Prometheus.
//!
//! A request's path: `serve::workers` accepts it, `serve::routes` finds the
//! endpoint and `tenancy` the caller; `proxy::Forwarder` reads and readies the
//! body and admits the caller's key (`proxy::prepare`), asks `fleet::pool` for
//! a slot (waiting in its queue if none is free), sends the body through
//! `proxy::upstream` (`proxy::attempt`) as often as its `proxy::retry::Course`
//! allows, and relays the answer. Every request the gateway makes of a backend,
//! its own health checks and reads included, goes through that one client.

pub mod config;
pub mod fleet;
pub mod metrics;
pub mod proxy;
pub mod serve;
pub mod tenancy;

pub use config::error::GatewayError;
pub use config::{Cli, GatewayConfig};
pub use serve::server::Gateway;

//! The gateway as a process: what starts and stops it, the threads that serve
//! clients, and what they serve (the forwarded API, the admin API, `/ui`).

pub mod admin;
pub mod app;
pub mod reload;
pub mod routes;
pub mod server;
pub mod spread;
pub mod stored;
pub mod ui;
pub mod workers;

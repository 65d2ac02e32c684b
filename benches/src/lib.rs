//! Benchmarks for slotgate and the systems users would pick instead: a load
//! generator that speaks the OpenAI API over HTTP ([`load`]), what it reports
//! ([`stats`]), SVG charts ([`chart`]), result files ([`report`]), the peers a
//! comparison starts ([`peer`]) and wrk as a second opinion ([`wrk`]). Each comparison is a binary under `src/bin`;
//! `scripts/bench` installs what it needs and runs it.

pub mod chart;
pub mod load;
pub mod peer;
pub mod report;
pub mod stats;
pub mod wrk;

pub use chart::Chart;
pub use load::{request, run, Arrival, Bodies, Load, Sample, Target};
pub use peer::{free_port, Peer};
pub use report::{by_target, fixed, ratio, runs_table, Output, Table};
pub use stats::{percentile_ms, Percentiles, Report};

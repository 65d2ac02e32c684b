//! Benchmarks of slotgate.

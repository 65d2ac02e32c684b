//! End-to-end tests that start the real slotgate binaries live in `tests/`.

//! End-to-end tests of the training job on the embedded tiny target (CPU reference backend)
//! and a small JSONL dataset cut from the embedded tiny data: exact resume, worker-count
//! invariance, determinism, non-finite steps, bad input and failures.
//!
//! One test binary (one link on slow machines); every run is a few seconds at most.

mod agreement;
mod bad_input;
mod config;
mod nonfinite;
mod resume;
mod samples;
mod support;
mod workers;

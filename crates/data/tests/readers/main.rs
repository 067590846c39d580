//! Arrow (HF save_to_disk) and JSONL readers on real files written at runtime.

#[path = "../common/mod.rs"]
mod common;

mod arrow;
mod corrupt;
mod jsonl;
mod problems;
mod support;

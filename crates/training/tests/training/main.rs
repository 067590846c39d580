//! Tests of the training crate on the embedded tiny target with a real (small) drafter:
//! the acceptance-length chain against a direct sequential implementation of docs/design.md §2.5,
//! the LR schedule, gradient clipping, non-finite steps and the resumable state.

mod optimizer;
mod packed;
mod replica;
mod support;
mod tau;

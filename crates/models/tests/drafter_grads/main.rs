//! The DFlash drafter's hand-written backward and its loss, checked three independent ways
//! on a tiny random problem (hidden 16, 2 layers, 4 q / 2 kv heads, head_dim 8, MLP 24,
//! vocab 40, block 4, k = 2 target features, S = 11, anchors [2, 3, 9, -1]: two overlapping
//! blocks, one running past the end of the sequence, one padding block):
//!
//! - central finite differences of `Drafter::loss` on a random sample of every tensor;
//! - an independent autodiff oracle (candle-core, CPU, f64) transcribed from docs/design.md
//!   §2.1-2.3 with primitive ops only and a dense mask;
//! - a dense transcription of the §2.3 loss, weights, labels and accuracy.

#[path = "../common/mod.rs"]
mod common;

mod gradients;
mod loss;
mod oracle;
mod spec;
mod support;

//! The whole-drafter-step comparison on the reference backend with the `tiled` attention
//! plugin (FlashAttention-2-style f32 kernel) against the plain reference: runs in CI, so the
//! comparison that every device backend calls is itself exercised on every change.

use dflash_tests::drafter_step::{ALL_PROBLEMS, StepTolerance, drafter_step_matches_reference};
use dflash_tests::reference_with;

#[test]
fn reference_with_tiled_attention_matches_reference() {
    dflash_attention_tiled::link();
    drafter_step_matches_reference(
        reference_with("tiled"),
        "reference + tiled attention",
        &ALL_PROBLEMS,
        &StepTolerance::F32,
    );
}

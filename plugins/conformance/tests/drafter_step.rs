//! Training through a foreign kernel: a whole drafter step (forward, loss, backward, every
//! parameter gradient) on the reference backend with `attention = "plugin:<the C example>"`
//! matches the step with the reference attention, at the bounds every f32 attention kernel is
//! held to (the same comparison `tiled` passes in `tests/tests/drafter_step.rs`).

use dflash_tests::drafter_step::{ALL_PROBLEMS, StepTolerance, drafter_step_matches_reference};
use dflash_tests::reference_with;

#[test]
fn a_drafter_step_through_the_c_plugin_matches_reference() {
    let name = format!("plugin:{}", dflash_plugin_c_attention::LIBRARY);
    drafter_step_matches_reference(
        reference_with(&name),
        "reference + c-attention plugin",
        &ALL_PROBLEMS,
        &StepTolerance::F32,
    );
}

//! The memory plan against what a drafter step really takes on the wgpu backend: its
//! `memory_stats` count each tensor's buffer, rounded up to the pool's size class, and the
//! plan (`DrafterPlan`, with the backend's `allocation_rounding`) must count the same. The
//! shape is chosen so that the rounding matters: the context rows, the block rows and the
//! vocabulary sit just above powers of two, where a size class adds up to an eighth.
//!
//! Tolerance: on lavapipe the plan is within 1% of the measured peak at each batch and with
//! recomputation, and 5-6% below it without the rounding; within 3% passes, and the plan
//! without the rounding must stay more than 4% below (else the shape no longer tests it).
//!
//! One test in its own binary: the device's memory counter is shared by every instance on
//! it, so no other test may allocate while the peak is measured. Skips cleanly without an
//! adapter.

mod common;

use std::sync::Arc;

use dflash_core::{AllocationRounding, Backend};
use dflash_pipeline::HostComm;
use dflash_pipeline::job::memory::{BackendModel, DrafterPlan, MicroShape};
use dflash_tests::step_memory::{StepShape, run_drafter_step, small_drafter};

/// Context rows and blocks of a micro-batch: 1040 x 128 f32 activations are 8 KiB past
/// 2^19 bytes, 33 blocks of 8 rows are 264 rows.
const S: usize = 1040;
const ANCHORS: usize = 33;

#[test]
fn the_plan_counts_the_buffers_a_wgpu_step_takes() {
    let Some(be) = common::wgpu_with("wgpu-tiled", None) else {
        return;
    };
    let b: Arc<dyn Backend> = Arc::new(be);
    let model = BackendModel::of(b.as_ref());
    assert_ne!(
        model.rounding,
        AllocationRounding::Exact,
        "the wgpu pool rounds"
    );
    let cfg = small_drafter(2080);
    let mb = MicroShape {
        ctx_rows: S,
        blocks: ANCHORS,
    };
    let comm = HostComm::group(1).remove(0);
    let mut rows = Vec::new();
    for (batch, recompute) in [(1, false), (2, false), (1, true)] {
        let base = b.memory_stats().unwrap().in_use_bytes;
        let shape = StepShape {
            seq_len: S,
            anchors: ANCHORS,
            batch,
            recompute,
        };
        run_drafter_step(&b, &cfg, shape, &comm, || b.reset_peak_memory());
        let measured = b.memory_stats().unwrap().peak_bytes - base;
        let plan = DrafterPlan::new(&cfg, mb, batch, recompute, &model).peak;
        let exact = BackendModel {
            rounding: AllocationRounding::Exact,
            ..model
        };
        let unrounded = DrafterPlan::new(&cfg, mb, batch, recompute, &exact).peak;
        let (ratio, unrounded_ratio) = (
            plan as f64 / measured as f64,
            unrounded as f64 / measured as f64,
        );
        rows.push(format!(
            "batch {batch}, recompute {recompute}: measured {measured} B; plan {plan} B \
             ({ratio:.3}); without the rounding {unrounded} B ({unrounded_ratio:.3})"
        ));
        println!("{}", rows.last().unwrap());
        assert!(
            (0.97..=1.03).contains(&ratio),
            "plan vs measured:\n{}",
            rows.join("\n")
        );
        assert!(
            unrounded_ratio < 0.96,
            "the shape no longer tests the rounding:\n{}",
            rows.join("\n")
        );
    }
}

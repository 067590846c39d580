//! The memory plan against the memory the reference backend really takes: every byte the
//! process allocates is counted by this binary's global allocator, and one drafter step
//! (micro-batches' forward+backward, then `finish_step`) is measured as `dflash bench` does
//! on a GPU, at batch 1 and 3, recomputation on and off. One test in its own binary, so no
//! other test's allocations run alongside.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::path::Path;

use dflash_config::{DrafterConfig, TrainConfig};
use dflash_core::Backend;
use dflash_core::registry::{BackendOptions, create_backend};
use dflash_pipeline::job::memory::{BackendModel, DrafterPlan, MicroShape};
use dflash_pipeline::{HostComm, train};
use dflash_tests::step_memory::{StepShape, run_drafter_step, small_drafter};

/// Counts live heap bytes and their high-water mark.
struct Counting;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

fn add(n: usize) {
    let live = LIVE.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters move.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        add(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        add(l.size());
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as u64, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        add(new);
        LIVE.fetch_sub(l.size() as u64, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> u64 {
    LIVE.load(Ordering::Relaxed)
}
fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}
fn peak() -> u64 {
    PEAK.load(Ordering::Relaxed)
}

const S: usize = 1024;
const ANCHORS: usize = 64;

fn drafter() -> DrafterConfig {
    small_drafter(2048)
}

/// Bytes one step of `batch` micro-batches takes above what was live before anything of the
/// drafter existed (state, frozen pair, features, activations, workspaces): the measured
/// peak, as the bench's `peak_memory` counts it on a GPU.
fn measure(b: &Arc<dyn Backend>, cfg: &DrafterConfig, batch: usize, recompute: bool) -> u64 {
    let base = live();
    let shape = StepShape {
        seq_len: S,
        anchors: ANCHORS,
        batch,
        recompute,
    };
    let comm = HostComm::group(1).remove(0);
    run_drafter_step(b, cfg, shape, &comm, reset_peak);
    peak() - base
}

#[test]
fn the_plan_is_within_ten_percent_of_the_reference_backends_measured_peak() {
    dflash_backend_reference::link();
    dflash_attention_tiled::link();
    let mut rows = Vec::new();
    for kernel in ["reference", "tiled"] {
        check_kernel(kernel, &mut rows);
    }
    eprintln!("{}", rows.join("\n"));
    // In the same test: nothing else may allocate while a peak is measured.
    check_job();
}

const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");
const TINY_TRAIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-data/train");

/// The whole job (`train`: target worker, queue, drafter replica, checkpoints) on the
/// embedded tiny target, its micro-batches large enough that the plan's terms dominate: the
/// process's heap peak over the run against the plan's device peak.
fn check_job() {
    let runs = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[target]
path = {TARGET:?}
[drafter]
num_layers = 2
block_size = 8
num_target_features = 3
[data]
train = {TINY_TRAIN:?}
max_len = 256
bucket_bounds = [256]
token_budget = 2048
num_anchors = 64
[train]
epochs = 1
max_steps = 6
seed = 7
[backend]
name = "reference"
attention = "reference"
threads = 2
[pipeline]
queue_capacity = 2
[run]
dir = {runs:?}
name = "run"
"#,
        runs = runs.path()
    );
    let cfg = TrainConfig::load_toml_str(&text, "test", Path::new("/"), &[]).unwrap();
    let base = live();
    reset_peak();
    let out = train(&cfg, None).unwrap();
    let measured = peak() - base;
    let plan: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.run_dir.join("memory_plan.json")).unwrap(),
    )
    .unwrap();
    let dev = &plan["devices"][0];
    let planned = dev["peak_bytes"].as_u64().unwrap();
    let target_forward = dev["terms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "target forward")
        .and_then(|t| t["bytes"].as_u64())
        .unwrap_or_else(|| panic!("no target forward term: {plan}"));
    let ratio = planned as f64 / measured as f64;
    eprintln!("job: plan {planned} B, measured {measured} B, ratio {ratio:.3}\n{plan}");
    // The plan adds the concurrent workers' peaks: never below what the run took (2% for
    // host noise such as the reporter's buffers), and within 10% once the target forward's
    // transient is set aside (it meets the drafter's peak only when their timing makes it:
    // measured 1.01 to 1.12 of the run with it).
    assert!(
        planned as f64 >= 0.98 * measured as f64,
        "job plan {planned} below measured {measured}"
    );
    let without_target = planned - target_forward;
    assert!(
        without_target as f64 <= 1.1 * measured as f64,
        "job plan {planned} ({without_target} without the target forward) vs measured {measured}"
    );
}

/// Batch 1 and 3, recomputation off and on, with attention kernel `kernel`.
fn check_kernel(kernel: &str, rows: &mut Vec<String>) {
    let opts = BackendOptions {
        attention: kernel.into(),
        threads: 2,
        device: 0,
    };
    let b = create_backend("reference", &opts).unwrap();
    let cfg = drafter();
    let model = BackendModel::of(b.as_ref());
    if kernel == "reference" {
        assert_eq!(model, BackendModel::reference());
    }
    let mb = MicroShape {
        ctx_rows: S,
        blocks: ANCHORS,
    };
    for (batch, recompute) in [(1, false), (3, false), (1, true), (3, true)] {
        let measured = measure(&b, &cfg, batch, recompute);
        let plan = DrafterPlan::new(&cfg, mb, batch, recompute, &model);
        let ratio = plan.peak as f64 / measured as f64;
        // The step's own part alone (what recomputation and the knobs change), measured as
        // the peak less the resident state, frozen pair and features.
        let resident = 4 * plan.weights + plan.frozen + plan.features;
        let step_plan = plan.activations_kept + plan.working_set;
        let step_ratio = step_plan as f64 / (measured - resident) as f64;
        rows.push(format!(
            "{kernel}: batch {batch}, recompute {recompute}: plan {} B, measured {measured} B, ratio \
             {ratio:.3}; the step's activations and workspaces alone: plan {step_plan} B, \
             ratio {step_ratio:.3}",
            plan.peak,
        ));
        for r in [ratio, step_ratio] {
            assert!(
                (0.9..=1.1).contains(&r),
                "plan vs measured off by more than 10%:\n{}",
                rows.join("\n")
            );
        }
    }
    // Recomputation must be what the plan says it is: a smaller peak.
    let on = DrafterPlan::new(&cfg, mb, 1, true, &model).peak;
    let off = DrafterPlan::new(&cfg, mb, 1, false, &model).peak;
    assert!(on < off, "recompute {on} vs {off}");
}

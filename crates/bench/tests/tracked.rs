//! The memory figures and synchronisation, through a backend that reports memory: a thin
//! wrapper over the reference backend with fixed `memory_stats` and counted calls. Registered
//! as `tracked` too, so that a job runs on it: the job returns every backend's cached memory
//! before it asks for the free memory its plan is checked against.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dflash_bench::{BenchOptions, Orientation, run_suite};
use dflash_core::mask::BlockMask;
use dflash_core::registry::{BackendOptions, create_backend};
use dflash_core::*;

struct Tracked {
    inner: Arc<dyn Backend>,
    /// Which instance: [`UNLOGGED`], or one the registry made for a job.
    id: usize,
    syncs: AtomicUsize,
    resets: AtomicUsize,
}

/// The id of an instance a test made itself, whose memory calls are not logged.
const UNLOGGED: usize = usize::MAX;
/// The memory calls of registry-made instances, in order: (instance, call).
static MEMORY_CALLS: Mutex<Vec<(usize, &'static str)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

impl Tracked {
    fn new(inner: Arc<dyn Backend>, id: usize) -> Self {
        Tracked {
            inner,
            id,
            syncs: AtomicUsize::new(0),
            resets: AtomicUsize::new(0),
        }
    }
    fn log(&self, call: &'static str) {
        if self.id != UNLOGGED {
            MEMORY_CALLS.lock().unwrap().push((self.id, call));
        }
    }
}

fn create_tracked(opts: &registry::BackendOptions) -> Result<Arc<dyn Backend>> {
    let inner = create_backend("reference", opts)?;
    Ok(Arc::new(Tracked::new(
        inner,
        NEXT_ID.fetch_add(1, Ordering::Relaxed),
    )))
}

inventory::submit! {
    registry::BackendRegistration {
        name: "tracked",
        description: "the reference backend with fixed memory figures and logged memory calls",
        create: create_tracked,
        device_count: || 1,
        preferred_attention: "reference",
    }
}

const PEAK: u64 = 3 << 30;

impl BackendInfo for Tracked {
    fn name(&self) -> &'static str {
        "tracked"
    }
    fn device(&self) -> String {
        "test (Fake GPU, sm_00)".into()
    }
    fn attention_kernel(&self) -> &str {
        self.inner.attention_kernel()
    }
    fn synchronize(&self) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn memory_stats(&self) -> Option<MemoryStats> {
        Some(MemoryStats {
            in_use_bytes: 1 << 30,
            peak_bytes: PEAK,
        })
    }
    fn reset_peak_memory(&self) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
    fn release_cached_memory(&self) {
        self.log("release");
    }
    fn memory_capacity(&self) -> Option<MemoryCapacity> {
        self.log("capacity");
        None
    }
}

impl MemoryOps for Tracked {
    fn upload(&self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        self.inner.upload(data, shape)
    }
    fn download(&self, t: &Tensor) -> Result<Vec<f32>> {
        self.inner.download(t)
    }
    fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        self.inner.zeros(shape)
    }
    fn copy(&self, t: &Tensor) -> Result<Tensor> {
        self.inner.copy(t)
    }
    fn narrow_rows(&self, t: &Tensor, start: usize, len: usize) -> Result<Tensor> {
        self.inner.narrow_rows(t, start, len)
    }
    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor> {
        self.inner.concat_rows(parts)
    }
    fn concat_cols(&self, parts: &[&Tensor]) -> Result<Tensor> {
        self.inner.concat_cols(parts)
    }
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.inner.add(a, b)
    }
    fn add_assign(&self, acc: &mut Tensor, x: &Tensor) -> Result<()> {
        self.inner.add_assign(acc, x)
    }
    fn scale_assign(&self, t: &mut Tensor, s: f32) -> Result<()> {
        self.inner.scale_assign(t, s)
    }
    fn sum_squares(&self, t: &Tensor) -> Result<f64> {
        self.inner.sum_squares(t)
    }
    fn all_finite(&self, t: &Tensor) -> Result<bool> {
        self.inner.all_finite(t)
    }
}

impl GemmOps for Tracked {
    fn matmul(&self, a: &Tensor, ta: Transpose, b: &Tensor, tb: Transpose) -> Result<Tensor> {
        self.inner.matmul(a, ta, b, tb)
    }
    fn matmul_acc(
        &self,
        c: &mut Tensor,
        a: &Tensor,
        ta: Transpose,
        b: &Tensor,
        tb: Transpose,
        beta: f32,
    ) -> Result<()> {
        self.inner.matmul_acc(c, a, ta, b, tb, beta)
    }
}

impl NormOps for Tracked {
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
        self.inner.rms_norm(x, w, eps)
    }
    fn rms_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        self.inner.rms_norm_backward(dy, x, w, rstd)
    }
}

impl RopeOps for Tracked {
    fn rope(&self, x: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor> {
        self.inner.rope(x, positions, theta)
    }
    fn rope_backward(&self, dy: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor> {
        self.inner.rope_backward(dy, positions, theta)
    }
}

impl ActivationOps for Tracked {
    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        self.inner.swiglu(gate, up)
    }
    fn swiglu_backward(&self, dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
        self.inner.swiglu_backward(dh, gate, up)
    }
}

impl EmbeddingOps for Tracked {
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        self.inner.embedding(table, ids)
    }
}

impl AttentionOps for Tracked {
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor)> {
        self.inner.attention(q, k, v, mask, scale)
    }
    fn attention_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        self.inner
            .attention_backward(q, k, v, out, lse, d_out, mask, scale)
    }
}

impl LossOps for Tracked {
    fn linear_cross_entropy(
        &self,
        x: &Tensor,
        w_head: &Tensor,
        labels: &[u32],
        weights: &[f32],
        grad_scale: f32,
    ) -> Result<(LossStats, Tensor)> {
        self.inner
            .linear_cross_entropy(x, w_head, labels, weights, grad_scale)
    }
    fn linear_argmax(&self, x: &Tensor, w_head: &Tensor) -> Result<Vec<u32>> {
        self.inner.linear_argmax(x, w_head)
    }
}

impl OptimizerOps for Tracked {
    fn adamw_step(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        hp: &AdamWParams,
    ) -> Result<()> {
        self.inner.adamw_step(param, grad, m, v, hp)
    }
}

impl CollectiveOps for Tracked {
    fn all_reduce_sum(&self, t: &mut Tensor, comm: &dyn Communicator) -> Result<()> {
        self.inner.all_reduce_sum(t, comm)
    }
}

#[test]
fn memory_figures_are_recorded_and_lower_is_better() {
    dflash_backend_reference::link();
    let tracked = Arc::new(Tracked::new(
        create_backend("reference", &BackendOptions::default()).unwrap(),
        UNLOGGED,
    ));
    let opts = BenchOptions {
        only: Some("drafter.step.b1".into()),
        warmup: Some(0),
        runs: Some(2),
        ..BenchOptions::smoke()
    };
    let results = run_suite(tracked.clone(), &opts, |_| {}).unwrap();
    let names: Vec<&str> = results.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["drafter.step.b1.throughput", "drafter.step.b1.peak_memory"]
    );
    let mem = &results[1];
    assert_eq!(mem.orientation, Orientation::LowerIsBetter);
    assert_eq!((mem.value, mem.unit.as_str()), (3.0, "GiB"));
    assert_eq!(mem.ratio, 36.0 / 3.0);
    assert_eq!(mem.device, "test (Fake GPU, sm_00)");
    assert_eq!(dflash_bench::device_slug(&mem.device), "fake-gpu");
    assert_eq!(tracked.resets.load(Ordering::Relaxed), 1);
    // Each step is the job's: its micro-batch's `accumulate` and `finish_step` synchronise
    // once each. Before and after each of the 2 timed runs (2 + 2 each), plus once before the
    // peak reset; one per memory-ledger reading (start, frozen, params, AdamW, grads, rebase,
    // features); and for the phase breakdown, 2 more runs each synchronised before it, after
    // its forward+backward, and its own 2.
    assert_eq!(
        tracked.syncs.load(Ordering::Relaxed),
        2 * 4 + 1 + 7 + 2 * (1 + 1 + 2)
    );
    // ... and the throughput figure's detail reports the job's drafter phases.
    for phase in ["prepare ", "forward+backward ", "all-reduce ", "optimizer "] {
        assert!(
            results[0].detail.contains(phase),
            "{phase:?} missing: {}",
            results[0].detail
        );
    }
    // The peak figure says where its bytes go.
    for part in [
        "frozen embed+LM head",
        "params",
        "grads",
        "AdamW m+v",
        "features",
    ] {
        assert!(
            mem.detail.contains(part),
            "{part:?} missing: {}",
            mem.detail
        );
    }
    assert!(
        mem.detail.contains("activations+workspace"),
        "{}",
        mem.detail
    );
}

/// The repository's root, which the embedded default's paths are relative to.
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// A job's memory plan is checked against each device's free memory after its backends
/// returned what their allocators cached (`release_cached_memory`): memory a bench's earlier
/// figures or a previous job left cached is free to it. On a GPU the order decides whether
/// the checkpoint snapshot fits (session 20's e2e figure); here the calls are logged.
#[test]
fn a_job_releases_cached_memory_before_it_plans_against_free_memory() {
    dflash_backend_reference::link();
    let runs = tempfile::tempdir().unwrap();
    // The embedded default, one small step on the logging backend.
    let overrides: Vec<(String, String)> = [
        ("backend.name", "\"tracked\"".to_string()),
        ("backend.attention", "\"reference\"".into()),
        ("drafter.num_layers", "1".into()),
        ("data.token_budget", "512".into()),
        ("data.num_anchors", "4".into()),
        ("train.max_steps", "1".into()),
        ("eval.max_samples", "2".into()),
        ("run.dir", format!("{:?}", runs.path())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let text = std::fs::read_to_string(format!("{ROOT}/configs/default.toml")).unwrap();
    let cfg = dflash_config::TrainConfig::load_toml_str(
        &text,
        "configs/default.toml",
        std::path::Path::new(ROOT),
        &overrides,
    )
    .unwrap();
    dflash_pipeline::train(&cfg, None).unwrap();
    let calls = MEMORY_CALLS.lock().unwrap().clone();
    let asked: Vec<usize> = calls
        .iter()
        .filter(|(_, c)| *c == "capacity")
        .map(|(id, _)| *id)
        .collect();
    assert!(
        !asked.is_empty(),
        "the plan asked no backend for its memory: {calls:?}"
    );
    for id in asked {
        let first_ask = calls.iter().position(|&c| c == (id, "capacity")).unwrap();
        assert!(
            calls[..first_ask].contains(&(id, "release")),
            "instance {id} was asked for its free memory before it released its cache: {calls:?}"
        );
    }
}

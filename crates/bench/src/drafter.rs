//! One drafter training step of the Qwen3-8B recipe (5 layers, S = 3072, 512 anchors, block
//! 16, k = 5 target features) at batch 1 and 4, through the job's own code: each sequence is
//! a micro-batch (the recipe's token budget holds one 3072-token sequence) prepared by
//! `PreparedBatch` and run by `DrafterReplica::accumulate`, then `DrafterReplica::finish_step`
//! (all-reduce with one replica, global grad norm, clipping and AdamW), exactly as a
//! single-GPU drafter replica of `dflash train` does. Features, weights and the frozen
//! embedding / LM head are random (`MemoryOps::random_normal`). Reports K tok/s (S x batch tokens per step) and, when
//! the backend tracks it, the peak device memory over the steps (everything resident counts:
//! frozen tensors, weights, gradients, AdamW moments, activations).

use std::sync::Arc;
use std::time::Instant;

use dflash_config::{DrafterConfig, DrafterShape, default_gamma};
use dflash_core::pipeline::{Features, HiddenBatch, SeqMeta};
use dflash_models::drafter::FrozenTarget;
use dflash_models::{Drafter, DrafterParams};
use dflash_pipeline::comm::HostComm;
use dflash_pipeline::job::memory::{self, BackendModel, DrafterPlan, MicroShape};
use dflash_training::optimizer::{AdamW, AdamWHyper};
use dflash_training::{BlockSpec, DrafterReplica, PreparedBatch};

use crate::util::SplitMix;
use crate::{BenchError, Result, Scale, Suite, Timing};

const SEED: u64 = 0xD2AF_7E25;
pub const BATCHES: [usize; 2] = [1, 4];
/// `(batch, recompute)` of each measured configuration: the recipe at batch 1 and 4, without
/// and with per-layer activation recomputation (the memory-lean setting).
const RUNS: [(usize, bool); 4] = [(1, false), (4, false), (1, true), (4, true)];
const LR: f64 = 6e-4;
const GRAD_CLIP: f64 = 1.0;
/// The drafter step's phases, as its `detail` times them (the job's drafter phases).
const PHASES: [&str; 4] = ["prepare", "forward+backward", "all-reduce", "optimizer"];
const INIT_STD: f32 = 0.02;

/// `(S, anchors)` per sequence.
pub fn shape(scale: Scale) -> (usize, usize) {
    match scale {
        Scale::Full => (3072, 512),
        Scale::Smoke => (96, 8),
    }
}

fn prefix(batch: usize, recompute: bool) -> String {
    if recompute {
        format!("drafter.step.recompute.b{batch}")
    } else {
        format!("drafter.step.b{batch}")
    }
}
pub(crate) fn throughput_name(batch: usize, recompute: bool) -> String {
    format!("{}.throughput", prefix(batch, recompute))
}
fn memory_name(batch: usize, recompute: bool) -> String {
    format!("{}.peak_memory", prefix(batch, recompute))
}

pub fn figure_names() -> Vec<String> {
    RUNS.iter()
        .flat_map(|&(b, rc)| [throughput_name(b, rc), memory_name(b, rc)])
        .collect()
}

/// The standard recipe's drafter for the target of [`crate::target::config`].
pub fn config(scale: Scale) -> Result<DrafterConfig> {
    let target = crate::target::config(scale);
    let mask = dflash_config::known_mask_token_id(target.vocab_size)
        .unwrap_or(target.vocab_size as u32 - 1);
    Ok(DrafterConfig::for_target(
        &target,
        &DrafterShape::standard(mask),
    )?)
}

/// Random drafter weights drawn on the device: linear weights `N(0, 0.02^2)`, norms 1.
fn random_params(s: &Suite<'_>, cfg: &DrafterConfig) -> Result<DrafterParams> {
    let b = s.b();
    let ts = DrafterParams::layout(cfg)
        .iter()
        .enumerate()
        .map(|(i, (_, shape))| {
            if shape.len() == 1 {
                b.upload(&vec![1.0; shape[0]], shape)
            } else {
                b.random_normal(shape, INIT_STD, SEED + 100 + i as u64)
            }
        })
        .collect::<dflash_core::Result<Vec<_>>>()?;
    Ok(DrafterParams::from_tensors(ts))
}

pub(crate) fn run(s: &mut Suite<'_>) -> Result<()> {
    let names = figure_names();
    if !s.wants_any(&names) {
        return Ok(());
    }
    let mut bench = StepBench::new(s)?;
    for (batch, recompute) in RUNS {
        bench.measure(s, batch, recompute)?;
    }
    Ok(())
}

/// The drafter step's state and inputs, made once and shared by every measured configuration.
struct StepBench {
    backend: Arc<dyn dflash_core::Backend>,
    timing: Timing,
    cfg: DrafterConfig,
    /// Tokens per sequence (S).
    len: usize,
    /// Anchors (blocks) per sequence.
    num_anchors: usize,
    /// Bytes in use after each part of the state was made, before any batch's features.
    ledger: Ledger,
    replica: DrafterReplica,
    comm: HostComm,
    spec: BlockSpec,
    /// One sequence per micro-batch, enough for the largest batch.
    metas: Vec<SeqMeta>,
    /// Host seconds to prepare one micro-batch (anchors, labels, weights).
    prepare_s: f64,
    /// The shapes, for every figure's detail.
    desc: String,
}

impl StepBench {
    /// Makes the drafter replica (frozen target parts, weights, AdamW, gradients), the block
    /// spec and the sequences, and times the host preparation of a micro-batch.
    fn new(s: &Suite<'_>) -> Result<Self> {
        let timing = s.timing(match s.opts.scale {
            Scale::Full => Timing { warmup: 1, runs: 3 },
            Scale::Smoke => Timing { warmup: 1, runs: 3 },
        });
        let cfg = config(s.opts.scale)?;
        let (len, num_anchors) = shape(s.opts.scale);
        // Where the memory goes: the pool's bytes in use after each part is made.
        let mut ledger = Ledger::start(s.b())?;
        let replica = make_replica(s, &cfg, &mut ledger)?;
        let comm = HostComm::group(1).remove(0);
        let spec = BlockSpec {
            block_size: cfg.block_size,
            num_anchors,
            gamma: default_gamma(cfg.block_size) as f32,
            mask_token_id: cfg.mask_token_id,
            seed: SEED,
        };
        let mut rng = SplitMix::new(SEED);
        let metas: Vec<SeqMeta> = (0..BATCHES[1])
            .map(|i| SeqMeta {
                sample_id: i as u64,
                ids: rng.tokens(len, cfg.vocab_size),
                loss_mask: vec![1; len],
            })
            .collect();
        let prepare_s = time_prepare(&metas, &spec);
        let desc = describe_shapes(&cfg, len, num_anchors);
        Ok(StepBench {
            backend: s.backend.clone(),
            timing,
            cfg,
            len,
            num_anchors,
            ledger,
            replica,
            comm,
            spec,
            metas,
            prepare_s,
            desc,
        })
    }

    /// `batch` prepared micro-batches with random features.
    fn make_batches(&self, batch: usize) -> Result<Vec<PreparedBatch>> {
        // One micro-batch per sequence, as the recipe's token budget makes them, with features
        // on the device in the compute format (as the trainer's queue hands them over). One
        // batch's inputs at a time, so a figure's peak memory holds only its own batch's
        // features.
        let b = self.backend.as_ref();
        let (h, k) = (self.cfg.hidden_size, self.cfg.num_target_features());
        (0..batch)
            .map(|i| {
                let feats = b.random_normal(&[self.len, k * h], 1.0, SEED + 10 + i as u64)?;
                let mb = micro_batch(
                    &self.metas,
                    i,
                    Some(Features::Tensor(b.to_compute_format(feats)?)),
                );
                PreparedBatch::packed(mb, &self.spec).ok_or_else(|| BenchError::Invalid {
                    bench: "drafter.step".into(),
                    detail: "a micro-batch without features".into(),
                })
            })
            .collect()
    }

    /// Measures and records the throughput and peak-memory figures of one `(batch, recompute)`
    /// configuration, skipping figures not selected.
    fn measure(&mut self, s: &mut Suite<'_>, batch: usize, recompute: bool) -> Result<()> {
        let (tp, mem) = (
            throughput_name(batch, recompute),
            memory_name(batch, recompute),
        );
        if !s.wants(&tp) && !s.wants(&mem) {
            return Ok(());
        }
        let backend = self.backend.clone();
        let b = backend.as_ref();
        let mut ledger = self.ledger.clone();
        // Workspaces earlier figures left behind (e.g. the loss's) count as workspace.
        let kept = ledger.rebase(b)?;
        let micro = self.make_batches(batch)?;
        ledger.part(b, "features")?;
        if micro.iter().map(|p| p.weight_sum()).sum::<f64>() <= 0.0 {
            return Err(BenchError::Invalid {
                bench: tp,
                detail: "the sampled blocks supervise nothing".into(),
            });
        }
        self.replica.recompute = recompute;
        b.synchronize()?;
        b.reset_peak_memory();
        let t = crate::median_seconds(b, self.timing, || {
            train_step(&mut self.replica, &self.comm, &micro, &mut |_| Ok(())).map(|_| ())
        })?;
        let detail = format!(
            "batch {batch}{}: {}",
            if recompute { ", recompute" } else { "" },
            self.desc
        );
        if s.wants(&tp) {
            let (phases, optimizer_s) = self.time_phases(&micro, batch)?;
            s.optimizer_s.insert(tp.clone(), optimizer_s);
            let with_phases = format!(
                "{detail}; phases (ms, each synchronised; prepare is host work the timed step \
                 reuses): {phases}"
            );
            s.record(&tp, (batch * self.len) as f64 / t / 1e3, t, with_phases)?;
        }
        // Omitted when the backend does not track memory.
        match b.memory_stats().filter(|_| s.wants(&mem)) {
            Some(m) => {
                let gib = m.peak_bytes as f64 / (1u64 << 30) as f64;
                let parts = ledger.describe(m.peak_bytes, kept);
                let vs = self.plan_vs_measured(batch, recompute, m.peak_bytes);
                s.record(&mem, gib, t, format!("{detail}; GiB: {parts}; {vs}"))?;
            }
            None if s.wants(&mem) => s.skip(
                &mem,
                format!("backend {} does not report memory_stats", b.name()),
            ),
            None => {}
        }
        Ok(())
    }

    /// Where the step's time goes: the timed steps again, synchronised after the
    /// forward+backward (finish_step times its own two phases to the device finishing).
    /// Returns `name ms` of each of [`PHASES`], comma-separated, and the optimizer's median
    /// seconds (the part of a step the job pays once, however many micro-batches it has).
    fn time_phases(&mut self, micro: &[PreparedBatch], batch: usize) -> Result<(String, f64)> {
        let b = self.backend.as_ref();
        let mut laps: [Vec<f64>; PHASES.len()] = Default::default();
        for _ in 0..self.timing.runs.max(1) {
            b.synchronize()?;
            let mut t0 = Instant::now();
            let (reduce, optimizer) = train_step(&mut self.replica, &self.comm, micro, &mut |i| {
                b.synchronize()?;
                laps[i].push(t0.elapsed().as_secs_f64());
                t0 = Instant::now();
                Ok(())
            })?;
            laps[0].push(self.prepare_s * batch as f64);
            laps[2].push(reduce);
            laps[3].push(optimizer);
        }
        let optimizer_s = crate::median(&mut laps[3]);
        let phases: Vec<String> = PHASES
            .iter()
            .zip(laps.iter_mut())
            .map(|(name, v)| format!("{name} {:.1}", crate::median(v) * 1e3))
            .collect();
        Ok((phases.join(", "), optimizer_s))
    }

    /// The job's memory plan for this step (from the shapes alone), against the measured
    /// `peak_bytes`.
    fn plan_vs_measured(&self, batch: usize, recompute: bool, peak_bytes: u64) -> String {
        let micro = MicroShape {
            ctx_rows: self.len,
            blocks: self.num_anchors,
        };
        let model = BackendModel::of(self.backend.as_ref());
        let plan = DrafterPlan::new(&self.cfg, micro, batch, recompute, &model);
        format!(
            "memory plan {:.2} GiB, plan / measured {:.3} (plan GiB: state {:.2}, frozen \
             {:.2}, features {:.2}, activations kept {:.2}, working set {:.2})",
            memory::gib(plan.peak),
            plan.peak as f64 / peak_bytes.max(1) as f64,
            memory::gib(4 * plan.weights),
            memory::gib(plan.frozen),
            memory::gib(plan.features),
            memory::gib(plan.activations_kept),
            memory::gib(plan.working_set),
        )
    }
}

/// The job's drafter replica over random weights and a random frozen embedding / LM head,
/// with a ledger part after each piece of its state.
fn make_replica(s: &Suite<'_>, cfg: &DrafterConfig, ledger: &mut Ledger) -> Result<DrafterReplica> {
    let backend = s.backend.clone();
    let b = backend.as_ref();
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let frozen = Arc::new(FrozenTarget::new(
        b.to_compute_format(b.random_normal(&[v, h], INIT_STD, SEED + 1)?)?,
        b.to_compute_format(b.random_normal(&[v, h], INIT_STD, SEED + 2)?)?,
    ));
    ledger.part(b, "frozen embed+LM head")?;
    let params = random_params(s, cfg)?;
    let drafter = Drafter::new(backend.clone(), cfg.clone(), params, frozen)?;
    ledger.part(b, "params")?;
    let hyper = AdamWHyper {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let opt = AdamW::new(b, cfg, hyper)?;
    ledger.part(b, "AdamW m+v")?;
    let replica = DrafterReplica::new(drafter, opt, false, GRAD_CLIP, u64::MAX)?;
    ledger.part(b, "grads")?;
    Ok(replica)
}

/// The drafter's shapes and the block sampling, for the figures' detail.
fn describe_shapes(cfg: &DrafterConfig, len: usize, num_anchors: usize) -> String {
    let (v, h, k) = (cfg.vocab_size, cfg.hidden_size, cfg.num_target_features());
    format!(
        "{} layers, hidden {h}, {}/{} heads, d={}, MLP {}, vocab {v}, k={k}, S={len}, \
         {num_anchors} anchors x {}",
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.block_size
    )
}

/// The `i`th of `metas` as a micro-batch of its own.
fn micro_batch(metas: &[SeqMeta], i: usize, features: Option<Features>) -> HiddenBatch {
    HiddenBatch {
        epoch: 0,
        step: 0,
        micro: i as u32,
        seqs: vec![metas[i].clone()],
        features,
    }
}

/// The host work of preparing one micro-batch (anchors, labels, weights), timed on its own
/// since the timed steps reuse prepared inputs.
fn time_prepare(metas: &[SeqMeta], spec: &BlockSpec) -> f64 {
    let t0 = Instant::now();
    for i in 0..BATCHES[1] {
        let _ = PreparedBatch::packed(
            micro_batch(metas, i, Some(Features::Host(Vec::new()))),
            spec,
        );
    }
    t0.elapsed().as_secs_f64() / BATCHES[1] as f64
}

/// One training step as the job's drafter replica runs it; `mark(1)` after the micro-batches'
/// forward+backward. Returns (all-reduce, optimizer) seconds.
fn train_step(
    replica: &mut DrafterReplica,
    comm: &HostComm,
    micro: &[PreparedBatch],
    mark: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<(f64, f64)> {
    for p in micro {
        replica.accumulate(&p.as_input())?;
    }
    mark(1)?;
    let summary = replica.finish_step(comm, LR)?;
    if !summary.applied {
        return Err(BenchError::Invalid {
            bench: "drafter.step".into(),
            detail: format!("the update was skipped (loss {})", summary.stats.loss()),
        });
    }
    Ok((
        replica.last_times.all_reduce_s,
        replica.last_times.optimizer_s,
    ))
}

/// Bytes in use after each part of the step's state is made (from the backend's memory pool),
/// so the peak-memory figure can say where its bytes go. Empty when the backend does not track
/// memory.
#[derive(Clone)]
struct Ledger {
    last: Option<u64>,
    parts: Vec<(&'static str, u64)>,
}

impl Ledger {
    fn start(b: &dyn dflash_core::Backend) -> Result<Self> {
        b.synchronize()?;
        Ok(Ledger {
            last: b.memory_stats().map(|m| m.in_use_bytes),
            parts: Vec::new(),
        })
    }

    fn part(&mut self, b: &dyn dflash_core::Backend, name: &'static str) -> Result<()> {
        b.synchronize()?;
        if let (Some(last), Some(m)) = (self.last, b.memory_stats()) {
            self.parts.push((name, m.in_use_bytes.saturating_sub(last)));
            self.last = Some(m.in_use_bytes);
        }
        Ok(())
    }

    /// Restarts the count from the bytes in use now; returns what was added since the last
    /// part (workspaces kept from earlier work).
    fn rebase(&mut self, b: &dyn dflash_core::Backend) -> Result<u64> {
        b.synchronize()?;
        let (Some(last), Some(m)) = (self.last, b.memory_stats()) else {
            return Ok(0);
        };
        self.last = Some(m.in_use_bytes);
        Ok(m.in_use_bytes.saturating_sub(last))
    }

    /// `name x.xx, ...`, then what the step added at its peak plus `kept` (activations and
    /// workspaces).
    fn describe(&self, peak: u64, kept: u64) -> String {
        let gib = |x: u64| x as f64 / (1u64 << 30) as f64;
        let mut out: Vec<String> = self
            .parts
            .iter()
            .map(|(n, x)| format!("{n} {:.2}", gib(*x)))
            .collect();
        if let Some(last) = self.last {
            out.push(format!(
                "activations+workspace {:.2}",
                gib(peak.saturating_sub(last) + kept)
            ));
        }
        out.join(", ")
    }
}

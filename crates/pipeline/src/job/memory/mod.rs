//! The job's memory plan: from the shapes alone (drafter and target configs, the schedule's
//! largest micro-batch, the knobs), the bytes each device will hold at its peak, term by term
//! (weights, gradients, AdamW moments, frozen embedding and LM head, target weights, queued
//! features, activations kept, the step's working set with its attention and CE workspaces,
//! backend workspaces). Built after the backends exist (their element sizes and free memory
//! are inputs) and before anything is allocated on them: a job that does not fit is refused
//! with the knobs that shrink it, each with the peak it would give.

mod ledger;
mod model;
mod sim;
mod step;

use std::path::Path;
use std::sync::Arc;

use dflash_config::DrafterConfig;
use dflash_core::{Backend, MemoryCapacity};
use serde::Serialize;

pub use model::{AttentionKind, BackendModel, OpsKind};
pub use step::MicroShape;

use super::plan::JobPlan;
use crate::error::{PipelineError, Result};
use crate::schedule::Schedule;
use ledger::{Ledger, features_in_flight};

/// File name of the plan in the run directory.
pub const MEMORY_PLAN_FILE: &str = "memory_plan.json";

/// Bytes (saturated to u64: no device holds 16 EiB, and a saturated plan does not fit).
fn bytes(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

pub fn gib(x: u64) -> f64 {
    x as f64 / (1u64 << 30) as f64
}

/// `x` in GiB, MiB or KiB, whichever keeps three significant digits (tiny jobs are planned
/// too, and their knobs must read differently).
pub fn human(x: u64) -> String {
    let f = x as f64;
    match x {
        x if x >= 1 << 30 => format!("{:.2} GiB", f / (1u64 << 30) as f64),
        x if x >= 1 << 20 => format!("{:.1} MiB", f / (1u64 << 20) as f64),
        _ => format!("{:.1} KiB", f / 1024.0),
    }
}

/// The largest micro-batch of a schedule: most context rows and most blocks (each
/// document gives at most `num_anchors` blocks, and no more than its length less one since a
/// document's last token is never an anchor). The step's bytes grow with both, so this
/// bounds every micro-batch.
pub fn largest_micro(schedule: &Schedule, lengths: &[usize], num_anchors: usize) -> MicroShape {
    let mut worst = MicroShape {
        ctx_rows: 0,
        blocks: 0,
    };
    for micro in schedule.steps.iter().flat_map(|s| &s.micro) {
        let lens = micro.iter().map(|&i| lengths.get(i).copied().unwrap_or(0));
        worst.ctx_rows = worst.ctx_rows.max(lens.clone().sum());
        worst.blocks = worst
            .blocks
            .max(lens.map(|l| l.saturating_sub(1).min(num_anchors)).sum());
    }
    worst
}

/// The drafter-only part of a plan for one replica on one device, as `dflash bench` measures
/// it: state, frozen embedding and head, `micro_batches` micro-batches' features resident,
/// one step's activations and workspaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DrafterPlan {
    pub weights: u64,
    pub gradients: u64,
    pub adamw: u64,
    pub frozen: u64,
    pub features: u64,
    pub activations_kept: u64,
    pub working_set: u64,
    pub attention_workspace: u64,
    pub ce_workspace: u64,
    pub backend_workspace: u64,
    pub peak: u64,
}

impl DrafterPlan {
    pub fn new(
        cfg: &DrafterConfig,
        mb: MicroShape,
        micro_batches: usize,
        recompute: bool,
        m: &BackendModel,
    ) -> Self {
        let state = step::drafter_state_on(cfg, m);
        let s = step::drafter_step(cfg, mb, recompute, false, m);
        let finish = step::finish_step(cfg, 1, m);
        let kh = cfg.target_layer_ids.len() as u128 * cfg.hidden_size as u128;
        let one_batch = m.tensor_bytes(mb.ctx_rows as u128 * kh * m.compute as u128);
        let features = micro_batches as u128 * one_batch;
        let frozen = 2 * step::frozen_matrix(cfg.vocab_size, cfg.hidden_size, m);
        let working = s.peak.max(finish) - s.kept;
        let backend = m.instance_bytes();
        let peak = 4 * state + frozen + features + s.kept + working + backend;
        DrafterPlan {
            weights: bytes(state),
            gradients: bytes(state),
            adamw: bytes(2 * state),
            frozen: bytes(frozen),
            features: bytes(features),
            activations_kept: bytes(s.kept),
            working_set: bytes(working),
            attention_workspace: bytes(s.attention_ws),
            ce_workspace: bytes(s.ce_ws),
            backend_workspace: bytes(backend),
            peak: bytes(peak),
        }
    }
}

/// One term of a device's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Term {
    pub name: String,
    pub bytes: u64,
}

/// One device's share of the plan.
#[derive(Debug, Clone, Serialize)]
pub struct DevicePlan {
    pub device: String,
    pub model: BackendModel,
    pub target_workers: usize,
    pub drafter_replicas: usize,
    /// Summing to `peak_bytes`.
    pub terms: Vec<Term>,
    /// Within the working set (for the reader; already counted).
    pub attention_workspace_bytes: u64,
    pub ce_workspace_bytes: u64,
    pub peak_bytes: u64,
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// Whether `free_bytes` and `total_bytes` are the host's: the backend reports no device
    /// memory of its own (the reference backend; wgpu on a CPU adapter, an integrated GPU or
    /// an API without a memory query).
    pub host_memory: bool,
    /// The backend's measured peak over the run (`BackendInfo::memory_stats`), once known.
    pub measured_peak_bytes: Option<u64>,
}

/// The whole job's plan.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    /// The largest micro-batch, which every step term is computed for.
    pub micro: MicroShape,
    pub recompute: bool,
    /// Whether checkpoints are written in the background from a device snapshot: only when
    /// the snapshot fits beside everything else; otherwise they are written in place.
    pub background_checkpoints: bool,
    /// Whether the drafter's state is large enough for a background write to pay
    /// (`checkpoint::BACKGROUND_MIN_BYTES`): a small state is written in place whatever the
    /// room, a large one in place only where its snapshot does not fit.
    pub snapshot_wanted: bool,
    pub devices: Vec<DevicePlan>,
}

/// Has every backend return what its allocator caches from earlier work in this process
/// (`BackendInfo::release_cached_memory`), so a plan made next counts it as free: without it a
/// job after a bench's component figures, or after the rate runs of `dflash plan`, finds no
/// room for what those left cached.
pub fn release_caches(backends: &[Arc<dyn Backend>]) {
    for b in backends {
        b.release_cached_memory();
    }
}

/// Where each worker runs: its device name and backend model.
struct Placed {
    device: String,
    model: BackendModel,
}

fn placed(bs: &[Arc<dyn Backend>]) -> Vec<Placed> {
    bs.iter()
        .map(|b| Placed {
            device: b.device(),
            model: BackendModel::of(b.as_ref()),
        })
        .collect()
}

/// The knobs of a job that the plan depends on (the rest comes from the configs).
#[derive(Debug, Clone, Copy)]
struct Knobs {
    micro: MicroShape,
    recompute: bool,
    queue_capacity: usize,
    /// Checkpoints from a device snapshot, written in the background (see `checkpoint.rs`).
    snapshot: bool,
}

impl MemoryPlan {
    /// The plan of `plan` on the backends its workers were placed on (target workers'
    /// `targets`, drafter replicas' `drafters`), with each device's free memory as the
    /// backends report it now: call [`release_caches`] first where earlier work in this
    /// process may have left memory cached.
    pub fn new(
        plan: &JobPlan,
        targets: &[Arc<dyn Backend>],
        drafters: &[Arc<dyn Backend>],
    ) -> Self {
        let knobs = Knobs {
            micro: plan.largest_micro(plan.cfg.data.num_anchors),
            recompute: plan.cfg.train.recompute,
            queue_capacity: plan.cfg.pipeline.queue_capacity.max(1),
            // As the checkpoint writer decides: small states are written in place.
            snapshot: 3 * step::drafter_state(&plan.drafter)
                >= crate::job::checkpoint::BACKGROUND_MIN_BYTES as u128,
        };
        let (t, d) = (placed(targets), placed(drafters));
        let with_capacity = |k: Knobs| {
            let mut p = Self::with_knobs(plan, &t, &d, k);
            let all = targets.iter().chain(drafters);
            for d in &mut p.devices {
                let device_cap = all
                    .clone()
                    .find(|b| b.device() == d.device)
                    .and_then(|b| b.memory_capacity());
                // A backend that does not report device memory keeps tensors in host memory.
                d.host_memory = device_cap.is_none();
                let cap = device_cap.or_else(host_capacity);
                d.free_bytes = cap.map(|c| c.free);
                d.total_bytes = cap.map(|c| c.total);
            }
            p
        };
        Self::snapshot_where_it_fits(knobs, with_capacity)
    }

    /// The plan `plan_with` makes of `knobs` (free memory included) where it fits; where it
    /// does not and it has a checkpoint snapshot, the plan without one (checkpoints then
    /// written in place), which says the snapshot was wanted.
    fn snapshot_where_it_fits(knobs: Knobs, plan_with: impl Fn(Knobs) -> Self) -> Self {
        let p = plan_with(knobs);
        if p.fits() || !knobs.snapshot {
            return p;
        }
        let mut p = plan_with(Knobs {
            snapshot: false,
            ..knobs
        });
        p.snapshot_wanted = true;
        p
    }

    /// Whether every device's peak is within its free memory (where that is known).
    fn fits(&self) -> bool {
        self.devices
            .iter()
            .all(|d| d.free_bytes.is_none_or(|f| d.peak_bytes <= f))
    }

    /// The plan of `plan` with the knobs `k`, its workers placed as `targets` and
    /// `drafters`; free memory is left unknown.
    fn with_knobs(plan: &JobPlan, targets: &[Placed], drafters: &[Placed], k: Knobs) -> Self {
        let in_flight = features_in_flight(plan, targets.len().max(1), drafters.len(), k);
        let mut ledger = Ledger::default();
        ledger.add_targets(plan, targets, k, in_flight);
        let replicas = ledger.add_drafters(plan, targets, drafters, k);
        ledger.add_eval_features(plan, targets, drafters);
        ledger.count_workers(targets, replicas);
        MemoryPlan {
            micro: k.micro,
            recompute: k.recompute,
            background_checkpoints: k.snapshot,
            snapshot_wanted: k.snapshot,
            devices: ledger.into_devices(),
        }
    }

    /// The plan as a table, one block per device.
    pub fn table(&self) -> String {
        let checkpoints = match (self.background_checkpoints, self.snapshot_wanted) {
            (true, _) => "in the background from a device snapshot",
            (false, true) => "in place (no room for a snapshot)",
            (false, false) => "in place (a small state)",
        };
        let mut out = format!(
            "memory plan (largest micro-batch: {} context rows, {} blocks; recompute {}; \
             checkpoints {checkpoints}):",
            self.micro.ctx_rows, self.micro.blocks, self.recompute
        );
        for d in &self.devices {
            let free = match (d.free_bytes, d.total_bytes) {
                (Some(f), Some(t)) => {
                    let whose = if d.host_memory { ", host memory" } else { "" };
                    format!(" of {} free ({} total{whose})", human(f), human(t))
                }
                _ => " (free memory unknown)".into(),
            };
            let rounding = match d.model.rounding {
                dflash_core::AllocationRounding::Exact => "",
                _ => "; each tensor in its buffer's size class",
            };
            out += &format!(
                "\n  {}: peak {}{free}{rounding}",
                d.device,
                human(d.peak_bytes)
            );
            for t in &d.terms {
                out += &format!("\n    {:<28} {:>11}", t.name, human(t.bytes));
            }
            if d.drafter_replicas > 0 {
                out += &format!(
                    "\n    (the working set includes attention workspace {}, CE workspace {})",
                    human(d.attention_workspace_bytes),
                    human(d.ce_workspace_bytes)
                );
            }
        }
        out
    }

    /// Records each device's measured peak where its backend tracks memory; false when none
    /// does.
    pub fn record_measured(&mut self, backends: &[Arc<dyn Backend>]) -> bool {
        let mut any = false;
        for d in &mut self.devices {
            let m = backends
                .iter()
                .filter(|b| b.device() == d.device)
                .find_map(|b| b.memory_stats());
            d.measured_peak_bytes = m.map(|m| m.peak_bytes);
            any |= m.is_some();
        }
        any
    }

    /// `memory: DEVICE planned X GiB, measured Y GiB (plan/measured R)` per measured device.
    pub fn measured_summary(&self) -> String {
        self.devices
            .iter()
            .filter_map(|d| {
                let m = d.measured_peak_bytes?;
                Some(format!(
                    "memory: {} planned {:.2} GiB, measured peak {:.2} GiB (plan / measured {:.3})",
                    d.device,
                    gib(d.peak_bytes),
                    gib(m),
                    d.peak_bytes as f64 / m.max(1) as f64
                ))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Writes the plan to `run_dir/memory_plan.json`.
    pub fn write(&self, run_dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self).expect("the plan serialises");
        dflash_models::safetensors_io::write_atomic(
            &run_dir.join(MEMORY_PLAN_FILE),
            json.as_bytes(),
        )?;
        Ok(())
    }

    /// The first device whose peak exceeds its free memory: an error naming the knobs that
    /// shrink the job, each with the peak that device would then plan.
    pub fn check(
        &self,
        plan: &JobPlan,
        targets: &[Arc<dyn Backend>],
        drafters: &[Arc<dyn Backend>],
    ) -> Result<()> {
        let Some(d) = self
            .devices
            .iter()
            .find(|d| d.free_bytes.is_some_and(|f| d.peak_bytes > f))
        else {
            return Ok(());
        };
        let (t, dr) = (placed(targets), placed(drafters));
        let base = Knobs {
            micro: self.micro,
            recompute: self.recompute,
            queue_capacity: plan.cfg.pipeline.queue_capacity.max(1),
            snapshot: self.background_checkpoints,
        };
        let peak_with = |k: Knobs| {
            Self::with_knobs(plan, &t, &dr, k)
                .devices
                .iter()
                .find(|x| x.device == d.device)
                .map_or(0, |x| x.peak_bytes)
        };
        let mut advice = knob_advice(d, smaller_knobs(plan, base), peak_with);
        if let Some(state) = state_advice(d) {
            advice += &state;
        }
        Err(PipelineError::PlanDoesNotFit {
            device: d.device.clone(),
            peak: d.peak_bytes,
            free: d.free_bytes.unwrap_or(0),
            total: d.total_bytes.unwrap_or(0),
            advice,
        })
    }
}

/// Bytes of the evaluation set's features: f32 in host memory from before training to after
/// it (`tokens x layers x hidden x 4`), on every backend.
pub(super) fn eval_features_bytes(plan: &JobPlan) -> u64 {
    let k = plan.drafter.target_layer_ids.len() as u128;
    let h = plan.target_config.hidden_size as u128;
    bytes(plan.eval_tokens as u128 * k * h * 4)
}

/// The evaluation set's features against the host's free memory (`host`; unknown: nothing
/// checked), whatever the backend: a device backend's plan counts its devices only, and the
/// set alone can exceed the host (2000 samples of 1500 tokens at Qwen3-8B's shape: ~245 GB),
/// which would end the process by the kernel's OOM killer, without a word, after the target
/// has loaded.
pub(in crate::job) fn check_eval_features(
    plan: &JobPlan,
    host: Option<MemoryCapacity>,
) -> Result<()> {
    let need = eval_features_bytes(plan);
    let Some(host) = host.filter(|h| need > h.free) else {
        return Ok(());
    };
    // At the set's mean sample length, about this many samples fit.
    let fit = plan.eval_samples as u128 * host.free as u128 / need as u128;
    let shown = match plan.cfg.eval.max_samples {
        Some(n) => n.to_string(),
        None => "unset: every sample".into(),
    };
    Err(PipelineError::Job(format!(
        "the evaluation set does not fit in host memory: its features ({} samples, {} tokens \
         x {} target layers x hidden size {}, f32, kept for the whole run) take {}, and {} are \
         free ({} total); lower eval.max_samples (now {shown}) to about {fit}, or data.max_len",
        plan.eval_samples,
        plan.eval_tokens,
        plan.drafter.target_layer_ids.len(),
        plan.target_config.hidden_size,
        human(need),
        human(host.free),
        human(host.total),
    )))
}

/// Each knob that lowers a device's peak, set to the next smaller value from `base`: its
/// setting as the config writes it, with the knobs it gives.
fn smaller_knobs(plan: &JobPlan, base: Knobs) -> Vec<(String, Knobs)> {
    let cfg = &plan.cfg;
    let mut options: Vec<(String, Knobs)> = Vec::new();
    if !base.recompute {
        options.push((
            "train.recompute = true".into(),
            Knobs {
                recompute: true,
                ..base
            },
        ));
    }
    let budget = (cfg.data.token_budget / 2).max(cfg.data.max_len);
    if budget < cfg.data.token_budget {
        let micro = plan.micro_with_budget(budget);
        options.push((
            format!("data.token_budget = {budget}"),
            Knobs { micro, ..base },
        ));
    }
    let anchors = cfg.data.num_anchors / 2;
    if anchors > 0 {
        let micro = plan.largest_micro(anchors);
        options.push((
            format!("data.num_anchors = {anchors}"),
            Knobs { micro, ..base },
        ));
    }
    if base.queue_capacity > 1 {
        options.push((
            "pipeline.queue_capacity = 1".into(),
            Knobs {
                queue_capacity: 1,
                ..base
            },
        ));
    }
    options
}

/// The `options` that lower device `d`'s peak (`peak_with` gives its peak with a knob set),
/// each with the peak it would give and what it saves; or, when none does, the knobs tried.
fn knob_advice(
    d: &DevicePlan,
    options: Vec<(String, Knobs)>,
    peak_with: impl Fn(Knobs) -> u64,
) -> String {
    let advice: Vec<String> = options
        .into_iter()
        .map(|(knob, k)| (knob, peak_with(k)))
        .filter(|&(_, p)| p < d.peak_bytes)
        .map(|(knob, p)| {
            let saves = human(d.peak_bytes - p);
            format!("{knob} ({}, saves {saves})", human(p))
        })
        .collect();
    match advice.is_empty() {
        true => "none of train.recompute, data.token_budget, data.num_anchors, \
                 pipeline.queue_capacity"
            .to_string(),
        false => advice.join(", "),
    }
}

/// What no knob of the step changes: the drafter's own state (weights, gradients, AdamW
/// moments). The advice to shrink the drafter or move it when that alone exceeds device
/// `d`'s free memory; `None` otherwise.
fn state_advice(d: &DevicePlan) -> Option<String> {
    let state: u64 = d
        .terms
        .iter()
        .filter(|t| ["drafter weights", "gradients", "AdamW moments"].contains(&t.name.as_str()))
        .map(|t| t.bytes)
        .sum();
    d.free_bytes.is_some_and(|f| state > f).then(|| {
        format!(
            "; but the drafter's weights, gradients and AdamW moments alone take {}: it \
             needs fewer drafter.num_layers or a smaller drafter.intermediate_size, or a \
             larger device",
            human(state)
        )
    })
}

/// Host memory (`dflash_core` reads it for every caller); kept at this path for the plan's
/// callers.
pub use dflash_core::host_capacity;

#[cfg(test)]
mod tests;

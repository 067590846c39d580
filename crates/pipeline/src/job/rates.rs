//! `dflash plan` and `pipeline.placement = "auto"`: the target's and the drafter's rates on
//! this machine, measured with the job's own code on the job's own first steps, and the
//! splits of this machine's devices they lead to, each with its memory plan.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use dflash_config::{Collective, PlacementMode, TrainConfig};
use dflash_core::{Backend, Communicator};
use dflash_training::PreparedBatch;
use serde::Serialize;

use super::build::{build_replicas, load_targets};
use super::memory::{MemoryPlan, human};
use super::plan::JobPlan;
use super::setup::backend_for;
use crate::comm::HostComm;
use crate::error::{PipelineError, Result};
use crate::placement::{Rates, Split, splits};
use crate::workers::{StepSkips, WorkItem, featurise_packed};

/// What the rates were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct RateRun {
    pub device: String,
    /// Steps timed (after one warm-up step when the schedule has more than one).
    pub steps: u64,
    pub tokens: u64,
    pub target_s: f64,
    pub drafter_s: f64,
    pub drafter_params: usize,
}

/// One split of the devices with the memory it needs on each.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedSplit {
    pub split: Split,
    /// `(device, planned peak, free)` per device used.
    pub memory: Vec<(String, u64, Option<u64>)>,
    pub fits: bool,
}

/// `dflash plan`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct PlacementReport {
    pub backend: String,
    /// `pipeline.collective = "device"`: the replicas' gradients stay on the devices.
    pub device_collective: bool,
    pub devices: usize,
    pub rates: Rates,
    pub measured: RateRun,
    /// Best first (see [`splits`]).
    pub splits: Vec<PlannedSplit>,
}

impl PlacementReport {
    /// The best split that fits, if any does.
    pub fn best(&self) -> Option<&PlannedSplit> {
        self.splits.iter().find(|s| s.fits)
    }

    /// What `dflash plan` prints.
    pub fn table(&self) -> String {
        let m = &self.measured;
        let mut out = format!(
            "measured on {} over {} step(s), {} tokens: target {:.0} tok/s ({:.2} s), drafter \
             {:.0} tok/s ({:.2} s, {:.1} M parameters)\n",
            m.device,
            m.steps,
            m.tokens,
            self.rates.target_tok_s,
            m.target_s,
            self.rates.drafter_tok_s,
            m.drafter_s,
            m.drafter_params as f64 / 1e6
        );
        out += &format!(
            "splits of {} {} device(s), best first (a shared device splits its time between \
             target and drafter; the all-reduce between replicas is not counted):\n",
            self.devices, self.backend
        );
        for s in &self.splits {
            let sp = &s.split;
            let memory: Vec<String> = s
                .memory
                .iter()
                .map(|(d, peak, free)| match free {
                    Some(f) => format!("{d} {} of {} free", human(*peak), human(*f)),
                    None => format!("{d} {}", human(*peak)),
                })
                .collect();
            out += &format!(
                "  {:>9.0} tok/s  {} target-only + {} drafter-only + {} shared: {}  [{}]{}\n",
                sp.expected_tok_s,
                sp.target_only,
                sp.drafter_only,
                sp.shared,
                sp.placement.describe(),
                memory.join("; "),
                if s.fits { "" } else { "  DOES NOT FIT" }
            );
        }
        if let Some(best) = self.best() {
            let p = &best.split.placement;
            out += &format!(
                "best that fits: --set pipeline.target_devices='{:?}' --set \
                 pipeline.drafter_devices='{:?}' (or pipeline.placement = \"auto\")",
                p.targets, p.drafters
            );
            if p.drafter_devices_used() > 1 && !self.device_collective {
                out += &format!(
                    "\nnote: {} drafter replicas all-reduce {:.1} M gradient values a step \
                     through host memory (pipeline.collective = \"device\" keeps them on the \
                     GPUs)",
                    p.drafters.len(),
                    m.drafter_params as f64 / 1e6
                );
            }
        } else {
            out += "no split fits this machine's memory (see each device above)";
        }
        out
    }
}

/// Times `steps` steps of the job (after one warm-up step) on device 0: the target worker's
/// featurisation and the drafter replica's forward/backward and update, one after the other,
/// each synchronised, so neither waits on the other.
pub fn measure_rates(plan: &JobPlan, steps: u64) -> Result<(Rates, RateRun)> {
    let b = backend_for(&plan.cfg, 0)?;
    let targets = load_targets(plan, std::slice::from_ref(&b))?;
    let target = targets[0].as_ref();
    let mut replica = build_replicas(plan, std::slice::from_ref(&b), target)?.remove(0);
    let comm = HostComm::group(1).remove(0);
    let skips = Mutex::new(StepSkips::default());
    let total = plan.total_steps();
    let warmup = u64::from(total > 1);
    let end = (warmup + steps.max(1)).min(total);
    let mut run = RateRun {
        device: b.device(),
        steps: end - warmup,
        tokens: 0,
        target_s: 0.0,
        drafter_s: 0.0,
        drafter_params: replica.drafter.params.num_params(),
    };
    for step in 0..end {
        let work = &plan.schedule.steps[step as usize];
        let (mut t_s, mut d_s) = (0.0, 0.0);
        for (m, samples) in work.micro.iter().enumerate() {
            let item = WorkItem {
                epoch: work.epoch,
                step,
                micro: m as u32,
                samples: samples.clone(),
            };
            let t0 = Instant::now();
            let batch =
                featurise_packed(target, plan.train_data.as_ref(), &item, &plan.rules, &skips)?;
            b.synchronize()?;
            t_s += t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            if let Some(p) = PreparedBatch::packed(batch, &plan.spec) {
                replica.accumulate(&p.as_input())?;
            }
            d_s += t1.elapsed().as_secs_f64();
        }
        let t2 = Instant::now();
        replica.finish_step(&comm as &dyn Communicator, plan.lr.lr(step))?;
        d_s += t2.elapsed().as_secs_f64();
        if step >= warmup {
            run.tokens += plan.step_tokens[step as usize];
            run.target_s += t_s;
            run.drafter_s += d_s;
        }
    }
    let rate = |s: f64| run.tokens as f64 / s.max(1e-9);
    let rates = Rates {
        target_tok_s: rate(run.target_s),
        drafter_tok_s: rate(run.drafter_s),
    };
    if !(rates.target_tok_s.is_finite() && rates.drafter_tok_s.is_finite()) || run.tokens == 0 {
        return Err(PipelineError::Job(format!(
            "plan: the measured steps 0..{end} held no tokens; nothing to time"
        )));
    }
    Ok((rates, run))
}

/// Measures the rates, then plans every split of the backend's devices.
pub fn plan_placement(cfg: &TrainConfig, steps: u64) -> Result<PlacementReport> {
    let plan = JobPlan::new(cfg)?;
    let (rates, measured) = measure_rates(&plan, steps)?;
    let devices = dflash_core::registry::device_count(&cfg.backend.name)?.max(1);
    // One backend per device, shared by every split's plan (workers on one device share it).
    let per_device = (0..devices)
        .map(|d| backend_for(cfg, d))
        .collect::<Result<Vec<Arc<dyn Backend>>>>()?;
    let on = |devs: &[usize]| -> Result<Vec<Arc<dyn Backend>>> {
        Ok(devs.iter().map(|&d| per_device[d].clone()).collect())
    };
    // The rate runs above left their memory cached: every split is planned without it.
    super::memory::release_caches(&per_device);
    let splits = splits(devices, &rates)
        .into_iter()
        .map(|split| {
            let (t, d) = (
                on(&split.placement.targets)?,
                on(&split.placement.drafters)?,
            );
            let memory: Vec<_> = MemoryPlan::new(&plan, &t, &d)
                .devices
                .into_iter()
                .map(|d| (d.device, d.peak_bytes, d.free_bytes))
                .collect();
            let fits = memory
                .iter()
                .all(|(_, peak, free)| free.is_none_or(|f| *peak <= f));
            Ok(PlannedSplit {
                split,
                memory,
                fits,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(PlacementReport {
        backend: cfg.backend.name.clone(),
        device_collective: cfg.pipeline.collective == Collective::Device,
        devices,
        rates,
        measured,
        splits,
    })
}

/// `cfg` with `pipeline.placement = "auto"` resolved into device lists by [`plan_placement`]
/// (the run directory's config then holds the lists, so a resume places workers the same
/// way without measuring again); any other config as it is.
pub fn resolve_auto(cfg: &TrainConfig) -> Result<TrainConfig> {
    if cfg.pipeline.placement != PlacementMode::Auto {
        return Ok(cfg.clone());
    }
    let report = plan_placement(cfg, AUTO_STEPS)?;
    eprintln!("pipeline.placement = \"auto\":\n{}", report.table());
    let best = report.best().ok_or_else(|| {
        PipelineError::Job(
            "pipeline.placement = \"auto\": no split of this machine's devices fits the job's \
             memory plan (`dflash plan` prints each)"
                .into(),
        )
    })?;
    let mut out = cfg.clone();
    out.pipeline.placement = PlacementMode::RoundRobin;
    out.pipeline.target_devices = Some(best.split.placement.targets.clone());
    out.pipeline.drafter_devices = Some(best.split.placement.drafters.clone());
    out.pipeline.target_workers = 1;
    out.pipeline.drafter_workers = 1;
    Ok(out)
}

/// Steps `pipeline.placement = "auto"` times before the run.
const AUTO_STEPS: u64 = 2;

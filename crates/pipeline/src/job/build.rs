//! Building a run's workers: backends on the planned devices, the frozen targets, the
//! drafter replicas with identical initial weights and their device collective group, and
//! what a multi-process run asks of its plan.

use std::sync::Arc;
use std::time::Instant;

use dflash_config::Collective;
use dflash_core::Backend;
use dflash_models::checkpoint::load_drafter;
use dflash_models::drafter::FrozenTarget;
use dflash_models::{Drafter, DrafterParams, Qwen3Target};
use dflash_training::{AdamW, DrafterReplica};

use super::plan::{JobPlan, TargetSource};
use super::setup::backend_for;
use crate::distributed::Processes;
use crate::error::{PipelineError, Result};

/// The backends of the target workers and of the drafter replicas.
pub(super) type Placed = (Vec<Arc<dyn Backend>>, Vec<Arc<dyn Backend>>);

/// Backends on the devices of [`JobPlan::placement`]. CPU backends have one device.
/// As one rank of `procs`, on the GPU of its `LOCAL_RANK` unless the config names devices.
pub(super) fn place_workers(plan: &JobPlan, procs: Option<&Processes>) -> Result<Placed> {
    let cfg = &plan.cfg;
    let mut placement = plan.placement()?;
    if let Some(p) = procs {
        let devices = dflash_core::registry::device_count(&cfg.backend.name)?;
        placement = p.local_placement(&cfg.pipeline, placement, devices);
    }
    let on = |devs: &[usize]| {
        devs.iter()
            .map(|&d| backend_for(cfg, d))
            .collect::<Result<Vec<_>>>()
    };
    Ok((on(&placement.targets)?, on(&placement.drafters)?))
}

/// One frozen target per target worker, and how long loading them took.
pub(super) fn load_targets(
    plan: &JobPlan,
    backends: &[Arc<dyn Backend>],
) -> Result<Vec<Arc<Qwen3Target>>> {
    let t0 = Instant::now();
    let ids = &plan.drafter.target_layer_ids;
    let targets = backends
        .iter()
        .map(|b| {
            let t = match &plan.target {
                TargetSource::Dir(dir) => Qwen3Target::load(b.clone(), dir, ids)?,
                TargetSource::Random { config, seed } => {
                    Qwen3Target::random(b.clone(), config.clone(), ids, *seed)?
                }
            };
            Ok(Arc::new(t))
        })
        .collect::<Result<Vec<_>>>()?;
    for b in backends {
        b.synchronize()?;
    }
    let what = match &plan.target {
        TargetSource::Dir(dir) => dir.display().to_string(),
        TargetSource::Random { .. } => "random weights".into(),
    };
    eprintln!(
        "target loaded ({what}, layers 0..={}) on {} worker(s) in {:.1} s",
        ids.iter().max().copied().unwrap_or(0),
        targets.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(targets)
}

/// Replicas with identical initial weights. Each takes the target's frozen embedding and LM
/// head from target worker 0 (shared on the same device, imported otherwise) instead of
/// reading them from disk again.
pub(super) fn build_replicas(
    plan: &JobPlan,
    backends: &[Arc<dyn Backend>],
    target: &Qwen3Target,
) -> Result<Vec<DrafterReplica>> {
    let cfg = &plan.cfg;
    let mut replicas = Vec::with_capacity(backends.len());
    for b in backends {
        let params = match &cfg.drafter.init_from {
            Some(dir) => load_drafter(b.as_ref(), dir)?.1,
            None => DrafterParams::init_random(b.as_ref(), &plan.drafter, 0.02, cfg.train.seed)?,
        };
        // Read-only tensors: a drafter on the target's device shares them as they are.
        let frozen = if b.is_local(target.embedding()) && b.is_local(target.lm_head()) {
            target.frozen().clone()
        } else {
            let frozen = target.frozen();
            let embed = b.import(frozen.embed())?;
            Arc::new(if frozen.is_tied() {
                FrozenTarget::tied(embed)
            } else {
                FrozenTarget::new(embed, b.import(frozen.lm_head())?)
            })
        };
        let drafter = Drafter::new(b.clone(), plan.drafter.clone(), params, frozen)?;
        let opt = AdamW::new(b.as_ref(), &plan.drafter, plan.hyper)?;
        replicas.push(DrafterReplica::new(
            drafter,
            opt,
            cfg.train.recompute,
            cfg.train.grad_clip,
            cfg.train.max_nonfinite_steps,
        )?);
    }
    Ok(replicas)
}

/// With `pipeline.collective = "device"` and more than one replica: one device collective
/// group over the replicas' backends (NCCL on CUDA), each replica its rank.
pub(super) fn attach_device_collective(
    plan: &JobPlan,
    backends: &[Arc<dyn Backend>],
    replicas: &mut [DrafterReplica],
) -> Result<()> {
    if plan.cfg.pipeline.collective != Collective::Device || replicas.len() < 2 {
        return Ok(());
    }
    let why = |e: dflash_core::Error| {
        PipelineError::Job(format!(
            "pipeline.collective = \"device\" with {} drafter replicas on backend {}: {e}",
            backends.len(),
            plan.cfg.backend.name
        ))
    };
    let endpoints = backends
        .iter()
        .map(|b| b.collective_endpoint())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(why)?;
    let members = backends[0].device_collectives(endpoints).map_err(why)?;
    eprintln!(
        "gradients summed on the devices: {}",
        members
            .iter()
            .map(|m| m.describe())
            .collect::<Vec<_>>()
            .join("; ")
    );
    for (r, m) in replicas.iter_mut().zip(members) {
        r.set_device_collective(m);
    }
    Ok(())
}

/// What a multi-process run needs of its plan: one drafter replica a process (the group
/// sums one gradient per rank), and the same job on every rank (recipe and schedule).
pub(super) fn check_process_plan(plan: &JobPlan, p: &Processes) -> Result<()> {
    if plan.drafter_workers != 1 {
        return Err(PipelineError::Job(format!(
            "pipeline.drafter_workers = {} with WORLD_SIZE = {}: a process of a multi-process \
             run trains one drafter replica (start one process per replica)",
            plan.drafter_workers,
            p.world_size()
        )));
    }
    crate::distributed::check_ranks_agree(&p.comm(), &crate::distributed::agreement_record(plan))
}

/// With `pipeline.collective = "device"` across processes: rank 0's backend makes the id of a
/// device group (NCCL's unique id), the processes' own group hands it to every rank, and each
/// process's replica joins it as its rank, so gradients are summed on the devices.
pub(super) fn attach_process_collective(
    plan: &JobPlan,
    p: &Processes,
    backend: &Arc<dyn Backend>,
    replica: &mut DrafterReplica,
) -> Result<()> {
    if plan.cfg.pipeline.collective != Collective::Device {
        return Ok(());
    }
    let why = |e: dflash_core::Error| {
        PipelineError::Job(format!(
            "pipeline.collective = \"device\" across {} processes on backend {}: {e}",
            p.world_size(),
            plan.cfg.backend.name
        ))
    };
    // Every rank reaches the broadcast: rank 0 hands out the id or, failing to make one,
    // an empty id that every rank refuses with rank 0's error in its own log.
    let id = match p.is_lead() {
        true => backend.device_collective_id(),
        false => Ok(Vec::new()),
    };
    let shared = p.broadcast(id.as_deref().unwrap_or_default())?;
    id.map_err(why)?;
    if shared.is_empty() {
        return Err(PipelineError::Job(
            "pipeline.collective = \"device\": rank 0 could not make the device group's id \
             (its error is in rank 0's log)"
                .into(),
        ));
    }
    let member = backend
        .join_device_collective(&shared, p.rank(), p.world_size())
        .map_err(why)?;
    eprintln!("gradients summed on the devices: {}", member.describe());
    replica.set_device_collective(member);
    Ok(())
}

//! Adding up a memory plan's terms, device by device: each target worker's and each drafter
//! replica's bytes on the device it was placed on, and the evaluation set's on the host.

use std::collections::BTreeMap;

use super::{BackendModel, DevicePlan, Knobs, OpsKind, Placed, Term, bytes, step};
use crate::job::JobPlan;

/// Features in flight over the job, with `nt` target workers (at least 1) and `nd`
/// replicas: each queue full, one batch in each replica's step, one finished by each target
/// worker waiting to be queued. No more than the invocation's micro-batches, which a short
/// job bounds first.
pub(super) fn features_in_flight(plan: &JobPlan, nt: usize, nd: usize, k: Knobs) -> usize {
    let steps = usize::try_from(plan.end_step()).unwrap_or(usize::MAX);
    let scheduled: usize = plan
        .schedule
        .steps
        .iter()
        .take(steps)
        .map(|s| s.micro.len())
        .sum();
    (nd * k.queue_capacity + nd + nt).min(scheduled)
}

/// The drafter replicas on one device, with the attention and CE workspaces of their steps
/// (for the breakdown: already within the working set).
#[derive(Default)]
pub(super) struct ReplicaTally {
    count: usize,
    attention_ws: u128,
    ce_ws: u128,
}

/// A plan's devices as their terms are added, keyed by device name.
#[derive(Default)]
pub(super) struct Ledger {
    devices: BTreeMap<String, DevicePlan>,
    /// Per device, in the order first added (the table reads state, then per-step terms).
    terms: BTreeMap<String, Vec<(&'static str, u128)>>,
}

impl Ledger {
    /// Adds `x` bytes to the term `name` of device `dev` (summed with its earlier bytes),
    /// the device planned with the model `m` of the first worker placed there.
    fn add(&mut self, dev: &str, m: BackendModel, name: &'static str, x: u128) {
        self.devices
            .entry(dev.to_string())
            .or_insert_with(|| DevicePlan {
                device: dev.to_string(),
                model: m,
                target_workers: 0,
                drafter_replicas: 0,
                terms: Vec::new(),
                attention_workspace_bytes: 0,
                ce_workspace_bytes: 0,
                peak_bytes: 0,
                free_bytes: None,
                total_bytes: None,
                host_memory: false,
                measured_peak_bytes: None,
            });
        let ts = self.terms.entry(dev.to_string()).or_default();
        match ts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, sum)) => *sum += x,
            None => ts.push((name, x)),
        }
    }

    /// Each target worker's terms on its device: the target's weights, its forward pass,
    /// and its share of the `in_flight` features.
    pub(super) fn add_targets(
        &mut self,
        plan: &JobPlan,
        targets: &[Placed],
        k: Knobs,
        in_flight: usize,
    ) {
        let tcfg = &plan.target_config;
        let ids = &plan.drafter.target_layer_ids;
        let depth = ids.iter().max().map_or(0, |d| d + 1);
        let nt = targets.len().max(1);
        for t in targets {
            let (layers, frozen) = step::target_weights(tcfg, depth, &t.model);
            let (peak, features) = step::target_forward(tcfg, ids, k.micro.ctx_rows, &t.model);
            self.add(&t.device, t.model, "target weights", layers);
            self.add(&t.device, t.model, "frozen embedding + LM head", frozen);
            self.add(&t.device, t.model, "target forward", peak - features);
            self.add(
                &t.device,
                t.model,
                "backend workspaces",
                t.model.instance_bytes(),
            );
            // The features stay on the device of the worker that made them; workers are fed
            // round robin, so each device holds its workers' share (rounded up).
            let share = in_flight.div_ceil(nt) as u128;
            self.add(&t.device, t.model, "features in flight", share * features);
        }
    }

    /// Each drafter replica's terms on its device: its state, the frozen embedding and LM
    /// head where target worker 0 is elsewhere, its step, and replica 0's checkpoint
    /// snapshot. Returns the replicas of each device.
    pub(super) fn add_drafters(
        &mut self,
        plan: &JobPlan,
        targets: &[Placed],
        drafters: &[Placed],
        k: Knobs,
    ) -> BTreeMap<String, ReplicaTally> {
        let (dcfg, tcfg) = (&plan.drafter, &plan.target_config);
        let nd = drafters.len();
        let target0 = targets.first().map(|t| t.device.as_str());
        let mut replicas: BTreeMap<String, ReplicaTally> = BTreeMap::new();
        for d in drafters {
            let m = &d.model;
            let state = step::drafter_state_on(dcfg, m);
            // Features made on another device are copied here for the step.
            let import = targets.iter().any(|t| t.device != d.device);
            let s = step::drafter_step(dcfg, k.micro, k.recompute, import, m);
            let finish = step::finish_step(dcfg, nd, m);
            self.add(&d.device, *m, "drafter weights", state);
            self.add(&d.device, *m, "gradients", state);
            self.add(&d.device, *m, "AdamW moments", 2 * state);
            if target0 != Some(d.device.as_str()) {
                // Shared with target worker 0 on its device, imported anywhere else.
                let frozen = step::frozen_pair(tcfg, m);
                self.add(&d.device, *m, "frozen embedding + LM head", frozen);
            }
            self.add(&d.device, *m, "drafter activations kept", s.kept);
            self.add(
                &d.device,
                *m,
                "drafter step working set",
                s.peak.max(finish) - s.kept,
            );
            self.add(&d.device, *m, "backend workspaces", m.instance_bytes());
            if k.snapshot && std::ptr::eq(d, &drafters[0]) {
                // Replica 0's weights and moments copied for a background checkpoint, alive
                // while the write runs (job/checkpoint.rs).
                self.add(&d.device, *m, "checkpoint snapshot", 3 * state);
            }
            let e = replicas.entry(d.device.clone()).or_default();
            e.count += 1;
            e.attention_ws += s.attention_ws;
            e.ce_ws += s.ce_ws;
        }
        replicas
    }

    /// The featurised evaluation set, f32 in host memory for the whole run: planned on the
    /// first device whose memory is the host's.
    pub(super) fn add_eval_features(
        &mut self,
        plan: &JobPlan,
        targets: &[Placed],
        drafters: &[Placed],
    ) {
        if let Some(h) = targets
            .iter()
            .chain(drafters)
            .find(|p| p.model.ops == OpsKind::Host)
        {
            let eval = super::eval_features_bytes(plan) as u128;
            self.add(&h.device, h.model, "evaluation features", eval);
        }
    }

    /// Sets each device's counts of replicas (with their workspaces) and target workers.
    pub(super) fn count_workers(
        &mut self,
        targets: &[Placed],
        replicas: BTreeMap<String, ReplicaTally>,
    ) {
        for (dev, r) in replicas {
            if let Some(dp) = self.devices.get_mut(&dev) {
                dp.drafter_replicas = r.count;
                dp.attention_workspace_bytes = bytes(r.attention_ws);
                dp.ce_workspace_bytes = bytes(r.ce_ws);
            }
        }
        for t in targets {
            if let Some(dp) = self.devices.get_mut(&t.device) {
                dp.target_workers += 1;
            }
        }
    }

    /// The devices' plans in device order, each with its nonzero terms and its peak: the sum
    /// of all its terms.
    pub(super) fn into_devices(mut self) -> Vec<DevicePlan> {
        self.devices
            .into_values()
            .map(|mut dp| {
                let ts = self.terms.remove(&dp.device).unwrap_or_default();
                dp.peak_bytes = bytes(ts.iter().map(|(_, x)| x).sum());
                dp.terms = ts
                    .into_iter()
                    .filter(|(_, x)| *x > 0)
                    .map(|(n, x)| Term {
                        name: n.to_string(),
                        bytes: bytes(x),
                    })
                    .collect();
                dp
            })
            .collect()
    }
}

//! Where a job's workers run: the device of every target worker and drafter replica, from the
//! config's device lists, round robin, or the best split of measured rates (`dflash plan`).
//!
//! The split model. A target worker turns tokens into features at `Rt` tok/s on a device of
//! its own, a drafter replica trains on them at `Rd` tok/s. With `nt` devices running only
//! targets, `nd` only drafters and `s` hosting both (their time split between the two, as
//! the work comes), the job's rate `X` needs `X / Rt <= nt + a` and `X / Rd <= nd + s - a`
//! for some share `0 <= a <= s`, so
//!
//! ```text
//! X = min((nt + nd + s) / (1/Rt + 1/Rd), (nt + s) Rt, (nd + s) Rd)
//! ```
//!
//! A shared device is assumed to lose nothing to the switching, and the drafters' all-reduce
//! is not counted: both make `X` an upper bound, which the job approaches when the all-reduce
//! is small next to a step.

use serde::Serialize;

/// Devices of the target workers and drafter replicas (an index may repeat).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub targets: Vec<usize>,
    pub drafters: Vec<usize>,
}

impl Placement {
    /// Targets on devices `0..t`, drafters on `t..t+d`, wrapping around when there are fewer
    /// than `t + d` devices (a device then hosts target and drafter work on their own
    /// streams).
    pub fn round_robin(t: usize, d: usize, devices: usize) -> Self {
        let n = devices.max(1);
        Placement {
            targets: (0..t).map(|i| i % n).collect(),
            drafters: (0..d).map(|i| (t + i) % n).collect(),
        }
    }

    /// The first device index that is not below `devices`, with the config field it is in.
    pub fn out_of_range(&self, devices: usize) -> Option<(&'static str, usize)> {
        let bad = |v: &[usize]| v.iter().copied().find(|&d| d >= devices);
        bad(&self.targets)
            .map(|d| ("pipeline.target_devices", d))
            .or_else(|| bad(&self.drafters).map(|d| ("pipeline.drafter_devices", d)))
    }

    /// Devices hosting both a target worker and a drafter replica.
    pub fn shared_devices(&self) -> usize {
        let targets = distinct(&self.targets);
        distinct(&self.drafters)
            .iter()
            .filter(|d| targets.contains(d))
            .count()
    }

    /// Distinct devices used.
    pub fn devices_used(&self) -> usize {
        let all: Vec<usize> = self.targets.iter().chain(&self.drafters).copied().collect();
        distinct(&all).len()
    }

    /// Distinct devices of the drafter replicas (more than one: their all-reduce crosses
    /// devices).
    pub fn drafter_devices_used(&self) -> usize {
        distinct(&self.drafters).len()
    }

    /// The model's rate of this placement (module docs): devices count once however many
    /// workers of one kind they host.
    pub fn expected_tok_s(&self, rates: &Rates) -> f64 {
        let s = self.shared_devices();
        let nt = distinct(&self.targets).len() - s;
        let nd = distinct(&self.drafters).len() - s;
        split_rate(nt as f64, nd as f64, s as f64, rates)
    }

    /// `targets on [0, 1], drafters on [2]`.
    pub fn describe(&self) -> String {
        format!(
            "targets on devices {:?}, drafters on devices {:?}",
            self.targets, self.drafters
        )
    }
}

/// The distinct device indices of `v`, sorted.
fn distinct(v: &[usize]) -> Vec<usize> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// Measured rates of one target worker and one drafter replica, each alone on a device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rates {
    pub target_tok_s: f64,
    pub drafter_tok_s: f64,
}

/// `X` of the module docs for `nt` target-only, `nd` drafter-only and `s` shared devices.
pub fn split_rate(nt: f64, nd: f64, s: f64, r: &Rates) -> f64 {
    let (rt, rd) = (r.target_tok_s, r.drafter_tok_s);
    if nt + s <= 0.0 || nd + s <= 0.0 || rt <= 0.0 || rd <= 0.0 {
        return 0.0;
    }
    let pooled = (nt + nd + s) / (1.0 / rt + 1.0 / rd);
    pooled.min((nt + s) * rt).min((nd + s) * rd)
}

/// One way to split `devices` devices, with its modelled rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Split {
    pub placement: Placement,
    pub target_only: usize,
    pub drafter_only: usize,
    pub shared: usize,
    pub expected_tok_s: f64,
}

/// Every split of `devices` devices into target-only, drafter-only and at most one shared
/// device (one target worker and one drafter replica per device), best first. Among splits
/// within 1% of each other the one with fewer shared devices, then fewer drafter replicas
/// (less all-reduce), comes first: the model counts neither cost.
pub fn splits(devices: usize, rates: &Rates) -> Vec<Split> {
    let g = devices.max(1);
    let mut out = Vec::new();
    for shared in 0..=1usize.min(g) {
        for nt in 0..=(g - shared) {
            let nd = g - shared - nt;
            if nt + shared == 0 || nd + shared == 0 {
                continue;
            }
            // Targets first, then drafters, the shared device last.
            let mut targets: Vec<usize> = (0..nt).collect();
            let mut drafters: Vec<usize> = (nt..nt + nd).collect();
            if shared == 1 {
                targets.push(g - 1);
                drafters.push(g - 1);
            }
            out.push(Split {
                placement: Placement { targets, drafters },
                target_only: nt,
                drafter_only: nd,
                shared,
                expected_tok_s: split_rate(nt as f64, nd as f64, shared as f64, rates),
            });
        }
    }
    let best = out.iter().map(|s| s.expected_tok_s).fold(0.0, f64::max);
    // Near-ties (within 1% of each other) rank by the costs the model leaves out.
    let bucket = |x: f64| ((best - x) / best.max(1e-300) / 0.01).floor() as i64;
    out.sort_by(|a, b| {
        bucket(a.expected_tok_s)
            .cmp(&bucket(b.expected_tok_s))
            .then(a.shared.cmp(&b.shared))
            .then(a.placement.drafters.len().cmp(&b.placement.drafters.len()))
            .then(b.expected_tok_s.total_cmp(&a.expected_tok_s))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(t: f64, d: f64) -> Rates {
        Rates {
            target_tok_s: t,
            drafter_tok_s: d,
        }
    }

    #[test]
    fn one_device_is_shared_and_runs_at_the_harmonic_rate() {
        let r = rates(42.0, 21.0);
        let s = splits(1, &r);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].placement, Placement::round_robin(1, 1, 1));
        assert!((s[0].expected_tok_s - 14.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn the_best_split_balances_the_two_rates() {
        // A target twice as fast as a drafter: of 3 devices, 1 target and 2 drafters make
        // 42 tok/s (both sides saturated).
        let s = splits(3, &rates(42.0, 21.0));
        assert_eq!(
            (s[0].target_only, s[0].drafter_only, s[0].shared),
            (1, 2, 0),
            "{s:?}"
        );
        assert!((s[0].expected_tok_s - 42.0).abs() < 1e-9);
        // 2 devices at the same rates: 1 + 1 gives min(42, 21) = 21; a shared device adds
        // to the drafter side: 1 target-only + 1 shared gives min(2 / (1/42 + 1/21), 84, 21)
        // = 21 as well; 0 + 1 drafter + 1 shared: min(28, 42, 42) = 28.
        let s = splits(2, &rates(42.0, 21.0));
        assert_eq!(
            (s[0].target_only, s[0].drafter_only, s[0].shared),
            (0, 1, 1),
            "{s:?}"
        );
        assert!((s[0].expected_tok_s - 28.0).abs() < 1e-9);
        for w in s.windows(2) {
            assert!(w[0].expected_tok_s >= w[1].expected_tok_s * 0.99, "{s:?}");
        }
    }

    #[test]
    fn near_ties_prefer_no_shared_device() {
        // Equal rates on 2 devices: 1 + 1 gives 10, 0 + 1 + shared gives min(10, 10, 20) =
        // 10 too; the dedicated split wins the tie.
        let s = splits(2, &rates(10.0, 10.0));
        assert_eq!(
            (s[0].shared, s[0].target_only, s[0].drafter_only),
            (0, 1, 1)
        );
    }

    #[test]
    fn a_placement_models_its_own_rate_and_reports_bad_devices() {
        let r = rates(42.0, 21.0);
        let p = Placement {
            targets: vec![0],
            drafters: vec![1, 2],
        };
        assert!((p.expected_tok_s(&r) - 42.0).abs() < 1e-9);
        assert_eq!(p.shared_devices(), 0);
        assert_eq!(p.devices_used(), 3);
        assert_eq!(p.out_of_range(3), None);
        assert_eq!(p.out_of_range(2), Some(("pipeline.drafter_devices", 2)));
        // Two drafter replicas on one device train no faster than one there.
        let p = Placement {
            targets: vec![0],
            drafters: vec![1, 1],
        };
        assert!((p.expected_tok_s(&r) - 21.0).abs() < 1e-9);
        assert_eq!(Placement::round_robin(2, 2, 3).drafters, vec![2, 0]);
    }
}

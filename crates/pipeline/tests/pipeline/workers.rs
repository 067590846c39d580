//! Worker counts, routing and determinism: repeated runs are bit-identical, and 2 + 2 workers
//! or least-loaded routing train as 1 + 1 workers or fixed routing do, to float rounding.

use std::path::Path;

use dflash_pipeline::train;

use crate::support::{
    Fixture, assert_bit_identical, assert_same_records, link, metrics, tensors, tiny_samples,
};

/// 1 target + 1 drafter twice: bit-identical. 2 targets + 2 drafter replicas (micro-batch m
/// of a step on replica m % 2, gradients all-reduced): the same losses up to float rounding
/// (the replicas' gradient sums are grouped differently), and weights that stay close.
#[test]
fn two_plus_two_workers_match_one_plus_one_and_runs_are_deterministic() {
    link();
    let fx = Fixture::new(&tiny_samples(24));
    let common = [
        ("train.micro_batches_per_step", "2"),
        ("train.max_steps", "6"),
    ];
    let run = |name: &str, t: &str, d: &str, q: &str| {
        let ov = [
            &common[..],
            &[
                ("run.name", name),
                ("pipeline.target_workers", t),
                ("pipeline.drafter_workers", d),
                ("pipeline.queue_capacity", q),
            ],
        ]
        .concat();
        train(&fx.config(&ov), None).unwrap()
    };
    let a = run("a11", "1", "1", "2");
    let b = run("b11", "1", "1", "2");
    // Queue capacity 1 forces out-of-order arrival and backpressure with two target workers.
    let c = run("c22", "2", "2", "1");
    let (ma, mb, mc) = (
        metrics(&a.run_dir),
        metrics(&b.run_dir),
        metrics(&c.run_dir),
    );
    assert_eq!(ma.len(), 6);
    assert_same_records(&ma, &mb);
    assert_bit_identical(
        &a.run_dir.join("model.safetensors"),
        &b.run_dir.join("model.safetensors"),
    );

    // 2+2 vs 1+1. Loss statistics travel as f32 sums and gradients are summed per replica
    // and then across replicas, so agreement is to float rounding: 1e-4 relative is ~1000x
    // the rounding seen (<= 3e-7), and far below any real difference (a sample lost or counted twice
    // changes a step's loss by percents).
    assert_eq!(mc.len(), 6);
    // Every worker reports a busy fraction of wall time: one per worker, in (0, 1].
    let last = mc.last().unwrap();
    for (key, n) in [("target_busy", 2), ("drafter_busy", 2)] {
        let v = last[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} missing: {last}"));
        assert_eq!(v.len(), n, "{key}");
        assert!(
            v.iter()
                .all(|x| (0.0..=1.0).contains(&x.as_f64().unwrap()) && x.as_f64().unwrap() > 0.0),
            "{key}: {v:?}"
        );
    }
    // ... and where its time went: every phase of every worker, the working ones non-zero,
    // together no more than the job's wall time.
    for (key, n, names, working) in [
        (
            "target_phases_s",
            2,
            &["wait_work", "target_forward", "push_wait"][..],
            "target_forward",
        ),
        (
            "drafter_phases_s",
            2,
            &[
                "queue_wait",
                "prepare",
                "forward_backward",
                "all_reduce",
                "optimizer",
                "checkpoint",
                "report",
            ][..],
            "forward_backward",
        ),
    ] {
        let workers = last[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} missing: {last}"));
        assert_eq!(workers.len(), n, "{key}");
        for w in workers {
            let w = w.as_object().unwrap();
            let mut got: Vec<&str> = w.keys().map(String::as_str).collect();
            let mut want = names.to_vec();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(got, want, "{key}");
            assert!(w[working].as_f64().unwrap() > 0.0, "{key}: {w:?}");
            let sum: f64 = w.values().map(|x| x.as_f64().unwrap()).sum();
            assert!(
                sum <= last["job_s"].as_f64().unwrap() + 0.5,
                "{key}: {sum} s > job time"
            );
        }
    }
    assert_close_runs(&a.run_dir, &c.run_dir);
}

/// Runs `a` and `c` of one job with different worker counts or routing: the same step
/// records, and losses, grad norms and weights equal to float rounding. Loss statistics
/// travel as f32 sums and gradients are summed per replica and then across replicas, so
/// agreement is to float rounding: 1e-4 relative is ~1000x the rounding seen (<= 3e-7), and
/// far below any real difference (a sample lost or counted twice changes a step's loss by
/// percents).
fn assert_close_runs(a: &Path, c: &Path) {
    let (ma, mc) = (metrics(a), metrics(c));
    assert_eq!(ma.len(), mc.len());
    for (x, y) in ma.iter().zip(&mc) {
        for k in ["step", "epoch", "tokens", "lr"] {
            assert_eq!(x[k], y[k], "{k}");
        }
        let (lx, ly) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
        assert!(
            (lx - ly).abs() <= 1e-4 * lx.abs(),
            "step {}: loss {lx} vs {ly}",
            x["step"]
        );
        let (gx, gy) = (
            x["grad_norm"].as_f64().unwrap(),
            y["grad_norm"].as_f64().unwrap(),
        );
        assert!(
            (gx - gy).abs() <= 1e-4 * gx.abs(),
            "step {}: grad norm {gx} vs {gy}",
            x["step"]
        );
    }
    // Weights: relative L2 distance per tensor (seen: <= 3e-7). AdamW normalises each
    // coordinate, so a coordinate whose gradient is ~0 can move by up to lr per step on
    // rounding alone; the tensors as a whole must still agree closely.
    let (ta, tc) = (
        tensors(&a.join("model.safetensors")),
        tensors(&c.join("model.safetensors")),
    );
    for ((name, va), (_, vc)) in ta.iter().zip(&tc) {
        let diff: f64 = va
            .iter()
            .zip(vc)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let norm: f64 = va.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!(
            diff <= 1e-5 * norm,
            "{name}: |a - c| = {diff:e}, |a| = {norm:e}"
        );
    }
}

/// Least-loaded routing (one shared feature queue, each micro-batch to whichever replica is
/// free) trains as fixed routing does, to float rounding, with 3 micro-batches a step over
/// 2 replicas (uneven shares) and 2 target workers racing to fill the queue.
#[test]
fn least_loaded_routing_matches_fixed_routing() {
    link();
    let fx = Fixture::new(&tiny_samples(24));
    let run = |name: &str, routing: &str, t: &str, d: &str| {
        let routing = format!("\"{routing}\"");
        let ov = [
            ("train.micro_batches_per_step", "3"),
            ("train.max_steps", "5"),
            ("run.name", name),
            ("pipeline.target_workers", t),
            ("pipeline.drafter_workers", d),
            ("pipeline.queue_capacity", "1"),
            ("pipeline.routing", routing.as_str()),
        ];
        train(&fx.config(&ov), None).unwrap()
    };
    let one = run("one", "fixed", "1", "1");
    let fixed = run("fixed", "fixed", "2", "2");
    let shared = run("shared", "least-loaded", "2", "2");
    assert_eq!(metrics(&shared.run_dir).len(), 5);
    assert_close_runs(&one.run_dir, &shared.run_dir);
    assert_close_runs(&fixed.run_dir, &shared.run_dir);
}

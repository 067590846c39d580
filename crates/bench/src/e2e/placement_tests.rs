use std::sync::Arc;

use dflash_core::registry::{self, BackendOptions, create_backend};
use dflash_pipeline::job::{JobPlan, TargetSource};

use super::*;
use crate::{BenchOptions, Suite};

fn create_fake4(opts: &BackendOptions) -> dflash_core::Result<Arc<dyn dflash_core::Backend>> {
    create_backend("reference", opts)
}

// Four devices, so that the round robin a job falls back to without device lists would
// put its drafter on device 1, not on the bench's.
inventory::submit! {
    registry::BackendRegistration {
        name: "bench-fake4",
        description: "the reference backend counted as four devices",
        create: create_fake4,
        device_count: || 4,
        preferred_attention: "reference",
    }
}

fn suite(device: usize, threads: usize) -> Suite<'static> {
    dflash_backend_reference::link();
    let opts = BackendOptions {
        attention: "reference".into(),
        threads,
        device: 0,
    };
    Suite {
        backend: create_backend("reference", &opts).unwrap(),
        opts: BenchOptions {
            device,
            threads,
            ..BenchOptions::smoke()
        },
        on_result: Box::new(|_| {}),
        results: Vec::new(),
        skipped: Vec::new(),
        optimizer_s: Default::default(),
    }
}

/// The placement of `case`'s job as the bench configures it, on `bench-fake4`.
fn placed(s: &Suite<'_>, case: &Case) -> (TrainConfig, dflash_pipeline::placement::Placement) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("train.jsonl");
    write_jsonl(&data, case.seqs, case.lens, case.target.vocab_size).unwrap();
    let mut cfg = job_config(s, case, &data, tmp.path(), 2).unwrap();
    cfg.backend.name = "bench-fake4".into();
    let plan = JobPlan::with_target(
        &cfg,
        TargetSource::Random {
            config: case.target.clone(),
            seed: SEED,
        },
    )
    .unwrap();
    let placement = plan.placement().unwrap();
    (cfg, placement)
}

#[test]
fn one_device_jobs_run_on_the_bench_device_and_threads() {
    let s = suite(3, 1);
    for case in [case_small(Scale::Smoke), case_8b(Scale::Smoke)] {
        let (cfg, p) = placed(&s, &case);
        assert_eq!((p.targets, p.drafters), (vec![3], vec![3]), "{}", case.name);
        assert_eq!(cfg.backend.threads, 1, "{}", case.name);
    }
}

#[test]
fn two_device_jobs_run_on_the_bench_device_and_the_next() {
    let s = suite(2, 0);
    let split = [
        ("pipeline.target_devices", "[2]".to_string()),
        ("pipeline.drafter_devices", "[3]".to_string()),
    ];
    let (_, p) = placed(&s, &case_8b_on_two(Scale::Smoke, E2E_8B_2GPU, &split));
    assert_eq!((p.targets, p.drafters), (vec![2], vec![3]));
}

#[test]
fn overrides_of_backend_or_placement_are_refused() {
    for key in [
        "backend.threads",
        "backend.name",
        "backend",
        "pipeline.target_devices",
        "pipeline.drafter_devices",
        "pipeline",
    ] {
        let err = crate::check_job_overrides(&[(key.into(), "1".into())]).unwrap_err();
        assert!(
            err.to_string().contains("cannot be overridden"),
            "{key}: {err}"
        );
    }
    crate::check_job_overrides(&[("data.num_anchors".into(), "4".into())]).unwrap();
}

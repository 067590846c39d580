//! The whole suite at smoke scale on the reference backend: every figure measured, finite,
//! positive, correctly oriented against its baseline, uniquely named, and the JSON round-trips.

use std::collections::HashSet;

use dflash_bench::{
    BenchOptions, BenchResult, Orientation, Scale, baseline, device_slug, figure_names, read_json,
    run_suite, write_json,
};
use dflash_core::registry::{BackendOptions, create_backend};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

#[test]
fn smoke_suite_on_reference() {
    dflash_backend_reference::link();
    let backend = create_backend("reference", &BackendOptions::default()).unwrap();
    let mut streamed = 0;
    let results = run_suite(backend, &BenchOptions::smoke(), |_| streamed += 1).unwrap();
    assert_eq!(streamed, results.len());

    // Every figure except the memory ones (the reference backend does not track memory) and
    // the two-GPU jobs (it has one device).
    let expected: Vec<String> = figure_names()
        .into_iter()
        .filter(|n| !n.ends_with("peak_memory") && !n.contains(".2gpu"))
        .collect();
    let got: Vec<&str> = results.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(got, expected);
    let unique: HashSet<&str> = got.iter().copied().collect();
    assert_eq!(unique.len(), results.len(), "names are unique");
    // The loss is read against the GEMM measured before it in the same run.
    let loss = results.iter().find(|r| r.name == "loss.ce.8b").unwrap();
    assert!(
        loss.detail.contains("of gemm.compute.8192 in this run"),
        "{}",
        loss.detail
    );
    // The 8B job is priced against its parts measured earlier in the run, the drafter's
    // optimizer once a step.
    let e2e = results.iter().find(|r| r.name == "e2e.8b.1gpu").unwrap();
    assert!(
        e2e.detail.contains("component bound for this data")
            && e2e.detail.contains("drafter forward+backward")
            && e2e.detail.contains("+ optimizer")
            // The smoke drafter's state is far under the size worth a background write.
            && e2e.detail.contains("inside the window, written in place)"),
        "{}",
        e2e.detail
    );

    for r in &results {
        let a = baseline(&r.name).expect("every figure has a baseline");
        assert_eq!(r.scale, Scale::Smoke);
        assert_eq!(r.unit, a.unit);
        assert_eq!(r.baseline, a.value);
        assert_eq!(r.orientation, a.orientation);
        assert_eq!(r.backend, "reference");
        for (what, x) in [
            ("value", r.value),
            ("baseline", r.baseline),
            ("ratio", r.ratio),
            ("seconds", r.seconds),
        ] {
            assert!(x.is_finite() && x > 0.0, "{}: {what} = {x}", r.name);
        }
        let want = match r.orientation {
            Orientation::HigherIsBetter => r.value / r.baseline,
            Orientation::LowerIsBetter => r.baseline / r.value,
        };
        assert!(
            close(r.ratio, want),
            "{}: ratio {} != {want}",
            r.name,
            r.ratio
        );
    }

    let dir = std::env::temp_dir().join(format!("dflash-bench-{}", std::process::id()));
    let path = dir.join("nested/results.json");
    write_json(&path, &results).unwrap();
    let back: Vec<BenchResult> = read_json(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(back.len(), results.len());
    for (a, b) in results.iter().zip(&back) {
        assert_eq!(
            (
                &a.name,
                &a.unit,
                a.scale,
                a.orientation,
                &a.detail,
                &a.device
            ),
            (
                &b.name,
                &b.unit,
                b.scale,
                b.orientation,
                &b.detail,
                &b.device
            )
        );
        for (x, y) in [
            (a.value, b.value),
            (a.baseline, b.baseline),
            (a.ratio, b.ratio),
            (a.seconds, b.seconds),
        ] {
            assert!(close(x, y), "{}: {x} != {y} after the round trip", a.name);
        }
    }
}

#[test]
fn only_selects_by_substring() {
    dflash_backend_reference::link();
    let backend = create_backend("reference", &BackendOptions::default()).unwrap();
    let opts = BenchOptions {
        only: Some("causal.s8192.fwd_bwd".into()),
        runs: Some(1),
        warmup: Some(0),
        ..BenchOptions::smoke()
    };
    let results = run_suite(backend, &opts, |_| {}).unwrap();
    let names: Vec<&str> = results.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["attention.causal.s8192.fwd_bwd"]);
}

/// `--only a,b` runs the figures matching any part, in suite order; a part matching nothing
/// is reported (the CLI refuses it) rather than silently running less than asked.
#[test]
fn only_takes_several_substrings() {
    dflash_backend_reference::link();
    let backend = create_backend("reference", &BackendOptions::default()).unwrap();
    let opts = BenchOptions {
        only: Some("causal.s8192.fwd_bwd, gemm.f32".into()),
        runs: Some(1),
        warmup: Some(0),
        ..BenchOptions::smoke()
    };
    assert!(opts.unmatched_only().is_empty());
    let results = run_suite(backend, &opts, |_| {}).unwrap();
    let names: Vec<&str> = results.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["gemm.f32.8192", "attention.causal.s8192.fwd_bwd"]);
    let typo = BenchOptions {
        only: Some("gemm,atention".into()),
        ..BenchOptions::smoke()
    };
    assert_eq!(typo.unmatched_only(), ["atention"]);
}

/// A baseline measured in the run (`--baselines`) replaces the table's for its figure only.
#[test]
fn baselines_measured_in_the_run_replace_the_tables() {
    dflash_backend_reference::link();
    let backend = create_backend("reference", &BackendOptions::default()).unwrap();
    let opts = BenchOptions {
        only: Some("generate.8b.b64".into()),
        runs: Some(1),
        warmup: Some(0),
        baselines: vec![
            ("generate.8b.b1".into(), 2.5),
            ("generate.8b.b64".into(), 7.0),
        ],
        ..BenchOptions::smoke()
    };
    let results = run_suite(backend, &opts, |_| {}).unwrap();
    let names: Vec<&str> = results.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["generate.8b.b64"]);
    let r = &results[0];
    assert_eq!(r.baseline, 7.0);
    assert!(close(r.ratio, r.value / 7.0), "{r:?}");
    assert!(r.detail.contains("HF generate in this run"), "{}", r.detail);
    assert_ne!(baseline("generate.8b.b64").unwrap().value, 7.0);
}

#[test]
fn device_slugs() {
    assert_eq!(device_slug("cuda:0 (NVIDIA H200, sm_90)"), "nvidia-h200");
    assert_eq!(
        device_slug("NVIDIA H100 80GB HBM3"),
        "nvidia-h100-80gb-hbm3"
    );
    assert_eq!(device_slug("cpu (16 threads, all cores)"), "16-threads");
    assert_eq!(device_slug("()"), "device");
}

/// `--set` reaches the end-to-end job's config: a recipe variant is timed through the job's
/// own code, says so in the detail, and a key the config does not have is refused.
#[test]
fn job_overrides_reach_the_end_to_end_job() {
    dflash_backend_reference::link();
    let backend = create_backend("reference", &BackendOptions::default()).unwrap();
    let opts = BenchOptions {
        only: Some("e2e.small".into()),
        job_overrides: vec![("data.num_anchors".into(), "4".into())],
        ..BenchOptions::smoke()
    };
    let results = run_suite(backend, &opts, |_| {}).unwrap();
    assert_eq!(results.len(), 1);
    let d = &results[0].detail;
    assert!(d.contains(", 4 anchors,"), "{d}");
    assert!(d.contains("recipe overridden: data.num_anchors=4"), "{d}");

    let backend = create_backend("reference", &BackendOptions::default()).unwrap();
    let bad = BenchOptions {
        only: Some("e2e.small".into()),
        job_overrides: vec![("data.no_such_key".into(), "1".into())],
        ..BenchOptions::smoke()
    };
    let err = run_suite(backend, &bad, |_| {}).unwrap_err().to_string();
    assert!(err.contains("no_such_key"), "{err}");

    // A variant that stops before the measured steps is an error, not a figure over nothing.
    let backend = create_backend("reference", &BackendOptions::default()).unwrap();
    let short = BenchOptions {
        only: Some("e2e.small".into()),
        job_overrides: vec![("train.stop_at_step".into(), "1".into())],
        ..BenchOptions::smoke()
    };
    let err = run_suite(backend, &short, |_| {}).unwrap_err().to_string();
    assert!(err.contains("warm-up and at least one measured"), "{err}");
}

/// The attention bench's inputs are the random values themselves (rope at position 0 is the
/// identity) on fresh draws, in the activation dtype: on the reference backend, f32 whose
/// values equal `random_normal`'s bit for bit.
#[test]
fn attention_inputs_are_the_random_values_in_the_activation_dtype() {
    dflash_backend_reference::link();
    let backend = create_backend("reference", &BackendOptions::default()).unwrap();
    let b = backend.as_ref();
    let shape = [5, 3, 16];
    let got = dflash_bench::attention::activation_input(b, &shape, 41).unwrap();
    let want = b.random_normal(&shape, 1.0, 41).unwrap();
    let (got, want) = (b.download(&got).unwrap(), b.download(&want).unwrap());
    assert!(want.iter().any(|&x| x != 0.0));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want));
}

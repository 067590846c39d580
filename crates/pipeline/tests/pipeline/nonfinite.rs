//! Non-finite values: NaN steps are skipped then stop the run keeping a good checkpoint (and
//! the run resumes), and NaN weights in a checkpoint, its optimizer moments, an `init_from`
//! drafter or an evaluated drafter are refused naming the tensor.

use std::path::Path;

use dflash_config::TrainConfig;
use dflash_models::checkpoint::load_drafter;
use dflash_models::safetensors_io::TensorFiles;
use dflash_pipeline::job::latest_checkpoint;
use dflash_pipeline::schedule::Schedule;
use dflash_pipeline::{PipelineError, train};
use dflash_training::TrainError;
use dflash_training::state::OPTIMIZER_STATE;
use serde_json::Value;

use crate::support::{
    Fixture, MAX_LEN, SEED, TARGET, TOKEN_BUDGET, assert_same_records, err_text, link, metrics,
    poison_tensor, rewrite_f32, tensors, tiny_samples,
};

/// The load check is process-wide: tests that switch it off exclude, for that time, the
/// tests that need it on (which hold [`load_check_on`]).
static LOAD_CHECK: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The load check off until the value drops (the check comes back before the lock goes).
fn load_check_off() -> (
    dflash_models::finite::LoadCheckOff,
    std::sync::RwLockWriteGuard<'static, ()>,
) {
    let guard = LOAD_CHECK.write().unwrap_or_else(|p| p.into_inner());
    (dflash_models::finite::LoadCheckOff::new(), guard)
}

/// The load check on while the guard lives.
fn load_check_on() -> std::sync::RwLockReadGuard<'static, ()> {
    LOAD_CHECK.read().unwrap_or_else(|p| p.into_inner())
}

/// A copy of the tiny target whose embedding row `token` is NaN: any sequence containing
/// `token` gets NaN target features from that position on, and so a NaN drafter gradient
/// (the `fc` weight gradient multiplies every feature row), while sequences without it are
/// untouched. This injects a non-finite step exactly where the test wants one, through the
/// real data path. The loader refuses such a target (the NaN policy, tested in
/// dflash-models), so the tests that use it hold a `LoadCheckOff`; finite weights cannot do
/// it (the models' norms absorb even `f32::MAX`).
fn poisoned_target(dir: &Path, token: usize) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        Path::new(TARGET).join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let files = TensorFiles::open(Path::new(TARGET)).unwrap();
    rewrite_f32(files, &dir.join("model.safetensors"), |name, shape, v| {
        let hit = name == "model.embed_tokens.weight";
        if hit {
            let h = shape[1];
            v[token * h..(token + 1) * h].fill(f32::NAN);
        }
        hit
    });
}

/// `dflash eval` on a drafter with a NaN weight is refused at load (it reported a tau), and
/// eval on data with no usable sequence is an error, never `tau=NaN sequences=0`.
#[test]
fn eval_refuses_a_nan_drafter_and_data_with_nothing_to_measure() {
    link();
    let _check = load_check_on();
    let fx = Fixture::new(&tiny_samples(6));
    let cfg = fx.config(&[("train.max_steps", "2")]);
    let out = train(&cfg, None).unwrap();
    let ok = dflash_pipeline::evaluate(&cfg, &out.run_dir, &fx.data()).unwrap();
    assert!(ok.report.tau.is_finite() && ok.report.sequences > 0);

    // No usable sequence: every loss mask zero.
    let none = fx.path().join("none.jsonl");
    let lines: Vec<String> = tiny_samples(3)
        .iter()
        .map(|(ids, _)| {
            serde_json::json!({ "input_ids": ids, "loss_mask": vec![0; ids.len()] }).to_string()
        })
        .collect();
    std::fs::write(&none, lines.join("\n")).unwrap();
    let e = dflash_pipeline::evaluate(&cfg, &out.run_dir, &none)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no usable sequence") && e.contains("3 samples skipped"),
        "{e}"
    );

    poison_tensor(&out.run_dir.join("model.safetensors"), "fc.weight");
    let e = dflash_pipeline::evaluate(&cfg, &out.run_dir, &fx.data())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"fc.weight\"") && e.contains("non-finite"),
        "{e}"
    );
}

/// The NaN policy on a job's own loads: a checkpoint whose `fc.weight` holds a NaN (the
/// issue's reproduction: it resumed, trained and saved a drafter with NaN weights, exit 0),
/// one whose AdamW moment does, and an `init_from` drafter with a NaN are each refused
/// naming tensor and file, before a step; the checkpoint stays the latest.
#[test]
fn a_non_finite_checkpoint_moment_or_init_from_is_refused_naming_the_tensor() {
    link();
    let _check = load_check_on();
    let fx = Fixture::new(&tiny_samples(8));
    let cfg = fx.config(&[
        ("train.max_steps", "4"),
        ("train.save_every", "0"),
        ("train.stop_at_step", "2"),
    ]);
    let out = train(&cfg, None).unwrap();
    let ckpt = latest_checkpoint(&out.run_dir).unwrap();
    assert_eq!(ckpt.file_name().unwrap(), "step-2");
    let resumed = TrainConfig::load(Some(&out.run_dir.join("config.toml")), &[]).unwrap();
    for (file, tensor) in [
        ("model.safetensors", "fc.weight"),
        (OPTIMIZER_STATE, "v.fc.weight"),
    ] {
        let path = ckpt.join(file);
        let good = std::fs::read(&path).unwrap();
        poison_tensor(&path, tensor);
        let e = err_text(&train(&resumed, Some(&out.run_dir)).unwrap_err());
        assert!(
            e.contains(&format!("\"{tensor}\"")) && e.contains(file) && e.contains("non-finite"),
            "{e}"
        );
        assert_eq!(metrics(&out.run_dir).len(), 2, "no step ran");
        assert_eq!(latest_checkpoint(&out.run_dir), Some(ckpt.clone()));
        std::fs::write(&path, good).unwrap();
    }

    poison_tensor(&out.run_dir.join("model.safetensors"), "fc.weight");
    let mut init = fx.config(&[("train.max_steps", "2"), ("run.name", "init")]);
    init.drafter.init_from = Some(out.run_dir.clone());
    let e = err_text(&train(&init, None).unwrap_err());
    assert!(
        e.contains("\"fc.weight\"") && e.contains("non-finite"),
        "{e}"
    );
    assert!(!fx.runs().join("init/model.safetensors").exists());
}

#[test]
fn non_finite_steps_are_skipped_then_stop_the_run_keeping_a_good_checkpoint() {
    link();
    const POISON: u32 = 260; // an unused row of the 264-token vocabulary
    let mut samples = tiny_samples(24);
    // Which samples each step trains on: the schedule is a pure function of lengths and seed.
    let lengths: Vec<usize> = samples.iter().map(|s| s.0.len().min(MAX_LEN)).collect();
    let (schedule, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 2, 1, Some(8));
    assert_eq!(schedule.len(), 8);
    // Steps 0, 1, 3, 7 clean; 2 isolated bad step; 4, 5, 6 consecutive bad steps.
    for step in [2, 4, 5, 6] {
        for &i in schedule.steps[step].micro.iter().flatten() {
            let p0 = samples[i].1.iter().position(|&m| m != 0).unwrap();
            samples[i].0[p0 + 3] = POISON;
        }
    }
    let fx = Fixture::new(&samples);
    let bad_target = fx.path().join("poisoned-target");
    poisoned_target(&bad_target, POISON as usize);
    let ov = [
        ("train.max_steps", "8"),
        ("train.max_nonfinite_steps", "3"),
        ("train.save_every", "2"),
    ];
    let mut cfg = fx.config(&ov);
    cfg.target.path = Some(bad_target);
    let check_off = load_check_off();
    let err = train(&cfg, None).unwrap_err();
    drop(check_off);
    match &err {
        PipelineError::Worker { worker, source } => {
            assert_eq!(worker, "drafter replica 0");
            assert!(
                matches!(
                    **source,
                    PipelineError::Train(TrainError::NonFinite {
                        count: 3,
                        limit: 3,
                        step: 6,
                        ..
                    })
                ),
                "{source:?}"
            );
        }
        other => panic!("expected a worker error, got {other:?}"),
    }
    let run_dir = fx.runs().join("run");
    let text = std::fs::read_to_string(run_dir.join("error.txt")).unwrap();
    assert!(
        text.starts_with("error: drafter replica 0 failed:"),
        "{text}"
    );
    assert!(
        text.contains(
            "3 consecutive steps had a non-finite loss or gradient (limit 3); last at step 6"
        ),
        "{text}"
    );
    assert_eq!(
        text.matches("consecutive steps had a non-finite loss")
            .count(),
        1,
        "error.txt holds the cause chain, each cause once:\n{text}"
    );
    assert!(
        text.contains("the target's features were already non-finite"),
        "the error says where the NaN came from:\n{text}"
    );

    // Steps 0..=5 were reported (step 6 failed before its record); the bad ones skipped.
    let m = metrics(&run_dir);
    let applied: Vec<bool> = m.iter().map(|r| r["applied"].as_bool().unwrap()).collect();
    assert_eq!(applied, [true, true, false, true, false, false]);
    for r in &m {
        let finite = r["loss"].as_f64().is_some_and(f64::is_finite)
            && r["grad_norm"].as_f64().is_some_and(f64::is_finite);
        assert_eq!(finite, r["applied"] == true, "{r}");
    }

    // The last good checkpoint: after step index 5 (save_every 2), AdamW has applied 3
    // updates (steps 0, 1, 3), and two non-finite steps are pending.
    let ckpt = latest_checkpoint(&run_dir).unwrap();
    assert_eq!(ckpt.file_name().unwrap(), "step-6");
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("trainer_state.json")).unwrap())
            .unwrap();
    assert_eq!(state["step"], 6);
    assert_eq!(state["adam_step"], 3);
    assert_eq!(state["nonfinite_run"], 2);
    let b = dflash_core::registry::create_backend("reference", &Default::default()).unwrap();
    let (_, params) = load_drafter(b.as_ref(), &ckpt).unwrap();
    for t in params.tensors() {
        assert!(b.download(t).unwrap().iter().all(|x| x.is_finite()));
    }
    for (name, v) in tensors(&ckpt.join(OPTIMIZER_STATE)) {
        assert!(v.iter().all(|x| x.is_finite()), "{name}");
    }

    // And it resumes: with the healthy target, steps 6 and 7 train and the run completes.
    let good = fx.config(&ov);
    let out = train(&good, Some(&run_dir)).unwrap();
    assert_eq!(out.steps, 8);
    assert!(
        !run_dir.join("error.txt").exists(),
        "a successful resume clears error.txt"
    );
    let m = metrics(&run_dir);
    let steps: Vec<u64> = m.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (0..8).collect::<Vec<_>>(), "one record per step");
    assert!(m[6]["applied"] == true && m[7]["applied"] == true);
}

/// After a failure between checkpoints, the resumed run repeats the steps after the last
/// checkpoint: metrics.jsonl keeps one record per step (the repeated ones identical).
#[test]
fn resume_after_failure_between_checkpoints_keeps_one_record_per_step() {
    link();
    const POISON: u32 = 261;
    let mut samples = tiny_samples(24);
    let lengths: Vec<usize> = samples.iter().map(|s| s.0.len().min(MAX_LEN)).collect();
    let (schedule, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 2, 1, Some(6));
    for &i in schedule.steps[3].micro.iter().flatten() {
        let p0 = samples[i].1.iter().position(|&m| m != 0).unwrap();
        samples[i].0[p0 + 1] = POISON;
    }
    let fx = Fixture::new(&samples);
    let bad_target = fx.path().join("poisoned-target");
    poisoned_target(&bad_target, POISON as usize);
    let ov = [
        ("train.max_nonfinite_steps", "1"),
        ("train.save_every", "2"),
    ];
    let mut cfg = fx.config(&ov);
    cfg.target.path = Some(bad_target);
    let check_off = load_check_off();
    train(&cfg, None).unwrap_err();
    drop(check_off);
    let run_dir = fx.runs().join("run");
    let before = metrics(&run_dir);
    assert_eq!(before.len(), 3, "steps 0..=2 reported, step 3 failed");
    assert_eq!(
        latest_checkpoint(&run_dir).unwrap().file_name().unwrap(),
        "step-2"
    );

    // Resume from step 2 with the healthy target: step 2 runs again.
    train(&fx.config(&ov), Some(&run_dir)).unwrap();
    let after = metrics(&run_dir);
    let steps: Vec<u64> = after.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (0..6).collect::<Vec<_>>());
    assert_same_records(&before, &after[..3]);
}

//! Exact resume: a stopped run resumed matches the uninterrupted run bit for bit, resuming a
//! finished run changes nothing, bad trainer state is refused, and `--resume` on a directory
//! that is no run (or a run without a checkpoint) does the right thing.

use std::path::{Path, PathBuf};

use dflash_config::TrainConfig;
use dflash_pipeline::job::latest_checkpoint;
use dflash_pipeline::train;
use dflash_training::state::OPTIMIZER_STATE;
use serde_json::Value;

use crate::support::{
    Fixture, assert_bit_identical, assert_same_records, config_text, link, metrics, tiny_samples,
};

/// A run stopped after step 7 of 12 (`train.stop_at_step`: the schedule and LR still span 12
/// steps, and step 7 is in the second epoch) and then resumed gives the same per-step metrics,
/// final weights and optimizer state, bit for bit, as the same run done in one go.
#[test]
fn stopped_then_resumed_run_matches_uninterrupted_run_bit_for_bit() {
    link();
    let fx = Fixture::new(&tiny_samples(24));
    let common = [
        ("train.epochs", "3"),
        ("train.max_steps", "12"),
        ("train.micro_batches_per_step", "2"),
        ("train.save_every", "3"),
    ];
    let a = train(
        &fx.config(&[&common[..], &[("run.name", "whole")]].concat()),
        None,
    )
    .unwrap();
    assert_eq!(a.steps, 12);
    let ma = metrics(&a.run_dir);
    assert_eq!(ma.len(), 12);
    assert_eq!(ma[11]["epoch"], 1, "the run crosses an epoch boundary");
    assert!(ma.iter().all(|r| r["applied"] == true));

    let stop = [
        &common[..],
        &[("run.name", "parts"), ("train.stop_at_step", "7")],
    ]
    .concat();
    let b = train(&fx.config(&stop), None).unwrap();
    assert_eq!(b.steps, 7);
    let ckpt = latest_checkpoint(&b.run_dir).unwrap();
    assert_eq!(
        ckpt.file_name().unwrap(),
        "step-7",
        "a checkpoint at the stop, off the save cadence"
    );
    assert_eq!(metrics(&b.run_dir).len(), 7);
    assert_same_records(&ma[..7], &metrics(&b.run_dir));
    let saved = std::fs::read_to_string(b.run_dir.join("config.toml")).unwrap();
    assert!(
        !saved.contains("stop_at_step"),
        "stop_at_step is not kept in the run directory:\n{saved}"
    );

    let zero = TrainConfig::load_toml_str(
        &config_text(&fx.data(), &fx.runs(), ""),
        "test",
        Path::new("/"),
        &[("train.stop_at_step".into(), "0".into())],
    );
    assert!(zero.unwrap_err().to_string().contains("train.stop_at_step"));

    // Resume with the config the run was started with (as `train --resume` does).
    let resumed = TrainConfig::load(Some(&b.run_dir.join("config.toml")), &[]).unwrap();
    let c = train(&resumed, Some(&b.run_dir)).unwrap();
    assert_eq!(c.steps, 12);
    assert_eq!(c.final_loss, a.final_loss);
    assert_same_records(&ma, &metrics(&b.run_dir));
    assert_bit_identical(
        &a.run_dir.join("model.safetensors"),
        &b.run_dir.join("model.safetensors"),
    );
    let (ca, cb) = (
        latest_checkpoint(&a.run_dir).unwrap(),
        latest_checkpoint(&b.run_dir).unwrap(),
    );
    assert_eq!(ca.file_name().unwrap(), "step-12");
    assert_eq!(cb.file_name().unwrap(), "step-12");
    assert_bit_identical(&ca.join(OPTIMIZER_STATE), &cb.join(OPTIMIZER_STATE));
    let state = |d: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("trainer_state.json")).unwrap())
            .unwrap()
    };
    assert_eq!(state(&ca), state(&cb));
    assert_eq!(state(&ca)["adam_step"], 12);

    // Resuming the finished run says so and changes nothing: the same outcome, every file
    // of the run directory byte-identical (summary.json keeps its figures).
    let snapshot = |d: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        let mut dirs = vec![d.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                match e.file_type().unwrap().is_dir() {
                    true => dirs.push(e.path()),
                    false => files.push((e.path(), std::fs::read(e.path()).unwrap())),
                }
            }
        }
        files.sort();
        files
    };
    let before = snapshot(&b.run_dir);
    let again = train(&resumed, Some(&b.run_dir)).unwrap();
    assert_eq!((again.steps, again.final_loss), (12, a.final_loss));
    assert_eq!(again.first_loss, c.first_loss);
    assert!(
        snapshot(&b.run_dir) == before,
        "resuming a finished run changed files"
    );

    // trainer_state.json cross-checks: counters that add up to more steps than were run,
    // and a step beyond the schedule, are errors naming the file.
    let ts = cb.join("trainer_state.json");
    let good = std::fs::read_to_string(&ts).unwrap();
    for (edit, says) in [
        (
            ("adam_step", 13),
            "adam_step 13 + nonfinite_run 0 exceed step 12",
        ),
        (
            ("step", 40),
            "step 40 but the checkpoint directory is step-12",
        ),
    ] {
        let mut v: Value = serde_json::from_str(&good).unwrap();
        v[edit.0] = edit.1.into();
        std::fs::write(&ts, v.to_string()).unwrap();
        let e = train(&resumed, Some(&b.run_dir)).unwrap_err().to_string();
        assert!(e.contains(says) && e.contains("trainer_state.json"), "{e}");
    }
    // A consistent checkpoint at step 40 of a 12-step schedule.
    let ckpts = b.run_dir.join("checkpoints");
    std::fs::rename(&cb, ckpts.join("step-40")).unwrap();
    std::fs::write(ckpts.join("latest"), "step-40").unwrap();
    let e = train(&resumed, Some(&b.run_dir)).unwrap_err().to_string();
    assert!(
        e.contains("step 40 is beyond this run's schedule of 12 steps"),
        "{e}"
    );
}

/// `--resume` on a directory that no run created says so (not what the config then lacks)
/// and writes nothing there; a run killed before its first checkpoint resumes from step 0 in
/// its own directory, with the records and losses of an uninterrupted run.
#[test]
fn resume_of_a_non_run_dir_says_so_and_a_run_without_checkpoint_starts_over() {
    link();
    let fx = Fixture::new(&tiny_samples(12));
    let cfg = fx.config(&[("train.max_steps", "3"), ("train.save_every", "0")]);
    let empty = fx.path().join("not-a-run");
    std::fs::create_dir_all(&empty).unwrap();
    let e = train(&cfg, Some(&empty)).unwrap_err().to_string();
    assert!(e.contains("not a run directory"), "{e}");
    assert!(std::fs::read_dir(&empty).unwrap().next().is_none());

    let a = train(&cfg, None).unwrap();
    let ma = metrics(&a.run_dir);
    std::fs::remove_dir_all(a.run_dir.join("checkpoints")).unwrap();
    std::fs::remove_file(a.run_dir.join("summary.json")).unwrap();
    let again = train(&cfg, Some(&a.run_dir)).unwrap();
    assert_eq!(again.run_dir, a.run_dir);
    assert_eq!((again.steps, again.final_loss), (3, a.final_loss));
    assert_same_records(&ma, &metrics(&a.run_dir));
}

/// A run started from a bf16 drafter (`drafter.init_from`, as every released DFlash drafter
/// is) resumes from its f32 checkpoint, and ends bit for bit where the same run done in one
/// go ends.
#[test]
fn a_run_from_a_bf16_init_from_drafter_resumes() {
    link();
    let fx = Fixture::new(&tiny_samples(12));
    let init = train(
        &fx.config(&[
            ("train.max_steps", "2"),
            ("run.name", "init"),
            ("drafter.save_dtype", "\"bfloat16\""),
        ]),
        None,
    )
    .unwrap();
    let from = |name: &str, extra: &[(&str, &str)]| {
        let mut cfg = fx.config(&[&[("train.max_steps", "4"), ("run.name", name)], extra].concat());
        cfg.drafter.init_from = Some(init.run_dir.clone());
        cfg
    };
    let whole = train(&from("whole", &[]), None).unwrap();
    let parts = train(&from("parts", &[("train.stop_at_step", "2")]), None).unwrap();
    assert_eq!(parts.steps, 2);
    let resumed = TrainConfig::load(Some(&parts.run_dir.join("config.toml")), &[]).unwrap();
    assert_eq!(resumed.drafter.init_from, Some(init.run_dir.clone()));
    let done = train(&resumed, Some(&parts.run_dir)).unwrap();
    assert_eq!((done.steps, done.final_loss), (4, whole.final_loss));
    assert_bit_identical(
        &whole.run_dir.join("model.safetensors"),
        &parts.run_dir.join("model.safetensors"),
    );
}

/// A run stopped at step 2 of 4 (`train.stop_at_step`), in the directory it returned, with
/// the config `train --resume` reuses.
fn stopped_at_step_2(fx: &Fixture) -> (PathBuf, TrainConfig) {
    let cfg = fx.config(&[
        ("train.max_steps", "4"),
        ("train.save_every", "0"),
        ("train.stop_at_step", "2"),
    ]);
    let run = train(&cfg, None).unwrap().run_dir;
    let resumed = TrainConfig::load(Some(&run.join("config.toml")), &[]).unwrap();
    (run, resumed)
}

/// Resuming with a `train.stop_at_step` before the checkpoint's step is an error naming the
/// field, the checkpoint and its step, and trains and writes nothing.
#[test]
fn resuming_with_stop_at_step_before_the_checkpoint_is_an_error() {
    link();
    let fx = Fixture::new(&tiny_samples(12));
    let (run, resumed) = stopped_at_step_2(&fx);
    let summary = std::fs::read(run.join("summary.json")).unwrap();
    let mut early = resumed;
    early.train.stop_at_step = Some(1);
    let e = train(&early, Some(&run)).unwrap_err().to_string();
    assert!(
        e.contains("train.stop_at_step = 1") && e.contains("step-2") && e.contains("step 2"),
        "{e}"
    );
    assert_eq!(metrics(&run).len(), 2, "nothing trained");
    assert!(
        std::fs::read(run.join("summary.json")).unwrap() == summary,
        "nor a summary written"
    );
}

/// A run whose last invocation published the final checkpoint but was killed before it wrote
/// the summary (while saving the drafter or measuring tau) is not taken for finished on the
/// strength of an earlier invocation's `summary.json`: resuming it saves the final drafter and
/// the summary of the final step, training nothing.
#[test]
fn a_run_killed_while_finishing_is_finished_on_resume_without_training() {
    link();
    let fx = Fixture::new(&tiny_samples(12));
    let (run, resumed) = stopped_at_step_2(&fx);
    let read = |f: &str| std::fs::read(run.join(f)).unwrap();
    let (summary_2, model_2) = (read("summary.json"), read("model.safetensors"));

    let done = train(&resumed, Some(&run)).unwrap();
    assert_eq!(done.steps, 4);
    let (summary_4, model_4) = (read("summary.json"), read("model.safetensors"));
    assert_ne!(model_4, model_2);
    let ckpt = latest_checkpoint(&run).unwrap();
    assert_eq!(ckpt.file_name().unwrap(), "step-4");
    let state_4 = std::fs::read(ckpt.join("trainer_state.json")).unwrap();

    // Killed after publishing step-4, before the drafter and summary: the first invocation's
    // files are still there; then the same with no summary at all.
    for kept_summary in [true, false] {
        std::fs::write(run.join("model.safetensors"), &model_2).unwrap();
        match kept_summary {
            true => std::fs::write(run.join("summary.json"), &summary_2).unwrap(),
            false => std::fs::remove_file(run.join("summary.json")).unwrap(),
        }
        let again = train(&resumed, Some(&run)).unwrap();
        assert_eq!((again.steps, again.final_loss), (4, done.final_loss));
        assert_eq!(again.first_loss, done.first_loss);
        assert!(
            read("model.safetensors") == model_4,
            "the final drafter saved"
        );
        // The run's figures of the finished invocation; only this invocation's own differ.
        let run_fields = |bytes: &[u8]| {
            let mut v: Value = serde_json::from_slice(bytes).unwrap();
            let m = v.as_object_mut().unwrap();
            m.retain(|k, _| !k.starts_with("invocation_"));
            v
        };
        let summary = run_fields(&read("summary.json"));
        assert_eq!(summary["steps"], 4);
        assert_eq!(summary, run_fields(&summary_4));
        assert_eq!(metrics(&run).len(), 4, "no step trained again");
        assert_eq!(latest_checkpoint(&run), Some(ckpt.clone()));
        assert_eq!(
            std::fs::read(ckpt.join("trainer_state.json")).unwrap(),
            state_4
        );
    }
    // Now finished: resuming changes nothing.
    let finished = read("summary.json");
    assert_eq!(train(&resumed, Some(&run)).unwrap().steps, 4);
    assert!(read("summary.json") == finished);
}

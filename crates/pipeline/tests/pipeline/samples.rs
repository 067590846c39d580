//! Samples the job cannot train on (beyond the target's positions, empty rows, out of
//! vocabulary, too few supervised tokens, too long) are skipped and counted, and a run left
//! with nothing to train on is an error naming the counts.

use std::path::Path;

use dflash_pipeline::job::JobPlan;
use dflash_pipeline::train;
use serde_json::Value;

use crate::support::{Fixture, MAX_LEN, Samples, TARGET, TINY_TRAIN, link, metrics, tiny_samples};

/// Samples longer than the target's `max_position_embeddings` are skipped and counted, not
/// trained on with positions the target never saw.
#[test]
fn samples_beyond_max_position_embeddings_are_skipped_and_counted() {
    link();
    let samples = tiny_samples(12);
    let longer = samples
        .iter()
        .filter(|s| s.0.len().min(MAX_LEN) > 50)
        .count();
    assert!(longer > 0 && longer < samples.len());
    let fx = Fixture::new(&samples);
    let short = fx.path().join("short-target");
    std::fs::create_dir_all(&short).unwrap();
    let text = std::fs::read_to_string(Path::new(TARGET).join("config.json")).unwrap();
    let mut json: Value = serde_json::from_str(&text).unwrap();
    json["max_position_embeddings"] = 50.into();
    std::fs::write(short.join("config.json"), json.to_string()).unwrap();
    std::fs::copy(
        Path::new(TARGET).join("model.safetensors"),
        short.join("model.safetensors"),
    )
    .unwrap();
    let mut cfg = fx.config(&[("train.epochs", "1")]);
    cfg.target.path = Some(short);
    let out = train(&cfg, None).unwrap();
    assert_eq!(out.skipped_samples, Some(longer as u64));
}

/// Empty rows (an Arrow null row reads as one) are never scheduled, so the run's skip counts
/// never see them: the plan counts them, for the data line to report.
#[test]
fn empty_rows_are_counted_by_the_plan() {
    let mut samples = tiny_samples(6);
    samples.insert(2, (Vec::new(), Vec::new()));
    let fx = Fixture::new(&samples);
    let cfg = fx.config(&[("train.max_steps", "2")]);
    let plan = dflash_pipeline::job::JobPlan::new(&cfg).unwrap();
    assert_eq!(plan.empty_samples, 1);
    // The summary says so next to the counts of the rows that were read (the issue: it said
    // every sample was kept).
    link();
    let out = train(&cfg, None).unwrap();
    assert_eq!(out.empty_rows, 1);
    let text = std::fs::read_to_string(out.run_dir.join("summary.json")).unwrap();
    let summary: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(summary["empty_rows"], 1);
    assert_eq!(
        summary["data"]["seen"], summary["data"]["kept"],
        "{summary}"
    );
}

#[test]
fn training_on_nothing_is_an_error_naming_the_skip_counts() {
    link();
    // Every loss mask zero: every sample is skipped as having too few supervised tokens.
    let samples: Samples = tiny_samples(6)
        .into_iter()
        .map(|(ids, m)| {
            let n = m.len();
            (ids, vec![0; n])
        })
        .collect();
    let fx = Fixture::new(&samples);
    let e = train(&fx.config(&[("train.max_steps", "2")]), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("trained on nothing")
            && e.contains("kept 0/4; skipped 4: 4 too few supervised tokens"),
        "{e}"
    );
    // Resuming such a run trains again from its last checkpoint before the end (step 2) and
    // fails again: it does not find a final checkpoint and finish the run by saving the
    // untrained drafter.
    let cfg = fx.config(&[("train.max_steps", "4"), ("run.name", "resumed")]);
    let e = train(&cfg, None).unwrap_err().to_string();
    assert!(e.contains("trained on nothing"), "{e}");
    let dir = fx.runs().join("resumed");
    for _ in 0..2 {
        let e = train(&cfg, Some(&dir)).unwrap_err().to_string();
        assert!(e.contains("trained on nothing: steps 2..4"), "resumed: {e}");
    }
    assert!(
        !dir.join("model.safetensors").exists(),
        "no untrained drafter is saved by a resume"
    );
    // Kept samples, but a min_supervised no sample reaches.
    let fx = Fixture::new(&tiny_samples(6));
    let cfg = fx.config(&[("train.max_steps", "2"), ("data.min_supervised", "100000")]);
    let e = train(&cfg, None).unwrap_err().to_string();
    assert!(
        e.contains("trained on nothing") && e.contains("kept 0/"),
        "{e}"
    );
    assert!(
        !fx.runs().join("run/model.safetensors").exists(),
        "no untrained drafter is saved as the run's result"
    );
    // Every sample with an id beyond the 264-token vocabulary, or of one token.
    for (name, samples, says) in [
        (
            "oov",
            tiny_samples(6)
                .into_iter()
                .map(|(mut ids, m)| {
                    ids[3] = 300;
                    (ids, m)
                })
                .collect::<Samples>(),
            "position 3, id 300 >= vocab_size 264)",
        ),
        (
            "one-token",
            (0..6).map(|i| (vec![10 + i], vec![1])).collect(),
            "too few supervised tokens",
        ),
    ] {
        let fx = Fixture::new(&samples);
        let e = train(&fx.config(&[("train.max_steps", "2")]), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("trained on nothing") && e.contains("kept 0/") && e.contains(says),
            "{name}: {e}"
        );
    }
}

/// A step whose samples are all skipped changes no weight (its record has no loss); when it
/// is the last, the run's final loss and accuracy are those of the last step that trained.
#[test]
fn a_last_step_without_supervised_tokens_keeps_the_last_trained_loss() {
    link();
    let mut samples = tiny_samples(8);
    let settings = [("train.epochs", "1"), ("train.save_every", "0")];
    let plan = JobPlan::new(&Fixture::new(&samples).config(&settings)).unwrap();
    let steps = &plan.schedule.steps;
    assert!(steps.len() >= 2, "{} steps", steps.len());
    let last: Vec<usize> = steps.last().unwrap().micro.concat();
    for &i in &last {
        samples[i].1.fill(0);
    }
    let fx = Fixture::new(&samples);
    let cfg = fx.config(&settings);
    // Loss masks do not move samples between steps.
    assert_eq!(JobPlan::new(&cfg).unwrap().schedule.steps, *steps);
    let out = train(&cfg, None).unwrap();
    let records = metrics(&out.run_dir);
    let (end, before) = (&records[records.len() - 1], &records[records.len() - 2]);
    assert_eq!(end["applied"], false, "{end}");
    assert!(end["loss"].is_null(), "{end}");
    assert_eq!(before["applied"], true, "{before}");
    assert!(out.final_loss.is_finite(), "final loss {}", out.final_loss);
    assert_eq!(Some(out.final_loss), before["loss"].as_f64());
    assert_eq!(Some(out.final_accuracy), before["accuracy"].as_f64());
    let text = std::fs::read_to_string(out.run_dir.join("summary.json")).unwrap();
    let summary: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        summary["final_loss"].as_f64(),
        Some(out.final_loss),
        "{summary}"
    );
}

fn with_bad_samples() -> (Samples, usize, usize) {
    let mut samples = tiny_samples(24);
    let good = samples[0].clone();
    // Two out-of-vocabulary ids (vocabulary 264).
    for k in [0, 1] {
        let mut s = good.clone();
        s.0[10 + k] = 300 + k as u32;
        samples.push(s);
    }
    // Two with too few supervised tokens: none, and a single one (no anchor possible).
    let mut none = good.clone();
    none.1.fill(0);
    samples.push(none);
    let mut one = good.clone();
    one.1.fill(0);
    one.1[30] = 1;
    samples.push(one);
    // Two longer than max_len (64).
    let data = dflash_data::open_dataset(TINY_TRAIN).unwrap();
    let (too_long, mut long_samples) = (2, Vec::new());
    for i in 100..100 + too_long {
        let s = data.get(i).unwrap();
        let p0 = s.loss_mask.iter().position(|&m| m != 0).unwrap();
        let r = p0 - 20..p0 - 20 + 80;
        long_samples.push((s.ids[r.clone()].to_vec(), s.loss_mask[r].to_vec()));
    }
    samples.extend(long_samples);
    (samples, 4, too_long)
}

#[test]
fn bad_samples_are_skipped_counted_and_training_completes() {
    link();
    let (samples, always_bad, too_long) = with_bad_samples();
    let fx = Fixture::new(&samples);
    // One epoch, no step limit: every sample is seen exactly once.
    let base = [("train.epochs", "1"), ("train.save_every", "0")];
    let summary = |name: &str| -> Value {
        let p = fx.runs().join(name).join("summary.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };

    let skip = train(
        &fx.config(
            &[
                &base[..],
                &[
                    ("train.max_steps", "1000"),
                    ("data.too_long", "skip"),
                    ("run.name", "skip"),
                ],
            ]
            .concat(),
        ),
        None,
    )
    .unwrap();
    assert_eq!(skip.skipped_samples, Some((always_bad + too_long) as u64));
    assert_eq!(
        summary("skip")["skipped_samples"],
        (always_bad + too_long) as u64
    );
    assert!(skip.steps > 0 && skip.final_loss.is_finite());
    assert!(skip.run_dir.join("model.safetensors").exists());

    // Truncation keeps the long samples (counted as truncated, not skipped).
    let trunc = train(
        &fx.config(
            &[
                &base[..],
                &[
                    ("train.max_steps", "1000"),
                    ("data.too_long", "truncate"),
                    ("run.name", "trunc"),
                ],
            ]
            .concat(),
        ),
        None,
    )
    .unwrap();
    assert_eq!(trunc.skipped_samples, Some(always_bad as u64));
    assert_eq!(summary("trunc")["skipped_samples"], always_bad as u64);
}

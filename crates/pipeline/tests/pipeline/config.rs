//! Config semantics the job must honour: `target_layer_ids` alone, `epochs = 0` with
//! `max_steps`, and `save_dtype` of the served drafter.

use std::path::Path;

use dflash_config::TrainConfig;
use dflash_pipeline::schedule::Schedule;
use dflash_pipeline::train;
use serde_json::Value;

use crate::support::{
    Fixture, MAX_LEN, SEED, TOKEN_BUDGET, config_from, config_text, link, metrics, tensors,
    tiny_samples,
};

/// `drafter.target_layer_ids` alone: `num_target_features` defaults to their count.
#[test]
fn target_layer_ids_alone_define_the_number_of_features() {
    link();
    let fx = Fixture::new(&tiny_samples(8));
    let cfg = config_from(
        &config_text(&fx.data(), &fx.runs(), "target_layer_ids = [2, 6]"),
        &[("train.max_steps", "2")],
    );
    let out = train(&cfg, None).unwrap();
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(out.run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(
        saved["dflash_config"]["target_layer_ids"],
        serde_json::json!([2, 6])
    );
}

/// `train.epochs = 0` with `train.max_steps` (which the config accepts): as many epochs as
/// the step count needs.
#[test]
fn zero_epochs_with_max_steps_runs_max_steps() {
    let lengths = vec![50usize; 10]; // 5 batches of 2 per epoch
    let (s, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 0, 1, Some(12));
    assert_eq!(s.len(), 12);
    assert_eq!(s.steps[4].epoch, 0);
    assert_eq!(s.steps[5].epoch, 1);
    assert_eq!(s.steps[11].epoch, 2);
    // Epoch-bounded schedules are unchanged: 2 epochs of 5, then truncated.
    let (two, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 2, 1, None);
    assert_eq!(two.len(), 10);
    let (cut, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 2, 1, Some(7));
    assert_eq!(cut.steps, two.steps[..7]);
    let (none, _) = Schedule::new(&[], &[MAX_LEN], TOKEN_BUDGET, SEED, 0, 1, Some(5));
    assert!(
        none.is_empty(),
        "an empty dataset plans nothing (and does not loop)"
    );

    link();
    let fx = Fixture::new(&tiny_samples(6));
    let out = train(
        &fx.config(&[("train.epochs", "0"), ("train.max_steps", "5")]),
        None,
    )
    .unwrap();
    assert_eq!(out.steps, 5);
    let m = metrics(&out.run_dir);
    assert_eq!(m.last().unwrap()["epoch"], 1);
}

/// `drafter.save_dtype = "bfloat16"`: the served drafter in the run directory is bf16 (as the
/// published drafters are) and says so in its config; the resumable checkpoint keeps the f32
/// master weights, and the served values are exactly those rounded.
#[test]
fn served_drafter_is_saved_in_the_asked_dtype_and_checkpoints_stay_f32() {
    link();
    let fx = Fixture::new(&tiny_samples(8));
    let cfg = fx.config(&[
        ("train.max_steps", "2"),
        ("train.save_every", "2"),
        ("drafter.save_dtype", "\"bfloat16\""),
    ]);
    let out = train(&cfg, None).unwrap();
    let dtypes = |path: &Path| -> Vec<safetensors::Dtype> {
        let bytes = std::fs::read(path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensors().into_iter().map(|(_, v)| v.dtype()).collect()
    };
    let served = out.run_dir.join("model.safetensors");
    assert!(
        dtypes(&served)
            .iter()
            .all(|d| *d == safetensors::Dtype::BF16)
    );
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(out.run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(saved["dtype"], "bfloat16");
    let latest = std::fs::read_to_string(out.run_dir.join("checkpoints/latest")).unwrap();
    let ckpt = out.run_dir.join("checkpoints").join(latest.trim());
    let master = ckpt.join("model.safetensors");
    assert!(
        dtypes(&master)
            .iter()
            .all(|d| *d == safetensors::Dtype::F32)
    );
    for ((n, s), (m, f)) in tensors(&served).iter().zip(tensors(&master)) {
        assert_eq!(n, &m);
        let rounded: Vec<f32> = f
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect();
        assert_eq!(s, &rounded, "{n}");
    }
    // A bad value is an error naming the key.
    let err = TrainConfig::load_toml_str(
        &config_text(&fx.data(), &fx.runs(), "save_dtype = \"int8\""),
        "test",
        Path::new("/"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("save_dtype") || err.contains("int8"), "{err}");
}

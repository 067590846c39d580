//! Fuzz property of `trainer_state.json`: a mutated file, or arbitrary bytes, reads as `Ok`
//! (with counters that add up and the step of its `step-N` directory) or a typed
//! [`TrainError`], never a panic (cases: `DFLASH_FUZZ_CASES`, see `mutate`).

#[path = "../../data/tests/mutate/mod.rs"]
mod mutate;

use dflash_training::TrainError;
use dflash_training::state::{TRAINER_STATE, read_state};
use proptest::prelude::*;

const SEED: &str = r#"{
  "step": 12,
  "adam_step": 11,
  "nonfinite_run": 1,
  "extra": {
    "epoch": 1,
    "seed": 7,
    "figures": {"first_loss": "6.39", "last_loss": "5.61", "last_accuracy": "0.0", "tau_before": null}
  }
}"#;

proptest! {
    #![proptest_config(mutate::config())]

    #[test]
    fn trainer_state_never_panics(bytes in mutate::input(SEED.as_bytes().to_vec())) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step-12");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join(TRAINER_STATE), &bytes).unwrap();
        match read_state(&dir) {
            Ok(s) => {
                prop_assert_eq!(s.step, 12);
                prop_assert!(s.adam_step + s.nonfinite_run <= s.step);
            }
            Err(e @ TrainError::State { .. }) => prop_assert!(!e.to_string().is_empty()),
            Err(e) => prop_assert!(false, "untyped: {e}"),
        }
    }
}

/// Counters at the edge of u64 are compared without overflowing.
#[test]
fn extreme_counters_are_an_error_not_an_overflow() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("step-12");
    std::fs::create_dir(&dir).unwrap();
    let text = SEED
        .replace("\"adam_step\": 11", &format!("\"adam_step\": {}", u64::MAX))
        .replace("\"nonfinite_run\": 1", "\"nonfinite_run\": 2");
    std::fs::write(dir.join(TRAINER_STATE), text).unwrap();
    let e = read_state(&dir).unwrap_err().to_string();
    assert!(e.contains("exceed step 12"), "{e}");
}

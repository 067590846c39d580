//! Fuzz properties of the data readers: a mutated JSONL file, Arrow IPC stream file or
//! `state.json`, or arbitrary bytes, opens and reads every sample as `Ok` or a typed
//! [`DataError`], never a panic (cases: `DFLASH_FUZZ_CASES`, see `mutate`).

mod common;
mod mutate;

use std::path::Path;

use common::*;
use dflash_data::{ArrowDataset, DataError, Dataset, JsonlDataset, open_dataset};
use proptest::prelude::*;

/// Reads everything a training run would: every sample's length and contents.
fn read_all(ds: Result<impl Dataset, DataError>) {
    let Ok(ds) = ds else { return };
    for i in 0..ds.len() {
        let _ = ds.seq_len(i);
        if let Err(e) = ds.get(i) {
            assert!(!e.to_string().is_empty());
        }
    }
    let _ = ds.lengths();
}

fn jsonl_seed() -> Vec<u8> {
    let (ids, mask) = rows(4, 0);
    let mut text = String::new();
    for (i, m) in ids.iter().zip(&mask) {
        text += &serde_json::json!({ "input_ids": i, "loss_mask": m }).to_string();
        text.push('\n');
    }
    // Lines the reader refuses (an SFT `labels` list instead of a mask, no mask at all), so
    // mutations also reach the missing-mask error path.
    text += "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n{\"input_ids\": [4, 5]}\n";
    text.into_bytes()
}

fn arrow_seed(dir: &Path) -> Vec<u8> {
    let file = hf_dir(dir, 5, Elem::I32, Elem::I8, false, 2);
    std::fs::read(file).unwrap()
}

proptest! {
    #![proptest_config(mutate::config())]

    #[test]
    fn jsonl_reader_never_panics(bytes in mutate::input(jsonl_seed())) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.jsonl");
        std::fs::write(&path, &bytes).unwrap();
        read_all(JsonlDataset::open(&path));
    }
}

proptest! {
    #![proptest_config(mutate::config())]

    #[test]
    fn arrow_reader_never_panics(bytes in mutate::input(arrow_seed(tempfile::tempdir().unwrap().path()))) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.arrow");
        std::fs::write(&path, &bytes).unwrap();
        read_all(ArrowDataset::open(&path));
    }

    /// A save_to_disk directory whose `state.json` is mutated (its data file intact).
    #[test]
    fn save_to_disk_state_never_panics(bytes in mutate::input({
        let d = tempfile::tempdir().unwrap();
        write_state(d.path(), &["data-00000-of-00001.arrow"]);
        std::fs::read(d.path().join("state.json")).unwrap()
    })) {
        let dir = tempfile::tempdir().unwrap();
        hf_dir(dir.path(), 3, Elem::I64, Elem::I64, true, 3);
        std::fs::write(dir.path().join("state.json"), &bytes).unwrap();
        if let Ok(ds) = open_dataset(dir.path()) {
            for i in 0..ds.len() {
                let _ = ds.get(i);
            }
        }
    }
}

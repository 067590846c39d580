//! The embedded dataset (`assets/tiny-data/{train,eval}`, HF save_to_disk, written by pyarrow).
//! Skipped with a note when the assets are absent.

use std::path::PathBuf;

use dflash_data::*;

const VOCAB: usize = 264;

fn asset(split: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../assets/tiny-data")
        .join(split);
    if p.join("state.json").exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} not present", p.display());
        None
    }
}

#[test]
fn tiny_data_train_and_eval_open_and_ids_fit_the_vocab() {
    for split in ["train", "eval"] {
        let Some(dir) = asset(split) else { continue };
        let ds = open_dataset(&dir).unwrap();
        assert!(!ds.is_empty(), "{split}: no rows");
        let mut counts = SkipCounts::default();
        for i in 0..ds.len() {
            let s = ds.get(i).unwrap_or_else(|e| panic!("{split}: {e}"));
            assert_eq!(s.ids.len(), ds.seq_len(i));
            assert_eq!(s.ids.len(), s.loss_mask.len());
            if let Some(&bad) = s.ids.iter().find(|&&t| t as usize >= VOCAB) {
                panic!("{split}: sample {i} has id {bad} >= {VOCAB}");
            }
            counts.record(&validate(s, VOCAB, 4096, 2, TooLongPolicy::Truncate));
        }
        eprintln!("{split}: {} rows; {counts}", ds.len());
        assert_eq!(counts.kept, ds.len() as u64, "{split}: {counts}");

        let plan = BatchPlan::new(&ds.lengths(), &[256, 512, 1024, 2048, 4096], 4096, 0, 0);
        eprintln!("{}", plan.bucket_summary());
        assert_eq!(
            plan.batches().iter().map(|b| b.len()).sum::<usize>(),
            ds.len()
        );
    }
}

#[test]
fn tiny_data_truncated_copies_are_errors_naming_the_file() {
    let Some(dir) = asset("eval") else { return };
    let bytes = std::fs::read(dir.join("data-00000-of-00001.arrow")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cut = tmp.path().join("data-00000-of-00001.arrow");
    std::fs::copy(dir.join("state.json"), tmp.path().join("state.json")).unwrap();
    let n = bytes.len();
    for len in [
        0,
        3,
        8,
        100,
        1000,
        n / 3,
        n / 2,
        n - 100,
        n - 9,
        n - 8,
        n - 4,
        n - 1,
    ] {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let e = open_dataset(tmp.path())
            .err()
            .unwrap_or_else(|| panic!("cut at {len} accepted"));
        assert!(
            e.to_string().contains("data-00000-of-00001.arrow"),
            "{len}: {e}"
        );
    }
    std::fs::write(&cut, &bytes).unwrap();
    assert!(!open_dataset(tmp.path()).unwrap().is_empty());
}

//! Fuzz properties of the safetensors loader: a mutated tensor file (alone, as a drafter
//! checkpoint, or behind a mutated shard index), or arbitrary bytes, opens and reads every
//! tensor as `Ok` or a typed [`ModelError`], never a panic (cases: `DFLASH_FUZZ_CASES`, see
//! `mutate`).

mod common;
#[path = "../../data/tests/mutate/mod.rs"]
mod mutate;

use std::path::Path;

use common::*;
use dflash_models::ModelError;
use dflash_models::checkpoint::{load_drafter, save_drafter};
use dflash_models::safetensors_io::{Dtype, TensorFiles, write_tensors_atomic};
use proptest::prelude::*;

/// Every tensor of `files` read the ways the loaders read them.
fn read_all(files: Result<TensorFiles, ModelError>) {
    let Ok(files) = files else { return };
    for name in files.names() {
        let _ = files.contains(&name);
        let Ok(shape) = files.shape(&name) else {
            continue;
        };
        let _ = files.read_f32(&name, &shape);
        let _ = files.view(&name, &shape);
        let _ = files.read_i64(&name);
        // A shape the file does not have is an error too.
        let _ = files.view(&name, &[shape.iter().product::<usize>() + 1]);
    }
}

fn tensor_seed(dtype: Dtype) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let t = |name: &str, shape: &[usize]| {
        let n = shape.iter().product::<usize>();
        (
            name.to_string(),
            shape.to_vec(),
            (0..n).map(|i| i as f32 * 0.5 - 3.0).collect(),
        )
    };
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    write_tensors_atomic(
        &path,
        &[t("a.weight", &[3, 4]), t("b", &[5]), t("c.scalar", &[])],
        dtype,
        Some(meta),
    )
    .unwrap();
    std::fs::read(path).unwrap()
}

/// A saved drafter checkpoint directory (config.json + model.safetensors).
fn drafter_dir(dir: &Path) {
    let b = backend();
    let cfg = tiny_drafter_cfg();
    save_drafter(b.as_ref(), dir, &cfg, &random_params(b.as_ref(), &cfg, 1)).unwrap();
}

proptest! {
    #![proptest_config(mutate::config())]

    #[test]
    fn safetensors_file_never_panics(bytes in prop_oneof![
        mutate::input(tensor_seed(Dtype::F32)),
        mutate::input(tensor_seed(Dtype::BF16)),
    ]) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        read_all(TensorFiles::open_file(&path));
    }

    /// A drafter checkpoint whose weights file is mutated loads or is a typed error.
    #[test]
    fn drafter_checkpoint_never_panics(bytes in mutate::mutated({
        let d = tempfile::tempdir().unwrap();
        drafter_dir(d.path());
        std::fs::read(d.path().join("model.safetensors")).unwrap()
    })) {
        let dir = tempfile::tempdir().unwrap();
        drafter_dir(dir.path());
        std::fs::write(dir.path().join("model.safetensors"), &bytes).unwrap();
        let _ = load_drafter(backend().as_ref(), dir.path());
    }

    /// A sharded checkpoint whose `model.safetensors.index.json` is mutated.
    #[test]
    fn shard_index_never_panics(text in mutate::text_input(
        r#"{"metadata": {"total_size": 68}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#
    )) {
        let dir = tempfile::tempdir().unwrap();
        let seed = tensor_seed(Dtype::F32);
        for shard in ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] {
            std::fs::write(dir.path().join(shard), &seed).unwrap();
        }
        std::fs::write(dir.path().join("model.safetensors.index.json"), text).unwrap();
        read_all(TensorFiles::open(dir.path()));
    }
}

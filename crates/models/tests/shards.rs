//! A sharded checkpoint must agree with its index: each tensor once, in the shard the index
//! names (transformers and vLLM read each tensor where the index says).

use std::path::Path;

use dflash_models::safetensors_io::{TensorFiles, write_f32_atomic};

const A: &str = "model-00001-of-00002.safetensors";
const B: &str = "model-00002-of-00002.safetensors";

fn tensor(name: &str, v: f32) -> (String, Vec<usize>, Vec<f32>) {
    (name.to_string(), vec![2], vec![v, v + 1.0])
}

/// Shards A and B with the given tensors, and an index mapping `map`.
fn sharded(dir: &Path, a: &[(&str, f32)], b: &[(&str, f32)], map: &[(&str, &str)]) {
    for (file, ts) in [(A, a), (B, b)] {
        let ts: Vec<_> = ts.iter().map(|&(n, v)| tensor(n, v)).collect();
        write_f32_atomic(&dir.join(file), &ts, None).unwrap();
    }
    let map: serde_json::Map<_, _> = map
        .iter()
        .map(|&(t, f)| (t.to_string(), serde_json::Value::from(f)))
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

fn open_err(dir: &Path) -> String {
    match TensorFiles::open(dir) {
        Ok(_) => panic!("{}: opened", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_checkpoint_that_agrees_with_its_index_opens() {
    let dir = tempfile::tempdir().unwrap();
    sharded(
        dir.path(),
        &[("x", 1.0)],
        &[("y", 5.0)],
        &[("x", A), ("y", B)],
    );
    let files = TensorFiles::open(dir.path()).unwrap();
    assert_eq!(files.names(), ["x", "y"]);
    assert_eq!(files.read_f32("y", &[2]).unwrap(), [5.0, 6.0]);
}

#[test]
fn a_tensor_in_two_shards_is_an_error_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    sharded(
        dir.path(),
        &[("x", 1.0)],
        &[("x", 9.0), ("y", 5.0)],
        &[("x", A), ("y", B)],
    );
    let e = open_err(dir.path());
    assert!(e.contains("\"x\"") && e.contains(A) && e.contains(B), "{e}");
}

#[test]
fn a_tensor_elsewhere_than_its_index_says_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    // The index puts y in A, but B (which the index lists for w) holds it.
    sharded(
        dir.path(),
        &[("x", 1.0)],
        &[("y", 5.0), ("w", 0.0)],
        &[("x", A), ("y", A), ("w", B)],
    );
    let e = open_err(dir.path());
    assert!(e.contains("weight_map puts \"y\"") && e.contains(B), "{e}");
    // A tensor the index lists that no shard holds.
    let dir = tempfile::tempdir().unwrap();
    sharded(
        dir.path(),
        &[("x", 1.0)],
        &[("y", 5.0)],
        &[("x", A), ("y", B), ("z", B)],
    );
    let e = open_err(dir.path());
    assert!(
        e.contains("\"z\"") && e.contains("no shard the index lists holds it"),
        "{e}"
    );
    // A file name that is not a string.
    let dir = tempfile::tempdir().unwrap();
    sharded(
        dir.path(),
        &[("x", 1.0)],
        &[("y", 5.0)],
        &[("x", A), ("y", B)],
    );
    let path = dir.path().join("model.safetensors.index.json");
    std::fs::write(&path, r#"{"weight_map": {"x": 3}}"#).unwrap();
    let e = open_err(dir.path());
    assert!(e.contains("weight_map[\"x\"]"), "{e}");
}

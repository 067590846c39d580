//! The Qwen3 target forward against HF transformers' float32 eager outputs on a randomly
//! initialised model (`tests/fixtures/qwen3-random`, see its README).
//!
//! Tolerance: `|ours - hf| <= 1e-4 + 1e-4 |hf|` per element. Both sides compute in f32, but
//! in different orders (matrixmultiply vs torch's CPU GEMM; our norms and softmax accumulate
//! in f64, torch's in f32), so each op differs by a few f32 ulps and three layers amplify that
//! to ~1e-6..1e-5 on values of order 1..10. Any real error (RoPE layout, eps, QK-norm placement,
//! GQA grouping, a missing norm) shows as >= 1e-2.

mod common;

use std::path::Path;
use std::sync::Arc;

use dflash_core::Backend;
use dflash_core::pipeline::Target;
use dflash_models::Qwen3Target;
use dflash_models::safetensors_io::{TensorFiles, write_f32_atomic};

use common::{Tolerance, assert_close, backend, closeness, fixture_dir};

const T: usize = 19;
const HID: usize = 64;
const VOCAB: usize = 96;
const GOLDEN: Tolerance = Tolerance::F32_VS_HF_GOLDEN;

struct Golden {
    /// Two rows of 19 ids.
    ids: Vec<Vec<u32>>,
    files: TensorFiles,
}

impl Golden {
    fn open() -> Self {
        let files = TensorFiles::open_file(&fixture_dir().join("golden.safetensors")).unwrap();
        let (ids, shape) = files.read_i64("input_ids").unwrap();
        assert_eq!(shape, [2, T]);
        let ids = ids
            .chunks(T)
            .map(|r| r.iter().map(|&t| u32::try_from(t).unwrap()).collect())
            .collect();
        Golden { ids, files }
    }

    /// Row `r` of a `[2, 19, C]` tensor.
    fn row(&self, name: &str, r: usize, cols: usize) -> Vec<f32> {
        let all = self.files.read_f32(name, &[2, T, cols]).unwrap();
        all[r * T * cols..(r + 1) * T * cols].to_vec()
    }
}

/// Asserts `ours` matches golden tensor `name` (row `r`) and returns the max abs error.
fn check(g: &Golden, ours: &[f32], name: &str, r: usize, cols: usize, what: &str) -> f64 {
    let want = g.row(name, r, cols);
    assert_close(&format!("{what}: {name} row {r}"), ours, &want, &GOLDEN).max_abs
}

/// Loads `dir` with all three layers and checks every hidden state and the logits of both
/// rows. Returns the max abs errors (hidden, logits).
fn check_model_dir(b: Arc<dyn Backend>, dir: &Path, what: &str) -> (f64, f64) {
    let g = Golden::open();
    let target = Qwen3Target::load(b, dir, &[0, 1, 2]).unwrap();
    let (mut worst_h, mut worst_l) = (0.0f64, 0.0f64);
    for (r, ids) in g.ids.iter().enumerate() {
        let hs = target.hidden_states(ids).unwrap();
        assert_eq!(hs.len(), 4, "{what}: embedding + 3 layer outputs");
        worst_h = worst_h.max(check(&g, &hs[0], "hidden_states.0", r, HID, what));
        for l in 0..3 {
            let name = format!("layer_output.{l}");
            worst_h = worst_h.max(check(&g, &hs[l + 1], &name, r, HID, what));
        }
        // HF's last hidden_states entry has the final norm applied; ours (the DFlash feature
        // of the last layer) is the raw layer output, so it must NOT match that entry.
        let hf_last = g.row("hidden_states.3", r, HID);
        let abs = closeness(&hs[3], &hf_last, &GOLDEN).max_abs;
        assert!(abs.is_finite(), "{what}: non-finite last-layer output");
        assert!(
            abs > 0.1,
            "{what}: our last-layer output looks final-normed (differs from HF hidden_states.3 by only {abs:.3e})"
        );
        let logits = target.logits(ids).unwrap();
        worst_l = worst_l.max(check(&g, &logits, "logits", r, VOCAB, what));
    }
    eprintln!("{what}: max abs error hidden {worst_h:.3e}, logits {worst_l:.3e}");
    (worst_h, worst_l)
}

#[test]
fn single_file_transformers5_config_matches_hf() {
    check_model_dir(
        backend(),
        &fixture_dir().join("model"),
        "model/ (rope_parameters)",
    );
}

#[test]
fn sharded_checkpoint_matches_hf() {
    check_model_dir(
        backend(),
        &fixture_dir().join("sharded"),
        "sharded/ (index + 3 shards)",
    );
}

#[test]
fn transformers4_config_matches_hf() {
    let src = fixture_dir().join("model");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config_v4.json"), tmp.path().join("config.json")).unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    let text = std::fs::read_to_string(tmp.path().join("config.json")).unwrap();
    assert!(text.contains("\"rope_theta\"") && !text.contains("rope_parameters"));
    check_model_dir(
        backend(),
        tmp.path(),
        "config_v4.json (top-level rope_theta)",
    );
}

/// `features` concatenates the chosen layers' outputs per token in `layer_ids` order (not
/// sorted), each the raw output of decoder layer l.
#[test]
fn features_concatenate_chosen_layers_in_order() {
    let g = Golden::open();
    let target = Qwen3Target::load(backend(), &fixture_dir().join("model"), &[2, 0]).unwrap();
    assert_eq!(target.layer_ids(), &[2, 0]);
    assert_eq!(target.hidden_size(), HID);
    assert_eq!(target.vocab_size(), VOCAB);
    for (r, ids) in g.ids.iter().enumerate() {
        let f = target.features(ids).unwrap().to_host().unwrap();
        assert_eq!(f.len(), T * 2 * HID);
        let (mut first, mut second) = (Vec::new(), Vec::new());
        for tok in f.chunks(2 * HID) {
            first.extend_from_slice(&tok[..HID]);
            second.extend_from_slice(&tok[HID..]);
        }
        // Layer 2 is the target's last layer: DFlash reads HF `hidden_states[3]`, which
        // has the final norm applied, not the raw layer output.
        check(
            &g,
            &first,
            "hidden_states.3",
            r,
            HID,
            "features[.., 0:H] (layer 2, the last: final-normed as in HF)",
        );
        check(
            &g,
            &second,
            "layer_output.0",
            r,
            HID,
            "features[.., H:2H] (layer 0)",
        );
    }
}

/// Loading with `[0]` keeps one layer and still matches layer 0's output.
#[test]
fn shallow_load_runs_only_needed_layers() {
    let g = Golden::open();
    let target = Qwen3Target::load(backend(), &fixture_dir().join("model"), &[0]).unwrap();
    for (r, ids) in g.ids.iter().enumerate() {
        let hs = target.hidden_states(ids).unwrap();
        assert_eq!(hs.len(), 2, "embedding + layer 0 only");
        check(&g, &hs[1], "layer_output.0", r, HID, "[0]-loaded layer 0");
        let f = target.features(ids).unwrap().to_host().unwrap();
        check(&g, &f, "layer_output.0", r, HID, "[0]-loaded features");
    }
}

/// The target never reads layers deeper than the deepest id: a checkpoint whose every
/// `model.layers.2.*` tensor is NaN (the load-time weight scan refuses any tensor it reads
/// that holds one) loads and matches for ids `[1, 0]`, and fails, naming a layer-2 tensor,
/// for `[2]`. (Removing the tensors instead is refused whatever the ids: the config and the
/// weights must agree on the layers.)
#[test]
fn deeper_layers_are_never_loaded() {
    let src = fixture_dir().join("model");
    let files = TensorFiles::open(&src).unwrap();
    let mut kept = Vec::new();
    let mut poisoned = 0;
    for name in files.names() {
        let shape = files.shape(&name).unwrap();
        let mut data = files.read_f32(&name, &shape).unwrap();
        if name.starts_with("model.layers.2.") {
            data.fill(f32::NAN);
            poisoned += 1;
        }
        kept.push((name.clone(), shape.clone(), data));
    }
    assert_eq!((kept.len(), poisoned), (36, 11));
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    write_f32_atomic(&tmp.path().join("model.safetensors"), &kept, None).unwrap();

    let g = Golden::open();
    let target = Qwen3Target::load(backend(), tmp.path(), &[1, 0]).unwrap();
    let ids = &g.ids[1];
    let f = target.features(ids).unwrap().to_host().unwrap();
    let (l1, l0): (Vec<f32>, Vec<f32>) = {
        let (mut a, mut c) = (Vec::new(), Vec::new());
        for tok in f.chunks(2 * HID) {
            a.extend_from_slice(&tok[..HID]);
            c.extend_from_slice(&tok[HID..]);
        }
        (a, c)
    };
    check(
        &g,
        &l1,
        "layer_output.1",
        1,
        HID,
        "checkpoint with a NaN layer 2, layer 1",
    );
    check(
        &g,
        &l0,
        "layer_output.0",
        1,
        HID,
        "checkpoint with a NaN layer 2, layer 0",
    );

    let err = Qwen3Target::load(backend(), tmp.path(), &[2])
        .err()
        .expect("loading layer 2 from a checkpoint where it is NaN must fail")
        .to_string();
    assert!(
        err.contains("model.layers.2."),
        "error does not name the tensor: {err}"
    );
}

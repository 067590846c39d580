//! A checkpoint's `config.json` and its weights agree on the number of layers, in both
//! directions, for the target and for the drafter: layers without weights, and weights of
//! layers the config does not have, are errors naming the tensor.

mod common;

use common::*;
use dflash_models::Qwen3Target;
use dflash_models::checkpoint::{load_drafter, save_drafter};

const TINY_TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");

/// `dir/config.json` with `num_hidden_layers` (and `layer_types`) set to `n` layers.
fn set_layers(dir: &std::path::Path, n: usize) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["num_hidden_layers"] = n.into();
    // A drafter config lists one attention type per layer.
    if let Some(types) = v["layer_types"].as_array_mut() {
        let first = types[0].clone();
        types.resize(n, first);
    }
    std::fs::write(path, v.to_string()).unwrap();
}

/// The tiny target (8 layers) under a config that says 9: the weights of layer 8 are
/// missing, although a job reading only layer 0 would never touch them.
#[test]
fn a_target_config_with_more_layers_than_the_weights_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(
            std::path::Path::new(TINY_TARGET).join(f),
            tmp.path().join(f),
        )
        .unwrap();
    }
    Qwen3Target::load(backend(), tmp.path(), &[0]).expect("the copy loads as it is");
    set_layers(tmp.path(), 9);
    let e = Qwen3Target::load(backend(), tmp.path(), &[0])
        .err()
        .expect("layer 8 has no weights")
        .to_string();
    assert!(
        e.contains("model.layers.8.input_layernorm.weight")
            && e.contains("missing")
            && e.contains("num_hidden_layers is 9"),
        "{e}"
    );
}

/// A drafter checkpoint whose config says fewer layers than its weights hold (the unused
/// tensors named), or more (the first missing one named).
#[test]
fn a_drafter_config_and_its_weights_disagreeing_on_layers_is_an_error() {
    let b = backend();
    let cfg = tiny_drafter_cfg();
    let n = cfg.num_hidden_layers;
    assert!(n >= 2, "the tiny drafter has layers to drop");
    let tmp = tempfile::tempdir().unwrap();
    save_drafter(
        b.as_ref(),
        tmp.path(),
        &cfg,
        &random_params(b.as_ref(), &cfg, 3),
    )
    .unwrap();
    load_drafter(b.as_ref(), tmp.path()).expect("the saved drafter loads");
    for (layers, says) in [
        (n - 1, format!("layers.{}.", n - 1)),
        (n + 1, format!("layers.{n}.input_layernorm.weight")),
    ] {
        set_layers(tmp.path(), layers);
        let e = load_drafter(b.as_ref(), tmp.path())
            .err()
            .expect("the layer counts disagree")
            .to_string();
        assert!(e.contains(&says) && e.contains("num_hidden_layers"), "{e}");
    }
}

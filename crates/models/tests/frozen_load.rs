//! Loading frozen weights straight from the file's dtype (`TensorFiles::view` +
//! `MemoryOps::upload_frozen`): the same values as widening to f32 first, for f32, bf16 and f16
//! checkpoints, and errors that name the file and the tensor.

mod common;

use std::path::Path;

use dflash_core::Backend;
use dflash_models::Qwen3Target;
use dflash_models::drafter::FrozenTarget;
use dflash_models::safetensors_io::{TensorFiles, write_tensors_atomic};
use safetensors::Dtype;

use common::{backend, fixture_dir};

/// Every tensor of the fixture, as f32 host values.
fn fixture_tensors() -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let files = TensorFiles::open(&fixture_dir().join("model")).unwrap();
    files
        .names()
        .into_iter()
        .map(|name| {
            let shape = files.shape(&name).unwrap();
            let v = files.read_f32(&name, &shape).unwrap();
            (name, shape, v)
        })
        .collect()
}

/// `x` as stored in `dtype` and widened back (round to nearest even).
fn stored(x: &[f32], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::F32 => x.to_vec(),
        Dtype::BF16 => x
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect(),
        Dtype::F16 => x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
        other => panic!("no float dtype {other:?}"),
    }
}

/// A checkpoint directory: the fixture's config and `tensors` stored as `dtype`.
fn write_checkpoint(dir: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        fixture_dir().join("model/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    write_tensors_atomic(&dir.join("model.safetensors"), tensors, dtype, None).unwrap();
}

fn down(b: &dyn Backend, t: &dflash_core::Tensor) -> Vec<f32> {
    b.download(t).unwrap()
}

/// A target read from an f32, bf16 or f16 file holds the file's values exactly: its embedding
/// and LM head are the stored values, and its forward gives bit-identical hidden states and
/// logits to a target read from an f32 file of those same values (what widening every
/// tensor to f32 on the host before uploading gave). The frozen embedding / LM head loader
/// agrees, and `loaded_bytes` counts the file's bytes.
#[test]
fn every_float_dtype_loads_the_values_widening_gives() {
    let b = backend();
    let src = fixture_tensors();
    assert_eq!(src.len(), 36);
    let numel: u64 = src
        .iter()
        .map(|(_, s, _)| s.iter().product::<usize>() as u64)
        .sum();
    let ids: Vec<u32> = (0..13).map(|i| (i * 7 + 3) % 96).collect();
    let tmp = tempfile::tempdir().unwrap();
    for (dtype, size) in [(Dtype::F32, 4), (Dtype::BF16, 2), (Dtype::F16, 2)] {
        let dir = tmp.path().join(format!("{dtype:?}"));
        write_checkpoint(&dir, &src, dtype);
        let files = TensorFiles::open(&dir).unwrap();
        // The same values, stored as f32: the path without any narrow dtype.
        let widened: Vec<_> = src
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone(), files.read_f32(n, s).unwrap()))
            .collect();
        for ((name, shape, orig), (_, _, w)) in src.iter().zip(&widened) {
            assert_eq!(w, &stored(orig, dtype), "{dtype:?} {name}: read_f32");
            let view = files.view(name, shape).unwrap();
            assert_eq!(view.numel(), orig.len());
            let up = b.upload_frozen(view, shape).unwrap();
            assert_eq!(up.dims(), shape.as_slice());
            assert_eq!(&down(b.as_ref(), &up), w, "{dtype:?} {name}: upload_frozen");
        }
        let f32_dir = tmp.path().join(format!("{dtype:?}-as-f32"));
        write_checkpoint(&f32_dir, &widened, Dtype::F32);

        let t = Qwen3Target::load(b.clone(), &dir, &[2, 0]).unwrap();
        let t32 = Qwen3Target::load(b.clone(), &f32_dir, &[2, 0]).unwrap();
        assert_eq!(t.loaded_bytes(), numel * size, "{dtype:?}");
        assert_eq!(t32.loaded_bytes(), numel * 4, "{dtype:?}");
        let want = |name: &str| &widened.iter().find(|(n, _, _)| n == name).unwrap().2;
        let embed = down(b.as_ref(), t.embedding());
        let head = down(b.as_ref(), t.lm_head());
        assert_eq!(
            &embed,
            want("model.embed_tokens.weight"),
            "{dtype:?} embedding"
        );
        assert_eq!(&head, want("lm_head.weight"), "{dtype:?} lm_head");
        assert_eq!(
            t.hidden_states(&ids).unwrap(),
            t32.hidden_states(&ids).unwrap(),
            "{dtype:?} hidden states"
        );
        let logits = t.logits(&ids).unwrap();
        assert!(logits.iter().all(|x| x.is_finite()));
        assert_eq!(logits, t32.logits(&ids).unwrap(), "{dtype:?} logits");

        let (cfg, frozen) = FrozenTarget::load(b.as_ref(), &dir).unwrap();
        assert_eq!(cfg.vocab_size, 96);
        assert_eq!(
            down(b.as_ref(), frozen.embed()),
            embed,
            "{dtype:?} frozen embed"
        );
        assert_eq!(
            down(b.as_ref(), frozen.lm_head()),
            head,
            "{dtype:?} frozen head"
        );
    }
}

/// With tied embeddings both loaders use the embedding as the LM head, one tensor for both,
/// also where the files hold an `lm_head.weight` of their own (a stale head a tied export
/// ships: HF and the serving engines never read it, so the drafter must not train on it).
#[test]
fn tied_embeddings_load_the_embedding_as_the_head() {
    let b = backend();
    for ships_head in [false, true] {
        let src: Vec<_> = fixture_tensors()
            .into_iter()
            .filter(|(n, _, _)| ships_head || n != "lm_head.weight")
            .collect();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_checkpoint(dir, &src, Dtype::BF16);
        let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let tied = cfg.replace(
            "\"tie_word_embeddings\": false",
            "\"tie_word_embeddings\": true",
        );
        assert_ne!(cfg, tied);
        std::fs::write(dir.join("config.json"), tied).unwrap();
        // What the loader reads: layers 0 and 1 of 3, the embedding and the final norm.
        let read: u64 = src
            .iter()
            .filter(|(n, _, _)| !n.starts_with("model.layers.2.") && n != "lm_head.weight")
            .map(|(_, s, _)| s.iter().product::<usize>() as u64)
            .sum();

        let t = Qwen3Target::load(b.clone(), dir, &[1]).unwrap();
        assert_eq!(t.loaded_bytes(), 2 * read, "ships_head {ships_head}");
        let embed = down(b.as_ref(), t.embedding());
        assert_eq!(down(b.as_ref(), t.lm_head()), embed);
        // One tensor serves both, not a second copy of the (V, H) table.
        assert!(t.frozen().is_tied() && std::ptr::eq(t.lm_head(), t.embedding()));
        let (_, frozen) = FrozenTarget::load(b.as_ref(), dir).unwrap();
        assert!(frozen.is_tied() && std::ptr::eq(frozen.lm_head(), frozen.embed()));
        assert_eq!(down(b.as_ref(), frozen.embed()), embed);
        if ships_head {
            let (_, _, head) = src.iter().find(|(n, _, _)| n == "lm_head.weight").unwrap();
            assert_ne!(
                down(b.as_ref(), frozen.lm_head()),
                *head,
                "the shipped head was read"
            );
        }
    }
}

/// A float tensor stored as an integer type, a wrong shape and a missing tensor are errors
/// that name the file and the tensor, from the accessor and from both loaders.
#[test]
fn bad_dtype_shape_and_missing_tensors_name_file_and_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.safetensors");
    let ints: Vec<u8> = (0..6i32).flat_map(|v| v.to_le_bytes()).collect();
    let floats: Vec<u8> = (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let views = vec![
        (
            "w.int".to_string(),
            safetensors::tensor::TensorView::new(Dtype::I32, vec![2, 3], &ints).unwrap(),
        ),
        (
            "w.ok".to_string(),
            safetensors::tensor::TensorView::new(Dtype::F32, vec![2, 3], &floats).unwrap(),
        ),
    ];
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    let files = TensorFiles::open_file(&path).unwrap();
    let file = path.display().to_string();

    let ok = files.view("w.ok", &[2, 3]).unwrap();
    assert_eq!(ok.to_f32_vec(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let e = files.view("w.int", &[2, 3]).unwrap_err().to_string();
    assert!(
        e.contains(&file) && e.contains("\"w.int\"") && e.contains("dtype I32"),
        "{e}"
    );
    let e = files.read_f32("w.int", &[2, 3]).unwrap_err().to_string();
    assert!(
        e.contains(&file) && e.contains("\"w.int\"") && e.contains("dtype I32"),
        "{e}"
    );
    let e = files.view("w.ok", &[3, 2]).unwrap_err().to_string();
    assert!(
        e.contains(&file) && e.contains("\"w.ok\"") && e.contains("shape [2, 3], expected [3, 2]"),
        "{e}"
    );
    let e = files.view("w.none", &[2, 3]).unwrap_err().to_string();
    assert!(e.contains("\"w.none\"") && e.contains("missing"), "{e}");

    // The loaders: one layer weight stored as I32, the embedding with a wrong shape.
    let b = backend();
    let mut src = fixture_tensors();
    let bad_layer = "model.layers.0.self_attn.q_proj.weight";
    let mut bytes = Vec::new();
    let mut views = Vec::new();
    for (name, shape, v) in &src {
        let (dtype, b): (Dtype, Vec<u8>) = if name == bad_layer {
            (
                Dtype::I32,
                v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
            )
        } else {
            (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect())
        };
        bytes.push((name.clone(), dtype, shape.clone(), b));
    }
    for (name, dtype, shape, b) in &bytes {
        views.push((
            name.clone(),
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), b).unwrap(),
        ));
    }
    let dir = tmp.path().join("int-layer");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixture_dir().join("model/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let model = dir.join("model.safetensors");
    std::fs::write(&model, safetensors::serialize(views, None).unwrap()).unwrap();
    let e = Qwen3Target::load(b.clone(), &dir, &[0])
        .err()
        .expect("an I32 layer weight is rejected")
        .to_string();
    assert!(
        e.contains(&model.display().to_string()) && e.contains(bad_layer) && e.contains("I32"),
        "{e}"
    );

    let embed = src
        .iter_mut()
        .find(|(n, _, _)| n == "model.embed_tokens.weight")
        .unwrap();
    embed.1 = vec![embed.1[1], embed.1[0]];
    let dir = tmp.path().join("bad-embed");
    write_checkpoint(&dir, &src, Dtype::BF16);
    let model = dir.join("model.safetensors").display().to_string();
    for e in [
        Qwen3Target::load(b.clone(), &dir, &[0])
            .err()
            .unwrap()
            .to_string(),
        FrozenTarget::load(b.as_ref(), &dir)
            .err()
            .unwrap()
            .to_string(),
    ] {
        assert!(
            e.contains(&model)
                && e.contains("model.embed_tokens.weight")
                && e.contains("shape [64, 96], expected [96, 64]"),
            "{e}"
        );
    }
}

/// The NaN policy at load time: one NaN (or Inf) in a target weight, stored as F32, BF16 or
/// F16, is an error naming the file, the tensor and the element's index, from the target
/// loader and from the frozen embedding / head loader, before anything trains on it.
#[test]
fn a_non_finite_target_weight_is_an_error_naming_tensor_file_and_index() {
    let b = backend();
    let tmp = tempfile::tempdir().unwrap();
    for (dtype, bad) in [
        (Dtype::F32, f32::NAN),
        (Dtype::BF16, f32::INFINITY),
        (Dtype::F16, f32::NAN),
    ] {
        for (poisoned, index) in [
            ("model.layers.1.mlp.down_proj.weight", [3usize, 5]),
            ("model.embed_tokens.weight", [7, 2]),
        ] {
            let mut src = fixture_tensors();
            let t = src.iter_mut().find(|(n, _, _)| n == poisoned).unwrap();
            let cols = t.1[1];
            t.2[index[0] * cols + index[1]] = bad;
            let dir = tmp.path().join(format!("{dtype:?}-{poisoned}"));
            write_checkpoint(&dir, &src, dtype);
            let model = dir.join("model.safetensors").display().to_string();
            let mut errs = vec![
                Qwen3Target::load(b.clone(), &dir, &[0, 1])
                    .err()
                    .expect("a non-finite weight is rejected")
                    .to_string(),
            ];
            if poisoned.starts_with("model.embed") {
                errs.push(
                    FrozenTarget::load(b.as_ref(), &dir)
                        .err()
                        .unwrap()
                        .to_string(),
                );
            }
            for e in errs {
                assert!(
                    e.contains(&model)
                        && e.contains(poisoned)
                        && e.contains(&format!("{index:?}"))
                        && e.contains("non-finite"),
                    "{dtype:?} {poisoned}: {e}"
                );
            }
        }
    }
}

/// A config that says fewer layers than the weights hold (the 4-of-8 reproduction)
/// is an error naming the first unused tensor, not a silently truncated target.
#[test]
fn config_layer_count_must_match_the_weights() {
    let b = backend();
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture_tensors();
    let text = std::fs::read_to_string(fixture_dir().join("model/config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let n = json["num_hidden_layers"].as_u64().unwrap();
    for (layers, says) in [
        (n - 1, format!("model.layers.{}.", n - 1)),
        (1, "model.layers.1.".to_string()),
    ] {
        let dir = tmp.path().join(format!("layers-{layers}"));
        write_checkpoint(&dir, &src, Dtype::F32);
        json["num_hidden_layers"] = layers.into();
        std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
        let e = Qwen3Target::load(b.clone(), &dir, &[0])
            .err()
            .expect("a depth mismatch is rejected")
            .to_string();
        assert!(e.contains(&says) && e.contains("num_hidden_layers"), "{e}");
    }
}

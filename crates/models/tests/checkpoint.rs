//! Drafter checkpoints (docs/design.md §2.6): the exact tensor names, shapes and config fields
//! that SGLang/vLLM load, a bit-exact round trip, clear errors on bad input (§5), and
//! atomic writes.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use dflash_config::default_gamma;
use dflash_core::Backend;
use dflash_core::pipeline::Target;
use dflash_data::block_targets;
use dflash_models::checkpoint::{load_drafter, save_drafter};
use dflash_models::safetensors_io::{TensorFiles, write_atomic, write_f32_atomic};
use dflash_models::{DraftInput, Drafter, DrafterParams, Qwen3Target};
use safetensors::{Dtype, SafeTensors};

use common::*;

/// The §2.6 layout of the tiny drafter (H 16, k 2, 4 q / 2 kv heads of 8, MLP 24, 2 layers),
/// written out by hand rather than taken from `DrafterParams::layout`.
fn expected_layout() -> BTreeMap<String, Vec<usize>> {
    let mut m = BTreeMap::new();
    m.insert("fc.weight".to_string(), vec![16, 2 * 16]);
    m.insert("hidden_norm.weight".to_string(), vec![16]);
    m.insert("norm.weight".to_string(), vec![16]);
    for i in 0..2 {
        let l = |n: &str| format!("layers.{i}.{n}");
        m.insert(l("input_layernorm.weight"), vec![16]);
        m.insert(l("post_attention_layernorm.weight"), vec![16]);
        m.insert(l("self_attn.q_proj.weight"), vec![32, 16]);
        m.insert(l("self_attn.k_proj.weight"), vec![16, 16]);
        m.insert(l("self_attn.v_proj.weight"), vec![16, 16]);
        m.insert(l("self_attn.o_proj.weight"), vec![16, 32]);
        m.insert(l("self_attn.q_norm.weight"), vec![8]);
        m.insert(l("self_attn.k_norm.weight"), vec![8]);
        m.insert(l("mlp.gate_proj.weight"), vec![24, 16]);
        m.insert(l("mlp.up_proj.weight"), vec![24, 16]);
        m.insert(l("mlp.down_proj.weight"), vec![16, 24]);
    }
    m
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn download_all(b: &dyn Backend, p: &DrafterParams) -> Vec<Vec<f32>> {
    p.tensors().iter().map(|t| b.download(t).unwrap()).collect()
}

/// Saves a random tiny drafter into a fresh temp dir.
fn saved() -> (Arc<dyn Backend>, tempfile::TempDir, DrafterParams) {
    let b = backend();
    let cfg = tiny_drafter_cfg();
    let params = random_params(b.as_ref(), &cfg, 7);
    let dir = tempfile::tempdir().unwrap();
    save_drafter(b.as_ref(), dir.path(), &cfg, &params).unwrap();
    (b, dir, params)
}

/// Rewrites `dir/model.safetensors` through `edit(name, shape, data) -> Option<(shape, data)>`.
fn rewrite_tensors(
    dir: &Path,
    edit: impl Fn(&str, Vec<usize>, Vec<f32>) -> Option<(Vec<usize>, Vec<f32>)>,
) {
    let files = TensorFiles::open(dir).unwrap();
    let mut out = Vec::new();
    for name in files.names() {
        let shape = files.shape(&name).unwrap();
        let data = files.read_f32(&name, &shape).unwrap();
        if let Some((s, d)) = edit(&name, shape, data) {
            out.push((name, s, d));
        }
    }
    drop(files);
    write_f32_atomic(&dir.join("model.safetensors"), &out, None).unwrap();
}

fn load_err(b: &dyn Backend, dir: &Path) -> String {
    match load_drafter(b, dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn save_writes_the_serving_layout_and_round_trips_bit_exactly() {
    let (b, dir, params) = saved();
    let cfg = tiny_drafter_cfg();
    assert_eq!(listing(dir.path()), ["config.json", "model.safetensors"]);

    // Tensor names and shapes, read with the safetensors crate directly.
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let got: BTreeMap<String, Vec<usize>> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            assert_eq!(v.dtype(), Dtype::F32, "{n}");
            (n, v.shape().to_vec())
        })
        .collect();
    assert_eq!(got, expected_layout());

    // Values: bit-exact through save and load, in layout order.
    let (cfg2, loaded) = load_drafter(b.as_ref(), dir.path()).unwrap();
    assert_eq!(cfg2, cfg);
    let (want, have) = (
        download_all(b.as_ref(), &params),
        download_all(b.as_ref(), &loaded),
    );
    for ((name, _), (w, h)) in DrafterParams::layout(&cfg)
        .iter()
        .zip(want.iter().zip(&have))
    {
        assert!(
            w.iter().zip(h).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name} changed in the round trip"
        );
        let raw: Vec<f32> = st
            .tensor(name)
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(
            w.iter().zip(&raw).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name} on disk"
        );
    }

    // The loaded drafter computes the same loss, bit for bit.
    let frozen = random_frozen(b.as_ref(), V, H, 8).tensors;
    let seq = random_sequence(2, 9);
    let bt = block_targets(
        &seq.ids,
        &seq.loss_mask,
        &ANCHORS,
        BS,
        default_gamma(BS) as f32,
        MASK_ID,
    );
    let inp = DraftInput {
        features: (&seq.features).into(),
        anchors: &ANCHORS,
        block_ids: &bt.block_ids,
        positions: &bt.positions,
        labels: &bt.labels,
        weights: &bt.weights,
        doc_starts: &[],
        ctx_positions: &[],
    };
    let d1 = Drafter::new(b.clone(), cfg.clone(), params, frozen.clone()).unwrap();
    let d2 = Drafter::new(b.clone(), cfg2, loaded, frozen).unwrap();
    assert_eq!(d1.loss(&inp).unwrap(), d2.loss(&inp).unwrap());

    // config.json fields serving engines and the DFlash reference code read.
    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(j["architectures"], serde_json::json!(["DFlashDraftModel"]));
    assert_eq!(j["model_type"], "qwen3");
    assert_eq!(j["block_size"], 4);
    assert_eq!(j["dflash_config"]["mask_token_id"], MASK_ID);
    assert_eq!(
        j["dflash_config"]["target_layer_ids"],
        serde_json::json!([1, 3])
    );
    assert_eq!(j["num_target_layers"], 4);
    assert_eq!(
        j["layer_types"],
        serde_json::json!(["full_attention", "full_attention"])
    );
    assert_eq!(j["hidden_size"], 16);
    assert_eq!(j["num_hidden_layers"], 2);
    assert_eq!(j["num_attention_heads"], 4);
    assert_eq!(j["num_key_value_heads"], 2);
    assert_eq!(j["head_dim"], 8);
    assert_eq!(j["intermediate_size"], 24);
    assert_eq!(j["vocab_size"], 40);
    // RoPE written in the top-level form (§2.6), read by transformers 4 and 5.
    assert_eq!(j["rope_theta"].as_f64(), Some(10_000.0));
    assert!(j.get("rope_parameters").is_none());

    // Saving again over the same directory replaces both files and leaves nothing else.
    let other = random_params(b.as_ref(), &cfg, 99);
    save_drafter(b.as_ref(), dir.path(), &cfg, &other).unwrap();
    assert_eq!(listing(dir.path()), ["config.json", "model.safetensors"]);
    let (_, again) = load_drafter(b.as_ref(), dir.path()).unwrap();
    assert_eq!(
        download_all(b.as_ref(), &again),
        download_all(b.as_ref(), &other)
    );
}

/// A drafter saved as bf16 or f16 (what published DFlash drafters ship): every tensor stored
/// in that dtype, each value the f32 one rounded to nearest even (as `torch.Tensor.to` does),
/// `config.json` saying so, and loading widens them back exactly.
#[test]
fn save_in_half_precision_rounds_once_and_says_so() {
    let b = backend();
    let params = random_params(b.as_ref(), &tiny_drafter_cfg(), 17);
    let want = download_all(b.as_ref(), &params);
    for (dtype, st_dtype, name, round) in [
        (
            dflash_config::DType::BFloat16,
            Dtype::BF16,
            "bfloat16",
            (|x| half::bf16::from_f32(x).to_f32()) as fn(f32) -> f32,
        ),
        (dflash_config::DType::Float16, Dtype::F16, "float16", |x| {
            half::f16::from_f32(x).to_f32()
        }),
    ] {
        let cfg = dflash_config::DrafterConfig {
            dtype,
            ..tiny_drafter_cfg()
        };
        let dir = tempfile::tempdir().unwrap();
        save_drafter(b.as_ref(), dir.path(), &cfg, &params).unwrap();
        let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        for (n, v) in st.tensors() {
            assert_eq!(v.dtype(), st_dtype, "{n}");
        }
        let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let j: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(j["dtype"], name);
        let (cfg2, loaded) = load_drafter(b.as_ref(), dir.path()).unwrap();
        assert_eq!(cfg2.dtype, dtype);
        let have = download_all(b.as_ref(), &loaded);
        let mut changed = 0;
        for (w, h) in want.iter().zip(&have) {
            for (&x, &y) in w.iter().zip(h) {
                assert_eq!(y.to_bits(), round(x).to_bits(), "{name}: {x} stored as {y}");
                changed += usize::from(x != y);
            }
        }
        assert!(changed > 0, "{name}: random f32 values must lose bits");
    }
}

#[test]
fn missing_tensor_is_named() {
    let (b, dir, _) = saved();
    rewrite_tensors(dir.path(), |n, s, d| {
        (n != "layers.1.mlp.up_proj.weight").then_some((s, d))
    });
    let err = load_err(b.as_ref(), dir.path());
    assert!(
        err.contains("layers.1.mlp.up_proj.weight") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn misshaped_tensor_names_tensor_and_both_shapes() {
    let (b, dir, _) = saved();
    rewrite_tensors(dir.path(), |n, s, d| {
        Some(if n == "layers.0.self_attn.k_proj.weight" {
            (vec![15, 16], vec![0.5; 15 * 16])
        } else {
            (s, d)
        })
    });
    let err = load_err(b.as_ref(), dir.path());
    assert!(err.contains("layers.0.self_attn.k_proj.weight"), "{err}");
    assert!(
        err.contains("[15, 16]") && err.contains("[16, 16]"),
        "{err}"
    );
    assert!(err.contains("model.safetensors"), "{err}");
}

#[test]
fn truncated_or_corrupt_safetensors_is_an_error_naming_the_file() {
    let (b, dir, _) = saved();
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    for (what, data) in [
        ("truncated to half", bytes[..bytes.len() / 2].to_vec()),
        ("truncated inside the header", bytes[..12].to_vec()),
        ("empty", Vec::new()),
        ("garbage", {
            let mut r = rng(3);
            (0..4096).map(|_| rand::Rng::random::<u8>(&mut r)).collect()
        }),
    ] {
        std::fs::write(&path, &data).unwrap();
        let err = load_err(b.as_ref(), dir.path());
        assert!(err.contains("model.safetensors"), "{what}: {err}");
    }
}

#[test]
fn drafter_config_must_fit_the_frozen_target() {
    let b = backend();
    let cfg = tiny_drafter_cfg();

    // Hidden size: a target with hidden 24 cannot lend its embedding to a hidden-16 drafter.
    let params = random_params(b.as_ref(), &cfg, 1);
    let wide = random_frozen(b.as_ref(), V, 24, 2).tensors;
    let err = Drafter::new(b.clone(), cfg.clone(), params, wide)
        .err()
        .expect("hidden mismatch")
        .to_string();
    assert!(
        err.contains("hidden_size") && err.contains("16") && err.contains("24"),
        "{err}"
    );

    // Parameters of another layer count: every later call would index past them.
    for layers in [cfg.num_hidden_layers + 1, cfg.num_hidden_layers - 1] {
        let other = dflash_config::DrafterConfig {
            num_hidden_layers: layers,
            layer_types: vec![cfg.layer_types[0]; layers],
            ..cfg.clone()
        };
        let params = random_params(b.as_ref(), &other, 1);
        let frozen = random_frozen(b.as_ref(), V, H, 2).tensors;
        let err = Drafter::new(b.clone(), cfg.clone(), params, frozen)
            .err()
            .expect("layer count")
            .to_string();
        assert!(
            err.contains("parameters are") && err.contains("tensors"),
            "{err}"
        );
    }

    // Mask token outside the target's vocabulary (mask id 39, target vocab 30).
    let params = random_params(b.as_ref(), &cfg, 1);
    let small = random_frozen(b.as_ref(), 30, H, 2).tensors;
    let err = Drafter::new(b.clone(), cfg.clone(), params, small)
        .err()
        .expect("mask id")
        .to_string();
    assert!(
        err.contains("mask_token_id") && err.contains("39") && err.contains("30"),
        "{err}"
    );

    // Parameters that do not match the config.
    let mut other = cfg.clone();
    other.intermediate_size = 20;
    let params = random_params(b.as_ref(), &other, 1);
    let frozen = random_frozen(b.as_ref(), V, H, 2).tensors;
    let err = Drafter::new(b.clone(), cfg.clone(), params, frozen)
        .err()
        .expect("shape")
        .to_string();
    assert!(
        err.contains("mlp.gate_proj") || err.contains("gate_proj"),
        "{err}"
    );

    // A saved config whose mask_token_id is outside its own vocabulary is refused at load.
    let dir = tempfile::tempdir().unwrap();
    save_drafter(
        b.as_ref(),
        dir.path(),
        &cfg,
        &random_params(b.as_ref(), &cfg, 1),
    )
    .unwrap();
    let p = dir.path().join("config.json");
    let mut j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    j["dflash_config"]["mask_token_id"] = serde_json::json!(40);
    std::fs::write(&p, j.to_string()).unwrap();
    let err = load_err(b.as_ref(), dir.path());
    assert!(
        err.contains("mask_token_id") && err.contains("config.json"),
        "{err}"
    );
}

#[test]
fn target_rejects_bad_layer_ids_and_token_ids() {
    let b = backend();
    let dir = fixture_dir().join("model");
    let err = Qwen3Target::load(b.clone(), &dir, &[0, 3])
        .err()
        .expect("layer 3 of a 3-layer target")
        .to_string();
    assert!(
        err.contains("layer id 3") && err.contains("3 layers"),
        "{err}"
    );

    let t = Qwen3Target::load(b, &dir, &[1]).unwrap();
    let err = t
        .features(&[5, 96, 7])
        .expect_err("token 96 of vocab 96")
        .to_string();
    assert!(err.contains("96") && err.contains("vocabulary"), "{err}");
    assert!(t.hidden_states(&[u32::MAX]).is_err());
    assert!(t.features(&[5, 95, 7]).is_ok());
}

#[test]
fn write_atomic_replaces_content_and_leaves_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/out.bin");
    write_atomic(&path, b"first version").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"first version");
    write_atomic(&path, b"second").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"second");
    assert_eq!(listing(&dir.path().join("nested")), ["out.bin"]);

    // A failing write (the target is a directory) is an error naming the path, and it
    // neither leaves a temp file behind nor touches what is there.
    let blocker = dir.path().join("nested/blocker");
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("keep"), b"x").unwrap();
    let err = write_atomic(&blocker, b"data")
        .expect_err("cannot replace a directory")
        .to_string();
    assert!(err.contains("blocker"), "{err}");
    assert_eq!(listing(&dir.path().join("nested")), ["blocker", "out.bin"]);
    assert_eq!(listing(&blocker), ["keep"]);
}

#[test]
fn write_atomic_from_many_threads_leaves_one_whole_file() {
    // Eight threads replace the same file at once, each with a distinct payload of a distinct
    // length. Whatever order the renames land in, the file must be exactly one of the payloads
    // (never a mix or a truncation) and no temp file may remain.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.bin");
    let payloads: Vec<Vec<u8>> = (0..8u8)
        .map(|i| vec![b'a' + i; 4096 * (i as usize + 1)])
        .collect();
    std::thread::scope(|s| {
        for p in &payloads {
            let path = &path;
            s.spawn(move || {
                for _ in 0..20 {
                    write_atomic(path, p).unwrap();
                }
            });
        }
    });
    let got = std::fs::read(&path).unwrap();
    assert!(payloads.contains(&got), "torn file of {} bytes", got.len());
    assert_eq!(listing(dir.path()), ["shared.bin"]);
}

#[test]
fn streamed_tensors_round_trip_and_a_failed_fetch_keeps_the_old_file() {
    use dflash_models::ModelError;
    use dflash_models::safetensors_io::write_tensors_streaming;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let entries = vec![("a".to_string(), vec![3, 5]), ("b".to_string(), vec![7])];
    let values: Vec<Vec<f32>> = entries
        .iter()
        .enumerate()
        .map(|(i, (_, s))| {
            dflash_models::drafter::normal_vec(&mut rng(40 + i as u64), s.iter().product(), 1.0)
        })
        .collect();
    use std::sync::atomic::{AtomicUsize, Ordering};
    let fetched = AtomicUsize::new(0);
    let fetch = |i: usize| {
        fetched.fetch_add(1, Ordering::Relaxed);
        Ok(values[i].clone())
    };
    write_tensors_streaming(&path, &entries, Dtype::F32, None, &fetch).unwrap();
    assert_eq!(
        fetched.load(Ordering::Relaxed),
        2,
        "each tensor fetched exactly once"
    );
    let files = TensorFiles::open_file(&path).unwrap();
    for ((name, shape), want) in entries.iter().zip(&values) {
        assert_eq!(
            &files.read_f32(name, shape).unwrap(),
            want,
            "{name} bit-exact"
        );
    }
    drop(files);
    let before = std::fs::read(&path).unwrap();

    // The second fetch fails: the error is the fetch's, and the published file is untouched.
    let failing = |i: usize| match i {
        0 => Ok(values[0].clone()),
        _ => Err(ModelError::Checkpoint {
            path: path.clone(),
            detail: "device lost while downloading b".into(),
        }),
    };
    let err = write_tensors_streaming(&path, &entries, Dtype::BF16, None, &failing)
        .expect_err("a failed fetch fails the write")
        .to_string();
    assert!(err.contains("device lost while downloading b"), "{err}");
    // A fetch of the wrong length names the tensor and both sizes.
    let short = |i: usize| Ok(values[i][1..].to_vec());
    let err = write_tensors_streaming(&path, &entries, Dtype::F32, None, &short)
        .expect_err("wrong length")
        .to_string();
    assert!(err.contains("tensor \"a\""), "{err}");
    assert!(
        err.contains("14 values") && err.contains("15 expected"),
        "{err}"
    );
    // A name given twice would make an ambiguous file: refused before anything is written.
    let twice = vec![entries[0].clone(), entries[0].clone()];
    let err = write_tensors_streaming(&path, &twice, Dtype::F32, None, &fetch)
        .expect_err("duplicate name")
        .to_string();
    assert!(
        err.contains("tensor \"a\"") && err.contains("twice"),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(listing(dir.path()), ["model.safetensors"]);
}

/// The NaN policy: a drafter checkpoint whose `fc.weight` holds a NaN (the resume
/// reproduction) does not load; the error names the tensor, the file and the index.
#[test]
fn a_nan_drafter_weight_is_an_error_naming_tensor_file_and_index() {
    let (b, dir, _) = saved();
    rewrite_tensors(dir.path(), |n, s, mut d| {
        if n == "fc.weight" {
            d[2 * s[1] + 9] = f32::NAN;
        }
        Some((s, d))
    });
    let err = load_err(b.as_ref(), dir.path());
    assert!(
        err.contains("\"fc.weight\"")
            && err.contains("model.safetensors")
            && err.contains("[2, 9]")
            && err.contains("non-finite"),
        "{err}"
    );
}

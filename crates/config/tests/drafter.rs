use std::collections::BTreeSet;
use std::path::PathBuf;

use dflash_config::{
    ConfigError, DType, DrafterConfig, DrafterShape, LayerType, Qwen3Config, TokenIds,
    default_gamma, default_num_target_features, default_target_layer_ids, known_mask_token_id,
};
use serde_json::{Value, json};

const REFERENCES: [&str; 3] = [
    "config_qwen3-4b-dflash.json",
    "config_qwen3-8b-dflash.json",
    "config_qwen3.6-27b-dflash.json",
];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

fn parse(v: &Value) -> Result<DrafterConfig, ConfigError> {
    DrafterConfig::from_json_str(&v.to_string(), "drafter/config.json")
}

fn edit(mut v: Value, f: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Value {
    f(v.as_object_mut().unwrap());
    v
}

fn target_8b() -> Qwen3Config {
    Qwen3Config::from_file(fixture("target_qwen3-8b.json")).unwrap()
}

fn target_tiny() -> Qwen3Config {
    Qwen3Config::from_file(fixture("target_tiny_v5.json")).unwrap()
}

#[test]
fn layer_id_defaults() {
    assert_eq!(default_target_layer_ids(36, 5), vec![1, 9, 17, 25, 33]);
    assert_eq!(default_target_layer_ids(64, 5), vec![1, 16, 31, 46, 61]);
    assert_eq!(default_target_layer_ids(8, 5), vec![1, 2, 3, 4, 5]);
    assert_eq!(default_target_layer_ids(36, 1), vec![18]);
    assert_eq!(default_target_layer_ids(7, 1), vec![3]);
    assert_eq!(default_target_layer_ids(36, 0), Vec::<usize>::new());
    // Half-to-even rounding, as Python's round(): 7.5 -> 8, 20.5 -> 20.
    assert_eq!(default_target_layer_ids(30, 5), vec![1, 8, 14, 20, 27]);
    assert_eq!(default_target_layer_ids(28, 3), vec![1, 13, 25]);

    assert_eq!(default_num_target_features(36), 5);
    assert_eq!(default_num_target_features(8), 5);
    assert_eq!(default_num_target_features(6), 3);
    assert_eq!(default_num_target_features(2), 1);
    for l in 1..80 {
        let ids = default_target_layer_ids(l, default_num_target_features(l));
        assert!(ids.iter().all(|&i| i < l), "{l}: {ids:?}");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{l}: {ids:?}");
    }

    assert_eq!(known_mask_token_id(151936), Some(151669));
    assert_eq!(known_mask_token_id(264), Some(256));
    assert_eq!(known_mask_token_id(1000), None);
    assert_eq!(
        (default_gamma(16), default_gamma(10), default_gamma(8)),
        (7.0, 5.0, 4.0)
    );
}

/// The one default gamma is the curve training has always used (it was a separate f32 copy
/// in dflash-data while this crate reported `7b/16`, which differs off the published
/// points): through the published points, piecewise linear between, increasing without
/// jumps; and `TrainConfig::gamma`, which the job's block spec reads, is that curve unless
/// `data.gamma` is set.
#[test]
fn default_gamma_is_the_trained_curve() {
    for (bs, g) in [
        (1, 0.5),
        (4, 2.0),
        (8, 4.0),
        (10, 5.0),
        (13, 6.0),
        (16, 7.0),
        (32, 14.0),
    ] {
        assert_eq!(default_gamma(bs), g, "block {bs}");
    }
    assert!((default_gamma(12) - (5.0 + 2.0 / 3.0)).abs() < 1e-12);
    let mut prev = 0.0;
    let mut cfg = dflash_config::TrainConfig::default();
    for bs in 1..=64 {
        let g = default_gamma(bs);
        assert!(g > prev, "not increasing at {bs}");
        assert!(g - prev <= 0.5 + 1e-9, "jump at {bs}");
        assert_eq!(cfg.gamma(bs), g, "TrainConfig::gamma at {bs}");
        prev = g;
    }
    cfg.data.gamma = Some(2.0);
    assert_eq!(cfg.gamma(16), 2.0);
}

#[test]
fn reads_the_reference_configs() {
    let c8 = DrafterConfig::from_file(fixture("config_qwen3-8b-dflash.json")).unwrap();
    assert_eq!(c8.hidden_size, 4096);
    assert_eq!(c8.intermediate_size, 12288);
    assert_eq!(c8.num_hidden_layers, 5);
    assert_eq!(
        (c8.num_attention_heads, c8.num_key_value_heads, c8.head_dim),
        (32, 8, 128)
    );
    assert_eq!(c8.block_size, 16);
    assert_eq!(c8.mask_token_id, 151669);
    assert_eq!(c8.target_layer_ids, vec![1, 9, 17, 25, 33]);
    assert_eq!(c8.num_target_layers, 36);
    assert_eq!(c8.layer_types, vec![LayerType::FullAttention; 5]);
    assert_eq!(c8.sliding_window, None);
    assert_eq!(c8.rope_theta, 1e6);
    assert_eq!(c8.vocab_size, 151936);
    assert_eq!(c8.bos_token_id, Some(151643));
    assert_eq!(c8.eos_token_id, Some(TokenIds::One(151645)));
    assert_eq!(c8.dtype, DType::BFloat16);
    assert_eq!(c8.num_target_features(), 5);
    assert_eq!(c8.deepest_target_layer(), Some(33));

    let c27 = DrafterConfig::from_file(fixture("config_qwen3.6-27b-dflash.json")).unwrap();
    assert_eq!(c27.hidden_size, 5120);
    assert_eq!(c27.target_layer_ids, default_target_layer_ids(64, 5));
    assert_eq!(c27.num_target_layers, 64);
    assert_eq!(
        c27.layer_types,
        [
            vec![LayerType::SlidingAttention; 4],
            vec![LayerType::FullAttention]
        ]
        .concat()
    );
    assert_eq!(c27.sliding_window, Some(2048));
    assert!(c27.use_sliding_window);
    assert_eq!(c27.bos_token_id, None);
    assert_eq!(c27.pad_token_id, Some(248044));
    assert_eq!(c27.rope_theta, 1e7);
    assert_eq!(c27.mask_token_id, 248070);

    // fixtures/ has no config.json: an I/O error naming the path.
    let e = DrafterConfig::from_dir(fixture("")).unwrap_err();
    assert!(
        matches!(e, ConfigError::Io { .. }) && e.to_string().contains("config.json"),
        "{e}"
    );
}

#[test]
fn round_trip_read_write_read() {
    for name in REFERENCES {
        let a = DrafterConfig::from_file(fixture(name)).unwrap();
        let text = a.to_json_string();
        let b = DrafterConfig::from_json_str(&text, "round-trip").unwrap();
        assert_eq!(a, b, "{name}");
        assert_eq!(a.to_json(), b.to_json(), "{name}");
    }
}

#[test]
fn to_json_reproduces_the_reference_files_exactly() {
    for name in REFERENCES {
        let file = fixture_json(name);
        let written = DrafterConfig::from_file(fixture(name)).unwrap().to_json();
        let mut expected = file.clone();
        // The only key not reproduced: who wrote the file.
        expected
            .as_object_mut()
            .unwrap()
            .remove("transformers_version");
        let keys = |v: &Value| {
            v.as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<BTreeSet<_>>()
        };
        assert_eq!(keys(&written), keys(&expected), "{name}");
        for k in keys(&expected) {
            assert_eq!(written[&k], expected[&k], "{name}: key {k}");
        }
        assert_eq!(written, expected, "{name}");
    }
    // The 8B file in particular, key for key and value for value.
    let file = fixture_json("config_qwen3-8b-dflash.json");
    let written = DrafterConfig::from_file(fixture("config_qwen3-8b-dflash.json"))
        .unwrap()
        .to_json();
    assert_eq!(written, file);
    assert_eq!(written["rope_theta"], json!(1000000));
    assert!(written["rope_scaling"].is_null());
}

#[test]
fn reads_transformers5_rope_parameters() {
    let v5 = edit(fixture_json("config_qwen3-8b-dflash.json"), |m| {
        m.remove("rope_theta");
        m.remove("rope_scaling");
        m.insert(
            "rope_parameters".into(),
            json!({"rope_theta": 1000000.0, "rope_type": "default"}),
        );
        m.remove("dtype");
        m.insert("torch_dtype".into(), json!("bfloat16"));
    });
    let a = parse(&v5).unwrap();
    let b = DrafterConfig::from_file(fixture("config_qwen3-8b-dflash.json")).unwrap();
    assert_eq!(a, b);
    // Written back in the top-level form.
    assert_eq!(a.to_json(), fixture_json("config_qwen3-8b-dflash.json"));

    let yarn = edit(v5, |m| {
        m.insert(
            "rope_parameters".into(),
            json!({"rope_theta": 1e6, "rope_type": "yarn"}),
        );
    });
    let e = parse(&yarn).unwrap_err();
    assert!(
        e.to_string().contains("drafter/config.json")
            && e.to_string().contains("rope_parameters.rope_type")
    );
}

#[test]
fn for_target_builds_the_standard_recipe() {
    let t = target_8b();
    let built = DrafterConfig::for_target(&t, &DrafterShape::standard(151669)).unwrap();
    // Exactly the published Qwen3-8B drafter config.
    assert_eq!(built.to_json(), fixture_json("config_qwen3-8b-dflash.json"));
    assert_eq!(
        built,
        DrafterConfig::from_file(fixture("config_qwen3-8b-dflash.json")).unwrap()
    );

    let shape = DrafterShape {
        num_layers: 2,
        block_size: 8,
        num_target_features: 3,
        intermediate_size: Some(1024),
        num_attention_heads: Some(16),
        num_key_value_heads: Some(4),
        head_dim: Some(64),
        dtype: DType::Float32,
        ..DrafterShape::standard(151669)
    };
    let c = DrafterConfig::for_target(&t, &shape).unwrap();
    assert_eq!(c.hidden_size, 4096);
    assert_eq!(
        (c.num_hidden_layers, c.block_size, c.intermediate_size),
        (2, 8, 1024)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (16, 4, 64)
    );
    assert_eq!(c.target_layer_ids, vec![1, 17, 33]);
    assert_eq!(c.layer_types.len(), 2);
    assert_eq!(c.max_window_layers, 2);
    assert_eq!(c.to_json()["dtype"], json!("float32"));
    assert_eq!(
        DrafterConfig::from_json_str(&c.to_json_string(), "x").unwrap(),
        c
    );

    let tiny = DrafterConfig::for_target(&target_tiny(), &DrafterShape::standard(256)).unwrap();
    assert_eq!(tiny.target_layer_ids, vec![1, 2, 3, 4, 5]);
    assert_eq!(
        (tiny.hidden_size, tiny.head_dim, tiny.rope_theta),
        (128, 32, 10000.0)
    );

    // Explicit ids must agree with k.
    let e = DrafterConfig::for_target(
        &t,
        &DrafterShape {
            target_layer_ids: Some(vec![2, 30]),
            ..DrafterShape::standard(151669)
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("target_layer_ids"), "{e}");
    let ok = DrafterConfig::for_target(
        &t,
        &DrafterShape {
            target_layer_ids: Some(vec![2, 30]),
            num_target_features: 2,
            ..DrafterShape::standard(151669)
        },
    )
    .unwrap();
    assert_eq!(ok.target_layer_ids, vec![2, 30]);

    // Sliding layers need a window.
    let sliding = DrafterShape {
        layer_types: Some(vec![LayerType::SlidingAttention, LayerType::FullAttention]),
        num_layers: 2,
        ..DrafterShape::standard(151669)
    };
    let e = DrafterConfig::for_target(&t, &sliding).unwrap_err();
    assert!(e.to_string().contains("sliding_window"), "{e}");
    let c = DrafterConfig::for_target(
        &t,
        &DrafterShape {
            sliding_window: Some(512),
            ..sliding
        },
    )
    .unwrap();
    assert!(c.use_sliding_window);
    assert_eq!(
        DrafterConfig::from_json_str(&c.to_json_string(), "x").unwrap(),
        c
    );
}

fn mismatch_field(e: &ConfigError) -> &str {
    match e {
        ConfigError::Mismatch { field, .. } | ConfigError::Invalid { field, .. } => field,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn validate_against_names_field_and_both_values() {
    let t = target_8b();
    let good = DrafterConfig::from_file(fixture("config_qwen3-8b-dflash.json")).unwrap();
    good.validate_against(&t).unwrap();

    // 27B drafter on the 8B target: hidden size.
    let d27 = DrafterConfig::from_file(fixture("config_qwen3.6-27b-dflash.json")).unwrap();
    let e = d27.validate_against(&t).unwrap_err();
    assert_eq!(mismatch_field(&e), "hidden_size");
    let msg = e.to_string();
    assert!(msg.contains("5120") && msg.contains("4096"), "{msg}");

    let mut d = good.clone();
    d.num_target_layers = 40;
    let e = d.validate_against(&t).unwrap_err();
    assert_eq!(mismatch_field(&e), "num_target_layers");
    assert!(e.to_string().contains("40") && e.to_string().contains("36"));

    let mut d = good.clone();
    d.target_layer_ids = vec![1, 9, 17, 25, 36];
    let e = d.validate_against(&t).unwrap_err();
    assert_eq!(mismatch_field(&e), "dflash_config.target_layer_ids");
    assert!(e.to_string().contains("36"), "{e}");

    let mut d = good.clone();
    d.mask_token_id = 151936;
    d.vocab_size = 200000;
    let e = d.validate_against(&t).unwrap_err();
    assert_eq!(mismatch_field(&e), "dflash_config.mask_token_id");
    assert!(e.to_string().contains("151936"), "{e}");

    let mut d = good.clone();
    d.vocab_size = 152064;
    let e = d.validate_against(&t).unwrap_err();
    assert_eq!(mismatch_field(&e), "vocab_size");

    let mut d = good.clone();
    d.block_size = 1;
    let e = d.validate_against(&t).unwrap_err();
    assert_eq!(mismatch_field(&e), "block_size");
    assert!(e.to_string().contains("got 1"), "{e}");

    let mut d = good.clone();
    d.num_attention_heads = 30;
    let e = d.validate_against(&t).unwrap_err();
    assert_eq!(mismatch_field(&e), "num_attention_heads");
    assert!(
        e.to_string().contains("30") && e.to_string().contains('8'),
        "{e}"
    );
}

#[test]
fn bad_drafter_files_are_clear_errors() {
    let base = || fixture_json("config_qwen3-8b-dflash.json");
    let cases: Vec<(Value, &str)> = vec![
        (
            edit(base(), |m| {
                m.remove("dflash_config");
            }),
            "missing field `dflash_config`",
        ),
        (
            edit(base(), |m| {
                m["dflash_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("mask_token_id");
            }),
            "dflash_config.mask_token_id",
        ),
        (
            edit(base(), |m| {
                m["dflash_config"]["target_layer_ids"] = json!([1, "9"]);
            }),
            "dflash_config.target_layer_ids[1]",
        ),
        (
            edit(base(), |m| {
                m["dflash_config"]["target_layer_ids"] = json!([1, 36]);
            }),
            "out of range",
        ),
        (
            edit(base(), |m| {
                m.insert("block_size".into(), json!(1));
            }),
            "block_size",
        ),
        (
            edit(base(), |m| {
                m["layer_types"] = json!(["full_attention"]);
            }),
            "layer_types",
        ),
        (
            edit(base(), |m| {
                m["layer_types"][2] = json!("linear_attention");
            }),
            "layer_types[2]",
        ),
        (
            edit(base(), |m| {
                m["layer_types"][0] = json!("sliding_attention");
            }),
            "sliding_window",
        ),
        (
            edit(base(), |m| {
                m["architectures"] = json!(["Qwen3ForCausalLM"]);
            }),
            "not a DFlash drafter",
        ),
        (
            edit(base(), |m| {
                m["dtype"] = json!("int8");
            }),
            "dtype",
        ),
        (
            edit(base(), |m| {
                m["dflash_config"]["mask_token_id"] = json!(151936);
            }),
            "mask_token_id",
        ),
    ];
    for (v, needle) in cases {
        let e = parse(&v).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("drafter/config.json"), "{msg}");
        assert!(msg.contains(needle), "expected {needle:?} in: {msg}");
    }

    // block_size may also live in dflash_config.
    let v = edit(base(), |m| {
        m.remove("block_size");
        m["dflash_config"]["block_size"] = json!(10);
    });
    assert_eq!(parse(&v).unwrap().block_size, 10);

    // layer_types absent: HF's rule from use_sliding_window / max_window_layers.
    let v = edit(fixture_json("config_qwen3.6-27b-dflash.json"), |m| {
        m.remove("layer_types");
        m["max_window_layers"] = json!(3);
    });
    let c = parse(&v).unwrap();
    assert_eq!(
        c.layer_types,
        [
            vec![LayerType::FullAttention; 3],
            vec![LayerType::SlidingAttention; 2]
        ]
        .concat()
    );
}

/// Sizes whose arithmetic or per-layer lists would overflow or exhaust memory are errors
/// naming the file and the knob, reached before anything of that size is allocated.
#[test]
fn absurd_sizes_in_a_drafter_file_are_errors_not_aborts() {
    let base = || fixture_json("config_qwen3-8b-dflash.json");
    let cases = [
        // HF's layer_types rule would otherwise make 1e12 entries.
        (
            edit(base(), |m| {
                m.remove("layer_types");
                m.remove("max_window_layers");
                m["num_hidden_layers"] = json!(1_000_000_000_000u64);
            }),
            "`num_hidden_layers`: 1000000000000 makes",
        ),
        // heads * head_dim = 2^64, and 2 * heads = 2^64: beyond usize.
        (
            edit(base(), |m| {
                m["num_attention_heads"] = json!(1u64 << 32);
                m["num_key_value_heads"] = json!(1u64 << 32);
                m["head_dim"] = json!(1u64 << 32);
            }),
            "`head_dim`: 4294967296 makes",
        ),
        (
            edit(base(), |m| {
                m["num_attention_heads"] = json!(1u64 << 63);
                m["num_key_value_heads"] = json!(1u64 << 63);
                m["head_dim"] = json!(2);
            }),
            "training state",
        ),
    ];
    for (v, says) in cases {
        let msg = parse(&v).unwrap_err().to_string();
        assert!(
            msg.contains("drafter/config.json")
                && msg.contains(says)
                && msg.contains("training state"),
            "{says}: {msg}"
        );
    }
}

/// More features than the recipe's spread has distinct layers for names the knob the user
/// set and how many fit, not the derived `target_layer_ids`.
#[test]
fn too_many_target_features_names_the_count_and_how_many_fit() {
    let mut target = target_8b();
    target.num_hidden_layers = 8;
    let shape = |k| DrafterShape {
        num_target_features: k,
        ..DrafterShape::standard(151_669)
    };
    let ok = DrafterConfig::for_target(&target, &shape(5)).unwrap();
    assert_eq!(ok.target_layer_ids, [1, 2, 3, 4, 5]);
    let e = DrafterConfig::for_target(&target, &shape(7)).unwrap_err();
    let ConfigError::Invalid { field, message, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(field, "num_target_features", "{e}");
    assert!(message.contains("at most 5 fit"), "{e}");

    // More features than target layers: refused at once (no list of 1e12 ids is made or
    // scanned), naming the knob and how many fit.
    let e = DrafterConfig::for_target(&target, &shape(1_000_000_000_000)).unwrap_err();
    let ConfigError::Invalid { field, message, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(field, "num_target_features", "{e}");
    assert!(
        message.contains("1000000000000 features from 8 target layers")
            && message.contains("at most 5 fit"),
        "{e}"
    );
    // The bound keeps every k the spread allows: 5 of 8 layers was accepted above, and one
    // feature of a one-layer target is still its layer 0.
    target.num_hidden_layers = 1;
    let one = DrafterConfig::for_target(&target, &shape(1)).unwrap();
    assert_eq!(one.target_layer_ids, [0]);
}

/// A drafter config is a Qwen3 config to the engines: absent sizes take HF Qwen3Config's
/// defaults (head_dim 128, not hidden / heads; 32 KV heads), a null KV count the heads'.
#[test]
fn absent_head_sizes_take_hf_qwen3_defaults() {
    let v = edit(fixture_json("config_qwen3-8b-dflash.json"), |m| {
        m.remove("head_dim");
        m.remove("num_key_value_heads");
        m.insert("num_attention_heads".into(), json!(64));
    });
    let c = parse(&v).unwrap();
    assert_eq!((c.head_dim, c.num_key_value_heads), (128, 32));
    let null_kv = edit(v, |m| {
        m.insert("num_key_value_heads".into(), json!(null));
    });
    assert_eq!(parse(&null_kv).unwrap().num_key_value_heads, 64);
}

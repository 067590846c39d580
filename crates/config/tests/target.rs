use std::path::PathBuf;

use dflash_config::{ConfigError, Qwen3Config, TokenIds};
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

fn parse(v: &Value) -> Result<Qwen3Config, ConfigError> {
    Qwen3Config::from_json_str(&v.to_string(), "test/config.json")
}

fn edit(mut v: Value, f: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Value {
    f(v.as_object_mut().unwrap());
    v
}

#[test]
fn reads_qwen3_8b_transformers4_form() {
    let c = Qwen3Config::from_file(fixture("target_qwen3-8b.json")).unwrap();
    assert_eq!(c.model_type, "qwen3");
    assert_eq!(c.vocab_size, 151936);
    assert_eq!(c.hidden_size, 4096);
    assert_eq!(c.intermediate_size, 12288);
    assert_eq!(c.num_hidden_layers, 36);
    assert_eq!(c.num_attention_heads, 32);
    assert_eq!(c.num_key_value_heads, 8);
    assert_eq!(c.head_dim, 128);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.max_position_embeddings, 40960);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.bos_token_id, Some(151643));
    assert_eq!(c.eos_token_id, Some(TokenIds::One(151645)));
    assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
}

#[test]
fn reads_transformers5_rope_parameters_and_matches_v4_form() {
    let v5 = fixture_json("target_tiny_v5.json");
    let c5 = parse(&v5).unwrap();
    assert_eq!(c5.rope_theta, 10000.0);
    assert_eq!(
        (c5.hidden_size, c5.num_hidden_layers, c5.vocab_size),
        (128, 8, 264)
    );
    assert_eq!(c5.dtype.as_deref(), Some("float32"));

    let v4 = edit(v5, |m| {
        m.remove("rope_parameters");
        m.remove("layer_types");
        m.insert("rope_theta".into(), json!(10000.0));
        m.insert("rope_scaling".into(), Value::Null);
        m.remove("dtype");
        m.insert("torch_dtype".into(), json!("float32"));
    });
    assert_eq!(parse(&v4).unwrap(), c5);

    // Both forms present and agreeing is fine.
    let both = edit(fixture_json("target_tiny_v5.json"), |m| {
        m.insert("rope_theta".into(), json!(10000));
    });
    assert_eq!(parse(&both).unwrap().rope_theta, 10000.0);

    // rope_scaling {"rope_type": "default"} (and legacy "type") is plain RoPE.
    let default_scaling = edit(v4.clone(), |m| {
        m.insert(
            "rope_scaling".into(),
            json!({"rope_type": "default", "type": "default"}),
        );
    });
    assert_eq!(parse(&default_scaling).unwrap(), c5);

    // Per-layer-type rope_parameters with one theta.
    let per_type = edit(fixture_json("target_tiny_v5.json"), |m| {
        m.insert(
            "rope_parameters".into(),
            json!({"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
        );
    });
    assert_eq!(parse(&per_type).unwrap().rope_theta, 10000.0);
}

/// Absent sizes take HF Qwen3Config's defaults (transformers 5.24): head_dim 128, not
/// hidden / heads (Qwen3-0.6B's shape: 1024 / 16 = 64), and 32 KV heads; a null KV count is
/// the attention heads'.
#[test]
fn head_dim_and_kv_heads_default() {
    let v = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.remove("head_dim");
        m.remove("num_key_value_heads");
        m.remove("tie_word_embeddings");
        m.insert("hidden_size".into(), json!(1024));
        m.insert("num_attention_heads".into(), json!(64));
        m.insert("eos_token_id".into(), json!([151645, 151643]));
    });
    let c = parse(&v).unwrap();
    assert_eq!(c.head_dim, 128);
    assert_eq!(c.num_key_value_heads, 32);
    let null_kv = edit(v.clone(), |m| {
        m.insert("num_key_value_heads".into(), json!(null));
    });
    assert_eq!(parse(&null_kv).unwrap().num_key_value_heads, 64);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.eos_token_id, Some(TokenIds::Many(vec![151645, 151643])));
    assert!(c.eos_token_id.unwrap().contains(151643));
}

#[test]
fn rope_scaling_is_rejected_naming_file_and_field() {
    let yarn = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.insert(
            "rope_scaling".into(),
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
        );
    });
    let e = parse(&yarn).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Unsupported { field, .. } if field == "rope_scaling.rope_type"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("test/config.json") && msg.contains("yarn"),
        "{msg}"
    );

    // Scaling settings that do not say their type are not plain RoPE either.
    let untyped = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.insert("rope_scaling".into(), json!({"factor": 4.0}));
    });
    let e = parse(&untyped).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Unsupported { field, .. } if field == "rope_scaling"),
        "{e:?}"
    );
    // An empty object says nothing: plain RoPE.
    let empty = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.insert("rope_scaling".into(), json!({}));
    });
    parse(&empty).unwrap();

    let linear = edit(fixture_json("target_tiny_v5.json"), |m| {
        m.insert(
            "rope_parameters".into(),
            json!({"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}),
        );
    });
    let e = parse(&linear).unwrap_err();
    assert!(e.to_string().contains("rope_parameters.rope_type"), "{e}");

    let partial = edit(fixture_json("target_tiny_v5.json"), |m| {
        m.insert(
            "rope_parameters".into(),
            json!({"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        );
    });
    assert!(
        parse(&partial)
            .unwrap_err()
            .to_string()
            .contains("partial_rotary_factor")
    );
}

#[test]
fn rope_theta_missing_or_conflicting() {
    let none = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.remove("rope_theta");
    });
    let e = parse(&none).unwrap_err();
    assert!(matches!(e, ConfigError::MissingField { .. }));
    assert!(e.to_string().contains("rope_theta"), "{e}");

    let conflict = edit(fixture_json("target_tiny_v5.json"), |m| {
        m.insert("rope_theta".into(), json!(500000));
    });
    let e = parse(&conflict).unwrap_err();
    assert!(e.to_string().contains("disagrees"), "{e}");

    let no_theta = edit(fixture_json("target_tiny_v5.json"), |m| {
        m.insert("rope_parameters".into(), json!({"rope_type": "default"}));
    });
    let e = parse(&no_theta).unwrap_err();
    assert!(e.to_string().contains("rope_parameters.rope_theta"), "{e}");
}

#[test]
fn missing_and_wrong_typed_fields_are_named() {
    let missing = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.remove("hidden_size");
    });
    let e = parse(&missing).unwrap_err();
    assert_eq!(
        e.to_string(),
        "test/config.json: missing field `hidden_size`"
    );

    let wrong = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.insert("num_hidden_layers".into(), json!("36"));
    });
    let e = parse(&wrong).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ConfigError::WrongType { .. }));
    assert!(
        msg.contains("num_hidden_layers") && msg.contains("string \"36\""),
        "{msg}"
    );

    let float = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.insert("rms_norm_eps".into(), json!(true));
    });
    assert!(
        parse(&float)
            .unwrap_err()
            .to_string()
            .contains("rms_norm_eps")
    );
}

#[test]
fn unsupported_target_features_are_errors() {
    for (key, value, needle) in [
        ("model_type", json!("llama"), "model_type"),
        ("hidden_act", json!("gelu"), "hidden_act"),
        ("attention_bias", json!(true), "attention_bias"),
        ("use_sliding_window", json!(true), "use_sliding_window"),
    ] {
        let v = edit(fixture_json("target_qwen3-8b.json"), |m| {
            m.insert(key.into(), value);
        });
        let e = parse(&v).unwrap_err();
        assert!(matches!(e, ConfigError::Unsupported { .. }), "{e:?}");
        assert!(e.to_string().contains(needle), "{e}");
    }
    let v = edit(fixture_json("target_tiny_v5.json"), |m| {
        m["layer_types"][3] = json!("sliding_attention");
    });
    assert!(
        parse(&v)
            .unwrap_err()
            .to_string()
            .contains("layer_types[3]")
    );
}

#[test]
fn invalid_values() {
    let v = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.insert("num_key_value_heads".into(), json!(5));
    });
    assert!(
        parse(&v)
            .unwrap_err()
            .to_string()
            .contains("num_key_value_heads")
    );
    let v = edit(fixture_json("target_qwen3-8b.json"), |m| {
        m.insert("vocab_size".into(), json!(0));
    });
    assert!(parse(&v).unwrap_err().to_string().contains("vocab_size"));
}

#[test]
fn file_errors_name_the_path() {
    let e = Qwen3Config::from_file("/nonexistent/dir/config.json").unwrap_err();
    assert!(matches!(e, ConfigError::Io { .. }));
    assert!(
        e.to_string().contains("/nonexistent/dir/config.json"),
        "{e}"
    );

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.json");
    std::fs::write(&p, "{\"hidden_size\": 12,").unwrap();
    let e = Qwen3Config::from_dir(dir.path()).unwrap_err();
    assert!(matches!(e, ConfigError::Json { .. }));
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");

    std::fs::write(&p, "[1, 2]").unwrap();
    let e = Qwen3Config::from_file(&p).unwrap_err();
    assert!(e.to_string().contains("JSON object"), "{e}");
}

//! Every test that loads a `TrainConfig` runs inside `figment::Jail`: it serializes the tests
//! that touch the process environment and the current directory, and restores both.

use std::path::{Path, PathBuf};

use dflash_config::{
    ConfigError, DrafterConfig, Qwen3Config, TooLong, TrainConfig, parse_overrides,
};
use figment::Jail;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn ov(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[allow(clippy::result_large_err)]
/// Runs `f` in a jail; `ConfigError`s become jail errors with their message.
fn jailed(f: impl FnOnce(&mut Jail) -> Result<(), String>) {
    Jail::expect_with(|jail| f(jail).map_err(figment::Error::from));
}

fn s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

#[test]
fn defaults() {
    jailed(|jail| {
        let cfg = TrainConfig::load(None, &[]).map_err(s)?;
        let mut expected = TrainConfig::default();
        expected.run.dir = jail.directory().join("runs");
        assert_eq!(cfg, expected);
        assert_eq!(cfg.train.lr, 6e-4);
        assert_eq!(cfg.train.epochs, 6);
        assert_eq!(cfg.train.warmup_ratio, 0.04);
        assert_eq!(cfg.train.grad_clip, 1.0);
        assert_eq!(cfg.drafter.num_layers, 5);
        assert_eq!(cfg.drafter.block_size, 16);
        assert_eq!(cfg.data.max_len, 3072);
        assert_eq!(cfg.data.num_anchors, 512);
        assert_eq!(cfg.data.too_long, TooLong::Truncate);
        assert_eq!(cfg.backend.name, "reference");
        assert_eq!(cfg.gamma(16), 7.0);
        assert!(cfg.target_dir().is_err());
        assert!(
            cfg.train_data()
                .unwrap_err()
                .to_string()
                .contains("data.train")
        );
        Ok(())
    });
}

#[test]
fn file_then_env_then_cli() {
    jailed(|jail| {
        jail.create_file(
            "job.toml",
            r#"
[target]
path = "models/qwen3-8b"

[drafter]
block_size = 10
target_layer_ids = [1, 9, 17]

[data]
train = "data/train"
too_long = "skip"
bucket_bounds = [1024, 3072]

[train]
lr = 1e-3
epochs = 2
"#,
        )
        .map_err(s)?;
        let file = Some(Path::new("job.toml"));

        let cfg = TrainConfig::load(file, &[]).map_err(s)?;
        assert_eq!(cfg.train.lr, 1e-3);
        assert_eq!(cfg.train.epochs, 2);
        assert_eq!(cfg.drafter.block_size, 10);
        assert_eq!(cfg.drafter.target_layer_ids, Some(vec![1, 9, 17]));
        assert_eq!(cfg.data.too_long, TooLong::Skip);
        assert_eq!(cfg.data.bucket_bounds, vec![1024, 3072]);
        assert_eq!(cfg.gamma(10), 5.0);
        // Relative paths resolve against the current directory.
        assert_eq!(
            cfg.target.path,
            Some(jail.directory().join("models/qwen3-8b"))
        );
        assert_eq!(cfg.data.train, Some(jail.directory().join("data/train")));
        assert_eq!(cfg.run.dir, jail.directory().join("runs"));
        // Untouched fields keep their defaults.
        assert_eq!(cfg.train.weight_decay, 0.0);

        jail.set_env("DFLASH_TRAIN__LR", "2e-4");
        jail.set_env("DFLASH_PIPELINE__QUEUE_CAPACITY", "9");
        jail.set_env("DFLASH_DATA__BUCKET_BOUNDS", "[512, 2048, 4096]");
        jail.set_env("DFLASH_RUN__DIR", "/abs/runs");
        // Not nested: not a config key, ignored.
        jail.set_env("DFLASH_LOG", "debug");
        let cfg = TrainConfig::load(file, &[]).map_err(s)?;
        assert_eq!(cfg.train.lr, 2e-4);
        assert_eq!(cfg.train.epochs, 2);
        assert_eq!(cfg.pipeline.queue_capacity, 9);
        assert_eq!(cfg.data.bucket_bounds, vec![512, 2048, 4096]);
        assert_eq!(cfg.run.dir, PathBuf::from("/abs/runs"));

        let cfg = TrainConfig::load(
            file,
            &ov(&[
                ("train.lr", "3e-4"),
                ("train.recompute", "true"),
                ("run.name", "exp1"),
            ]),
        )
        .map_err(s)?;
        assert_eq!(cfg.train.lr, 3e-4);
        assert!(cfg.train.recompute);
        assert_eq!(cfg.run.name.as_deref(), Some("exp1"));
        assert_eq!(cfg.pipeline.queue_capacity, 9);

        // Overrides merge into nested tables without clobbering siblings.
        let cfg = TrainConfig::load(
            file,
            &ov(&[
                ("drafter.num_layers", "3"),
                ("drafter.mask_token_id", "151669"),
            ]),
        )
        .map_err(s)?;
        assert_eq!(cfg.drafter.num_layers, 3);
        assert_eq!(cfg.drafter.mask_token_id, Some(151669));
        assert_eq!(cfg.drafter.block_size, 10);
        Ok(())
    });
}

#[test]
fn unknown_keys_are_errors_naming_the_key_and_source() {
    jailed(|jail| {
        jail.create_file("typo.toml", "[train]\nlearning_rate = 1e-3\n")
            .map_err(s)?;
        let e = TrainConfig::load(Some(Path::new("typo.toml")), &[]).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ConfigError::Train(_)));
        assert!(
            msg.contains("learning_rate") && msg.contains("typo.toml"),
            "{msg}"
        );

        jail.create_file("section.toml", "[trian]\nlr = 1e-3\n")
            .map_err(s)?;
        let msg = TrainConfig::load(Some(Path::new("section.toml")), &[])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("trian") && msg.contains("section.toml"),
            "{msg}"
        );

        let msg = TrainConfig::load(None, &ov(&[("train.lrr", "1")]))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("lrr") && msg.contains("command-line override"),
            "{msg}"
        );

        jail.set_env("DFLASH_TRAIN__LRR", "1");
        let msg = TrainConfig::load(None, &[]).unwrap_err().to_string();
        assert!(msg.contains("lrr") && msg.contains("DFLASH_"), "{msg}");
        Ok(())
    });
}

#[test]
fn wrong_types_and_bad_values_name_the_field_and_source() {
    jailed(|jail| {
        jail.create_file("bad.toml", "[train]\nlr = \"fast\"\n")
            .map_err(s)?;
        let msg = TrainConfig::load(Some(Path::new("bad.toml")), &[])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("lr") && msg.contains("bad.toml"), "{msg}");

        jail.create_file("neg.toml", "[train]\nlr = -1.0\n")
            .map_err(s)?;
        let e = TrainConfig::load(Some(Path::new("neg.toml")), &[]).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ConfigError::Invalid { .. }));
        assert!(
            msg.contains("train.lr") && msg.contains("neg.toml"),
            "{msg}"
        );

        let msg = TrainConfig::load(None, &ov(&[("data.too_long", "drop")]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("drop"), "{msg}");

        let e = TrainConfig::load(None, &ov(&[("data.token_budget", "1000")])).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("data.token_budget") && msg.contains("command-line override"),
            "{msg}"
        );

        let msg = TrainConfig::load(None, &ov(&[("drafter.block_size", "1")]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("drafter.block_size"), "{msg}");

        let msg = TrainConfig::load(None, &ov(&[("data.bucket_bounds", "[1024, 512]")]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("data.bucket_bounds"), "{msg}");

        let msg = TrainConfig::load(
            None,
            &ov(&[
                ("drafter.target_layer_ids", "[1, 2]"),
                ("drafter.num_target_features", "3"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(msg.contains("num_target_features"), "{msg}");

        let e = TrainConfig::load(Some(Path::new("missing.toml")), &[]).unwrap_err();
        assert!(
            matches!(e, ConfigError::Io { .. }) && e.to_string().contains("missing.toml"),
            "{e}"
        );
        Ok(())
    });
}

#[test]
fn override_argument_parsing() {
    let pairs = parse_overrides(&["train.lr=3e-4", "run.name=a=b", " data.gamma = 5 "]).unwrap();
    assert_eq!(
        pairs,
        ov(&[
            ("train.lr", "3e-4"),
            ("run.name", "a=b"),
            ("data.gamma", "5")
        ])
    );
    assert!(
        parse_overrides(&["train.lr"])
            .unwrap_err()
            .to_string()
            .contains("train.lr")
    );
    assert!(parse_overrides(&["=3"]).is_err());
    jailed(|_| {
        let e = TrainConfig::load(None, &ov(&[("train..lr", "1")])).unwrap_err();
        assert!(e.to_string().contains("train..lr"));
        // A value's own spaces survive the trim inside a quoted TOML string.
        let quoted = parse_overrides(&["run.name = \" a b \" "]).unwrap();
        let cfg = TrainConfig::load(None, &quoted).unwrap();
        assert_eq!(cfg.run.name.as_deref(), Some(" a b "));
        Ok(())
    });
}

/// Dates and times are plain strings (run names often are), and `check_overrides` finds an
/// unknown key or a wrong type without judging values against other fields.
#[test]
fn overrides_take_dates_as_strings_and_are_checked_on_their_own() {
    jailed(|_| {
        for name in ["2024-01-01", "12:30:00", "2024-01-01T12:30:00"] {
            let cfg = TrainConfig::load(None, &ov(&[("run.name", name)])).unwrap();
            assert_eq!(cfg.run.name.as_deref(), Some(name));
        }
        // Below the default max_len, so `load` refuses it; on its own it is a valid budget.
        let budget = ov(&[("data.token_budget", "128")]);
        assert!(TrainConfig::load(None, &budget).is_err());
        TrainConfig::check_overrides(&budget).unwrap();
        let e = TrainConfig::check_overrides(&ov(&[("train.lrr", "1")])).unwrap_err();
        assert!(e.to_string().contains("lrr"), "{e}");
        let e = TrainConfig::check_overrides(&ov(&[("train.lr", "[1]")])).unwrap_err();
        assert!(e.to_string().contains("lr"), "{e}");
        Ok(())
    });
    // The environment joins the overrides wherever they are applied: checked with them.
    jailed(|jail| {
        jail.set_env("DFLASH_TRAIN__LRR", "1");
        let e = TrainConfig::check_overrides(&[]).unwrap_err();
        assert!(e.to_string().contains("lrr"), "{e}");
        Ok(())
    });
}

#[test]
fn resolved_toml_round_trips() {
    jailed(|jail| {
        let cfg = TrainConfig::load(
            None,
            &ov(&[
                ("target.path", "t"),
                ("data.train", "d/train"),
                ("data.eval", "d/eval"),
                ("data.gamma", "6.5"),
                ("train.max_steps", "100"),
                ("drafter.target_layer_ids", "[1, 3]"),
                ("eval.max_samples", "8"),
            ]),
        )
        .map_err(s)?;
        let text = cfg.to_toml_string().map_err(s)?;
        assert!(
            text.contains("[train]") && text.contains("lr = 0.0006"),
            "{text}"
        );
        jail.create_file("resolved.toml", &text).map_err(s)?;
        let back = TrainConfig::load(Some(Path::new("resolved.toml")), &[]).map_err(s)?;
        assert_eq!(back, cfg);
        let from_str = TrainConfig::load_toml_str(&text, "resolved", Path::new("/elsewhere"), &[])
            .map_err(s)?;
        assert_eq!(from_str, cfg, "absolute paths are kept as they are");
        Ok(())
    });
}

#[test]
fn toml_text_with_base_dir() {
    jailed(|_| {
        let cfg = TrainConfig::load_toml_str(
            "[target]\npath = \"assets/tiny-target\"\n[data]\ntrain = \"assets/tiny-data/train\"\n",
            "embedded default",
            Path::new("/repo"),
            &ov(&[("train.epochs", "1")]),
        )
        .map_err(s)?;
        assert_eq!(
            cfg.target.path,
            Some(PathBuf::from("/repo/assets/tiny-target"))
        );
        assert_eq!(cfg.run.dir, PathBuf::from("/repo/runs"));
        assert_eq!(cfg.train.epochs, 1);
        let msg =
            TrainConfig::load_toml_str("[x]\ny = 1\n", "embedded default", Path::new("/"), &[])
                .unwrap_err()
                .to_string();
        assert!(
            msg.contains("embedded default") && msg.contains('x'),
            "{msg}"
        );
        Ok(())
    });
}

#[test]
fn drafter_config_from_the_job() {
    jailed(|jail| {
        let target8 = Qwen3Config::from_file(fixture("target_qwen3-8b.json")).map_err(s)?;
        let tiny = Qwen3Config::from_file(fixture("target_tiny_v5.json")).map_err(s)?;

        let cfg = TrainConfig::load(None, &[]).map_err(s)?;
        let d = cfg.drafter_config(&target8).map_err(s)?;
        let reference =
            DrafterConfig::from_file(fixture("config_qwen3-8b-dflash.json")).map_err(s)?;
        assert_eq!(d, reference);

        let d = cfg.drafter_config(&tiny).map_err(s)?;
        assert_eq!(d.mask_token_id, 256);
        assert_eq!(d.target_layer_ids, vec![1, 2, 3, 4, 5]);

        let cfg = TrainConfig::load(
            None,
            &ov(&[
                ("drafter.target_layer_ids", "[2, 6]"),
                ("drafter.num_layers", "1"),
                ("drafter.block_size", "8"),
            ]),
        )
        .map_err(s)?;
        let d = cfg.drafter_config(&tiny).map_err(s)?;
        assert_eq!(d.target_layer_ids, vec![2, 6]);
        assert_eq!((d.num_hidden_layers, d.block_size), (1, 8));
        assert_eq!(cfg.gamma(d.block_size), 4.0);

        // Out-of-range explicit ids are caught against the target.
        let cfg =
            TrainConfig::load(None, &ov(&[("drafter.target_layer_ids", "[2, 8]")])).map_err(s)?;
        let msg = cfg.drafter_config(&tiny).unwrap_err().to_string();
        assert!(
            msg.contains("target_layer_ids") && msg.contains('8'),
            "{msg}"
        );

        // Unknown vocabulary: the mask id must be given.
        let mut odd = tiny.clone();
        odd.vocab_size = 300;
        let cfg = TrainConfig::load(None, &[]).map_err(s)?;
        let msg = cfg.drafter_config(&odd).unwrap_err().to_string();
        assert!(
            msg.contains("drafter.mask_token_id") && msg.contains("300"),
            "{msg}"
        );
        let cfg = TrainConfig::load(None, &ov(&[("drafter.mask_token_id", "299")])).map_err(s)?;
        assert_eq!(cfg.drafter_config(&odd).map_err(s)?.mask_token_id, 299);

        // init_from: the drafter directory's config defines the drafter (a shape key set to
        // its own value is accepted), checked against the target.
        std::fs::create_dir("init").map_err(s)?;
        std::fs::copy(fixture("config_qwen3-8b-dflash.json"), "init/config.json").map_err(s)?;
        let cfg = TrainConfig::load(
            None,
            &ov(&[("drafter.init_from", "init"), ("drafter.num_layers", "5")]),
        )
        .map_err(s)?;
        assert_eq!(cfg.drafter.init_from, Some(jail.directory().join("init")));
        assert_eq!(cfg.drafter_config(&target8).map_err(s)?, reference);
        let msg = cfg.drafter_config(&tiny).unwrap_err().to_string();
        assert!(msg.contains("hidden_size"), "{msg}");
        Ok(())
    });
}

/// With `drafter.init_from`, a shape key set to something else than the loaded drafter has is
/// refused naming the key, both values and the directory (it used to be silently ignored: a
/// block-16 drafter fine-tuned with `drafter.block_size=8` trained at 16); set to the same
/// value it is accepted. `data.max_len` is checked against the loaded block, not the
/// section's default, and the resolved config written into a run loads back as it was.
#[test]
fn init_from_refuses_shape_keys_that_disagree_with_the_loaded_drafter() {
    jailed(|jail| {
        let json = std::fs::read_to_string(fixture("config_qwen3-8b-dflash.json")).map_err(s)?;
        let init = jail.directory().join("init");
        std::fs::create_dir("init").map_err(s)?;
        std::fs::write("init/config.json", &json).map_err(s)?;
        let from = [("drafter.init_from", "init")];

        for (key, value, loaded) in [
            ("drafter.block_size", "8", "16"),
            ("drafter.num_layers", "2", "5"),
            ("drafter.mask_token_id", "7", "151669"),
            ("drafter.target_layer_ids", "[1, 2]", "[1, 9, 17, 25, 33]"),
            ("drafter.num_target_features", "3", "5"),
            ("drafter.intermediate_size", "64", "12288"),
            ("drafter.num_attention_heads", "4", "32"),
            ("drafter.num_key_value_heads", "4", "8"),
            ("drafter.head_dim", "64", "128"),
        ] {
            let e = TrainConfig::load(None, &ov(&[from[0], (key, value)])).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(&e, ConfigError::InitFromMismatch(m) if m.field == key),
                "{key}: {e:?}"
            );
            assert!(
                msg.contains(&format!("`{key}` = {value} "))
                    && msg.contains(&format!("which has {loaded}"))
                    && msg.contains(&init.display().to_string())
                    && msg.contains("command-line override"),
                "{key}: {msg}"
            );
        }
        // Set in a TOML file: that file is named.
        std::fs::write(
            "job.toml",
            "[drafter]\ninit_from = \"init\"\nblock_size = 8\n",
        )
        .map_err(s)?;
        let msg = TrainConfig::load(Some(Path::new("job.toml")), &[])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("job.toml") && msg.contains("block_size"),
            "{msg}"
        );

        // The same values as the loaded drafter are accepted, and the section takes the
        // loaded drafter's shape.
        let cfg = TrainConfig::load(
            None,
            &ov(&[
                from[0],
                ("drafter.block_size", "16"),
                ("drafter.target_layer_ids", "[1, 9, 17, 25, 33]"),
            ]),
        )
        .map_err(s)?;
        assert_eq!(cfg.drafter.block_size, 16);
        assert_eq!(cfg.drafter.intermediate_size, Some(12288));

        // A block-4 drafter: data.max_len 8 holds its blocks (the section's default block
        // of 16 would not), and the run's resolved config loads back, keys and all.
        std::fs::create_dir("init4").map_err(s)?;
        let json4 = json.replace("\"block_size\": 16", "\"block_size\": 4");
        assert_ne!(json4, json);
        std::fs::write("init4/config.json", &json4).map_err(s)?;
        let small = [
            ("drafter.init_from", "init4"),
            ("data.max_len", "8"),
            ("data.bucket_bounds", "[8]"),
        ];
        let cfg = TrainConfig::load(None, &ov(&small)).map_err(s)?;
        assert_eq!(cfg.drafter.block_size, 4);
        let saved = cfg.to_toml_string().map_err(s)?;
        let back =
            TrainConfig::load_toml_str(&saved, "run config", jail.directory(), &[]).map_err(s)?;
        assert_eq!(back, cfg);
        // ... and a drafter whose block is longer than data.max_len is refused by the loaded
        // value, naming the drafter it came from.
        let msg = TrainConfig::load(None, &ov(&[from[0], small[1], small[2]]))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("drafter.block_size")
                && msg.contains("16 exceeds data.max_len 8")
                && msg.contains(&init.display().to_string()),
            "{msg}"
        );

        // A config built in code: an optional shape key it holds is checked too, and the
        // loaded block against data.max_len.
        let target8 = Qwen3Config::from_file(fixture("target_qwen3-8b.json")).map_err(s)?;
        let mut built = TrainConfig::load(None, &[]).map_err(s)?;
        built.drafter.init_from = Some(init.clone());
        built.drafter.head_dim = Some(64);
        let msg = built.drafter_config(&target8).unwrap_err().to_string();
        assert!(
            msg.contains("drafter.head_dim") && msg.contains("128"),
            "{msg}"
        );
        built.drafter.head_dim = None;
        built.data.max_len = 8;
        let msg = built.drafter_config(&target8).unwrap_err().to_string();
        assert!(msg.contains("16 exceeds data.max_len 8"), "{msg}");
        Ok(())
    });
}

/// A fault of the `drafter.init_from` drafter's own config.json is reported against that
/// file, not against the training config or the layer that set `drafter.init_from`.
#[test]
fn init_from_drafter_faults_name_its_config_json() {
    jailed(|jail| {
        let json = std::fs::read_to_string(fixture("config_qwen3-8b-dflash.json")).map_err(s)?;
        std::fs::create_dir("init").map_err(s)?;
        let file = jail.directory().join("init").join("config.json");
        for (from, to, field) in [
            (
                "\"rms_norm_eps\": 1e-06",
                "\"rms_norm_eps\": 0",
                "rms_norm_eps",
            ),
            ("\"head_dim\": 128", "\"head_dim\": 127", "head_dim"),
            ("\"block_size\": 16", "\"block_size\": 1", "block_size"),
            (
                "\"mask_token_id\": 151669",
                "\"mask_token_id\": 151936",
                "dflash_config.mask_token_id",
            ),
        ] {
            let bad = json.replace(from, to);
            assert_ne!(bad, json, "{from}");
            std::fs::write(&file, &bad).map_err(s)?;
            let e = TrainConfig::load(None, &ov(&[("drafter.init_from", "init")])).unwrap_err();
            let ConfigError::Invalid {
                origin, field: f, ..
            } = &e
            else {
                return Err(format!("{field}: {e:?}"));
            };
            assert_eq!(origin, &file.display().to_string(), "{field}: {e}");
            assert_eq!(f, field, "{e}");
        }
        Ok(())
    });
}

/// The issue's unbounded knobs are refused before anything is allocated, each error naming
/// the knob: blocks longer than any sample, thread counts beyond the machine, a zero queue
/// timeout, duplicate target layers (given, or generated by a `num_target_features` above the
/// target's depth), and drafter sizes whose training state no machine holds.
#[test]
fn unbounded_knobs_are_refused_naming_the_knob() {
    jailed(|_| {
        let tiny = Qwen3Config::from_file(fixture("target_tiny_v5.json")).map_err(s)?;
        let target8 = Qwen3Config::from_file(fixture("target_qwen3-8b.json")).map_err(s)?;
        for (pairs, field, says) in [
            (
                &[("drafter.block_size", "100000")][..],
                "drafter.block_size",
                "exceeds data.max_len",
            ),
            (
                &[("drafter.block_size", "33"), ("data.max_len", "32")][..],
                "drafter.block_size",
                "exceeds data.max_len 32",
            ),
            (
                &[("backend.threads", "100000")][..],
                "backend.threads",
                "cores",
            ),
            (
                &[("pipeline.timeout_secs", "0")][..],
                "pipeline.timeout_secs",
                "at least 1",
            ),
            (
                &[("drafter.target_layer_ids", "[3, 3, 3]")][..],
                "drafter.target_layer_ids",
                "appears twice",
            ),
            // Not "is the dataset empty?": the knob that asked for nothing is named.
            (
                &[("train.epochs", "0")][..],
                "train.epochs",
                "is 0 and train.max_steps is not set: nothing to train",
            ),
            (
                &[("train.epochs", "1"), ("train.max_steps", "0")][..],
                "train.max_steps",
                "at least 1",
            ),
        ] {
            let msg = TrainConfig::load(None, &ov(pairs)).unwrap_err().to_string();
            assert!(
                msg.contains(field) && msg.contains(says),
                "{pairs:?}: {msg}"
            );
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let ok = (cores * 4).to_string();
        TrainConfig::load(None, &ov(&[("backend.threads", ok.as_str())])).map_err(s)?;

        // Generated ids: 9 features from the tiny target's 8 layers would repeat layers.
        let cfg =
            TrainConfig::load(None, &ov(&[("drafter.num_target_features", "9")])).map_err(s)?;
        let msg = cfg.drafter_config(&tiny).unwrap_err().to_string();
        assert!(
            msg.contains("num_target_features") && msg.contains("at most 5 fit"),
            "{msg}"
        );
        // Far more features than target layers: refused before 1e12 ids are made.
        let cfg = TrainConfig::load(
            None,
            &ov(&[("drafter.num_target_features", "1000000000000")]),
        )
        .map_err(s)?;
        let msg = cfg.drafter_config(&tiny).unwrap_err().to_string();
        assert!(
            msg.contains("num_target_features") && msg.contains("at most 5 fit"),
            "{msg}"
        );

        // Sizes: each refused naming its knob, against the 8B target (hidden 4096).
        for (knob, value, field) in [
            (
                "drafter.intermediate_size",
                "100000000000",
                "intermediate_size",
            ),
            ("drafter.head_dim", "1000000000", "head_dim"),
            ("drafter.num_layers", "100000000", "num_hidden_layers"),
            // Refused before its per-layer list (a byte a layer) is allocated.
            ("drafter.num_layers", "1000000000000", "num_hidden_layers"),
        ] {
            let cfg = TrainConfig::load(None, &ov(&[(knob, value)])).map_err(s)?;
            let msg = cfg.drafter_config(&target8).unwrap_err().to_string();
            assert!(
                msg.contains(field) && msg.contains(value) && msg.contains("training state"),
                "{knob}: {msg}"
            );
        }
        // The 8B recipe itself is far below the ceiling.
        let cfg = TrainConfig::load(None, &[]).map_err(s)?;
        let d = cfg.drafter_config(&target8).map_err(s)?;
        assert!(16.0 * d.trainable_params() < (1u64 << 40) as f64 / 10.0);
        Ok(())
    });
}

//! Bad input and failures: a missing or truncated dataset, a drafter or layer ids that do not
//! fit the target, unknown backends, kernels and plugin libraries are clear errors.

use std::path::Path;

use dflash_pipeline::train;

use crate::support::{
    Fixture, TARGET, TINY_TRAIN, config_from, config_text, err_text, link, tiny_samples,
};

#[test]
fn missing_dataset_is_an_error_naming_the_path_and_written_to_error_txt() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let missing = fx.path().join("no-such-data.jsonl");
    let mut cfg = fx.config(&[]);
    cfg.data.train = Some(missing.clone());
    let e = err_text(&train(&cfg, None).unwrap_err());
    assert!(e.contains(&missing.display().to_string()), "{e}");
    let saved = std::fs::read_to_string(fx.runs().join("run/error.txt")).unwrap();
    assert!(saved.contains(&missing.display().to_string()), "{saved}");
}

#[test]
fn truncated_arrow_file_is_an_error_naming_the_file() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let dir = fx.path().join("corrupt");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["state.json", "dataset_info.json"] {
        std::fs::copy(Path::new(TINY_TRAIN).join(f), dir.join(f)).unwrap();
    }
    let arrow = std::fs::read(Path::new(TINY_TRAIN).join("data-00000-of-00001.arrow")).unwrap();
    let file = dir.join("data-00000-of-00001.arrow");
    std::fs::write(&file, &arrow[..arrow.len() / 2 + 13]).unwrap();
    let mut cfg = fx.config(&[]);
    cfg.data.train = Some(dir);
    let e = err_text(&train(&cfg, None).unwrap_err());
    assert!(e.contains(&file.display().to_string()), "{e}");
    assert!(e.contains("truncated") || e.contains("corrupt"), "{e}");
}

#[test]
fn drafter_init_with_another_hidden_size_is_a_clear_error() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    // A complete, valid drafter directory for a target of hidden size 64.
    let mut small =
        dflash_config::Qwen3Config::from_file(Path::new(TARGET).join("config.json")).unwrap();
    small.hidden_size = 64;
    small.head_dim = 16;
    let shape = dflash_config::DrafterShape {
        num_layers: 1,
        block_size: 4,
        num_target_features: 2,
        dtype: dflash_config::DType::Float32,
        ..dflash_config::DrafterShape::standard(256)
    };
    let dcfg = dflash_config::DrafterConfig::for_target(&small, &shape).unwrap();
    let b = dflash_core::registry::create_backend("reference", &Default::default()).unwrap();
    let params = dflash_models::DrafterParams::init_random(b.as_ref(), &dcfg, 0.02, 0).unwrap();
    let dir = fx.path().join("drafter-h64");
    dflash_models::checkpoint::save_drafter(b.as_ref(), &dir, &dcfg, &params).unwrap();

    let mut cfg = fx.config(&[]);
    cfg.drafter.init_from = Some(dir);
    let e = err_text(&train(&cfg, None).unwrap_err());
    assert!(
        e.contains("hidden_size") && e.contains("64") && e.contains("128"),
        "{e}"
    );
}

#[test]
fn target_layer_ids_out_of_range_is_a_clear_error() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let cfg = config_from(
        &config_text(&fx.data(), &fx.runs(), "target_layer_ids = [1, 9]"),
        &[],
    );
    let e = err_text(&train(&cfg, None).unwrap_err());
    assert!(e.contains("layer 9") && e.contains("out of range"), "{e}");
}

#[test]
fn unknown_backend_or_attention_kernel_lists_the_registered_names() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let e = err_text(&train(&fx.config(&[("backend.name", "no-such-backend")]), None).unwrap_err());
    assert!(
        e.contains("no-such-backend") && e.contains("reference"),
        "{e}"
    );
    let e =
        err_text(&train(&fx.config(&[("backend.attention", "no-such-kernel")]), None).unwrap_err());
    assert!(
        e.contains("no-such-kernel") && e.contains("reference") && e.contains("tiled"),
        "{e}"
    );
}

#[test]
fn plugins_paths_register_kernels_by_name_and_a_missing_library_is_named() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let e = err_text(
        &train(
            &fx.config(&[("plugins.paths", "[\"/no/such/libplugin.so\"]")]),
            None,
        )
        .unwrap_err(),
    );
    assert!(
        e.contains("plugins.paths") && e.contains("/no/such/libplugin.so"),
        "{e}"
    );
    // The C example plugin, loaded from the list, serves `backend.attention` by its own name.
    let lib = format!("[{:?}]", dflash_plugin_c_attention::LIBRARY);
    let cfg = fx.config(&[
        ("plugins.paths", lib.as_str()),
        ("backend.attention", "c-attention"),
        ("train.max_steps", "2"),
    ]);
    let out = train(&cfg, None).expect("a job through the C plugin");
    assert!(out.final_loss.is_finite() && out.final_loss > 0.0);
}

//! The CUDA plugin as the CUDA backend's attention kernel (`backend.attention = "plugin:PATH"`):
//! the backend hands it device addresses and its stream, and the device conformance suite runs
//! through the backend's attention ops. Skips without a GPU.

use std::path::PathBuf;

/// Where cargo put this crate's cdylib: next to the test binary in `deps/` (cdylib file names
/// carry no hash), or one directory up.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let name = format!(
        "{}dflash_plugin_cuda_attention{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let dir = exe.parent().expect("test binary directory");
    [dir.join(&name), dir.join("..").join(&name)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not found next to {}", exe.display()))
}

/// The conformance table through the CUDA backend (`check_device_plugin`, what `cargo xtask
/// conformance --plugin` runs on a CUDA plugin): every case passes, none is skipped (the
/// plugin declares head dims 1..=1024 and GQA). Twice, each run with a backend of its own: the
/// second retains the device's primary context after the first released it (its modules
/// unloaded, its handle the same), so the plugin must not launch what it loaded for the first.
#[test]
fn the_cuda_plugin_conforms_through_the_cuda_backend() {
    for run in ["first", "second"] {
        let table = match dflash_plugin_conformance::check_device_plugin(&library()) {
            Ok(t) => t,
            Err(e) if e.contains("no usable CUDA device") => {
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        println!("{run} backend:\n{table}");
        assert!(table.passed(), "{run} backend: {table}");
        let skipped = table.count(|o| matches!(o, dflash_plugin_conformance::Outcome::Skipped(_)));
        assert_eq!(skipped, 0, "{run} backend: {table}");
    }
}

#[test]
fn a_host_backend_refuses_the_cuda_plugin_naming_its_device() {
    dflash_attention_loader::link();
    let name = format!("plugin:{}", library().display());
    let err = dflash_core::registry::create_host_attention(&name)
        .err()
        .expect("a CUDA plugin is no host kernel");
    let msg = err.to_string();
    assert!(
        msg.contains("CUDA device memory") && msg.contains("cuda-attention"),
        "{msg}"
    );
}

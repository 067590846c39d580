//! The CUDA plugin as the CUDA backend's attention kernel (`backend.attention = "plugin:PATH"`):
//! the backend hands it device addresses and its stream. The shared device attention suite
//! (every suite mask on three layouts, against the dense f64 oracle, outputs NaN-poisoned) and
//! the NaN cases run through the backend's attention ops. Skips without a GPU.

use std::path::PathBuf;

use dflash_backend_cuda::{CudaBackend, CudaOptions, DType, GemmPrecision};
use dflash_core::Error;
use dflash_core::registry::BackendOptions;
use dflash_tests::{F32_KERNEL, Layout, cases_on, check_backend_attention, nan_cases_on};

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

/// The CUDA backend with the plugin as its attention kernel, poison on, f32 activations; `None`
/// (after saying so) without CUDA.
fn backend() -> Option<CudaBackend> {
    dflash_attention_loader::link();
    let opts = BackendOptions {
        attention: format!("plugin:{}", library().display()),
        threads: 0,
        device: 0,
    };
    let copts = CudaOptions {
        gemm: GemmPrecision::Fp32,
        activations: DType::F32,
        poison: true,
        attn_forward_ctas: None,
    };
    match CudaBackend::with_options(&opts, copts) {
        Ok(b) => Some(b),
        Err(Error::Unavailable { reason, .. }) => {
            eprintln!("no CUDA device: skipped ({reason})");
            None
        }
        Err(e) => panic!("the CUDA backend failed to start with the plugin: {e}"),
    }
}

#[test]
fn the_cuda_plugin_conforms_through_the_cuda_backend() {
    let Some(cu) = backend() else { return };
    let layouts = [
        Layout::new(4, 2, 64),
        Layout::new(3, 3, 8),
        Layout::new(2, 1, 128),
    ];
    let masks = dflash_tests::suite_masks().expect("suite masks");
    let cases = cases_on(&masks, &layouts);
    let report = check_backend_attention(&cu, "plugin cuda-attention", &cases, &F32_KERNEL);
    println!("{report}");
    report.ensure_passed().unwrap();

    let nan = nan_cases_on(Layout::new(4, 2, 64)).expect("NaN cases");
    let report =
        dflash_tests::check_backend_attention_nan(&cu, "plugin cuda-attention, NaN inputs", &nan);
    println!("{report}");
    report.ensure_passed().unwrap();
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

//! Runs the attention conformance suite on every registered host attention kernel.
//!
//! Registrations come from `inventory::submit!` in each kernel's crate, so those crates must be
//! linked into this test binary: naming an item of each (below) guarantees that.

use dflash_core::registry::{attention_kernel_names, create_host_attention};
use dflash_tests::check_host_attention_kernel;

/// Forces the kernel crates (and their `inventory` registrations) into the link.
fn link_kernels() {
    dflash_attention_tiled::link();
    let _ = std::any::type_name::<dflash_backend_reference::ReferenceAttention>();
}

#[test]
fn reference_and_tiled_are_registered() {
    link_kernels();
    let names = attention_kernel_names();
    for want in ["reference", "tiled"] {
        assert!(
            names.iter().any(|n| n == want),
            "attention kernel {want:?} is not registered; registered: {names:?}"
        );
    }
}

#[test]
fn every_registered_kernel_conforms() {
    link_kernels();
    let names = attention_kernel_names();
    assert!(!names.is_empty(), "no attention kernel is registered");
    let mut failures = Vec::new();
    for name in &names {
        let kernel =
            create_host_attention(name).unwrap_or_else(|e| panic!("creating kernel {name:?}: {e}"));
        assert_eq!(
            kernel.name(),
            name,
            "kernel registered as {name:?} reports name {:?}",
            kernel.name()
        );
        let start = std::time::Instant::now();
        let report = check_host_attention_kernel(kernel.as_ref())
            .unwrap_or_else(|e| panic!("kernel={name}: conformance suite could not run: {e}"));
        println!("{report}");
        println!("kernel={name} suite took {:.2?}", start.elapsed());
        if let Err(e) = report.ensure_passed() {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The suite through a backend's own attention ops (upload, forward, backward on its own
/// out/lse, download): the path device kernels take, here with each host kernel behind the
/// reference backend, at the f32 device kernels' bounds.
#[test]
fn reference_backend_attention_conforms_through_its_ops() {
    link_kernels();
    let cases = dflash_tests::suite_cases().expect("suite cases");
    let mut failures = Vec::new();
    for name in ["reference", "tiled"] {
        let backend = dflash_tests::reference_with(name);
        let report = dflash_tests::check_backend_attention(
            backend.as_ref(),
            &format!("reference backend, {name} attention"),
            &cases,
            &dflash_tests::F32_KERNEL,
        );
        println!("{report}");
        if let Err(e) = report.ensure_passed() {
            failures.push(e);
        }
        let nan = dflash_tests::check_backend_attention_nan(
            backend.as_ref(),
            &format!("reference backend, {name} attention, NaN inputs"),
            &dflash_tests::nan_input_cases_on(dflash_tests::Layout::new(4, 2, 16))
                .expect("NaN cases"),
        );
        println!("{nan}");
        if let Err(e) = nan.ensure_passed() {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

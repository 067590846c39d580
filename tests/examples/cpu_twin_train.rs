//! Trains a config on the CPU reference backend with wgpu's tensor-core attention forward's
//! numerics (its CPU twin, `dflash_tests::f16_products`: q, k, v and P rounded to f16 where the
//! kernel rounds them) or with the reference attention, so that what those numerics do to
//! training shows without a GPU:
//!
//! ```text
//! cargo run --release -p dflash-tests --example cpu_twin_train -- twin|reference [--set KEY=VALUE]...
//! ```
//!
//! e.g. `twin --set drafter.head_dim=128 --set train.epochs=1` against `reference` with the
//! same settings, from the repository root (the embedded default's paths are relative to it).
//! Prints the run's losses and tau before and after.

use std::path::Path;
use std::sync::Arc;

use dflash_backend_reference::ReferenceBackend;
use dflash_config::TrainConfig;
use dflash_core::Backend;
use dflash_core::registry::{BackendOptions, BackendRegistration};
use dflash_tests::f16_products::WGPU_COOP_FORWARD;

fn create_twin(opts: &BackendOptions) -> dflash_core::Result<Arc<dyn Backend>> {
    let be = ReferenceBackend::with_attention_kernel(opts, Box::new(WGPU_COOP_FORWARD))?;
    Ok(Arc::new(be))
}

inventory::submit! {
    BackendRegistration {
        name: "reference-f16-products-twin",
        description: "the reference backend with the CPU twin of wgpu's tensor-core attention \
                      forward (tests/examples/cpu_twin_train.rs)",
        create: create_twin,
        device_count: || 1,
        preferred_attention: "reference",
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (which, sets) = args
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("usage: cpu_twin_train twin|reference [--set K=V]..."))?;
    let backend = match which.as_str() {
        "twin" => "reference-f16-products-twin",
        "reference" => "reference",
        other => anyhow::bail!("{other:?}: expected twin or reference"),
    };
    dflash_backend_reference::link();
    let mut overrides = vec![
        ("backend.name".to_string(), format!("{backend:?}")),
        ("backend.attention".to_string(), "\"reference\"".to_string()),
        ("run.name".to_string(), format!("\"cpu-twin-{which}\"")),
    ];
    let mut it = sets.iter();
    while let Some(flag) = it.next() {
        anyhow::ensure!(flag == "--set", "{flag:?}: expected --set KEY=VALUE");
        let kv = it
            .next()
            .ok_or_else(|| anyhow::anyhow!("--set needs KEY=VALUE"))?;
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--set {kv:?}: expected KEY=VALUE"))?;
        overrides.push((k.to_string(), v.to_string()));
    }
    let cfg = TrainConfig::load(Some(Path::new("configs/default.toml")), &overrides)?;
    let out = dflash_pipeline::train(&cfg, None)?;
    println!(
        "{which}: run_dir={} steps={} loss_first={:.4} loss_last={:.4} acc_last={:.3} \
         tau_before={:?} tau_after={:?}",
        out.run_dir.display(),
        out.steps,
        out.first_loss,
        out.final_loss,
        out.final_accuracy,
        out.tau_before,
        out.tau_after
    );
    Ok(())
}

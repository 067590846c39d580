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

/// Which attention the reference backend trains with.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Attention {
    /// The twin of the tensor-core forward (f16 products).
    Twin,
    /// The reference kernel (f64 scores).
    Reference,
}

#[derive(clap::Parser)]
struct Args {
    attention: Attention,
    /// Config overrides, as `dflash train --set`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let (which, backend) = match args.attention {
        Attention::Twin => ("twin", "reference-f16-products-twin"),
        Attention::Reference => ("reference", "reference"),
    };
    dflash_backend_reference::link();
    let mut overrides = vec![
        ("backend.name".to_string(), format!("{backend:?}")),
        ("backend.attention".to_string(), "\"reference\"".to_string()),
        ("run.name".to_string(), format!("\"cpu-twin-{which}\"")),
    ];
    overrides.extend(dflash_config::parse_overrides(&args.set)?);
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

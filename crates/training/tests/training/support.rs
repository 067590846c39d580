//! Shared fixtures: the reference backend, the tiny target and a small drafter for it, real
//! samples of the embedded data and their host features, and the AdamW settings.

use std::path::Path;
use std::sync::Arc;

use dflash_config::{DType, DrafterConfig, DrafterShape, Qwen3Config};
use dflash_core::Backend;
use dflash_core::pipeline::{Features, HiddenSeq, Target};
use dflash_core::registry::{BackendOptions, create_backend};
use dflash_models::drafter::FrozenTarget;
use dflash_models::{Drafter, DrafterParams, Qwen3Target};
use dflash_training::optimizer::AdamWHyper;

pub(crate) const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");
const TINY_TRAIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-data/train");
pub(crate) const MASK: u32 = 256;

pub(crate) fn backend(attention: &str) -> Arc<dyn Backend> {
    dflash_backend_reference::link();
    dflash_attention_tiled::link();
    let opts = BackendOptions {
        attention: attention.into(),
        ..Default::default()
    };
    create_backend("reference", &opts).unwrap()
}

pub(crate) fn drafter_config(block_size: usize) -> DrafterConfig {
    let t = Qwen3Config::from_file(Path::new(TARGET).join("config.json")).unwrap();
    let shape = DrafterShape {
        num_layers: 1,
        block_size,
        num_target_features: 2,
        dtype: DType::Float32,
        ..DrafterShape::standard(MASK)
    };
    DrafterConfig::for_target(&t, &shape).unwrap()
}

pub(crate) fn drafter(b: &Arc<dyn Backend>, cfg: &DrafterConfig, std: f32, seed: u64) -> Drafter {
    let params = DrafterParams::init_random(b.as_ref(), cfg, std, seed).unwrap();
    let (_, frozen) = FrozenTarget::load(b.as_ref(), Path::new(TARGET)).unwrap();
    Drafter::new(b.clone(), cfg.clone(), params, Arc::new(frozen)).unwrap()
}

pub(crate) fn target(b: &Arc<dyn Backend>, cfg: &DrafterConfig) -> Qwen3Target {
    Qwen3Target::load(b.clone(), Path::new(TARGET), &cfg.target_layer_ids).unwrap()
}

/// A real sample of the embedded data.
pub(crate) fn data_sample(i: usize) -> (Vec<u32>, Vec<u8>) {
    let s = dflash_data::open_dataset(TINY_TRAIN)
        .unwrap()
        .get(i)
        .unwrap();
    (s.ids, s.loss_mask)
}

/// Host features (the tests below slice, poison and clone them).
pub(crate) fn seq(target: &Qwen3Target, id: u64, ids: Vec<u32>, loss_mask: Vec<u8>) -> HiddenSeq {
    let features = Features::Host(target.features(&ids).unwrap().to_host().unwrap());
    HiddenSeq {
        sample_id: id,
        ids,
        loss_mask,
        features,
    }
}

pub(crate) fn host(f: &Features) -> &[f32] {
    match f {
        Features::Host(h) => h,
        Features::Tensor(_) => panic!("these tests keep features on the host"),
    }
}

pub(crate) fn clone_seq(s: &HiddenSeq) -> HiddenSeq {
    HiddenSeq {
        sample_id: s.sample_id,
        ids: s.ids.clone(),
        loss_mask: s.loss_mask.clone(),
        features: Features::Host(host(&s.features).to_vec()),
    }
}

pub(crate) const HYPER: AdamWHyper = AdamWHyper {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.0,
};

//! Shared helpers of the dflash-models integration tests: the reference backend, seeded
//! random data and a tiny drafter problem (one helper per family of inputs).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dflash_config::{DType, DrafterConfig, DrafterShape, Qwen3Config};
use dflash_core::Backend;
use dflash_core::registry::BackendOptions;
use dflash_models::DrafterParams;
use dflash_models::drafter::{FrozenTarget, normal_vec};
// Not every test file uses every one of these.
#[allow(unused_imports)]
pub use dflash_tests::tolerance::{AtolUnit, Tolerance, assert_close, closeness};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The CPU reference backend, one thread (deterministic and cheap on 2 cores).
pub fn backend() -> Arc<dyn Backend> {
    dflash_backend_reference::link();
    Arc::new(
        dflash_backend_reference::ReferenceBackend::new(&BackendOptions {
            attention: "reference".into(),
            threads: 1,
            device: 0,
        })
        .expect("the reference backend builds"),
    )
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `tests/fixtures/qwen3-random` of the workspace.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3-random")
}

// ---------------------------------------------------------------------------------------
// The tiny drafter problem.

pub const H: usize = 16;
pub const V: usize = 40;
pub const BS: usize = 4;
pub const S: usize = 11;
pub const MASK_ID: u32 = (V - 1) as u32;
/// Two overlapping blocks (2 and 3), one running past the end (9: slots at 11, 12 >= S) and
/// one padding block.
pub const ANCHORS: [i32; 4] = [2, 3, 9, -1];

/// A tiny Qwen3 target config (only hidden size, vocabulary, depth and RoPE matter to the
/// drafter). RoPE theta 1e4 so positions 0..12 rotate visibly in every frequency pair.
pub fn tiny_target_cfg() -> Qwen3Config {
    Qwen3Config {
        model_type: "qwen3".into(),
        vocab_size: V,
        hidden_size: H,
        intermediate_size: 32,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_id: None,
        dtype: Some("float32".into()),
    }
}

/// hidden 16, 2 layers, 4 q / 2 kv heads, head_dim 8, intermediate 24, vocab 40, block 4,
/// k = 2 target features (layers [1, 3]).
pub fn tiny_drafter_cfg() -> DrafterConfig {
    let shape = DrafterShape {
        num_layers: 2,
        block_size: BS,
        mask_token_id: MASK_ID,
        num_target_features: 2,
        target_layer_ids: Some(vec![1, 3]),
        intermediate_size: Some(24),
        num_attention_heads: Some(4),
        num_key_value_heads: Some(2),
        head_dim: Some(8),
        layer_types: None,
        sliding_window: None,
        dtype: DType::Float32,
    };
    DrafterConfig::for_target(&tiny_target_cfg(), &shape).expect("tiny drafter config is valid")
}

/// Random parameters: linear weights `N(0, 0.2)` and every norm weight `1 + N(0, 0.2)`
/// (so a gradient bug that only shows with non-unit norm weights is not hidden).
pub fn random_params(b: &dyn Backend, cfg: &DrafterConfig, seed: u64) -> DrafterParams {
    let mut params = DrafterParams::init_random(b, cfg, 0.2, seed).unwrap();
    let mut r = rng(seed ^ 0x5eed);
    let layout = DrafterParams::layout(cfg);
    for ((name, shape), t) in layout.iter().zip(params.tensors_mut()) {
        if name.ends_with("norm.weight") || name.ends_with("layernorm.weight") {
            let n: usize = shape.iter().product();
            let w: Vec<f32> = normal_vec(&mut r, n, 0.2).iter().map(|x| 1.0 + x).collect();
            *t = b.upload(&w, shape).unwrap();
        }
    }
    params
}

/// Host copies of the frozen target tensors and their uploaded form.
pub struct Frozen {
    pub embed: Vec<f32>,
    pub lm_head: Vec<f32>,
    pub tensors: Arc<FrozenTarget>,
}

/// Random frozen embedding `N(0, 1)` and LM head `N(0, 0.5)`, both `(V, H)`.
pub fn random_frozen(b: &dyn Backend, v: usize, h: usize, seed: u64) -> Frozen {
    let mut r = rng(seed);
    let embed = normal_vec(&mut r, v * h, 1.0);
    let lm_head = normal_vec(&mut r, v * h, 0.5);
    let tensors = Arc::new(FrozenTarget::new(
        b.upload(&embed, &[v, h]).unwrap(),
        b.upload(&lm_head, &[v, h]).unwrap(),
    ));
    Frozen {
        embed,
        lm_head,
        tensors,
    }
}

/// One sequence: random ids (never the mask token), a loss mask with prompt tokens 0..2 and
/// one unsupervised hole at position 5 (inside the overlapping blocks), and random features.
pub struct Sequence {
    pub ids: Vec<u32>,
    pub loss_mask: Vec<u8>,
    /// `(S, k*H)` features `N(0, 1)`.
    pub features: Vec<f32>,
}

pub fn random_sequence(k: usize, seed: u64) -> Sequence {
    let mut r = rng(seed);
    let ids: Vec<u32> = (0..S).map(|_| r.random_range(0..MASK_ID)).collect();
    let mut loss_mask = vec![1u8; S];
    loss_mask[0] = 0;
    loss_mask[1] = 0;
    loss_mask[5] = 0;
    let features = normal_vec(&mut r, S * k * H, 1.0);
    Sequence {
        ids,
        loss_mask,
        features,
    }
}

//! The three ways target features reach the drafter — host values, a tensor already on the
//! drafter's device (borrowed as it is), a tensor of another backend or device (imported
//! through [`dflash_core::Storage::read_host`]) — compute the same loss and gradients, bit for
//! bit on the reference backend; a mis-shaped tensor is a clear error.

mod common;

use std::any::Any;

use common::*;
use dflash_config::default_gamma;
use dflash_core::pipeline::FeaturesRef;
use dflash_core::{Storage, Tensor};
use dflash_data::block_targets;
use dflash_models::{DraftInput, Drafter, DrafterGrads};

/// A buffer of some other device: only its host read-back works, as for a real foreign GPU
/// tensor, so the drafter must import it.
#[derive(Debug)]
struct RemoteStorage(Vec<f32>);
impl Storage for RemoteStorage {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn backend_name(&self) -> &'static str {
        "remote"
    }
    fn read_host(&self, n: usize) -> dflash_core::Result<Vec<f32>> {
        Ok(self.0[..n].to_vec())
    }
}

#[test]
fn host_local_and_imported_features_train_identically() {
    let b = backend();
    let cfg = tiny_drafter_cfg();
    let k = cfg.target_layer_ids.len();
    let frozen = random_frozen(b.as_ref(), V, H, 3).tensors;
    let drafter = Drafter::new(
        b.clone(),
        cfg.clone(),
        random_params(b.as_ref(), &cfg, 4),
        frozen,
    )
    .unwrap();
    let seq = random_sequence(k, 5);
    let bt = block_targets(
        &seq.ids,
        &seq.loss_mask,
        &ANCHORS,
        BS,
        default_gamma(BS) as f32,
        MASK_ID,
    );
    let local = b.upload(&seq.features, &[S, k * H]).unwrap();
    assert!(b.is_local(&local));
    let remote = Tensor::from_storage(Box::new(RemoteStorage(seq.features.clone())), [S, k * H]);
    assert!(!b.is_local(&remote));

    let run = |features: FeaturesRef<'_>| {
        let inp = DraftInput {
            features,
            anchors: &ANCHORS,
            block_ids: &bt.block_ids,
            positions: &bt.positions,
            labels: &bt.labels,
            weights: &bt.weights,
            doc_starts: &[],
            ctx_positions: &[],
        };
        let mut g = DrafterGrads::zeros(b.as_ref(), &cfg).unwrap();
        let stats = drafter.forward_backward(&inp, 0.37, &mut g, false).unwrap();
        let grads: Vec<Vec<f32>> = g.tensors().iter().map(|t| b.download(t).unwrap()).collect();
        (stats.weighted_loss, grads)
    };
    let (loss_host, g_host) = run(FeaturesRef::Host(&seq.features));
    assert!(loss_host.is_finite() && loss_host > 0.0);
    assert!(g_host.iter().flatten().any(|&x| x != 0.0));
    for (name, f) in [
        ("local tensor", FeaturesRef::Tensor(&local)),
        ("imported tensor", FeaturesRef::Tensor(&remote)),
    ] {
        let (loss, g) = run(f);
        assert_eq!(loss.to_bits(), loss_host.to_bits(), "{name}: loss");
        assert_eq!(g, g_host, "{name}: gradients");
    }

    // A tensor whose columns are not k*H is refused by name, before any compute.
    let wrong = b.upload(&seq.features, &[S * k, H]).unwrap();
    let inp = DraftInput {
        features: FeaturesRef::Tensor(&wrong),
        anchors: &ANCHORS,
        block_ids: &bt.block_ids,
        positions: &bt.positions,
        labels: &bt.labels,
        weights: &bt.weights,
        doc_starts: &[],
        ctx_positions: &[],
    };
    let err = drafter.loss(&inp).unwrap_err().to_string();
    assert!(
        err.contains("features tensor") && err.contains(&format!("{}", k * H)),
        "{err}"
    );
}

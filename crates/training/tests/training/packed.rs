//! Packed micro-batches: the target's packed forward and one drafter forward/backward over
//! all documents equal the sequences taken one by one.

use dflash_core::pipeline::Target;
use dflash_models::DrafterParams;
use dflash_training::{BlockSpec, PreparedSeq};

use crate::support::{MASK, backend, data_sample, drafter, drafter_config, seq, target};

/// A packed micro-batch is the same computation as its sequences one by one: the target's
/// packed forward (document mask, per-document positions) gives each sequence's features, and
/// one drafter forward/backward over all blocks (per-document DFlash masks) gives the same
/// loss statistics and gradients as accumulating the sequences separately. Tolerance: the
/// reference backend accumulates in f64 and stores f32, so the two paths differ only by f32
/// rounding of intermediates summed in another order: 1e-5 absolute + 1e-4 relative.
#[test]
fn packed_micro_batch_matches_sequence_by_sequence() {
    use dflash_core::pipeline::{HiddenBatch, SeqMeta};
    use dflash_training::PreparedBatch;
    let close = |what: &str, got: &[f32], want: &[f32]| {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                "{what}[{i}]: packed {g} vs one by one {w}"
            );
        }
    };
    for attention in ["reference", "tiled"] {
        let b = backend(attention);
        let cfg = drafter_config(4);
        let t = target(&b, &cfg);
        // Three real samples of different lengths, one of them short.
        let samples: Vec<(Vec<u32>, Vec<u8>)> = [(0, 160), (1, 37), (2, 120)]
            .iter()
            .map(|&(i, len)| {
                let (ids, mask) = data_sample(i);
                let n = len.min(ids.len());
                (ids[..n].to_vec(), mask[..n].to_vec())
            })
            .collect();
        let docs: Vec<&[u32]> = samples.iter().map(|(ids, _)| ids.as_slice()).collect();
        let packed = t.features_packed(&docs).unwrap();
        let one_by_one: Vec<f32> = docs
            .iter()
            .flat_map(|ids| t.features(ids).unwrap().to_host().unwrap())
            .collect();
        close(
            &format!("{attention}: features"),
            &packed.to_host().unwrap(),
            &one_by_one,
        );

        let spec = BlockSpec {
            block_size: cfg.block_size,
            num_anchors: 12,
            gamma: 4.0,
            mask_token_id: MASK,
            seed: 5,
        };
        let d = drafter(&b, &cfg, 0.05, 3);
        let mut g_seq = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
        let mut stats_seq = dflash_core::LossStats::default();
        let mut anchors_seq = Vec::new();
        let mut start = 0;
        for (k, (ids, mask)) in samples.iter().enumerate() {
            let s = seq(&t, 40 + k as u64, ids.clone(), mask.clone());
            let p = PreparedSeq::new(s, 2, &spec);
            anchors_seq.extend(p.anchors.iter().map(|a| a + start));
            start += ids.len() as i32;
            if p.anchors.is_empty() {
                continue; // a prompt-only document: no blocks (the replica skips it too)
            }
            let st = d
                .forward_backward(&p.as_input(), 1.0, &mut g_seq, false)
                .unwrap();
            stats_seq.merge(&st);
        }
        let batch = HiddenBatch {
            epoch: 2,
            step: 0,
            micro: 0,
            seqs: samples
                .iter()
                .enumerate()
                .map(|(k, (ids, mask))| SeqMeta {
                    sample_id: 40 + k as u64,
                    ids: ids.clone(),
                    loss_mask: mask.clone(),
                })
                .collect(),
            features: Some(packed),
        };
        let p = PreparedBatch::packed(batch, &spec).unwrap();
        assert_eq!(
            p.anchors, anchors_seq,
            "{attention}: the same anchors, shifted to packed rows"
        );
        let mut g_packed = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
        let stats = d
            .forward_backward(&p.as_input(), 1.0, &mut g_packed, false)
            .unwrap();
        assert!(stats.weight_sum > 0.0);
        assert_eq!(
            stats.weight_sum, stats_seq.weight_sum,
            "{attention}: same weights"
        );
        assert_eq!(
            (stats.counted, stats.correct),
            (stats_seq.counted, stats_seq.correct)
        );
        let rel = (stats.weighted_loss - stats_seq.weighted_loss).abs() / stats_seq.weighted_loss;
        assert!(
            rel < 1e-5,
            "{attention}: loss {} vs {}",
            stats.weighted_loss,
            stats_seq.weighted_loss
        );
        let names = DrafterParams::layout(&cfg);
        for ((name, _), (a, w)) in names
            .iter()
            .zip(g_packed.tensors().iter().zip(g_seq.tensors()))
        {
            let (a, w) = (b.download(a).unwrap(), b.download(w).unwrap());
            assert!(w.iter().any(|&x| x != 0.0), "{name}: gradient is zero");
            close(&format!("{attention}: d {name}"), &a, &w);
        }
    }
}

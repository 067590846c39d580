//! Loss statistics (weighted CE, weight sum, accuracy, greedy predictions) against the dense
//! §2.3 transcription, and the regression "labels shifted by one".

use dflash_models::DraftInput;
use rand::Rng;

use crate::common::*;
use crate::spec::{argmax_margin, dense_weighted_ce, spec_targets};
use crate::support::{input, problem, run_oracle};

/// (d) `LossStats` against the §2.3 transcription: weight sum from the formula, weighted CE
/// and accuracy from dense (oracle, f64) logits with same-position labels; greedy
/// predictions equal the dense argmax. Then accuracy with labels set to the argmax on half
/// the supervised rows, so `correct` is checked at a non-trivial value.
#[test]
fn loss_accuracy_and_weight_sum_match_dense_transcription() {
    let p = problem(51);
    let sp = spec_targets(&p.seq, p.gamma, 0);
    let inp = input(&p.seq, &p.bt);
    let stats = p.drafter.loss(&inp).unwrap();
    let o = run_oracle(&p, &sp.labels, &sp.weights);

    let wsum: f64 = sp.weights.iter().map(|&w| w as f64).sum();
    assert!(
        (stats.weight_sum - wsum).abs() <= 1e-6,
        "{} vs {wsum}",
        stats.weight_sum
    );
    let want = dense_weighted_ce(&o.logits, &sp.labels, &sp.weights);
    let rel = (stats.weighted_loss - want).abs() / want;
    assert!(
        rel <= 1e-5,
        "weighted loss {} vs dense {want} (rel {rel:e})",
        stats.weighted_loss
    );
    let loss_rel = (stats.loss() - want / wsum).abs() / (want / wsum);
    assert!(loss_rel <= 1e-5);

    // Greedy predictions of every non-padding row equal the dense argmax (margins are wide
    // on a random model; rows closer than 1e-3 to a tie are not compared).
    let pred = p.drafter.predict(&inp).unwrap();
    for (r, row) in o.logits.chunks(V).enumerate().take(3 * BS) {
        let (am, margin) = argmax_margin(row);
        if margin > 1e-3 {
            assert_eq!(pred[r] as usize, am, "row {r}");
        }
    }

    // Accuracy: rows with w > 0 whose argmax is the label.
    let supervised: Vec<usize> = (0..sp.weights.len())
        .filter(|&r| sp.weights[r] > 0.0)
        .collect();
    assert_eq!(stats.counted as usize, supervised.len());
    let mut labels = sp.labels.clone();
    let mut rr = rng(52);
    for &r in &supervised {
        if rr.random_bool(0.5) {
            labels[r] = argmax_margin(&o.logits[r * V..(r + 1) * V]).0 as u32;
        }
    }
    let (mut expect, mut ambiguous) = (0i64, 0i64);
    for &r in &supervised {
        let (am, margin) = argmax_margin(&o.logits[r * V..(r + 1) * V]);
        expect += (am as u32 == labels[r]) as i64;
        ambiguous += (margin <= 1e-3) as i64;
    }
    assert!(expect > 0, "the accuracy check needs some correct rows");
    let s2 = p
        .drafter
        .loss(&DraftInput {
            labels: &labels,
            ..inp
        })
        .unwrap();
    assert!(
        (s2.correct as i64 - expect).abs() <= ambiguous,
        "correct {} vs dense {expect} ({ambiguous} near-ties)",
        s2.correct
    );
    assert_eq!(s2.counted, stats.counted);
    eprintln!(
        "dense transcription: weighted loss rel error {rel:.3e}, accuracy {}/{}",
        s2.correct, s2.counted
    );
}

/// (e) Regression "labels shifted by one": the drafter's loss equals the dense §2.3 loss with
/// same-position labels (`ids[a+k]`) and clearly differs from the shifted one (`ids[a+k+1]`).
#[test]
fn labels_are_same_position_not_shifted() {
    let p = problem(61);
    let same = spec_targets(&p.seq, p.gamma, 0);
    let shifted = spec_targets(&p.seq, p.gamma, 1);
    assert_ne!(same.labels, shifted.labels);
    // block_targets' labels (what the drafter consumes) are the same-position ones.
    assert_eq!(p.bt.labels, same.labels);
    for (blk, &a) in ANCHORS.iter().enumerate().filter(|(_, a)| **a >= 0) {
        for k in 1..BS {
            let pos = a as usize + k;
            if pos < S {
                assert_eq!(
                    p.bt.labels[blk * BS + k],
                    p.seq.ids[pos],
                    "block {blk} slot {k}"
                );
            }
        }
    }
    let stats = p.drafter.loss(&input(&p.seq, &p.bt)).unwrap();
    let o = run_oracle(&p, &same.labels, &same.weights);
    let l_same = dense_weighted_ce(&o.logits, &same.labels, &same.weights);
    let l_shift = dense_weighted_ce(&o.logits, &shifted.labels, &shifted.weights);
    assert!((stats.weighted_loss - l_same).abs() <= 1e-5 * l_same);
    assert!(
        (stats.weighted_loss - l_shift).abs() > 0.05 * l_same,
        "same-position {l_same} and shifted {l_shift} losses are too close to tell apart"
    );
}

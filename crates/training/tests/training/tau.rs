//! The acceptance-length (tau) chain: batched cycles against a direct sequential
//! implementation of docs/design.md §2.5 with both attention kernels, `evaluate_tau`, and the
//! serving loop committing exactly the completion and stopping at a stop token.

use dflash_core::pipeline::{Features, HiddenSeq, Target};
use dflash_models::{DraftInput, Drafter, Qwen3Target};
use dflash_training::eval::sequence_cycles;
use dflash_training::{TrainError, evaluate_tau};

use crate::support::{
    MASK, backend, clone_seq, data_sample, drafter, drafter_config, host, seq, target,
};

/// The drafter's greedy block of `bs` slots for anchor `a` alone, given `features` rows `0..=a`.
fn predict_len(d: &Drafter, features: &[f32], ids: &[u32], a: usize, bs: usize) -> Vec<u32> {
    let mut block_ids = vec![MASK; bs];
    block_ids[0] = ids[a];
    let positions: Vec<i32> = (0..bs).map(|j| (a + j) as i32).collect();
    let input = DraftInput {
        features: features.into(),
        anchors: &[a as i32],
        block_ids: &block_ids,
        positions: &positions,
        labels: &vec![0; bs],
        weights: &vec![0.0; bs],
        doc_starts: &[],
        ctx_positions: &[],
    };
    d.predict(&input).unwrap()
}

/// A full block (`block_size` slots) for anchor `a`.
fn predict_one(d: &Drafter, features: &[f32], ids: &[u32], a: usize) -> Vec<u32> {
    predict_len(d, features, ids, a, d.config().block_size)
}

/// docs/design.md §2.5 written out directly: one drafter call per cycle, sequentially. The drafter
/// gets only the committed context, positions `< a`, plus a garbage row at `a` (the anchor's
/// own feature is not known at inference; the mask must hide it, and garbage makes a leak
/// visible); block `[token at a, MASK...]`; accepted = matching prefix of its greedy tokens
/// with the data at `a+1..`; tau = accepted + 1; next anchor `a + accepted + 1`. At the end,
/// as the serving loop does: the block is `min(block_size, S - a)` slots and a cycle commits
/// at most the `S - 1 - a` tokens still to generate.
fn sequential_cycles(d: &Drafter, s: &HiddenSeq) -> Vec<usize> {
    sequential_cycles_to(d, s, s.ids.len(), false)
}

/// [`sequential_cycles`] with generation ending after token `n - 1`; `whole`: every block has
/// `block_size` slots (the loop stopped by a stop token drafts whole blocks; slots at or past
/// `n` are compared with nothing).
fn sequential_cycles_to(d: &Drafter, s: &HiddenSeq, n: usize, whole: bool) -> Vec<usize> {
    let cfg = d.config();
    let (bs, kh) = (cfg.block_size, cfg.hidden_size * cfg.target_layer_ids.len());
    let Some(p0) = s.loss_mask.iter().position(|&m| m == 1) else {
        return Vec::new();
    };
    let mut cycles = Vec::new();
    let mut a = p0;
    while a + 1 < n {
        let mut features = host(&s.features)[..a * kh].to_vec();
        features.extend((0..kh).map(|i| ((i * 37 % 11) as f32 - 5.0) * 3.0));
        let len = if whole { bs } else { bs.min(n - a) };
        let pred = predict_len(d, &features, &s.ids, a, len);
        let mut accepted = 0;
        while accepted + 1 < len.min(n - a) && pred[accepted + 1] == s.ids[a + accepted + 1] {
            accepted += 1;
        }
        cycles.push((accepted + 1).min(n - 1 - a));
        a += accepted + 1;
    }
    cycles
}

/// Builds a sequence on which the drafter's acceptance follows `plan`: after a real prompt
/// and first completion token, each cycle appends the drafter's own first `k` predictions
/// then a token it did not predict (or, after a full block, any bonus token). Returns the
/// sequence and the tau of each planned cycle.
fn generate(
    target: &Qwen3Target,
    d: &Drafter,
    prompt: &[u32],
    plan: &[usize],
    len: usize,
) -> (HiddenSeq, Vec<usize>) {
    let bs = d.config().block_size;
    let mut ids = prompt.to_vec();
    let mut planned = Vec::new();
    while ids.len() < len {
        let a = ids.len() - 1;
        let features = target.features(&ids).unwrap().to_host().unwrap();
        let pred = predict_one(d, &features, &ids, a);
        let k = plan[planned.len() % plan.len()].min(bs - 1);
        ids.extend_from_slice(&pred[1..=k]);
        ids.push(if k + 1 < bs {
            (pred[k + 1] + 1) % 256
        } else {
            b'#' as u32
        });
        planned.push(k + 1);
    }
    ids.truncate(len);
    let p0 = prompt.len() - 1;
    let mask = (0..len).map(|i| u8::from(i >= p0)).collect();
    (seq(target, 0, ids, mask), planned)
}

fn check_tau_chain(attention: &str) {
    let b = backend(attention);
    let cfg = drafter_config(4);
    let t = target(&b, &cfg);
    // A larger init scale than training's 0.02, so predictions depend on the context.
    let d = drafter(&b, &cfg, 0.2, 11);
    let (ids, mask) = data_sample(3);
    let p0 = mask.iter().position(|&m| m == 1).unwrap();
    let prompt = &ids[p0 - 24..=p0];

    // Planned acceptance patterns, including full blocks (3 of 3) and rejections (0).
    let mut seqs = Vec::new();
    for (plan, len) in [
        (&[0usize, 3, 1, 2, 3, 0][..], 70),
        (&[2, 3, 3, 0, 1][..], 61),
    ] {
        let (s, planned) = generate(&t, &d, prompt, plan, len);
        let got = sequence_cycles(&d, &s, &[]).unwrap();
        assert_eq!(
            got,
            sequential_cycles(&d, &s),
            "{attention}: batched vs sequential"
        );
        // All but the last cycle (cut by the end of the sequence) follow the plan.
        assert!(got.len() >= 10);
        assert_eq!(
            got[..got.len() - 1],
            planned[..got.len() - 1],
            "{attention}"
        );
        assert!(got.contains(&4) && got.contains(&1));
        seqs.push((s, got));
    }

    // More anchors than one batched forward takes (256), so the chunk boundary is crossed.
    let (long, planned) = generate(&t, &d, &prompt[16..], &[3, 2, 3, 0, 3, 1, 3], 300);
    let got = sequence_cycles(&d, &long, &[]).unwrap();
    assert_eq!(
        got,
        sequential_cycles(&d, &long),
        "{attention}: long sequence"
    );
    assert_eq!(
        got[..got.len() - 1],
        planned[..got.len() - 1],
        "{attention}"
    );
    seqs.push((long, got));

    // evaluate_tau: mean over sequences of per-sequence mean tau; sequences without a
    // completion to draft (no supervised token, or only the last one) are left out.
    let (ids, _) = data_sample(7);
    let n = ids.len();
    let none = seq(&t, 2, ids.clone(), vec![0; n]);
    let last_only = seq(&t, 3, ids, (0..n).map(|i| u8::from(i + 1 == n)).collect());
    let mut all: Vec<HiddenSeq> = seqs.iter().map(|(s, _)| clone_seq(s)).collect();
    all.insert(1, none);
    all.push(last_only);
    let report = evaluate_tau(&d, &all, &[]).unwrap();
    let means: Vec<f64> = seqs
        .iter()
        .map(|(_, c)| c.iter().sum::<usize>() as f64 / c.len() as f64)
        .collect();
    assert_eq!(report.sequences, 3);
    assert_eq!(
        report.cycles,
        seqs.iter().map(|(_, c)| c.len()).sum::<usize>()
    );
    assert_eq!(report.per_sequence, means);
    assert!((report.tau - means.iter().sum::<f64>() / 3.0).abs() < 1e-12);

    // Nothing to measure (the issue's `tau=NaN sequences=0`): an error, never a NaN tau.
    for none in [&all[1..2], &all[all.len() - 1..], &[]] {
        match evaluate_tau(&d, none, &[]) {
            Err(e @ TrainError::NoEvalSequence { .. }) => {
                assert!(e.to_string().contains("tau is undefined"), "{e}")
            }
            other => panic!("expected NoEvalSequence, got {other:?}"),
        }
    }
}

#[test]
fn tau_chain_matches_sequential_definition_reference_attention() {
    check_tau_chain("reference");
}

#[test]
fn tau_chain_matches_sequential_definition_tiled_attention() {
    check_tau_chain("tiled");
}

/// The serving loop commits exactly the completion: summed over cycles, the committed
/// tokens equal the tokens to generate (no bonus token past the end is counted), and a stop
/// token ends generation right after it is committed.
#[test]
fn cycles_commit_exactly_the_completion_and_stop_at_eos() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let t = target(&b, &cfg);
    // Large init: predictions vary, so both full and partial acceptance occur over many seeds.
    for seed in 0..4 {
        let d = drafter(&b, &cfg, 0.2, seed);
        let (ids, mask) = data_sample(seed as usize);
        let p0 = mask.iter().position(|&m| m == 1).unwrap();
        let s = seq(&t, 0, ids.clone(), mask);
        let n = ids.len();
        let cycles = sequence_cycles(&d, &s, &[]).unwrap();
        assert_eq!(
            cycles.iter().sum::<usize>(),
            n - 1 - p0,
            "seed {seed}: whole completion"
        );
        assert!(cycles.iter().all(|&c| (1..=cfg.block_size).contains(&c)));

        // Stop at the first occurrence of some completion token: generation ends there.
        let eos_at = p0 + 1 + (n - p0 - 1) / 2;
        let eos = ids[eos_at];
        let first = p0 + ids[p0..].iter().position(|&x| x == eos).unwrap();
        let cut = sequence_cycles(&d, &s, &[eos]).unwrap();
        let expect = first.saturating_sub(p0);
        assert_eq!(
            cut.iter().sum::<usize>(),
            expect,
            "seed {seed}: stop token at {first}"
        );
    }
}

/// Generation that ends at a stop token drafts whole blocks up to the end, as the serving
/// loop does (it cannot know where it will stop); the batched cycles match the sequential
/// definition with whole blocks. The sequences accept whole blocks by construction (planned
/// on whole-block predictions), ending at a stop token placed last, so that shortened blocks,
/// whose last predictions differ (attention inside a block runs both ways), would show.
#[test]
fn blocks_stay_whole_up_to_a_stop_token() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let t = target(&b, &cfg);
    let (ids, mask) = data_sample(3);
    let p0 = mask.iter().position(|&m| m == 1).unwrap();
    let prompt = &ids[p0 - 24..=p0];
    // A token the tiny target's byte-level data never holds: the stop token, placed last.
    let stop = 300u32.min(cfg.vocab_size as u32 - 1);
    let mut differ = 0;
    // The prompt's last token is position 24 and each cycle commits 4 tokens, so at these
    // lengths the last cycle's anchor has 3 tokens left: a block of 3 slots, not 4, if
    // shortened, whose slot 1 is still compared with the data.
    for seed in 0..6 {
        let d = drafter(&b, &cfg, 0.2, seed);
        for len in [43, 47] {
            let (s, _) = generate(&t, &d, prompt, &[3], len);
            let mut ids = s.ids.clone();
            assert!(!ids.contains(&stop));
            *ids.last_mut().unwrap() = stop;
            let s = seq(&t, 0, ids, s.loss_mask.clone());
            let got = sequence_cycles(&d, &s, &[stop]).unwrap();
            let whole = sequential_cycles_to(&d, &s, len, true);
            assert_eq!(got, whole, "seed {seed}, length {len}");
            let shortened = sequential_cycles_to(&d, &s, len, false);
            differ += usize::from(whole != shortened);
        }
    }
    println!("{differ} of 12 sequences tell whole blocks from shortened ones");
    assert!(
        differ > 0,
        "no sequence tells whole blocks from shortened ones"
    );
}

/// Non-finite predictions give no tau: the argmax of a NaN row is a valid token id, so a tau
/// would be reported as a number. The error names the sample and where the NaN came from.
#[test]
fn non_finite_predictions_are_an_error_naming_the_sample() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let t = target(&b, &cfg);
    let mut d = drafter(&b, &cfg, 0.2, 1);
    let (ids, mask) = data_sample(3);
    let good = seq(&t, 40, ids.clone(), mask.clone());
    let mut bad = seq(&t, 41, ids, mask);
    let mut features = host(&bad.features).to_vec();
    features.fill(f32::NAN);
    bad.features = Features::Host(features);
    match evaluate_tau(&d, &[clone_seq(&good), bad], &[]) {
        Err(e @ TrainError::NonFiniteEval { .. }) => {
            let e = e.to_string();
            assert!(
                e.contains("sample 41") && e.contains("target's features"),
                "{e}"
            );
        }
        other => panic!("expected NonFiniteEval, got {other:?}"),
    }

    // Finite features through a NaN weight: the drafter is named.
    let n = cfg.hidden_size;
    d.params.norm = b.upload(&vec![f32::NAN; n], &[n]).unwrap();
    match evaluate_tau(&d, &[good], &[]) {
        Err(e @ TrainError::NonFiniteEval { .. }) => {
            let e = e.to_string();
            assert!(
                e.contains("sample 40") && e.contains("drafter's forward"),
                "{e}"
            );
        }
        other => panic!("expected NonFiniteEval, got {other:?}"),
    }
}

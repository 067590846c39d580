//! The generation path (`dflash regenerate`) on the CUDA backend against the reference:
//! `scatter_rows` (the KV cache's writes), `attention_rows` (a decode step's attention over
//! each row's own slot of a shared cache), and the whole KV-cache forward and greedy
//! generation of a real target.
//!
//! Skips cleanly without CUDA (`common`). Target: the fixture `tests/fixtures/qwen3-random`
//! (3 layers, vocab 96, weights ~N(0, 0.1): logits far from ties).

mod common;

use std::sync::Arc;

use common::*;
use dflash_backend_cuda::{DType, GemmPrecision};
use dflash_core::mask::{BlockMask, Interval};
use dflash_core::{AttentionOps, Backend, MemoryOps};
use dflash_models::Qwen3Target;
use dflash_models::generate::{GenerateOptions, Generated, Prompt, Sampling, generate};

const TARGET: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/qwen3-random/model"
);

#[test]
fn scatter_rows_matches_reference_in_place() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(41);
    let (rows, cols) = (23, 40);
    let base = rand_vec(&mut r, rows * cols, 1.0);
    let rows_to = [7usize, 0, 22, 13, 5];
    let src = rand_vec(&mut r, rows_to.len() * cols, 1.0);
    let mut want_t = up(&rf, &base, &[rows, cols]);
    rf.scatter_rows(&mut want_t, &rows_to, &up(&rf, &src, &[5, cols]))
        .unwrap();
    let want = down(&rf, &want_t);
    // Rows not named keep their values: `dst` is updated in place, not re-allocated.
    let mut got_t = up(&cu, &base, &[rows, cols]);
    cu.scatter_rows(&mut got_t, &rows_to, &up(&cu, &src, &[5, cols]))
        .unwrap();
    check_exact("scatter_rows f32", &down(&cu, &got_t), &want);
    // A 3-D cache view `(R, H, d)` is rows of `H * d`.
    let mut got3 = up(&cu, &base, &[rows, 4, 10]);
    cu.scatter_rows(&mut got3, &rows_to, &up(&cu, &src, &[5, 4, 10]))
        .unwrap();
    check_exact("scatter_rows (R, H, d)", &down(&cu, &got3), &want);
    // bf16 storage rounds each written value once (RNE), like an upload.
    let mut got_b = up_bf16(&cu, &base, &[rows, cols]);
    cu.scatter_rows(&mut got_b, &rows_to, &up(&cu, &src, &[5, cols]))
        .unwrap();
    assert_eq!(dtype_of(&got_b), DType::Bf16);
    check_exact(
        "scatter_rows bf16",
        &down(&cu, &got_b),
        &bf16_rounded(&want),
    );
    // Bad calls: a row twice, a row out of range, a wrong row length; none writes anything.
    let s2 = up(&cu, &src[..2 * cols], &[2, cols]);
    for (bad, what) in [
        (&[3usize, 3][..], "twice"),
        (&[3, rows][..], "out of range"),
    ] {
        let e = cu
            .scatter_rows(&mut got_t, bad, &s2)
            .err()
            .unwrap_or_else(|| panic!("scatter_rows accepted a row {what}"))
            .to_string();
        assert!(e.contains("scatter_rows") && e.contains("cuda:0"), "{e}");
    }
    let wrong = up(&cu, &src[..2 * 20], &[2, 20]);
    assert!(cu.scatter_rows(&mut got_t, &[1, 2], &wrong).is_err());
    check_exact(
        "scatter_rows: refused calls write nothing",
        &down(&cu, &got_t),
        &want,
    );
}

/// A decode step's mask: query row `j` sees keys `[slot_j * cap, slot_j * cap + len_j)` of
/// a cache of `slots * cap` rows, i.e. row-disjoint key ranges far apart.
fn decode_mask(cap: usize, rows: &[(usize, usize)], slots: usize) -> BlockMask {
    let first: Vec<Interval> = rows
        .iter()
        .map(|&(s, len)| Interval::new((s * cap) as i32, (s * cap + len) as i32))
        .collect();
    let second = vec![Interval::new(0, 0); rows.len()];
    BlockMask::from_intervals(slots * cap, first, second).unwrap()
}

#[test]
fn attention_rows_matches_reference_on_decode_masks() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(42);
    let (slots, cap) = (6, 96);
    // One new row each for five sequences of different lengths (one a single key), and a
    // prefill-shaped call: several rows of one slot with causal prefixes.
    let decode = [(4usize, 1usize), (0, 96), (2, 37), (5, 64), (1, 12)];
    let prefill: Vec<(usize, usize)> = (30..38).map(|n| (3, n)).collect();
    for (what, rows) in [("decode", &decode[..]), ("prefill", &prefill[..])] {
        let mask = decode_mask(cap, rows, slots);
        for (h, kv, d) in [(4usize, 2usize, 64usize), (8, 1, 128), (2, 2, 32)] {
            let n = rows.len();
            let q = rand_vec(&mut r, n * h * d, 1.0);
            let k = rand_vec(&mut r, slots * cap * kv * d, 1.0);
            let v = rand_vec(&mut r, slots * cap * kv * d, 1.0);
            let scale = 1.0 / (d as f32).sqrt();
            let want = rf
                .attention_rows(
                    &up(&rf, &q, &[n, h, d]),
                    &up(&rf, &k, &[slots * cap, kv, d]),
                    &up(&rf, &v, &[slots * cap, kv, d]),
                    &mask,
                    scale,
                )
                .unwrap();
            let want = down(&rf, &want);
            let got = cu
                .attention_rows(
                    &up(&cu, &q, &[n, h, d]),
                    &up(&cu, &k, &[slots * cap, kv, d]),
                    &up(&cu, &v, &[slots * cap, kv, d]),
                    &mask,
                    scale,
                )
                .unwrap();
            assert_close(
                &format!("attention_rows {what} h{h} kv{kv} d{d}"),
                &down(&cu, &got),
                &want,
                &Tolerance::DEVICE_F32_ATTN_OUT,
            );
        }
    }
}

fn load(be: Arc<dyn Backend>) -> Qwen3Target {
    Qwen3Target::load(be, std::path::Path::new(TARGET), &[2]).expect("the fixture loads")
}

fn prompts() -> Vec<Prompt> {
    (0..5u64)
        .map(|id| Prompt {
            id,
            ids: (0..3 + 7 * id as usize)
                .map(|i| ((i * 31 + id as usize * 17) % 96) as u32)
                .collect(),
        })
        .collect()
}

fn greedy(t: &Qwen3Target, batch: usize) -> Vec<Generated> {
    let opts = GenerateOptions {
        batch,
        capacity: 96,
        max_new_tokens: 40,
        prefill_tokens: 64,
        eos: vec![],
        sampling: Sampling::default(),
    };
    let mut out = Vec::new();
    generate(t, &opts, &mut prompts().into_iter(), &mut |g, _| {
        out.push(g);
        Ok(())
    })
    .unwrap();
    out.sort_by_key(|g| g.id);
    out
}

/// Exact-f32 GEMMs and f32 activations: the CUDA cache forward's logits equal the reference's
/// plain forward to f32 rounding (the models crate's cache-test bound: 1e-4 of the logits'
/// scale), and greedy generation is the same token for token at batch 1 and 3.
#[test]
fn kv_cache_generation_matches_reference() {
    let Some(cu) = cuda_with(GemmPrecision::Fp32) else {
        return;
    };
    let cu: Arc<dyn Backend> = Arc::new(cu);
    let rb: Arc<dyn Backend> = Arc::new(reference());
    let (tc, tr) = (load(cu.clone()), load(rb.clone()));
    let seq: Vec<u32> = (0..50).map(|i| (i * 13 % 96) as u32).collect();
    let want = tr.logits(&seq).unwrap();
    let mut cache = tc.kv_cache(2, 64).unwrap();
    let v = tc.config().vocab_size;
    tc.extend(&mut cache, &[(1, &seq[..20])]).unwrap();
    for n in 20..50 {
        let h = tc.extend(&mut cache, &[(1, &seq[n..n + 1])]).unwrap();
        let got = cu.download(&tc.head_logits(&h).unwrap()).unwrap();
        assert_close(
            &format!("cached logits at {n}"),
            &got,
            &want[n * v..(n + 1) * v],
            &Tolerance {
                atol: 1e-4,
                rtol: 0.0,
                atol_unit: AtolUnit::MaxWant,
                why: "f32 on both sides, summation order only",
            },
        );
    }
    let want = greedy(&tr, 5);
    for batch in [1, 3] {
        let got = greedy(&tc, batch);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.tokens, w.tokens, "prompt {} at batch {batch}", g.id);
            assert_eq!(g.finish, w.finish);
        }
    }
    println!("  greedy generation: cuda == reference token for token at batch 1 and 3");
}

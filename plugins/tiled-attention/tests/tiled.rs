//! Tests of the `tiled` kernel: the shared conformance suite at several tile sizes (odd sizes
//! put tile edges everywhere), determinism across thread counts, hand-checked values, and
//! errors (never panics) on malformed input.

use dflash_attention_tiled::{NAME, TiledAttention};
use dflash_core::mask::BlockMask;
use dflash_core::registry::{attention_kernel_names, create_host_attention};
use dflash_core::{AttnBackward, AttnDims, AttnForward, HostAttentionKernel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

#[test]
fn registered_as_tiled() {
    dflash_attention_tiled::link();
    assert!(attention_kernel_names().iter().any(|n| n == NAME));
    let k = create_host_attention(NAME).expect("create tiled");
    assert_eq!(k.name(), "tiled");
}

#[test]
fn conformance_default_tiles() {
    let report = dflash_tests::check_host_attention_kernel(&TiledAttention::new()).unwrap();
    println!("{report}");
    report.ensure_passed().unwrap();
}

#[test]
fn conformance_odd_tiles() {
    // 1x1 (every tile Partial or Full by a single element), 7x5 and 64x3: tiles that straddle
    // block, document and window boundaries in every way.
    for (qt, kt) in [(1, 1), (7, 5), (64, 3)] {
        let kernel = TiledAttention::with_tiles(qt, kt).unwrap();
        let report = dflash_tests::check_host_attention_kernel(&kernel).unwrap();
        println!("tiles {qt}x{kt}:\n{report}");
        report
            .ensure_passed()
            .unwrap_or_else(|e| panic!("tiles {qt}x{kt}: {e}"));
    }
}

#[test]
fn zero_tile_size_is_an_error() {
    let e = TiledAttention::with_tiles(0, 32).unwrap_err();
    assert!(e.contains("tile sizes"), "{e}");
}

struct Problem {
    dims: AttnDims,
    mask: BlockMask,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
}

fn dflash_problem() -> Problem {
    let anchors: Vec<i32> = (0..24).map(|b| 7 * b + 3).chain([-1, -1]).collect();
    let mask = BlockMask::dflash(180, 8, &anchors).unwrap();
    let dims = AttnDims {
        q_rows: mask.q_len(),
        kv_rows: mask.kv_len(),
        q_heads: 4,
        kv_heads: 2,
        head_dim: 32,
    };
    let nq = dims.q_rows * dims.q_heads * dims.head_dim;
    let nk = dims.kv_rows * dims.kv_heads * dims.head_dim;
    Problem {
        q: random(1, nq),
        k: random(2, nk),
        v: random(3, nk),
        d_out: random(4, nq),
        dims,
        mask,
    }
}

fn run_all(kernel: &TiledAttention, p: &Problem) -> Vec<Vec<u32>> {
    let (nq, nk, nl) = (p.q.len(), p.k.len(), p.dims.q_rows * p.dims.q_heads);
    let (mut out, mut lse) = (vec![f32::NAN; nq], vec![f32::NAN; nl]);
    AttnForward::new(
        &p.dims,
        &p.mask,
        0.2,
        [&p.q, &p.k, &p.v],
        [&mut out, &mut lse],
    )
    .and_then(|c| kernel.forward(c))
    .unwrap();
    let (mut dq, mut dk, mut dv) = (vec![f32::NAN; nq], vec![f32::NAN; nk], vec![f32::NAN; nk]);
    AttnBackward::new(
        &p.dims,
        &p.mask,
        0.2,
        [&p.q, &p.k, &p.v, &out, &lse, &p.d_out],
        [&mut dq, &mut dk, &mut dv],
    )
    .and_then(|c| kernel.backward(c))
    .unwrap();
    [out, lse, dq, dk, dv]
        .iter()
        .map(|t| t.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn bit_identical_across_runs_and_thread_counts() {
    let p = dflash_problem();
    let kernel = TiledAttention::new();
    let base = run_all(&kernel, &p);
    for threads in [1, 2, 3, 8] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for _ in 0..2 {
            let again = pool.install(|| run_all(&kernel, &p));
            assert!(
                again == base,
                "results differ bitwise with {threads} threads"
            );
        }
    }
}

#[test]
fn padding_rows_give_zero_out_and_neg_inf_lse() {
    let p = dflash_problem();
    let (nq, nl) = (p.q.len(), p.dims.q_rows * p.dims.q_heads);
    let (mut out, mut lse) = (vec![f32::NAN; nq], vec![f32::NAN; nl]);
    AttnForward::new(
        &p.dims,
        &p.mask,
        0.2,
        [&p.q, &p.k, &p.v],
        [&mut out, &mut lse],
    )
    .and_then(|c| TiledAttention::new().forward(c))
    .unwrap();
    let row_elems = p.dims.q_heads * p.dims.head_dim;
    // The last two blocks (16 rows) are padding.
    for r in p.dims.q_rows - 16..p.dims.q_rows {
        assert!(
            out[r * row_elems..(r + 1) * row_elems]
                .iter()
                .all(|&x| x == 0.0),
            "row {r}"
        );
        assert!(
            lse[r * p.dims.q_heads..(r + 1) * p.dims.q_heads]
                .iter()
                .all(|&x| x == f32::NEG_INFINITY)
        );
    }
    // Every other row sees something.
    assert!(
        lse[..(p.dims.q_rows - 16) * p.dims.q_heads]
            .iter()
            .all(|x| x.is_finite())
    );
}

#[test]
fn hand_checked_two_keys() {
    // One query row, two visible keys, D = 1: scores s = scale*q*k = [1, 3] -> softmax
    // [1/(1+e^2), e^2/(1+e^2)]; out = p . v; lse = ln(e + e^3).
    let mask = BlockMask::causal(2).unwrap();
    let dims = AttnDims {
        q_rows: 2,
        kv_rows: 2,
        q_heads: 1,
        kv_heads: 1,
        head_dim: 1,
    };
    let (q, k, v) = ([5.0f32, 1.0], [2.0f32, 6.0], [10.0f32, -2.0]);
    let (mut out, mut lse) = ([f32::NAN; 2], [f32::NAN; 2]);
    AttnForward::new(&dims, &mask, 0.1, [&q, &k, &v], [&mut out, &mut lse])
        .and_then(|c| TiledAttention::new().forward(c))
        .unwrap();
    // Row 0 sees key 0 only: s = 0.1*5*2 = 1.
    assert_eq!(out[0], 10.0);
    assert!((lse[0] - 1.0).abs() < 1e-6);
    // Row 1: s = [0.2, 0.6].
    let (e0, e1) = (0.2f64.exp(), 0.6f64.exp());
    let want = (e0 * 10.0 + e1 * -2.0) / (e0 + e1);
    assert!((out[1] as f64 - want).abs() < 1e-6, "{} vs {want}", out[1]);
    assert!((lse[1] as f64 - (e0 + e1).ln()).abs() < 1e-6);
}

#[test]
fn malformed_input_is_an_error_not_a_panic() {
    let p = dflash_problem();
    let kernel = TiledAttention::new();
    let nl = p.dims.q_rows * p.dims.q_heads;
    let mut out = vec![0.0; p.q.len()];
    let mut lse = vec![0.0; nl];
    // Short q.
    let e = AttnForward::new(
        &p.dims,
        &p.mask,
        0.2,
        [&p.q[1..], &p.k, &p.v],
        [&mut out, &mut lse],
    )
    .and_then(|c| kernel.forward(c))
    .unwrap_err();
    assert!(e.contains("q has"), "{e}");
    // Heads not divisible.
    let dims = AttnDims {
        q_heads: 3,
        ..p.dims
    };
    let e = AttnForward::new(
        &dims,
        &p.mask,
        0.2,
        [&p.q, &p.k, &p.v],
        [&mut out, &mut lse],
    )
    .and_then(|c| kernel.forward(c))
    .unwrap_err();
    assert!(e.contains("multiple"), "{e}");
    // Mask of another size.
    let other = BlockMask::causal(10).unwrap();
    let e = AttnForward::new(
        &p.dims,
        &other,
        0.2,
        [&p.q, &p.k, &p.v],
        [&mut out, &mut lse],
    )
    .and_then(|c| kernel.forward(c))
    .unwrap_err();
    assert!(e.contains("mask"), "{e}");
    // head_dim 0, non-finite scale.
    let dims = AttnDims {
        head_dim: 0,
        ..p.dims
    };
    assert!(
        AttnForward::new(&dims, &p.mask, 0.2, [&[], &[], &[]], [&mut [], &mut lse])
            .and_then(|c| kernel.forward(c))
            .is_err()
    );
    assert!(
        AttnForward::new(
            &p.dims,
            &p.mask,
            f32::NAN,
            [&p.q, &p.k, &p.v],
            [&mut out, &mut lse]
        )
        .and_then(|c| kernel.forward(c))
        .is_err()
    );
    // Absurd dims whose product overflows usize.
    let dims = AttnDims {
        q_heads: usize::MAX / 2 + 1,
        kv_heads: 1,
        ..p.dims
    };
    assert!(
        AttnForward::new(
            &dims,
            &p.mask,
            0.2,
            [&p.q, &p.k, &p.v],
            [&mut out, &mut lse]
        )
        .and_then(|c| kernel.forward(c))
        .is_err()
    );
    // Backward: short dk.
    let mut dq = vec![0.0; p.q.len()];
    let mut dk = vec![0.0; p.k.len() - 1];
    let mut dv = vec![0.0; p.k.len()];
    let e = AttnBackward::new(
        &p.dims,
        &p.mask,
        0.2,
        [&p.q, &p.k, &p.v, &out, &lse, &p.d_out],
        [&mut dq, &mut dk, &mut dv],
    )
    .and_then(|c| kernel.backward(c))
    .unwrap_err();
    assert!(e.contains("dk has"), "{e}");
}

#[test]
fn empty_inputs_are_fine() {
    // No query rows at all, and query rows with no keys at all.
    let kernel = TiledAttention::new();
    let mask = BlockMask::dflash(4, 3, &[]).unwrap();
    let dims = AttnDims {
        q_rows: 0,
        kv_rows: 4,
        q_heads: 2,
        kv_heads: 1,
        head_dim: 8,
    };
    let kv = random(5, 4 * 8);
    AttnForward::new(&dims, &mask, 0.3, [&[], &kv, &kv], [&mut [], &mut []])
        .and_then(|c| kernel.forward(c))
        .unwrap();
    let mask = BlockMask::dflash(1, 2, &[-1]).unwrap();
    let dims = AttnDims {
        q_rows: 2,
        kv_rows: 3,
        q_heads: 2,
        kv_heads: 2,
        head_dim: 4,
    };
    let q = random(6, 2 * 2 * 4);
    let kv = random(7, 3 * 2 * 4);
    let (mut out, mut lse) = (vec![f32::NAN; 16], vec![f32::NAN; 4]);
    AttnForward::new(&dims, &mask, 0.3, [&q, &kv, &kv], [&mut out, &mut lse])
        .and_then(|c| kernel.forward(c))
        .unwrap();
    assert!(out.iter().all(|&x| x == 0.0) && lse.iter().all(|&x| x == f32::NEG_INFINITY));
    let (mut dq, mut dk, mut dv) = (vec![f32::NAN; 16], vec![f32::NAN; 24], vec![f32::NAN; 24]);
    AttnBackward::new(
        &dims,
        &mask,
        0.3,
        [&q, &kv, &kv, &out, &lse, &q],
        [&mut dq, &mut dk, &mut dv],
    )
    .and_then(|c| kernel.backward(c))
    .unwrap();
    assert!(dq.iter().chain(&dk).chain(&dv).all(|&x| x == 0.0));
}

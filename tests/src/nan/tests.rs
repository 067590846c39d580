//! The NaN check itself, strict and at tile granularity, for a NaN in each input: the
//! reference backend's outputs on the padded DFlash case, clean (both contracts must pass
//! them) and with one fault planted at a time, each of which a contract line must catch.

use super::*;
use crate::{Layout, nan_input_cases_on, reference_with};

/// Where a fault is planted: a (row, head) for out/lse/dq, a (key, kv head) for dk/dv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A (row, head) that reads the NaN.
    Reader,
    /// Another head of the NaN's query row (`q`, `d_out`).
    Sibling,
    /// A row that sees keys (others than the NaN row's) but does not read the NaN.
    Bystander,
    /// A row that sees no key.
    Empty,
    /// The NaN key (`k`, `v`), or a key the NaN row sees in its kv head (`q`, `d_out`).
    SeenKey,
    /// A key of the NaN row's kv head that it does not see, but another row does.
    UnseenKey,
    /// A key the NaN row sees, in another kv head.
    OtherKvHead,
}

/// What is planted, at element 0 of the role's slice (`Dv1Nan`: element 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    OutNan,
    OutZero,
    LseNan,
    LseZero,
    DqNan,
    DqZero,
    DkNan,
    DkZero,
    DvNan,
    DvZero,
    Dv1Nan,
}

use Fault::*;
use NanInput::{DOut, K, Q, V};
use Role::*;

/// (NaN input, role, fault, fails strict, fails within_tiles).
#[rustfmt::skip]
const TABLE: &[(NanInput, Role, Fault, bool, bool)] = &[
    (K, Reader, None, false, false),
    (K, Reader, OutZero, true, true),
    (K, Reader, LseZero, true, true),
    (K, Reader, DqZero, true, true),
    (K, Bystander, DqNan, true, false),
    (K, Bystander, OutNan, true, true),
    (K, Bystander, LseNan, true, true),
    (K, Empty, OutNan, true, true),
    (K, SeenKey, DkZero, true, true),
    (K, SeenKey, DvZero, true, true),
    (V, Reader, None, false, false),
    (V, Reader, OutZero, true, true),
    (V, Reader, LseNan, true, true),
    (V, Reader, DqZero, true, true),
    (V, Bystander, OutNan, true, false),
    (V, Bystander, DqNan, true, false),
    (V, Bystander, LseNan, true, true),
    (V, Empty, OutNan, true, true),
    (V, SeenKey, DkZero, true, true),
    (V, SeenKey, DvNan, true, true),
    // NaN in q: its row and head all NaN, every other row finite in both contracts.
    (Q, Reader, None, false, false),
    (Q, Reader, OutZero, true, true),
    (Q, Reader, LseZero, true, true),
    (Q, Reader, DqZero, true, true),
    (Q, Sibling, OutNan, true, true),
    (Q, Sibling, DqNan, true, true),
    (Q, Bystander, OutNan, true, true),
    (Q, Bystander, LseNan, true, true),
    (Q, Bystander, DqNan, true, true),
    (Q, Empty, OutNan, true, true),
    (Q, Empty, LseZero, true, true),
    // dk/dv: NaN where the row sees, finite elsewhere (tile-granular in its kv head).
    (Q, SeenKey, DkZero, true, true),
    (Q, SeenKey, DvZero, true, true),
    (Q, UnseenKey, DkNan, true, false),
    (Q, UnseenKey, DvNan, true, false),
    (Q, OtherKvHead, DkNan, true, true),
    (Q, OtherKvHead, DvNan, true, true),
    // NaN in d_out: the forward untouched, dq NaN in its row and head only.
    (DOut, Reader, None, false, false),
    (DOut, Reader, OutNan, true, true),
    (DOut, Reader, LseNan, true, true),
    (DOut, Reader, DqZero, true, true),
    (DOut, Sibling, DqNan, true, true),
    (DOut, Bystander, OutNan, true, true),
    (DOut, Bystander, DqNan, true, true),
    (DOut, Empty, OutNan, true, true),
    // dk NaN where the row sees, dv NaN there at dim 0 only; dims 1.. of dv always finite.
    (DOut, SeenKey, DkZero, true, true),
    (DOut, SeenKey, DvZero, true, true),
    (DOut, SeenKey, Dv1Nan, true, true),
    (DOut, UnseenKey, DkNan, true, false),
    (DOut, UnseenKey, DvNan, true, false),
    (DOut, UnseenKey, Dv1Nan, true, true),
    (DOut, OtherKvHead, DkNan, true, true),
    (DOut, OtherKvHead, DvNan, true, true),
];

/// The (row, head) a row role names in `nc`.
fn row_of(nc: &NanCase, role: Role) -> (usize, usize) {
    let dense = nc.case.mask.to_dense_oracle();
    let sees = |v: &Vec<bool>| v.iter().any(|&b| b);
    if !nc.input.is_key_side() {
        let (r, h) = (nc.row, nc.head);
        let pick = |i: usize, v: &Vec<bool>| match role {
            Bystander => i != r && sees(v) && *v != dense[r],
            Empty => !sees(v),
            _ => unreachable!("{role:?} is not a row role"),
        };
        return match role {
            Reader => (r, h),
            Sibling => (r, if h > 0 { h - 1 } else { h + 1 }),
            _ => (first(&dense, pick), h),
        };
    }
    let pick = |_: usize, v: &Vec<bool>| match role {
        Reader => v[nc.row],
        Bystander => !v[nc.row] && sees(v),
        Empty => !sees(v),
        _ => unreachable!("{role:?} is not a row role of a k/v case"),
    };
    (first(&dense, pick), nc.head * nc.case.dims.group())
}

fn first(dense: &[Vec<bool>], pick: impl Fn(usize, &Vec<bool>) -> bool) -> usize {
    let i = dense.iter().enumerate().position(|(i, v)| pick(i, v));
    i.expect("the case has such a row")
}

/// The (key, kv head) a key role names in `nc`.
fn key_of(nc: &NanCase, role: Role) -> (usize, usize) {
    if nc.input.is_key_side() {
        assert_eq!(role, SeenKey, "k/v cases name only their NaN key");
        return (nc.row, nc.head);
    }
    let dims = nc.case.dims;
    let dense = nc.case.mask.to_dense_oracle();
    let seen = &dense[nc.row];
    let g = nc.head / dims.group();
    let key = |pick: &dyn Fn(usize) -> bool| (0..dims.kv_rows).find(|&j| pick(j)).expect("key");
    match role {
        SeenKey => (key(&|j| seen[j]), g),
        UnseenKey => (key(&|j| !seen[j] && dense.iter().any(|v| v[j])), g),
        OtherKvHead => (key(&|j| seen[j]), (g + 1) % dims.kv_heads),
        _ => unreachable!("{role:?} is not a key role"),
    }
}

/// `clean` with `fault` planted at `role`.
fn planted(nc: &NanCase, clean: &Outputs, role: Role, fault: Fault) -> Outputs {
    let mut got = clean.clone();
    let dims = nc.case.dims;
    let (hq, hkv, d) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    let (buf, at, x) = match fault {
        None => return got,
        OutNan | OutZero | LseNan | LseZero | DqNan | DqZero => {
            let (i, h) = row_of(nc, role);
            let (at, at_lse) = ((i * hq + h) * d, i * hq + h);
            match fault {
                OutNan | OutZero => (&mut got.out, at, fault == OutZero),
                LseNan | LseZero => (&mut got.lse, at_lse, fault == LseZero),
                _ => (&mut got.dq, at, fault == DqZero),
            }
        }
        DkNan | DkZero | DvNan | DvZero | Dv1Nan => {
            let (j, g) = key_of(nc, role);
            let at = (j * hkv + g) * d;
            match fault {
                DkNan | DkZero => (&mut got.dk, at, fault == DkZero),
                Dv1Nan => (&mut got.dv, at + 1, false),
                _ => (&mut got.dv, at, fault == DvZero),
            }
        }
    };
    buf[at] = if x { 0.0 } else { f32::NAN };
    got
}

#[test]
fn nan_contracts_catch_what_they_promise() {
    let be = reference_with("reference");
    let cases = nan_input_cases_on(Layout::new(4, 2, 16)).expect("cases");
    for input in [K, V, Q, DOut] {
        let nc = cases
            .iter()
            .find(|c| c.input == input && c.case.name.starts_with("dflash_padding"))
            .expect("the padded DFlash case");
        let clean = run_on_backend(be.as_ref(), &nc.case, &inputs(nc)).expect("reference run");
        let rows = TABLE.iter().filter(|t| t.0 == input);
        for &(_, role, fault, strict_fails, tiles_fails) in rows {
            let got = planted(nc, &clean, role, fault);
            for (contract, nc, fails) in [
                ("strict", nc.clone(), strict_fails),
                ("within_tiles", nc.clone().within_tiles(), tiles_fails),
            ] {
                let failure = check(&nc, &got).failure;
                assert_eq!(
                    failure.is_some(),
                    fails,
                    "NaN in {}, {role:?} {fault:?}, {contract}: {failure:?}",
                    input.name()
                );
            }
        }
    }
}

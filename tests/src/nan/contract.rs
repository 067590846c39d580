//! [`NanCase`]'s contract as a plan: what each (row, head) of `out`/`lse`/`dq` and each
//! (key, kv head) of `dk`/`dv` must hold, and the check of a run's outputs against it.

use crate::backend::Outputs;
use crate::cases::{NanCase, NanInput};
use crate::report::CaseResult;

/// What one slice must hold: a (row, head) of `out` or `dq`, one `lse`, a (key, kv head) of
/// `dk` or `dv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// Not checked (outside the contract, or left to tile granularity).
    Any,
    Finite,
    /// Every element NaN.
    Nan,
    /// Element 0 NaN, the others not checked.
    NanAt0,
    /// Element 0 NaN, every other element finite.
    NanAt0Only,
    /// Element 0 not checked, every other element finite.
    FiniteAfter0,
    /// Every element exactly 0.
    Zero,
    /// Every element exactly `-inf`.
    NegInf,
}

impl Want {
    pub(super) fn holds(self, xs: &[f32]) -> bool {
        let finite = |xs: &[f32]| xs.iter().all(|x| x.is_finite());
        match self {
            Want::Any => true,
            Want::Finite => finite(xs),
            Want::Nan => xs.iter().all(|x| x.is_nan()),
            Want::NanAt0 => xs[0].is_nan(),
            Want::NanAt0Only => xs[0].is_nan() && finite(&xs[1..]),
            Want::FiniteAfter0 => finite(&xs[1..]),
            Want::Zero => xs.iter().all(|&x| x == 0.0),
            Want::NegInf => xs.iter().all(|&x| x == f32::NEG_INFINITY),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Want::Any => "anything",
            Want::Finite => "finite",
            Want::Nan => "all NaN",
            Want::NanAt0 => "NaN at dim 0",
            Want::NanAt0Only => "NaN at dim 0 and finite elsewhere",
            Want::FiniteAfter0 => "finite past dim 0",
            Want::Zero => "exactly 0",
            Want::NegInf => "-inf",
        }
    }

    /// `want` under the strict contract, not checked under `within_tiles`.
    fn strict(want: Want, within_tiles: bool) -> Want {
        if within_tiles { Want::Any } else { want }
    }
}

/// What one (row, head) must hold, and why (its role, for the message).
#[derive(Debug, Clone, Copy)]
pub(super) struct RowWant {
    pub(super) out: Want,
    pub(super) lse: Want,
    pub(super) dq: Want,
    pub(super) role: &'static str,
}

/// What one (key, kv head) must hold, and why.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyWant {
    pub(super) dk: Want,
    pub(super) dv: Want,
    pub(super) role: &'static str,
}

/// Whether (row `i`, head `h`), whose mask row is `visible`, reads the NaN input.
pub(super) fn reads(nc: &NanCase, visible: &[bool], i: usize, h: usize) -> bool {
    if nc.input.is_key_side() {
        visible[nc.row] && h / nc.case.dims.group() == nc.head
    } else {
        i == nc.row && h == nc.head && visible.iter().any(|&b| b)
    }
}

/// The contract of (row `i`, head `h`), whose mask row is `visible` ([`NanCase`]).
pub(super) fn row_want(nc: &NanCase, visible: &[bool], i: usize, h: usize) -> RowWant {
    use Want::*;
    let tiles = nc.within_tiles;
    let want = |out, lse, dq, role| RowWant { out, lse, dq, role };
    if reads(nc, visible, i, h) {
        return match nc.input {
            NanInput::K | NanInput::Q => want(Nan, Nan, Nan, "reads the NaN"),
            NanInput::V => want(NanAt0, Finite, Nan, "reads the NaN value"),
            NanInput::DOut => want(Finite, Finite, Nan, "reads the NaN d_out"),
        };
    }
    if !visible.iter().any(|&b| b) {
        return want(Zero, NegInf, Any, "sees no key");
    }
    let role = "never reads the NaN";
    match nc.input {
        // A NaN key reaches the dq of its query tiles' other rows through dS K.
        NanInput::K => want(Finite, Finite, Want::strict(Finite, tiles), role),
        // A NaN value reaches their out through P V, and their dq through dO V^T.
        NanInput::V => want(
            Want::strict(Finite, tiles),
            Finite,
            Want::strict(Finite, tiles),
            role,
        ),
        // The forward and dq = dS K are row-wise: no other row reads a NaN q or d_out.
        NanInput::Q | NanInput::DOut => want(Finite, Finite, Finite, role),
    }
}

/// The contract of key `j` in kv head `g` ([`NanCase`]); `poisoned` is the mask row of the
/// NaN's query row (`q`, `d_out`; not read for `k`, `v`).
pub(super) fn key_want(nc: &NanCase, poisoned: &[bool], j: usize, g: usize) -> KeyWant {
    use Want::*;
    let tiles = nc.within_tiles;
    let want = |dk, dv, role| KeyWant { dk, dv, role };
    match nc.input {
        NanInput::K | NanInput::V if (j, g) != (nc.row, nc.head) => {
            want(Any, Any, "is not the NaN's key")
        }
        NanInput::K => want(Nan, Nan, "is the NaN key"),
        NanInput::V => want(Nan, Finite, "is the NaN value's key"),
        NanInput::Q | NanInput::DOut if g != nc.head / nc.case.dims.group() => {
            want(Finite, Finite, "is in another kv head")
        }
        NanInput::Q if poisoned[j] => want(Nan, Nan, "is seen by the NaN row"),
        NanInput::DOut if poisoned[j] => want(Nan, NanAt0Only, "is seen by the NaN row"),
        NanInput::Q => want(
            Want::strict(Finite, tiles),
            Want::strict(Finite, tiles),
            "is not seen by the NaN row",
        ),
        NanInput::DOut => want(
            Want::strict(Finite, tiles),
            if tiles { FiniteAfter0 } else { Finite },
            "is not seen by the NaN row",
        ),
    }
}

/// The first elements of `xs`, for a message.
fn head_of(xs: &[f32]) -> &[f32] {
    &xs[..xs.len().min(2)]
}

/// The violations of `row_want` in `got`, one message each.
fn row_violations(nc: &NanCase, got: &Outputs, dense: &[Vec<bool>]) -> Vec<String> {
    let dims = nc.case.dims;
    let (hq, d) = (dims.q_heads, dims.head_dim);
    let mut bad = Vec::new();
    for (i, visible) in dense.iter().enumerate() {
        for h in 0..hq {
            let w = row_want(nc, visible, i, h);
            let (at, at_lse) = ((i * hq + h) * d, i * hq + h);
            for (what, want, xs) in [
                ("out", w.out, &got.out[at..at + d]),
                ("lse", w.lse, &got.lse[at_lse..at_lse + 1]),
                ("dq", w.dq, &got.dq[at..at + d]),
            ] {
                if !want.holds(xs) {
                    bad.push(format!(
                        "row {i}, head {h} {}: {what} must be {} but is {:?}..",
                        w.role,
                        want.describe(),
                        head_of(xs)
                    ));
                }
            }
        }
    }
    bad
}

/// The violations of `key_want` in `got`, one message each.
fn key_violations(nc: &NanCase, got: &Outputs, dense: &[Vec<bool>]) -> Vec<String> {
    let dims = nc.case.dims;
    let (hkv, d) = (dims.kv_heads, dims.head_dim);
    let poisoned: &[bool] = match nc.input.is_key_side() {
        true => &[],
        false => &dense[nc.row],
    };
    let mut bad = Vec::new();
    for j in 0..dims.kv_rows {
        for g in 0..hkv {
            let w = key_want(nc, poisoned, j, g);
            let at = (j * hkv + g) * d;
            for (what, want, xs) in [
                ("dk", w.dk, &got.dk[at..at + d]),
                ("dv", w.dv, &got.dv[at..at + d]),
            ] {
                if !want.holds(xs) {
                    bad.push(format!(
                        "key {j}, kv head {g} {}: {what} must be {} but is {:?}..",
                        w.role,
                        want.describe(),
                        head_of(xs)
                    ));
                }
            }
        }
    }
    bad
}

/// Compares `got` with the pattern [`NanCase`] states; the first violations (and how many
/// there are) land in the result.
pub(super) fn check(nc: &NanCase, got: &Outputs) -> CaseResult {
    let mut res = CaseResult::new(nc.case.name.clone());
    let dense = nc.case.mask.to_dense_oracle();
    let mut bad = row_violations(nc, got, &dense);
    bad.extend(key_violations(nc, got, &dense));
    if !bad.is_empty() {
        let what = format!("NaN in {}[{}, {}, 0]", nc.input.name(), nc.row, nc.head);
        let first: Vec<&str> = bad.iter().take(3).map(String::as_str).collect();
        res.fail(format!(
            "{what}: {} ({} violations in all)",
            first.join("; "),
            bad.len()
        ));
    }
    res
}

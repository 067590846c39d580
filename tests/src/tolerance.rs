//! The one tolerance type and the one element-wise comparator of every numerical test in the
//! workspace (backend conformance, model gradients, golden outputs, attention kernels).
//!
//! A tolerance is always written with named fields, so that no call site can swap `atol` and
//! `rtol`, and always carries the reason for its size. Element `i` passes when
//!
//! ```text
//! |got_i - want_i| <= atol * unit + rtol * |want_i|
//! ```
//!
//! where `unit` is 1 ([`AtolUnit::Absolute`]), `max_j |want_j|` over the finite values of the
//! tensor ([`AtolUnit::MaxWant`]: for tensors whose magnitude is not known in advance, e.g. a
//! gradient compared across backends) or `max(1, |want_i|)` ([`AtolUnit::WantAtLeastOne`]). A non-finite `want` must be matched exactly
//! (`-inf == -inf`); NaN never passes, and a non-finite `got` where `want` is finite fails.
//!
//! The presets below name what they are for; tests with a one-off bound write a
//! `Tolerance { .. }` literal with its own `why`.

use std::fmt;

/// What [`Tolerance::atol`] is measured in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtolUnit {
    /// `atol` is an absolute error.
    Absolute,
    /// `atol` is a fraction of the tensor's largest finite `|want|`.
    MaxWant,
    /// `atol` is a fraction of `max(1, |want_i|)`, per element: for log-sum-exps, whose
    /// absolute error grows with their magnitude once it exceeds 1.
    WantAtLeastOne,
}

/// Per-element tolerance: pass when `|got - want| <= atol * unit + rtol * |want|` (see the
/// module docs for `unit` and non-finite values).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
    pub atol_unit: AtolUnit,
    /// Why the bound has this size (printed with every comparison).
    pub why: &'static str,
}

impl Tolerance {
    /// Bit-for-bit equal values (compared as f64, so also `-0 == +0`): for ops whose two
    /// sides round once, identically.
    pub const EXACT: Tolerance = Tolerance {
        atol: 0.0,
        rtol: 0.0,
        atol_unit: AtolUnit::Absolute,
        why: "the same single rounding on both sides",
    };

    /// An f32 attention kernel against the dense f64 oracle on the same f32 inputs (the
    /// conformance suite's host kernels): the only error is the kernel's own f32 rounding, ~1e-6
    /// relative at the suite's sizes; 1e-4 leaves two orders of magnitude for summation order
    /// and f32 `exp`, while a real bug (a wrong mask element, a missed rescale, an off-by-one
    /// tile) moves values by 1e-2 or more.
    pub const F32_ATTENTION_VS_F64: Tolerance = Tolerance {
        atol: 1e-4,
        rtol: 1e-4,
        atol_unit: AtolUnit::Absolute,
        why: "f32 attention kernel vs the dense f64 oracle (~1e-6 expected, 100x headroom)",
    };

    /// A device f32 attention forward `out` (f32 online softmax) against f64.
    pub const DEVICE_F32_ATTN_OUT: Tolerance = Tolerance {
        atol: 2e-5,
        rtol: 1e-4,
        atol_unit: AtolUnit::MaxWant,
        why: "f32 online softmax vs f64",
    };

    /// A device f32 attention forward `lse` against f64: a log-sum-exp of f32 scores, ~1e-7
    /// relative; also the bound for two f32 reductions of the same values in different orders.
    pub const DEVICE_F32_ATTN_LSE: Tolerance = Tolerance {
        atol: 1e-6,
        rtol: 1e-5,
        atol_unit: AtolUnit::MaxWant,
        why: "f32 online softmax vs f64",
    };

    /// Device f32 attention gradients `dq`/`dk`/`dv` against f64: f32 sums over the visible
    /// pairs of a row or column.
    pub const DEVICE_F32_ATTN_GRAD: Tolerance = Tolerance {
        atol: 5e-5,
        rtol: 2e-4,
        atol_unit: AtolUnit::MaxWant,
        why: "f32 sums over visible pairs vs f64",
    };

    /// The same f32 values accumulated by f32 atomics in another order (e.g. a kernel's `dq`
    /// run twice, or from f32 and bf16 copies of the same bf16 values): equal to rounding.
    pub const F32_ATOMIC_ORDER: Tolerance = Tolerance {
        atol: 1e-6,
        rtol: 1e-5,
        atol_unit: AtolUnit::MaxWant,
        why: "dq: f32 atomic accumulation order",
    };

    /// Analytic gradients against a 5-point central-difference stencil (h = 1e-2, truncation
    /// ~h^4 = 1e-8) of `sum(out * cotangent)` in f64 over an f32 forward: each loss evaluation
    /// carries ~sqrt(n) * 2^-24 * |out| of rounding noise, amplified by 18 / (12h): ~1e-5
    /// absolute for n <= 100 outputs of size ~1. A formula error moves a gradient by O(1).
    pub const FD_GRAD: Tolerance = Tolerance {
        atol: 1e-4,
        rtol: 1e-3,
        atol_unit: AtolUnit::Absolute,
        why: "5-point stencil (h 1e-2) of an f32 forward: ~1e-5 rounding noise",
    };

    /// Our f32 Qwen3 forward against HF transformers' f32 golden outputs (fixtures): both
    /// accumulate in f32, in different orders, through a few layers.
    pub const F32_VS_HF_GOLDEN: Tolerance = Tolerance {
        atol: 1e-4,
        rtol: 1e-4,
        atol_unit: AtolUnit::Absolute,
        why: "f32 vs HF transformers f32: different summation order over a few layers",
    };

    /// This tolerance with `why` replaced.
    pub const fn because(self, why: &'static str) -> Tolerance {
        Tolerance { why, ..self }
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.atol_unit {
            AtolUnit::Absolute => "",
            AtolUnit::MaxWant => "*max|want|",
            AtolUnit::WantAtLeastOne => "*max(1,|want|)",
        };
        write!(
            f,
            "atol {:e}{unit}, rtol {:e}: {}",
            self.atol, self.rtol, self.why
        )
    }
}

/// The outcome of one comparison.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Closeness {
    /// Largest `|got - want|` (infinite where a non-finite value does not match).
    pub max_abs: f64,
    /// Largest `|got - want| / (atol * unit + rtol * |want|)`: the tensor passes when `<= 1`.
    pub worst: f64,
    /// The element with the largest ratio, and its two values (`None` when every element is
    /// exactly equal, or the tensors are empty or of different lengths).
    pub worst_at: Option<(usize, f64, f64)>,
    /// `Some((got, want))` element counts when the lengths differ (then `worst` is infinite).
    pub len_mismatch: Option<(usize, usize)>,
}

impl Closeness {
    pub fn passed(&self) -> bool {
        self.worst <= 1.0
    }
}

/// Compares `got` with `want` under `tol`, without asserting.
pub fn closeness<G, W>(got: &[G], want: &[W], tol: &Tolerance) -> Closeness
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    if got.len() != want.len() {
        return Closeness {
            max_abs: f64::INFINITY,
            worst: f64::INFINITY,
            worst_at: None,
            len_mismatch: Some((got.len(), want.len())),
        };
    }
    let max_want = match tol.atol_unit {
        AtolUnit::MaxWant => want
            .iter()
            .map(|&w| w.into())
            .filter(|w: &f64| w.is_finite())
            .fold(0.0f64, |m, w| m.max(w.abs())),
        AtolUnit::Absolute | AtolUnit::WantAtLeastOne => 1.0,
    };
    let mut c = Closeness::default();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w): (f64, f64) = (g.into(), w.into());
        let (abs, ratio) = if !w.is_finite() || !g.is_finite() {
            // NaN == NaN is false, so NaN never passes.
            if g == w {
                (0.0, 0.0)
            } else {
                (f64::INFINITY, f64::INFINITY)
            }
        } else {
            let err = (g - w).abs();
            let unit = match tol.atol_unit {
                AtolUnit::WantAtLeastOne => w.abs().max(1.0),
                AtolUnit::Absolute | AtolUnit::MaxWant => max_want,
            };
            let bound = tol.atol * unit + tol.rtol * w.abs();
            let ratio = if bound > 0.0 {
                err / bound
            } else if err == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            (err, ratio)
        };
        c.max_abs = c.max_abs.max(abs);
        if ratio > c.worst {
            c.worst = ratio;
            c.worst_at = Some((i, g, w));
        }
    }
    c
}

/// Compares `got` with `want` under `tol`, prints one line (name, largest absolute error,
/// worst error over its bound, the tolerance and its reason) and panics naming the worst
/// element when it fails. Returns the measured errors.
pub fn assert_close<G, W>(name: &str, got: &[G], want: &[W], tol: &Tolerance) -> Closeness
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    let c = closeness(got, want, tol);
    if let Some((g, w)) = c.len_mismatch {
        panic!("{name}: {g} elements, expected {w}");
    }
    println!(
        "  {name:<44} max_abs_err {:9.2e}  err/tol {:5.3}  [{tol}]",
        c.max_abs, c.worst
    );
    if let Some((i, g, w)) = c.worst_at.filter(|_| !c.passed()) {
        panic!(
            "{name}[{i}]: got {g}, want {w} (|err| {:.3e}, {:.3}x tolerance; {tol})",
            (g - w).abs(),
            c.worst
        );
    }
    c
}

/// A per-tensor relative L2 bound: pass when `||got - want|| / ||want|| <= max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RelL2 {
    pub max: f64,
    pub why: &'static str,
}

/// Relative L2 error `||got - want|| / ||want||` (f64 sums) and the largest `|got - want|`;
/// non-finite values must match exactly (NaN never passes) and are left out of the norms.
/// `Err` names the first non-finite mismatch or the lengths.
pub fn rel_l2<G, W>(got: &[G], want: &[W]) -> Result<(f64, f64), String>
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    if got.len() != want.len() {
        return Err(format!("length {} vs {}", got.len(), want.len()));
    }
    let (mut num, mut den, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w): (f64, f64) = (g.into(), w.into());
        if !w.is_finite() || !g.is_finite() {
            if g != w {
                return Err(format!(
                    "[{i}]: got {g}, want {w} (a non-finite value must match exactly; NaN never passes)"
                ));
            }
            continue;
        }
        let e = g - w;
        num += e * e;
        den += w * w;
        max_abs = max_abs.max(e.abs());
    }
    let rel = if den > 0.0 {
        (num / den).sqrt()
    } else if num == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    Ok((rel, max_abs))
}

/// [`rel_l2`] printed and asserted `<= tol.max`.
pub fn assert_rel_l2<G, W>(name: &str, got: &[G], want: &[W], tol: &RelL2) -> f64
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    let (rel, max_abs) = rel_l2(got, want).unwrap_or_else(|e| panic!("{name}{e}"));
    println!(
        "  {name:<44} rel_l2 {rel:9.2e}  max_abs_err {max_abs:9.2e}  err/tol {:5.3}  \
         [rel-L2 tol {:e}: {}]",
        rel / tol.max,
        tol.max,
        tol.why
    );
    assert!(
        rel <= tol.max,
        "{name}: relative L2 error {rel:.3e} > {:e}",
        tol.max
    );
    rel
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Tolerance = Tolerance {
        atol: 1e-3,
        rtol: 1e-2,
        atol_unit: AtolUnit::Absolute,
        why: "test",
    };

    #[test]
    fn bound_is_atol_plus_rtol_times_want() {
        // |err| 1e-3 + 1e-2 * 2 = 2.1e-2 is exactly the bound.
        let c = closeness(&[2.021f64], &[2.0f64], &T);
        assert!((c.worst - 1.0).abs() < 1e-9 && c.passed(), "{c:?}");
        assert!(!closeness(&[2.022f64], &[2.0f64], &T).passed());
    }

    #[test]
    fn max_want_scales_atol_by_the_largest_finite_want() {
        let t = Tolerance {
            atol_unit: AtolUnit::MaxWant,
            rtol: 0.0,
            ..T
        };
        // max|want| = 100 (the infinity is left out): the bound is 0.1 everywhere.
        let want = [100.0f32, 0.0, f32::NEG_INFINITY];
        assert!(closeness(&[100.0f32, 0.099, f32::NEG_INFINITY], &want, &t).passed());
        assert!(!closeness(&[100.0f32, 0.101, f32::NEG_INFINITY], &want, &t).passed());
    }

    #[test]
    fn nan_never_passes_and_infinities_must_match() {
        let loose = Tolerance {
            atol: 1e30,
            rtol: 1e30,
            ..T
        };
        assert!(!closeness(&[f32::NAN], &[f32::NAN], &loose).passed());
        assert!(!closeness(&[f32::NAN], &[1.0f32], &loose).passed());
        assert!(!closeness(&[f32::INFINITY], &[1.0f32], &loose).passed());
        assert!(!closeness(&[f32::INFINITY], &[f32::NEG_INFINITY], &loose).passed());
        assert!(closeness(&[f32::NEG_INFINITY], &[f32::NEG_INFINITY], &T).passed());
    }

    #[test]
    fn zero_bound_needs_exact_equality_and_lengths_must_agree() {
        assert!(closeness(&[1.5f32], &[1.5f64], &Tolerance::EXACT).passed());
        assert!(!closeness(&[1.5f32], &[1.500_000_1f64], &Tolerance::EXACT).passed());
        let c = closeness(&[1.0f32, 2.0], &[1.0f32], &T);
        assert_eq!(c.len_mismatch, Some((2, 1)));
        assert!(!c.passed());
    }

    #[test]
    #[should_panic(expected = "x[1]: got 3, want 2")]
    fn assert_close_names_the_worst_element() {
        assert_close("x", &[1.0f32, 3.0], &[1.0f32, 2.0], &T);
    }
}

//! Small dense helpers with a fixed order of operations, so results are reproducible bit for
//! bit. Every loop here is elementwise over independent lanes (keys, or the head dim) or sums
//! into a fixed set of 8 partials, so vectorising it at any width (SSE2, AVX2) computes the
//! same IEEE operations in the same order: the result does not depend on the CPU. No `mul_add`:
//! fused and unfused products round differently, and the baseline x86-64 build has no FMA.

/// `t (D, w)`: rows `0..w` of `row(j)` (each of length `D`), transposed, so a query row's
/// scores against the tile are a loop over keys with unit stride.
#[inline(always)]
pub(crate) fn transpose_into<'a>(
    t: &mut [f32],
    w: usize,
    d: usize,
    row: impl Fn(usize) -> &'a [f32],
) {
    for j in 0..w {
        for (x, &v) in row(j).iter().enumerate().take(d) {
            t[x * w + j] = v;
        }
    }
}

/// `out[j] = sum_x a[x] * t[x, lo + j]` for `j in 0..out.len()`, with `t (D, w)` a transposed
/// tile: the sum over `x` runs in order for every key, vectorised across keys. Keys go in
/// blocks whose partial sums stay in registers for the whole sum (32 keys: four independent
/// 8-lane chains, which hides the add latency); the blocking changes no result.
#[inline(always)]
pub(crate) fn dots_t(out: &mut [f32], a: &[f32], t: &[f32], w: usize, lo: usize) {
    let mut j = 0;
    j += dots_t_blocks::<32>(&mut out[j..], a, t, w, lo + j);
    j += dots_t_blocks::<8>(&mut out[j..], a, t, w, lo + j);
    dots_t_blocks::<1>(&mut out[j..], a, t, w, lo + j);
}

/// [`dots_t`] over the leading whole blocks of `B` keys; returns how many keys it did.
#[inline(always)]
fn dots_t_blocks<const B: usize>(
    out: &mut [f32],
    a: &[f32],
    t: &[f32],
    w: usize,
    lo: usize,
) -> usize {
    let blocks = out.len() / B;
    for (b, o) in out.chunks_exact_mut(B).enumerate() {
        let mut acc = [0f32; B];
        for (&ax, col) in a.iter().zip(t.chunks_exact(w)) {
            let col = &col[lo + b * B..][..B];
            for l in 0..B {
                acc[l] += ax * col[l];
            }
        }
        o.copy_from_slice(&acc);
    }
    blocks * B
}

/// `xs *= scale`, then the largest value and whether any is NaN. Eight partial maxima keep it
/// vectorisable; a maximum is exact, so the lane structure does not change it (NaN is
/// tracked apart because a compare-select drops it).
#[inline(always)]
pub(crate) fn scale_max(xs: &mut [f32], scale: f32) -> (f32, bool) {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut nan = [false; 8];
    let mut chunks = xs.chunks_exact_mut(8);
    for c in &mut chunks {
        for l in 0..8 {
            c[l] *= scale;
            nan[l] |= c[l].is_nan();
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
    }
    let (mut best, mut any_nan) = (f32::NEG_INFINITY, false);
    for v in chunks.into_remainder() {
        *v *= scale;
        any_nan |= v.is_nan();
        best = if *v > best { *v } else { best };
    }
    for l in 0..8 {
        any_nan |= nan[l];
        best = if m[l] > best { m[l] } else { best };
    }
    (best, any_nan)
}

/// Sum with 8 independent partials (a fixed lane structure: deterministic, and vectorisable).
#[inline(always)]
pub(crate) fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    let mut tail = 0f32;
    for &x in rest {
        tail += x;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `y += alpha * x`.
#[inline(always)]
pub(crate) fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `y[c] += sum_j p[j] * row(j)[c]`, the sum over `j` in order for every column `c`: the same
/// operations as one [`axpy`] per `j`, with the columns in blocks held in registers across all
/// `j` instead of reloaded and stored for each.
#[inline(always)]
pub(crate) fn axpy_rows<'a>(y: &mut [f32], p: &[f32], row: impl Fn(usize) -> &'a [f32]) {
    let mut c = 0;
    c += axpy_rows_blocks::<32, _>(&mut y[c..], c, p, &row);
    c += axpy_rows_blocks::<8, _>(&mut y[c..], c, p, &row);
    axpy_rows_blocks::<1, _>(&mut y[c..], c, p, &row);
}

/// [`axpy_rows`] over the leading whole blocks of `B` columns of `y` (column `c0` onwards of
/// each row); returns how many columns it did.
#[inline(always)]
fn axpy_rows_blocks<'a, const B: usize, F: Fn(usize) -> &'a [f32]>(
    y: &mut [f32],
    c0: usize,
    p: &[f32],
    row: &F,
) -> usize {
    let blocks = y.len() / B;
    for (b, yb) in y.chunks_exact_mut(B).enumerate() {
        let mut acc = [0f32; B];
        acc.copy_from_slice(yb);
        for (j, &pj) in p.iter().enumerate() {
            let r = &row(j)[c0 + b * B..][..B];
            for l in 0..B {
                acc[l] += pj * r[l];
            }
        }
        yb.copy_from_slice(&acc);
    }
    blocks * B
}

/// `y += x`, folding an f32 per-tile partial into an f64 cross-tile accumulator.
#[inline(always)]
pub(crate) fn fold(y: &mut [f64], x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += *xi as f64;
    }
}

/// `e^x` in f32 without a libm call, so a loop over it vectorises (libm's `expf` is an opaque
/// call per element: a third of the kernel's time before this). Cephes' `expf`: `x = n ln2 + r`
/// with `n = round(x / ln2)` and `ln2` split in two parts (`n * C1` is exact), then a degree-5
/// polynomial in `r`, scaled by `2^n` built from its exponent bits. Within a few ulp of the
/// true value (tested against f64). The kernel's arguments are `s - max` or `s - lse`, so
/// about `<= 0`; outside the normal range the result saturates: `0` below
/// `ln(f32::MIN_POSITIVE)` (where the true value is subnormal), `+inf` above `127.5 ln2`
/// (= 88.38, a little below the true overflow at 88.72); NaN stays NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LO: f32 = -87.336_55; // ln(f32::MIN_POSITIVE): 2^-126
    const HI: f32 = 88.376_26; // 127.5 ln2: n = 127 is the largest normal exponent
    const C1: f32 = 355.0 / 512.0; // ln2, high part (9 bits: n * C1 is exact)
    const C2: f32 = -2.121_944_4e-4; // ln2 - C1
    // 1.5 * 2^23: adding it rounds to the nearest integer, held in the low mantissa bits.
    const SHIFTER: f32 = 12_582_912.0;
    let xc = x.clamp(LO, HI); // NaN stays NaN
    let t = xc * std::f32::consts::LOG2_E + SHIFTER;
    let n = t - SHIFTER;
    let r = (xc - n * C1) - n * C2;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = (p * (r * r) + r) + 1.0;
    // n as an integer (|n| <= 127) from the shifted sum's bits, then 2^n from its exponent.
    let e = t.to_bits().wrapping_sub(SHIFTER.to_bits()) as i32;
    let two_n = f32::from_bits(((e + 127) as u32) << 23);
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        y * two_n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative error of `exp` against f64 over the kernel's range, in f32 ulps at 1.0.
    #[test]
    fn exp_is_within_a_few_ulp() {
        let mut worst = 0f64;
        let n = 200_000;
        for i in 0..=n {
            let x = -87.0 + (88.0 + 87.0) * i as f32 / n as f32;
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "worst rel error {worst:e}"
        );
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert_eq!(exp(-87.4), 0.0, "subnormal results flush to 0");
        assert!(exp(-87.3) > 0.0 && exp(-87.3).is_normal());
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert!(exp(88.3).is_finite());
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn dots_t_matches_plain_dots() {
        let (w, d) = (5, 3);
        let rows: Vec<Vec<f32>> = (0..w)
            .map(|j| (0..d).map(|x| (j * d + x) as f32 * 0.5 - 2.0).collect())
            .collect();
        let mut t = vec![0f32; d * w];
        transpose_into(&mut t, w, d, |j| &rows[j]);
        let a = [1.0f32, -2.0, 0.25];
        let mut out = vec![f32::NAN; 3];
        dots_t(&mut out, &a, &t, w, 1);
        for (j, &o) in out.iter().enumerate() {
            let want: f32 = a.iter().zip(&rows[1 + j]).map(|(x, y)| x * y).sum();
            assert_eq!(o, want, "key {}", 1 + j);
        }
    }

    #[test]
    fn dots_t_blocks_match_the_plain_sum() {
        // 45 keys from offset 2 of a 50-wide tile: one block of 32, one of 8, 5 single keys.
        let (w, d) = (50, 7);
        let t: Vec<f32> = (0..w * d)
            .map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5)
            .collect();
        let a: Vec<f32> = (0..d).map(|x| 0.3 - x as f32 * 0.11).collect();
        let mut out = vec![f32::NAN; 45];
        dots_t(&mut out, &a, &t, w, 2);
        for (j, &o) in out.iter().enumerate() {
            let mut want = 0f32;
            for x in 0..d {
                want += a[x] * t[x * w + 2 + j];
            }
            assert_eq!(o.to_bits(), want.to_bits(), "key {j}");
        }
    }

    #[test]
    fn scale_max_finds_max_and_nan() {
        let mut xs: Vec<f32> = (0..19).map(|i| (i as f32 - 9.0).abs()).collect();
        assert_eq!(scale_max(&mut xs, 2.0), (18.0, false));
        assert_eq!(xs[1], 16.0);
        xs[17] = f32::NAN;
        assert!(scale_max(&mut xs, 1.0).1);
        assert_eq!(scale_max(&mut [], 1.0), (f32::NEG_INFINITY, false));
    }

    #[test]
    fn axpy_rows_matches_one_axpy_per_row() {
        // 45 columns: one block of 32, one of 8, 5 single columns.
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|j| {
                (0..45)
                    .map(|c| ((j * 45 + c) * 29 % 97) as f32 * 0.01 - 0.4)
                    .collect()
            })
            .collect();
        let p = [0.5f32, -1.25, 0.1, 2.0, 0.0, 0.7];
        let mut want: Vec<f32> = (0..45).map(|c| c as f32 * 0.02).collect();
        let mut got = want.clone();
        for (j, &pj) in p.iter().enumerate() {
            axpy(&mut want, pj, &rows[j]);
        }
        axpy_rows(&mut got, &p, |j| &rows[j]);
        for c in 0..45 {
            assert_eq!(got[c].to_bits(), want[c].to_bits(), "column {c}");
        }
    }

    #[test]
    fn sum_matches_in_order_for_exact_values() {
        let xs: Vec<f32> = (0..21).map(|i| i as f32).collect();
        assert_eq!(sum(&xs), 210.0);
        assert_eq!(sum(&[]), 0.0);
    }
}

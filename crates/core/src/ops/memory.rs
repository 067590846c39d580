use crate::{Error, Result, Tensor};

/// Buffers, host transfers and elementwise glue. The host side of every transfer is `f32`;
/// the device format (f32, bf16, ...) is the backend's business.
pub trait MemoryOps {
    fn upload(&self, data: &[f32], shape: &[usize]) -> Result<Tensor>;
    fn download(&self, t: &Tensor) -> Result<Vec<f32>>;
    fn zeros(&self, shape: &[usize]) -> Result<Tensor>;
    fn copy(&self, t: &Tensor) -> Result<Tensor>;
    /// Rows `[start, start+len)` of a `(R, C)` view of `t` (first dim as rows).
    fn narrow_rows(&self, t: &Tensor, start: usize, len: usize) -> Result<Tensor>;
    /// Stacks tensors that agree on all but the first dim, along the first dim.
    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor>;
    /// `(R, C_i)` parts side by side into `(R, sum C_i)`.
    fn concat_cols(&self, parts: &[&Tensor]) -> Result<Tensor>;
    /// `a + b`, same shapes.
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    /// `acc += x`, same element count.
    fn add_assign(&self, acc: &mut Tensor, x: &Tensor) -> Result<()>;
    /// `t *= s`.
    fn scale_assign(&self, t: &mut Tensor, s: f32) -> Result<()>;
    /// `sum(t^2)` in f64, for gradient norms.
    fn sum_squares(&self, t: &Tensor) -> Result<f64>;
    /// [`Self::sum_squares`] of each tensor, with the same values. A device backend overrides
    /// it to read all the sums back in one host transfer (a gradient norm over a drafter's
    /// ~60 tensors would otherwise wait on the device once per tensor).
    fn sum_squares_many(&self, ts: &[&Tensor]) -> Result<Vec<f64>> {
        ts.iter().map(|t| self.sum_squares(t)).collect()
    }
    /// Whether every element is finite.
    fn all_finite(&self, t: &Tensor) -> Result<bool>;

    /// `t` in the backend's storage format for tensors that compute ops only *read*: frozen
    /// weights (the target's layers, the drafter's frozen embedding and LM head), target
    /// features on their way to the drafter, benchmark inputs. A GPU backend whose GEMMs take
    /// bf16 operands stores them in bf16 (half the bytes, no conversion per use); the default
    /// keeps `t` as it is. The result is still a valid input of `download`, `copy`,
    /// `narrow_rows`, `concat_*`, `linear`/`matmul` (as an operand), `embedding` (as the table),
    /// `attention` (q, k, v) and the fused loss (as the LM head); an op that cannot read it
    /// reports that by name instead of computing garbage.
    fn to_compute_format(&self, t: Tensor) -> Result<Tensor> {
        Ok(t)
    }

    /// Whether `t` is this backend's own tensor on its own device, so that ops take it as
    /// it is. The default says no, which routes every foreign tensor through [`Self::import`].
    fn is_local(&self, t: &Tensor) -> bool {
        let _ = t;
        false
    }

    /// `t`, made by another backend or on another device, as a tensor of this one (same
    /// shape and values, in [`Self::to_compute_format`]). The default goes through host
    /// memory; a backend with a direct path (peer copies) overrides it.
    fn import(&self, t: &Tensor) -> Result<Tensor> {
        let host = t.storage().read_host(t.numel())?;
        self.to_compute_format(self.upload(&host, t.dims())?)
    }

    /// A tensor of `N(0, std^2)` samples, deterministic in `seed` (random weights and inputs
    /// for benchmarks and tests). The default draws [`normal_host`] on the host and uploads it;
    /// GPU backends override it to generate on the device (their stream need not match the
    /// host one, only be deterministic in `seed`).
    fn random_normal(&self, shape: &[usize], std: f32, seed: u64) -> Result<Tensor> {
        if !(std.is_finite() && std >= 0.0) {
            return Err(Error::op(
                "random_normal",
                "host",
                format!("std must be a finite number >= 0, got {std} (shape {shape:?})"),
            ));
        }
        let n = shape.iter().product();
        self.upload(&normal_host(n, std, seed), shape)
    }
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output function (Steele, Lea, Flood 2014).
fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` samples of `N(0, std^2)`, deterministic in `seed`, counter-based so any range can be
/// produced independently (in parallel here, on a device elsewhere):
///
/// ```text
/// key      = splitmix64(seed + GOLDEN)
/// u(c)     = splitmix64(key + (c + 1) * GOLDEN) >> 11                  53 random bits
/// pair p   : u1 = (u(2p) + 1) * 2^-53 in (0, 1],  u2 = u(2p+1) * 2^-53 in [0, 1)
///            r = sqrt(-2 ln u1);  x[2p] = r cos(2 pi u2) * std,  x[2p+1] = r sin(2 pi u2) * std
/// ```
/// (Box-Muller in f64, rounded to f32.)
pub fn normal_host(n: usize, std: f32, seed: u64) -> Vec<f32> {
    let key = splitmix64(seed.wrapping_add(GOLDEN));
    let bits = |c: u64| splitmix64(key.wrapping_add(c.wrapping_add(1).wrapping_mul(GOLDEN))) >> 11;
    let scale = 1.0 / (1u64 << 53) as f64;
    let fill = |start: usize, out: &mut [f32]| {
        // `start` is even: whole pairs per chunk.
        for (j, pair) in out.chunks_mut(2).enumerate() {
            let p = (start / 2 + j) as u64;
            let u1 = (bits(2 * p) + 1) as f64 * scale;
            let u2 = bits(2 * p + 1) as f64 * scale;
            let r = (-2.0 * u1.ln()).sqrt();
            let (s, c) = (2.0 * std::f64::consts::PI * u2).sin_cos();
            pair[0] = (r * c * std as f64) as f32;
            if let Some(x) = pair.get_mut(1) {
                *x = (r * s * std as f64) as f32;
            }
        }
    };
    let mut out = vec![0.0f32; n];
    const SERIAL: usize = 1 << 20;
    if n <= SERIAL {
        fill(0, &mut out);
        return out;
    }
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let chunk = n.div_ceil(threads).next_multiple_of(2).max(SERIAL);
    std::thread::scope(|s| {
        for (i, part) in out.chunks_mut(chunk).enumerate() {
            let fill = &fill;
            s.spawn(move || fill(i * chunk, part));
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::normal_host;

    #[test]
    fn normal_host_is_deterministic_counter_based_and_normal() {
        let big = normal_host(3_000_001, 2.0, 7); // parallel path, odd length
        let small = normal_host(1001, 2.0, 7); // serial path
        assert_eq!(&big[..1001], &small[..]);
        assert_eq!(normal_host(1001, 2.0, 7), small);
        assert_ne!(normal_host(1001, 2.0, 8), small);
        let n = big.len() as f64;
        let mean = big.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = big.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 4.0).abs() < 0.02, "var {var}");
        assert!(big.iter().all(|x| x.is_finite()));
        assert!(normal_host(0, 1.0, 1).is_empty());
    }
}

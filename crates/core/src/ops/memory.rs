use crate::ops::BackendInfo;
use crate::tensor::{checked_numel, numel_or_overflow};
use crate::{Error, Result, Tensor};

/// A host tensor in the dtype its file stores it in: little-endian bytes, as safetensors lays
/// them out. Bytes rather than typed slices because a tensor inside a memory-mapped file need
/// not be aligned for its element type.
#[derive(Debug, Clone, Copy)]
pub enum HostSlice<'a> {
    F32(&'a [u8]),
    Bf16(&'a [u8]),
    F16(&'a [u8]),
}

impl<'a> HostSlice<'a> {
    /// f32 values already in memory, viewed as their bytes (no copy).
    pub fn from_f32(data: &'a [f32]) -> Self {
        // SAFETY: f32 has no padding and u8 has alignment 1: the same memory, 4x the length.
        HostSlice::F32(unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        })
    }

    pub fn bytes(&self) -> &'a [u8] {
        match *self {
            HostSlice::F32(b) | HostSlice::Bf16(b) | HostSlice::F16(b) => b,
        }
    }

    /// Bytes per element.
    pub fn elem_size(&self) -> usize {
        match self {
            HostSlice::F32(_) => 4,
            HostSlice::Bf16(_) | HostSlice::F16(_) => 2,
        }
    }

    pub fn dtype_name(&self) -> &'static str {
        match self {
            HostSlice::F32(_) => "f32",
            HostSlice::Bf16(_) => "bf16",
            HostSlice::F16(_) => "f16",
        }
    }

    /// Whole elements held (a trailing partial element is rejected by [`Self::check`]).
    pub fn numel(&self) -> usize {
        self.bytes().len() / self.elem_size()
    }

    /// Elements `[start, start + len)`, the same dtype. Panics when out of range (callers
    /// slice within [`Self::numel`]).
    pub fn range(&self, start: usize, len: usize) -> HostSlice<'a> {
        let s = self.elem_size();
        let b = &self.bytes()[start * s..(start + len) * s];
        match self {
            HostSlice::F32(_) => HostSlice::F32(b),
            HostSlice::Bf16(_) => HostSlice::Bf16(b),
            HostSlice::F16(_) => HostSlice::F16(b),
        }
    }

    /// The first `out.len()` elements widened to f32 into `out` (exact for every dtype).
    /// Panics when `out` is longer than [`Self::numel`].
    pub fn widen_into(&self, out: &mut [f32]) {
        let n = out.len();
        match *self {
            HostSlice::F32(b) => b[..4 * n]
                .chunks_exact(4)
                .zip(out)
                .for_each(|(c, o)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            HostSlice::Bf16(b) => b[..2 * n]
                .chunks_exact(2)
                .zip(out)
                .for_each(|(c, o)| *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            HostSlice::F16(b) => b[..2 * n]
                .chunks_exact(2)
                .zip(out)
                .for_each(|(c, o)| *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        }
    }

    /// All elements widened to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.numel()];
        self.widen_into(&mut out);
        out
    }

    /// The element count of `shape`, after checking that the bytes hold exactly that many
    /// elements (a shape error of `op` on `device` otherwise).
    pub fn check(&self, op: &'static str, device: &str, shape: &[usize]) -> Result<usize> {
        let numel = checked_numel(op, device, shape)?;
        let bytes = self.bytes().len();
        if numel.checked_mul(self.elem_size()) != Some(bytes) {
            return Err(Error::shape(
                op,
                device,
                format!(
                    "{bytes} host bytes of {} for shape {shape:?} ({numel} elements)",
                    self.dtype_name()
                ),
            ));
        }
        Ok(numel)
    }
}

/// Buffers, host transfers and elementwise glue. The host side of every transfer is `f32`
/// (or, for frozen weights, the file's dtype: [`MemoryOps::upload_frozen`]); the device
/// format (f32, bf16, ...) is the backend's business.
///
/// [`BackendInfo`] is a supertrait so that the default methods here name the device of the
/// backend that inherits them ([`BackendInfo::device`]) in their errors.
pub trait MemoryOps: BackendInfo {
    fn upload(&self, data: &[f32], shape: &[usize]) -> Result<Tensor>;
    fn download(&self, t: &Tensor) -> Result<Vec<f32>>;
    /// As [`download`](Self::download), for a reader on another thread of a tensor that no
    /// queued work writes (a checkpoint's device snapshot): a device backend copies it on a
    /// side stream, waiting only for `t`'s own last write, not for the work queued since.
    fn download_detached(&self, t: &Tensor) -> Result<Vec<f32>> {
        self.download(t)
    }
    fn zeros(&self, shape: &[usize]) -> Result<Tensor>;
    /// Writes row `j` of `src` into row `rows[j]` of `dst` (both viewed as `(R, C)`, first
    /// dim as rows), in place: a KV cache takes each step's new keys without being copied.
    /// Operands are checked by [`scatter_rows_cols`]. The default goes through host memory
    /// (correct everywhere, two full transfers); backends with device memory override it.
    fn scatter_rows(&self, dst: &mut Tensor, rows: &[usize], src: &Tensor) -> Result<()> {
        let cols = scatter_rows_cols("scatter_rows", &self.device(), dst, rows, src)?;
        let mut d = self.download(dst)?;
        let s = self.download(src)?;
        for (j, &r) in rows.iter().enumerate() {
            d[r * cols..(r + 1) * cols].copy_from_slice(&s[j * cols..(j + 1) * cols]);
        }
        *dst = self.upload(&d, dst.dims())?;
        Ok(())
    }
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

    /// `data`, a host tensor in its file dtype, uploaded into [`Self::to_compute_format`]:
    /// the loader of frozen weights, reading straight from a memory-mapped checkpoint. The
    /// result has the same values as `to_compute_format(upload(widened data))`. The default
    /// does exactly that, through one f32 host copy (what a host backend keeps as the tensor
    /// anyway); a device backend overrides it to send the file's bytes in bounded chunks and
    /// convert on the device, so a checkpoint never passes through an f32 copy in host memory.
    fn upload_frozen(&self, data: HostSlice<'_>, shape: &[usize]) -> Result<Tensor> {
        data.check("upload_frozen", &self.device(), shape)?;
        self.to_compute_format(self.upload(&data.to_f32_vec(), shape)?)
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
                self.device(),
                format!("std must be a finite number >= 0, got {std} (shape {shape:?})"),
            ));
        }
        let n = numel_or_overflow(shape)
            .map_err(|e| Error::shape("random_normal", self.device(), e))?;
        self.upload(&normal_host(n, std, seed), shape)
    }
}

/// The row length `C` of a [`MemoryOps::scatter_rows`] call, after checking that `src` has
/// one row per entry of `rows`, the same row length as `dst`, and that every target row is
/// in range and written once (two writes to one row would race on a device).
pub fn scatter_rows_cols(
    op: &'static str,
    device: &str,
    dst: &Tensor,
    rows: &[usize],
    src: &Tensor,
) -> Result<usize> {
    let split = |t: &Tensor| {
        t.dims()
            .split_first()
            .map(|(&r, rest)| (r, rest.iter().product()))
    };
    let (Some((dst_rows, cols)), Some((src_rows, src_cols))) = (split(dst), split(src)) else {
        return Err(Error::shape(op, device, "cannot scatter rank-0 tensors"));
    };
    if src_cols != cols || src_rows != rows.len() {
        return Err(Error::shape(
            op,
            device,
            format!(
                "src {:?} must be ({}, {cols}) to scatter into rows of dst {:?}",
                src.shape(),
                rows.len(),
                dst.shape()
            ),
        ));
    }
    let mut seen = vec![false; dst_rows];
    for &r in rows {
        match seen.get_mut(r) {
            None => {
                return Err(Error::shape(
                    op,
                    device,
                    format!("row {r} is outside dst {:?}", dst.shape()),
                ));
            }
            Some(true) => {
                return Err(Error::shape(
                    op,
                    device,
                    format!("row {r} is written twice"),
                ));
            }
            Some(s) => *s = true,
        }
    }
    Ok(cols)
}

/// The element count of [`MemoryOps::upload`]'s `shape`, checked against the `len` host
/// elements given (every backend checks here, so all report the same text).
pub fn upload_numel(len: usize, shape: &[usize]) -> std::result::Result<usize, String> {
    // Checked before anything is allocated: a wrapped product (`[2^32, 2^32]` -> 0) would
    // accept `len` 0 and index out of bounds later.
    let numel = numel_or_overflow(shape)?;
    if len != numel {
        return Err(format!(
            "{len} host elements for shape {shape:?} ({numel} elements)"
        ));
    }
    Ok(numel)
}

/// The checked shape of [`MemoryOps::narrow_rows`]: `t`'s row length (elements per row of its
/// `(R, ...)` view) and the result's dims, or what is wrong with the range. Every backend checks
/// here, so all report the same text (under their own op and device).
pub fn narrow_rows_dims(
    t: &Tensor,
    start: usize,
    len: usize,
) -> std::result::Result<(usize, Vec<usize>), String> {
    let Some((&rows, rest)) = t.dims().split_first() else {
        return Err("cannot narrow a rank-0 tensor".into());
    };
    if start.checked_add(len).is_none_or(|end| end > rows) {
        return Err(format!(
            "rows [{start}, {start}+{len}) of {:?} (only {rows} rows)",
            t.shape()
        ));
    }
    let mut dims = vec![len];
    dims.extend_from_slice(rest);
    Ok((rest.iter().product(), dims))
}

/// The checked shape of [`MemoryOps::concat_rows`]: the result's dims (parts agree on all but
/// their first dim), or which part disagrees.
pub fn concat_rows_dims(parts: &[&Tensor]) -> std::result::Result<Vec<usize>, String> {
    let Some(first) = parts.first() else {
        return Err("no tensors to concatenate".into());
    };
    let Some((_, rest)) = first.dims().split_first() else {
        return Err("cannot concatenate rank-0 tensors".into());
    };
    let mut rows = 0usize;
    for (i, p) in parts.iter().enumerate() {
        match p.dims().split_first() {
            Some((&r, tail)) if tail == rest => {
                // Rows of zero-width parts are not bounded by memory: their sum can overflow.
                rows = rows.checked_add(r).ok_or_else(|| {
                    format!("the parts' row counts add up to more than usize::MAX (at part {i})")
                })?;
            }
            _ => {
                return Err(format!(
                    "part {i} is {:?} but part 0 is {:?}",
                    p.shape(),
                    first.shape()
                ));
            }
        }
    }
    let mut dims = vec![rows];
    dims.extend_from_slice(rest);
    numel_or_overflow(&dims)?;
    Ok(dims)
}

/// The checked shape of [`MemoryOps::concat_cols`]: the row count `R` and each part's column
/// count (parts viewed as `(R, C_i)`), or which part has another row count. The total width
/// and the `(R, sum C_i)` element count are checked to fit in `usize`.
pub fn concat_cols_dims(parts: &[&Tensor]) -> std::result::Result<(usize, Vec<usize>), String> {
    let Some(first) = parts.first() else {
        return Err("no tensors to concatenate".into());
    };
    let (rows, _) = first.shape().as_matrix();
    let mut cols = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let (r, c) = p.shape().as_matrix();
        if r != rows {
            return Err(format!(
                "part {i} is {:?} ({r} rows) but part 0 is {:?} ({rows} rows)",
                p.shape(),
                first.shape()
            ));
        }
        cols.push(c);
    }
    // Widths of zero-row parts are not bounded by memory: their sum, and the (R, sum C_i)
    // result, can overflow. Checked here so callers may sum and multiply freely.
    let total = cols
        .iter()
        .try_fold(0usize, |acc, &c| acc.checked_add(c))
        .ok_or("the parts' column counts add up to more than usize::MAX")?;
    numel_or_overflow(&[rows, total])?;
    Ok((rows, cols))
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
    use super::{HostSlice, normal_host};

    #[test]
    fn host_slice_widens_every_dtype_exactly_and_checks_its_length() {
        let x = [1.0f32, -2.5, 3.0e-3, f32::INFINITY, 65504.0];
        let f32_le: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf: Vec<u8> = x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let hf: Vec<u8> = x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        // The same values through an odd byte offset: an mmap gives no alignment.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&f32_le);
        for (s, want) in [
            (HostSlice::F32(&f32_le), x.to_vec()),
            (HostSlice::F32(&shifted[1..]), x.to_vec()),
            (HostSlice::from_f32(&x), x.to_vec()),
            (
                HostSlice::Bf16(&bf),
                x.iter()
                    .map(|&v| half::bf16::from_f32(v).to_f32())
                    .collect(),
            ),
            (
                HostSlice::F16(&hf),
                x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
            ),
        ] {
            assert_eq!(s.numel(), 5, "{}", s.dtype_name());
            assert_eq!(s.to_f32_vec(), want, "{}", s.dtype_name());
            assert_eq!(s.range(1, 3).to_f32_vec(), want[1..4], "{}", s.dtype_name());
            assert_eq!(s.check("op", "host", &[5]).unwrap(), 5);
            let e = s.check("op", "host", &[2, 3]).unwrap_err().to_string();
            assert!(
                e.contains("op on host") && e.contains(s.dtype_name()) && e.contains("[2, 3]"),
                "{e}"
            );
        }
        // A trailing partial element is not a whole tensor.
        assert!(HostSlice::Bf16(&bf[..9]).check("op", "host", &[4]).is_err());
        assert!(HostSlice::Bf16(&[]).check("op", "host", &[0, 7]).is_ok());
    }

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

//! The load-time half of the NaN policy (ARCHITECTURE.md): every float tensor read from a
//! checkpoint is scanned for NaN/Inf on the bytes as the file stores them (the memory map),
//! before any conversion or upload, so no f32 copy is made for the check.
//!
//! The scan tests the exponent bits only (all ones = Inf or NaN in F32, BF16 and F16), in
//! parallel over 1 MiB chunks; the 16 GB of an 8B target cost one pass over memory that the
//! upload reads anyway.

use dflash_core::HostSlice;
use rayon::prelude::*;

/// Holders of [`LoadCheckOff`]: the scan runs while there are none.
static CHECK_OFF: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Turns the load-time scan off, process-wide, while it lives (a count, so tests running in
/// parallel can each hold one). For tests only, which inject a non-finite step through the
/// real data path: a NaN row in a target's embedding is the one token-selective way, since
/// finite weights cannot overflow through the models' norms. The NaN policy has no
/// user-facing switch.
#[doc(hidden)]
pub struct LoadCheckOff(());

impl LoadCheckOff {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        CHECK_OFF.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        LoadCheckOff(())
    }
}

impl Drop for LoadCheckOff {
    fn drop(&mut self) {
        CHECK_OFF.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

pub(crate) fn load_check_enabled() -> bool {
    CHECK_OFF.load(std::sync::atomic::Ordering::SeqCst) == 0
}

/// Bytes per parallel task: large enough to amortise scheduling, small enough to balance.
const CHUNK: usize = 1 << 20;

/// The bytes, element size and exponent mask of a float storage type.
fn layout<'a>(data: &HostSlice<'a>) -> (&'a [u8], usize, u32) {
    match *data {
        HostSlice::F32(b) => (b, 4, 0x7f80_0000),
        HostSlice::Bf16(b) => (b, 2, 0x7f80),
        HostSlice::F16(b) => (b, 2, 0x7c00),
    }
}

/// Whether `chunk` (elements of `N` little-endian bytes) holds an element whose exponent bits
/// `exp` are all set. Monomorphised per size and branch-free, so it vectorises.
fn any_bad<const N: usize>(chunk: &[u8], exp: u32) -> bool {
    chunk
        .chunks_exact(N)
        .fold(false, |bad, c| bad | (bits_of(c) & exp == exp))
}

fn bits_of(c: &[u8]) -> u32 {
    match c.len() {
        4 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        _ => u16::from_le_bytes([c[0], c[1]]) as u32,
    }
}

/// Index (in elements) and value of the first NaN or infinite element, if any.
pub fn first_non_finite(data: &HostSlice<'_>) -> Option<(usize, f32)> {
    let (bytes, size, exp) = layout(data);
    // A cheap `any` per chunk in parallel; only the first chunk that has one is searched.
    let chunk = CHUNK - CHUNK % size;
    let hit = bytes.par_chunks(chunk).position_first(|c| match size {
        4 => any_bad::<4>(c, exp),
        _ => any_bad::<2>(c, exp),
    })?;
    let c = &bytes[hit * chunk..(hit * chunk + chunk).min(bytes.len())];
    let (i, b) = c
        .chunks_exact(size)
        .map(bits_of)
        .enumerate()
        .find(|&(_, b)| b & exp == exp)?;
    let value = match *data {
        HostSlice::F32(_) => f32::from_bits(b),
        HostSlice::Bf16(_) => half::bf16::from_bits(b as u16).to_f32(),
        HostSlice::F16(_) => half::f16::from_bits(b as u16).to_f32(),
    };
    Some((hit * chunk / size + i, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(x: &[f32]) -> Vec<u8> {
        x.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn half_bytes(x: &[f32], bf16: bool) -> Vec<u8> {
        x.iter()
            .flat_map(|&v| match bf16 {
                true => half::bf16::from_f32(v).to_le_bytes(),
                false => half::f16::from_f32(v).to_le_bytes(),
            })
            .collect()
    }

    /// Every dtype; the first element, the last of a bf16 chunk and the very last; and the
    /// largest finite values
    /// (all exponent bits but one set) that must not be mistaken for Inf.
    #[test]
    fn finds_the_first_nan_or_inf_in_every_dtype_across_chunks() {
        let n = 3 * CHUNK / 2 + 7;
        for (at, bad) in [
            (0, f32::NAN),
            (CHUNK / 2 - 1, f32::INFINITY),
            (n - 1, -f32::INFINITY),
        ] {
            let mut x: Vec<f32> = (0..n).map(|i| (i % 251) as f32 - 125.0).collect();
            x[at] = bad;
            let f = f32_bytes(&x);
            let (b, h) = (half_bytes(&x, true), half_bytes(&x, false));
            let got = first_non_finite(&HostSlice::F32(&f));
            assert_eq!(got.map(|g| g.0), Some(at), "f32");
            assert_eq!(got.unwrap().1.is_nan(), bad.is_nan());
            assert_eq!(
                first_non_finite(&HostSlice::Bf16(&b)).map(|g| g.0),
                Some(at)
            );
            assert_eq!(first_non_finite(&HostSlice::F16(&h)).map(|g| g.0), Some(at));
        }
        let big = [f32::MAX, -f32::MAX, f32::MIN_POSITIVE, 0.0, -0.0];
        assert_eq!(first_non_finite(&HostSlice::F32(&f32_bytes(&big))), None);
        let bmax = [half::bf16::MAX.to_f32(), half::bf16::MIN.to_f32()];
        assert_eq!(
            first_non_finite(&HostSlice::Bf16(&half_bytes(&bmax, true))),
            None
        );
        let hmax = [half::f16::MAX.to_f32(), half::f16::MIN.to_f32()];
        assert_eq!(
            first_non_finite(&HostSlice::F16(&half_bytes(&hmax, false))),
            None
        );
        assert_eq!(first_non_finite(&HostSlice::F32(&[])), None);
    }
}

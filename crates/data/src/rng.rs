//! Deterministic randomness: seed mixing (splitmix64) and ChaCha8 streams, with our own
//! bounded-uniform and Fisher-Yates so plans and anchors never change with a `rand` upgrade
//! (ChaCha8's output stream itself is value-stable).

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// FNV-1a as a [`std::hash::Hasher`]: a digest every build computes alike (std's
/// `DefaultHasher` may change between Rust releases), for fingerprints that must match across
/// processes and builds: a dataset's files, the schedule ranks compare.
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// splitmix64: a bijective 64-bit mixer (Steele, Lea & Flood; the `SplittableRandom` finalizer).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Mixes `x` into the running hash `h`: `splitmix64(h ^ splitmix64(x))`.
pub fn combine(h: u64, x: u64) -> u64 {
    splitmix64(h ^ splitmix64(x))
}

/// Domain tags so that anchor, bucket and batch-order streams never coincide.
pub(crate) const DOMAIN_ANCHOR: u64 = 0x616E_6368_6F72_7321; // "anchors!"
pub(crate) const DOMAIN_BUCKET: u64 = 0x6275_636B_6574_7321; // "buckets!"
pub(crate) const DOMAIN_ORDER: u64 = 0x6F72_6465_7273_2121; // "orders!!"

pub(crate) fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Uniform in `[0, n)` (Lemire's multiply-and-reject; exact, no modulo bias). `n > 0`.
pub(crate) fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    debug_assert!(n > 0);
    let mut m = (rng.next_u64() as u128) * (n as u128);
    if (m as u64) < n {
        let threshold = n.wrapping_neg() % n;
        while (m as u64) < threshold {
            m = (rng.next_u64() as u128) * (n as u128);
        }
    }
    (m >> 64) as u64
}

/// Fisher-Yates shuffle.
pub(crate) fn shuffle<T>(v: &mut [T], rng: &mut ChaCha8Rng) {
    for i in (1..v.len()).rev() {
        let j = below(rng, i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// Moves a uniform random `k`-subset of `v` to `v[..k]` (partial Fisher-Yates). `k <= len`.
pub(crate) fn choose_prefix<T>(v: &mut [T], k: usize, rng: &mut ChaCha8Rng) {
    let n = v.len();
    for i in 0..k.min(n) {
        let j = i + below(rng, (n - i) as u64) as usize;
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use std::hash::Hasher;

    /// The published FNV-1a 64 test vectors: "" and "a".
    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(super::Fnv1a::default().finish(), 0xcbf2_9ce4_8422_2325);
        let mut h = super::Fnv1a::default();
        h.write(b"a");
        assert_eq!(h.finish(), 0xaf63_dc4c_8601_ec8c);
    }
}

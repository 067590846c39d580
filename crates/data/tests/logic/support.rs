//! Shared builders: a sample, and a pseudo-random loss mask.

use dflash_data::Sample;

pub(crate) fn sample(id: u64, ids: Vec<u32>, loss_mask: Vec<u8>) -> Sample {
    Sample { id, ids, loss_mask }
}

pub(crate) fn random_mask(s: usize, seed: u64, p_one: u64) -> Vec<u8> {
    (0..s as u64)
        .map(|i| (dflash_data::rng::splitmix64(seed.wrapping_mul(31) ^ i) % 100 < p_one) as u8)
        .collect()
}

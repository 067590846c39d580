//! Defaults of the standard DFlash recipe that depend on the target or the block size: which
//! target layers to read, how many, the mask token, the loss decay.

/// Target layer ids whose outputs feed the drafter (the DFlash default):
/// one layer: `[L/2]`; otherwise `k` ids spread as `round(1 + i*(L-4)/(k-1))`, i = 0..k-1.
/// Rounding is half-to-even, as Python's `round` in the DFlash reference code.
/// 36 layers, k=5 -> `[1, 9, 17, 25, 33]`; 64 -> `[1, 16, 31, 46, 61]`. `k == 0` gives `[]`.
/// Meaningful for `L >= 4` when `k > 1` (see [`default_num_target_features`]).
pub fn default_target_layer_ids(num_target_layers: usize, k: usize) -> Vec<usize> {
    spread(num_target_layers, k).collect()
}

/// The ids of [`default_target_layer_ids`], one at a time: they are monotonic in `i` (rounding
/// and the clamp at 0 keep the order of the line), so a repeat is always next to its twin.
pub(crate) fn spread(num_target_layers: usize, k: usize) -> impl Iterator<Item = usize> {
    let span = num_target_layers as f64 - 4.0;
    (0..k).map(move |i| match k {
        1 => num_target_layers / 2,
        _ => {
            let x = (1.0 + i as f64 * span / (k - 1) as f64).round_ties_even();
            x.max(0.0) as usize
        }
    })
}

/// The default number of target features `k`: 5 (the standard recipe) when the target has at
/// least 8 layers, so that the 5 default ids are distinct; `L - 3` for 5..=7 layers; 1 below.
pub fn default_num_target_features(num_target_layers: usize) -> usize {
    match num_target_layers {
        8.. => 5,
        5..=7 => num_target_layers - 3,
        _ => 1,
    }
}

/// The conventional mask token of known target families, by vocabulary size: an unused row of
/// the target's embedding table. Qwen3 (151936) -> 151669; Qwen3.5/3.6 (248320) -> 248070;
/// the embedded tiny byte-level target (264) -> 256. `None` for other vocabularies.
pub fn known_mask_token_id(target_vocab_size: usize) -> Option<u32> {
    match target_vocab_size {
        151_936 => Some(151_669),
        248_320 => Some(248_070),
        264 => Some(256),
        _ => None,
    }
}

/// Loss decay `gamma` of the DFlash recipe for a block size: the one definition, used by
/// training (through [`crate::TrainConfig::gamma`]) and by everything else that reports or
/// measures it, so no reader sees a gamma the drafter was not trained with.
///
/// Published values: 7 for block 16, 5 for block 10, 4 for block 8. Other sizes follow the
/// piecewise-linear curve through those points (continuous, increasing):
/// - `block_size <= 10`: `block_size / 2` (passes through (8, 4) and (10, 5));
/// - `10 < block_size < 16`: `5 + (block_size - 10) / 3` (linear from (10, 5) to (16, 7));
/// - `block_size >= 16`: `block_size * 7 / 16` (proportional to the block-16 recipe).
///
/// Training computes in f32: `default_gamma(b) as f32` equals the curve evaluated in f32
/// bit for bit (the outer branches are exact; the middle one was checked for 11..=15), so
/// replacing dflash-data's f32 copy of this curve by this function changed no run.
pub fn default_gamma(block_size: usize) -> f64 {
    let b = block_size as f64;
    if block_size <= 10 {
        b / 2.0
    } else if block_size < 16 {
        5.0 + (b - 10.0) / 3.0
    } else {
        b * 7.0 / 16.0
    }
}

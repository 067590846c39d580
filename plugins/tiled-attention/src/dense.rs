//! Small dense helpers with a fixed summation order, so results are reproducible bit for bit.

/// f32 dot product with 8 independent partial sums: lets the compiler vectorise, and the fixed
/// lane structure keeps the result deterministic.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `y += alpha * x`.
#[inline]
pub(crate) fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `y += x`, folding an f32 per-tile partial into an f64 cross-tile accumulator.
#[inline]
pub(crate) fn fold(y: &mut [f64], x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += *xi as f64;
    }
}

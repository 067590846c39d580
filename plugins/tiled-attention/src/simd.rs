//! Which instruction set the hot loops run with. The crate is built for baseline x86-64
//! (SSE2: 4 f32 lanes); each pass also has an AVX2 copy (8 lanes), chosen at run time. Both
//! copies are the same safe code compiled twice, and every loop in it is elementwise or sums
//! into fixed partials without FMA (see `dense`), so they give bit-identical results.

/// True when the AVX2 copies may run (x86-64 CPUs with AVX2; the check is cached by std).
#[inline]
pub(crate) fn has_avx2() -> bool {
    #[cfg(test)]
    if BASELINE_ONLY.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Tests set this to run the baseline copies on an AVX2 machine, to compare the two.
#[cfg(test)]
pub(crate) static BASELINE_ONLY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

//! Learning rate: linear warm-up over `warmup_ratio` of the steps, then cosine to
//! `min_lr_ratio * peak` (0 in the DFlash recipe).

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    pub peak: f64,
    pub total_steps: u64,
    pub warmup_steps: u64,
    pub min_ratio: f64,
}

impl LrSchedule {
    pub fn new(peak: f64, total_steps: u64, warmup_ratio: f64, min_ratio: f64) -> Self {
        let warmup_steps = ((total_steps as f64) * warmup_ratio).round() as u64;
        LrSchedule {
            peak,
            total_steps: total_steps.max(1),
            warmup_steps,
            min_ratio,
        }
    }

    /// Learning rate of 0-based optimizer step `step`.
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = (self.total_steps - self.warmup_steps).max(1) as f64;
        let t = ((step - self.warmup_steps) as f64 / span).min(1.0);
        let min = self.peak * self.min_ratio;
        min + (self.peak - min) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_min() {
        let s = LrSchedule::new(6e-4, 100, 0.04, 0.0);
        assert_eq!(s.warmup_steps, 4);
        assert!(
            (s.lr(0) - 1.5e-4).abs() < 1e-12,
            "first warm-up step is peak/4"
        );
        assert!((s.lr(3) - 6e-4).abs() < 1e-12, "warm-up ends at the peak");
        assert!((s.lr(4) - 6e-4).abs() < 1e-12, "cosine starts at the peak");
        assert!(
            s.lr(52) < 3.1e-4 && s.lr(52) > 2.9e-4,
            "half way is half the peak"
        );
        assert!(s.lr(100) < 1e-12, "ends at zero");
        for k in 4..100 {
            assert!(s.lr(k + 1) <= s.lr(k), "monotone after warm-up at {k}");
        }
    }
}

//! Choosing the next token from logits: greedy, or sampling with temperature, top-k and
//! top-p applied in that order (the order of HF transformers' logits warpers).

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 is greedy (argmax, top-k and top-p unused); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Seed of every sequence's stream: sequence `id` draws from its own stream, seeded by
    /// `(seed, id)`, so what a sequence gets does not depend on what it is batched with.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl Sampling {
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks the knobs: a finite temperature >= 0 and `top_p` in `(0, 1]`.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ModelError::Input(format!(
                "sampling temperature must be a finite number >= 0 (0 = greedy), got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ModelError::Input(format!(
                "sampling top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }

    /// The random stream of sequence `id`.
    pub fn stream(&self, id: u64) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(id);
        rng
    }

    /// The next token from one row of logits. Non-finite logits are an error (a NaN
    /// target would otherwise write garbage text that looks like output).
    pub fn pick(&self, logits: &[f32], rng: &mut ChaCha8Rng) -> Result<u32> {
        if let Some(i) = logits.iter().position(|l| !l.is_finite()) {
            return Err(ModelError::Input(format!(
                "logit {i} is {}: the target produced non-finite logits",
                logits[i]
            )));
        }
        if self.is_greedy() {
            return Ok(argmax(logits));
        }
        // Candidates by decreasing logit (ties by id, so the order is deterministic).
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        if self.top_k > 0 {
            order.truncate(self.top_k);
        }
        let t = self.temperature as f64;
        let top = logits[order[0] as usize] as f64 / t;
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| (logits[i as usize] as f64 / t - top).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if self.top_p < 1.0 {
            // HF keeps a token while the mass before it is below top_p: at least one.
            let mut mass = 0.0;
            let keep = probs
                .iter()
                .take_while(|&&p| {
                    let before = mass;
                    mass += p;
                    before < self.top_p as f64
                })
                .count()
                .max(1);
            probs.truncate(keep);
            let kept: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= kept);
        }
        let u: f64 = rng.random();
        let mut acc = 0.0;
        for (p, &id) in probs.iter().zip(&order) {
            acc += p;
            if u < acc {
                return Ok(id);
            }
        }
        Ok(order[probs.len() - 1])
    }
}

/// The first index of the largest value (the tie rule of `torch.argmax`).
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: usize, top_p: f32) -> Sampling {
        Sampling {
            temperature,
            top_k,
            top_p,
            seed: 7,
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let s = Sampling::default();
        let mut rng = s.stream(0);
        assert_eq!(s.pick(&[0.5, 2.0, -1.0, 2.0], &mut rng).unwrap(), 1);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [0.1, 3.0, 2.9, -4.0, 1.0];
        for s in [sampler(1.0, 1, 1.0), sampler(2.0, 0, 1e-6)] {
            let mut rng = s.stream(3);
            for _ in 0..50 {
                assert_eq!(s.pick(&logits, &mut rng).unwrap(), 1, "{s:?}");
            }
        }
    }

    #[test]
    fn sampling_follows_the_softmax_and_respects_top_k() {
        // Logits ln(1), ln(2), ln(3), ln(4): probabilities 0.1 .. 0.4 at temperature 1.
        let logits: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|p| p.ln()).collect();
        let s = sampler(1.0, 0, 1.0);
        let mut rng = s.stream(1);
        let n = 20_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.pick(&logits, &mut rng).unwrap() as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let want = (i + 1) as f64 / 10.0;
            let got = c as f64 / n as f64;
            // 5 standard deviations of a binomial proportion at n = 20000 is under 0.018.
            assert!((got - want).abs() < 0.018, "token {i}: {got} vs {want}");
        }
        let s = sampler(1.0, 2, 1.0);
        let mut rng = s.stream(1);
        for _ in 0..500 {
            assert!(
                s.pick(&logits, &mut rng).unwrap() >= 2,
                "top-k 2 keeps tokens 2, 3"
            );
        }
        // top-p 0.6: 0.4 (token 3) is below it, so token 2 joins; token 1 does not.
        let s = sampler(1.0, 0, 0.6);
        let mut rng = s.stream(1);
        for _ in 0..500 {
            assert!(s.pick(&logits, &mut rng).unwrap() >= 2, "top-p 0.6");
        }
    }

    #[test]
    fn streams_are_per_sequence_and_reproducible() {
        let s = sampler(1.0, 0, 1.0);
        let logits = vec![0.0f32; 50];
        let draw = |id| {
            let mut rng = s.stream(id);
            (0..20)
                .map(|_| s.pick(&logits, &mut rng).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(4), draw(4));
        assert_ne!(draw(4), draw(5));
    }

    #[test]
    fn bad_knobs_and_nan_logits_are_errors() {
        assert!(sampler(-1.0, 0, 1.0).validate().is_err());
        assert!(sampler(f32::NAN, 0, 1.0).validate().is_err());
        assert!(sampler(1.0, 0, 0.0).validate().is_err());
        assert!(sampler(1.0, 0, 1.5).validate().is_err());
        let s = Sampling::default();
        let err = s.pick(&[0.0, f32::NAN], &mut s.stream(0)).unwrap_err();
        assert!(err.to_string().contains("logit 1 is NaN"), "{err}");
    }
}

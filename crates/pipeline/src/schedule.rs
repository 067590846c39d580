//! The deterministic step plan: per epoch, length-bucketed token-budget batches (shuffled
//! from seed and epoch), grouped `micro_batches_per_step` at a time into optimizer steps.

use dflash_data::BatchPlan;

#[derive(Debug, Clone, PartialEq)]
pub struct StepWork {
    pub epoch: u64,
    /// Sample indices of each micro-batch.
    pub micro: Vec<Vec<usize>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub steps: Vec<StepWork>,
}

impl Schedule {
    pub fn new(
        lengths: &[usize],
        bucket_bounds: &[usize],
        token_budget: usize,
        seed: u64,
        epochs: u64,
        micro_per_step: usize,
        max_steps: Option<u64>,
    ) -> (Self, Vec<BatchPlan>) {
        let mut steps = Vec::new();
        let mut plans = Vec::new();
        // `epochs == 0` with `max_steps` (accepted by the config): as many epochs as needed.
        // Without either bound there is nothing to plan (the config rejects that).
        let unbounded = epochs == 0 && max_steps.is_none();
        let mut epoch = 0;
        while !unbounded
            && (epochs == 0 || epoch < epochs)
            && max_steps.is_none_or(|max| (steps.len() as u64) < max)
        {
            let plan = BatchPlan::new(lengths, bucket_bounds, token_budget, seed, epoch);
            let empty = plan.is_empty();
            for group in plan.batches().chunks(micro_per_step.max(1)) {
                steps.push(StepWork {
                    epoch,
                    micro: group.to_vec(),
                });
            }
            plans.push(plan);
            if empty {
                break;
            }
            epoch += 1;
        }
        if let Some(max) = max_steps {
            steps.truncate(max as usize);
        }
        (Schedule { steps }, plans)
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
    /// How many micro-batches of `step` replica `rank` of `world` processes.
    pub fn share(&self, step: usize, rank: usize, world: usize) -> usize {
        (0..self.steps[step].micro.len())
            .filter(|m| m % world == rank)
            .count()
    }
}

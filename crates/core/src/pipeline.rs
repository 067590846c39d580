//! The seams of the training pipeline: what a target emits and a drafter consumes (what the
//! pipeline's queues carry). Concrete models live in `dflash-models`, queues in `dflash-queue`.

use crate::Tensor;

/// A sequence's `(S, k*H)` target features: the k chosen target layers' outputs,
/// concatenated per token in `target_layer_ids` order (the input of the drafter's `fc`).
#[derive(Debug)]
pub enum Features {
    /// A tensor of the target's backend, left where the target computed it (on a GPU: in
    /// device memory, in that backend's compute format). The drafter takes it as it is when
    /// it runs on the same device, and imports it otherwise.
    Tensor(Tensor),
    /// Host memory, row-major (tests, and features made without a backend).
    Host(Vec<f32>),
}

/// A borrowed [`Features`].
#[derive(Debug, Clone, Copy)]
pub enum FeaturesRef<'a> {
    Tensor(&'a Tensor),
    Host(&'a [f32]),
}

impl Features {
    pub fn as_ref(&self) -> FeaturesRef<'_> {
        match self {
            Features::Tensor(t) => FeaturesRef::Tensor(t),
            Features::Host(h) => FeaturesRef::Host(h),
        }
    }
    /// The values in host memory (copied back from a device when they live there).
    pub fn to_host(&self) -> crate::Result<Vec<f32>> {
        self.as_ref().to_host()
    }
}

impl<'a> FeaturesRef<'a> {
    /// Number of values, `S * k * H`.
    pub fn len(&self) -> usize {
        match self {
            FeaturesRef::Tensor(t) => t.numel(),
            FeaturesRef::Host(h) => h.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values in host memory.
    pub fn to_host(&self) -> crate::Result<Vec<f32>> {
        match self {
            FeaturesRef::Tensor(t) => t.storage().read_host(t.numel()),
            FeaturesRef::Host(h) => Ok(h.to_vec()),
        }
    }
}

impl<'a> From<&'a [f32]> for FeaturesRef<'a> {
    fn from(h: &'a [f32]) -> Self {
        FeaturesRef::Host(h)
    }
}
impl<'a> From<&'a Vec<f32>> for FeaturesRef<'a> {
    fn from(h: &'a Vec<f32>) -> Self {
        FeaturesRef::Host(h)
    }
}
impl<'a> From<&'a Features> for FeaturesRef<'a> {
    fn from(f: &'a Features) -> Self {
        f.as_ref()
    }
}

/// One sequence's target features, ready for the drafter.
#[derive(Debug)]
pub struct HiddenSeq {
    /// Stable id of the sample in the dataset (anchor sampling is seeded by it).
    pub sample_id: u64,
    /// `(S)` token ids.
    pub ids: Vec<u32>,
    /// `(S)` 1 where the token is supervised (assistant tokens).
    pub loss_mask: Vec<u8>,
    /// `(S, k*H)`.
    pub features: Features,
}

/// One sequence of a packed micro-batch: its tokens are rows `[offset, offset + len)` of
/// the batch's features.
#[derive(Debug, Clone)]
pub struct SeqMeta {
    /// Stable id of the sample in the dataset (anchor sampling is seeded by it).
    pub sample_id: u64,
    /// `(S)` token ids.
    pub ids: Vec<u32>,
    /// `(S)` 1 where the token is supervised (assistant tokens).
    pub loss_mask: Vec<u8>,
}

/// A micro-batch of features tagged with its place in the schedule: its sequences packed
/// end to end, so the target ran them as one forward (document mask) and the drafter trains
/// on all their blocks in one forward/backward.
#[derive(Debug)]
pub struct HiddenBatch {
    pub epoch: u64,
    /// Optimizer step this micro-batch belongs to.
    pub step: u64,
    /// Index of the micro-batch within its step.
    pub micro: u32,
    /// The packed sequences, in row order.
    pub seqs: Vec<SeqMeta>,
    /// `(sum S, k*H)`; `None` when every sample of the micro-batch was skipped.
    pub features: Option<Features>,
}

impl HiddenBatch {
    pub fn tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.ids.len()).sum()
    }
}

/// A frozen target that turns token ids into the chosen layers' features.
pub trait Target: Send + Sync {
    fn hidden_size(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// Target layer ids whose outputs are emitted, in order.
    fn layer_ids(&self) -> &[usize];
    /// Documents packed end to end -> `(sum S, k*H)` features, each document attending only
    /// to itself (causal, positions from 0), running no layer past the deepest needed one.
    /// They stay where the target computed them ([`Features::Tensor`] on its backend).
    fn features_packed(&self, docs: &[&[u32]]) -> crate::Result<Features>;
    /// `(S)` ids -> `(S, k*H)` features of one sequence.
    fn features(&self, ids: &[u32]) -> crate::Result<Features> {
        self.features_packed(&[ids])
    }
}

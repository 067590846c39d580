//! Checks of a drafter config: internal consistency, and fit to the target it will be trained
//! against or served with. Each error names the field and the values involved.

use super::{DrafterConfig, LayerType, ORIGIN_BUILT};
use crate::error::{ConfigError, Result};
use crate::qwen3::Qwen3Config;

/// 1 TiB: 50x the 8B recipe's drafter state, far below the sizes a typo produces.
const MAX_TRAINING_STATE_BYTES: f64 = (1u64 << 40) as f64;

impl DrafterConfig {
    /// Internal consistency (no target needed).
    pub fn validate(&self) -> Result<()> {
        self.check(ORIGIN_BUILT)
    }

    pub(super) fn check(&self, origin: &str) -> Result<()> {
        // The order of the checks decides which error a config with several faults reports.
        self.check_shapes(origin)?;
        self.check_block_and_rope(origin)?;
        self.check_target_layer_ids(origin)?;
        if self.mask_token_id as usize >= self.vocab_size {
            return Err(invalid(
                origin,
                "dflash_config.mask_token_id",
                format!(
                    "{} is not below vocab_size {}",
                    self.mask_token_id, self.vocab_size
                ),
            ));
        }
        self.check_layer_types(origin)
    }

    /// Layer shapes (sizes, head grouping, norm epsilon) and the training state's total size.
    fn check_shapes(&self, origin: &str) -> Result<()> {
        crate::layer_checks::check_layer_shape(
            &[
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("num_attention_heads", self.num_attention_heads),
                ("num_key_value_heads", self.num_key_value_heads),
                ("head_dim", self.head_dim),
                ("vocab_size", self.vocab_size),
                ("max_position_embeddings", self.max_position_embeddings),
                ("num_target_layers", self.num_target_layers),
            ],
            (
                self.num_attention_heads,
                self.num_key_value_heads,
                "num_attention_heads",
            ),
            self.head_dim,
            self.rms_norm_eps,
        )
        .map_err(|(field, message)| invalid(origin, field, message))?;
        self.check_size_at(origin)
    }

    /// [`Self::check_size`] as the error of the config read from `origin`. Also run before
    /// the per-layer `layer_types` are made, so that a layer count no machine could train
    /// is refused before it is allocated.
    pub(super) fn check_size_at(&self, origin: &str) -> Result<()> {
        self.check_size()
            .map_err(|(field, message)| invalid(origin, field, message))
    }

    /// `block_size` holds an anchor and a predicted token; `rope_theta` is positive.
    fn check_block_and_rope(&self, origin: &str) -> Result<()> {
        if self.block_size < 2 {
            return Err(invalid(
                origin,
                "block_size",
                format!(
                    "must be at least 2 (anchor + one predicted token), got {}",
                    self.block_size
                ),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(invalid(
                origin,
                "rope_theta",
                format!("must be a positive number, got {}", self.rope_theta),
            ));
        }
        Ok(())
    }

    /// The target layer ids: at least one, each inside the target, none twice.
    fn check_target_layer_ids(&self, origin: &str) -> Result<()> {
        let ids = &self.target_layer_ids;
        if ids.is_empty() {
            return Err(invalid(
                origin,
                "dflash_config.target_layer_ids",
                "must name at least one target layer".into(),
            ));
        }
        if let Some(&bad) = ids.iter().find(|&&l| l >= self.num_target_layers) {
            return Err(invalid(
                origin,
                "dflash_config.target_layer_ids",
                format!(
                    "layer {bad} is out of range for num_target_layers {} (ids {ids:?})",
                    self.num_target_layers
                ),
            ));
        }
        if let Some(dup) = ids.iter().enumerate().find(|(i, l)| ids[..*i].contains(l)) {
            return Err(invalid(
                origin,
                "dflash_config.target_layer_ids",
                format!(
                    "layer {} appears twice in {ids:?}: each target layer is one feature",
                    dup.1
                ),
            ));
        }
        Ok(())
    }

    /// One layer type per layer; sliding-attention layers need a positive window, switched on.
    fn check_layer_types(&self, origin: &str) -> Result<()> {
        if self.layer_types.len() != self.num_hidden_layers {
            return Err(invalid(
                origin,
                "layer_types",
                format!(
                    "{} entries for num_hidden_layers {}",
                    self.layer_types.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        if !self.layer_types.contains(&LayerType::SlidingAttention) {
            return Ok(());
        }
        match self.sliding_window {
            None | Some(0) => Err(invalid(
                origin,
                "sliding_window",
                format!(
                    "is {:?} but layer_types has sliding_attention layers; set a positive window",
                    self.sliding_window
                ),
            )),
            Some(_) if !self.use_sliding_window => Err(invalid(
                origin,
                "use_sliding_window",
                "is false but layer_types has sliding_attention layers".into(),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Parameters of the trainable drafter, from the shapes (f64: absurd sizes must not
    /// overflow): per layer the attention projections, the MLP and two norms, plus `fc`.
    pub fn trainable_params(&self) -> f64 {
        let h = self.hidden_size as f64;
        let (hq, hkv, d) = (
            self.num_attention_heads as f64,
            self.num_key_value_heads as f64,
            self.head_dim as f64,
        );
        let attn = h * d * (2.0 * hq + 2.0 * hkv) + 2.0 * d;
        let mlp = 3.0 * h * self.intermediate_size as f64;
        let fc = self.target_layer_ids.len() as f64 * h * h;
        self.num_hidden_layers as f64 * (attn + mlp + 2.0 * h) + fc + 2.0 * h
    }

    /// Refuses a drafter whose training state (f32 weights, gradients and two AdamW moments:
    /// 16 bytes a parameter) is beyond any machine, before anything is allocated; the error
    /// names the largest knob. The real fit is the backend's (out of memory is
    /// `Error::OutOfMemory`); this only keeps typos from reaching the allocator.
    fn check_size(&self) -> std::result::Result<(), (&'static str, String)> {
        let bytes = 16.0 * self.trainable_params();
        if bytes <= MAX_TRAINING_STATE_BYTES {
            return Ok(());
        }
        // In f64, as the sum above: head counts and head_dim are read unchecked from the
        // file, and their integer products can overflow.
        let h = self.hidden_size as f64;
        let (hq, hkv, d) = (
            self.num_attention_heads as f64,
            self.num_key_value_heads as f64,
            self.head_dim as f64,
        );
        let heads = 2.0 * hq + 2.0 * hkv;
        let terms = [
            (
                "intermediate_size",
                self.intermediate_size,
                3.0 * h * self.intermediate_size as f64,
            ),
            ("head_dim", self.head_dim, h * heads * d),
            (
                "num_attention_heads",
                self.num_attention_heads,
                2.0 * h * hq * d,
            ),
        ];
        let (field, value) = if self.num_hidden_layers > 1024 {
            ("num_hidden_layers", self.num_hidden_layers)
        } else {
            let t = terms
                .iter()
                .max_by(|a, b| a.2.total_cmp(&b.2))
                .expect("three terms");
            (t.0, t.1)
        };
        Err((
            field,
            format!(
                "{value} makes the drafter's training state (weights, gradients, AdamW \
                 moments) {:.3e} bytes, above the {:.0} GiB any device holds",
                bytes,
                MAX_TRAINING_STATE_BYTES / (1u64 << 30) as f64
            ),
        ))
    }

    /// Checks that this drafter fits `target`: same hidden size and vocabulary, target layer ids
    /// inside the target, the mask token inside its vocabulary, the same layer count. Each error
    /// names the field and both values.
    pub fn validate_against(&self, target: &Qwen3Config) -> Result<()> {
        let mismatch = |field: &str, d: String, t: String, message: &str| ConfigError::Mismatch {
            field: field.into(),
            drafter: d,
            target: t,
            message: message.into(),
        };
        if self.hidden_size != target.hidden_size {
            return Err(mismatch(
                "hidden_size",
                self.hidden_size.to_string(),
                target.hidden_size.to_string(),
                "the drafter uses the target's embedding and LM head, so they must be equal",
            ));
        }
        if self.num_target_layers != target.num_hidden_layers {
            return Err(mismatch(
                "num_target_layers",
                self.num_target_layers.to_string(),
                format!("num_hidden_layers {}", target.num_hidden_layers),
                "the drafter was made for a target with a different depth",
            ));
        }
        if let Some(&bad) = self
            .target_layer_ids
            .iter()
            .find(|&&l| l >= target.num_hidden_layers)
        {
            return Err(mismatch(
                "dflash_config.target_layer_ids",
                format!("{:?} (layer {bad})", self.target_layer_ids),
                format!("num_hidden_layers {}", target.num_hidden_layers),
                "a target layer id is out of range",
            ));
        }
        if self.mask_token_id as usize >= target.vocab_size {
            return Err(mismatch(
                "dflash_config.mask_token_id",
                self.mask_token_id.to_string(),
                format!("vocab_size {}", target.vocab_size),
                "the mask token must be a row of the target's embedding table",
            ));
        }
        if self.vocab_size != target.vocab_size {
            return Err(mismatch(
                "vocab_size",
                self.vocab_size.to_string(),
                target.vocab_size.to_string(),
                "the drafter predicts through the target's LM head",
            ));
        }
        self.validate()
    }
}

/// The `field` error of the drafter config read from `origin`.
fn invalid(origin: &str, field: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        origin: origin.to_string(),
        field: field.to_string(),
        message,
    }
}

//! Configuration of dflash-rs.
//!
//! - [`Qwen3Config`]: a target's HF `config.json` (both the transformers-4 top-level
//!   `rope_theta` form and the transformers-5 `rope_parameters` form).
//! - [`DrafterConfig`]: a DFlash drafter's `config.json`: read, built for a target
//!   ([`DrafterConfig::for_target`]), checked against it ([`DrafterConfig::validate_against`]),
//!   and written in exactly the layout serving engines load ([`DrafterConfig::to_json`]).
//! - [`TrainConfig`]: the training job, layered with figment: defaults <- TOML file <-
//!   `DFLASH_*` environment variables <- command-line `key.path=value` overrides.
//!
//! Every error is a [`ConfigError`] naming the file (or source) and the field.

// The workspace declares rust-version 1.85: no let-chains (1.88) or `is_multiple_of` (1.87).
#![allow(clippy::collapsible_if, clippy::manual_is_multiple_of)]

mod drafter;
mod error;
mod json;
mod layer_checks;
mod qwen3;
mod rope;
mod train;

pub use drafter::{
    DType, DrafterConfig, DrafterShape, LayerType, default_gamma, default_num_target_features,
    default_target_layer_ids, known_mask_token_id,
};
pub use error::{ConfigError, InitFromMismatch, Result};
pub use qwen3::{Qwen3Config, TokenIds};
pub use train::{
    BackendSection, Collective, DataSection, DrafterSection, ENV_PREFIX, EvalSection,
    PipelineSection, PlacementMode, PluginsSection, Routing, RunSection, TargetSection, TooLong,
    TrainConfig, TrainSection, parse_overrides,
};

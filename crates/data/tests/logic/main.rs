//! Validation, batch plans, anchors and loss weights.

mod anchors;
mod batch_plan;
mod support;
mod validation;
mod weights;

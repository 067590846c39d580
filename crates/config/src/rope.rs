//! RoPE settings in both HF forms:
//! - transformers 4.x: top-level `rope_theta` and `rope_scaling` (null, or an object whose
//!   `rope_type`/`type` is "default");
//! - transformers 5.x: `rope_parameters {rope_theta, rope_type, ...}`, possibly one such object
//!   per layer type (`{"full_attention": {...}, "sliding_attention": {...}}`).
//!
//! Only plain RoPE is implemented: any other `rope_type` (linear, dynamic, yarn, llama3, ...) is
//! an `Unsupported` error, never silently different math.

use serde_json::Value;

use crate::error::Result;
use crate::json::Obj;

fn check_rope_type(o: &Obj<'_>, what: &str) -> Result<()> {
    for key in ["rope_type", "type"] {
        if let Some(v) = o.get(key) {
            match v {
                Value::String(s) if s == "default" => {}
                Value::String(_) => {
                    return Err(o.unsupported(
                        key,
                        v,
                        format!("only plain RoPE (\"default\") is implemented; {what} scaling would change the math"),
                    ));
                }
                _ => return Err(o.wrong(key, "a string", v)),
            }
        }
    }
    match o.opt_f64("partial_rotary_factor")? {
        Some(f) if f != 1.0 => Err(o.unsupported(
            "partial_rotary_factor",
            &Value::from(f),
            "only full-width RoPE (factor 1.0) is implemented",
        )),
        _ => Ok(()),
    }
}

/// `rope_parameters` of one layer type: theta (required) and a default rope type.
fn single_params(o: &Obj<'_>) -> Result<f64> {
    check_rope_type(o, "this")?;
    o.req_f64("rope_theta")
}

/// Reads RoPE theta from either form; see the module docs.
pub(crate) fn read_rope_theta(o: &Obj<'_>) -> Result<f64> {
    let top = o.opt_f64("rope_theta")?;
    if let Some(scaling) = o.opt_obj("rope_scaling")? {
        check_rope_type(&scaling, "this")?;
        // Settings without a type (`{"factor": 4.0}`): transformers refuses them, and
        // reading them as plain RoPE would drop a scaling the author meant.
        if !scaling.has("rope_type") && !scaling.has("type") && !scaling.map.is_empty() {
            return Err(o.unsupported(
                "rope_scaling",
                &Value::Object(scaling.map.clone()),
                "scaling settings without a rope_type: only plain RoPE (\"default\") is \
                 implemented, and which scaling these mean is not said",
            ));
        }
    }
    let params = match o.opt_obj("rope_parameters")? {
        None => None,
        Some(p) if p.has("rope_theta") || p.has("rope_type") || p.map.is_empty() => {
            Some(single_params(&p)?)
        }
        Some(p) => {
            // One parameter set per layer type: all must be plain RoPE with the same theta.
            let mut theta: Option<(String, f64)> = None;
            for key in p.map.keys() {
                let Some(sub) = p.opt_obj(key)? else { continue };
                let t = single_params(&sub)?;
                match &theta {
                    None => theta = Some((key.clone(), t)),
                    Some((k0, t0)) if *t0 != t => {
                        return Err(p.invalid(
                            key,
                            format!(
                                "rope_theta {t} differs from {t0} of `{}{k0}`; per-layer-type RoPE is not supported",
                                p.prefix
                            ),
                        ));
                    }
                    Some(_) => {}
                }
            }
            match theta {
                Some((_, t)) => Some(t),
                None => return Err(p.missing("rope_theta")),
            }
        }
    };
    let theta = match (top, params) {
        (Some(a), Some(b)) if a != b => {
            return Err(o.invalid(
                "rope_theta",
                format!("top-level rope_theta {a} disagrees with rope_parameters.rope_theta {b}"),
            ));
        }
        (_, Some(t)) | (Some(t), None) => t,
        (None, None) => {
            return Err(crate::ConfigError::MissingField {
                origin: o.origin.to_string(),
                field: format!("{0}rope_theta (or {0}rope_parameters.rope_theta)", o.prefix),
            });
        }
    };
    if !(theta.is_finite() && theta > 0.0) {
        return Err(o.invalid(
            "rope_theta",
            format!("must be a positive number, got {theta}"),
        ));
    }
    Ok(theta)
}

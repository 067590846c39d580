//! SwiGLU: `h = silu(gate) * up`, `silu(g) = g * sigmoid(g)`, evaluated in f64 per element.

use dflash_core::{ActivationOps, Result, Tensor};
use rayon::prelude::*;

use crate::ReferenceBackend;
use crate::storage::{host_tensor, same_shape, slice};

const CHUNK: usize = 1 << 14;

fn sigmoid(g: f64) -> f64 {
    1.0 / (1.0 + (-g).exp())
}

impl ActivationOps for ReferenceBackend {
    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        same_shape("swiglu", "gate and up", gate, up)?;
        let (gs, us) = (slice("swiglu", gate)?, slice("swiglu", up)?);
        let mut h = vec![0.0f32; gs.len()]; // same shape as gate, e.g. (T, I)
        self.run(|| {
            h.par_chunks_mut(CHUNK)
                .zip(gs.par_chunks(CHUNK))
                .zip(us.par_chunks(CHUNK))
                .for_each(|((h, g), u)| {
                    for ((h, &g), &u) in h.iter_mut().zip(g).zip(u) {
                        let g = g as f64;
                        *h = (g * sigmoid(g) * u as f64) as f32;
                    }
                })
        });
        Ok(host_tensor(h, gate.shape().clone()))
    }

    /// `d_up = dh * silu(g)`, `d_gate = dh * up * s * (1 + g * (1 - s))` with `s = sigmoid(g)`.
    fn swiglu_backward(&self, dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
        let op = "swiglu_backward";
        same_shape(op, "gate and up", gate, up)?;
        same_shape(op, "dh and gate", dh, gate)?;
        let (dhs, gs, us) = (slice(op, dh)?, slice(op, gate)?, slice(op, up)?);
        let mut dg = vec![0.0f32; gs.len()];
        let mut du = vec![0.0f32; gs.len()];
        self.run(|| {
            dg.par_chunks_mut(CHUNK)
                .zip(du.par_chunks_mut(CHUNK))
                .zip(dhs.par_chunks(CHUNK))
                .zip(gs.par_chunks(CHUNK))
                .zip(us.par_chunks(CHUNK))
                .for_each(|((((dg, du), dh), g), u)| {
                    for i in 0..dg.len() {
                        let (d, g, u) = (dh[i] as f64, g[i] as f64, u[i] as f64);
                        let s = sigmoid(g);
                        du[i] = (d * g * s) as f32;
                        dg[i] = (d * u * s * (1.0 + g * (1.0 - s))) as f32;
                    }
                })
        });
        Ok((
            host_tensor(dg, gate.shape().clone()),
            host_tensor(du, up.shape().clone()),
        ))
    }
}

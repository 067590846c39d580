//! RoPE forward and backward (`shaders/rope.wgsl`). The `(T, D/2)` cos/sin tables are made
//! on the host exactly as the reference makes them (angle in f64, rounded to f32), so the
//! rotation itself is the only rounding; they are uploaded once per distinct
//! (positions, D, theta) and reused by every layer (a small cache).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use dflash_core::{Result, RopeDims, RopeOps, Tensor};

use crate::pipelines::{Family, Kernel};
use crate::storage::{WgpuStorage, storage};
use crate::{WgpuBackend, groups};

const ROPE: Kernel<'static> = Kernel::new(Family::Rope, "rope");

/// Tables kept (a forward's and backward's query and key positions, with room to spare).
const CACHED: usize = 8;

/// The key of a table pair: positions, D/2 and theta's bits.
type TableKey = (Vec<i32>, usize, u32);
type Tables = Arc<(WgpuStorage, WgpuStorage)>;

/// Recently used cos/sin tables.
#[derive(Default)]
pub(crate) struct TableCache(Mutex<VecDeque<(TableKey, Tables)>>);

fn host_tables(positions: &[i32], half: usize, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let d = (2 * half) as f64;
    let inv: Vec<f64> = (0..half)
        .map(|i| (theta as f64).powf(-((2 * i) as f64) / d))
        .collect();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for &f in &inv {
            let a = p as f64 * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

impl WgpuBackend {
    fn tables(
        &self,
        op: &'static str,
        positions: &[i32],
        half: usize,
        theta: f32,
    ) -> Result<Tables> {
        let key = (positions.to_vec(), half, theta.to_bits());
        let mut cache = self.rope_tables.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
            let hit = cache.remove(i).expect("index from position");
            let t = hit.1.clone();
            cache.push_front(hit);
            return Ok(t);
        }
        let (c, s) = host_tables(positions, half, theta);
        let (cs, ss) = (self.ctx.upload_f32(op, &c)?, self.ctx.upload_f32(op, &s)?);
        let t = Arc::new((cs, ss));
        cache.push_front((key, t.clone()));
        cache.truncate(CACHED);
        Ok(t)
    }

    fn rotate(
        &self,
        op: &'static str,
        x: &Tensor,
        positions: &[i32],
        theta: f32,
        sign: f32,
    ) -> Result<Tensor> {
        let RopeDims {
            tokens,
            heads,
            head_dim,
        } = RopeDims::of(op, self.tag(), x, positions, theta)?;
        let xs = storage(op, &self.ctx, x)?;
        let y = self.out(op, xs.len)?;
        let half = head_dim / 2;
        if xs.len == 0 || half == 0 {
            return Ok(self.tensor(y, x.shape().clone()));
        }
        let tables = self.tables(op, positions, half, theta)?;
        let per_token = heads * head_dim;
        let per = (self.span_elems() / per_token).max(1);
        for t0 in (0..tokens).step_by(per) {
            let tc = per.min(tokens - t0);
            let (xb, xsh) = self.span(xs, t0 * per_token, tc * per_token);
            let (yb, ysh) = self.span(&y, t0 * per_token, tc * per_token);
            let (cb, tsh) = self.span(&tables.0, t0 * half, tc * half);
            let (sb, _) = self.span(&tables.1, t0 * half, tc * half);
            let p = [
                tc as u32,
                heads as u32,
                half as u32,
                sign.to_bits(),
                xsh,
                ysh,
                tsh,
            ];
            let g = groups(tc * heads * half, 256);
            self.ctx.dispatch(op, &ROPE, &p, &[xb, cb, sb], &[yb], g)?;
        }
        Ok(self.tensor(y, x.shape().clone()))
    }
}

impl RopeOps for WgpuBackend {
    fn rope(&self, x: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor> {
        self.rotate("rope", x, positions, theta, 1.0)
    }

    fn rope_backward(&self, dy: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor> {
        self.rotate("rope_backward", dy, positions, theta, -1.0)
    }
}

//! Rotary position embedding, HF "rotate half" layout (`kernels/rope.cu`). Positions are
//! uploaded as i32; angles are evaluated in f64 on the device. Input f32 or bf16; the output
//! (forward and backward) is an activation (`CudaOptions::activations`).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use dflash_core::{Result, RopeDims, RopeOps, Tensor};

use crate::CudaBackend;
use crate::kernels::pick;

impl CudaBackend {
    fn rotate(
        &self,
        op: &'static str,
        x: &Tensor,
        positions: &[i32],
        theta: f32,
        sign: f32,
    ) -> Result<Tensor> {
        let xs = self.any(op, x)?;
        let RopeDims {
            tokens: t,
            heads,
            head_dim: d,
        } = RopeDims::of(op, &self.tag, x, positions, theta)?;
        let n = xs.len;
        let od = self.opts.activations;
        let mut y = self.alloc(op, n, od)?;
        if n == 0 {
            return Ok(self.tensor(y, od, x.shape().clone()));
        }
        let heads = heads as i32;
        let pos = self.upload_i32_cached(op, positions)?;
        let (d32, th) = (d as i32, theta as f64);
        // One thread per rotated pair, or per 8 pairs where the kernel vectorises (D/2 % 8 == 0;
        // it also needs 16-byte aligned pointers, which every tensor base is, and falls back
        // to pairs otherwise: correct with either launch).
        let items = heads as usize * d / 2 / if (d / 2) % 8 == 0 { 8 } else { 1 };
        let threads = (items.div_ceil(32) * 32).clamp(32, 256) as u32;
        let k = self.k();
        let f = pick(
            &[
                &k.rope_rotate_ff,
                &k.rope_rotate_fb,
                &k.rope_rotate_bf,
                &k.rope_rotate_bb,
            ],
            &[od, xs.dtype],
        );
        let mut l = self.stream.launch_builder(f);
        l.arg(&mut y)
            .arg(&xs.buf)
            .arg(&*pos)
            .arg(&heads)
            .arg(&d32)
            .arg(&th)
            .arg(&sign);
        self.launch(
            op,
            l,
            LaunchConfig {
                grid_dim: (t as u32, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: (d * 4) as u32,
            },
        )?;
        Ok(self.tensor(y, od, x.shape().clone()))
    }
}

impl RopeOps for CudaBackend {
    fn rope(&self, x: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor> {
        self.rotate("rope", x, positions, theta, 1.0)
    }

    fn rope_backward(&self, dy: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor> {
        self.rotate("rope_backward", dy, positions, theta, -1.0)
    }
}

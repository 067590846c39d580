//! The bytes of one drafter step and one target forward, simulated from shapes alone: every
//! tensor the model code makes is allocated here, in the code's order, and freed where the
//! code drops it (Rust frees a local at the end of its scope, so a function's temporaries
//! stay until it returns). The high-water mark of that walk is the step's peak. The walk
//! follows `dflash_models::{drafter, layer, target}`; a change there that moves the peak shows
//! up in this module's CPU test against the measured peak.

use dflash_models::layer::LayerDims;

use dflash_core::AllocationRounding;

use super::model::{BackendModel, Dtype, rounded};

/// Bytes live now and their high-water mark. 128-bit: a typo'd size (a 10^11 MLP) must come
/// out as "does not fit", never as an overflow; signed, so that a repeated section may free
/// more than it allocates (the backward frees the forward's caches).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Sim {
    pub live: i128,
    pub peak: i128,
    /// How the backend sizes each allocation.
    pub rounding: AllocationRounding,
}

impl Sim {
    /// A tensor of `bytes`: returns the bytes it takes (rounded as the backend rounds), which
    /// is what freeing it gives back.
    pub fn alloc(&mut self, bytes: u128) -> u128 {
        let bytes = rounded(self.rounding, bytes);
        self.live += bytes as i128;
        self.peak = self.peak.max(self.live);
        bytes
    }
    pub fn free(&mut self, bytes: u128) {
        self.live -= bytes as i128;
    }
    /// A workspace an op takes and gives back before returning.
    pub fn transient(&mut self, bytes: u128) {
        let taken = self.alloc(bytes);
        self.free(taken);
    }
}

/// One decoder layer's dimensions (the drafter's or the target's).
#[derive(Debug, Clone, Copy)]
pub(super) struct LayerShape {
    pub h: u128,
    pub qd: u128,
    pub kd: u128,
    pub hq: u128,
    pub hkv: u128,
    pub dh: u128,
    pub i: u128,
    /// The projections' element type (f32 trainable weights; the compute format when frozen).
    pub wdt: Dtype,
}

impl LayerShape {
    /// The layer of `d` (the models' own dimensions) with MLP width `i`, projections of `wdt`.
    pub fn new(d: &LayerDims, i: usize, wdt: Dtype) -> Self {
        let u = |x: usize| x as u128;
        LayerShape {
            h: u(d.hidden),
            qd: u(d.q_heads) * u(d.head_dim),
            kd: u(d.kv_heads) * u(d.head_dim),
            hq: u(d.q_heads),
            hkv: u(d.kv_heads),
            dh: u(d.head_dim),
            i: u(i),
            wdt,
        }
    }
    /// Elements of the seven projections (the 2-D weights).
    pub fn matrix_elems(&self) -> u128 {
        let (h, qd, kd, i) = (self.h, self.qd, self.kd, self.i);
        2 * qd * h + 2 * kd * h + 3 * i * h
    }
    /// Elements of the four norm weights (1-D, always f32).
    pub fn norm_elems(&self) -> u128 {
        2 * self.h + 2 * self.dh
    }
    /// The largest projection, in elements (the largest transient a GEMM's operand rounding
    /// or a gradient's fresh zeros make).
    pub fn largest_matrix(&self) -> u128 {
        (self.i * self.h).max(self.qd * self.h)
    }
}

/// The ops of the layer walk, each allocating its outputs (and transient workspace) in `sim`.
pub(super) struct Walk<'a> {
    pub sim: Sim,
    pub m: &'a BackendModel,
    /// The largest attention workspace seen (for the breakdown).
    pub attn_ws: u128,
}

impl<'a> Walk<'a> {
    pub fn new(m: &'a BackendModel) -> Self {
        Walk {
            sim: Sim {
                rounding: m.rounding,
                ..Sim::default()
            },
            m,
            attn_ws: 0,
        }
    }
    /// `n` runs of `f`, each changing the live bytes by the same amount (identical layers):
    /// walked once and extrapolated, so the plan costs the same for 5 layers or 10^8.
    pub fn repeat(&mut self, n: u128, mut f: impl FnMut(&mut Walk<'a>)) {
        if n == 0 {
            return;
        }
        let mut one = Walk::new(self.m);
        f(&mut one);
        let (delta, local_peak) = (one.sim.live, one.sim.peak);
        // The highest run is the last when each adds bytes, the first when each frees some.
        let runs_before = if delta > 0 { n as i128 - 1 } else { 0 };
        self.sim.peak = self
            .sim
            .peak
            .max(self.sim.live + runs_before * delta + local_peak);
        self.sim.live += n as i128 * delta;
        self.attn_ws = self.attn_ws.max(one.attn_ws);
    }
    fn act(&self, elems: u128) -> u128 {
        elems * self.m.act as u128
    }
    /// An activation of `elems` elements (what every compute op writes).
    pub fn a(&mut self, elems: u128) -> u128 {
        let b = self.act(elems);
        self.sim.alloc(b)
    }
    /// An f32 tensor (statistics such as rstd and lse, `zeros`, parameter gradients).
    pub fn f(&mut self, elems: u128) -> u128 {
        self.sim.alloc(elems * 4)
    }
    pub fn free(&mut self, bytes: u128) {
        self.sim.free(bytes);
    }
    /// A GEMM's operand-rounding scratch: operands not already in the GEMM type are
    /// converted into a stream-ordered copy for the call (CUDA), nothing on the host.
    pub fn gemm(&mut self, operands: &[(Dtype, u128)]) {
        let scratch: u128 = operands
            .iter()
            .map(|&(dt, n)| self.m.gemm_scratch(dt, n))
            .sum();
        self.sim.transient(scratch);
    }
    /// `linear(x, w)`: `(rows, out)` activation; `w` of dtype `wdt`.
    pub fn linear(&mut self, x: (Dtype, u128), wdt: Dtype, w_elems: u128, out: u128) -> u128 {
        self.gemm(&[x, (wdt, w_elems)]);
        self.a(out)
    }
    /// Forward attention: `out (Tq, Hq*D)` activation and `lse (Tq, Hq)` f32, plus the
    /// kernel's workspace.
    pub fn attention(&mut self, tq: u128, tk: u128, l: &LayerShape) -> (u128, u128) {
        let ws = self.m.attention_forward_ws(tq, tk, l);
        let out = self.a(tq * l.qd);
        let lse = self.f(tq * l.hq);
        self.attn_ws = self.attn_ws.max(ws);
        self.sim.transient(ws);
        (out, lse)
    }
    /// Backward attention: `dq`, `dk`, `dv` activations, plus the kernel's workspace (held
    /// together with the outputs).
    pub fn attention_backward(&mut self, tq: u128, tk: u128, l: &LayerShape) -> u128 {
        let ws = self.m.attention_backward_ws(tq, tk, l);
        let outs = self.a(tq * l.qd) + self.a(tk * l.kd) + self.a(tk * l.kd);
        self.attn_ws = self.attn_ws.max(ws);
        self.sim.transient(ws);
        outs
    }
    /// RMSNorm of `rows` rows of `cols`: output activation and `(rows)` f32 rstd.
    pub fn rms_norm(&mut self, rows: u128, cols: u128) -> (u128, u128) {
        (self.a(rows * cols), self.f(rows))
    }
    /// RMSNorm backward: `dx` activation and `dw (cols)` f32.
    pub fn rms_norm_backward(&mut self, rows: u128, cols: u128) -> (u128, u128) {
        (self.a(rows * cols), self.f(cols))
    }
    /// Per-head RMSNorm of `(rows, heads*D)`: a copy viewed as `(rows*heads, D)` (freed on
    /// return), then the norm. Returns (output, rstd).
    pub fn head_norm(&mut self, rows: u128, heads: u128, dh: u128) -> (u128, u128) {
        let copy = self.a(rows * heads * dh);
        let r = self.rms_norm(rows * heads, dh);
        self.free(copy);
        r
    }
    /// RoPE (forward or backward) of `(rows, heads*D)`: the output, plus the host's cos/sin
    /// tables while it runs.
    pub fn rope(&mut self, rows: u128, heads: u128, dh: u128) -> u128 {
        self.sim.transient(self.m.rope_tables(rows, dh));
        self.a(rows * heads * dh)
    }
}

/// The cache [`dflash_models::layer::recompute_cache`] returns, in bytes, and the walk of it.
/// `ctx`: the context rows (`None`: the target's plain self-attention). Leaves the cache live
/// and everything else the function drops freed.
pub(super) fn layer_cache(w: &mut Walk<'_>, l: &LayerShape, rows: u128, ctx: Option<u128>) -> u128 {
    let act = w.m.act_dtype();
    let (xn, rstd_in) = w.rms_norm(rows, l.h);
    let q = w.linear((act, rows * l.h), l.wdt, l.qd * l.h, rows * l.qd);
    let (qn, rstd_q) = w.head_norm(rows, l.hq, l.dh);
    let q_rot = w.rope(rows, l.hq, l.dh);
    let kb = w.linear((act, rows * l.h), l.wdt, l.kd * l.h, rows * l.kd);
    let (kbn, rstd_kb) = w.head_norm(rows, l.hkv, l.dh);
    let kb_rot = w.rope(rows, l.hkv, l.dh);
    let vb = w.linear((act, rows * l.h), l.wdt, l.kd * l.h, rows * l.kd);
    // k_all / v_all: the concatenation with the context rows, or the block rows themselves.
    let (kv_all, k_ctx, locals) = match ctx {
        Some(s) => {
            let kc = w.linear((act, s * l.h), l.wdt, l.kd * l.h, s * l.kd);
            let (kcn, rstd_kc) = w.head_norm(s, l.hkv, l.dh);
            let kc_rot = w.rope(s, l.hkv, l.dh);
            let vc = w.linear((act, s * l.h), l.wdt, l.kd * l.h, s * l.kd);
            let k_all = w.a((s + rows) * l.kd);
            let v_all = w.a((s + rows) * l.kd);
            // kcn, kc_rot and vc end with the match arm; kb_rot and vb with the function.
            w.free(kcn + kc_rot + vc);
            (k_all + v_all, kc + rstd_kc, kb_rot + vb)
        }
        None => (kb_rot + vb, 0, 0),
    };
    let tk = rows + ctx.unwrap_or(0);
    let (attn, lse) = w.attention(rows, tk, l);
    let o = w.linear((act, rows * l.qd), l.wdt, l.h * l.qd, rows * l.h);
    let h = w.a(rows * l.h);
    let (hn, rstd_post) = w.rms_norm(rows, l.h);
    let gate = w.linear((act, rows * l.h), l.wdt, l.i * l.h, rows * l.i);
    let up = w.linear((act, rows * l.h), l.wdt, l.i * l.h, rows * l.i);
    let act_out = w.a(rows * l.i);
    // Dropped on return: qn, kbn, o, and (with context) kb_rot and vb.
    w.free(qn + kbn + o + locals);
    xn + rstd_in
        + q
        + rstd_q
        + q_rot
        + k_ctx
        + kb
        + rstd_kb
        + kv_all
        + attn
        + lse
        + h
        + hn
        + rstd_post
        + gate
        + up
        + act_out
}

/// [`dflash_models::layer::forward`]: the cache, then `down` and `y`. Returns (y, cache);
/// the cache is freed here unless `keep`.
pub(super) fn layer_forward(
    w: &mut Walk<'_>,
    l: &LayerShape,
    rows: u128,
    ctx: Option<u128>,
    keep: bool,
) -> (u128, u128) {
    let act = w.m.act_dtype();
    let cache = layer_cache(w, l, rows, ctx);
    let down = w.linear((act, rows * l.i), l.wdt, l.h * l.i, rows * l.h);
    let y = w.a(rows * l.h);
    w.free(down);
    if keep {
        (y, cache)
    } else {
        w.free(cache);
        (y, 0)
    }
}

/// [`dflash_models::layer::backward`] with context rows `s`: the MLP half's temporaries live
/// until it returns `d_h`, the attention half's until it returns `d_xn`; returns `dx` (the only
/// allocation left live).
pub(super) fn layer_backward(w: &mut Walk<'_>, l: &LayerShape, rows: u128, s: u128) -> u128 {
    let d_h = mlp_backward(w, l, rows);
    let d_xn = attention_backward(w, l, rows, s);
    let (dx_norm, d_in) = w.rms_norm_backward(rows, l.h);
    let dx = w.a(rows * l.h);
    w.free(d_h + d_xn + dx_norm + d_in);
    dx
}

/// Weight gradients (`acc_weight_grad`) read two activations: scratch only where the
/// activations are not in the GEMM type.
fn weight_grad(w: &mut Walk<'_>, a: u128, b: u128) {
    let act = w.m.act_dtype();
    w.gemm(&[(act, a), (act, b)]);
}

/// The layer backward's `mlp_backward`: returns `d_h`, its temporaries freed.
fn mlp_backward(w: &mut Walk<'_>, l: &LayerShape, rows: u128) -> u128 {
    let act = w.m.act_dtype();
    let wdt = l.wdt;
    let mut held = 0;
    weight_grad(w, rows * l.h, rows * l.i); // down_proj
    held += w.linear((act, rows * l.h), wdt, l.h * l.i, rows * l.i); // d_act
    held += w.a(rows * l.i) + w.a(rows * l.i); // d_gate, d_up
    weight_grad(w, rows * l.i, rows * l.h); // gate_proj, up_proj
    held += w.linear((act, rows * l.i), wdt, l.i * l.h, rows * l.h); // d_hn
    w.gemm(&[(act, rows * l.i), (wdt, l.i * l.h)]); // d_hn += d_up up_proj
    let (d_h_mlp, d_post) = w.rms_norm_backward(rows, l.h);
    held += d_h_mlp + d_post;
    let d_h = w.a(rows * l.h);
    w.free(held);
    d_h
}

/// The layer backward's `attention_backward` with context rows `s`: returns `d_xn`, its
/// temporaries freed.
fn attention_backward(w: &mut Walk<'_>, l: &LayerShape, rows: u128, s: u128) -> u128 {
    let act = w.m.act_dtype();
    let wdt = l.wdt;
    let mut held = 0;
    weight_grad(w, rows * l.h, rows * l.qd); // o_proj
    held += w.linear((act, rows * l.h), wdt, l.h * l.qd, rows * l.qd); // d_attn
    held += w.a(rows * l.qd); // copy of attn
    held += w.attention_backward(rows, s + rows, l);
    held += w.rope(rows, l.hq, l.dh); // dq_n
    held += w.a(rows * l.qd); // q_rows copy
    let (dq, dq_norm) = w.rms_norm_backward(rows * l.hq, l.dh);
    held += dq + dq_norm;
    weight_grad(w, rows * l.qd, rows * l.h); // q_proj
    let d_xn = w.linear((act, rows * l.qd), wdt, l.qd * l.h, rows * l.h);
    held += w.a(rows * l.kd) + w.a(rows * l.kd); // dk_blk, dv_blk
    held += key_backward(w, l, rows);
    weight_grad(w, rows * l.kd, rows * l.h); // k_proj, v_proj
    for _ in 0..2 {
        w.gemm(&[(act, rows * l.kd), (wdt, l.kd * l.h)]); // d_xn += dk/dv W
    }
    if s > 0 {
        // dk_ctx, dv_ctx and dk_c end with the `if let` block.
        let block = w.a(s * l.kd) + w.a(s * l.kd) + key_backward(w, l, s);
        for _ in 0..2 {
            w.gemm(&[(act, s * l.kd), (wdt, l.kd * l.h)]); // d_ctx += dk_c/dv_ctx W
        }
        w.free(block);
    }
    w.free(held);
    d_xn
}

/// The layer backward's `key_backward`: rope backward and a copy (freed on
/// return), the per-head norm backward's `dk` (returned) and `dk_norm`.
fn key_backward(w: &mut Walk<'_>, l: &LayerShape, n: u128) -> u128 {
    let dk_n = w.rope(n, l.hkv, l.dh);
    let k_rows = w.a(n * l.kd);
    let (dk, dk_norm) = w.rms_norm_backward(n * l.hkv, l.dh);
    w.free(dk_n + k_rows + dk_norm);
    dk
}

//! `wgpu-tiled`'s choice per call on this backend: which configuration of each kernel runs
//! (for the adapter's workgroup memory and subgroups, and the options: [`AttnCfg`]'s
//! variants), its uniform parameters, and the passes a call's tile lists are split into
//! (one on a GPU; several on CPU adapters, whose loops are capped).

use dflash_core::{AttnDims, Result};

use super::lists::Meta;
use super::tiled::{AttnCfg, AttnKind, MARGIN, MAX_HEAD_DIM};
use crate::WgpuBackend;
use crate::pipelines::{Bind, Kernel};

impl WgpuBackend {
    /// The modules `wgpu-tiled` runs at head dim `head_dim` on this adapter (forward, dq,
    /// dk/dv), as their labels name them: file, padded head dim, tiles, how q/k/v are read.
    /// Tests use it to know which kernel a suite covered.
    pub fn tiled_kernels(&self, head_dim: usize) -> Result<[String; 3]> {
        let dims = AttnDims {
            q_rows: 1,
            kv_rows: 1,
            q_heads: 1,
            kv_heads: 1,
            head_dim,
        };
        let kinds = [AttnKind::Fwd, AttnKind::Dq, AttnKind::Dkdv];
        let cfgs = self.tiled_check("tiled_kernels", &dims, &[head_dim, head_dim], kinds)?;
        Ok(cfgs.map(|c| c.label()))
    }

    /// Checks the head dim `wgpu-tiled` supports and picks the configuration of each kernel
    /// for the adapter's workgroup memory and subgroups (`sizes`: q's and k's elements).
    pub(super) fn tiled_check<const N: usize>(
        &self,
        op: &'static str,
        dims: &AttnDims,
        sizes: &[usize],
        kinds: [AttnKind; N],
    ) -> Result<[AttnCfg; N]> {
        let d = dims.head_dim;
        if d == 0 || d > MAX_HEAD_DIM {
            return Err(self.err(
                op,
                format!("wgpu-tiled supports head_dim 1..={MAX_HEAD_DIM}, got {d}"),
            ));
        }
        let have = self.ctx.limits.max_compute_workgroup_storage_size;
        let empty = sizes.contains(&0);
        let (min, max) = self.subgroup_sizes();
        let mut out = Vec::with_capacity(N);
        for kind in kinds {
            let cfg = AttnCfg::choose(kind, d, empty, have).map_err(|need| {
                self.err(
                    op,
                    format!(
                        "wgpu-tiled needs {need} bytes of workgroup memory at head_dim {d}; \
                         the adapter has {have}"
                    ),
                )
            })?;
            let cfg = self.on_subgroups(cfg, have, (min, max));
            out.push(self.on_coop(cfg, have));
        }
        Ok(out
            .try_into()
            .unwrap_or_else(|_| unreachable!("one per kind")))
    }

    /// `cfg` moved to its subgroup kernel where the adapter and the options allow: the forward
    /// wherever its tiles fit the subgroups (on its own tiles with `attn_subgroup_tiles`), with
    /// query registers (`attn_qreg`) and two keys a lane (`attn_wide_tiles`); dq with
    /// `attn_dq_subgroups`, dk/dv with `attn_dkdv_subgroups`. Each only where `have` bytes of
    /// workgroup memory hold it.
    fn on_subgroups(&self, cfg: AttnCfg, have: u32, (min, max): (u32, u32)) -> AttnCfg {
        if !self.subgroups() {
            return cfg;
        }
        let o = &self.opts;
        let fits = |c: &AttnCfg| c.fits_subgroups(min, max) && c.bytes() + MARGIN <= have;
        let qreg = match cfg.kind {
            AttnKind::Fwd => o.attn_qreg,
            AttnKind::Dq if o.attn_dq_subgroups => true,
            AttnKind::Dkdv if o.attn_dkdv_subgroups => true,
            _ => return cfg,
        };
        let natural = AttnCfg {
            sg: true,
            qreg,
            ..cfg
        };
        let tiled = cfg.with_subgroup_tiles(qreg);
        let sg = if fits(&natural) {
            natural
        } else if o.attn_subgroup_tiles && fits(&tiled) {
            tiled
        } else {
            return cfg;
        };
        let wide = sg.with_wide_tiles();
        if sg.kind == AttnKind::Fwd && o.attn_wide_tiles && fits(&wide) {
            return wide;
        }
        sg
    }

    /// `cfg` moved to the tensor-core forward ([`AttnCfg::coop_forward`]) under
    /// [`crate::WgpuOptions::attn_coop`] (as resolved at start), where it exists for the head
    /// dim, `have` bytes of workgroup memory hold it and the call runs in one pass (the kernel
    /// carries no state between passes: GPUs run one unless `attn_pass_tiles` splits them).
    /// Elsewhere the f32 forward runs, as documented on the option.
    fn on_coop(&self, cfg: AttnCfg, have: u32) -> AttnCfg {
        if !self.coop_attention || self.per_pass(&cfg) != usize::MAX {
            return cfg;
        }
        match cfg.coop_forward() {
            Some(c) if c.bytes() + MARGIN <= have => c,
            _ => cfg,
        }
    }

    pub(super) fn attn_params(
        &self,
        dims: &AttnDims,
        scale: f32,
        m: &Meta,
        cfg: &AttnCfg,
    ) -> [u32; 16] {
        let (bq, bk) = cfg.tiles();
        [
            dims.q_rows as u32,
            dims.kv_rows as u32,
            dims.q_heads as u32,
            dims.kv_heads as u32,
            dims.head_dim as u32,
            bq as u32,
            bk as u32,
            dims.group() as u32,
            scale.to_bits(),
            m.qlist_at,
            m.koff_at,
            m.klist_at,
            m.ivs_at,
            0,
            0,
            0,
        ]
    }

    /// List iterations one dispatch may run: unbounded on GPUs; on a CPU adapter (llvmpipe
    /// stops every invocation after 65535 loop iterations in all) as many as keep an
    /// invocation's loop iterations under 60000, counted generously (twice: five tile
    /// stages, two score phases of `DP / 4` steps per block, the row phase, two accumulation
    /// phases); at most [`crate::WgpuOptions::attn_pass_tiles`] where that is set.
    pub(super) fn per_pass(&self, cfg: &AttnCfg) -> usize {
        let cap = self.opts.attn_pass_tiles.unwrap_or(usize::MAX).max(1);
        if self.ctx.info.device_type != wgpu::DeviceType::Cpu {
            return cap;
        }
        let (bq, bk) = cfg.tiles();
        let (dp, wg) = (cfg.dp as usize, cfg.threads() as usize);
        let stage = (bq.max(bk) * dp / 4).div_ceil(wg) * 4 + bq.max(bk);
        let scores = (bq * bk / 8).div_ceil(wg) * (dp / 4 + 8);
        let cost = 2 * (5 * stage + 2 * scores + 2 * bk + 2 * bq.max(bk) + 64);
        (60_000 / cost).clamp(1, cap)
    }

    /// Dispatches `k` once per pass over `len` list iterations (at least one pass), setting
    /// each pass's range and first/last flags in `p`; flags outside `keep` are dropped (a
    /// kernel that carries its state across several calls is first and last only once).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn passes(
        &self,
        op: &'static str,
        k: &Kernel<'_>,
        mut p: [u32; 16],
        per: usize,
        len: usize,
        reads: &[Bind<'_>],
        writes: &[Bind<'_>],
        groups: u64,
        keep: u32,
    ) -> Result<()> {
        for [first, count, flags] in pass_words(per, len) {
            (p[13], p[14], p[15]) = (first, count, flags & keep);
            self.ctx.dispatch(op, k, &p, reads, writes, groups)?;
        }
        Ok(())
    }
}

/// A pass's flags (attention.wgsl's `FIRST`, `LAST`): it starts a kernel's state, it ends it.
pub(super) const FIRST: u32 = 1;
pub(super) const LAST: u32 = 2;

/// `[w_first, w_count, flags]` of each pass over `len` list iterations, `per` at a time (at
/// least one pass). A count never exceeds `len`: the shader adds it to where a tile's list
/// starts in the concatenated lists, so `u32::MAX` standing for "all" would wrap.
pub(super) fn pass_words(per: usize, len: usize) -> Vec<[u32; 3]> {
    let per = per.clamp(1, len.max(1));
    let n = len.div_ceil(per).max(1);
    (0..n)
        .map(|i| {
            let flags = if i == 0 { FIRST } else { 0 } | if i + 1 == n { LAST } else { 0 };
            [(i * per) as u32, per as u32, flags]
        })
        .collect()
}

//! `wgpu-tiled`: the block-sparse WGSL attention kernels (`shaders/attention*.wgsl`). The
//! host part: one generated module per kernel, head-dim class and tile configuration (chosen
//! for the adapter's workgroup memory and subgroups: [`AttnCfg::choose`]), the uniform
//! parameters and the passes of one call; a mask's tile lists are `lists.rs`'s. The forward
//! and the three backward kernels (`dsum`, `dq`, `dk/dv`; atomics-free and deterministic) are
//! dispatched by `run.rs`.

use dflash_core::{AttnDims, Result};

use super::lists::Meta;
use crate::WgpuBackend;
use crate::pipelines::{Bind, Family, Kernel};

/// The largest head dim.
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// Bytes kept free under the adapter's workgroup-storage limit (alignment a driver may add).
const MARGIN: u32 = 256;

/// Which attention kernel a module holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AttnKind {
    /// `attn_fwd` (attention_fwd.wgsl).
    Fwd,
    /// `attn_dsum` and `attn_dq` (attention_dq.wgsl).
    Dq,
    /// `attn_dkdv` (attention_dkdv.wgsl).
    Dkdv,
}

/// One attention module: the kernel, the padded head dim `dp` (a power of two, 32..=256) and
/// the tile sizes, put in front of the WGSL as constants, and how q, k, v are read (`vec4`:
/// whole vec4, for head dims that are a multiple of 4). The threads: each owns 4 rows (keys
/// for dk/dv) of 8 dims of the accumulators, so `(rows / 4) * (dp / 8)`, 128 for every kernel
/// (the owned side is 4096 / dp); the subgroup forward (`sg`) has twice as many, each owning
/// 4 rows of 4 dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AttnCfg {
    pub kind: AttnKind,
    pub dp: u32,
    pub bq: u32,
    pub bk: u32,
    pub vec4: bool,
    /// The forward's softmax in registers and subgroup shuffles, on twice the threads
    /// (attention_fwd_sg.wgsl).
    pub sg: bool,
    /// With `sg`: the scores from query rows held in registers, the head dim split over 8
    /// lanes (attention_fwd_sg.wgsl, `QREG`), instead of a staged query tile.
    pub qreg: bool,
    /// With `sg`: keys per lane of a row group (`KPL`, 1 or 2): BK = KPL * DP / 4.
    pub kpl: u32,
    /// The forward on cooperative matrices (attention_fwd_coop.wgsl, [`Self::coop_forward`]).
    pub coop: bool,
}

impl AttnCfg {
    /// The configuration of `kind` for head dim `d` within `limit` bytes of workgroup memory:
    /// 128 threads (the rows a thread block owns, BQ for the forward and dq, BK for dk/dv,
    /// = 4096 / DP), the other tile side the largest of 64, 32, 16, 8 that fits; q, k, v read
    /// as vec4 when `d % 4 == 0` and none is empty (a binding of vec4 needs 16 bytes). `Err`:
    /// the bytes the smallest configuration needs.
    pub(crate) fn choose(
        kind: AttnKind,
        d: usize,
        empty: bool,
        limit: u32,
    ) -> std::result::Result<Self, u32> {
        let vec4 = d.is_multiple_of(4) && !empty;
        let dp = (d.max(1).next_power_of_two() as u32).max(32);
        let owned = 4096 / dp;
        let mut need = u32::MAX;
        for other in [64, 32, 16, 8] {
            let (bq, bk) = match kind {
                AttnKind::Fwd | AttnKind::Dq => (owned, other),
                AttnKind::Dkdv => (other, owned),
            };
            let cfg = AttnCfg {
                kind,
                dp,
                bq,
                bk,
                vec4,
                sg: false,
                qreg: false,
                kpl: 1,
                coop: false,
            };
            need = cfg.bytes() + MARGIN;
            if need <= limit {
                return Ok(cfg);
            }
        }
        Err(need)
    }

    /// Whether the kernel can run on subgroups whose size lies in `[min, max]` ([`Self::sg`]):
    /// a row group's DP / 4 lanes hold KPL keys each and their 4-dim slices of the
    /// accumulators cover DP (BK == KPL * DP / 4), and full subgroups of at least DP / 4 lanes
    /// fill the workgroup of (BQ / 4) * DP / 4 threads. The forward: its softmax in registers
    /// (two keys a lane only with the query rows in registers); dq: q and d_out rows in
    /// registers, one key a lane; dk/dv, the other way round: k and v rows in registers,
    /// one query row a lane (BQ == DP / 4), (BK / 4) * DP / 4 threads.
    pub(crate) fn fits_subgroups(&self, min: u32, max: u32) -> bool {
        let lanes = self.dp / 4;
        let wg = self.owned() / 4 * lanes;
        let shape = match self.kind {
            AttnKind::Fwd => {
                matches!(self.kpl, 1 | 2)
                    && (self.kpl == 1 || self.qreg)
                    && self.bk == self.kpl * lanes
            }
            AttnKind::Dq => self.kpl == 1 && self.qreg && self.bk == lanes,
            AttnKind::Dkdv => self.kpl == 1 && self.qreg && self.bq == lanes,
        };
        shape
            && wg <= 256
            && min >= lanes
            && max <= wg
            && max.is_power_of_two()
            && min.is_power_of_two()
    }

    /// The subgroup kernels' tiles for this head dim: DP / 4 keys (query rows for dk/dv), one
    /// a lane of a row group, the owned side unchanged; `qreg` as [`Self::qreg`].
    fn with_subgroup_tiles(&self, qreg: bool) -> Self {
        let (bq, bk) = match self.kind {
            AttnKind::Dkdv => (self.dp / 4, self.bk),
            _ => (self.bq, self.dp / 4),
        };
        AttnCfg {
            bq,
            bk,
            sg: true,
            qreg,
            kpl: 1,
            ..*self
        }
    }

    /// The tile side a thread block owns rows (keys for dk/dv) of.
    fn owned(&self) -> u32 {
        match self.kind {
            AttnKind::Dkdv => self.bk,
            _ => self.bq,
        }
    }

    /// The subgroup forward on key tiles twice as wide (two keys a lane, BK = DP / 2): half
    /// the tiles, hence the barriers and staging rounds, per key. Its K and V tiles leave room
    /// for no query tile, so the query rows are in registers.
    fn with_wide_tiles(&self) -> Self {
        AttnCfg {
            bk: self.dp / 2,
            sg: true,
            qreg: true,
            kpl: 2,
            ..*self
        }
    }

    /// The tensor-core forward (attention_fwd_coop.wgsl) in place of `self`, a forward at
    /// DP 128 read as vec4: 128 x 32 tiles on 8 subgroups of 32 lanes (256 threads), each
    /// owning 16 query rows. `None` for any other kernel or head-dim class.
    pub(crate) fn coop_forward(&self) -> Option<Self> {
        (self.kind == AttnKind::Fwd && self.dp == 128 && self.vec4).then_some(AttnCfg {
            bq: 128,
            bk: 32,
            sg: false,
            qreg: false,
            kpl: 1,
            coop: true,
            ..*self
        })
    }

    /// The workgroup memory the tensor-core forward needs, with the margin every attention
    /// module keeps: what an adapter must offer for [`crate::WgpuOptions::attn_coop`].
    pub(crate) fn coop_forward_bytes() -> u32 {
        let f32_forward = AttnCfg {
            kind: AttnKind::Fwd,
            dp: 128,
            bq: 32,
            bk: 64,
            vec4: true,
            sg: false,
            qreg: false,
            kpl: 1,
            coop: false,
        };
        f32_forward
            .coop_forward()
            .map_or(u32::MAX, |c| c.bytes() + MARGIN)
    }

    /// The forward's entry point.
    pub(crate) fn fwd_entry(&self) -> &'static str {
        if self.coop {
            "attn_fwd_coop"
        } else if self.sg {
            "attn_fwd_sg"
        } else {
            "attn_fwd"
        }
    }

    /// The dq kernel's entry point.
    pub(super) fn dq_entry(&self) -> &'static str {
        if self.sg { "attn_dq_sg" } else { "attn_dq" }
    }

    /// The dk/dv kernel's entry point.
    pub(super) fn dkdv_entry(&self) -> &'static str {
        if self.sg { "attn_dkdv_sg" } else { "attn_dkdv" }
    }

    pub(crate) fn threads(&self) -> u32 {
        if self.coop {
            return 256;
        }
        if self.sg {
            return self.owned() / 4 * (self.dp / 4);
        }
        match self.kind {
            AttnKind::Fwd | AttnKind::Dq => self.bq * self.dp / 32,
            AttnKind::Dkdv => self.bk * self.dp / 32,
        }
    }

    /// The workgroup memory the module declares (attention.wgsl, attention_bwd.wgsl for the
    /// backward, and the kernel's file).
    pub(crate) fn bytes(&self) -> u32 {
        let (bq, bk) = (self.bq, self.bk);
        if self.coop {
            // attention_fwd_coop.wgsl: the f16 K and V tiles (rows of DP + 8 halves), each
            // subgroup's two 16 x 16 f32 scratch blocks and 16 x (BK + 8) f16 probabilities, the vote
            // (atomic and plain), the unused one-vec4 `buf`; attention.wgsl's row intervals,
            // bounds and flags.
            let nsg = self.threads() / 32;
            let tiles = 2 * (2 * bk * (self.dp + 8));
            let own = tiles + nsg * 2 * 256 * 4 + nsg * 16 * (bk + 8) * 2 + 16 + 16 + 16;
            return own + 16 * bq + 16 + 16;
        }
        let qs = self.dp / 4 + 1;
        let common = 16 * bq + 16 + 16;
        let vec4s = match self.kind {
            AttnKind::Fwd => (self.staged_q_rows() + bk) * qs + bk * (bq / 4 + 1) + bq / 4,
            AttnKind::Dq => (bq + bk) * qs + bk * (bq / 4 + 1),
            AttnKind::Dkdv => (bk + bq) * qs + 2 * bq * (bk / 4 + 1),
        };
        let words = match self.kind {
            AttnKind::Fwd => 2 * self.threads(),
            AttnKind::Dq | AttnKind::Dkdv => 2 * bq,
        };
        common + 16 * vec4s + 4 * words
    }

    /// The query rows the forward stages in workgroup memory: none where the subgroup
    /// forward holds them in registers (`qreg`).
    fn staged_q_rows(&self) -> u32 {
        if self.qreg { 0 } else { self.bq }
    }

    /// The constants in front of the module. `ABLATE` is a measurement switch
    /// (`DFLASH_WGPU_ATTN_ABLATE`, default 0): the forward skips the phases its bits name
    /// (1: the score products, 2: the exponentials, 4: the P V accumulation, 8: staging K
    /// and V), so that timing each variant tells what each phase costs. Its results are
    /// then wrong: never set it outside a measurement. The f32 forwards honour it; the
    /// tensor-core forward ignores it.
    pub(crate) fn header(&self) -> String {
        format!(
            "const DP: u32 = {}u;\nconst BQ: u32 = {}u;\nconst BK: u32 = {}u;\nconst WG: u32 = {}u;\n\
             const QROWS: u32 = {}u;\nconst QREG: bool = {};\nconst KPL: u32 = {}u;\n\
             const ABLATE: u32 = {}u;\n",
            self.dp,
            self.bq,
            self.bk,
            self.threads(),
            self.staged_q_rows(),
            self.qreg,
            self.kpl,
            ablate()
        )
    }

    /// The bindings of the row-major (rows, D) inputs, put before attention.wgsl: q, k, v at
    /// 1-3 and the backward's d_out at 5, each with its reader `NAME_row4(at, c4)` (elements
    /// 4 c4 .. 4 c4 + 3 of the row starting at element `at`, zero past D).
    pub(crate) fn operands(&self) -> String {
        let mut s = String::new();
        for (name, binding) in [("q", 1), ("k", 2), ("v", 3)] {
            s += &row_operand(name, binding, self.vec4);
        }
        if self.kind != AttnKind::Fwd {
            s += &row_operand("d_out", 5, self.vec4);
        }
        s
    }

    /// The kernel's file (the backward kernels' after their shared attention_bwd.wgsl, the
    /// subgroup forward after the plain one, whose helpers it shares).
    pub(crate) fn body(&self) -> &'static str {
        if self.coop {
            return include_str!("../shaders/attention_fwd_coop.wgsl");
        }
        match self.kind {
            AttnKind::Fwd if self.sg => concat!(
                include_str!("../shaders/attention_fwd.wgsl"),
                include_str!("../shaders/attention_regs.wgsl"),
                include_str!("../shaders/attention_fwd_sg.wgsl")
            ),
            AttnKind::Fwd => include_str!("../shaders/attention_fwd.wgsl"),
            AttnKind::Dq if self.sg => concat!(
                include_str!("../shaders/attention_bwd.wgsl"),
                include_str!("../shaders/attention_dq.wgsl"),
                include_str!("../shaders/attention_regs.wgsl"),
                include_str!("../shaders/attention_dq_sg.wgsl")
            ),
            AttnKind::Dq => concat!(
                include_str!("../shaders/attention_bwd.wgsl"),
                include_str!("../shaders/attention_dq.wgsl")
            ),
            AttnKind::Dkdv if self.sg => concat!(
                include_str!("../shaders/attention_bwd.wgsl"),
                include_str!("../shaders/attention_dkdv.wgsl"),
                include_str!("../shaders/attention_regs.wgsl"),
                include_str!("../shaders/attention_dkdv_sg.wgsl")
            ),
            AttnKind::Dkdv => concat!(
                include_str!("../shaders/attention_bwd.wgsl"),
                include_str!("../shaders/attention_dkdv.wgsl")
            ),
        }
    }

    pub(crate) fn label(&self) -> String {
        if self.coop {
            return format!(
                "attention_fwd_coop.wgsl (DP {}, {} x {} tiles, f16 products on cooperative \
                 matrices)",
                self.dp, self.bq, self.bk
            );
        }
        let file = match self.kind {
            AttnKind::Fwd if self.sg => "attention_fwd_sg.wgsl",
            AttnKind::Fwd => "attention_fwd.wgsl",
            AttnKind::Dq if self.sg => "attention_dq_sg.wgsl",
            AttnKind::Dq => "attention_dq.wgsl",
            AttnKind::Dkdv if self.sg => "attention_dkdv_sg.wgsl",
            AttnKind::Dkdv => "attention_dkdv.wgsl",
        };
        let loads = if self.vec4 { "vec4" } else { "f32" };
        let q = match (self.qreg, self.kind) {
            (true, AttnKind::Dq) => ", q and d_out in registers",
            (true, AttnKind::Dkdv) => ", k and v in registers",
            (true, _) => ", q in registers",
            (false, _) => "",
        };
        let q = if self.kpl > 1 {
            format!("{q}, {} keys a lane", self.kpl)
        } else {
            q.into()
        };
        format!(
            "{file} (DP {}, {} x {} tiles, {loads} q/k/v{q})",
            self.dp, self.bq, self.bk
        )
    }

    pub(super) fn kernel(&self, entry: &'static str) -> Kernel<'static> {
        Kernel::new(Family::Attention(*self), entry)
    }

    /// `(BQ, BK)` as the host's tile lists take them.
    pub(super) fn tiles(&self) -> (usize, usize) {
        (self.bq as usize, self.bk as usize)
    }
}

/// The binding of a row-major (rows, D) input `name` and its reader `NAME_row4`. With `vec4`
/// (D % 4 == 0: every row starts on a vec4) the binding is vec4 and a read one 16-byte load;
/// otherwise f32 and four loads.
fn row_operand(name: &str, binding: u32, vec4: bool) -> String {
    if vec4 {
        format!(
            "@group(0) @binding({binding}) var<storage, read> {name}: array<vec4<f32>>;\n\
             fn {name}_row4(at: u32, c4: u32) -> vec4<f32> {{\n\
             \x20   if (4u * c4 >= p.d) {{ return vec4<f32>(0.0); }}\n\
             \x20   return {name}[at / 4u + c4];\n}}\n"
        )
    } else {
        format!(
            "@group(0) @binding({binding}) var<storage, read> {name}: array<f32>;\n\
             fn {name}_row4(at: u32, c4: u32) -> vec4<f32> {{\n\
             \x20   var x = vec4<f32>(0.0);\n\
             \x20   for (var e = 0u; e < 4u; e = e + 1u) {{\n\
             \x20       if (4u * c4 + e < p.d) {{ x[e] = {name}[at + 4u * c4 + e]; }}\n\
             \x20   }}\n\
             \x20   return x;\n}}\n"
        )
    }
}

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
    /// [`crate::WgpuOptions::attn_coop`], where it exists for the head dim, `have` bytes of
    /// workgroup memory hold it and the call runs in one pass (the kernel carries no state
    /// between passes: GPUs run one unless `attn_pass_tiles` splits them). Elsewhere the f32
    /// forward runs, as documented on the option.
    fn on_coop(&self, cfg: AttnCfg, have: u32) -> AttnCfg {
        if !self.opts.attn_coop || self.per_pass(&cfg) != usize::MAX {
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
fn pass_words(per: usize, len: usize) -> Vec<[u32; 3]> {
    let per = per.clamp(1, len.max(1));
    let n = len.div_ceil(per).max(1);
    (0..n)
        .map(|i| {
            let flags = if i == 0 { FIRST } else { 0 } | if i + 1 == n { LAST } else { 0 };
            [(i * per) as u32, per as u32, flags]
        })
        .collect()
}

/// `DFLASH_WGPU_ATTN_ABLATE` (see [`AttnCfg::header`]), read once.
fn ablate() -> u32 {
    static ABLATE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ABLATE.get_or_init(|| {
        std::env::var("DFLASH_WGPU_ATTN_ABLATE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

#[cfg(test)]
mod tests;

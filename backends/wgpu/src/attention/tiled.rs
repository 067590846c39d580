//! `wgpu-tiled`: the block-sparse WGSL attention kernels (`shaders/attention*.wgsl`). The
//! host part: one generated module per kernel, head-dim class and tile configuration
//! ([`AttnCfg`], sized for workgroup memory by [`AttnCfg::choose`]). Which configuration a
//! call runs, its uniform parameters and passes are `plan.rs`'s; a mask's tile lists are
//! `lists.rs`'s. The forward and the three backward kernels (`dsum`, `dq`, `dk/dv`;
//! atomics-free and deterministic) are dispatched by `run.rs`.

use crate::pipelines::{Family, Kernel};

/// The largest head dim.
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// Bytes kept free under the adapter's workgroup-storage limit (alignment a driver may add).
pub(super) const MARGIN: u32 = 256;

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
    pub(super) fn with_subgroup_tiles(&self, qreg: bool) -> Self {
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
    pub(super) fn with_wide_tiles(&self) -> Self {
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
    pub(super) fn fwd_entry(&self) -> &'static str {
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
            // subgroup's two 16 x 16 f32 scratch blocks and 16 x (BK + 8) f16 probabilities,
            // the vote (atomic and plain), the unused one-vec4 `buf`; attention.wgsl's row
            // intervals, bounds and flags.
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

//! Matrix products (`shaders/gemm.wgsl`): 128 x 128 workgroup tiles, or another kernel chosen
//! by [`crate::WgpuOptions::gemm`] ([`GemmKernel`]: 64 x 64 tiles, double-buffered in
//! `shaders/gemm_db.wgsl`, 128 threads of 8 x 16 outputs in `shaders/gemm_wide.wgsl`, 128 x 64
//! tiles on 128 threads in `shaders/gemm_narrow.wgsl`, tensor cores through cooperative
//! matrices in `shaders/gemm_coop.wgsl`), f32 accumulation and f32 output, every
//! transpose combination read in place (no transposed copies), each operand f32 or f16 (the
//! compute format of frozen weights and features, widened on load: one pipeline per dtype
//! pair).
//!
//! A product whose operands exceed one storage binding is split ([`plan`]): each operand is
//! bound as the span of its *stored* rows that a sub-product needs, so splitting `M` shrinks
//! `a` (not transposed) and `c`, splitting `N` shrinks `b` (transposed), and splitting `K`
//! shrinks `a` (transposed) and `b` (not transposed); chunks of `K` after the first
//! accumulate with `beta = 1`.

use dflash_core::ops::gemm::{matmul_acc_dims, matmul_dims};
use dflash_core::{GemmOps, Result, Tensor, Transpose};

use crate::WgpuBackend;
use crate::pipelines::{Family, Kernel};
use crate::storage::{DType, WgpuStorage, storage_any, storage_mut};

/// The chunk granularity of [`plan`]: a multiple of every kernel's tile rows and columns (a
/// chunk boundary is a tile boundary).
const TILE: usize = 128;

mod workgroup;
pub(crate) use workgroup::COOP_WORKGROUP_BYTES;
#[cfg(test)]
pub(crate) use workgroup::DB_WORKGROUP_BYTES;

/// Which GEMM kernel runs ([`crate::WgpuOptions::gemm`]; `DFLASH_WGPU_GEMM=<entry point>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum GemmKernel {
    /// `matmul`: 64 x 64 tiles, 256 threads of 4 x 4 outputs. Ships next to `matmul128` so
    /// each is tested; the small tile wastes less on products with few rows or columns.
    Small,
    /// `matmul128`: 128 x 128 tiles, 256 threads of 8 x 8 outputs, the next k-step's elements
    /// prefetched into registers. The shipped kernel.
    #[default]
    Large,
    /// `matmul128_db` (gemm_db.wgsl): `matmul128` with two buffers of workgroup tiles, so one
    /// barrier a k-step instead of two, and each row of k's workgroup loads issued before the
    /// previous row's FMAs. Off by default, until timed against `matmul128`; where the
    /// adapter's workgroup storage cannot hold its 32 KiB, `matmul128` runs instead
    /// ([`WgpuBackend::gemm_kernel`]).
    DoubleBuffered,
    /// `matmul128_w` (gemm_wide.wgsl): the 128 x 128 tile on 128 threads, each 8 x 16 outputs
    /// in 32 vec4 registers, 6 workgroup loads per 128 FMAs instead of `matmul128`'s 8, and
    /// fewer threads for a driver's register allocator to fit (NVIDIA's Vulkan compiler gives
    /// `matmul128` 127 registers, two workgroups a multiprocessor; NVRTC gives this algorithm's
    /// CUDA twin 255 and spills 56 bytes, lab/wgpu/gemm_twin.py, so expect it to lose). The
    /// same workgroup tiles and grid as `matmul128`. Off by default, until timed.
    Wide,
    /// `matmul128_n` (gemm_narrow.wgsl): `matmul128`'s per-thread work (8 x 8 outputs, 4
    /// workgroup loads per 64 FMAs, the next k-step prefetched) on 128 threads, so a 128 x 64
    /// tile of c: a test of whether NVIDIA's Vulkan compiler, which seems to cap registers by
    /// workgroup size, gives it the ~171 registers NVRTC gives `matmul128`'s CUDA twin (its
    /// 128-thread attention kernels get 156-254). a is read from global memory twice as often
    /// per output as in `matmul128`. Untimed, off by default.
    Narrow,
    /// `matmul_coop` (gemm_coop.wgsl): tensor cores through cooperative matrices
    /// (`EXPERIMENTAL_COOPERATIVE_MATRIX`, 16 x 16 x 16 f16 products with f32 accumulation): a
    /// 128 x 128 tile of c a workgroup, 8 subgroups of 32 lanes each 32 x 64 of it. **Operands
    /// are rounded to f16** on their way into workgroup memory: f16 operands are exact, f32
    /// ones lose 13 mantissa bits (relative error up to 2^-11) and do not survive past f16's
    /// range (|x| >= 65520 becomes infinite on round-to-nearest hardware; WGSL leaves it
    /// undefined), so this is a precision mode like the CUDA backend's bf16 GEMMs, not a
    /// faster `matmul128`. Off by default, untimed. Only where the adapter offers a 16 x 16 x 16
    /// f16 x f16 -> f32 subgroup configuration, subgroups of exactly 32 lanes, `SHADER_F16`,
    /// `SUBGROUP` and 20 KiB of workgroup memory: the backend opens its device with the
    /// experimental feature for it (a device of its own on the adapter, so its tensors are not
    /// those of instances running other kernels) and refuses to start elsewhere
    /// ([`crate::device::cooperative_matrix_support`]), never running another kernel under this
    /// name.
    Coop,
}

impl GemmKernel {
    /// Every kernel.
    pub const ALL: [GemmKernel; 6] = [
        GemmKernel::Small,
        GemmKernel::Large,
        GemmKernel::DoubleBuffered,
        GemmKernel::Wide,
        GemmKernel::Narrow,
        GemmKernel::Coop,
    ];

    /// The kernel's entry point in the GEMM module (and `DFLASH_WGPU_GEMM`'s value for it).
    pub fn entry(self) -> &'static str {
        self.entry_and_tile().0
    }

    /// The kernel whose entry point is `name`.
    pub fn from_entry(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.entry() == name)
    }

    /// The entry point and the rows and columns of the tile of c each workgroup computes (the
    /// `tm`, `tn` its shader passes to `tile_origin`).
    fn entry_and_tile(self) -> (&'static str, usize, usize) {
        match self {
            GemmKernel::Small => ("matmul", 64, 64),
            GemmKernel::Large => ("matmul128", 128, 128),
            GemmKernel::DoubleBuffered => ("matmul128_db", 128, 128),
            GemmKernel::Wide => ("matmul128_w", 128, 128),
            GemmKernel::Narrow => ("matmul128_n", 128, 64),
            GemmKernel::Coop => ("matmul_coop", 128, 128),
        }
    }
}

/// The GEMM pipeline of `kernel` for operands of dtypes `a` and `b`, and its tile's rows and
/// columns.
fn matmul_kernel(a: DType, b: DType, kernel: GemmKernel) -> (Kernel<'static>, usize, usize) {
    let family = Family::Gemm {
        a16: a == DType::F16,
        b16: b == DType::F16,
        coop: kernel == GemmKernel::Coop,
    };
    let (entry, tm, tn) = kernel.entry_and_tile();
    (Kernel::new(family, entry), tm, tn)
}

/// One operand: its stored matrix is `(rows, cols)` row-major.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operand<'a> {
    pub s: &'a WgpuStorage,
    /// Element offset of the stored matrix inside `s`.
    pub at: usize,
    /// Row stride of the stored matrix (its column count).
    pub ld: usize,
    pub t: Transpose,
}

/// A sub-product: rows `[m0, m0 + m)`, columns `[n0, n0 + n)`, inner `[k0, k0 + k)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub m0: usize,
    pub m: usize,
    pub n0: usize,
    pub n: usize,
    pub k0: usize,
    pub k: usize,
}

/// Chunk sizes `(mc, nc, kc)` such that each operand's span of stored rows fits its limit
/// (`(a, b, c)`, in elements: an f16 operand's is twice an f32 one's), or `None` when even
/// one stored row does not.
pub(crate) fn plan(
    (m, n, k): (usize, usize, usize),
    (ta, tb): (Transpose, Transpose),
    (limit_a, limit_b, limit_c): (usize, usize, usize),
) -> Option<(usize, usize, usize)> {
    let (mut mc, mut nc, mut kc) = (m.max(1), n.max(1), k.max(1));
    loop {
        // (span, which dimension shrinks it, its limit)
        let spans = [
            match ta {
                Transpose::No => (mc * k, 0, limit_a),
                Transpose::Yes => (kc * m, 2, limit_a),
            },
            match tb {
                Transpose::No => (kc * n, 2, limit_b),
                Transpose::Yes => (nc * k, 1, limit_b),
            },
            (mc * n, 0, limit_c),
        ];
        let Some(&(_, dim, _)) = spans
            .iter()
            .filter(|(s, _, limit)| s > limit)
            .max_by_key(|(s, _, _)| *s)
        else {
            return Some((mc, nc, kc));
        };
        let d = match dim {
            0 => &mut mc,
            1 => &mut nc,
            _ => &mut kc,
        };
        if *d == 1 {
            return None;
        }
        // Halve, keeping whole tiles where the dimension is larger than one.
        *d = if *d > 2 * TILE {
            (*d / 2).next_multiple_of(TILE).min(*d - 1)
        } else {
            *d / 2
        };
    }
}

/// The `(rows, cols)` of the stored matrix of an operand that enters the product as `(r, c)`.
fn stored_extent(t: Transpose, r: usize, c: usize) -> (usize, usize) {
    match t {
        Transpose::No => (r, c),
        Transpose::Yes => (c, r),
    }
}

/// Every block of the plan, in order (`k` innermost, so a block's first `k` chunk comes first).
pub(crate) fn blocks(
    (m, n, k): (usize, usize, usize),
    (mc, nc, kc): (usize, usize, usize),
) -> Vec<Block> {
    let mut out = Vec::new();
    for m0 in (0..m).step_by(mc) {
        for n0 in (0..n).step_by(nc) {
            let ks: Vec<usize> = if k == 0 {
                vec![0]
            } else {
                (0..k).step_by(kc).collect()
            };
            for k0 in ks {
                out.push(Block {
                    m0,
                    m: mc.min(m - m0),
                    n0,
                    n: nc.min(n - n0),
                    k0,
                    k: kc.min(k.saturating_sub(k0)),
                });
            }
        }
    }
    out
}

/// One checked product as its blocks dispatch it: the operands, the output, and the kernel.
struct Product<'a> {
    a: Operand<'a>,
    b: Operand<'a>,
    /// The output: the row-major `(M, N)` matrix, so its row stride `ld` is `N`.
    c: Operand<'a>,
    /// The weight of `c`'s old values in each block's first chunk of `K` (later chunks add
    /// to it: `beta = 1`).
    beta: f32,
    kernel: Kernel<'static>,
    /// The rows and columns of the tile of c each of the kernel's workgroups computes.
    tile: (usize, usize),
}

impl WgpuBackend {
    /// `c (M, N) = beta * c + op(a) @ op(b)` for operands at any offset; `c` is the
    /// row-major `(M, N)` matrix at element `c_at` of `c`. Checks that every operand lies
    /// inside its buffer, splits the product into blocks whose spans fit one binding
    /// ([`plan`]), and records one dispatch a block ([`Self::dispatch_block`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &self,
        op: &'static str,
        a: Operand<'_>,
        b: Operand<'_>,
        c: &WgpuStorage,
        c_at: usize,
        (m, n, k): (usize, usize, usize),
        beta: f32,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            // An empty sum: c = beta * c (never reading c when beta is 0).
            return if beta == 0.0 {
                self.fill(op, c, c_at, m * n, 0.0)
            } else {
                self.scale_range(op, c, c_at, m * n, beta)
            };
        }
        // The GEMM's module carries no bounds checks (`Family::bounds_proven_on_host`): these
        // checks are what keeps every read and write of its kernels inside the buffers.
        let (a_rows, a_cols) = stored_extent(a.t, m, k);
        let (b_rows, b_cols) = stored_extent(b.t, k, n);
        self.check_extent(op, "a", a, a_rows, a_cols)?;
        self.check_extent(op, "b", b, b_rows, b_cols)?;
        let c_out = Operand {
            s: c,
            at: c_at,
            ld: n,
            t: Transpose::No,
        };
        self.check_extent(op, "c", c_out, m, n)?;
        let limits = (
            self.span_elems_of(a.s.dtype),
            self.span_elems_of(b.s.dtype),
            self.span_elems(),
        );
        let (kernel, tm, tn) = matmul_kernel(a.s.dtype, b.s.dtype, self.gemm_variant());
        let chunks = plan((m, n, k), (a.t, b.t), limits).ok_or_else(|| {
            self.err(
                op,
                format!("a ({m}, {k}, {n}) product has a row longer than one storage binding"),
            )
        })?;
        let product = Product {
            a,
            b,
            c: c_out,
            beta,
            kernel,
            tile: (tm, tn),
        };
        for blk in blocks((m, n, k), chunks) {
            self.dispatch_block(op, &product, blk)?;
        }
        Ok(())
    }

    /// Records the dispatch of one block of `p`: each operand bound as the span of its stored
    /// rows the block reads or writes, the block's origin inside each span and its `beta` (1
    /// after the block's first chunk of `K`) as the parameter words, and under
    /// `DFLASH_WGPU_PROFILE` a label naming its shape, transposes and dtypes.
    fn dispatch_block(&self, op: &'static str, p: &Product<'_>, blk: Block) -> Result<()> {
        let (a, b, c) = (p.a, p.b, p.c);
        let first_k = blk.k0 == 0;
        // a: stored rows m (not transposed) or k (transposed); the block's origin inside.
        let (ar0, arows, acol) = match a.t {
            Transpose::No => (blk.m0, blk.m, blk.k0),
            Transpose::Yes => (blk.k0, blk.k, blk.m0),
        };
        let (br0, brows, bcol) = match b.t {
            Transpose::No => (blk.k0, blk.k, blk.n0),
            Transpose::Yes => (blk.n0, blk.n, blk.k0),
        };
        let (ab, ash) = self.span(a.s, a.at + ar0 * a.ld, arows.max(1) * a.ld);
        let (bb, bsh) = self.span(b.s, b.at + br0 * b.ld, brows.max(1) * b.ld);
        let (cb, csh) = self.span(c.s, c.at + blk.m0 * c.ld, blk.m * c.ld);
        let t = |t: Transpose| (t == Transpose::Yes) as u32;
        let params = [
            blk.m as u32,
            blk.n as u32,
            blk.k as u32,
            ash + acol as u32,
            a.ld as u32,
            t(a.t),
            bsh + bcol as u32,
            b.ld as u32,
            t(b.t),
            csh + blk.n0 as u32,
            c.ld as u32,
            if first_k { p.beta } else { 1.0 }.to_bits(),
        ];
        let (tm, tn) = p.tile;
        let groups = (blk.m.div_ceil(tm) * blk.n.div_ceil(tn)) as u64;
        self.ctx.profile_label(|| {
            let d = |s: &WgpuStorage| if s.dtype == DType::F16 { "16" } else { "32" };
            format!(
                "{} {}x{}x{} t{}{} f{}/{}",
                p.kernel.entry,
                blk.m,
                blk.n,
                blk.k,
                t(a.t),
                t(b.t),
                d(a.s),
                d(b.s)
            )
        });
        self.ctx
            .dispatch(op, &p.kernel, &params, &[ab, bb], &[cb], groups)
    }

    /// The entry point of the GEMM kernel this instance runs ([`GemmKernel::entry`]): what
    /// the options choose where the adapter holds it (see `gemm_variant`), so a test knows
    /// which kernel it covered.
    pub fn gemm_kernel(&self) -> &'static str {
        self.gemm_variant().entry()
    }

    /// The kernel the options choose ([`crate::WgpuOptions::gemm`]) where the adapter's
    /// workgroup storage holds it, else `matmul128`, else the 64 x 64-tile `matmul`
    /// ([`crate::limits::gemm_for`]; said once at start). The cooperative-matrix one runs only
    /// on a device opened for it, which `with_options` gives an instance that chooses it or
    /// refuses to start.
    pub(crate) fn gemm_variant(&self) -> GemmKernel {
        crate::limits::gemm_for(
            self.opts.gemm,
            self.ctx.limits.max_compute_workgroup_storage_size,
        )
    }

    /// That the `(rows, cols)` matrix `o` names lies inside its buffer: rows at least `cols`
    /// long, the last of them ending inside.
    fn check_extent(
        &self,
        op: &'static str,
        which: &str,
        o: Operand<'_>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let end = rows
            .checked_mul(o.ld)
            .and_then(|e| e.checked_add(o.at))
            .filter(|&e| e <= o.s.len);
        if cols > o.ld || end.is_none() {
            return Err(self.err(
                op,
                format!(
                    "{which} ({rows}, {cols}) at element {} with row stride {} does not fit its \
                     buffer of {} elements",
                    o.at, o.ld, o.s.len
                ),
            ));
        }
        Ok(())
    }

    /// The operands of a `matmul` / `matmul_acc` call, checked (either may be f16).
    fn operands<'a>(
        &self,
        op: &'static str,
        a: &'a Tensor,
        ta: Transpose,
        b: &'a Tensor,
        tb: Transpose,
    ) -> Result<(Operand<'a>, Operand<'a>, (usize, usize, usize))> {
        let dims = matmul_dims(a.shape(), ta, b.shape(), tb).map_err(|e| self.shape_err(op, e))?;
        let ld = |t: &Tensor| t.shape().as_matrix().1;
        let oa = Operand {
            s: storage_any(op, &self.ctx, a)?,
            at: 0,
            ld: ld(a),
            t: ta,
        };
        let ob = Operand {
            s: storage_any(op, &self.ctx, b)?,
            at: 0,
            ld: ld(b),
            t: tb,
        };
        Ok((oa, ob, dims))
    }
}

impl GemmOps for WgpuBackend {
    fn matmul(&self, a: &Tensor, ta: Transpose, b: &Tensor, tb: Transpose) -> Result<Tensor> {
        let op = "matmul";
        let (oa, ob, (m, k, n)) = self.operands(op, a, ta, b, tb)?;
        let c = self.out(op, m * n)?;
        self.gemm(op, oa, ob, &c, 0, (m, n, k), 0.0)?;
        Ok(self.tensor(c, [m, n]))
    }

    fn matmul_acc(
        &self,
        c: &mut Tensor,
        a: &Tensor,
        ta: Transpose,
        b: &Tensor,
        tb: Transpose,
        beta: f32,
    ) -> Result<()> {
        let op = "matmul_acc";
        let (oa, ob, (m, k, n)) = self.operands(op, a, ta, b, tb)?;
        matmul_acc_dims(c.shape(), a.shape(), ta, b.shape(), tb)
            .map_err(|e| self.shape_err(op, e))?;
        let cs = storage_mut(op, &self.ctx, c)?;
        self.gemm(op, oa, ob, cs, 0, (m, n, k), beta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WgpuOptions;

    /// The GEMM's module has no bounds checks, so `gemm` itself must refuse operands whose
    /// rows are shorter than the columns read or run past the buffer, naming the operand; a
    /// product that fits still runs.
    #[test]
    fn gemm_refuses_operands_outside_their_buffers() {
        let opts = dflash_core::registry::BackendOptions {
            attention: "wgpu-tiled".into(),
            ..Default::default()
        };
        let be = match WgpuBackend::new(&opts) {
            Ok(be) => be,
            Err(dflash_core::Error::Unavailable { reason, .. }) => {
                eprintln!("skipped: no wgpu adapter ({reason})");
                return;
            }
            Err(e) => panic!("wgpu backend: {e}"),
        };
        let buf = |n| be.out("test", n).expect("alloc");
        let (a, b, c) = (buf(12), buf(12), buf(4));
        let op = |s, at, ld, t| Operand { s, at, ld, t };
        let no = Transpose::No;
        // (2, 4) @ (4, 2): a and b stored (2, 4) and (4, 2), row strides 4 and 2 (b's 12
        // elements leave room for an offset of 4).
        let fits = be.gemm(
            "t",
            op(&a, 0, 4, no),
            op(&b, 4, 2, no),
            &c,
            0,
            (2, 2, 4),
            0.0,
        );
        assert!(fits.is_ok(), "{fits:?}");
        let cases = [
            // a's rows of 3 are shorter than the 4 columns read
            ("a (2, 4)", op(&a, 0, 3, no), op(&b, 0, 2, no), 0),
            // a's second row would end at element 14 of 12
            ("a (2, 4)", op(&a, 6, 4, no), op(&b, 0, 2, no), 0),
            // b transposed: stored (2, 4), its rows start at 10, past the end
            (
                "b (2, 4)",
                op(&a, 0, 4, no),
                op(&b, 10, 4, Transpose::Yes),
                0,
            ),
            // c's 4 elements from element 1
            ("c (2, 2)", op(&a, 0, 4, no), op(&b, 0, 2, no), 1),
        ];
        for (name, oa, ob, c_at) in cases {
            let e = be
                .gemm("t", oa, ob, &c, c_at, (2, 2, 4), 0.0)
                .expect_err(name)
                .to_string();
            assert!(
                e.contains(name) && e.contains("does not fit"),
                "{name}: {e}"
            );
        }
    }

    /// Every kernel's entry point names it back (how `DFLASH_WGPU_GEMM` is read), and its tile's
    /// rows and columns divide the chunk granularity of `plan`, so a chunk starts on a tile.
    #[test]
    fn kernels_round_trip_and_their_tiles_divide_the_chunks() {
        for k in GemmKernel::ALL {
            assert_eq!(GemmKernel::from_entry(k.entry()), Some(k));
            let (_, tm, tn) = k.entry_and_tile();
            assert!(TILE.is_multiple_of(tm) && TILE.is_multiple_of(tn), "{k:?}");
        }
        assert_eq!(GemmKernel::from_entry("matmul128_x"), None);
        assert_eq!(
            GemmKernel::from_entry("matmul_coop"),
            Some(GemmKernel::Coop)
        );
        assert_eq!(GemmKernel::default(), WgpuOptions::shipped().gemm);
    }

    /// Every plan keeps each operand's span within the limit and its blocks tile the product.
    #[test]
    fn plans_fit_the_limit_and_cover_the_product() {
        let (no, yes) = (Transpose::No, Transpose::Yes);
        for &(m, n, k) in &[(1000, 700, 300), (5, 3000, 2), (129, 1, 4000), (64, 64, 64)] {
            for &(ta, tb) in &[(no, no), (no, yes), (yes, no), (yes, yes)] {
                for limit in [1 << 30, 50_000, 9_000, 4_000] {
                    // The same limit for all, and an f16 b (twice the elements per binding).
                    for limits in [(limit, limit, limit), (limit, 2 * limit, limit)] {
                        let Some((mc, nc, kc)) = plan((m, n, k), (ta, tb), limits) else {
                            continue;
                        };
                        let a = if ta == no { mc * k } else { kc * m };
                        let b = if tb == no { kc * n } else { nc * k };
                        assert!(a <= limits.0 && b <= limits.1 && mc * n <= limits.2);
                        let mut covered = 0;
                        for blk in blocks((m, n, k), (mc, nc, kc)) {
                            covered += blk.m * blk.n * blk.k;
                        }
                        assert_eq!(covered, m * n * k, "{m}x{n}x{k} {ta:?} {tb:?} {limits:?}");
                    }
                }
            }
        }
        // A stored row longer than the limit cannot be split.
        assert_eq!(plan((4, 4, 100), (no, no), (50, 50, 50)), None);
    }
}

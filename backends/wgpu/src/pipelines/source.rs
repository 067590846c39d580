//! What each shader module is compiled from: the families of WGSL files, the text a module
//! gets (`enable` directives, the shared prelude, generated operand readers or attention
//! headers, the family's file) and the runtime checks naga adds to it.

/// The shader families, one WGSL file each (`src/shaders/*.wgsl`), each compiled with the
/// shared prelude (`common.wgsl`) in front. The GEMM is one family per operand dtype pair
/// (the operand bindings and readers are put in front of `gemm.wgsl`, and after it, in this
/// order, `gemm_db.wgsl`, its double-buffered variant, `gemm_wide.wgsl`, its 128-thread variant
/// of 8 x 16 outputs a thread, and `gemm_narrow.wgsl`, its 128-thread variant of 128 x 64 tiles,
/// which uses the files before it), and with `coop` its own module of `gemm.wgsl` and
/// `gemm_coop.wgsl` (the tensor-core kernel, behind `enable wgpu_cooperative_matrix;`, which
/// only a device opened with `EXPERIMENTAL_COOPERATIVE_MATRIX` builds, so it stays out of the
/// module every adapter builds); `F16` holds the kernels that read or write f16 buffers
/// and is compiled only on a device with `SHADER_F16` (its `enable f16;` is a compile error
/// elsewhere). wgpu compiles one entry point at a time from a module compacted to what that
/// entry point reaches (naga's `process_overrides`), so a GEMM kernel's workgroup memory is its
/// own tiles, not every kernel's of the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    Memory,
    Gemm {
        a16: bool,
        b16: bool,
        /// The cooperative-matrix module (`gemm_coop.wgsl`) instead of the shared one.
        coop: bool,
    },
    Norm,
    Rope,
    Activation,
    Embedding,
    Optimizer,
    Loss,
    /// One attention kernel's module, generated per head-dim class and tile configuration.
    Attention(crate::attention::AttnCfg),
    F16,
}

/// The row reductions of the families that reduce (norm, loss, memory), in front of their file:
/// through workgroup memory, or on subgroup operations ([`super::Kernel::subgroups`]).
const REDUCE: &str = include_str!("../shaders/reduce.wgsl");
const REDUCE_SUBGROUPS: &str = include_str!("../shaders/reduce_subgroups.wgsl");

/// The builtins the subgroup variant adds to an entry point that reduces (at `/*rd-args*/`)
/// and hands to `rd_init` (at `/*rd-init*/`).
const RD_ARGS: &str = ", @builtin(subgroup_invocation_id) rd_lane_in: u32, \
     @builtin(subgroup_id) rd_sg_in: u32, @builtin(num_subgroups) rd_sgs_in: u32";
const RD_INIT: &str = "rd_init(rd_lane_in, rd_sg_in, rd_sgs_in);";

impl Family {
    /// Whether the host proves every index of the family's kernels in bounds before it
    /// dispatches one, so that its module needs no runtime bounds checks. The GEMM: every
    /// operand read is guarded by `m`, `n` and `k` in the kernel, its workgroup tiles are
    /// indexed by expressions that constants bound (`gemm_db.wgsl`'s `swz`, its buffer
    /// offsets, `gemm_wide.wgsl`'s, `gemm_narrow.wgsl`'s and `gemm_coop.wgsl`'s thread and
    /// subgroup coordinates, each file's proof in its header), and `WgpuBackend::gemm` refuses
    /// an operand whose rows are shorter than the columns it reads or whose rows run past its
    /// buffer (the bounds checks cost the GEMM ~8% on the H200, docs/PERF.md).
    pub(super) fn bounds_proven_on_host(self) -> bool {
        matches!(self, Family::Gemm { .. })
    }

    /// Whether the family's file reduces rows (and so comes in two variants).
    pub(super) fn reduces(self) -> bool {
        matches!(self, Family::Memory | Family::Norm | Family::Loss)
    }

    /// The module's text: `enable` directives, the prelude, the family's file (behind the
    /// reductions of the chosen variant where it reduces).
    pub(super) fn source(self, subgroups: bool) -> String {
        if self.reduces() {
            let body = match self {
                Family::Memory => include_str!("../shaders/memory.wgsl"),
                Family::Norm => include_str!("../shaders/norm.wgsl"),
                _ => include_str!("../shaders/loss.wgsl"),
            };
            return if subgroups {
                let body = body
                    .replace("/*rd-args*/", RD_ARGS)
                    .replace("/*rd-init*/", RD_INIT);
                // No `enable subgroups;`: naga rejects the directive (not implemented yet) and
                // takes the builtins on the device's SUBGROUP feature alone.
                format!("{PRELUDE}\n{REDUCE_SUBGROUPS}\n{body}")
            } else {
                format!("{PRELUDE}\n{REDUCE}\n{body}")
            };
        }
        let body = match self {
            Family::Gemm { a16, b16, coop } => return gemm_source(a16, b16, coop),
            Family::Rope => include_str!("../shaders/rope.wgsl"),
            Family::Activation => include_str!("../shaders/activation.wgsl"),
            Family::Embedding => include_str!("../shaders/embedding.wgsl"),
            Family::Optimizer => include_str!("../shaders/optimizer.wgsl"),
            Family::Attention(cfg) => {
                let enable = if cfg.coop {
                    "enable f16;\nenable wgpu_cooperative_matrix;\n"
                } else {
                    ""
                };
                return format!(
                    "{enable}{}{PRELUDE}\n{}\n{}\n{}",
                    cfg.header(),
                    cfg.operands(),
                    include_str!("../shaders/attention.wgsl"),
                    cfg.body()
                );
            }
            Family::F16 => {
                return format!(
                    "enable f16;\n{PRELUDE}\n{}",
                    include_str!("../shaders/f16.wgsl")
                );
            }
            Family::Memory | Family::Norm | Family::Loss => unreachable!("handled above"),
        };
        format!("{PRELUDE}\n{body}")
    }
    /// The module's name in messages: its file, and the variant where there are several.
    pub(super) fn label(self, subgroups: bool) -> String {
        if subgroups {
            return format!("{} (subgroup reductions)", self.file());
        }
        self.file()
    }

    fn file(self) -> String {
        match self {
            Family::Gemm { a16, b16, coop } => {
                let d = |h| if h { "f16" } else { "f32" };
                let file = if coop { "gemm_coop.wgsl" } else { "gemm.wgsl" };
                format!("{file} (a {}, b {})", d(a16), d(b16))
            }
            Family::Attention(cfg) => cfg.label(),
            _ => format!("{self:?}").to_lowercase() + ".wgsl",
        }
    }
}

/// The text of a GEMM module: `enable` directives, the prelude, the operand bindings and
/// `gemm.wgsl`, then either the kernels every adapter builds (`gemm_db.wgsl`, `gemm_wide.wgsl`,
/// `gemm_narrow.wgsl`) or (`coop`) the cooperative-matrix kernel, whose f16 tiles and
/// `wgpu_cooperative_matrix` directive are its own module's alone (its subgroup builtins need
/// no directive: naga takes them on the device's `SUBGROUP` feature).
fn gemm_source(a16: bool, b16: bool, coop: bool) -> String {
    let operands = format!(
        "{PRELUDE}\n{}{}{}",
        gemm_operand("a", 1, a16),
        gemm_operand("b", 2, b16),
        include_str!("../shaders/gemm.wgsl")
    );
    if coop {
        return format!(
            "enable f16;\nenable wgpu_cooperative_matrix;\n{operands}\n{}",
            include_str!("../shaders/gemm_coop.wgsl")
        );
    }
    let f16 = if a16 || b16 { "enable f16;\n" } else { "" };
    format!(
        "{f16}{operands}\n{}\n{}\n{}",
        include_str!("../shaders/gemm_db.wgsl"),
        include_str!("../shaders/gemm_wide.wgsl"),
        include_str!("../shaders/gemm_narrow.wgsl")
    )
}

/// The GEMM's binding of operand `x` (`ga` / `gb`) and its readers: `Raw_x` is a pair of stored
/// elements as they are stored (`vec2<f16>` or `vec2<f32>`), `raw_x(i)` stored element `i`,
/// `raw_x2(i)` elements `i`, `i + 1` (`i` even) and `widen_x` a pair to f32. An f16 operand is
/// bound as `vec2<f16>` words, so a pair is one 32-bit load. The kernel keeps what it fetches for
/// the next k-step raw and widens it only when it stores it to workgroup memory: a conversion
/// right after the load would wait for the load before the current step's FMAs.
fn gemm_operand(x: &str, binding: u32, f16: bool) -> String {
    if f16 {
        format!(
            "@group(0) @binding({binding}) var<storage, read> g{x}: array<vec2<f16>>;\n\
             alias Raw_{x} = vec2<f16>;\n\
             fn raw_{x}(i: u32) -> f16 {{ return g{x}[i >> 1u][i & 1u]; }}\n\
             fn raw_{x}2(i: u32) -> Raw_{x} {{ return g{x}[i >> 1u]; }}\n\
             fn widen_{x}(r: Raw_{x}) -> vec2<f32> {{ return vec2<f32>(r); }}\n"
        )
    } else {
        format!(
            "@group(0) @binding({binding}) var<storage, read> g{x}: array<f32>;\n\
             alias Raw_{x} = vec2<f32>;\n\
             fn raw_{x}(i: u32) -> f32 {{ return g{x}[i]; }}\n\
             fn raw_{x}2(i: u32) -> Raw_{x} {{ return vec2<f32>(g{x}[i], g{x}[i + 1u]); }}\n\
             fn widen_{x}(r: Raw_{x}) -> vec2<f32> {{ return r; }}\n"
        )
    }
}

const PRELUDE: &str = include_str!("../shaders/common.wgsl");

/// Which of naga's runtime checks a family's module carries. By default bounds checks and
/// integer-division checks, without loop bounding: a counter naga puts on every loop so that a
/// loop the driver could not prove finite still ends, which made the attention kernels 4.3x
/// slower on the H200 (docs/PERF.md) while every loop here ends by construction (bounds from
/// the uniform block or from host-built tile lists). A family whose every index the host
/// proves in bounds before each dispatch ([`Family::bounds_proven_on_host`]) carries no checks,
/// as a CUDA kernel carries none. `DFLASH_WGPU_CHECKS=all` puts every check on every family,
/// loop bounding included (debugging); `none` drops them everywhere (a measurement switch, to
/// see what they cost).
pub(super) fn runtime_checks(family: Family) -> wgpu::ShaderRuntimeChecks {
    static SWITCH: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let switch = SWITCH.get_or_init(|| std::env::var("DFLASH_WGPU_CHECKS").ok());
    match switch.as_deref() {
        Some("all") => wgpu::ShaderRuntimeChecks::checked(),
        Some("none") => wgpu::ShaderRuntimeChecks::unchecked(),
        _ if family.bounds_proven_on_host() => wgpu::ShaderRuntimeChecks::unchecked(),
        _ => wgpu::ShaderRuntimeChecks {
            force_loop_bounding: false,
            ..wgpu::ShaderRuntimeChecks::checked()
        },
    }
}

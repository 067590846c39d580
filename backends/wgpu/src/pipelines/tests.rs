//! Every module the backend can generate parses and validates under naga (the WGSL front end
//! wgpu runs when it makes a pipeline), without an adapter: variants that the CI's lavapipe
//! never builds (the subgroup forward needs 32-lane subgroups, lavapipe has 8; tile sizes of
//! larger workgroup memories) are checked on every commit too.

use super::Family;
use crate::attention::{AttnCfg, AttnKind};

fn validate(family: Family, subgroups: bool) {
    let label = family.label(subgroups);
    let src = family.source(subgroups);
    let module = naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(&src)));
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(&src)));
}

pub(super) fn attention_variants() -> Vec<AttnCfg> {
    let mut out = Vec::new();
    // Every head-dim class, with vec4 and scalar reads (22 and 40 are padded).
    for d in [22, 32, 40, 64, 128, 256] {
        for kind in [AttnKind::Fwd, AttnKind::Dq, AttnKind::Dkdv] {
            for limit in [32 * 1024, 48 * 1024, 64 * 1024] {
                for empty in [false, true] {
                    let c = AttnCfg::choose(kind, d, empty, limit).expect("fits");
                    out.push(c);
                    // The subgroup forward as the memory-chosen tiles give it, and on its
                    // own tiles, with a staged query tile and with query registers.
                    let sg = AttnCfg { bk: c.dp / 4, ..c };
                    for base in [c, sg] {
                        if base.fits_subgroups(base.bk, base.bk) {
                            for qreg in [false, true] {
                                out.push(AttnCfg {
                                    sg: true,
                                    qreg,
                                    ..base
                                });
                            }
                        }
                    }
                    // The backward kernels on subgroups (the rows each owns in registers, one
                    // key or query row a lane: dq's keys, dk/dv's query rows) and the forward
                    // on two keys a lane; `fits_subgroups` keeps each for its own kind.
                    let lanes = c.dp / 4;
                    let (sg, qreg) = (true, true);
                    for cand in [
                        AttnCfg {
                            bk: lanes,
                            sg,
                            qreg,
                            ..c
                        },
                        AttnCfg {
                            bq: lanes,
                            sg,
                            qreg,
                            ..c
                        },
                        AttnCfg {
                            bk: 2 * lanes,
                            sg,
                            qreg,
                            kpl: 2,
                            ..c
                        },
                    ] {
                        if cand.fits_subgroups(lanes, lanes) && !out.contains(&cand) {
                            out.push(cand);
                        }
                    }
                    // The tensor-core forward, where the head dim has it.
                    if let Some(coop) = c.coop_forward()
                        && !out.contains(&coop)
                    {
                        out.push(coop);
                    }
                }
            }
        }
    }
    out
}

/// Every GEMM dtype pair, `(a16, b16)`.
const GEMM_DTYPES: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// Every family, every GEMM dtype pair (the shared module and the cooperative-matrix one),
/// every attention configuration.
fn all_families() -> Vec<Family> {
    let mut families = vec![
        Family::Memory,
        Family::Norm,
        Family::Rope,
        Family::Activation,
        Family::Embedding,
        Family::Optimizer,
        Family::Loss,
        Family::F16,
    ];
    for (a16, b16) in GEMM_DTYPES {
        for coop in [false, true] {
            families.push(Family::Gemm { a16, b16, coop });
        }
    }
    let attention = attention_variants();
    let qreg_dims = |d| attention.iter().any(|c| c.qreg && c.dp == d);
    assert!(qreg_dims(32) && qreg_dims(128) && attention.iter().any(|c| !c.vec4));
    assert!(
        attention.iter().any(|c| c.kpl == 2 && c.dp == 128),
        "no wide-tile variant"
    );
    let dq_sg = |d| {
        attention
            .iter()
            .any(|c| c.sg && c.kind == AttnKind::Dq && c.dp == d)
    };
    assert!(dq_sg(32) && dq_sg(128), "no subgroup dq variant");
    let dkdv_sg = |d| {
        attention
            .iter()
            .any(|c| c.sg && c.kind == AttnKind::Dkdv && c.dp == d)
    };
    assert!(dkdv_sg(32) && dkdv_sg(128), "no subgroup dk/dv variant");
    assert!(
        attention.iter().any(|c| c.coop && c.dp == 128),
        "no tensor-core forward"
    );
    families.extend(attention.into_iter().map(Family::Attention));
    families
}

/// The module variants of `f`: workgroup-memory reductions, and subgroup ones where it reduces.
fn variants(f: Family) -> Vec<bool> {
    if f.reduces() {
        vec![false, true]
    } else {
        vec![false]
    }
}

#[test]
fn every_module_variant_validates() {
    for f in all_families() {
        for subgroups in variants(f) {
            validate(f, subgroups);
        }
    }
}

/// `f`'s module, parsed and validated.
fn parsed(f: Family) -> (naga::Module, naga::valid::ModuleInfo) {
    let src = f.source(false);
    let module = naga::front::wgsl::parse_str(&src).expect("parses");
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .expect("validates");
    (module, info)
}

/// The index of entry point `entry` of `module` and the bytes of the workgroup variables it
/// uses, as the driver allocates them: what wgpu hands the driver is the module compacted to
/// the entry point (every backend of wgpu-hal 30 calls `process_overrides` with it), whose
/// workgroup variables are checked to be exactly those.
fn workgroup_bytes(
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    entry: &str,
) -> (usize, u32) {
    let (i, bytes, kept) = workgroup_bytes_used_and_kept(module, info, entry);
    assert_eq!(
        kept, bytes,
        "{entry}: workgroup bytes after wgpu's compaction"
    );
    (i, bytes)
}

/// The index of `entry`, the bytes of the workgroup variables it uses, and those of the module
/// compacted to it (which keeps the variables of functions it does not call).
fn workgroup_bytes_used_and_kept(
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    entry: &str,
) -> (usize, u32, u32) {
    let i = module
        .entry_points
        .iter()
        .position(|ep| ep.name == entry)
        .unwrap_or_else(|| panic!("no entry point {entry}"));
    let ep = info.get_entry_point(i);
    let bytes: u32 = module
        .global_variables
        .iter()
        .filter(|(h, g)| g.space == naga::AddressSpace::WorkGroup && !ep[*h].is_empty())
        .map(|(_, g)| module.types[g.ty].inner.size(module.to_ctx()))
        .sum();
    let (compact, _) = naga::back::pipeline_constants::process_overrides(
        module,
        info,
        Some((naga::ShaderStage::Compute, entry)),
        &Default::default(),
    )
    .expect("compacts");
    let kept: u32 = compact
        .global_variables
        .iter()
        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
        .map(|(_, g)| compact.types[g.ty].inner.size(compact.to_ctx()))
        .sum();
    (i, bytes, kept)
}

/// Every shared GEMM module holds every kernel `gemm.rs` dispatches from it (`GemmKernel::ALL`
/// but the cooperative-matrix one, which has its own module) at its workgroup size; the
/// 128-thread ones (`matmul128_w`, `matmul128_n`) need no more workgroup memory than
/// `matmul128`, so they run wherever it does (`matmul128_n`: its own a and b tiles, the module's
/// other tiles not counted, as wgpu compiles each entry point from the module compacted to
/// what it reaches); the double-buffered one declares the workgroup memory the host checks
/// against the adapter's limit before it chooses it (`DB_WORKGROUP_BYTES`), no more than 32 KiB
/// (so lavapipe runs it in the conformance suite).
#[test]
fn gemm_modules_hold_every_kernel_and_its_workgroup_bytes() {
    use crate::gemm::{DB_WORKGROUP_BYTES, GemmKernel};
    for (a16, b16) in GEMM_DTYPES {
        let coop = false;
        let (module, info) = parsed(Family::Gemm { a16, b16, coop });
        let mut bytes_of = std::collections::HashMap::new();
        let shared = GemmKernel::ALL
            .into_iter()
            .filter(|&k| k != GemmKernel::Coop);
        for entry in shared.map(GemmKernel::entry) {
            let (i, bytes) = workgroup_bytes(&module, &info, entry);
            if entry == "matmul128_db" {
                assert_eq!(bytes, DB_WORKGROUP_BYTES, "{entry}");
            }
            // What the host fits to the adapter's limit (`limits::gemm_for`).
            let kernel = GemmKernel::from_entry(entry).expect("a GEMM kernel");
            assert_eq!(bytes, kernel.workgroup_bytes(), "{entry}");
            let threads128 = ["matmul128_w", "matmul128_n"].contains(&entry);
            let threads = if threads128 { 128 } else { 256 };
            assert_eq!(
                module.entry_points[i].workgroup_size,
                [threads, 1, 1],
                "{entry}"
            );
            assert!(
                bytes <= 32 * 1024,
                "{entry}: {bytes} bytes of workgroup memory"
            );
            bytes_of.insert(entry, bytes);
        }
        assert_eq!(
            bytes_of["matmul128_w"], bytes_of["matmul128"],
            "matmul128_w"
        );
        assert_eq!(
            bytes_of["matmul128_n"],
            528 * 16 + 272 * 16,
            "matmul128_n's wa and wb_n"
        );
        assert_eq!(bytes_of["matmul128"], 2 * 528 * 16, "matmul128's wa and wb");
    }
}

/// The statements of `block` and of every block nested in it.
fn statements(block: &naga::Block) -> Vec<&naga::Statement> {
    let mut out = Vec::new();
    for s in block.iter() {
        out.push(s);
        match s {
            naga::Statement::Block(b) => out.extend(statements(b)),
            naga::Statement::If { accept, reject, .. } => {
                out.extend(statements(accept));
                out.extend(statements(reject));
            }
            naga::Statement::Loop {
                body, continuing, ..
            } => {
                out.extend(statements(body));
                out.extend(statements(continuing));
            }
            _ => {}
        }
    }
    out
}

/// The cooperative-matrix module of every dtype pair holds `matmul_coop` (besides gemm.wgsl's
/// own kernels, which come with its helpers) on 256 threads with `COOP_WORKGROUP_BYTES` of
/// workgroup memory, and no shared GEMM module mentions it (they
/// build on every adapter). Its cooperative loads are those gemm_coop.wgsl's header states:
/// A and B each row-major (`coopLoadT`) and column-major (`coopLoad`), the accumulators stored
/// row-major (`coopStoreT`): in naga's IR, and in the SPIR-V naga writes from it
/// (`OpCooperativeMatrixLoadKHR` / `StoreKHR` with the layout constants `RowMajorKHR` = 0 and
/// `ColumnMajorKHR` = 1, and 8 `OpCooperativeMatrixMulAddKHR` a k-step).
#[test]
fn gemm_coop_modules_hold_the_tensor_core_kernel() {
    use crate::gemm::{COOP_WORKGROUP_BYTES, GemmKernel};
    use naga::{CooperativeRole as Role, Expression, Statement};
    let entry = GemmKernel::Coop.entry();
    for (a16, b16) in GEMM_DTYPES {
        let shared = Family::Gemm {
            a16,
            b16,
            coop: false,
        };
        let src = shared.source(false);
        assert!(
            !src.contains("cooperative") && !src.contains(entry),
            "{src}"
        );
        let f = Family::Gemm {
            a16,
            b16,
            coop: true,
        };
        let (module, info) = parsed(f);
        let (i, bytes) = workgroup_bytes(&module, &info, entry);
        assert_eq!(bytes, COOP_WORKGROUP_BYTES, "{}", f.label(false));
        assert_eq!(module.entry_points[i].workgroup_size, [256, 1, 1]);
        let mut loads = std::collections::BTreeSet::new();
        let mut stores = Vec::new();
        let bodies = module.functions.iter().map(|(_, f)| f);
        for func in bodies.chain(module.entry_points.iter().map(|e| &e.function)) {
            for (_, e) in func.expressions.iter() {
                if let Expression::CooperativeLoad { role, data, .. } = e {
                    loads.insert((*role == Role::A, data.row_major));
                }
            }
            for s in statements(&func.body) {
                if let Statement::CooperativeStore { data, .. } = s {
                    stores.push(data.row_major);
                }
            }
        }
        let all = [(false, false), (false, true), (true, false), (true, true)];
        assert_eq!(loads, all.into_iter().collect(), "A / B, row-major");
        assert_eq!(stores, [true], "the accumulators' store");
        let (layouts, store_layouts, mul_adds) = spirv_coop_ops(f);
        assert_eq!(layouts, [0, 1].into_iter().collect(), "SPIR-V load layouts");
        assert_eq!(
            store_layouts,
            [0].into_iter().collect(),
            "SPIR-V store layout"
        );
        assert_eq!(mul_adds, 8, "SPIR-V multiply-adds");
    }
}

/// The layouts (constants' values) of the cooperative loads and stores, and the number of
/// multiply-adds, in the SPIR-V of `f`'s `matmul_coop` as the statistics switch writes it.
fn spirv_coop_ops(
    f: Family,
) -> (
    std::collections::BTreeSet<u32>,
    std::collections::BTreeSet<u32>,
    usize,
) {
    use crate::vulkan::stats::{Report, spirv};
    const CONSTANT: u32 = 43;
    const LOAD: u32 = 4457;
    const STORE: u32 = 4458;
    const MUL_ADD: u32 = 4459;
    let (label, source) = (f.label(false), f.source(false));
    let words = spirv(&Report {
        label: &label,
        source: &source,
        entry: "matmul_coop",
        consts: &[],
        checks: wgpu::ShaderRuntimeChecks::unchecked(),
    })
    .expect("SPIR-V");
    // Instructions after the 5-word header: (opcode, operands).
    let mut ops = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let n = (words[at] >> 16) as usize;
        ops.push((words[at] & 0xffff, &words[at + 1..at + n]));
        at += n.max(1);
    }
    let constant = |id: u32| {
        let c = ops.iter().find(|(op, w)| *op == CONSTANT && w[1] == id);
        c.map(|(_, w)| w[2]).expect("a constant layout")
    };
    let of = |opcode: u32, operand: usize| -> std::collections::BTreeSet<u32> {
        let uses = ops.iter().filter(|(op, _)| *op == opcode);
        uses.map(|(_, w)| constant(w[operand])).collect()
    };
    // Load: result type, result, pointer, layout, stride; store: pointer, object, layout, stride.
    let mul_adds = ops.iter().filter(|(op, _)| *op == MUL_ADD).count();
    (of(LOAD, 3), of(STORE, 2), mul_adds)
}

/// `DFLASH_WGPU_PIPELINE_STATS` compiles each pipeline a second time, to SPIR-V through naga
/// (`vulkan::stats`): every entry point of every variant, with and without runtime checks, must
/// get through that writer, so a GPU run reading the driver's statistics does not stop at the
/// first module it meets (lavapipe offers no statistics, so CI sees only this half).
#[test]
fn every_entry_point_compiles_to_spirv_for_the_statistics() {
    use crate::vulkan::stats::{Report, spirv};
    let mut count = 0;
    for f in all_families() {
        for subgroups in variants(f) {
            let (label, source) = (f.label(subgroups), f.source(subgroups));
            let module = naga::front::wgsl::parse_str(&source).expect("parses");
            for ep in &module.entry_points {
                for checks in [
                    wgpu::ShaderRuntimeChecks::checked(),
                    wgpu::ShaderRuntimeChecks::unchecked(),
                ] {
                    let r = Report {
                        label: &label,
                        source: &source,
                        entry: &ep.name,
                        consts: &[],
                        checks,
                    };
                    let words = spirv(&r).unwrap_or_else(|e| panic!("{label} {}: {e}", ep.name));
                    assert_eq!(
                        words.first(),
                        Some(&0x0723_0203),
                        "{label} {}: SPIR-V magic",
                        ep.name
                    );
                    count += 1;
                }
            }
        }
    }
    assert!(count > 100, "only {count} entry points");
}

/// The tensor-core attention forward's module (attention_fwd_coop.wgsl) declares the
/// workgroup memory the host checks against the adapter's limit (`AttnCfg::bytes`, and at
/// start `AttnCfg::coop_forward_bytes`, within the 48 KiB NVIDIA gives a workgroup), runs on
/// its 256 threads, and makes the cooperative operations its header states: Q and P as A
/// row-major, K as B column-major (K^T), V as B row-major, the accumulators loaded back and
/// stored row-major (its scratch); no other attention module mentions them.
#[test]
fn the_coop_attention_module_holds_its_kernel_and_bytes() {
    use naga::{CooperativeRole as Role, Expression, Statement};
    let coop: Vec<AttnCfg> = attention_variants()
        .into_iter()
        .filter(|c| c.coop)
        .collect();
    assert!(!coop.is_empty());
    for cfg in coop {
        let f = Family::Attention(cfg);
        let (module, info) = parsed(f);
        // attention.wgsl's staging tile and flags stay in the compacted module (functions
        // the kernel does not call name them): the host counts them too, an upper bound.
        let (i, used, kept) = workgroup_bytes_used_and_kept(&module, &info, "attn_fwd_coop");
        assert_eq!(kept, cfg.bytes(), "{}", f.label(false));
        assert!(cfg.bytes() < AttnCfg::coop_forward_bytes());
        assert!(AttnCfg::coop_forward_bytes() <= 48 << 10);
        assert!(kept - used <= 16 + 16, "{used} used of {kept}");
        // Every workgroup variable a multiple of 16 bytes, so that each starts 16-byte
        // aligned wherever the driver places it (the cooperative loads' requirement).
        for (_, g) in module.global_variables.iter() {
            if g.space == naga::AddressSpace::WorkGroup {
                let size = module.types[g.ty].inner.size(module.to_ctx());
                assert_eq!(size % 16, 0, "{:?}: {size} bytes", g.name);
            }
        }
        assert_eq!(module.entry_points[i].workgroup_size, [cfg.threads(), 1, 1]);
        let mut loads = std::collections::BTreeSet::new();
        let mut stores = std::collections::BTreeSet::new();
        let bodies = module.functions.iter().map(|(_, f)| f);
        for func in bodies.chain(module.entry_points.iter().map(|e| &e.function)) {
            for (_, e) in func.expressions.iter() {
                if let Expression::CooperativeLoad { role, data, .. } = e {
                    loads.insert((format!("{role:?}"), data.row_major));
                }
            }
            for s in statements(&func.body) {
                if let Statement::CooperativeStore { data, .. } = s {
                    stores.insert(data.row_major);
                }
            }
        }
        let want: std::collections::BTreeSet<(String, bool)> = [
            (Role::A, true),
            (Role::B, false),
            (Role::B, true),
            (Role::C, true),
        ]
        .into_iter()
        .map(|(r, m)| (format!("{r:?}"), m))
        .collect();
        assert_eq!(loads, want, "{}", f.label(false));
        assert_eq!(stores, [true].into_iter().collect());
    }
    for cfg in attention_variants().into_iter().filter(|c| !c.coop) {
        let src = Family::Attention(cfg).source(false);
        assert!(!src.contains("cooperative"), "{}", cfg.label());
    }
}

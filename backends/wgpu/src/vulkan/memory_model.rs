//! Workgroup memory made coherent in SPIR-V that declares the Vulkan memory model.
//!
//! naga 30 declares the Vulkan memory model for a module with cooperative matrices but emits
//! every workgroup load and store as a private access and every barrier without availability
//! and visibility operations (gfx-rs/wgpu#8805). Under that model a barrier then orders
//! nothing between invocations, and the driver's compiler may move a workgroup access across
//! it. The tensor-core attention forward (attention_fwd_coop.wgsl) shares workgroup memory
//! between its lanes and its cooperative loads and stores in both directions, and on the H200
//! its results came out wrong (deterministically: accesses moved, not a timing race).
//!
//! [`coherent_workgroup`] rewrites such a module the way glslang writes `shared` memory under
//! the same model: every load (and cooperative-matrix load) from a Workgroup pointer gets
//! `NonPrivatePointer | MakePointerVisible` at Workgroup scope, every store `NonPrivatePointer
//! | MakePointerAvailable`, and every barrier's semantics `MakeAvailable | MakeVisible`. The
//! module is then handed to the driver as it is (wgpu's SPIR-V passthrough), since wgpu would
//! compile the WGSL again. A module under the GLSL450 model is returned unchanged (workgroup
//! memory is coherent there).

/// SPIR-V opcodes and enumerants used here (the SPIR-V specification's numbers).
mod op {
    pub const MEMORY_MODEL: u32 = 14;
    pub const TYPE_INT: u32 = 21;
    pub const TYPE_POINTER: u32 = 32;
    pub const CONSTANT: u32 = 43;
    pub const FUNCTION_PARAMETER: u32 = 55;
    pub const VARIABLE: u32 = 59;
    pub const LOAD: u32 = 61;
    pub const STORE: u32 = 62;
    pub const ACCESS_CHAIN: u32 = 65;
    pub const IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
    pub const PTR_ACCESS_CHAIN: u32 = 67;
    pub const CONTROL_BARRIER: u32 = 224;
    pub const MEMORY_BARRIER: u32 = 225;
    pub const COOP_LOAD: u32 = 4457;
    pub const COOP_STORE: u32 = 4458;
}

const MEMORY_MODEL_VULKAN: u32 = 3;
const STORAGE_WORKGROUP: u32 = 4;
const SCOPE_WORKGROUP: u32 = 2;
/// Memory operands: `Aligned` takes a literal, the two below a scope id each, in bit order.
const ACCESS_ALIGNED: u32 = 0x2;
const ACCESS_MAKE_AVAILABLE: u32 = 0x8;
const ACCESS_MAKE_VISIBLE: u32 = 0x10;
const ACCESS_NON_PRIVATE: u32 = 0x20;
const SEMANTICS_MAKE_AVAILABLE: u32 = 0x2000;
const SEMANTICS_MAKE_VISIBLE: u32 = 0x4000;

/// What [`coherent_workgroup`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Patched {
    pub loads: usize,
    pub stores: usize,
    pub barriers: usize,
}

/// One instruction: its opcode and operand words (without the leading word).
struct Inst {
    op: u32,
    args: Vec<u32>,
}

fn split(words: &[u32]) -> Result<(Vec<u32>, Vec<Inst>), String> {
    if words.len() < 5 || words[0] != 0x0723_0203 {
        return Err("not a SPIR-V module".into());
    }
    let mut out = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        if count == 0 || at + count > words.len() {
            return Err(format!("instruction at word {at}: bad word count {count}"));
        }
        out.push(Inst {
            op,
            args: words[at + 1..at + count].to_vec(),
        });
        at += count;
    }
    Ok((words[..5].to_vec(), out))
}

/// `words` with its workgroup accesses and barriers coherent (see the module docs), and what
/// changed; unchanged where the module does not declare the Vulkan memory model.
pub(crate) fn coherent_workgroup(words: &[u32]) -> Result<(Vec<u32>, Patched), String> {
    let (mut header, mut insts) = split(words)?;
    let vulkan = insts
        .iter()
        .any(|i| i.op == op::MEMORY_MODEL && i.args.get(1) == Some(&MEMORY_MODEL_VULKAN));
    if !vulkan {
        return Ok((words.to_vec(), Patched::default()));
    }
    // Pointer types' and pointers' storage classes, the 32-bit unsigned type, its constants.
    let mut ptr_type = std::collections::HashMap::new();
    let mut workgroup = std::collections::HashSet::new();
    let mut uint = None;
    let mut consts = std::collections::HashMap::new(); // id -> value (u32 constants)
    for i in &insts {
        match (i.op, i.args.as_slice()) {
            (op::TYPE_INT, [id, 32, 0]) => uint = Some(*id),
            (op::TYPE_POINTER, [id, sc, _]) => {
                ptr_type.insert(*id, *sc);
            }
            (op::CONSTANT, [ty, id, v]) if Some(*ty) == uint => {
                consts.insert(*id, *v);
            }
            (op::VARIABLE, [ty, id, sc, ..])
                if *sc == STORAGE_WORKGROUP && ptr_type.contains_key(ty) =>
            {
                workgroup.insert(*id);
            }
            (
                op::ACCESS_CHAIN
                | op::IN_BOUNDS_ACCESS_CHAIN
                | op::PTR_ACCESS_CHAIN
                | op::FUNCTION_PARAMETER,
                [ty, id, ..],
            ) if ptr_type.get(ty) == Some(&STORAGE_WORKGROUP) => {
                workgroup.insert(*id);
            }
            _ => {}
        }
    }
    let uint = uint.ok_or("no 32-bit unsigned integer type")?;
    // The constants the rewrite needs: the Workgroup scope, and each barrier's semantics with
    // the availability and visibility bits, new ones declared right after the integer type.
    let mut bound = header[3];
    let mut new_consts: Vec<(u32, u32)> = Vec::new();
    let mut constant = |value: u32, consts: &std::collections::HashMap<u32, u32>| -> u32 {
        if let Some((&id, _)) = consts.iter().find(|(_, v)| **v == value) {
            return id;
        }
        if let Some(&(id, _)) = new_consts.iter().find(|(_, v)| *v == value) {
            return id;
        }
        let id = bound;
        bound += 1;
        new_consts.push((id, value));
        id
    };
    let scope = constant(SCOPE_WORKGROUP, &consts);
    let mut patched = Patched::default();
    for i in insts.iter_mut() {
        let (ptr_at, access_at, make) = match i.op {
            op::LOAD => (2, 3, ACCESS_MAKE_VISIBLE),
            op::STORE => (0, 2, ACCESS_MAKE_AVAILABLE),
            // [type, result, pointer, layout, stride]
            op::COOP_LOAD => (2, 5, ACCESS_MAKE_VISIBLE),
            // [pointer, object, layout, stride]
            op::COOP_STORE => (0, 4, ACCESS_MAKE_AVAILABLE),
            op::CONTROL_BARRIER | op::MEMORY_BARRIER => {
                let s = i.args.len() - 1;
                let old = *consts
                    .get(&i.args[s])
                    .ok_or("a barrier whose semantics are not a 32-bit constant")?;
                i.args[s] = constant(
                    old | SEMANTICS_MAKE_AVAILABLE | SEMANTICS_MAKE_VISIBLE,
                    &consts,
                );
                patched.barriers += 1;
                continue;
            }
            _ => continue,
        };
        if !workgroup.contains(&i.args[ptr_at]) {
            continue;
        }
        if matches!(i.op, op::COOP_LOAD | op::COOP_STORE) && i.args.len() < access_at {
            return Err(format!(
                "a cooperative-matrix access without its stride (opcode {})",
                i.op
            ));
        }
        let mut mask = i.args.get(access_at).copied().unwrap_or(0);
        let aligned = (mask & ACCESS_ALIGNED != 0).then(|| i.args[access_at + 1]);
        if mask & !(ACCESS_ALIGNED | 0x1 | 0x4) != 0 {
            return Err(format!("memory operands {mask:#x} already carry scopes"));
        }
        mask |= ACCESS_NON_PRIVATE | make;
        i.args.truncate(access_at);
        i.args.push(mask);
        i.args.extend(aligned);
        i.args.push(scope);
        if make == ACCESS_MAKE_VISIBLE {
            patched.loads += 1;
        } else {
            patched.stores += 1;
        }
    }
    header[3] = bound;
    let mut out = header;
    for i in &insts {
        out.push(((i.args.len() as u32 + 1) << 16) | i.op);
        out.extend(&i.args);
        if i.op == op::TYPE_INT && i.args.first() == Some(&uint) {
            for &(id, v) in &new_consts {
                out.extend([(4 << 16) | op::CONSTANT, uint, id, v]);
            }
        }
    }
    Ok((out, patched))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module under the Vulkan memory model (as naga writes one with cooperative matrices):
    /// workgroup and function-local accesses, a barrier.
    fn spirv_of(src: &str) -> Vec<u32> {
        use naga::back::spv;
        let module = naga::front::wgsl::parse_str(src).unwrap();
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .unwrap();
        let options = spv::Options {
            lang_version: (1, 3),
            ..spv::Options::default()
        };
        spv::write_vec(&module, &info, &options, None).unwrap()
    }

    const COOP: &str = "enable f16;\nenable wgpu_cooperative_matrix;\n\
        var<workgroup> t: array<f16, 512>;\n\
        var<workgroup> s: array<f32, 256>;\n\
        @group(0) @binding(0) var<storage, read_write> o: array<f32>;\n\
        @compute @workgroup_size(32)\n\
        fn main(@builtin(local_invocation_index) lid: u32) {\n\
            t[lid] = f16(lid);\n\
            workgroupBarrier();\n\
            let a = coopLoadT<coop_mat16x16<f16, A>>(&t[0], 16u);\n\
            let b = coopLoad<coop_mat16x16<f16, B>>(&t[256], 16u);\n\
            coopStoreT(coopMultiplyAdd(a, b, coop_mat16x16<f32, C>()), &s[0], 16u);\n\
            workgroupBarrier();\n\
            var x = s[lid];\n\
            o[lid] = x;\n\
        }\n";

    /// Every workgroup access of the module gets its operands, each barrier its bits, the
    /// storage-buffer and function-local accesses none; the result splits into whole
    /// instructions with the new constants declared.
    #[test]
    fn workgroup_accesses_and_barriers_become_coherent() {
        let words = spirv_of(COOP);
        let (out, p) = coherent_workgroup(&words).unwrap();
        // Two barriers of the source, and the one after naga's zero-initialisation.
        assert!(p.barriers >= 2, "{p:?}");
        assert!(p.loads >= 2 && p.stores >= 2, "{p:?}");
        let (_, insts) = split(&out).unwrap();
        let mut non_private = 0;
        for i in &insts {
            let access = match i.op {
                op::LOAD => i.args.get(3),
                op::STORE => i.args.get(2),
                op::COOP_LOAD => i.args.get(5),
                op::COOP_STORE => i.args.get(4),
                _ => continue,
            };
            if access.is_some_and(|m| m & ACCESS_NON_PRIVATE != 0) {
                non_private += 1;
            }
        }
        assert_eq!(non_private, p.loads + p.stores);
        // Patching twice is refused (the operands carry scopes already), never doubled.
        assert!(coherent_workgroup(&out).is_err());
    }

    /// The tensor-core attention forward's SPIR-V, as the backend writes it for the driver,
    /// takes the rewrite: its cooperative loads and stores included, every barrier.
    #[test]
    fn the_coop_attention_forward_becomes_coherent() {
        use crate::attention::{AttnCfg, AttnKind};
        use crate::pipelines::Family;
        let cfg = AttnCfg::choose(AttnKind::Fwd, 128, false, 48 * 1024)
            .unwrap()
            .coop_forward()
            .unwrap();
        let family = Family::Attention(cfg);
        let source = family.source(false);
        let words = crate::vulkan::stats::spirv(&crate::vulkan::stats::Report {
            label: "coop",
            source: &source,
            entry: cfg.fwd_entry(),
            consts: &[],
            checks: wgpu::ShaderRuntimeChecks::default(),
        })
        .unwrap();
        let (out, p) = coherent_workgroup(&words).unwrap();
        assert!(p.barriers >= 8 && p.loads > 10 && p.stores > 10, "{p:?}");
        let (_, insts) = split(&out).unwrap();
        let coop_accesses = insts
            .iter()
            .filter(|i| {
                (i.op == op::COOP_LOAD
                    && i.args.get(5).is_some_and(|m| m & ACCESS_NON_PRIVATE != 0))
                    || (i.op == op::COOP_STORE
                        && i.args.get(4).is_some_and(|m| m & ACCESS_NON_PRIVATE != 0))
            })
            .count();
        let coop_total = insts
            .iter()
            .filter(|i| matches!(i.op, op::COOP_LOAD | op::COOP_STORE))
            .count();
        assert!(coop_total > 0);
        assert_eq!(
            coop_accesses, coop_total,
            "every cooperative access is on workgroup memory"
        );
    }

    /// A module under GLSL450 (no cooperative matrices) comes back as it was.
    #[test]
    fn glsl450_modules_are_unchanged() {
        let src = "var<workgroup> s: array<f32, 64>;\n\
            @group(0) @binding(0) var<storage, read_write> o: array<f32>;\n\
            @compute @workgroup_size(64)\n\
            fn main(@builtin(local_invocation_index) lid: u32) {\n\
                s[lid] = f32(lid);\n\
                workgroupBarrier();\n\
                o[lid] = s[63u - lid];\n\
            }\n";
        let words = spirv_of(src);
        let (out, p) = coherent_workgroup(&words).unwrap();
        assert_eq!(out, words);
        assert_eq!(p, Patched::default());
    }
}

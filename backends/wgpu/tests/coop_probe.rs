//! What the tensor-core attention forward (attention_fwd_coop.wgsl) asks of the driver's
//! cooperative matrices, one pattern at a time, in a 16 x 16 x 16 product C = A B^T on one
//! subgroup: A loaded row-major and B (stored as rows of B^T, as K is) column-major from f16
//! workgroup tiles at the strides the forward uses (A 40 halves, B 136) and at matmul_coop's
//! (24 and 24), with an 8-byte or a 16-byte workgroup variable declared before the tiles (a
//! driver that places variables by alignment may then start an f16 tile off 16 bytes), the
//! accumulator zeroed inside a loop or outside it, and C stored row-major at stride 16 and
//! read back by the lanes. Each pattern is compared with the f64 product of the f16-rounded
//! operands; every result is printed before any assertion, so one run tells which patterns
//! a driver gets wrong. Skips where the adapter has no 16 x 16 f16 cooperative matrices.

use dflash_backend_wgpu::device;
use dflash_tests::ops::Format;
use wgpu::util::DeviceExt;

/// One pattern: A's and B's tile strides (halves), the words of the variable declared before
/// the tiles, and whether the accumulator is zeroed inside a two-trip loop.
#[derive(Debug, Clone, Copy)]
struct Pattern {
    sa: u32,
    sb: u32,
    pad_words: u32,
    zero_in_loop: bool,
}

fn source(p: Pattern) -> String {
    let Pattern {
        sa,
        sb,
        pad_words,
        zero_in_loop,
    } = p;
    let product = if zero_in_loop {
        "var mc = coop_mat16x16<f32, C>();\n    \
         for (var t = 0u; t < 2u; t = t + 1u) {\n        \
         var z = coop_mat16x16<f32, C>();\n        \
         z = coopMultiplyAdd(ma, mb, z);\n        \
         mc = z;\n    }"
    } else {
        "let mc = coopMultiplyAdd(ma, mb, coop_mat16x16<f32, C>());"
    };
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
         var<workgroup> pad: array<u32, {pad_words}>;\n\
         var<workgroup> ta: array<f16, {na}>;\n\
         var<workgroup> tb: array<f16, {nb}>;\n\
         var<workgroup> tc: array<f32, 256>;\n\
         @group(0) @binding(0) var<storage, read> a: array<f32>;\n\
         @group(0) @binding(1) var<storage, read> b: array<f32>;\n\
         @group(0) @binding(2) var<storage, read_write> c: array<f32>;\n\
         @compute @workgroup_size(32)\n\
         fn main(@builtin(local_invocation_index) lid: u32) {{\n    \
         pad[lid % {pad_words}u] = lid;\n    \
         for (var e = lid; e < 256u; e = e + 32u) {{\n        \
         ta[(e / 16u) * {sa}u + e % 16u] = f16(a[e]);\n        \
         tb[(e / 16u) * {sb}u + e % 16u] = f16(b[e]);\n    }}\n    \
         workgroupBarrier();\n    \
         let ma = coopLoadT<coop_mat16x16<f16, A>>(&ta[0], {sa}u);\n    \
         let mb = coopLoad<coop_mat16x16<f16, B>>(&tb[0], {sb}u);\n    \
         {product}\n    \
         coopStoreT(mc, &tc[0], 16u);\n    \
         workgroupBarrier();\n    \
         for (var e = lid; e < 256u; e = e + 32u) {{\n        \
         c[e] = tc[e] + 0.0 * f32(pad[0]);\n    }}\n}}\n",
        na = 16 * sa,
        nb = 16 * sb,
    )
}

/// `x` rounded to f16 and back (nearest even, as the device's conversion).
fn f16_round(x: f32) -> f64 {
    Format::F16.round(x) as f64
}

/// The worst |error| of pattern `p` on `ctx`'s device against the f64 product, relative to
/// sum |a||b| of each element.
fn run(ctx: &device::Ctx, p: Pattern, a: &[f32], b: &[f32]) -> f64 {
    let dev = &ctx.device;
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("coop probe"),
        source: wgpu::ShaderSource::Wgsl(source(p).into()),
    });
    let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("coop probe"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let storage = |data: &[f32]| {
        dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: &data
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        })
    };
    let (ba, bb, bc) = (storage(a), storage(b), storage(&[f32::NAN; 256]));
    let read = dev.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 1024,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: ba.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: bb.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: bc.as_entire_binding(),
            },
        ],
    });
    let mut enc = dev.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    enc.copy_buffer_to_buffer(&bc, 0, &read, 0, 1024);
    ctx.queue.submit([enc.finish()]);
    read.slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    dev.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
    let bytes = read.slice(..).get_mapped_range().expect("mapped").to_vec();
    let got: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let mut worst = 0.0f64;
    for i in 0..16 {
        for n in 0..16 {
            let (mut want, mut scale) = (0.0f64, 0.0f64);
            for k in 0..16 {
                let x = f16_round(a[i * 16 + k]) * f16_round(b[n * 16 + k]);
                want += x;
                scale += x.abs();
            }
            let err = (got[i * 16 + n] as f64 - want).abs() / scale.max(1e-30);
            worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
        }
    }
    worst
}

/// Every pattern in the probe.
fn patterns() -> Vec<Pattern> {
    let mut out = Vec::new();
    for (sa, sb) in [(24, 24), (40, 136), (40, 24), (24, 136)] {
        for pad_words in [2, 4] {
            for zero_in_loop in [false, true] {
                out.push(Pattern {
                    sa,
                    sb,
                    pad_words,
                    zero_in_loop,
                });
            }
        }
    }
    out
}

/// Every probe kernel parses and validates under naga (no adapter needed), so the GPU run
/// never fails on the probe's own text.
#[test]
fn coop_probe_kernels_validate() {
    for p in patterns() {
        let src = source(p);
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{p:?}: {}", e.emit_to_string(&src)));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{p:?}: {}", e.emit_to_string(&src)));
    }
}

#[test]
fn coop_patterns_of_the_attention_forward() {
    dflash_backend_wgpu::link();
    if let Err(why) = device::cooperative_matrix_support(0) {
        eprintln!("coop_patterns_of_the_attention_forward: skipped: {why}");
        return;
    }
    let ctx = device::get(0, true).expect("the cooperative-matrix device");
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut draw = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let a: Vec<f32> = (0..256).map(|_| draw()).collect();
    let b: Vec<f32> = (0..256).map(|_| draw()).collect();
    let mut failed = Vec::new();
    for p in patterns() {
        let worst = run(&ctx, p, &a, &b);
        // f16 products are exact in f32; only the f32 accumulation errs.
        let ok = worst <= 1e-5;
        println!(
            "  {p:?}: worst err/sum|a||b| {worst:.2e} {}",
            if ok { "ok" } else { "WRONG" }
        );
        if !ok {
            failed.push(p);
        }
    }
    assert!(
        failed.is_empty(),
        "patterns the driver gets wrong: {failed:?}"
    );
}

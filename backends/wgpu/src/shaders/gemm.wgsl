// gemm.wgsl: c = beta * c + op(a) @ op(b), f32 storage and f32 accumulation.
//
// One workgroup of 256 threads computes a 64 x 64 tile of c, 4 x 4 elements per thread
// (rows ty + 16 r, columns tx + 16 c: neighbouring threads read neighbouring words of the
// tiles). K advances in steps of 16 through two workgroup-memory tiles, loaded so that
// consecutive threads read consecutive addresses of the stored matrix whichever way it is
// transposed. Operands are given by an element offset and a row stride of their stored
// matrix, so the host can hand any sub-block (a chunk of a large matrix) to one dispatch.
// beta == 0 never reads c (it may hold NaN poison).

struct GemmParams {
    m: u32, n: u32, k: u32,
    a_off: u32, lda: u32, ta: u32,
    b_off: u32, ldb: u32, tb: u32,
    c_off: u32, ldc: u32, beta: f32,
}
@group(0) @binding(0) var<uniform> gp: GemmParams;
@group(0) @binding(1) var<storage, read> ga: array<f32>;
@group(0) @binding(2) var<storage, read> gb: array<f32>;
@group(0) @binding(3) var<storage, read_write> gc: array<f32>;

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;

var<workgroup> tile_a: array<f32, 1024>; // [BK][BM]
var<workgroup> tile_b: array<f32, 1024>; // [BK][BN]

// op(a)[i, p]
fn load_a(i: u32, p: u32) -> f32 {
    if (i >= gp.m || p >= gp.k) {
        return 0.0;
    }
    if (gp.ta == 0u) {
        return ga[gp.a_off + i * gp.lda + p];
    }
    return ga[gp.a_off + p * gp.lda + i];
}

// op(b)[p, j]
fn load_b(p: u32, j: u32) -> f32 {
    if (p >= gp.k || j >= gp.n) {
        return 0.0;
    }
    if (gp.tb == 0u) {
        return gb[gp.b_off + p * gp.ldb + j];
    }
    return gb[gp.b_off + j * gp.ldb + p];
}

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let tiles_n = (gp.n + BN - 1u) / BN;
    let g = wg_linear(wid, nwg);
    if (g >= tiles_n * ((gp.m + BM - 1u) / BM)) {
        return; // the tail of a 2-D grid
    }
    let m0 = (g / tiles_n) * BM;
    let n0 = (g % tiles_n) * BN;
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc: array<array<f32, 4>, 4>;
    for (var r = 0u; r < 4u; r = r + 1u) {
        for (var c = 0u; c < 4u; c = c + 1u) {
            acc[r][c] = 0.0;
        }
    }
    for (var k0 = 0u; k0 < gp.k; k0 = k0 + BK) {
        for (var e = 0u; e < 4u; e = e + 1u) {
            let idx = lid + e * 256u;
            // a: consecutive threads along the stored matrix's contiguous dimension.
            var ii: u32; var ka: u32;
            if (gp.ta == 0u) { ka = idx % BK; ii = idx / BK; } else { ii = idx % BM; ka = idx / BM; }
            tile_a[ka * BM + ii] = load_a(m0 + ii, k0 + ka);
            var jj: u32; var kb: u32;
            if (gp.tb == 0u) { jj = idx % BN; kb = idx / BN; } else { kb = idx % BK; jj = idx / BK; }
            tile_b[kb * BN + jj] = load_b(k0 + kb, n0 + jj);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            var av: array<f32, 4>;
            var bv: array<f32, 4>;
            for (var r = 0u; r < 4u; r = r + 1u) {
                av[r] = tile_a[kk * BM + ty + 16u * r];
                bv[r] = tile_b[kk * BN + tx + 16u * r];
            }
            for (var r = 0u; r < 4u; r = r + 1u) {
                for (var c = 0u; c < 4u; c = c + 1u) {
                    acc[r][c] = fma(av[r], bv[c], acc[r][c]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r = r + 1u) {
        let i = m0 + ty + 16u * r;
        for (var c = 0u; c < 4u; c = c + 1u) {
            let j = n0 + tx + 16u * c;
            if (i < gp.m && j < gp.n) {
                let at = gp.c_off + i * gp.ldc + j;
                if (gp.beta == 0.0) {
                    gc[at] = acc[r][c];
                } else {
                    gc[at] = gp.beta * gc[at] + acc[r][c];
                }
            }
        }
    }
}

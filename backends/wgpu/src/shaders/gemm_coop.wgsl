// gemm_coop.wgsl: matmul_coop, c = beta * c + op(a) @ op(b) on cooperative matrices (tensor
// cores on NVIDIA through VK_KHR_cooperative_matrix, simdgroup matrices on Apple), with
// operands ROUNDED TO F16 on their way into workgroup memory (f16 operands are exact), f32
// accumulation (coop_mat16x16<f32, C>) and f32 output. Behind `WgpuOptions::gemm =
// GemmKernel::Coop` (`DFLASH_WGPU_GEMM=matmul_coop`): untimed, off by default, a precision
// mode like the CUDA backend's bf16 GEMMs (f32 operands lose 13 mantissa bits).
//
// Why: the f32-FMA kernels run ~27 TFLOP/s on the H200 through Vulkan where the CUDA backend's
// tensor-core GEMM runs ~690, and the drafter step on wgpu is ~85% GEMM time.
//
// Its own module (the host puts `enable f16; enable wgpu_cooperative_matrix;`, the prelude, the
// operand bindings and gemm.wgsl in front of this file; gemm.rs's `Family::Gemm { coop: true }`),
// built only on a device opened with EXPERIMENTAL_COOPERATIVE_MATRIX, so the shared GEMM module
// builds on every adapter. It runs on matmul128's grid (one workgroup a 128 x 128 tile of c,
// gemm.wgsl's `tile_origin` written out) and uses gemm.wgsl's `fetch_a128` / `fetch_b128` (a
// thread's 8 elements of a 128 x 16 operand tile, four pairs along the stored matrix's
// contiguous dimension, coalesced, 0 outside the product), `pair_pos` and `store` (bounds, and
// beta: beta == 0 never reads c).
//
// Rounding: an f32 pair becomes f16 through WGSL's conversion (`vec2<f16>(v)`), which WGSL lets
// round an in-range value to either neighbour and leaves undefined past f16's range; NVIDIA's
// conversion rounds to nearest even and overflows to infinity, which the conformance test
// (tests/gemm.rs, against operands rounded to nearest even on the host) checks on the GPU.
//
// Subgroups: the host chooses this kernel only where the adapter's subgroups are exactly 32
// lanes (min == max == 32), so the 256 threads are 8 subgroups; subgroup `sg` (its
// `subgroup_id`, not lid / 32: Vulkan does not promise that mapping) owns rows 32 (sg % 4) ..
// + 32 and columns 64 (sg / 4) .. + 64 of the tile: 2 x 4 accumulators of 16 x 16. Under any
// other subgroup size every index below stays in bounds (`sg` and `lane` are clamped) but the
// result is wrong, which is why the host refuses such an adapter.
//
// Workgroup tiles, f16, each laid out like the operand's stored matrix so that a pair (two
// neighbours along the stored contiguous dimension) lands in two neighbouring halves: stored
// along k (a not transposed, b transposed) the tile is [128 rows][16 k] with a row stride of
// HSK = 24 halves (48 bytes), and the cooperative load reads it row-major for A (coopLoadT) or
// column-major for B (coopLoad); stored along the 128-wide dimension (a transposed, b not
// transposed) it is [16 k][128] with a row stride of HSW = 136 halves (272 bytes), read
// column-major for A (coopLoad) or row-major for B (coopLoadT). The strides are multiples of
// 16 bytes and every load starts at a multiple of 16 rows or columns, so each load's pointer
// and stride meet VK_KHR_cooperative_matrix's 16-byte alignment; the pads put the 8 rows of a
// 16-byte-per-row phase in 8 different 16-byte bank groups (48 and 272 bytes apart). Per k-step
// of 16 a subgroup makes 2 A loads, 4 B loads and 8 coopMultiplyAdd. The next k-step's
// fragments are fetched into registers before the step's multiplies (matmul128's pipelining),
// two barriers a step. Caveat: naga 30 declares the Vulkan memory model for a module with
// cooperative matrices but marks no workgroup access non-private and no barrier with
// availability / visibility (gfx-rs/wgpu#8805, open), so that the barriers publish the tiles is
// what drivers do, not what that model promises: the GPU conformance test checks it.
//
// Epilogue: cooperative matrices have no element access, and tails and beta need it, so each
// subgroup stores each accumulator row-major (coopStoreT) into its own 16 x 16 f32 scratch
// (`hc`, 8 KiB for the 8 subgroups), and its 32 lanes write the valid elements through `store`.
// Workgroup memory: 2 x 6 KiB tiles + 8 KiB scratch = 20 KiB (`COOP_WORKGROUP_BYTES`, checked
// against the adapter's limit before the kernel is chosen).
//
// Every workgroup index is in bounds by construction (the module has no runtime checks, and
// a cooperative load or store reads or writes a 16 x 16 block past its pointer that no check
// of the pointer's index would bound):
// - puts (`tile_at`): pair_pos gives x <= 127 and kk <= 15 with the pair's second element at
//   x + 1 <= 127 (across, x even) or kk + 1 <= 15 (along k, kk even); along k the first half
//   is at x * 24 + kk <= 127 * 24 + 14 = 3062, across at kk * 136 + x <= 15 * 136 + 126 =
//   2166, and the second at the next index: at most 3063 < 3072;
// - cooperative loads (`coop_a`, `coop_b`): rows or columns r0 = 32 (sg % 4) + 16 t <= 112
//   (sg <= 7, t <= 1) or c0 = 64 (sg / 4) + 16 t <= 112 (t <= 3); a 16 x 16 block at r0 of
//   a tile of stride 24 ends at (r0 + 15) * 24 + 15 <= 3063, one at r0 of a tile of stride
//   136 at 15 * 136 + r0 + 15 <= 2167: both < 3072;
// - scratch: subgroup sg <= 7 owns hc[256 sg ..][16 x 16], coopStoreT's last element at
//   256 * 7 + 15 * 16 + 15 = 2047 < 2048, and lane <= 31 reads lane + 32 e <= 255 (e < 8) of it.

const HSK: u32 = 24u; // halves per row of a tile stored along k: 16 + 8 pad
const HSW: u32 = 136u; // halves per row of a tile stored along the 128-wide dimension: 128 + 8
var<workgroup> ha: array<f16, 3072>; // a's tile: [128][HSK] or [16][HSW]
var<workgroup> hb: array<f16, 3072>; // b's tile: [128][HSK] or [16][HSW]
var<workgroup> hc: array<f32, 2048>; // [8 subgroups][16][16], row-major

alias CoopA = coop_mat16x16<f16, A>;
alias CoopB = coop_mat16x16<f16, B>;
alias CoopC = coop_mat16x16<f32, C>;

// Where the first element of a pair at `at` (x of 128, kk of 16; pair_pos) lives in a tile laid
// out like its stored matrix (see the header); the second element is at the next index.
fn tile_at(at: vec2<u32>, along_k: bool) -> u32 {
    return select(at.y * HSW + at.x, at.x * HSK + at.y, along_k);
}

fn put_pair_ha(at: vec2<u32>, along_k: bool, v: vec2<f16>) {
    let i = tile_at(at, along_k);
    ha[i] = v.x;
    ha[i + 1u] = v.y;
}

fn put_pair_hb(at: vec2<u32>, along_k: bool, v: vec2<f16>) {
    let i = tile_at(at, along_k);
    hb[i] = v.x;
    hb[i + 1u] = v.y;
}

// A thread's fragments into the f16 tiles: an f32 pair rounded by WGSL's conversion (see the
// header), an f16 pair as it is.
fn put_a_coop(lid: u32, f: FragA) {
    let ak = gp.ta == 0u;
    put_pair_ha(pair_pos(lid, 0u, ak), ak, vec2<f16>(f.p0));
    put_pair_ha(pair_pos(lid, 1u, ak), ak, vec2<f16>(f.p1));
    put_pair_ha(pair_pos(lid, 2u, ak), ak, vec2<f16>(f.p2));
    put_pair_ha(pair_pos(lid, 3u, ak), ak, vec2<f16>(f.p3));
}

fn put_b_coop(lid: u32, f: FragB) {
    let bk = gp.tb != 0u;
    put_pair_hb(pair_pos(lid, 0u, bk), bk, vec2<f16>(f.p0));
    put_pair_hb(pair_pos(lid, 1u, bk), bk, vec2<f16>(f.p1));
    put_pair_hb(pair_pos(lid, 2u, bk), bk, vec2<f16>(f.p2));
    put_pair_hb(pair_pos(lid, 3u, bk), bk, vec2<f16>(f.p3));
}

// Rows r0 .. r0 + 15 (all 16 k) of a's tile as an A matrix: (i, kk) at ha[(r0 + i) * HSK + kk]
// (row-major) or ha[kk * HSW + r0 + i] (column-major). The branch is uniform (gp).
fn coop_a(r0: u32) -> CoopA {
    if (gp.ta == 0u) {
        return coopLoadT<CoopA>(&ha[r0 * HSK], HSK);
    }
    return coopLoad<CoopA>(&ha[r0], HSW);
}

// Columns c0 .. c0 + 15 (all 16 k) of b's tile as a B matrix: (kk, j) at hb[kk * HSW + c0 + j]
// (row-major) or hb[(c0 + j) * HSK + kk] (column-major).
fn coop_b(c0: u32) -> CoopB {
    if (gp.tb == 0u) {
        return coopLoadT<CoopB>(&hb[c0], HSW);
    }
    return coopLoad<CoopB>(&hb[c0 * HSK], HSK);
}

// Accumulator `acc` of subgroup `sg`, the 16 x 16 block of c at (i0, j0), into c: through the
// subgroup's scratch, lane `lane` writing elements lane + 32 e (row 2 e + lane / 16, column
// lane % 16: 16 lanes a row segment of c). Called by every thread of the workgroup alike (the
// barriers).
fn drain_coop(acc: CoopC, sg: u32, lane: u32, i0: u32, j0: u32) {
    let base = sg * 256u;
    coopStoreT(acc, &hc[base], 16u);
    workgroupBarrier();
    for (var e = 0u; e < 8u; e = e + 1u) {
        let at = lane + 32u * e;
        let i = i0 + at / 16u;
        if (i < gp.m) {
            store(i, j0 + at % 16u, hc[base + at]);
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn matmul_coop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg_in: u32,
               @builtin(subgroup_invocation_id) lane_in: u32) {
    // gemm.wgsl's tile_origin written out: naga's uniformity analysis takes a function's
    // result for non-uniform, and a return on one would put every cooperative operation after
    // it in non-uniform control flow (a validation error). Here the condition is uniform.
    let tiles_n = (gp.n + WM - 1u) / WM;
    let g = wid.x + wid.y * nwg.x;
    if (g >= tiles_n * ((gp.m + WM - 1u) / WM)) {
        return; // the tail of a 2-D grid
    }
    let m0 = (g / tiles_n) * WM;
    let n0 = (g % tiles_n) * WM;
    // In bounds whatever the subgroup size (see the header); right only for 8 subgroups of 32.
    let sg = min(sg_in, 7u);
    let lane = lane_in & 31u;
    let r0 = 32u * (sg % 4u);
    let c0 = 64u * (sg / 4u);
    // cRC: rows r0 + 16 R, columns c0 + 16 C of the tile.
    var c00 = CoopC(); var c01 = CoopC(); var c02 = CoopC(); var c03 = CoopC();
    var c10 = CoopC(); var c11 = CoopC(); var c12 = CoopC(); var c13 = CoopC();
    var fa = fetch_a128(lid, m0, 0u);
    var fb = fetch_b128(lid, 0u, n0);
    for (var k0 = 0u; k0 < gp.k; k0 = k0 + WK) {
        put_a_coop(lid, fa);
        put_b_coop(lid, fb);
        workgroupBarrier();
        // The next step's elements are in flight while this step's multiplies run.
        if (k0 + WK < gp.k) {
            fa = fetch_a128(lid, m0, k0 + WK);
            fb = fetch_b128(lid, k0 + WK, n0);
        }
        let a0 = coop_a(r0);
        let a1 = coop_a(r0 + 16u);
        let b0 = coop_b(c0);
        let b1 = coop_b(c0 + 16u);
        let b2 = coop_b(c0 + 32u);
        let b3 = coop_b(c0 + 48u);
        c00 = coopMultiplyAdd(a0, b0, c00); c01 = coopMultiplyAdd(a0, b1, c01);
        c02 = coopMultiplyAdd(a0, b2, c02); c03 = coopMultiplyAdd(a0, b3, c03);
        c10 = coopMultiplyAdd(a1, b0, c10); c11 = coopMultiplyAdd(a1, b1, c11);
        c12 = coopMultiplyAdd(a1, b2, c12); c13 = coopMultiplyAdd(a1, b3, c13);
        workgroupBarrier();
    }
    let i0 = m0 + r0;
    let i1 = m0 + r0 + 16u;
    let j0 = n0 + c0;
    drain_coop(c00, sg, lane, i0, j0); drain_coop(c01, sg, lane, i0, j0 + 16u);
    drain_coop(c02, sg, lane, i0, j0 + 32u); drain_coop(c03, sg, lane, i0, j0 + 48u);
    drain_coop(c10, sg, lane, i1, j0); drain_coop(c11, sg, lane, i1, j0 + 16u);
    drain_coop(c12, sg, lane, i1, j0 + 32u); drain_coop(c13, sg, lane, i1, j0 + 48u);
}

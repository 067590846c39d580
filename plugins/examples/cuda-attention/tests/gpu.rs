//! The CUDA plugin against the C plugin (the CPU path, itself conformant) on the same inputs:
//! device pointers and the context's stream in, forward and backward out. Skips without a GPU.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use dflash_attention_abi::{self as abi, DLDataType, DLDevice, DLTensor};
use dflash_attention_loader::PluginKernel;
use dflash_core::mask::BlockMask;
use dflash_core::{AttnBackward, AttnDims, AttnForward, HostAttentionKernel};

const CUDA: DLDevice = DLDevice {
    device_type: abi::kDLCUDA,
    device_id: 0,
};

fn tensor(ptr: u64, shape: &mut [i64]) -> DLTensor {
    DLTensor {
        data: ptr as *mut c_void,
        device: CUDA,
        ndim: shape.len() as i32,
        dtype: DLDataType::F32,
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

fn ptr<T>(s: &CudaSlice<T>, stream: &Arc<CudaStream>) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g == w) || (g - w).abs() <= 1e-4 + 1e-4 * w.abs();
        assert!(ok, "{what}[{i}] = {g}, CPU plugin says {w}");
    }
}

#[test]
fn matches_the_c_plugin_on_a_dflash_mask_with_gqa() {
    // Dynamic loading: without the driver library cudarc would panic on first use.
    // SAFETY: these only try to dlopen the candidate names; no symbol is called.
    let libs = unsafe {
        cudarc::driver::sys::is_culib_present() && cudarc::nvrtc::sys::is_culib_present()
    };
    let Some(ctx) = libs.then(|| CudaContext::new(0).ok()).flatten() else {
        println!("no CUDA device: skipped");
        return;
    };
    let stream = ctx.default_stream();
    let mask = BlockMask::dflash(37, 5, &[0, 2, 15, 16, -1, -1]).unwrap();
    let (tq, tk, hq, hkv, d) = (mask.q_len(), mask.kv_len(), 4usize, 2usize, 16usize);
    let draw = |n: usize, s: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + s * 104729) % 1000) as f32 / 500.0) - 1.0)
            .collect()
    };
    let (q, k, v, g) = (
        draw(tq * hq * d, 1),
        draw(tk * hkv * d, 2),
        draw(tk * hkv * d, 3),
        draw(tq * hq * d, 4),
    );
    let dims = AttnDims {
        q_rows: tq,
        kv_rows: tk,
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
    };

    // CPU: the C plugin.
    let cpu = PluginKernel::load(dflash_plugin_c_attention::LIBRARY).unwrap();
    let (mut out, mut lse) = (vec![0f32; q.len()], vec![0f32; tq * hq]);
    cpu.forward(AttnForward::new(&dims, &mask, 0.25, [&q, &k, &v], [&mut out, &mut lse]).unwrap())
        .unwrap();
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; q.len()],
        vec![0f32; k.len()],
        vec![0f32; k.len()],
    );
    cpu.backward(
        AttnBackward::new(
            &dims,
            &mask,
            0.25,
            [&q, &k, &v, &out, &lse, &g],
            [&mut dq, &mut dk, &mut dv],
        )
        .unwrap(),
    )
    .unwrap();

    // GPU: the CUDA plugin, called through its table with device pointers.
    let up = |x: &[f32]| stream.clone_htod(x).unwrap();
    let (dq_, dk_, dv_, dg) = (up(&q), up(&k), up(&v), up(&g));
    let arrays = mask.to_i32_arrays();
    let m: Vec<CudaSlice<i32>> = arrays
        .iter()
        .map(|a| stream.clone_htod(a).unwrap())
        .collect();
    let d_out = stream.alloc_zeros::<f32>(q.len()).unwrap();
    let d_lse = stream.alloc_zeros::<f32>(tq * hq).unwrap();
    let (gq, gk, gv) = (
        stream.alloc_zeros::<f32>(q.len()).unwrap(),
        stream.alloc_zeros::<f32>(k.len()).unwrap(),
        stream.alloc_zeros::<f32>(k.len()).unwrap(),
    );
    let ws = stream.alloc_zeros::<u8>(tq * hq * 4).unwrap();
    let mask_abi = abi::DfAttnMask {
        struct_size: abi::size_of_u32::<abi::DfAttnMask>(),
        device: CUDA,
        q_len: tq as i64,
        kv_len: tk as i64,
        first_start: ptr(&m[0], &stream) as *const i32,
        first_end: ptr(&m[1], &stream) as *const i32,
        second_start: ptr(&m[2], &stream) as *const i32,
        second_end: ptr(&m[3], &stream) as *const i32,
    };
    // One shape array per tensor, alive as long as the DLTensors pointing at them.
    let (qs, ks, ls) = (
        [tq as i64, hq as i64, d as i64],
        [tk as i64, hkv as i64, d as i64],
        [tq as i64, hq as i64],
    );
    let mut shapes = [qs, ks, ks, qs, qs, qs, ks, ks];
    let mut lse_shape = ls;
    let table =
        unsafe { &*dflash_plugin_cuda_attention::dflash_attention_plugin(abi::ABI_MAJOR, 0) };
    let slices = [&dq_, &dk_, &dv_, &d_out, &dg, &gq, &gk, &gv];
    let mut ts: Vec<DLTensor> = slices
        .iter()
        .zip(shapes.iter_mut())
        .map(|(sl, sh)| tensor(ptr(sl, &stream), sh))
        .collect();
    let mut tl = tensor(ptr(&d_lse, &stream), &mut lse_shape);
    let [tq_, tk_, tv_, mut to, tg, mut tdq, mut tdk, mut tdv]: [DLTensor; 8] =
        std::mem::take(&mut ts).try_into().unwrap();
    let fwd = abi::DfAttnForwardArgs {
        struct_size: abi::size_of_u32::<abi::DfAttnForwardArgs>(),
        q: &tq_,
        k: &tk_,
        v: &tv_,
        mask: &mask_abi,
        scale: 0.25,
        out: &mut to,
        lse: &mut tl,
        stream: stream.cu_stream() as *mut c_void,
        workspace: std::ptr::null_mut(),
        workspace_bytes: 0,
    };
    let status = unsafe { (table.forward.unwrap())(table, &fwd) };
    assert_eq!(status, 0, "{:?}", unsafe {
        std::ffi::CStr::from_ptr((table.last_error.unwrap())(table))
    });
    let bwd = abi::DfAttnBackwardArgs {
        struct_size: abi::size_of_u32::<abi::DfAttnBackwardArgs>(),
        q: &tq_,
        k: &tk_,
        v: &tv_,
        out: &to,
        lse: &tl,
        d_out: &tg,
        mask: &mask_abi,
        scale: 0.25,
        dq: &mut tdq,
        dk: &mut tdk,
        dv: &mut tdv,
        stream: stream.cu_stream() as *mut c_void,
        workspace: ptr(&ws, &stream) as *mut c_void,
        workspace_bytes: (tq * hq * 4) as u64,
    };
    let status = unsafe { (table.backward.unwrap())(table, &bwd) };
    assert_eq!(status, 0, "{:?}", unsafe {
        std::ffi::CStr::from_ptr((table.last_error.unwrap())(table))
    });
    stream.synchronize().unwrap();
    let down = |s: &CudaSlice<f32>| stream.clone_dtoh(s).unwrap();
    close("out", &down(&d_out), &out);
    close("lse", &down(&d_lse), &lse);
    close("dq", &down(&gq), &dq);
    close("dk", &down(&gk), &dk);
    close("dv", &down(&gv), &dv);
}

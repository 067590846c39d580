//! Loading `attention.cu` on a device: compiling it, reading the launch shapes `attn_config`
//! writes (and checking them), loading each head dim's kernels and raising their shared memory
//! limits.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, DriverError, LaunchConfig, PushKernelArg, sys};

use super::{FLASH_HEAD_DIMS, FlashKernels, FlashVariant};
use crate::CudaError;

/// Ints per head dim written by `attn_config`.
const CONFIG_FIELDS: usize = 12;

/// The architecture `attention.cu` is compiled for on a device of compute capability `cc`:
/// on Hopper the arch-specific target, so that the forward and the backward can use wgmma
/// (`__CUDA_ARCH_FEAT_SM90_ALL`); elsewhere the plain one (the mma.sync kernels).
pub(crate) fn flash_arch(cc: (i32, i32)) -> String {
    if cc == (9, 0) {
        "compute_90a".to_string()
    } else {
        format!("compute_{}{}", cc.0, cc.1)
    }
}

impl FlashKernels {
    /// Compiles `attention.cu` for `arch`, loads it into `ctx`, reads `attn_config` (one
    /// launch on `stream`, synchronised) and raises the dynamic shared memory limit of every
    /// kernel that needs more than the default 48 KB.
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        stream: &Arc<cudarc::driver::CudaStream>,
        cc: (i32, i32),
    ) -> std::result::Result<FlashKernels, String> {
        if cc.0 < 8 {
            return Err(format!(
                "needs compute capability >= 8.0 (bf16 mma.sync, cp.async); this device is {}.{}",
                cc.0, cc.1
            ));
        }
        let arch = flash_arch(cc);
        let (file, src) = crate::kernels::flash_source();
        let ptx = crate::kernels::compile_once(file, &src, &arch).map_err(|e| e.to_string())?;
        let module = ctx
            .load_module(ptx)
            .map_err(driver_err(format!("loading the module of {file} ({arch})")))?;
        let func = |name: &str| {
            module
                .load_function(name)
                .map_err(driver_err(format!("loading kernel {name} of {file}")))
        };

        let config = func("attn_config")?;
        let rows = read_config(stream, &config)?;

        let optin = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(driver_err("reading the opt-in shared memory limit".into()))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err("reading the multiprocessor count".into()))?;
        ctx.bind_to_thread()
            .map_err(driver_err("binding the context".into()))?;

        let mut variants = Vec::new();
        for (i, &d) in FLASH_HEAD_DIMS.iter().enumerate() {
            let r = &rows[i * CONFIG_FIELDS..(i + 1) * CONFIG_FIELDS];
            variants.push(FlashVariant::load(d, r, &func, optin)?);
        }
        Ok(FlashKernels {
            variants,
            dq_convert: func("attn_bwd_dq_convert")?,
            sms: sms.max(1) as u32,
        })
    }
}

impl FlashVariant {
    /// The variant of head dim `d` from its `attn_config` row `r`: loads its kernels (`func`)
    /// and, when the device's opt-in shared memory (`optin`) allows it, raises their dynamic
    /// shared memory limits; else records why the head dim cannot run.
    fn load(
        d: usize,
        r: &[i32],
        func: &impl Fn(&str) -> std::result::Result<CudaFunction, String>,
        optin: i32,
    ) -> std::result::Result<FlashVariant, String> {
        check_config_row(d, r)?;
        let fwd = func(&format!("attn_fwd_d{d}"))?;
        let pre = func(&format!("attn_bwd_pre_d{d}"))?;
        let dkdv = func(&format!("attn_bwd_dkdv_d{d}"))?;
        let (fwd_smem, bwd_smem) = (r[3], r[6]);
        let unsupported = if fwd_smem.max(bwd_smem) > optin {
            Some(format!(
                "head_dim {d} needs {} bytes of shared memory per block; this device allows {optin}",
                fwd_smem.max(bwd_smem)
            ))
        } else {
            // Dynamic shared memory above 48 KB must be opted into, once per function.
            let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            fwd.set_attribute(attr, fwd_smem)
                .map_err(driver_err(format!(
                    "raising attn_fwd_d{d}'s dynamic shared memory to {fwd_smem}"
                )))?;
            dkdv.set_attribute(attr, bwd_smem)
                .map_err(driver_err(format!(
                    "raising attn_bwd_dkdv_d{d}'s dynamic shared memory to {bwd_smem}"
                )))?;
            None
        };
        Ok(FlashVariant {
            d,
            fwd,
            pre,
            dkdv,
            fwd_bm: r[1] as u32,
            fwd_threads: r[2] as u32,
            fwd_smem: fwd_smem as u32,
            bwd_bn: r[4] as u32,
            bwd_threads: r[5] as u32,
            bwd_smem: bwd_smem as u32,
            pre_rows: r[7] as u32,
            pre_threads: r[8] as u32,
            bwd_tma: r[9] == 1,
            fwd_tma_bn: r[10] as u32,
            fwd_persist: r[11] == 1,
            unsupported,
        })
    }
}

/// A driver failure as `FlashKernels::load`'s message: what was being done, and the error.
fn driver_err(what: String) -> impl FnOnce(DriverError) -> String {
    move |e| CudaError::Driver { what, source: e }.to_string()
}

/// Runs `attn_config` (one launch on `stream`, synchronised) and returns the launch shapes it
/// writes, from the kernel itself: 3 rows of `CONFIG_FIELDS` ints (D 64, 128, 256).
fn read_config(
    stream: &Arc<cudarc::driver::CudaStream>,
    config: &CudaFunction,
) -> std::result::Result<Vec<i32>, String> {
    let n_cfg = FLASH_HEAD_DIMS.len() * CONFIG_FIELDS;
    let mut buf = stream
        .alloc_zeros::<i32>(n_cfg)
        .map_err(driver_err("allocating the attn_config buffer".into()))?;
    {
        let mut l = stream.launch_builder(config);
        l.arg(&mut buf);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: attn_config(int* out) writes 3 * ATTN_CONFIG_FIELDS (= 33) ints; `buf`
        // holds exactly that many i32.
        unsafe { l.launch(cfg) }.map_err(driver_err("launching attn_config".into()))?;
    }
    let rows = stream
        .clone_dtoh(&buf)
        .map_err(driver_err("reading attn_config".into()))?;
    stream
        .synchronize()
        .map_err(driver_err("running attn_config".into()))?;
    Ok(rows)
}

/// Checks the `attn_config` row `r` of head dim `d`: the head dim, the launch shapes (threads
/// a warp multiple in 32..=1024), the tensor-map boxes and the flags.
fn check_config_row(d: usize, r: &[i32]) -> std::result::Result<(), String> {
    let bad = |what: &str| format!("attn_config row for D {d} is {r:?}: {what}");
    if r[0] as usize != d {
        return Err(bad("field 0 is not the head dim"));
    }
    let threads_ok = |t: i32| (32..=1024).contains(&t) && t % 32 == 0;
    if r[1] <= 0 || !threads_ok(r[2]) || r[3] < 0 || r[4] <= 0 || !threads_ok(r[5]) {
        return Err(bad("invalid launch shape"));
    }
    if r[6] < 0 || r[7] <= 0 || !threads_ok(r[8]) || !(0..=1).contains(&r[9]) {
        return Err(bad("invalid backward shape"));
    }
    // TMA boxes are at most 256 rows: the forward's query tile (field 1) and key tile (10).
    if r[10] < 0 || (r[10] != 0 && (r[10] > 256 || r[1] > 256)) {
        return Err(bad("invalid forward tensor-map box"));
    }
    if !(0..=1).contains(&r[11]) {
        return Err(bad("invalid forward persistence flag"));
    }
    Ok(())
}

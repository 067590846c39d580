//! A CUDA plugin served as a [`DeviceAttentionKernel`]: the CUDA backend hands it device
//! addresses, its stream and a device workspace; the call is checked against the plugin's
//! declared capabilities first, like a host call.

use std::sync::Arc;

use dflash_attention_abi::{
    DLDevice, DfAttnMask, PASS_BACKWARD, PASS_FORWARD, kDLCUDA, size_of_u32,
};
use dflash_core::mask::BlockMask;
use dflash_core::{
    AttnDims, DeviceAttentionKernel, DeviceAttnBackward, DeviceAttnForward, DeviceCall, DeviceKind,
};

use crate::calls;
use crate::host::HostTensor;
use crate::{Plugin, PluginError};

/// A loaded CUDA plugin as a device attention kernel. Holds the [`Plugin`] (and so its library).
#[derive(Debug, Clone)]
pub struct DevicePluginKernel {
    plugin: Arc<Plugin>,
}

impl DevicePluginKernel {
    /// Wraps `plugin` for CUDA device memory: it must declare `kDLCUDA` and f32.
    pub fn new(plugin: Arc<Plugin>) -> Result<Self, PluginError> {
        calls::require_memory(&plugin, kDLCUDA, "kDLCUDA (device memory")?;
        Ok(DevicePluginKernel { plugin })
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }
}

/// The ABI mask of a device call: the four interval arrays at their device addresses.
fn mask_abi(c: &DeviceCall<'_>, device: DLDevice) -> DfAttnMask {
    let [fs, fe, ss, se] = c.mask_arrays.map(|a| a as *const i32);
    DfAttnMask {
        struct_size: size_of_u32::<DfAttnMask>(),
        device,
        q_len: c.mask.q_len() as i64,
        kv_len: c.mask.kv_len() as i64,
        first_start: fs,
        first_end: fe,
        second_start: ss,
        second_end: se,
    }
}

fn launch<'a>(c: &DeviceCall<'_>, mask: &'a DfAttnMask) -> calls::Launch<'a> {
    calls::Launch {
        mask,
        scale: c.scale,
        stream: c.stream,
        workspace: (c.workspace as *mut std::ffi::c_void, c.workspace_bytes),
    }
}

impl DeviceAttentionKernel for DevicePluginKernel {
    fn name(&self) -> &str {
        self.plugin.name()
    }
    fn device(&self) -> DeviceKind {
        DeviceKind::Cuda
    }
    fn supports(&self, backward: bool, dims: &AttnDims, mask: &BlockMask) -> Result<(), String> {
        let call = if backward { "backward" } else { "forward" };
        calls::require(&self.plugin, call, dims, mask).map_err(|e| e.to_string())
    }
    fn workspace_bytes(&self, backward: bool, dims: &AttnDims) -> Result<u64, String> {
        let (call, pass) = if backward {
            ("backward", PASS_BACKWARD)
        } else {
            ("forward", PASS_FORWARD)
        };
        calls::workspace_bytes(&self.plugin, call, dims, pass).map_err(|e| e.to_string())
    }
    unsafe fn forward(&self, a: &DeviceAttnForward<'_>) -> Result<(), String> {
        let c = &a.call;
        let dev = DLDevice {
            device_type: kDLCUDA,
            device_id: c.device_id,
        };
        let (qd, kd, ld) = calls::shapes(c.dims);
        let mut ins =
            [(a.q, qd), (a.k, kd), (a.v, kd)].map(|(p, d)| HostTensor::device(p, dev, &d));
        let mut outs = [
            HostTensor::device(a.out, dev, &qd),
            HostTensor::device(a.lse, dev, &ld),
        ];
        let [q, k, v] = ins.each_mut().map(|t| t.dl());
        let [mut out, mut lse] = outs.each_mut().map(|t| t.dl());
        let mask = mask_abi(c, dev);
        // SAFETY: the caller's contract (DeviceAttentionKernel::forward) covers the addresses;
        // the descriptions are locals alive for the call.
        unsafe {
            calls::forward(
                &self.plugin,
                [&q, &k, &v],
                [&mut out, &mut lse],
                &launch(c, &mask),
            )
        }
        .map_err(|e| e.to_string())
    }
    unsafe fn backward(&self, a: &DeviceAttnBackward<'_>) -> Result<(), String> {
        let c = &a.call;
        let dev = DLDevice {
            device_type: kDLCUDA,
            device_id: c.device_id,
        };
        let (qd, kd, ld) = calls::shapes(c.dims);
        let mut ins = [
            (a.q, &qd[..]),
            (a.k, &kd[..]),
            (a.v, &kd[..]),
            (a.out, &qd[..]),
            (a.lse, &ld[..]),
            (a.d_out, &qd[..]),
        ]
        .map(|(p, d)| HostTensor::device(p, dev, d));
        let mut outs =
            [(a.dq, qd), (a.dk, kd), (a.dv, kd)].map(|(p, d)| HostTensor::device(p, dev, &d));
        let [q, k, v, out, lse, d_out] = ins.each_mut().map(|t| t.dl());
        let [mut dq, mut dk, mut dv] = outs.each_mut().map(|t| t.dl());
        let mask = mask_abi(c, dev);
        // SAFETY: as in forward.
        unsafe {
            calls::backward(
                &self.plugin,
                [&q, &k, &v, &out, &lse, &d_out],
                [&mut dq, &mut dk, &mut dv],
                &launch(c, &mask),
            )
        }
        .map_err(|e| e.to_string())
    }
}

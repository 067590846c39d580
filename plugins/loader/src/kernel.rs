//! A plugin served as a [`HostAttentionKernel`]: each call described in host memory and checked
//! against the plugin's declared capabilities before the plugin sees it.

use std::sync::Arc;

use dflash_attention_abi::{PASS_BACKWARD, PASS_FORWARD, kDLCPU};
use dflash_core::{AttnBackward, AttnForward, HostAttentionKernel};

use crate::calls;
use crate::host::{HostMask, HostTensor, Workspace};
use crate::{Plugin, PluginError};

/// A loaded plugin as a host attention kernel. Holds the [`Plugin`] (and so its library).
#[derive(Debug, Clone)]
pub struct PluginKernel {
    plugin: Arc<Plugin>,
}

impl PluginKernel {
    /// Wraps `plugin` for host memory: it must declare the CPU device and f32.
    pub fn new(plugin: Arc<Plugin>) -> Result<Self, PluginError> {
        calls::require_memory(&plugin, kDLCPU, "kDLCPU (host memory")?;
        Ok(PluginKernel { plugin })
    }

    /// Loads the library at `path` ([`Plugin::load`]) and wraps it.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Self, PluginError> {
        Self::new(Arc::new(Plugin::load(path)?))
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    fn forward_impl(&self, call: AttnForward<'_>) -> Result<(), PluginError> {
        let p = &*self.plugin;
        let x = call.input;
        let d = x.dims;
        calls::require(p, "forward", &d, x.mask)?;
        let (qd, kd, ld) = calls::shapes(&d);
        let bytes = calls::workspace_bytes(p, "forward", &d, PASS_FORWARD)?;
        let mut ws = Workspace::new(bytes).map_err(|e| calls::call_err(p, "forward", &e))?;
        let mask = HostMask::new(x.mask);
        let mask_abi = mask.abi();
        let mut ins = [
            HostTensor::input(x.q, &qd),
            HostTensor::input(x.k, &kd),
            HostTensor::input(x.v, &kd),
        ];
        let mut outs = [
            HostTensor::output(call.out, &qd),
            HostTensor::output(call.lse, &ld),
        ];
        let [q, k, v] = ins.each_mut().map(|t| t.dl());
        let [mut out, mut lse] = outs.each_mut().map(|t| t.dl());
        let launch = calls::Launch {
            mask: &mask_abi,
            scale: x.scale,
            stream: std::ptr::null_mut(),
            workspace: ws.raw(),
        };
        // SAFETY: the tensors describe locals above and the call's slices, whose lengths
        // AttnForward::new checked.
        unsafe { calls::forward(p, [&q, &k, &v], [&mut out, &mut lse], &launch) }
    }

    fn backward_impl(&self, call: AttnBackward<'_>) -> Result<(), PluginError> {
        let p = &*self.plugin;
        let x = call.input;
        let d = x.dims;
        calls::require(p, "backward", &d, x.mask)?;
        let (qd, kd, ld) = calls::shapes(&d);
        let bytes = calls::workspace_bytes(p, "backward", &d, PASS_BACKWARD)?;
        let mut ws = Workspace::new(bytes).map_err(|e| calls::call_err(p, "backward", &e))?;
        let mask = HostMask::new(x.mask);
        let mask_abi = mask.abi();
        let mut ins = [
            HostTensor::input(x.q, &qd),
            HostTensor::input(x.k, &kd),
            HostTensor::input(x.v, &kd),
            HostTensor::input(call.out, &qd),
            HostTensor::input(call.lse, &ld),
            HostTensor::input(call.d_out, &qd),
        ];
        let mut outs = [
            HostTensor::output(call.dq, &qd),
            HostTensor::output(call.dk, &kd),
            HostTensor::output(call.dv, &kd),
        ];
        let [q, k, v, out, lse, d_out] = ins.each_mut().map(|t| t.dl());
        let [mut dq, mut dk, mut dv] = outs.each_mut().map(|t| t.dl());
        let launch = calls::Launch {
            mask: &mask_abi,
            scale: x.scale,
            stream: std::ptr::null_mut(),
            workspace: ws.raw(),
        };
        // SAFETY: as in forward.
        unsafe {
            calls::backward(
                p,
                [&q, &k, &v, &out, &lse, &d_out],
                [&mut dq, &mut dk, &mut dv],
                &launch,
            )
        }
    }
}

impl HostAttentionKernel for PluginKernel {
    fn name(&self) -> &str {
        self.plugin.name()
    }
    fn forward(&self, call: AttnForward<'_>) -> Result<(), String> {
        self.forward_impl(call).map_err(|e| e.to_string())
    }
    fn backward(&self, call: AttnBackward<'_>) -> Result<(), String> {
        self.backward_impl(call).map_err(|e| e.to_string())
    }
}

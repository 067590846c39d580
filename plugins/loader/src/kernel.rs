//! A plugin served as a [`HostAttentionKernel`]: each call described in host memory and checked
//! against the plugin's declared capabilities before the plugin sees it.

use std::sync::Arc;

use dflash_attention_abi::{
    CAP_BACKWARD, CAP_GQA, DLDataType, DTYPE_F32, DfAttnBackwardArgs, DfAttnForwardArgs,
    DfAttnShape, MASK_EMPTY_ROWS, MASK_TWO_INTERVALS, PASS_BACKWARD, PASS_FORWARD, kDLCPU,
    size_of_u32,
};
use dflash_core::mask::BlockMask;
use dflash_core::{AttnBackward, AttnDims, AttnForward, HostAttentionKernel};

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
        let caps = plugin.capabilities();
        let need = |need: &str| PluginError::MissingCapability {
            plugin: plugin.label().to_string(),
            call: "open",
            need: need.to_string(),
        };
        if caps.device_type != kDLCPU {
            return Err(need(&format!(
                "device kDLCPU (host memory; it declares device type {})",
                caps.device_type
            )));
        }
        if caps.dtypes & DTYPE_F32 == 0 {
            return Err(need("dtype f32 (DF_ATTN_DTYPE_F32)"));
        }
        Ok(PluginKernel { plugin })
    }

    /// Loads the library at `path` ([`Plugin::load`]) and wraps it.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Self, PluginError> {
        Self::new(Arc::new(Plugin::load(path)?))
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// The capabilities this call needs that are not declared.
    fn require(
        &self,
        call: &'static str,
        dims: &AttnDims,
        mask: &BlockMask,
    ) -> Result<(), PluginError> {
        let caps = self.plugin.capabilities();
        let need = |need: String| PluginError::MissingCapability {
            plugin: self.plugin.label().to_string(),
            call,
            need,
        };
        if !caps.supports_head_dim(dims.head_dim as u64) {
            return Err(need(format!(
                "head dim {} (it declares {}..={}, multiples of {})",
                dims.head_dim, caps.head_dim_min, caps.head_dim_max, caps.head_dim_multiple
            )));
        }
        if dims.q_heads != dims.kv_heads && caps.flags & CAP_GQA == 0 {
            return Err(need(format!(
                "GQA ({} query heads over {} kv heads; DF_ATTN_CAP_GQA)",
                dims.q_heads, dims.kv_heads
            )));
        }
        if call == "backward" && caps.flags & CAP_BACKWARD == 0 {
            return Err(need("a backward (DF_ATTN_CAP_BACKWARD)".into()));
        }
        // Every mask is two intervals per row; only a row seeing nothing is a rule of its own.
        if caps.mask_rules & MASK_TWO_INTERVALS == 0 {
            return Err(need(
                "two-interval masks (DF_ATTN_MASK_TWO_INTERVALS)".into(),
            ));
        }
        let empty_row = (0..mask.q_len()).any(|i| mask.row(i).iter().all(|iv| iv.is_empty()));
        if empty_row && caps.mask_rules & MASK_EMPTY_ROWS == 0 {
            return Err(need(
                "rows that see no key (DF_ATTN_MASK_EMPTY_ROWS)".into(),
            ));
        }
        Ok(())
    }

    fn workspace(
        &self,
        call: &'static str,
        dims: &AttnDims,
        pass: i32,
    ) -> Result<Workspace, PluginError> {
        let shape = DfAttnShape {
            struct_size: size_of_u32::<DfAttnShape>(),
            dtype: DLDataType::F32,
            q_rows: dims.q_rows as i64,
            kv_rows: dims.kv_rows as i64,
            q_heads: dims.q_heads as i64,
            kv_heads: dims.kv_heads as i64,
            head_dim: dims.head_dim as i64,
        };
        let t = self.plugin.table();
        let mut bytes = 0u64;
        let f = t
            .workspace_bytes
            .ok_or_else(|| self.call_err(call, "no workspace_bytes"))?;
        // SAFETY: a checked table's function, with valid pointers.
        let status = unsafe { f(t, &shape, pass, &mut bytes) };
        self.plugin.check_status("workspace_bytes", status)?;
        Workspace::new(bytes).map_err(|e| self.call_err(call, &e))
    }

    fn call_err(&self, call: &'static str, detail: &str) -> PluginError {
        PluginError::Call {
            plugin: self.plugin.label().to_string(),
            call,
            detail: detail.to_string(),
        }
    }

    fn forward_impl(&self, call: AttnForward<'_>) -> Result<(), PluginError> {
        let x = call.input;
        let d = x.dims;
        self.require("forward", &d, x.mask)?;
        let (qd, kd, ld) = (
            [d.q_rows, d.q_heads, d.head_dim],
            [d.kv_rows, d.kv_heads, d.head_dim],
            [d.q_rows, d.q_heads],
        );
        let mut ws = self.workspace("forward", &d, PASS_FORWARD)?;
        let (workspace, workspace_bytes) = ws.raw();
        let mask = HostMask::new(x.mask);
        let mask_abi = mask.abi();
        let (mut q, mut k, mut v) = (
            HostTensor::input(x.q, &qd),
            HostTensor::input(x.k, &kd),
            HostTensor::input(x.v, &kd),
        );
        let (mut out, mut lse) = (
            HostTensor::output(call.out, &qd),
            HostTensor::output(call.lse, &ld),
        );
        let (q, k, v, mut out, mut lse) = (q.dl(), k.dl(), v.dl(), out.dl(), lse.dl());
        let args = DfAttnForwardArgs {
            struct_size: size_of_u32::<DfAttnForwardArgs>(),
            q: &q,
            k: &k,
            v: &v,
            mask: &mask_abi,
            scale: x.scale,
            out: &mut out,
            lse: &mut lse,
            stream: std::ptr::null_mut(),
            workspace,
            workspace_bytes,
        };
        let t = self.plugin.table();
        let f = t
            .forward
            .ok_or_else(|| self.call_err("forward", "no forward"))?;
        // SAFETY: every pointer in `args` is valid for the call (locals above, the call's
        // slices with the lengths AttnForward::new checked).
        let status = unsafe { f(t, &args) };
        self.plugin.check_status("forward", status)
    }

    fn backward_impl(&self, call: AttnBackward<'_>) -> Result<(), PluginError> {
        let x = call.input;
        let d = x.dims;
        self.require("backward", &d, x.mask)?;
        let (qd, kd, ld) = (
            [d.q_rows, d.q_heads, d.head_dim],
            [d.kv_rows, d.kv_heads, d.head_dim],
            [d.q_rows, d.q_heads],
        );
        let mut ws = self.workspace("backward", &d, PASS_BACKWARD)?;
        let (workspace, workspace_bytes) = ws.raw();
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
        let args = DfAttnBackwardArgs {
            struct_size: size_of_u32::<DfAttnBackwardArgs>(),
            q: &q,
            k: &k,
            v: &v,
            out: &out,
            lse: &lse,
            d_out: &d_out,
            mask: &mask_abi,
            scale: x.scale,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
            stream: std::ptr::null_mut(),
            workspace,
            workspace_bytes,
        };
        let t = self.plugin.table();
        let f = t
            .backward
            .ok_or_else(|| self.call_err("backward", "no backward"))?;
        // SAFETY: as in forward.
        let status = unsafe { f(t, &args) };
        self.plugin.check_status("backward", status)
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

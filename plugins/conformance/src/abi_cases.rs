//! Raw ABI calls the host's own checks would never let through: a valid forward and backward
//! into NaN-poisoned outputs guarded past their end, and malformed calls that must come back
//! as a non-zero status with a message, never as success (or a crash).

use std::ptr::{null, null_mut};

use dflash_attention_abi::{
    self as abi, CAP_BACKWARD, CAP_STRIDED, DLDataType, DLDevice, DLTensor, DTYPE_F16,
    DfAttnBackwardArgs, DfAttnCapabilities, DfAttnForwardArgs, DfAttnMask, DfAttnShape,
    MASK_EMPTY_ROWS, MASK_TWO_INTERVALS, PASS_BACKWARD, PASS_FORWARD, size_of_u32,
};
use dflash_attention_loader::{PluginKernel, Workspace};
use dflash_core::mask::BlockMask;

use crate::table::{Outcome, Row};

/// Tensor slots: a forward uses the first five.
const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const OUT: usize = 3;
const LSE: usize = 4;
const D_OUT: usize = 5;
const DQ: usize = 6;
const DK: usize = 7;
const DV: usize = 8;
const OUTPUTS: [[usize; 3]; 2] = [[OUT, LSE, LSE], [DQ, DK, DV]];
/// The read-only inputs of each pass, by name.
const INPUTS: [&[(usize, &str)]; 2] = [
    &[(Q, "q"), (K, "k"), (V, "v")],
    &[
        (Q, "q"),
        (K, "k"),
        (V, "v"),
        (OUT, "out"),
        (LSE, "lse"),
        (D_OUT, "d_out"),
    ],
];

/// Elements past each output's end whose bits must survive a valid call.
const GUARD: usize = 64;
/// The guard's bit pattern: a NaN no arithmetic produces.
const SENTINEL: u32 = 0x7fc0_dead;

#[derive(Clone)]
struct Tensor {
    data: *mut f32,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    dtype: DLDataType,
    device: DLDevice,
    null: bool,
}

impl Tensor {
    fn dl(&mut self) -> DLTensor {
        DLTensor {
            data: self.data.cast(),
            device: self.device,
            ndim: self.shape.len() as i32,
            dtype: self.dtype,
            shape: self.shape.as_mut_ptr(),
            strides: self.strides.as_mut().map_or(null_mut(), |s| s.as_mut_ptr()),
            byte_offset: 0,
        }
    }
}

/// One raw call: its tensors, mask and the parts of the args a case may break.
#[derive(Clone)]
struct Call {
    t: Vec<Tensor>,
    mask: [Vec<i32>; 4],
    mask_rows: i64,
    mask_keys: i64,
    null_mask: bool,
    null_args: bool,
    struct_size: Option<u32>,
    /// `Some(bytes)`: pass a NULL workspace of `bytes` instead of the one the plugin asks for.
    workspace: Option<u64>,
    shape: DfAttnShape,
}

/// Buffers twice the valid size (plus the guard), so a plugin that trusts a malformed shape
/// scribbles into owned memory rather than corrupting the host.
struct Buffers(Vec<Vec<f32>>);

impl Call {
    fn run(&self, kernel: &PluginKernel, pass: i32) -> Result<i32, String> {
        let plugin = kernel.plugin();
        let table = plugin.table();
        let mut c = self.clone();
        let mut dls: Vec<DLTensor> = c.t.iter_mut().map(Tensor::dl).collect();
        let base = dls.as_mut_ptr();
        let p = |i: usize| -> *mut DLTensor {
            if c.t[i].null {
                null_mut()
            } else {
                unsafe { base.add(i) }
            }
        };
        let [fs, fe, ss, se] = &c.mask;
        let mask = DfAttnMask {
            struct_size: size_of_u32::<DfAttnMask>(),
            device: DLDevice::CPU,
            q_len: c.mask_rows,
            kv_len: c.mask_keys,
            first_start: fs.as_ptr(),
            first_end: fe.as_ptr(),
            second_start: ss.as_ptr(),
            second_end: se.as_ptr(),
        };
        let mask_ptr: *const DfAttnMask = if c.null_mask { null() } else { &mask };
        let mut ws;
        let (workspace, workspace_bytes) = match c.workspace {
            Some(bytes) => (null_mut(), bytes),
            None => {
                let mut bytes = 0u64;
                let f = table.workspace_bytes.ok_or("no workspace_bytes")?;
                let status = unsafe { f(plugin.raw_table(), &c.shape, pass, &mut bytes) };
                plugin
                    .check_status("workspace_bytes", status)
                    .map_err(|e| e.to_string())?;
                ws = Workspace::new(bytes)?;
                ws.raw()
            }
        };
        let status = if pass == PASS_FORWARD {
            let args = DfAttnForwardArgs {
                struct_size: c.struct_size.unwrap_or(size_of_u32::<DfAttnForwardArgs>()),
                q: p(Q),
                k: p(K),
                v: p(V),
                mask: mask_ptr,
                scale: 0.25,
                out: p(OUT),
                lse: p(LSE),
                stream: null_mut(),
                workspace,
                workspace_bytes,
            };
            let f = table.forward.ok_or("no forward")?;
            unsafe { f(plugin.raw_table(), if c.null_args { null() } else { &args }) }
        } else {
            let args = DfAttnBackwardArgs {
                struct_size: c.struct_size.unwrap_or(size_of_u32::<DfAttnBackwardArgs>()),
                q: p(Q),
                k: p(K),
                v: p(V),
                out: p(OUT),
                lse: p(LSE),
                d_out: p(D_OUT),
                mask: mask_ptr,
                scale: 0.25,
                dq: p(DQ),
                dk: p(DK),
                dv: p(DV),
                stream: null_mut(),
                workspace,
                workspace_bytes,
            };
            let f = table.backward.ok_or("no backward")?;
            unsafe { f(plugin.raw_table(), if c.null_args { null() } else { &args }) }
        };
        drop(dls);
        Ok(status)
    }
}

/// A head dim the plugin declares, preferring the suite's.
pub(crate) fn head_dim(caps: &DfAttnCapabilities) -> Option<i64> {
    let m = caps.head_dim_multiple.max(1);
    let first = caps.head_dim_min.div_ceil(m) * m;
    [16, 64, 32, 8, 128, first]
        .into_iter()
        .find(|&d| caps.supports_head_dim(d as u64))
        .map(i64::from)
}

fn base_call(caps: &DfAttnCapabilities, bufs: &mut Buffers) -> Result<Call, String> {
    // A padding block (rows that see no key) only for a plugin declaring such rows.
    let anchors: &[i32] = if caps.mask_rules & MASK_EMPTY_ROWS != 0 {
        &[3, 9, -1]
    } else {
        &[3, 9]
    };
    let mask = BlockMask::dflash(20, 4, anchors).map_err(|e| e.to_string())?;
    let d = head_dim(caps).ok_or("the plugin declares no usable head dim")?;
    let (tq, tk, h) = (mask.q_len() as i64, mask.kv_len() as i64, 2i64);
    let shapes: [Vec<i64>; 9] = [
        vec![tq, h, d],
        vec![tk, h, d],
        vec![tk, h, d],
        vec![tq, h, d],
        vec![tq, h],
        vec![tq, h, d],
        vec![tq, h, d],
        vec![tk, h, d],
        vec![tk, h, d],
    ];
    bufs.0 = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = s.iter().product::<i64>() as usize;
            (0..2 * n + GUARD)
                .map(|j| ((j * 7 + i * 3) % 17) as f32 / 17.0 - 0.5)
                .collect()
        })
        .collect();
    let t = shapes
        .into_iter()
        .zip(bufs.0.iter_mut())
        .map(|(shape, buf)| Tensor {
            data: buf.as_mut_ptr(),
            strides: None,
            shape,
            dtype: DLDataType::F32,
            device: DLDevice::CPU,
            null: false,
        })
        .collect();
    Ok(Call {
        t,
        mask: mask.to_i32_arrays(),
        mask_rows: tq,
        mask_keys: tk,
        null_mask: false,
        null_args: false,
        struct_size: None,
        workspace: None,
        shape: DfAttnShape {
            struct_size: size_of_u32::<DfAttnShape>(),
            dtype: DLDataType::F32,
            q_rows: tq,
            kv_rows: tk,
            q_heads: h,
            kv_heads: h,
            head_dim: d,
        },
    })
}

fn numel(t: &Tensor) -> usize {
    t.shape.iter().product::<i64>() as usize
}

/// Output slot `i` of the valid call and its guard, through the call's own pointer (the
/// buffers are only touched through the pointers the plugin also receives).
///
/// # Safety
/// No other reference to the slot's buffer is alive while the result is.
unsafe fn output<'a>(call: &Call, i: usize) -> &'a mut [f32] {
    // SAFETY: slot `i` points into a buffer of `2 * numel + GUARD` elements that outlives `call`.
    unsafe { std::slice::from_raw_parts_mut(call.t[i].data, numel(&call.t[i]) + GUARD) }
}

/// FNV-1a over the bits of input slot `i` and the guard-sized stretch past its end.
fn checksum(call: &Call, i: usize) -> u64 {
    // SAFETY: slot `i` points into a buffer of `2 * numel + GUARD` elements that outlives
    // `call`, and no mutable reference to it is alive.
    let xs = unsafe { std::slice::from_raw_parts(call.t[i].data, numel(&call.t[i]) + GUARD) };
    dflash_tests::checksum(xs)
}

/// Poisons the outputs of `pass` (NaN, then the guard), runs the valid call, and checks every
/// element was written, none past the end, and no input changed.
fn valid(kernel: &PluginKernel, call: &Call, pass: i32) -> Row {
    let which = if pass == PASS_FORWARD {
        "forward"
    } else {
        "backward"
    };
    let name = format!("abi/{which}/valid_guarded");
    if kernel.plugin().capabilities().mask_rules & MASK_TWO_INTERVALS == 0 {
        return Row {
            name,
            worst: None,
            max_err: None,
            outcome: Outcome::Skipped(
                "needs two-interval masks (DF_ATTN_MASK_TWO_INTERVALS)".into(),
            ),
        };
    }
    let inputs = INPUTS[pass as usize];
    let sums: Vec<u64> = inputs.iter().map(|&(i, _)| checksum(call, i)).collect();
    let outs = OUTPUTS[pass as usize];
    for &i in &outs {
        let n = numel(&call.t[i]);
        let buf = unsafe { output(call, i) };
        buf[..n].fill(f32::NAN);
        buf[n..n + GUARD].fill(f32::from_bits(SENTINEL));
    }
    let outcome = match call.run(kernel, pass) {
        Err(e) => Outcome::Failed(e),
        Ok(0) => {
            let changed = inputs
                .iter()
                .zip(&sums)
                .find(|&(&(i, _), &sum)| checksum(call, i) != sum)
                .map(|((_, input), _)| {
                    format!("wrote into its input {input} (inputs are read-only)")
                });
            let bad = changed.or_else(|| {
                outs.iter().find_map(|&i| {
                    let n = numel(&call.t[i]);
                    let buf = unsafe { output(call, i) };
                    if let Some(j) = buf[..n].iter().position(|x| x.is_nan()) {
                        Some(format!(
                            "output slot {i}: element {j} of {n} left unwritten"
                        ))
                    } else if buf[n..n + GUARD].iter().any(|x| x.to_bits() != SENTINEL) {
                        Some(format!("output slot {i}: wrote past its {n} elements"))
                    } else {
                        None
                    }
                })
            });
            bad.map_or(Outcome::Passed, Outcome::Failed)
        }
        Ok(s) => Outcome::Failed(format!(
            "valid call returned {s} ({}): {}",
            abi::status_name(s),
            kernel.plugin().last_error()
        )),
    };
    Row {
        name,
        worst: None,
        max_err: None,
        outcome,
    }
}

fn malformed(kernel: &PluginKernel, name: &str, call: &Call, pass: i32) -> Row {
    let which = if pass == PASS_FORWARD {
        "forward"
    } else {
        "backward"
    };
    // `last_error` is per thread and keeps its message until that thread's next failure, so
    // on a thread that already made a failing call a plugin returning an error without a
    // message would show the stale one: each malformed call and its `last_error` read run on
    // a fresh thread.
    let call = AssertSend(call);
    let run = std::thread::scope(|s| {
        s.spawn(move || {
            let call = call.into_inner();
            let status = call.run(kernel, pass);
            (status, kernel.plugin().last_error())
        })
        .join()
    });
    let outcome = match run {
        Err(_) => Outcome::Failed("the call panicked".into()),
        Ok((Err(e), _)) => Outcome::Failed(e),
        Ok((Ok(0), _)) => Outcome::Failed("accepted a malformed call (status 0)".into()),
        Ok((Ok(_), msg)) if msg.trim().is_empty() => {
            Outcome::Failed("non-zero status but an empty last_error".into())
        }
        Ok((Ok(_), _)) => Outcome::Passed,
    };
    Row {
        name: format!("abi/{which}/{name}"),
        worst: None,
        max_err: None,
        outcome,
    }
}

/// A `Call` (raw pointers into buffers the caller keeps alive and leaves alone) lent to the
/// scoped thread that makes it.
struct AssertSend<T>(T);
// SAFETY: only used for a `&Call` whose buffers outlive the scoped thread and are not touched
// by the lending thread while it runs.
unsafe impl<T> Send for AssertSend<T> {}
impl<T> AssertSend<T> {
    /// By value, so a closure captures the whole (Send) wrapper rather than its field.
    fn into_inner(self) -> T {
        self.0
    }
}

type Break = Box<dyn Fn(&mut Call)>;

/// The malformed variants of a call of either pass: (name, how it breaks the valid call).
fn breaks(caps: &DfAttnCapabilities, pass: i32) -> Vec<(&'static str, Break)> {
    let out = if pass == PASS_FORWARD { OUT } else { DQ };
    let mut v: Vec<(&'static str, Break)> = vec![
        ("null_args", Box::new(|c| c.null_args = true)),
        ("short_struct", Box::new(|c| c.struct_size = Some(4))),
        ("null_q", Box::new(|c| c.t[Q].null = true)),
        ("null_output", Box::new(move |c| c.t[out].null = true)),
        ("null_mask", Box::new(|c| c.null_mask = true)),
        ("q_ndim", Box::new(|c| c.t[Q].shape.truncate(2))),
        ("output_rows", Box::new(move |c| c.t[out].shape[0] += 1)),
        ("lse_heads", Box::new(|c| c.t[LSE].shape[1] += 1)),
        ("v_rows", Box::new(|c| c.t[V].shape[0] -= 1)),
        (
            "heads_not_divisible",
            Box::new(move |c| {
                for i in [Q, out, LSE, OUT, D_OUT] {
                    c.t[i].shape[1] = 3;
                }
            }),
        ),
        ("mask_rows", Box::new(|c| c.mask_rows -= 1)),
        (
            "mask_interval_out_of_range",
            Box::new(|c| c.mask[1][0] = c.mask_keys as i32 + 5),
        ),
    ];
    if caps.dtypes & DTYPE_F16 == 0 {
        v.push(("q_dtype_f16", Box::new(|c| c.t[Q].dtype = DLDataType::F16)));
    }
    if caps.device_type == abi::kDLCPU {
        v.push((
            "k_on_cuda",
            Box::new(|c| {
                c.t[K].device = DLDevice {
                    device_type: abi::kDLCUDA,
                    device_id: 0,
                }
            }),
        ));
    }
    if caps.flags & CAP_STRIDED == 0 {
        // Head-major q: (Tq, Hq, D) with strides (D, Tq * D, 1).
        v.push((
            "strided_q",
            Box::new(|c| {
                let s = &c.t[Q].shape;
                c.t[Q].strides = Some(vec![s[2], s[0] * s[2], 1]);
            }),
        ));
    }
    v
}

/// The raw-ABI cases of the conformance run (see the module docs).
pub fn abi_cases(kernel: &PluginKernel) -> Vec<Row> {
    let caps = *kernel.plugin().capabilities();
    let mut bufs = Buffers(Vec::new());
    let call = match base_call(&caps, &mut bufs) {
        Ok(c) => c,
        Err(e) => {
            return vec![Row {
                name: "abi/setup".into(),
                worst: None,
                max_err: None,
                outcome: Outcome::Failed(e),
            }];
        }
    };
    let mut passes = vec![PASS_FORWARD];
    if caps.flags & CAP_BACKWARD != 0 {
        passes.push(PASS_BACKWARD);
    }
    let mut rows = Vec::new();
    for &pass in &passes {
        // The backward's out/lse are the valid forward's, left in their buffers.
        rows.push(valid(kernel, &call, pass));
        let mut needs_ws = 0u64;
        if let Some(f) = kernel.plugin().table().workspace_bytes {
            unsafe {
                f(
                    kernel.plugin().raw_table(),
                    &call.shape,
                    pass,
                    &mut needs_ws,
                )
            };
        }
        let mut cases = breaks(&caps, pass);
        if needs_ws > 0 {
            cases.push(("short_workspace", Box::new(|c| c.workspace = Some(0))));
        }
        for (name, brk) in cases {
            let mut c = call.clone();
            brk(&mut c);
            rows.push(malformed(kernel, name, &c, pass));
        }
    }
    rows
}

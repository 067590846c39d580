//! Buffers, host transfers and elementwise glue (kernels in `kernels/elementwise.cu`).
//! `download` (widened to f32), `copy`, `narrow_rows`, `concat_rows` and `concat_cols` take
//! f32 and bf16 tensors (the result keeps the dtype). The arithmetic ops take either dtype for
//! every input: `add` writes an activation (`CudaOptions::activations`), `add_assign` and
//! `scale_assign` keep the accumulator's dtype, `sum_squares` / `all_finite` read any dtype.
//! `upload`, `zeros` and `random_normal` always make f32 (parameters, master weights,
//! gradient accumulators, optimizer moments); `upload_frozen` makes the compute format.

use cudarc::driver::PushKernelArg;
use dflash_core::{Error, HostSlice, MemoryOps, Result, Tensor};

use crate::kernels::pick;
use crate::storage::{DType, f32_bytes, f32_bytes_mut};
use crate::{CudaBackend, GemmPrecision, grid_vec8, grid1d};

mod frozen;
mod reduce;
mod transfers;

use reduce::{cfg_blocks, reduce_blocks};
pub(crate) use transfers::SideTransfers;

/// The storages of `parts` (at least one, shapes checked by the caller), which must all hold
/// part 0's dtype: a concatenation copies bytes, so it cannot mix element sizes.
fn parts_of_one_dtype<'a>(
    be: &CudaBackend,
    op: &'static str,
    parts: &[&'a Tensor],
) -> Result<(DType, Vec<&'a crate::CudaStorage>)> {
    let dtype = be.any(op, parts[0])?.dtype;
    let stores = parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = be.any(op, p)?;
            if s.dtype != dtype {
                return Err(be.shape_err(
                    op,
                    format!(
                        "part {i} is {} but part 0 is {}",
                        s.dtype.name(),
                        dtype.name()
                    ),
                ));
            }
            Ok(s)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((dtype, stores))
}

/// A same-dtype copy of any tensor of this backend.
pub(crate) fn copy_any(be: &CudaBackend, op: &'static str, t: &Tensor) -> Result<Tensor> {
    let s = be.any(op, t)?;
    let mut out = be.alloc(op, s.len, s.dtype)?;
    if s.len > 0 {
        be.stream
            .memcpy_dtod(&s.view(0, s.len), &mut out.slice_mut(0..s.bytes()))
            .map_err(|e| be.drv(op, e))?;
    }
    Ok(be.tensor(out, s.dtype, t.shape().clone()))
}

impl MemoryOps for CudaBackend {
    /// Any dtype, this device (another backend instance on the same device counts: cudarc
    /// orders its stream after the buffer's writes through the buffer's events).
    fn is_local(&self, t: &Tensor) -> bool {
        t.storage()
            .as_any()
            .downcast_ref::<crate::CudaStorage>()
            .is_some_and(|s| s.ordinal == self.ordinal)
    }

    /// Another GPU's tensor by a peer copy (`peer.rs`); anything else through the host.
    fn import(&self, t: &Tensor) -> Result<Tensor> {
        let here = match self.import_peer(t)? {
            Some(copy) => copy,
            None => self.upload(&t.storage().read_host(t.numel())?, t.dims())?,
        };
        self.to_compute_format(here)
    }

    fn upload(&self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        let op = "upload";
        let numel =
            dflash_core::upload_numel(data.len(), shape).map_err(|e| self.shape_err(op, e))?;
        let mut buf = self.alloc(op, numel, DType::F32)?;
        if numel > 0 {
            self.stream
                .memcpy_htod(f32_bytes(data), &mut buf)
                .map_err(|e| self.drv(op, e))?;
        }
        Ok(self.tensor(buf, DType::F32, shape))
    }

    /// [`CudaBackend::upload_frozen_chunked`] in chunks of [`CudaBackend::FROZEN_CHUNK`]
    /// elements.
    fn upload_frozen(&self, data: HostSlice<'_>, shape: &[usize]) -> Result<Tensor> {
        self.upload_frozen_chunked(data, shape, Self::FROZEN_CHUNK)
    }

    fn download(&self, t: &Tensor) -> Result<Vec<f32>> {
        let op = "download";
        let s = self.any(op, t)?;
        let f32_tensor;
        let s = if s.dtype == DType::F32 {
            s
        } else {
            f32_tensor = self.to_dtype(t, DType::F32)?;
            self.any(op, &f32_tensor)?
        };
        let mut out = vec![0.0f32; s.len];
        if s.len > 0 {
            self.stream
                .memcpy_dtoh(&s.view(0, s.len), f32_bytes_mut(&mut out))
                .map_err(|e| self.drv(op, e))?;
        }
        self.stream.synchronize().map_err(|e| self.drv(op, e))?;
        self.dev.ctx.check_err().map_err(|e| self.drv(op, e))?;
        Ok(out)
    }

    /// On the side stream: the context's event tracking (on while this backend has its own
    /// stream) makes the copy wait for the tensor's last write only, and a later write to it
    /// on the main stream wait for this read. Not f32: converted on the main stream first.
    fn download_detached(&self, t: &Tensor) -> Result<Vec<f32>> {
        let op = "download_detached";
        let s = self.any(op, t)?;
        if s.dtype != DType::F32 || !self.dev.ctx.is_event_tracking() {
            return self.download(t);
        }
        let mut side = self.transfers.lock().unwrap_or_else(|p| p.into_inner());
        if side.is_none() {
            *side = Some(SideTransfers::new(&self.dev.ctx).map_err(|e| self.drv(op, e))?);
        }
        let side = side.as_mut().expect("made above");
        let mut out = vec![0.0f32; s.len];
        side.copy(&s.view(0, s.len), f32_bytes_mut(&mut out))
            .map_err(|e| self.drv(op, e))?;
        self.dev.ctx.check_err().map_err(|e| self.drv(op, e))?;
        Ok(out)
    }

    /// Generated on the device (no host buffer, no upload): the same stream as the host
    /// generator, so a seed gives the same weights on every backend.
    fn random_normal(&self, shape: &[usize], std: f32, seed: u64) -> Result<Tensor> {
        let op = "random_normal";
        if !(std.is_finite() && std >= 0.0) {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!("std must be a finite number >= 0, got {std} (shape {shape:?})"),
            ));
        }
        let n = dflash_core::tensor::checked_numel(op, &self.tag, shape)?;
        let mut buf = self.alloc_f32(op, n)?;
        if n > 0 {
            let n64 = n as i64;
            let mut l = self
                .stream
                .launch_builder(&self.dev.kernels.random_normal_f32);
            l.arg(&mut buf).arg(&n64).arg(&std).arg(&seed);
            self.launch(op, l, grid1d(n.div_ceil(2)))?;
        }
        Ok(self.tensor(buf, DType::F32, shape))
    }

    /// With bf16 GEMMs ([`GemmPrecision::Bf16`], the default): `t` in bf16 (rounded to
    /// nearest even; a bf16 `t` is returned as it is). GEMMs read it in place, `embedding`
    /// gathers from it, the fused loss takes it as the LM head, memory ops copy it; every
    /// other op rejects it by name. With TF32/FP32 GEMMs: `t` unchanged (their f32 operands
    /// would only be widened back).
    fn to_compute_format(&self, t: Tensor) -> Result<Tensor> {
        let s = self.any("to_compute_format", &t)?;
        if self.opts.gemm != GemmPrecision::Bf16 || s.dtype == DType::Bf16 {
            return Ok(t);
        }
        self.to_dtype(&t, DType::Bf16)
    }

    fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        let n = dflash_core::tensor::checked_numel("zeros", &self.tag, shape)?;
        Ok(self.tensor(self.zeros_f32("zeros", n)?, DType::F32, shape))
    }

    fn copy(&self, t: &Tensor) -> Result<Tensor> {
        copy_any(self, "copy", t)
    }

    /// One launch of `scatter_rows_<dst>` (any `dst` dtype, kept; `src` widened to f32 if it
    /// is bf16), with the row indices through the upload cache: a decode step writes each
    /// layer's keys and values to the same rows.
    fn scatter_rows(&self, dst: &mut Tensor, rows: &[usize], src: &Tensor) -> Result<()> {
        let op = "scatter_rows";
        let cols = dflash_core::scatter_rows_cols(op, &self.tag, dst, rows, src)?;
        let n = rows.len();
        if n == 0 || cols == 0 {
            return Ok(());
        }
        let idx: Vec<i32> = rows
            .iter()
            .map(|&r| i32::try_from(r).map_err(|_| self.shape_err(op, format!("row {r} > i32"))))
            .collect::<Result<_>>()?;
        let idx = self.upload_i32_cached(op, &idx)?;
        let xs = self.widen(op, self.any(op, src)?)?;
        let d = self.any_mut(op, dst)?;
        let k = self.k();
        let f = pick(&[&k.scatter_rows_f, &k.scatter_rows_b], &[d.dtype]);
        let (n64, c64) = (n as i64, cols as i64);
        let mut l = self.stream.launch_builder(f);
        l.arg(&mut d.buf)
            .arg(xs.get())
            .arg(&*idx)
            .arg(&n64)
            .arg(&c64);
        self.launch(op, l, grid1d(n * cols))
    }

    fn narrow_rows(&self, t: &Tensor, start: usize, len: usize) -> Result<Tensor> {
        let op = "narrow_rows";
        let s = self.any(op, t)?;
        let (row, dims) =
            dflash_core::narrow_rows_dims(t, start, len).map_err(|e| self.shape_err(op, e))?;
        let n = len * row;
        let mut out = self.alloc(op, n, s.dtype)?;
        if n > 0 {
            self.stream
                .memcpy_dtod(
                    &s.view(start * row, (start + len) * row),
                    &mut out.slice_mut(0..n * s.dtype.size()),
                )
                .map_err(|e| self.drv(op, e))?;
        }
        Ok(self.tensor(out, s.dtype, dims))
    }

    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor> {
        let op = "concat_rows";
        let dims = dflash_core::concat_rows_dims(parts).map_err(|e| self.shape_err(op, e))?;
        let (dtype, stores) = parts_of_one_dtype(self, op, parts)?;
        let total: usize = stores.iter().map(|s| s.len).sum();
        let mut out = self.alloc(op, total, dtype)?;
        let mut off = 0; // bytes
        for s in stores {
            if s.len > 0 {
                self.stream
                    .memcpy_dtod(&s.view(0, s.len), &mut out.slice_mut(off..off + s.bytes()))
                    .map_err(|e| self.drv(op, e))?;
            }
            off += s.bytes();
        }
        Ok(self.tensor(out, dtype, dims))
    }

    fn concat_cols(&self, parts: &[&Tensor]) -> Result<Tensor> {
        let op = "concat_cols";
        let (rows, cols) =
            dflash_core::concat_cols_dims(parts).map_err(|e| self.shape_err(op, e))?;
        let (dtype, stores) = parts_of_one_dtype(self, op, parts)?;
        let total: usize = cols.iter().sum();
        let mut out = self.alloc(op, rows * total, dtype)?;
        // A pure copy: the 4- or 2-byte kernel by element size.
        let f = match dtype {
            DType::F32 => &self.k().copy_cols_f32,
            DType::Bf16 => &self.k().copy_cols_u16,
        };
        let mut col_off = 0usize;
        for (s, &c) in stores.iter().zip(&cols) {
            let n = rows * c;
            if n > 0 {
                let (r64, c64, t64, o64) = (rows as i64, c as i64, total as i64, col_off as i64);
                let mut l = self.stream.launch_builder(f);
                l.arg(&mut out)
                    .arg(&s.buf)
                    .arg(&r64)
                    .arg(&c64)
                    .arg(&t64)
                    .arg(&o64);
                self.launch(op, l, grid1d(n))?;
            }
            col_off += c;
        }
        Ok(self.tensor(out, dtype, [rows, total]))
    }

    /// Any dtypes (each independently); the sum is an activation (`opts.activations`).
    /// `add`, `add_assign` and `scale_assign` run 8 elements per thread (16-byte accesses).
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let op = "add";
        self.same_shape(op, "a and b", a, b)?;
        let (x, y) = (self.any(op, a)?, self.any(op, b)?);
        let n = x.len;
        let od = self.opts.activations;
        let mut out = self.alloc(op, n, od)?;
        if n > 0 {
            let k = self.k();
            let f = pick(
                &[
                    &k.add_fff, &k.add_ffb, &k.add_fbf, &k.add_fbb, &k.add_bff, &k.add_bfb,
                    &k.add_bbf, &k.add_bbb,
                ],
                &[od, x.dtype, y.dtype],
            );
            let n64 = n as i64;
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut out).arg(&x.buf).arg(&y.buf).arg(&n64);
            self.launch(op, l, grid_vec8(n))?;
        }
        Ok(self.tensor(out, od, a.shape().clone()))
    }

    /// `acc` keeps its dtype (f32 gradient accumulators stay f32); `x` any dtype.
    fn add_assign(&self, acc: &mut Tensor, x: &Tensor) -> Result<()> {
        let op = "add_assign";
        if acc.numel() != x.numel() {
            return Err(self.shape_err(
                op,
                format!(
                    "acc {:?} vs x {:?} (element counts differ)",
                    acc.shape(),
                    x.shape()
                ),
            ));
        }
        let xs = self.any(op, x)?;
        let a = self.any_mut(op, acc)?;
        let n = a.len;
        if n > 0 {
            let k = self.k();
            let f = pick(
                &[
                    &k.add_assign_ff,
                    &k.add_assign_fb,
                    &k.add_assign_bf,
                    &k.add_assign_bb,
                ],
                &[a.dtype, xs.dtype],
            );
            let n64 = n as i64;
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut a.buf).arg(&xs.buf).arg(&n64);
            self.launch(op, l, grid_vec8(n))?;
        }
        Ok(())
    }

    /// In place, any dtype (kept).
    fn scale_assign(&self, t: &mut Tensor, s: f32) -> Result<()> {
        let op = "scale_assign";
        let a = self.any_mut(op, t)?;
        let n = a.len;
        if n > 0 {
            let k = self.k();
            let f = pick(&[&k.scale_f, &k.scale_b], &[a.dtype]);
            let n64 = n as i64;
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut a.buf).arg(&n64).arg(&s);
            self.launch(op, l, grid_vec8(n))?;
        }
        Ok(())
    }

    /// Any dtype; f64 sums.
    fn sum_squares(&self, t: &Tensor) -> Result<f64> {
        Ok(self.sum_squares_of("sum_squares", &[t])?[0])
    }

    /// Any dtype: the same kernels and summation order as `sum_squares` (so the same bits),
    /// one host read for all the sums.
    fn sum_squares_many(&self, ts: &[&Tensor]) -> Result<Vec<f64>> {
        self.sum_squares_of("sum_squares_many", ts)
    }

    /// Any dtype.
    fn all_finite(&self, t: &Tensor) -> Result<bool> {
        let op = "all_finite";
        let x = self.any(op, t)?;
        let n = x.len;
        if n == 0 {
            return Ok(true);
        }
        let g = reduce_blocks(n);
        let mut partial = self.alloc(op, 2 * g, DType::F32)?; // g u64
        let mut out = self.alloc(op, 2, DType::F32)?; // 1 u64
        let n64 = n as i64;
        let g32 = g as i32;
        let k = self.k();
        let f = pick(
            &[&k.nonfinite_partial_f, &k.nonfinite_partial_b],
            &[x.dtype],
        );
        let mut l = self.stream.launch_builder(f);
        l.arg(&x.buf).arg(&n64).arg(&mut partial);
        self.launch(op, l, cfg_blocks(g))?;
        let mut l = self.stream.launch_builder(&self.k().sum_final_u64);
        l.arg(&partial).arg(&g32).arg(&mut out);
        self.launch(op, l, cfg_blocks(1))?;
        Ok(self.download_pod::<u64>(op, &out, 1)?[0] == 0)
    }
}

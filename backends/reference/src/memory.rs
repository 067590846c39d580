//! Buffers, host transfers and elementwise glue.

use dflash_core::{HostSlice, MemoryOps, Result, Tensor};
use rayon::prelude::*;

use crate::DEVICE;
use crate::ReferenceBackend;
use crate::storage::{host_tensor, same_shape, shape_err, slice, slice_mut};

/// Elements per rayon task for elementwise loops (big enough that splitting pays).
const ELEMWISE_CHUNK: usize = 1 << 14;

impl MemoryOps for ReferenceBackend {
    fn is_local(&self, t: &Tensor) -> bool {
        t.storage().as_any().is::<crate::HostStorage>()
    }
    fn upload(&self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        dflash_core::upload_numel(data.len(), shape).map_err(|e| shape_err("upload", e))?;
        Ok(host_tensor(data.to_vec(), shape))
    }

    /// Widened once, straight into the tensor's own storage (f32 is this backend's only
    /// format, so there is nothing to convert afterwards).
    fn upload_frozen(&self, data: HostSlice<'_>, shape: &[usize]) -> Result<Tensor> {
        data.check("upload_frozen", DEVICE, shape)?;
        Ok(host_tensor(data.to_f32_vec(), shape))
    }

    fn download(&self, t: &Tensor) -> Result<Vec<f32>> {
        Ok(slice("download", t)?.to_vec())
    }

    fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        // Checked: a wrapped product would make a tensor smaller than its shape says.
        let n = dflash_core::tensor::checked_numel("zeros", DEVICE, shape)?;
        Ok(host_tensor(vec![0.0; n], shape))
    }

    fn copy(&self, t: &Tensor) -> Result<Tensor> {
        Ok(host_tensor(slice("copy", t)?.to_vec(), t.shape().clone()))
    }

    fn narrow_rows(&self, t: &Tensor, start: usize, len: usize) -> Result<Tensor> {
        let x = slice("narrow_rows", t)?;
        let (row, dims) = dflash_core::narrow_rows_dims(t, start, len)
            .map_err(|e| shape_err("narrow_rows", e))?;
        Ok(host_tensor(
            x[start * row..(start + len) * row].to_vec(),
            dims,
        ))
    }

    fn scatter_rows(&self, dst: &mut Tensor, rows: &[usize], src: &Tensor) -> Result<()> {
        let op = "scatter_rows";
        let cols = dflash_core::scatter_rows_cols(op, crate::DEVICE, dst, rows, src)?;
        let s = slice(op, src)?;
        let d = slice_mut(op, dst)?;
        for (j, &r) in rows.iter().enumerate() {
            d[r * cols..(r + 1) * cols].copy_from_slice(&s[j * cols..(j + 1) * cols]);
        }
        Ok(())
    }

    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor> {
        let dims = dflash_core::concat_rows_dims(parts).map_err(|e| shape_err("concat_rows", e))?;
        let mut out = Vec::new();
        for p in parts {
            out.extend_from_slice(slice("concat_rows", p)?);
        }
        Ok(host_tensor(out, dims))
    }

    fn concat_cols(&self, parts: &[&Tensor]) -> Result<Tensor> {
        let (rows, cols) =
            dflash_core::concat_cols_dims(parts).map_err(|e| shape_err("concat_cols", e))?;
        let datas = parts
            .iter()
            .map(|p| slice("concat_cols", p))
            .collect::<Result<Vec<_>>>()?;
        let total: usize = cols.iter().sum();
        // out (R, sum C_i): row r is part 0's row r, then part 1's row r, ...
        let mut out = Vec::with_capacity(rows * total);
        for r in 0..rows {
            for (d, &c) in datas.iter().zip(&cols) {
                out.extend_from_slice(&d[r * c..(r + 1) * c]);
            }
        }
        Ok(host_tensor(out, [rows, total]))
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        same_shape("add", "a and b", a, b)?;
        let (x, y) = (slice("add", a)?, slice("add", b)?);
        let out = self.run(|| {
            x.par_iter()
                .zip(y)
                .map(|(p, q)| p + q)
                .collect::<Vec<f32>>()
        });
        Ok(host_tensor(out, a.shape().clone()))
    }

    fn add_assign(&self, acc: &mut Tensor, x: &Tensor) -> Result<()> {
        if acc.numel() != x.numel() {
            return Err(shape_err(
                "add_assign",
                format!(
                    "acc {:?} vs x {:?} (element counts differ)",
                    acc.shape(),
                    x.shape()
                ),
            ));
        }
        let x = slice("add_assign", x)?;
        let acc = slice_mut("add_assign", acc)?;
        self.run(|| {
            acc.par_chunks_mut(ELEMWISE_CHUNK)
                .zip(x.par_chunks(ELEMWISE_CHUNK))
                .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a += b))
        });
        Ok(())
    }

    fn scale_assign(&self, t: &mut Tensor, s: f32) -> Result<()> {
        let t = slice_mut("scale_assign", t)?;
        self.run(|| {
            t.par_chunks_mut(ELEMWISE_CHUNK)
                .for_each(|c| c.iter_mut().for_each(|v| *v *= s))
        });
        Ok(())
    }

    fn sum_squares(&self, t: &Tensor) -> Result<f64> {
        let x = slice("sum_squares", t)?;
        // Fixed chunks summed in order: the same bits on every run.
        let partial: Vec<f64> = self.run(|| {
            x.par_chunks(ELEMWISE_CHUNK)
                .map(|c| c.iter().map(|&v| v as f64 * v as f64).sum::<f64>())
                .collect()
        });
        Ok(partial.iter().sum())
    }

    fn all_finite(&self, t: &Tensor) -> Result<bool> {
        let x = slice("all_finite", t)?;
        Ok(self.run(|| x.par_iter().all(|v| v.is_finite())))
    }
}

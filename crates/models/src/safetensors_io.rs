//! Reading HF safetensors checkpoints (single file or sharded with an index) and writing
//! them atomically (temp file + rename).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use dflash_core::HostSlice;
use safetensors::{Dtype, SafeTensors};

use crate::error::{ModelError, Result, io_err};

/// A tensor's file, dtype and bytes (borrowed from the memory map), and shape.
type RawTensor<'a> = (&'a Path, (Dtype, &'a [u8]), Vec<usize>);

/// All tensors of a checkpoint directory, memory-mapped, looked up by name.
pub struct TensorFiles {
    dir: PathBuf,
    /// tensor name -> index into `maps`
    index: HashMap<String, usize>,
    maps: Vec<(PathBuf, memmap2::Mmap)>,
}

impl TensorFiles {
    /// Opens `dir/model.safetensors`, or the shards listed by `dir/model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(io_err(&index_path))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Checkpoint {
                    path: index_path.clone(),
                    detail: format!("invalid JSON: {e}"),
                })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Checkpoint {
                    path: index_path.clone(),
                    detail: "missing object field \"weight_map\"".into(),
                })?;
            let mut names: Vec<String> = map
                .values()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        Self::open_files(dir, files)
    }

    /// Opens one safetensors file.
    pub fn open_file(path: &Path) -> Result<Self> {
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Self::open_files(&dir, vec![path.to_path_buf()])
    }

    fn open_files(dir: &Path, files: Vec<PathBuf>) -> Result<Self> {
        let mut maps = Vec::new();
        let mut index = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(io_err(&path))?;
            // SAFETY: the checkpoint is treated as read-only for the lifetime of the map;
            // a concurrent writer would be a user error we cannot guard against anyway.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(&path))?;
            let st = SafeTensors::deserialize(&map).map_err(|e| ModelError::Checkpoint {
                path: path.clone(),
                detail: format!("not a valid safetensors file: {e}"),
            })?;
            for name in st.names() {
                index.insert(name.to_string(), maps.len());
            }
            maps.push((path, map));
        }
        Ok(TensorFiles {
            dir: dir.to_path_buf(),
            index,
            maps,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.index.keys().cloned().collect();
        v.sort();
        v
    }

    /// Reads tensor `name` as f32 (from f32, bf16 or f16), checking its shape.
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.view(name, shape)?.to_f32_vec())
    }

    /// Float tensor `name` as the file stores it (F32, BF16 or F16 bytes borrowed from the
    /// memory map, no copy), checking its shape: what
    /// [`dflash_core::MemoryOps::upload_frozen`] takes.
    pub fn view(&self, name: &str, shape: &[usize]) -> Result<HostSlice<'_>> {
        let (path, (dtype, bytes), actual) = self.raw(name)?;
        let err = |detail: String| ModelError::Tensor {
            path: path.to_path_buf(),
            name: name.into(),
            detail,
        };
        if actual != shape {
            return Err(err(format!("shape {actual:?}, expected {shape:?}")));
        }
        let data = match dtype {
            Dtype::F32 => HostSlice::F32(bytes),
            Dtype::BF16 => HostSlice::Bf16(bytes),
            Dtype::F16 => HostSlice::F16(bytes),
            other => {
                return Err(err(format!(
                    "dtype {other:?} is not a float type (F32, BF16, F16)"
                )));
            }
        };
        // The safetensors crate checks each tensor's byte length against its shape and dtype
        // when it parses the header; this guards the conversions against a future change.
        data.check("view", "host", shape)
            .map_err(|e| err(e.to_string()))?;
        Ok(data)
    }

    /// Reads an integer tensor (I64 or I32) as i64, with its shape.
    pub fn read_i64(&self, name: &str) -> Result<(Vec<i64>, Vec<usize>)> {
        let (path, (dtype, bytes), shape) = self.raw(name)?;
        let v = match dtype {
            Dtype::I64 => bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("chunk of 8")))
                .collect(),
            Dtype::I32 => bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("chunk of 4")) as i64)
                .collect(),
            other => {
                return Err(ModelError::Tensor {
                    path: path.to_path_buf(),
                    name: name.into(),
                    detail: format!("dtype {other:?} is not I64/I32"),
                });
            }
        };
        Ok((v, shape))
    }

    /// Shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.raw(name)?.2)
    }

    fn raw(&self, name: &str) -> Result<RawTensor<'_>> {
        let &i = self.index.get(name).ok_or_else(|| ModelError::Tensor {
            path: self.dir.clone(),
            name: name.into(),
            detail: "missing from the checkpoint".into(),
        })?;
        let (path, map) = &self.maps[i];
        let st = SafeTensors::deserialize(map).map_err(|e| ModelError::Checkpoint {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        let view = st.tensor(name).map_err(|e| ModelError::Tensor {
            path: path.clone(),
            name: name.into(),
            detail: e.to_string(),
        })?;
        let shape = view.shape().to_vec();
        let dtype = view.dtype();
        // The view borrows from `map`, which lives as long as `self`.
        let data: &[u8] = view.data();
        Ok((path, (dtype, data), shape))
    }
}

/// Writes f32 tensors to `path` atomically: a temp file in the same directory, then rename.
pub fn write_f32_atomic(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    write_tensors_atomic(path, tensors, Dtype::F32, metadata)
}

/// Writes f32 host tensors to `path` atomically, stored as `dtype` (F32, or BF16 / F16 rounded
/// to nearest even, as `torch.Tensor.to` does).
pub fn write_tensors_atomic(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    dtype: Dtype,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let encode = |d: &[f32]| -> Option<Vec<u8>> {
        Some(match dtype {
            Dtype::F32 => d.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Dtype::BF16 => d
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
            Dtype::F16 => d
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            _ => return None,
        })
    };
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(name, _, d)| {
            encode(d).ok_or_else(|| ModelError::Tensor {
                path: path.to_path_buf(),
                name: name.clone(),
                detail: format!("cannot store tensors as {dtype:?} (F32, BF16 or F16)"),
            })
        })
        .collect::<Result<_>>()?;
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            safetensors::tensor::TensorView::new(dtype, shape.clone(), b)
                .map(|v| (name.clone(), v))
                .map_err(|e| ModelError::Tensor {
                    path: path.to_path_buf(),
                    name: name.clone(),
                    detail: e.to_string(),
                })
        })
        .collect::<Result<_>>()?;
    let data = safetensors::serialize(views, metadata).map_err(|e| ModelError::Checkpoint {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    write_atomic(path, &data)
}

/// Temp file + fsync + rename: a crash mid-write never leaves a torn `path`.
///
/// The temp name is unique per call (process id and a process-wide counter), so threads that
/// write the same path at once each rename a whole file of their own: the last rename wins and
/// no writer can truncate another's temp file.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let serial = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{file_name}.tmp-{}-{serial}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(data).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(io_err(path))
    })();
    if result.is_err() {
        // A failed write (disk full, target is a directory, ...) must not leave its temp file.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

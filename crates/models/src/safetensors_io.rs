//! Reading HF safetensors checkpoints (single file or sharded with an index) and writing
//! them atomically (temp file + rename).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use dflash_core::HostSlice;
pub use safetensors::Dtype;
use safetensors::SafeTensors;

use crate::error::{ModelError, Result, io_err};
use crate::finite::{first_non_finite, load_check_enabled};

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
            let mut listed: Vec<(String, PathBuf)> = Vec::with_capacity(map.len());
            for (tensor, file) in map {
                let file = file.as_str().ok_or_else(|| ModelError::Checkpoint {
                    path: index_path.clone(),
                    detail: format!("weight_map[{tensor:?}] is {file}, not a file name"),
                })?;
                listed.push((tensor.clone(), dir.join(file)));
            }
            let mut names: Vec<PathBuf> = listed.iter().map(|(_, f)| f.clone()).collect();
            names.sort();
            names.dedup();
            let files = Self::open_files(dir, names)?;
            files.check_weight_map(&index_path, &listed)?;
            return Ok(files);
        } else {
            vec![dir.join("model.safetensors")]
        };
        Self::open_files(dir, files)
    }

    /// Every tensor the index lists is in the shard it names: loaders (transformers, vLLM)
    /// read each tensor where the index says, so a checkpoint that disagrees with its index
    /// would train on other weights than serving uses.
    fn check_weight_map(&self, index_path: &Path, listed: &[(String, PathBuf)]) -> Result<()> {
        for (tensor, file) in listed {
            let found = self.index.get(tensor).map(|&i| &self.maps[i].0);
            if found != Some(file) {
                return Err(ModelError::Checkpoint {
                    path: index_path.to_path_buf(),
                    detail: format!(
                        "weight_map puts {tensor:?} in {}, but {}",
                        file.display(),
                        match found {
                            Some(f) => format!("it is in {}", f.display()),
                            None => "no shard the index lists holds it".to_string(),
                        }
                    ),
                });
            }
        }
        Ok(())
    }

    /// Opens one safetensors file.
    pub fn open_file(path: &Path) -> Result<Self> {
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Self::open_files(&dir, vec![path.to_path_buf()])
    }

    fn open_files(dir: &Path, files: Vec<PathBuf>) -> Result<Self> {
        let mut maps: Vec<(PathBuf, memmap2::Mmap)> = Vec::new();
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
                if let Some(earlier) = index.insert(name.to_string(), maps.len()) {
                    let first: &PathBuf = &maps[earlier].0;
                    return Err(ModelError::Checkpoint {
                        path: path.clone(),
                        detail: format!(
                            "tensor {name:?} is also in {}: one checkpoint holds each tensor once",
                            first.display()
                        ),
                    });
                }
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
    /// memory map, no copy), checking its shape and that every value is finite
    /// ([`ModelError::NonFinite`] names the first that is not): what
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
        if let Some((index, value)) = load_check_enabled()
            .then(|| first_non_finite(&data))
            .flatten()
        {
            return Err(ModelError::NonFinite {
                path: path.to_path_buf(),
                name: name.into(),
                index: unravel(index, shape),
                value,
            });
        }
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

/// The multi-index of flat row-major index `i` in `shape`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut at = vec![0; shape.len()];
    for (a, &n) in at.iter_mut().zip(shape).rev() {
        *a = i % n.max(1);
        i /= n.max(1);
    }
    at
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
    let entries: Vec<(String, Vec<usize>)> = tensors
        .iter()
        .map(|(name, shape, _)| (name.clone(), shape.clone()))
        .collect();
    write_tensors_streaming(path, &entries, dtype, metadata, &|i| {
        Ok(tensors[i].2.clone())
    })
}

/// Writes the tensors `entries` (name, shape) to `path` as `dtype` in the safetensors format,
/// fetching each one's f32 values with `fetch(index)` only shortly before it is written: host
/// memory holds a few tensors at a time, not the file (a checkpoint of the 8B recipe's drafter
/// and its AdamW moments is 12.6 GB). A second thread fetches and encodes the next tensor
/// while the current one goes to disk, and the file is flushed as it grows (`sync_data` every
/// [`FLUSH_BYTES`]), so device downloads overlap the disk's writeback instead of the whole file
/// waiting for one fsync at the end. Atomic and durable: a temp file in the same directory,
/// fsync, then rename.
pub fn write_tensors_streaming(
    path: &Path,
    entries: &[(String, Vec<usize>)],
    dtype: Dtype,
    metadata: Option<HashMap<String, String>>,
    fetch: &(dyn Fn(usize) -> Result<Vec<f32>> + Sync),
) -> Result<()> {
    let header = header_bytes(path, entries, dtype, metadata)?;
    let encode = |i: usize| -> Result<Vec<u8>> {
        let (name, shape) = &entries[i];
        let data = fetch(i)?;
        let numel: usize = shape.iter().product();
        if data.len() != numel {
            return Err(ModelError::Tensor {
                path: path.to_path_buf(),
                name: name.clone(),
                detail: format!(
                    "{} values for shape {shape:?} ({numel} expected)",
                    data.len()
                ),
            });
        }
        Ok(encode_f32(&data, dtype))
    };
    std::thread::scope(|s| {
        // One encoded tensor waits while the next is fetched: at most three in memory.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>>>(1);
        s.spawn(move || {
            for i in 0..entries.len() {
                if tx.send(encode(i)).is_err() {
                    break; // the writer stopped (an error): nothing more to fetch
                }
            }
        });
        with_temp_file(path, |tmp| {
            use std::io::Write;
            let mut f = File::create(tmp).map_err(io_err(tmp))?;
            f.write_all(&(header.len() as u64).to_le_bytes())
                .and_then(|()| f.write_all(&header))
                .map_err(io_err(tmp))?;
            let mut unflushed = 0;
            for i in 0..entries.len() {
                let bytes = rx.recv().map_err(|_| ModelError::Checkpoint {
                    path: path.to_path_buf(),
                    detail: "the thread fetching tensors ended early".into(),
                })??;
                f.write_all(&bytes).map_err(io_err(tmp))?;
                if i == 0 {
                    crate::fault::file_point("stream", path);
                }
                unflushed += bytes.len();
                if unflushed >= FLUSH_BYTES {
                    f.sync_data().map_err(io_err(tmp))?;
                    unflushed = 0;
                }
            }
            f.sync_all().map_err(io_err(tmp))
        })
    })
}

/// How much a streamed file may grow before it is flushed to disk.
pub const FLUSH_BYTES: usize = 64 << 20;

/// The safetensors header of `entries` stored as `dtype`, in file order: JSON with each
/// tensor's dtype, shape and byte range, padded with spaces to a multiple of 8 bytes.
fn header_bytes(
    path: &Path,
    entries: &[(String, Vec<usize>)],
    dtype: Dtype,
    metadata: Option<HashMap<String, String>>,
) -> Result<Vec<u8>> {
    let (tag, bytes) = match dtype {
        Dtype::F32 => ("F32", 4),
        Dtype::BF16 => ("BF16", 2),
        Dtype::F16 => ("F16", 2),
        other => {
            return Err(ModelError::Checkpoint {
                path: path.to_path_buf(),
                detail: format!("cannot store tensors as {other:?} (F32, BF16 or F16)"),
            });
        }
    };
    let mut map = serde_json::Map::new();
    if let Some(m) = metadata {
        map.insert("__metadata__".into(), serde_json::json!(m));
    }
    let mut offset = 0usize;
    for (name, shape) in entries {
        let n = shape.iter().product::<usize>() * bytes;
        let info =
            serde_json::json!({"dtype": tag, "shape": shape, "data_offsets": [offset, offset + n]});
        if name == "__metadata__" || map.insert(name.clone(), info).is_some() {
            return Err(ModelError::Tensor {
                path: path.to_path_buf(),
                name: name.clone(),
                detail: "named twice (or reserved)".into(),
            });
        }
        offset += n;
    }
    let mut header = serde_json::to_vec(&map).expect("a JSON map serialises");
    header.resize(header.len().next_multiple_of(8), b' ');
    Ok(header)
}

/// Little-endian bytes of `data` stored as `dtype` (F32, BF16 or F16; checked by the caller).
fn encode_f32(data: &[f32], dtype: Dtype) -> Vec<u8> {
    let halves = |bits: Vec<u16>| -> Vec<u8> {
        match cfg!(target_endian = "little") {
            true => bytemuck::cast_slice(&bits).to_vec(),
            false => bits.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    };
    match dtype {
        Dtype::BF16 => halves(
            data.iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect(),
        ),
        Dtype::F16 => halves(
            data.iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect(),
        ),
        _ => match cfg!(target_endian = "little") {
            true => bytemuck::cast_slice(data).to_vec(),
            false => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        },
    }
}

/// Temp file + fsync + rename: a crash mid-write never leaves a torn `path`.
///
/// The temp name is unique per call (process id and a process-wide counter), so threads that
/// write the same path at once each rename a whole file of their own: the last rename wins and
/// no writer can truncate another's temp file.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    with_temp_file(path, |tmp| {
        let mut f = File::create(tmp).map_err(io_err(tmp))?;
        f.write_all(data).map_err(io_err(tmp))?;
        f.sync_all().map_err(io_err(tmp))
    })
}

/// Whether `name` is a temp file of [`write_atomic`] or the tensor writers: what a write
/// killed before its rename leaves behind.
pub fn is_temp_file(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp-")
}

/// Runs `write(tmp)` with a fresh temp path next to `path`, then renames the temp file onto
/// `path`; on failure removes the temp file (a full disk must not leave it behind).
fn with_temp_file(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
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
    let result = write(&tmp).and_then(|()| {
        crate::fault::file_point("write", path);
        std::fs::rename(&tmp, path).map_err(io_err(path))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    // The rename lives in the directory: until it is on disk, a power loss can bring back the
    // old file (or none) after the caller has gone on as if the new one were published.
    sync_dir(dir)
}

/// Flushes directory `dir`'s entries (renames, new and removed files) to disk, so that what
/// they name survives a power loss; call it after a rename that publishes something and
/// before removing what it replaces. A missing directory is an error; a filesystem that
/// refuses to sync one (some FUSE and network filesystems answer EOPNOTSUPP, EACCES or EIO)
/// gets a warning, printed once: the data is written and renamed, and nothing more can be
/// done there. A no-op off Unix.
pub fn sync_dir(dir: &Path) -> Result<()> {
    // The parent of a bare file name is "": the current directory.
    let dir = match dir.as_os_str().is_empty() {
        true => Path::new("."),
        false => dir,
    };
    #[cfg(test)]
    tests::record_sync(dir);
    #[cfg(unix)]
    {
        let d = File::open(dir).map_err(io_err(dir))?;
        if let Err(e) = d.sync_all() {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "warning: {}: the filesystem does not sync directories ({e}); a power loss \
                     may undo the last renames",
                    dir.display()
                )
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::path::{Path, PathBuf};

    thread_local! {
        /// Each directory this thread synced, with the names it held at that moment.
        static SYNCED: RefCell<Vec<(PathBuf, Vec<String>)>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn record_sync(dir: &Path) {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        SYNCED.with(|s| s.borrow_mut().push((dir.to_path_buf(), names)));
    }

    fn take_synced() -> Vec<(PathBuf, Vec<String>)> {
        SYNCED.with(|s| std::mem::take(&mut *s.borrow_mut()))
    }

    /// Every atomic write syncs its directory after its rename: the sync sees the new name
    /// and no temp file, and the file holds the new bytes.
    #[test]
    fn an_atomic_write_syncs_its_directory_after_the_rename() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sub");
        let path = dir.join("latest");
        take_synced();
        super::write_atomic(&path, b"step-3").unwrap();
        let synced = take_synced();
        assert_eq!(synced, vec![(dir.clone(), vec!["latest".to_string()])]);
        super::write_atomic(&path, b"step-4").unwrap();
        assert_eq!(take_synced().len(), 1, "a rewrite syncs again");
        assert_eq!(std::fs::read(&path).unwrap(), b"step-4");

        // Tensor files take the same path.
        let t = dir.join("model.safetensors");
        super::write_f32_atomic(&t, &[("w".into(), vec![2], vec![1.0, 2.0])], None).unwrap();
        let synced = take_synced();
        assert_eq!(synced.len(), 1);
        assert!(synced[0].1.contains(&"model.safetensors".to_string()));
        assert!(!synced[0].1.iter().any(|n| super::is_temp_file(n)));
    }

    /// A directory that does not exist is an error naming it; a real one syncs, and so does
    /// the current one, as the parent of a bare file name ("").
    #[test]
    fn sync_dir_names_a_missing_directory() {
        let tmp = tempfile::tempdir().unwrap();
        super::sync_dir(tmp.path()).unwrap();
        super::sync_dir(Path::new("summary.json").parent().unwrap()).unwrap();
        let gone = tmp.path().join("gone");
        let e = super::sync_dir(&gone).unwrap_err().to_string();
        assert!(e.contains("gone"), "{e}");
    }
}

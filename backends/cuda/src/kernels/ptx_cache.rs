//! PTX kept on disk between processes, so that a restarted job loads its kernels instead of
//! compiling them again (NVRTC takes about 4 s for the flash attention alone).
//!
//! - **Where**: `DFLASH_CUDA_KERNEL_CACHE` names the directory (`0` or `off` turns the cache
//!   off); by default `$XDG_CACHE_HOME/dflash/kernels`, else `$HOME/.cache/dflash/kernels`,
//!   else no cache.
//! - **Key**: an entry is named by the file, the architecture and a 128-bit hash of
//!   everything that decides the PTX: the full source, the NVRTC options, NVRTC's version and
//!   the cache's format. A change to any of them is a miss, never a stale hit; nothing is
//!   ever invalidated in place.
//! - **Integrity**: an entry ends with a comment line holding the hash of the PTX above it,
//!   and is written to a temporary file in the same directory and renamed, so a reader sees
//!   either a whole entry or none. An entry that fails its check is a miss, compiled and
//!   written again.
//! - **Failure is not an error**: a cache that cannot be read or written costs the
//!   compilation it would have saved, said once on stderr; the job goes on.

use std::io::Write;
use std::path::{Path, PathBuf};

use twox_hash::XxHash3_128;

/// Bumped when what an entry holds, or how its key is made, changes.
const FORMAT: &str = "dflash-ptx-cache-1";

/// The prefix of an entry's last line, followed by the hash of the PTX above it.
const CHECK_PREFIX: &str = "// dflash-ptx-cache check ";

/// A directory of PTX entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxCache {
    dir: PathBuf,
}

impl PtxCache {
    /// The cache at `dir` (created on the first write).
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        PtxCache { dir: dir.into() }
    }

    /// The cache the environment asks for (see the module's documentation), or `None`.
    pub fn from_env() -> Option<Self> {
        Self::resolve(
            std::env::var_os("DFLASH_CUDA_KERNEL_CACHE"),
            std::env::var_os("XDG_CACHE_HOME"),
            std::env::var_os("HOME"),
        )
    }

    fn resolve(
        explicit: Option<std::ffi::OsString>,
        xdg: Option<std::ffi::OsString>,
        home: Option<std::ffi::OsString>,
    ) -> Option<Self> {
        let non_empty = |v: Option<std::ffi::OsString>| v.filter(|v| !v.is_empty());
        if let Some(v) = non_empty(explicit) {
            return match v.to_str() {
                Some("0" | "off") => None,
                _ => Some(Self::at(v)),
            };
        }
        let base = match non_empty(xdg) {
            Some(x) => PathBuf::from(x),
            None => PathBuf::from(non_empty(home)?).join(".cache"),
        };
        Some(Self::at(base.join("dflash").join("kernels")))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the entry of `file` for `arch` under `key` lives.
    pub fn entry(&self, file: &str, arch: &str, key: u128) -> PathBuf {
        let stem = file.strip_suffix(".cu").unwrap_or(file);
        self.dir.join(format!("{stem}-{arch}-{key:032x}.ptx"))
    }

    /// The PTX at `path` where it is a whole entry; `None` where it is absent or fails its
    /// check (a torn or edited file).
    pub fn read(path: &Path) -> Option<String> {
        let text = std::fs::read_to_string(path).ok()?;
        let body = text.strip_suffix('\n')?;
        let (ptx, last) = body.rsplit_once('\n')?;
        let want = last.strip_prefix(CHECK_PREFIX)?;
        (format!("{:032x}", hash_parts(&[ptx.as_bytes()])) == want).then(|| ptx.to_string())
    }

    /// Writes `ptx` as the entry at `path`: to a temporary file beside it, then renamed over
    /// it, so that a concurrent reader sees the old entry, the new one or none.
    pub fn write(path: &Path, ptx: &str) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        let check = hash_parts(&[ptx.as_bytes()]);
        write!(tmp, "{ptx}\n{CHECK_PREFIX}{check:032x}\n")?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }

    /// The entry of `file` for `arch` under `key` where the cache holds one; else `compile()`,
    /// written to the cache when it succeeds. A failed write is said once and costs nothing
    /// else.
    pub fn get_or_compile<E>(
        &self,
        file: &str,
        arch: &str,
        key: u128,
        compile: impl FnOnce() -> Result<String, E>,
    ) -> Result<String, E> {
        let path = self.entry(file, arch, key);
        if let Some(ptx) = Self::read(&path) {
            return Ok(ptx);
        }
        let ptx = compile()?;
        if let Err(e) = Self::write(&path, &ptx) {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "dflash-backend-cuda: cannot keep compiled kernels in {} ({e}); they will \
                     be compiled again next start (DFLASH_CUDA_KERNEL_CACHE picks another \
                     directory, `off` turns the cache off)",
                    self.dir.display()
                )
            });
        }
        Ok(ptx)
    }
}

/// The key of an entry: a hash of the cache's format and `parts` (source, options, compiler
/// version), each length-prefixed so that no two lists of parts run together alike.
pub fn key(parts: &[&[u8]]) -> u128 {
    let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
    all.push(FORMAT.as_bytes());
    all.extend_from_slice(parts);
    hash_parts(&all)
}

fn hash_parts(parts: &[&[u8]]) -> u128 {
    let mut h = XxHash3_128::new();
    for p in parts {
        h.write(&(p.len() as u64).to_le_bytes());
        h.write(p);
    }
    h.finish_128()
}

#[cfg(test)]
mod tests;

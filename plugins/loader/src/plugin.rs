//! Opening a plugin: the library, its entry point, and the checks on the table it returns.

use std::ffi::{CStr, c_char};
use std::path::Path;

use dflash_attention_abi::{
    ABI_MAJOR, ABI_MINOR, CAP_BACKWARD, CAPABILITIES_SIZE_V1_0, DfAttnCapabilities, DfAttnPlugin,
    ENTRY_POINT, EntryPointFn, PLUGIN_SIZE_V1_0, read_prefix,
};

use dflash_core::AttnDims;
use dflash_core::mask::BlockMask;

use crate::PluginError;

/// An opened plugin: its table, checked, and the library that table lives in. The library is
/// unloaded only when the last [`crate::PluginKernel`] holding this (through an `Arc`) is gone,
/// so no pointer the plugin handed out outlives it.
pub struct Plugin {
    /// How errors name the plugin: its path (or label) and, once known, its name.
    label: String,
    name: String,
    version: String,
    caps: DfAttnCapabilities,
    /// The plugin's own table: what its functions get as `self`.
    table: *const DfAttnPlugin,
    /// The fields of `table` its `struct_size` covers (zero past them): what the host reads.
    fields: DfAttnPlugin,
    /// The library's canonical path; `None` for a table linked into this process.
    file: Option<std::path::PathBuf>,
    /// Declared last so it drops last; `None` for a table linked into this process.
    _library: Option<libloading::Library>,
}

// The table is immutable data of the library, which this struct keeps loaded; the ABI requires
// a plugin's functions to be callable from any thread.
unsafe impl Send for Plugin {}
unsafe impl Sync for Plugin {}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("label", &self.label)
            .field("name", &self.name)
            .field("version", &self.version)
            .field("caps", &self.caps)
            .finish()
    }
}

/// A C string the plugin owns, copied; `None` for null.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
pub(crate) unsafe fn c_string(p: *const c_char) -> Option<String> {
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl Plugin {
    /// Loads the shared library at `path` and opens the plugin it exports. A library this
    /// process already has loaded (under any spelling of its path) is the same library: the
    /// OS counts the references, and its entry point is called again, returning the same
    /// table.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PluginError> {
        let path = path.as_ref();
        let label = path.display().to_string();
        // SAFETY: loading runs the library's initialisers; that a plugin's are sound is what
        // loading a plugin means.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| PluginError::Load {
            plugin: label.clone(),
            reason: e.to_string(),
        })?;
        // SAFETY: the header fixes the symbol's type.
        let entry: EntryPointFn = unsafe {
            *library
                .get::<EntryPointFn>(ENTRY_POINT.as_bytes())
                .map_err(|e| PluginError::MissingSymbol {
                    plugin: label.clone(),
                    symbol: ENTRY_POINT,
                    reason: e.to_string(),
                })?
        };
        // SAFETY: `entry` is the plugin's entry point, called as the header says.
        let mut plugin = unsafe { Self::open(label, entry, Some(library)) }?;
        plugin.file = std::fs::canonicalize(path).ok();
        Ok(plugin)
    }

    /// Opens a plugin whose entry point is linked into this process (a Rust plugin crate used
    /// as an rlib), under `label`.
    ///
    /// # Safety
    /// `entry` must behave as the header's `dflash_attention_plugin`.
    pub unsafe fn from_entry(label: &str, entry: EntryPointFn) -> Result<Self, PluginError> {
        unsafe { Self::open(label.to_string(), entry, None) }
    }

    unsafe fn open(
        label: String,
        entry: EntryPointFn,
        library: Option<libloading::Library>,
    ) -> Result<Self, PluginError> {
        let version_err = |detail: String| PluginError::Version {
            plugin: label.clone(),
            host_major: ABI_MAJOR,
            host_minor: ABI_MINOR,
            detail,
        };
        let malformed = |detail: &str| PluginError::Malformed {
            plugin: label.clone(),
            detail: detail.to_string(),
        };
        let table = unsafe { entry(ABI_MAJOR, ABI_MINOR) };
        if table.is_null() {
            return Err(version_err(
                "the plugin refused it (its entry point returned NULL)".into(),
            ));
        }
        // The first three fields are stable across every version: read them before the rest.
        let (size, major, minor) = unsafe {
            let t = table.cast::<u32>();
            (*t, *t.add(1), *t.add(2))
        };
        if major != ABI_MAJOR {
            return Err(version_err(format!("the plugin speaks {major}.{minor}")));
        }
        // Against the 1.0 size, not size_of: a 1.0 plugin's table stays valid for every 1.x
        // host, whose own table type may have grown; fields it lacks read as zero / None.
        if size < PLUGIN_SIZE_V1_0 {
            return Err(malformed(&format!(
                "struct_size {size} < {PLUGIN_SIZE_V1_0} (the {ABI_MAJOR}.0 table)"
            )));
        }
        // SAFETY: the table holds `size` bytes, at least the 1.0 fields.
        let fields = unsafe { read_prefix(table, size) };
        let t = &fields;
        let name = unsafe { c_string(t.name) }.ok_or_else(|| malformed("name is NULL"))?;
        let version = unsafe { c_string(t.version) }.ok_or_else(|| malformed("version is NULL"))?;
        if t.capabilities.is_null() {
            return Err(malformed("capabilities is NULL"));
        }
        let caps_size = unsafe { (*t.capabilities).struct_size };
        if caps_size < CAPABILITIES_SIZE_V1_0 {
            return Err(malformed(&format!(
                "capabilities.struct_size {caps_size} < {CAPABILITIES_SIZE_V1_0} (the {ABI_MAJOR}.0 \
                 capabilities)"
            )));
        }
        // SAFETY: the capabilities hold `caps_size` bytes.
        let caps = unsafe { read_prefix(t.capabilities, caps_size) };
        for (missing, what) in [
            (t.workspace_bytes.is_none(), "workspace_bytes"),
            (t.forward.is_none(), "forward"),
            (t.last_error.is_none(), "last_error"),
            (
                t.backward.is_none() && caps.flags & CAP_BACKWARD != 0,
                "backward (declared by CAP_BACKWARD)",
            ),
        ] {
            if missing {
                return Err(malformed(&format!("function {what} is NULL")));
            }
        }
        Ok(Plugin {
            label: format!("{name} {version} ({label})"),
            name,
            version,
            caps,
            table,
            fields,
            file: None,
            _library: library,
        })
    }

    /// The plugin's own name (from its table).
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn version(&self) -> &str {
        &self.version
    }
    /// How errors name the plugin: `name version (path)`.
    pub fn label(&self) -> &str {
        &self.label
    }
    pub fn capabilities(&self) -> &DfAttnCapabilities {
        &self.caps
    }
    /// The library's canonical path (`None` for a table linked into this process).
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }
    /// The checked table's fields as this host reads them (those its `struct_size` covers;
    /// zero / `None` past them), for callers that drive the ABI themselves (the conformance
    /// suite's malformed calls). Its functions take [`Plugin::raw_table`] as `self`, not this.
    pub fn table(&self) -> &DfAttnPlugin {
        &self.fields
    }
    /// The plugin's own table, to pass as `self` to its functions. Valid while `self` lives.
    pub fn raw_table(&self) -> *const DfAttnPlugin {
        self.table
    }

    /// What a forward (or, with `backward`, a backward) of `dims` over `mask` needs that the
    /// plugin does not declare (`"head dim 80 (it declares ...)"`), or `None`: the check every
    /// call passes before the plugin sees it.
    pub fn missing_capability(
        &self,
        backward: bool,
        dims: &AttnDims,
        mask: &BlockMask,
    ) -> Option<String> {
        let call = if backward { "backward" } else { "forward" };
        crate::calls::missing(self, call, dims, mask)
    }

    /// The calling thread's last error message from the plugin.
    pub fn last_error(&self) -> String {
        let t = self.table();
        match t.last_error {
            // SAFETY: a plugin function, called as the header says.
            Some(f) => unsafe { c_string(f(self.table)) }
                .unwrap_or_else(|| "(last_error returned NULL)".into()),
            None => "(no last_error)".into(),
        }
    }

    /// `Ok` for status 0, else the typed error naming `call` with the plugin's message.
    pub fn check_status(&self, call: &'static str, status: i32) -> Result<(), PluginError> {
        if status == 0 {
            return Ok(());
        }
        Err(PluginError::Status {
            plugin: self.label.clone(),
            call,
            status,
            name: dflash_attention_abi::status_name(status),
            message: self.last_error(),
        })
    }
}

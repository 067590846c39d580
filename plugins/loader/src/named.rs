//! Plugins registered under their own names (a `[plugins] paths` list): each library is loaded
//! once, kept for the process's lifetime, and its kernel is then selected like an in-tree one
//! (`backend.attention = "c-attention"`).

use std::path::Path;
use std::sync::{Arc, Mutex};

use dflash_core::AttentionKernel;

use crate::{Plugin, PluginError};

static REGISTERED: Mutex<Vec<Arc<Plugin>>> = Mutex::new(Vec::new());

fn registered() -> std::sync::MutexGuard<'static, Vec<Arc<Plugin>>> {
    // A panic elsewhere while holding the lock leaves the list itself intact.
    REGISTERED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The names of the in-tree device kernels (`backends/cuda`, `backends/wgpu`), reserved
/// whether or not their backend is linked: a backend selects its own kernels by name before
/// asking the registry, so a plugin under one of these names would be silently ignored there,
/// and the loader does not depend on the backends to see their registrations. Kept equal to
/// the backends' registrations by `tests/device_names.rs`, which links them.
pub const DEVICE_KERNEL_NAMES: &[&str] = &["cuda-flash", "cuda-simple", "wgpu-tiled"];

/// Names no plugin may take: the host kernels and other kernel sources' names, the device
/// kernels of every linked backend, and [`DEVICE_KERNEL_NAMES`].
fn taken_names() -> Vec<String> {
    let mut names = dflash_core::registry::attention_kernel_names();
    let device = dflash_core::registry::attention_kernels()
        .into_iter()
        .filter(|k| k.backend.is_some())
        .map(|k| k.name);
    names.extend(
        device
            .chain(DEVICE_KERNEL_NAMES.iter().copied())
            .map(str::to_string),
    );
    names
}

/// Loads each library of `paths` and registers its kernel under the plugin's own name;
/// returns the names. Registering the same library again (under any spelling of its path) is
/// a no-op; a name already taken (by an in-tree kernel, host or device, or another library) is
/// an error naming both.
pub fn register_paths(paths: &[impl AsRef<Path>]) -> Result<Vec<String>, PluginError> {
    paths
        .iter()
        .map(|path| register(Arc::new(Plugin::load(path.as_ref())?)))
        .collect()
}

/// Registers one opened plugin under its own name (see [`register_paths`]).
fn register(plugin: Arc<Plugin>) -> Result<String, PluginError> {
    crate::kernel_of(plugin.clone())?;
    let name = plugin.name().to_string();
    // Before taking the lock: the list of sources' names includes this one's.
    let in_tree = taken_names();
    let mut list = registered();
    match list.iter().find(|p| p.name() == name) {
        // One library loaded twice is one file and hands out one table (an entry point
        // that makes a new table each call still names the same file), whatever path
        // spelled it; a copy of the file is another library.
        Some(p)
            if std::ptr::eq(p.raw_table(), plugin.raw_table())
                || (p.file().is_some() && p.file() == plugin.file()) => {}
        Some(p) => {
            return Err(PluginError::NameTaken {
                plugin: plugin.label().to_string(),
                name,
                by: p.label().to_string(),
            });
        }
        None if in_tree.contains(&name) => {
            return Err(PluginError::NameTaken {
                plugin: plugin.label().to_string(),
                name,
                by: "an in-tree kernel".into(),
            });
        }
        None => list.push(plugin),
    }
    Ok(name)
}

pub(crate) fn names() -> Vec<String> {
    registered().iter().map(|p| p.name().to_string()).collect()
}

pub(crate) fn create(name: &str) -> dflash_core::Result<AttentionKernel> {
    let plugin = registered().iter().find(|p| p.name() == name).cloned();
    let plugin = plugin.ok_or_else(|| dflash_core::Error::UnknownName {
        kind: "registered attention plugin",
        name: name.to_string(),
        available: names(),
    })?;
    Ok(crate::kernel_of(plugin)?)
}

#[cfg(test)]
mod tests {
    use dflash_attention_abi as abi;

    use super::*;

    /// The Rust example's table under the name of the CUDA backend's flash kernel.
    unsafe extern "C" fn named_cuda_flash(major: u32, minor: u32) -> *const abi::DfAttnPlugin {
        let inner = unsafe { &*dflash_plugin_rust_tiled::dflash_attention_plugin(major, minor) };
        Box::leak(Box::new(abi::DfAttnPlugin {
            name: c"cuda-flash".as_ptr(),
            ..*inner
        }))
    }

    #[test]
    fn a_plugin_taking_a_device_kernels_name_is_refused() {
        // The CUDA backend is not linked here: the name is reserved all the same.
        let plugin = unsafe { Plugin::from_entry("fake", named_cuda_flash) }.unwrap();
        let err = register(Arc::new(plugin)).unwrap_err();
        assert!(
            matches!(&err, PluginError::NameTaken { name, .. } if name == "cuda-flash"),
            "{err}"
        );
        assert!(!names().contains(&"cuda-flash".to_string()));
    }
}

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

/// Loads each library of `paths` and registers its kernel under the plugin's own name;
/// returns the names. Registering the same library again (under any spelling of its path) is
/// a no-op; a name already taken (by an in-tree kernel or another library) is an error naming
/// both.
pub fn register_paths(paths: &[impl AsRef<Path>]) -> Result<Vec<String>, PluginError> {
    let mut names = Vec::new();
    for path in paths {
        let plugin = Arc::new(Plugin::load(path.as_ref())?);
        crate::kernel_of(plugin.clone())?;
        let name = plugin.name().to_string();
        let in_tree = dflash_core::registry::attention_kernel_names();
        let mut list = registered();
        match list.iter().find(|p| p.name() == name) {
            // One library loaded twice is one file and hands out one table (an entry point
            // that makes a new table each call still names the same file), whatever path
            // spelled it; a copy of the file is another library.
            Some(p)
                if std::ptr::eq(p.table(), plugin.table())
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
        names.push(name);
    }
    Ok(names)
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

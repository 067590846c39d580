//! The host side of the attention plugin ABI (`dflash-attention-abi`): [`Plugin::load`] opens a
//! shared library and checks the table its entry point returns (symbol, ABI major, struct
//! sizes, required functions); [`PluginKernel`] serves it as a [`HostAttentionKernel`] of any
//! backend, checking each call against the declared capabilities and turning a non-zero
//! status into a [`PluginError`] naming the plugin, the call and the plugin's `last_error`.
//!
//! Registered as the kernel source `plugin:`: `backend.attention = "plugin:PATH"` loads the
//! library at `PATH`; [`register_paths`] (a `[plugins] paths` list) registers plugins under
//! their own names.
//!
//! [`HostAttentionKernel`]: dflash_core::HostAttentionKernel

mod error;
mod host;
mod kernel;
mod named;
mod plugin;

use dflash_core::HostAttentionKernel;
use dflash_core::registry::AttentionKernelSource;

pub use error::PluginError;
pub use host::{HostMask, HostTensor, Workspace};
pub use kernel::PluginKernel;
pub use named::register_paths;
pub use plugin::Plugin;

/// The prefix of a plugin kernel's name in `backend.attention`.
pub const PREFIX: &str = "plugin:";

/// Name this from a binary to keep the crate (and its `plugin:` source) linked.
pub fn link() {}

fn create(path: &str) -> dflash_core::Result<Box<dyn HostAttentionKernel>> {
    Ok(Box::new(PluginKernel::load(path)?))
}

inventory::submit! {
    AttentionKernelSource {
        prefix: PREFIX,
        description: "a foreign kernel loaded through the C ABI from the shared library PATH",
        create,
        named: named::names,
        create_named: named::create,
    }
}

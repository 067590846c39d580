//! The host side of the attention plugin ABI (`dflash-attention-abi`): [`Plugin::load`] opens a
//! shared library and checks the table its entry point returns (symbol, ABI major, struct
//! sizes, required functions); [`PluginKernel`] serves it as a [`HostAttentionKernel`] of any
//! backend, checking each call against the declared capabilities and turning a non-zero
//! status into a [`PluginError`] naming the plugin, the call and the plugin's `last_error`.
//!
//! A plugin declaring CUDA is served as a [`DevicePluginKernel`] instead, which the CUDA backend
//! calls with device addresses and its stream.
//!
//! Registered as the kernel source `plugin:`: `backend.attention = "plugin:PATH"` loads the
//! library at `PATH`; [`register_paths`] (a `[plugins] paths` list) registers plugins under
//! their own names.
//!
//! [`HostAttentionKernel`]: dflash_core::HostAttentionKernel

mod calls;
mod device;
mod error;
mod host;
mod kernel;
mod named;
mod plugin;

use std::sync::Arc;

use dflash_core::AttentionKernel;
use dflash_core::registry::AttentionKernelSource;

pub use device::DevicePluginKernel;
pub use error::PluginError;
pub use host::{HostMask, HostTensor, Workspace};
pub use kernel::PluginKernel;
pub use named::{DEVICE_KERNEL_NAMES, register_paths};
pub use plugin::Plugin;

/// The prefix of a plugin kernel's name in `backend.attention`.
pub const PREFIX: &str = "plugin:";

/// Name this from a binary to keep the crate (and its `plugin:` source) linked.
pub fn link() {}

fn create(path: &str) -> dflash_core::Result<AttentionKernel> {
    Ok(kernel_of(Arc::new(Plugin::load(path)?))?)
}

/// The plugin as the kernel its declared device calls for: host memory for `kDLCPU`, CUDA
/// device memory for `kDLCUDA`.
pub fn kernel_of(plugin: Arc<Plugin>) -> Result<AttentionKernel, PluginError> {
    if plugin.capabilities().device_type == dflash_attention_abi::kDLCUDA {
        Ok(AttentionKernel::Device(Box::new(DevicePluginKernel::new(
            plugin,
        )?)))
    } else {
        Ok(AttentionKernel::Host(Box::new(PluginKernel::new(plugin)?)))
    }
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

//! Startup registries. Backends and in-tree attention kernels submit a registration with
//! `inventory::submit!`; the binary links them in, and selection is by name from the config.
//! An unknown name is an error listing what is registered.

use std::sync::Arc;

use crate::{Backend, Error, HostAttentionKernel, Result};

/// Options a backend is built with (from the config's `[backend]` table).
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Attention kernel name (see [`attention_kernel_names`]).
    pub attention: String,
    /// Worker threads for CPU backends (0 = all cores).
    pub threads: usize,
    /// Device ordinal for GPU backends.
    pub device: usize,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            attention: "reference".into(),
            threads: 0,
            device: 0,
        }
    }
}

pub struct BackendRegistration {
    pub name: &'static str,
    pub description: &'static str,
    pub create: fn(&BackendOptions) -> Result<Arc<dyn Backend>>,
    /// Devices this backend can use on this machine (0 when it is unavailable). Workers are
    /// spread over them; with fewer devices than workers, devices are shared.
    pub device_count: fn() -> usize,
}
inventory::collect!(BackendRegistration);

/// How many devices backend `name` has here (1 for host backends).
pub fn device_count(name: &str) -> Result<usize> {
    inventory::iter::<BackendRegistration>
        .into_iter()
        .find(|r| r.name == name)
        .map(|r| (r.device_count)())
        .ok_or_else(|| Error::UnknownName {
            kind: "backend",
            name: name.to_string(),
            available: backend_names(),
        })
}

/// A host-memory attention kernel. GPU backends will add a device-memory sibling.
pub struct AttentionKernelRegistration {
    pub name: &'static str,
    pub description: &'static str,
    pub create: fn() -> Box<dyn HostAttentionKernel>,
}
inventory::collect!(AttentionKernelRegistration);

pub fn backend_names() -> Vec<String> {
    let mut v: Vec<String> = inventory::iter::<BackendRegistration>
        .into_iter()
        .map(|r| r.name.to_string())
        .collect();
    v.sort();
    v
}

pub fn attention_kernel_names() -> Vec<String> {
    let mut v: Vec<String> = inventory::iter::<AttentionKernelRegistration>
        .into_iter()
        .map(|r| r.name.to_string())
        .collect();
    v.sort();
    v
}

/// Builds the backend registered as `name`.
pub fn create_backend(name: &str, opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    let reg = inventory::iter::<BackendRegistration>
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| Error::UnknownName {
            kind: "backend",
            name: name.to_string(),
            available: backend_names(),
        })?;
    (reg.create)(opts)
}

/// Builds the host attention kernel registered as `name`.
pub fn create_host_attention(name: &str) -> Result<Box<dyn HostAttentionKernel>> {
    let reg = inventory::iter::<AttentionKernelRegistration>
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| Error::UnknownName {
            kind: "attention kernel",
            name: name.to_string(),
            available: attention_kernel_names(),
        })?;
    Ok((reg.create)())
}

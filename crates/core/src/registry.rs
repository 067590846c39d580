//! Startup registries. Backends and attention kernels submit a registration with
//! `inventory::submit!`; the binary links them in, and selection is by name from the config.
//! An unknown name is an error listing what is registered.
//!
//! Attention kernels come in two kinds: host kernels ([`AttentionKernelRegistration`]), which
//! any backend can run (a device backend through a host round trip), and device kernels
//! ([`DeviceAttentionKernelRegistration`]), which live inside one backend and run on its
//! device memory. [`attention_kernels`] lists both.

use std::sync::Arc;

use crate::device_kernel::AttentionKernel;
use crate::{Backend, Error, HostAttentionKernel, Result};

/// Options a backend is built with (from the config's `[backend]` table).
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Attention kernel name: a host kernel ([`attention_kernel_names`]) or one of the
    /// backend's device kernels ([`device_attention_kernel_names`]).
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
    /// The attention kernel that serves this backend best (its fastest own kernel, or a host
    /// kernel): what tools that measure the backend use when no kernel is named.
    pub preferred_attention: &'static str,
}
inventory::collect!(BackendRegistration);

fn backend(name: &str) -> Result<&'static BackendRegistration> {
    inventory::iter::<BackendRegistration>
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| Error::UnknownName {
            kind: "backend",
            name: name.to_string(),
            available: backend_names(),
        })
}

/// How many devices backend `name` has here (1 for host backends).
pub fn device_count(name: &str) -> Result<usize> {
    backend(name).map(|r| (r.device_count)())
}

/// The attention kernel backend `name` prefers ([`BackendRegistration::preferred_attention`]).
pub fn preferred_attention(name: &str) -> Result<&'static str> {
    backend(name).map(|r| r.preferred_attention)
}

/// A host-memory attention kernel: any backend can run it.
pub struct AttentionKernelRegistration {
    pub name: &'static str,
    pub description: &'static str,
    pub create: fn() -> Box<dyn HostAttentionKernel>,
}
inventory::collect!(AttentionKernelRegistration);

/// A family of host attention kernels named `PREFIX ARG` and built from `ARG` at startup, e.g.
/// `plugin:PATH` (a foreign kernel loaded through the C ABI by `dflash-attention-loader`).
pub struct AttentionKernelSource {
    pub prefix: &'static str,
    pub description: &'static str,
    /// Builds a host kernel, or a device kernel that only a backend of its device can run.
    pub create: fn(&str) -> Result<AttentionKernel>,
    /// The kernels this source registered at run time under their own names (e.g. the
    /// plugins of a `[plugins] paths` list), which [`create_attention`] builds with
    /// `create_named` and [`attention_kernel_names`] lists.
    pub named: fn() -> Vec<String>,
    pub create_named: fn(&str) -> Result<AttentionKernel>,
}
inventory::collect!(AttentionKernelSource);

/// A device attention kernel: part of backend `backend`, selected through its
/// [`BackendOptions::attention`]; it has no existence outside that backend.
pub struct DeviceAttentionKernelRegistration {
    pub backend: &'static str,
    pub name: &'static str,
    pub description: &'static str,
}
inventory::collect!(DeviceAttentionKernelRegistration);

/// One registered attention kernel, host or device, as [`attention_kernels`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionKernelInfo {
    pub name: &'static str,
    pub description: &'static str,
    /// The backend a device kernel belongs to; `None` for a host kernel (any backend).
    pub backend: Option<&'static str>,
}

fn sorted(names: impl Iterator<Item = &'static str>) -> Vec<String> {
    let mut v: Vec<String> = names.map(str::to_string).collect();
    v.sort();
    v
}

pub fn backend_names() -> Vec<String> {
    sorted(
        inventory::iter::<BackendRegistration>
            .into_iter()
            .map(|r| r.name),
    )
}

/// The attention kernels [`create_attention`] builds by name, sorted: the registered host
/// kernels and those [`AttentionKernelSource`]s registered at run time (which may be device
/// kernels, e.g. a CUDA plugin of a `[plugins] paths` list).
pub fn attention_kernel_names() -> Vec<String> {
    let mut names = sorted(
        inventory::iter::<AttentionKernelRegistration>
            .into_iter()
            .map(|r| r.name),
    );
    names.extend(runtime_names().into_iter().map(|(_, n)| n));
    names.sort();
    names
}

fn runtime_names() -> Vec<(&'static AttentionKernelSource, String)> {
    inventory::iter::<AttentionKernelSource>
        .into_iter()
        .flat_map(|s| (s.named)().into_iter().map(move |n| (s, n)))
        .collect()
}

/// The device attention kernels of backend `backend`, sorted (none for an unknown backend).
pub fn device_attention_kernel_names(backend: &str) -> Vec<String> {
    sorted(
        inventory::iter::<DeviceAttentionKernelRegistration>
            .into_iter()
            .filter(|r| r.backend == backend)
            .map(|r| r.name),
    )
}

/// Every registered attention kernel: the host kernels, then each backend's device kernels,
/// each group sorted by name.
pub fn attention_kernels() -> Vec<AttentionKernelInfo> {
    let mut host: Vec<AttentionKernelInfo> = inventory::iter::<AttentionKernelRegistration>
        .into_iter()
        .map(|r| AttentionKernelInfo {
            name: r.name,
            description: r.description,
            backend: None,
        })
        .collect();
    host.sort_by_key(|k| k.name);
    let mut device: Vec<AttentionKernelInfo> = inventory::iter::<DeviceAttentionKernelRegistration>
        .into_iter()
        .map(|r| AttentionKernelInfo {
            name: r.name,
            description: r.description,
            backend: Some(r.backend),
        })
        .collect();
    device.sort_by_key(|k| (k.backend, k.name));
    host.extend(device);
    host
}

/// Builds the backend registered as `name`.
pub fn create_backend(name: &str, opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    (backend(name)?.create)(opts)
}

/// Builds the attention kernel registered as `name`, or, for a name starting with an
/// [`AttentionKernelSource`]'s prefix, the kernel that source builds from the rest: a host
/// kernel, or a device kernel for the backends of its device (a CUDA plugin).
pub fn create_attention(name: &str) -> Result<AttentionKernel> {
    let source = inventory::iter::<AttentionKernelSource>
        .into_iter()
        .find_map(|s| name.strip_prefix(s.prefix).map(|arg| (s, arg)));
    if let Some((source, arg)) = source {
        return (source.create)(arg);
    }
    if let Some((source, _)) = runtime_names().into_iter().find(|(_, n)| n == name) {
        return (source.create_named)(name);
    }
    let reg = inventory::iter::<AttentionKernelRegistration>
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| Error::UnknownName {
            kind: "attention kernel",
            name: name.to_string(),
            available: attention_kernel_names(),
        })?;
    Ok(AttentionKernel::Host((reg.create)()))
}

/// Like [`create_attention`], for a backend that runs kernels in host memory only: a device
/// kernel is an error naming its device.
pub fn create_host_attention(name: &str) -> Result<Box<dyn HostAttentionKernel>> {
    match create_attention(name)? {
        AttentionKernel::Host(k) => Ok(k),
        AttentionKernel::Device(k) => Err(Error::op(
            "attention kernel",
            "a host backend",
            format!(
                "{name:?} (kernel {:?}) runs on {} device memory; this backend runs host kernels \
                 only (use it with a {} backend, or choose a host kernel)",
                k.name(),
                k.device(),
                k.device()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    inventory::submit! {
        DeviceAttentionKernelRegistration {
            backend: "registry-test",
            name: "registry-test-kernel",
            description: "a device kernel of a backend that exists only in this test",
        }
    }

    fn refuse_source(arg: &str) -> Result<AttentionKernel> {
        if arg == "registry-test-device" {
            return Ok(AttentionKernel::Device(Box::new(NoopDeviceKernel)));
        }
        Err(Error::op(
            "registry-test source",
            "host",
            format!("asked for {arg:?}"),
        ))
    }

    inventory::submit! {
        AttentionKernelSource {
            prefix: "registry-test:",
            description: "a kernel source that exists only in this test and builds nothing",
            create: refuse_source,
            named: || vec!["registry-test-runtime".into(), "registry-test-device".into()],
            create_named: refuse_source,
        }
    }

    /// A device kernel that is never called: only its kind matters here.
    struct NoopDeviceKernel;
    impl crate::device_kernel::DeviceAttentionKernel for NoopDeviceKernel {
        fn name(&self) -> &str {
            "registry-test-device"
        }
        fn device(&self) -> crate::device_kernel::DeviceKind {
            crate::device_kernel::DeviceKind::Cuda
        }
        fn supports(
            &self,
            _: bool,
            _: &crate::AttnDims,
            _: &crate::mask::BlockMask,
        ) -> std::result::Result<(), String> {
            Err("never called".into())
        }
        fn workspace_bytes(
            &self,
            _: bool,
            _: &crate::AttnDims,
        ) -> std::result::Result<u64, String> {
            Err("never called".into())
        }
        unsafe fn forward(
            &self,
            _: &crate::device_kernel::DeviceAttnForward<'_>,
        ) -> std::result::Result<(), String> {
            Err("never called".into())
        }
        unsafe fn backward(
            &self,
            _: &crate::device_kernel::DeviceAttnBackward<'_>,
        ) -> std::result::Result<(), String> {
            Err("never called".into())
        }
    }

    #[test]
    fn a_device_kernel_is_refused_where_only_host_kernels_run() {
        let kernel = create_attention("registry-test-device").expect("built by its source");
        assert!(matches!(kernel, AttentionKernel::Device(_)));
        let err = create_host_attention("registry-test-device")
            .err()
            .expect("a host backend cannot run it");
        let msg = err.to_string();
        assert!(
            msg.contains("CUDA device memory") && msg.contains("registry-test-device"),
            "{msg}"
        );
    }

    #[test]
    fn a_prefixed_name_goes_to_its_source_with_the_rest() {
        let err = create_host_attention("registry-test:some/path.so")
            .err()
            .expect("the test source refuses");
        assert!(err.to_string().contains("\"some/path.so\""), "{err}");
        // A kernel the source registered at run time is listed and built by its own name.
        assert!(attention_kernel_names().contains(&"registry-test-runtime".to_string()));
        let err = create_host_attention("registry-test-runtime")
            .err()
            .expect("the test source refuses");
        assert!(
            err.to_string().contains("\"registry-test-runtime\""),
            "{err}"
        );
        // Without the prefix the name is an ordinary (here unknown) kernel name.
        assert!(matches!(
            create_host_attention("registry-test"),
            Err(Error::UnknownName { .. })
        ));
    }

    #[test]
    fn device_kernels_are_listed_with_their_backend() {
        assert_eq!(
            device_attention_kernel_names("registry-test"),
            vec!["registry-test-kernel".to_string()]
        );
        assert!(device_attention_kernel_names("no-such-backend").is_empty());
        let all = attention_kernels();
        let k = all
            .iter()
            .find(|k| k.name == "registry-test-kernel")
            .expect("listed among all kernels");
        assert_eq!(k.backend, Some("registry-test"));
        // A device kernel is no host kernel: it cannot be created on its own.
        assert!(!attention_kernel_names().contains(&"registry-test-kernel".to_string()));
        assert!(create_host_attention("registry-test-kernel").is_err());
    }

    #[test]
    fn an_unknown_backend_has_no_preferred_kernel() {
        match preferred_attention("no-such-backend") {
            Err(Error::UnknownName { kind, name, .. }) => {
                assert_eq!((kind, name.as_str()), ("backend", "no-such-backend"));
            }
            other => panic!("expected UnknownName, got {other:?}"),
        }
    }
}

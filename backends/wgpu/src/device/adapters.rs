//! Which of wgpu's adapters count as this machine's devices, and in which order (the module
//! docs of [`super`]): enumerated once, filtered by [`select`], a pure function of each
//! adapter's kind and API so that the rules are tested without the adapters they are about.

use std::sync::OnceLock;

/// The adapters of this machine, in selection order, enumerated once.
pub(super) struct Adapters {
    /// Kept alive for as long as the adapters and devices made from it.
    _instance: wgpu::Instance,
    pub(super) list: Vec<wgpu::Adapter>,
    /// Why the list is empty though wgpu found compute adapters: `WGPU_ADAPTER_NAME` matched
    /// none of them (named with the adapters it could have matched).
    pub(super) unmatched: Option<String>,
}

/// The variable that keeps only the adapters whose name contains its value (case-insensitive),
/// as `wgpu::util::initialize_adapter_from_env` reads it: the way to run on an adapter that
/// [`select`] drops, e.g. lavapipe on a machine with a GPU (`WGPU_ADAPTER_NAME=llvmpipe`).
pub(super) const NAME_VAR: &str = "WGPU_ADAPTER_NAME";

pub(super) fn adapters() -> &'static Adapters {
    static ADAPTERS: OnceLock<Adapters> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        // `WGPU_BACKEND` (wgpu's own variable, e.g. `vulkan` or `gl`) restricts the APIs.
        let backends = wgpu::Backends::all().with_env();
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        let instance = wgpu::Instance::new(desc);
        let mut all = pollster::block_on(instance.enumerate_adapters(backends));
        // Only adapters that can run compute shaders at all.
        all.retain(|a| {
            a.get_downlevel_capabilities()
                .flags
                .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
        });
        let wanted = std::env::var(NAME_VAR).ok().filter(|v| !v.is_empty());
        let named: Vec<wgpu::Adapter> = all
            .iter()
            .filter(|a| {
                wanted
                    .as_deref()
                    .is_none_or(|w| name_matches(&a.get_info().name, w))
            })
            .cloned()
            .collect();
        let unmatched = match (&wanted, named.is_empty() && !all.is_empty()) {
            (Some(w), true) => Some(format!(
                "{NAME_VAR}={w:?} matches none of this machine's adapters: {}",
                all.iter()
                    .map(|a| super::describe(&a.get_info()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            _ => None,
        };
        let kinds: Vec<_> = named
            .iter()
            .map(|a| {
                let info = a.get_info();
                (info.device_type, info.backend)
            })
            .collect();
        let list = select(&kinds)
            .into_iter()
            .map(|i| named[i].clone())
            .collect();
        Adapters {
            _instance: instance,
            list,
            unmatched,
        }
    })
}

/// Whether adapter name `name` contains `wanted`, ignoring case (wgpu's own rule for
/// [`NAME_VAR`]).
pub(super) fn name_matches(name: &str, wanted: &str) -> bool {
    name.to_lowercase().contains(&wanted.to_lowercase())
}

/// The adapters that count, as indices into `kinds` (each adapter's device type and API), in
/// selection order: stably sorted by kind (discrete, integrated, virtual, CPU, other) and
/// within a kind native APIs before GL; then
/// - CPU adapters (lavapipe, llvmpipe, SwiftShader) are dropped where any other adapter
///   exists: Mesa installs lavapipe next to the GPU's driver on many GPU machines, and
///   counted it is a second "device" that round-robin placement puts a worker on, hundreds
///   of times slower than the GPU. Where they are all there is (CI) they stay.
/// - then GL adapters are dropped where a native one (Vulkan, Metal, DX12) is left: GL is
///   then a second view of the same hardware (lavapipe and llvmpipe, or a GPU through both
///   drivers). CPU adapters go first so that a GPU reachable only through GL is kept over
///   lavapipe.
pub(super) fn select(kinds: &[(wgpu::DeviceType, wgpu::Backend)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..kinds.len()).collect();
    order.sort_by_key(|&i| rank(kinds[i]));
    let is_cpu = |i: &usize| kinds[*i].0 == wgpu::DeviceType::Cpu;
    if order.iter().any(|i| !is_cpu(i)) {
        order.retain(|i| !is_cpu(i));
    }
    let native = |i: &usize| rank(kinds[*i]).1 == 0;
    if order.iter().any(native) {
        order.retain(native);
    }
    order
}

/// Sort key: kind of device first, then native APIs before GL.
fn rank((device_type, backend): (wgpu::DeviceType, wgpu::Backend)) -> (u8, u8) {
    let kind = match device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    };
    let api = match backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    };
    (kind, api)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgpu::Backend::{Dx12, Gl, Metal, Vulkan};
    use wgpu::DeviceType::{Cpu, DiscreteGpu, IntegratedGpu, Other};

    fn kept(kinds: &[(wgpu::DeviceType, wgpu::Backend)]) -> Vec<(wgpu::DeviceType, wgpu::Backend)> {
        select(kinds).into_iter().map(|i| kinds[i]).collect()
    }

    #[test]
    fn lavapipe_next_to_a_gpu_is_not_a_second_device() {
        assert_eq!(
            kept(&[(DiscreteGpu, Vulkan), (Cpu, Vulkan)]),
            [(DiscreteGpu, Vulkan)]
        );
        // Enumeration order does not matter, nor does llvmpipe's GL view.
        assert_eq!(
            kept(&[
                (Cpu, Vulkan),
                (Cpu, Gl),
                (DiscreteGpu, Vulkan),
                (DiscreteGpu, Gl)
            ]),
            [(DiscreteGpu, Vulkan)]
        );
        assert_eq!(
            kept(&[(Cpu, Vulkan), (IntegratedGpu, Metal)]),
            [(IntegratedGpu, Metal)]
        );
    }

    #[test]
    fn cpu_adapters_stay_where_they_are_all_there_is() {
        assert_eq!(kept(&[(Cpu, Vulkan)]), [(Cpu, Vulkan)]);
        // lavapipe and llvmpipe: one CPU, through Vulkan.
        assert_eq!(kept(&[(Cpu, Gl), (Cpu, Vulkan)]), [(Cpu, Vulkan)]);
        assert_eq!(kept(&[(Cpu, Gl)]), [(Cpu, Gl)]);
        assert!(kept(&[]).is_empty());
    }

    #[test]
    fn gl_is_dropped_where_a_native_api_is_left() {
        // A GPU through both drivers is one device.
        assert_eq!(
            kept(&[(DiscreteGpu, Gl), (DiscreteGpu, Vulkan)]),
            [(DiscreteGpu, Vulkan)]
        );
        // Two GPUs, kind first, native API before GL within a kind.
        assert_eq!(
            kept(&[(IntegratedGpu, Dx12), (DiscreteGpu, Dx12), (Other, Gl)]),
            [(DiscreteGpu, Dx12), (IntegratedGpu, Dx12)]
        );
        // GL alone stays: a GPU whose only driver is GL (wgpu types an unknown GL renderer
        // `Other`) is kept over lavapipe.
        assert_eq!(kept(&[(Cpu, Vulkan), (Other, Gl)]), [(Other, Gl)]);
        assert_eq!(
            kept(&[(DiscreteGpu, Gl), (Cpu, Vulkan)]),
            [(DiscreteGpu, Gl)]
        );
    }

    #[test]
    fn adapter_names_match_as_wgpu_matches_them() {
        assert!(name_matches("llvmpipe (LLVM 15.0.7, 256 bits)", "LLVMpipe"));
        assert!(name_matches("NVIDIA H100 80GB HBM3", "h100"));
        assert!(!name_matches("NVIDIA H100 80GB HBM3", "h200"));
    }
}

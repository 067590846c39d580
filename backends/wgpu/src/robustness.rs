//! `DFLASH_WGPU_ROBUSTNESS=off`: a measurement switch that opens the Vulkan device without
//! robust buffer access, to see what the driver's own bounds checks cost the kernels.
//!
//! wgpu enables `robustBufferAccess` (and `robustBufferAccess2` where the driver has
//! `VK_EXT_robustness2`) on every Vulkan device, and with the latter it leaves buffer bounds to
//! the driver: naga then emits no checks of its own on buffer accesses, and the driver bounds
//! every load and store against its binding. Whether that costs the GEMM and attention kernels
//! on a GPU is what this switch measures: the device is created here by hand, with the
//! extensions and features wgpu asks for except those two, and handed to wgpu. wgpu still
//! believes the driver checks, so **nothing checks buffer accesses on such a device**: an
//! out-of-bounds access is undefined behaviour. Never a default; the backend prints a warning.

use std::ffi::c_char;

use ash::vk;
use wgpu::hal::api::Vulkan;

/// Whether the switch is set (`off`, `0` or `false`).
pub(crate) fn disabled() -> bool {
    std::env::var("DFLASH_WGPU_ROBUSTNESS")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "off" | "0" | "false"))
}

/// Opens `adapter` (a Vulkan one) as wgpu would for `desc`, but without robust buffer access.
pub(crate) fn open_unrobust(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
) -> Result<(wgpu::Device, wgpu::Queue), String> {
    // SAFETY: the device is created from this adapter's physical device with the queue family
    // (0), extensions and features wgpu-hal's own `open` would use (`device_from_raw`'s
    // contract), robust buffer access aside; hal takes ownership of it (no drop callback).
    unsafe {
        let hal_adapter = adapter
            .as_hal::<Vulkan>()
            .ok_or("DFLASH_WGPU_ROBUSTNESS=off needs a Vulkan adapter")?;
        let features = desc.required_features;
        let extensions = hal_adapter.required_device_extensions(features);
        let mut phd = hal_adapter.physical_device_features(&extensions, features);
        let core = vk::PhysicalDeviceFeatures {
            robust_buffer_access: vk::FALSE,
            ..phd.get_core()
        };
        let names: Vec<*const c_char> = extensions.iter().map(|e| e.as_ptr()).collect();
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(0)
            .queue_priorities(&priorities)];
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&names);
        info = phd.add_to_device_create(info);
        info.p_enabled_features = &core;
        turn_off_robustness2(info.p_next as *mut vk::BaseOutStructure<'_>);
        let instance = hal_adapter.shared_instance().raw_instance();
        let raw = instance
            .create_device(hal_adapter.raw_physical_device(), &info, None)
            .map_err(|e| format!("vkCreateDevice without robust buffer access: {e}"))?;
        let open = hal_adapter
            .device_from_raw(
                raw,
                None,
                &extensions,
                features,
                &desc.required_limits,
                &desc.memory_hints,
                0,
                0,
            )
            .map_err(|e| format!("wgpu-hal could not take the device: {e}"))?;
        drop(hal_adapter);
        adapter
            .create_device_from_hal::<Vulkan>(open, desc)
            .map_err(|e| format!("wgpu could not take the device: {e}"))
    }
}

/// Clears `robustBufferAccess2` in a device-create `p_next` chain, where it is.
///
/// # Safety
/// `p` must be null or the head of a valid, writable `p_next` chain.
unsafe fn turn_off_robustness2(mut p: *mut vk::BaseOutStructure<'_>) {
    while !p.is_null() {
        // SAFETY: every element of a valid chain starts with a BaseOutStructure header, and
        // its s_type says what the whole structure is.
        unsafe {
            if (*p).s_type == vk::StructureType::PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT {
                (*(p as *mut vk::PhysicalDeviceRobustness2FeaturesEXT<'_>)).robust_buffer_access2 =
                    vk::FALSE;
            }
            p = (*p).p_next;
        }
    }
}

/// What the backend prints when the switch is on.
pub(crate) const WARNING: &str = "DFLASH_WGPU_ROBUSTNESS=off: the Vulkan device has no robust \
    buffer access and the shaders no buffer bounds checks (a measurement switch: an \
    out-of-bounds access is undefined behaviour)";

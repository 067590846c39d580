//! The Vulkan device opened by hand for the measurement switches (see [`super`]).
//!
//! `DFLASH_WGPU_ROBUSTNESS=off`: wgpu enables `robustBufferAccess` (and `robustBufferAccess2`
//! where the driver has `VK_EXT_robustness2`) on every Vulkan device, and with the latter it
//! leaves buffer bounds to the driver: naga then emits no checks of its own on buffer accesses,
//! and the driver bounds every load and store against its binding. Whether that costs the GEMM
//! and attention kernels on a GPU is what this switch measures: the device is created with the
//! extensions and features wgpu asks for except those two. wgpu still believes the driver
//! checks, so **nothing checks buffer accesses on such a device**: an out-of-bounds access is
//! undefined behaviour. Never a default; the backend prints a warning.
//!
//! `DFLASH_WGPU_PIPELINE_STATS`: the device also gets `VK_KHR_pipeline_executable_properties`
//! and its `pipelineExecutableInfo` feature, where the driver offers them.

use std::ffi::{CStr, c_char};

use ash::vk;
use wgpu::hal::api::Vulkan;

use super::HandOpen;

/// Whether `DFLASH_WGPU_ROBUSTNESS` is set to `off`, `0` or `false`.
pub(crate) fn disabled() -> bool {
    std::env::var("DFLASH_WGPU_ROBUSTNESS")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "off" | "0" | "false"))
}

/// The device by hand, and whether it has the pipeline executable properties.
pub(crate) struct Opened {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub executable_properties: bool,
}

/// Opens `adapter` (a Vulkan one) as wgpu would for `desc`, with the changes `how` asks for.
pub(crate) fn open_by_hand(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
    how: HandOpen,
) -> Result<Opened, String> {
    // SAFETY: the device is created from this adapter's physical device with the queue family
    // (0), extensions and features wgpu-hal's own `open` would use (`device_from_raw`'s
    // contract: a superset of its extensions), robust buffer access aside where asked; hal
    // takes ownership of it (no drop callback).
    unsafe {
        let hal_adapter = adapter
            .as_hal::<Vulkan>()
            .ok_or("the measurement switches DFLASH_WGPU_ROBUSTNESS and DFLASH_WGPU_PIPELINE_STATS need a Vulkan adapter")?;
        let instance = hal_adapter.shared_instance().raw_instance();
        let phys = hal_adapter.raw_physical_device();
        let features = desc.required_features;
        let mut extensions = hal_adapter.required_device_extensions(features);
        let props_ext = ash::khr::pipeline_executable_properties::NAME;
        let executable_properties =
            how.executable_properties && has_extension(instance, phys, props_ext);
        if executable_properties {
            extensions.push(props_ext);
        }
        let mut phd = hal_adapter.physical_device_features(&extensions, features);
        let core = vk::PhysicalDeviceFeatures {
            robust_buffer_access: if how.unrobust {
                vk::FALSE
            } else {
                phd.get_core().robust_buffer_access
            },
            ..phd.get_core()
        };
        let names: Vec<*const c_char> = extensions.iter().map(|e| e.as_ptr()).collect();
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(0)
            .queue_priorities(&priorities)];
        let mut exec_info = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
            .pipeline_executable_info(true);
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&names);
        if executable_properties {
            info = info.push_next(&mut exec_info);
        }
        info = phd.add_to_device_create(info);
        info.p_enabled_features = &core;
        if how.unrobust {
            turn_off_robustness2(info.p_next as *mut vk::BaseOutStructure<'_>);
        }
        let raw = instance
            .create_device(phys, &info, None)
            .map_err(|e| format!("vkCreateDevice ({how:?}): {e}"))?;
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
        let (device, queue) = adapter
            .create_device_from_hal::<Vulkan>(open, desc)
            .map_err(|e| format!("wgpu could not take the device: {e}"))?;
        Ok(Opened {
            device,
            queue,
            executable_properties,
        })
    }
}

/// Whether the physical device offers the device extension `name`.
///
/// # Safety
/// `phys` must be a physical device of `instance`.
unsafe fn has_extension(instance: &ash::Instance, phys: vk::PhysicalDevice, name: &CStr) -> bool {
    // SAFETY: as the caller promises.
    let Ok(list) = (unsafe { instance.enumerate_device_extension_properties(phys) }) else {
        return false;
    };
    list.iter()
        .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
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

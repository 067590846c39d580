//! The device memory of a Vulkan adapter, for the job's memory plan
//! ([`dflash_core::BackendInfo::memory_capacity`]).
//!
//! wgpu has no portable query for device memory, so without this a wgpu job would be planned
//! against host memory even on a discrete GPU. Vulkan says what its heaps hold: the capacity is
//! the largest device-local heap, and what is free is that heap less what this process's
//! devices on the adapter hold (live tensors and their buffer pools). Only the largest counts because a second device-local
//! heap is a view of the same memory (NVIDIA's 256 MiB window the host can map) or a small
//! part of it (AMD's host-visible VRAM without resizable BAR): the largest is exact or a few
//! hundred MiB short, never twice the same bytes. Where wgpu enabled `VK_EXT_memory_budget`
//! (where the driver has it, except drivers whose accounting wgpu knows to be wrong), the free
//! figure is also capped by the driver's budget for that heap less its usage, which sees other
//! processes, other wgpu devices on the adapter and the driver's overheads. Other APIs (Metal,
//! DX12, GL) report nothing here; the plan then uses host memory, which is right for Apple's
//! unified memory. So do a CPU adapter (lavapipe), whose heap is a placeholder, and an
//! integrated GPU, whose buffers are host memory (`WgpuBackend::memory_capacity`).

use ash::vk;
use wgpu::hal::api::Vulkan;

/// The largest device-local heap of one Vulkan physical device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceLocal {
    /// Bytes of the heap.
    pub total: u64,
    /// Bytes the driver would still give this process from the heap (its budget less its
    /// usage, `VK_EXT_memory_budget`), where the driver says.
    pub budget_free: Option<u64>,
}

impl DeviceLocal {
    /// The capacity a plan is checked against, with `held` bytes already taken by this
    /// process on the heap: free is the smaller of `total - held` and the driver's budget.
    pub(crate) fn capacity(self, held: u64) -> dflash_core::MemoryCapacity {
        let free = self.total.saturating_sub(held);
        dflash_core::MemoryCapacity {
            free: self.budget_free.map_or(free, |b| b.min(free)),
            total: self.total,
        }
    }
}

/// The largest device-local heap of `device`'s physical device; `None` on an API other than
/// Vulkan, or where the device has no device-local heap.
pub(crate) fn device_local(device: &wgpu::Device) -> Option<DeviceLocal> {
    // SAFETY: only queries of the physical device wgpu opened this device on, through the
    // instance it was created from; the properties2 query only where both the instance and
    // the device are Vulkan 1.1 or later (core there); the returned structures are plain data.
    unsafe {
        let hal = device.as_hal::<Vulkan>()?;
        let shared = hal.shared_instance();
        let instance = shared.raw_instance();
        let phys = hal.raw_physical_device();
        let v1_1 = shared.instance_api_version() >= vk::API_VERSION_1_1
            && instance.get_physical_device_properties(phys).api_version >= vk::API_VERSION_1_1;
        let budget_ext = hal
            .enabled_device_extensions()
            .contains(&ash::ext::memory_budget::NAME);
        if !(v1_1 && budget_ext) {
            let props = instance.get_physical_device_memory_properties(phys);
            return largest_device_local(&props, None);
        }
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut props2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        instance.get_physical_device_memory_properties2(phys, &mut props2);
        let props = props2.memory_properties;
        largest_device_local(&props, Some(&budget))
    }
}

/// The largest device-local heap of `props`, with its free budget where `budget` is given.
fn largest_device_local(
    props: &vk::PhysicalDeviceMemoryProperties,
    budget: Option<&vk::PhysicalDeviceMemoryBudgetPropertiesEXT<'_>>,
) -> Option<DeviceLocal> {
    let count = (props.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS);
    let i = (0..count)
        .filter(|&i| {
            props.memory_heaps[i]
                .flags
                .contains(vk::MemoryHeapFlags::DEVICE_LOCAL)
        })
        .max_by_key(|&i| props.memory_heaps[i].size)?;
    Some(DeviceLocal {
        total: props.memory_heaps[i].size,
        budget_free: budget.map(|b| b.heap_budget[i].saturating_sub(b.heap_usage[i])),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heap(size: u64, local: bool) -> vk::MemoryHeap {
        vk::MemoryHeap {
            size,
            flags: if local {
                vk::MemoryHeapFlags::DEVICE_LOCAL
            } else {
                vk::MemoryHeapFlags::empty()
            },
        }
    }

    /// A discrete card: a 24 GiB device-local heap, 64 GiB of host memory it can map, and a
    /// 256 MiB device-local window the host can see (a view of the first heap's memory).
    fn discrete() -> vk::PhysicalDeviceMemoryProperties {
        let mut p = vk::PhysicalDeviceMemoryProperties {
            memory_heap_count: 3,
            ..Default::default()
        };
        p.memory_heaps[0] = heap(256 << 20, true);
        p.memory_heaps[1] = heap(64 << 30, false);
        p.memory_heaps[2] = heap(24 << 30, true);
        // Past the count: never read.
        p.memory_heaps[3] = heap(1 << 40, true);
        p
    }

    #[test]
    fn the_largest_device_local_heap_counts() {
        let d = largest_device_local(&discrete(), None).unwrap();
        assert_eq!(d.total, 24 << 30);
        assert_eq!(d.budget_free, None);
        let cap = d.capacity(1 << 30);
        assert_eq!(cap.total, 24 << 30);
        assert_eq!(cap.free, 23 << 30);
        // No device-local heap: nothing to report.
        let mut host_only = discrete();
        host_only.memory_heap_count = 2;
        host_only.memory_heaps[0] = heap(8 << 30, false);
        assert_eq!(largest_device_local(&host_only, None), None);
    }

    #[test]
    fn the_drivers_budget_caps_what_is_free() {
        let mut b = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        // Another process holds 10 GiB of the big heap; the other heaps' budgets do not count.
        b.heap_budget[2] = 23 << 30;
        b.heap_usage[2] = 10 << 30;
        b.heap_budget[1] = 60 << 30;
        b.heap_budget[0] = 200 << 20;
        let d = largest_device_local(&discrete(), Some(&b)).unwrap();
        assert_eq!(d.budget_free, Some(13 << 30));
        assert_eq!(d.capacity(0).free, 13 << 30);
        // What this backend holds caps it too, where that is the smaller.
        assert_eq!(d.capacity(23 << 30).free, 1 << 30);
        // Usage above the budget is nothing free, not an underflow.
        b.heap_usage[2] = 30 << 30;
        let d = largest_device_local(&discrete(), Some(&b)).unwrap();
        assert_eq!(d.budget_free, Some(0));
    }
}

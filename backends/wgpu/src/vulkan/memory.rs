//! The device memory of a Vulkan adapter, for the job's memory plan
//! ([`dflash_core::BackendInfo::memory_capacity`]).
//!
//! wgpu has no portable query for device memory, so without this a wgpu job would be planned
//! against host memory even on a discrete GPU. Vulkan says what its heaps hold: the capacity is
//! the sum of the device-local heaps, and what is free is that sum less what this backend holds
//! (live tensors and its buffer pool). Where the driver has `VK_EXT_memory_budget`, the free
//! figure is also capped by the driver's own budget less its usage, which sees other
//! processes and the driver's overheads. Other APIs (Metal, DX12, GL) report nothing here; the
//! plan then uses host memory, which is right for Apple's unified memory. So do a CPU adapter
//! (lavapipe), whose heap is a placeholder, and an integrated GPU, whose buffers are host memory
//! (`WgpuBackend::memory_capacity`).

use ash::vk;
use wgpu::hal::api::Vulkan;

/// Device-local memory of one Vulkan physical device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceLocal {
    /// Bytes of every device-local heap together.
    pub total: u64,
    /// Bytes the driver would still give this process from those heaps (its budget less its
    /// usage, `VK_EXT_memory_budget`), where the driver says.
    pub budget_free: Option<u64>,
}

impl DeviceLocal {
    /// The capacity a plan is checked against, with `held` bytes already taken by this
    /// backend: free is the smaller of `total - held` and the driver's budget.
    pub(crate) fn capacity(self, held: u64) -> dflash_core::MemoryCapacity {
        let free = self.total.saturating_sub(held);
        dflash_core::MemoryCapacity {
            free: self.budget_free.map_or(free, |b| b.min(free)),
            total: self.total,
        }
    }
}

/// The device-local heaps of `device`'s physical device; `None` on an API other than Vulkan.
pub(crate) fn device_local(device: &wgpu::Device) -> Option<DeviceLocal> {
    // SAFETY: only queries of the physical device wgpu opened this device on, through the
    // instance it was created from; the returned structures are plain data.
    unsafe {
        let hal = device.as_hal::<Vulkan>()?;
        let shared = hal.shared_instance();
        let instance = shared.raw_instance();
        let phys = hal.raw_physical_device();
        // The properties2 query is core in Vulkan 1.1; wgpu-hal asks for 1.1 or later
        // wherever the driver has it.
        let budget_ext = shared.instance_api_version() >= vk::API_VERSION_1_1
            && super::open::has_extension(instance, phys, ash::ext::memory_budget::NAME);
        if !budget_ext {
            let props = instance.get_physical_device_memory_properties(phys);
            return Some(sum_device_local(&props, None));
        }
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut props2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        instance.get_physical_device_memory_properties2(phys, &mut props2);
        let props = props2.memory_properties;
        Some(sum_device_local(&props, Some(&budget)))
    }
}

/// The device-local heaps of `props` summed, with their free budget where `budget` is given.
fn sum_device_local(
    props: &vk::PhysicalDeviceMemoryProperties,
    budget: Option<&vk::PhysicalDeviceMemoryBudgetPropertiesEXT<'_>>,
) -> DeviceLocal {
    let heaps = &props.memory_heaps[..(props.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS)];
    let local = |i: &usize| heaps[*i].flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL);
    let total = (0..heaps.len()).filter(local).map(|i| heaps[i].size).sum();
    let budget_free = budget.map(|b| {
        (0..heaps.len())
            .filter(local)
            .map(|i| b.heap_budget[i].saturating_sub(b.heap_usage[i]))
            .sum()
    });
    DeviceLocal { total, budget_free }
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
    /// 256 MiB device-local window the host can see (counted: it is device memory too).
    fn discrete() -> vk::PhysicalDeviceMemoryProperties {
        let mut p = vk::PhysicalDeviceMemoryProperties {
            memory_heap_count: 3,
            ..Default::default()
        };
        p.memory_heaps[0] = heap(24 << 30, true);
        p.memory_heaps[1] = heap(64 << 30, false);
        p.memory_heaps[2] = heap(256 << 20, true);
        // Past the count: never read.
        p.memory_heaps[3] = heap(1 << 40, true);
        p
    }

    #[test]
    fn only_device_local_heaps_count() {
        let d = sum_device_local(&discrete(), None);
        assert_eq!(d.total, (24 << 30) + (256 << 20));
        assert_eq!(d.budget_free, None);
        let cap = d.capacity(1 << 30);
        assert_eq!(cap.total, d.total);
        assert_eq!(cap.free, d.total - (1 << 30));
    }

    #[test]
    fn the_drivers_budget_caps_what_is_free() {
        let mut b = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        // Another process holds 10 GiB of the big heap; the host heap's budget is not counted.
        b.heap_budget[0] = 23 << 30;
        b.heap_usage[0] = 10 << 30;
        b.heap_budget[1] = 60 << 30;
        b.heap_usage[2] = 1 << 20;
        b.heap_budget[2] = 200 << 20;
        let d = sum_device_local(&discrete(), Some(&b));
        assert_eq!(d.budget_free, Some((13 << 30) + (199 << 20)));
        assert_eq!(d.capacity(0).free, (13 << 30) + (199 << 20));
        // What this backend holds caps it too, where that is the smaller.
        assert_eq!(d.capacity(d.total - (1 << 30)).free, 1 << 30);
        // Usage above the budget is nothing free, not an underflow.
        b.heap_usage[0] = 30 << 30;
        let d = sum_device_local(&discrete(), Some(&b));
        assert_eq!(d.budget_free, Some(199 << 20));
    }
}

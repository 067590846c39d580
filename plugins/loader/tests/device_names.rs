//! The loader reserves the in-tree device kernels' names without depending on their backends
//! (`DEVICE_KERNEL_NAMES`); this test links both backends and checks that list is exactly
//! what they register, so a kernel added or renamed there cannot go unreserved.

use dflash_attention_loader::DEVICE_KERNEL_NAMES;

#[test]
fn reserved_device_kernel_names_are_exactly_the_backends_kernels() {
    let mut declared: Vec<&str> = dflash_backend_cuda::DEVICE_ATTENTION_KERNELS.to_vec();
    declared.extend(dflash_backend_wgpu::WGPU_ATTENTION_KERNELS);
    declared.sort_unstable();
    let mut registered: Vec<&str> = dflash_core::registry::attention_kernels()
        .into_iter()
        .filter(|k| k.backend.is_some())
        .map(|k| k.name)
        .collect();
    registered.sort_unstable();
    let mut reserved = DEVICE_KERNEL_NAMES.to_vec();
    reserved.sort_unstable();
    assert_eq!(registered, declared);
    assert_eq!(reserved, registered);
}

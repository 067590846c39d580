//! A lost device is an error of every op, never a panic: the device is destroyed (what a
//! driver reset or a removed GPU looks like to wgpu), after which `synchronize`, downloads,
//! allocations and kernels of every instance on it fail with `device lost`, and a new
//! instance opens the adapter again. Its own test executable: it destroys the process's
//! shared device of adapter 0. Skips without an adapter.

mod common;

use common::*;
use dflash_core::{BackendInfo, MemoryOps};

#[test]
fn a_lost_device_fails_every_op_and_a_new_instance_opens_the_adapter_again() {
    let Some(a) = wgpu() else { return };
    let Some(b) = wgpu() else { return };
    let mut t = a.upload(&[1.0, 2.0, 3.0], &[3]).unwrap();
    a.synchronize().unwrap();
    let ctx = dflash_backend_wgpu::device::get(0, false).unwrap();
    ctx.device.destroy();

    let lost = |what: &str, r: dflash_core::Result<()>| {
        let e = r.expect_err(what).to_string();
        assert!(
            e.contains("device lost") && e.contains("wgpu:0"),
            "{what}: {e}"
        );
        println!("  {what}: {e}");
    };
    lost("synchronize", a.synchronize());
    lost("download", a.download(&t).map(drop));
    lost("synchronize of another instance", b.synchronize());
    lost("upload", b.upload(&[1.0], &[1]).map(drop));
    lost("zeros", a.zeros(&[4]).map(drop));
    lost("a kernel", a.scale_assign(&mut t, 2.0));

    let fresh = wgpu().expect("a new instance after the loss");
    let t = fresh.upload(&[4.0, 5.0], &[2]).unwrap();
    assert_eq!(fresh.download(&t).unwrap(), [4.0, 5.0]);
}

//! Two backend instances on adapter 0 share its device and its encoder: an error one of them
//! provokes is its own, and the other's work and downloads go on. Skips without an adapter.

use std::sync::Arc;

use dflash_core::registry::BackendOptions;
use dflash_core::{BackendInfo, Error, MemoryOps};

use crate::WgpuBackend;
use crate::pipelines::{Bind, Family, Kernel};
use crate::storage::storage;

const FILL: Kernel<'static> = Kernel::new(Family::Memory, "fill");
/// `acc += x`: one buffer read, one written.
const ADD_ASSIGN: Kernel<'static> = Kernel::new(Family::Memory, "add_assign");

/// Two instances on adapter 0, or `None` after a skip line.
fn two_instances() -> Option<(WgpuBackend, WgpuBackend)> {
    // The tiled kernel: host kernels are registered by crates this one's tests do not link.
    let opts = BackendOptions {
        attention: crate::TILED.into(),
        ..BackendOptions::default()
    };
    let new = || WgpuBackend::new(&opts);
    match (new(), new()) {
        (Ok(a), Ok(b)) => Some((a, b)),
        (Err(Error::Unavailable { reason, .. }), _) => {
            println!("skipped: no wgpu adapter ({reason})");
            None
        }
        (Err(e), _) | (_, Err(e)) => panic!("the wgpu backend: {e}"),
    }
}

#[test]
fn an_error_goes_to_the_instance_that_raised_it_and_the_other_goes_on() {
    let Some((a, b)) = two_instances() else {
        return;
    };
    assert!(Arc::ptr_eq(&a.ctx, &b.ctx), "one device for both");
    assert_ne!(a.ctx.id(), b.ctx.id());
    let want = [1.0, 2.0, 3.0];
    let tb = b.upload(&want, &[3]).unwrap();
    let ta = a.upload(&[0.0; 4], &[4]).unwrap();
    let sa = storage("test", &a.ctx, &ta).unwrap();

    // An error wgpu raises outside any result: a host write of `a` past its buffer's end.
    {
        let _on = a.ctx.enter("provoke_write");
        a.ctx.queue.write_buffer(&sa.buf, 1 << 20, &[0u8; 4]);
    }
    assert_eq!(
        b.download(&tb).unwrap(),
        want,
        "b's download took a's error"
    );
    let e = a
        .synchronize()
        .expect_err("a never heard of its error")
        .to_string();
    let raised_by = format!("raised by provoke_write of {}#{}", a.ctx.tag, a.ctx.id());
    assert!(e.contains("synchronize") && e.contains(&raised_by), "{e}");
    a.synchronize().expect("an error is reported once");

    // A dispatch wgpu rejects (a binding past the buffer's end) is refused before it is
    // recorded into the shared encoder, whose rejection would fail b's work too.
    let past_end = Bind {
        buf: &sa.buf,
        offset: 0,
        size: 1 << 20,
    };
    let params = [0, 4, 0];
    let e = a
        .ctx
        .dispatch("provoke_binding", &FILL, &params, &[], &[past_end], 1);
    let e = e
        .expect_err("a binding past the end was accepted")
        .to_string();
    assert!(
        e.contains("provoke_binding") && e.contains("rejected"),
        "{e}"
    );
    assert_eq!(b.download(&tb).unwrap(), want);

    // So is a usage conflict (one buffer bound read-only and read-write), which wgpu reports
    // only when the encoder is finished.
    let (x, acc) = ([sa.bind()], [sa.bind()]);
    let e = a
        .ctx
        .dispatch("provoke_conflict", &ADD_ASSIGN, &[4], &x, &acc, 1);
    let e = e.expect_err("a usage conflict was accepted").to_string();
    assert!(e.contains("usage conflict"), "{e}");
    assert_eq!(b.download(&tb).unwrap(), want);
    a.synchronize()
        .expect("a's refused dispatches left nothing behind");
    assert_eq!(a.download(&ta).unwrap(), [0.0; 4]);
}

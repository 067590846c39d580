//! Collectives (the host path through a `Communicator`, against the reference backend; the
//! NCCL group) and copies between GPUs.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use common::*;
use dflash_core::CollectiveOps;

// ---------------------------------------------------------------------------------------
// Collectives

/// The host all-reduce, and its ordering against work queued on the stream before and after
/// it: the shared op suite's body.
#[test]
fn collective_ops_match_reference() {
    if let Some(cu) = cuda() {
        let p = CudaPath::new("f32 activations", cu, dflash_backend_cuda::DType::F32);
        dflash_tests::ops::collective::all_reduce(&p);
    }
}

// ---------------------------------------------------------------------------------------
// Device collectives (NCCL)

/// The backend on device `d`, or `None` (said) where CUDA or the device is missing.
fn cuda_on(d: usize) -> Option<dflash_backend_cuda::CudaBackend> {
    let opts = dflash_core::registry::BackendOptions {
        device: d,
        ..Default::default()
    };
    match dflash_backend_cuda::CudaBackend::with_options(
        &opts,
        dflash_backend_cuda::CudaOptions::from_env().unwrap(),
    ) {
        Ok(b) => Some(b),
        Err(e) => {
            skip(&format!("device {d}: {e}"));
            None
        }
    }
}

/// Whether this machine has 2 GPUs (said when not).
fn two_gpus() -> bool {
    match dflash_backend_cuda::device::device_count() {
        Ok(n) if n >= 2 => true,
        other => {
            skip(&format!("needs 2 GPUs; device count: {other:?}"));
            false
        }
    }
}

/// The group's members on `backends`, or `None` (said) without NCCL.
fn nccl_group(
    backends: &[&dflash_backend_cuda::CudaBackend],
) -> Option<Vec<Box<dyn dflash_core::DeviceCollective>>> {
    let endpoints: Result<Vec<_>, _> = backends.iter().map(|b| b.collective_endpoint()).collect();
    match endpoints.and_then(|e| backends[0].device_collectives(e)) {
        Ok(m) => Some(m),
        Err(dflash_core::Error::Unavailable { reason, .. }) => {
            skip(&format!("NCCL: {reason}"));
            None
        }
        Err(e) => panic!("the NCCL group failed: {e}"),
    }
}

/// One GPU: a group of one leaves the tensor as it is (loads NCCL, makes a communicator,
/// runs the call); two replicas on one GPU are refused by name.
#[test]
fn nccl_group_of_one_and_duplicate_devices() {
    let Some(cu) = cuda_on(0) else { return };
    let Some(members) = nccl_group(&[&cu]) else {
        return;
    };
    let mut r = rng(21);
    let x = rand_vec(&mut r, 10_007, 1.0);
    let mut t = up(&cu, &x, &[10_007]);
    members[0].all_reduce_sum(&mut t).unwrap();
    check_exact("NCCL all-reduce over one rank", &down(&cu, &t), &x);
    assert!(members[0].describe().contains("rank 0 of 1 on cuda:0"));
    let e = cu
        .device_collectives(vec![
            cu.collective_endpoint().unwrap(),
            cu.collective_endpoint().unwrap(),
        ])
        .err()
        .expect("two ranks on one GPU are refused")
        .to_string();
    assert!(e.contains("two drafter replicas on cuda:0"), "{e}");
}

/// Two GPUs: each rank's thread sums its tensor with the other's; both end with x0 + x1,
/// bit for bit what the host computes (one f32 addition per element, in either order).
#[test]
fn nccl_two_gpus_sum_like_the_host() {
    if !two_gpus() {
        return;
    }
    let (Some(c0), Some(c1)) = (cuda_on(0), cuda_on(1)) else {
        return;
    };
    let Some(members) = nccl_group(&[&c0, &c1]) else {
        return;
    };
    let mut r = rng(22);
    let len = (1 << 20) + 3;
    let (x0, x1) = (rand_vec(&mut r, len, 1.0), rand_vec(&mut r, len, 1.0));
    let want: Vec<f32> = x0.iter().zip(&x1).map(|(a, b)| a + b).collect();
    let (mut t0, mut t1) = (up(&c0, &x0, &[len]), up(&c1, &x1, &[len]));
    let [m0, m1]: [Box<dyn dflash_core::DeviceCollective>; 2] =
        members.try_into().ok().expect("two members");
    let (t0, t1) = std::thread::scope(|s| {
        let a = s.spawn(move || {
            m0.all_reduce_sum(&mut t0).unwrap();
            t0
        });
        let b = s.spawn(move || {
            m1.all_reduce_sum(&mut t1).unwrap();
            t1
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    check_exact("NCCL all-reduce, rank 0", &down(&c0, &t0), &want);
    check_exact("NCCL all-reduce, rank 1", &down(&c1, &t1), &want);
}

/// The group across processes, joined through NCCL's unique id, on one GPU: a group of one
/// (rank 0 makes the id and joins it) leaves the tensor as it is; an id of the wrong length
/// and a rank outside the group are refused by name.
#[test]
fn nccl_joined_group_of_one() {
    let Some(cu) = cuda_on(0) else { return };
    let id = match cu.device_collective_id() {
        Ok(id) => id,
        Err(dflash_core::Error::Unavailable { reason, .. }) => {
            return skip(&format!("NCCL: {reason}"));
        }
        Err(e) => panic!("ncclGetUniqueId failed: {e}"),
    };
    assert_eq!(id.len(), 128, "NCCL's unique id");
    let member = cu.join_device_collective(&id, 0, 1).unwrap();
    let mut r = rng(23);
    let x = rand_vec(&mut r, 4099, 1.0);
    let mut t = up(&cu, &x, &[4099]);
    member.all_reduce_sum(&mut t).unwrap();
    check_exact("NCCL joined all-reduce over one rank", &down(&cu, &t), &x);
    assert!(member.describe().contains("rank 0 of 1 on cuda:0"));
    let short = cu
        .join_device_collective(&id[..100], 0, 1)
        .err()
        .unwrap()
        .to_string();
    assert!(short.contains("128 bytes, this one 100"), "{short}");
    let outside = cu
        .join_device_collective(&id, 2, 2)
        .err()
        .unwrap()
        .to_string();
    assert!(outside.contains("rank 2 of a group of 2"), "{outside}");
}

/// Two GPUs, as two processes would: rank 0's id, each rank joining from its own thread on
/// its own GPU, then summing like the host.
#[test]
fn nccl_joined_group_of_two_gpus_sums_like_the_host() {
    if !two_gpus() {
        return;
    }
    let (Some(c0), Some(c1)) = (cuda_on(0), cuda_on(1)) else {
        return;
    };
    let id = match c0.device_collective_id() {
        Ok(id) => id,
        Err(e) => return skip(&format!("NCCL: {e}")),
    };
    let mut r = rng(24);
    let len = (1 << 16) + 5;
    let (x0, x1) = (rand_vec(&mut r, len, 1.0), rand_vec(&mut r, len, 1.0));
    let want: Vec<f32> = x0.iter().zip(&x1).map(|(a, b)| a + b).collect();
    let (t0, t1) = std::thread::scope(|s| {
        let (id, c0, c1, x0, x1) = (&id, &c0, &c1, &x0, &x1);
        let a = s.spawn(move || {
            let m = c0.join_device_collective(id, 0, 2).unwrap();
            let mut t = up(c0, x0, &[len]);
            m.all_reduce_sum(&mut t).unwrap();
            t
        });
        let b = s.spawn(move || {
            let m = c1.join_device_collective(id, 1, 2).unwrap();
            let mut t = up(c1, x1, &[len]);
            m.all_reduce_sum(&mut t).unwrap();
            t
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    check_exact("NCCL joined all-reduce, rank 0", &down(&c0, &t0), &want);
    check_exact("NCCL joined all-reduce, rank 1", &down(&c1, &t1), &want);
}

/// Two GPUs: a tensor of GPU 0 imported by GPU 1's backend is a peer copy that GPU 1 owns,
/// with exactly the values GPU 0 holds in the compute format.
#[test]
fn peer_import_between_two_gpus() {
    if !two_gpus() {
        return;
    }
    let (Some(c0), Some(c1)) = (cuda_on(0), cuda_on(1)) else {
        return;
    };
    use dflash_core::MemoryOps;
    let mut r = rng(23);
    let n = 3 * 4096 + 5;
    let x = rand_vec(&mut r, n, 2.0);
    let t0 = up(&c0, &x, &[n]);
    let want = down(&c0, &c0.to_compute_format(c0.copy(&t0).unwrap()).unwrap());
    assert!(!c1.is_local(&t0));
    let t1 = c1.import(&t0).unwrap();
    assert!(c1.is_local(&t1), "the import lives on cuda:1");
    check_exact("peer import cuda:0 -> cuda:1", &down(&c1, &t1), &want);
}

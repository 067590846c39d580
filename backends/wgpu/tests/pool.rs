//! The buffer pool (`src/pool.rs`): a freed tensor's buffer serves a later allocation of its
//! size class once the work that used it was submitted, reads as zeros where the allocation
//! promises zeros and as the uploaded values where it is an upload, and never changes what
//! queued work reads. The whole conformance suite runs with the pool on (the default); these
//! cases aim at the reuse itself.
//!
//! Skips cleanly without an adapter, or with `DFLASH_WGPU_POOL=0` (no pool to test).

mod common;

use common::*;
use dflash_core::MemoryOps;

/// Every backend instance of this process on the adapter shares one device and so one pool:
/// a test that releases the cache, or takes and frees buffers, while another counts its hits
/// would make that one fail at random. The tests here hold this lock throughout.
static ONE_POOL_TEST_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The backend when its device pools buffers, and the lock that keeps the other tests of this
/// file off its pool (held by a test that failed: still a lock).
fn pooled() -> Option<(
    dflash_backend_wgpu::WgpuBackend,
    std::sync::MutexGuard<'static, ()>,
)> {
    if std::env::var("DFLASH_WGPU_POOL").is_ok_and(|v| v == "0") {
        skip("DFLASH_WGPU_POOL=0: no buffer pool");
        return None;
    }
    let guard = ONE_POOL_TEST_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Poison off: `zeros` must read as zeros because the reused buffer was cleared, not
    // because a poison fill wrote over it.
    Some((wgpu_poison_off()?, guard))
}

#[test]
fn a_freed_buffer_comes_back_cleared_or_overwritten() {
    let Some((be, _one_at_a_time)) = pooled() else {
        return;
    };
    let mut r = rng(31);
    let n = 5000;
    for round in 0..3 {
        let x = up(&be, &rand_vec(&mut r, n, 2.0), &[n]);
        let y = be.add(&x, &x).unwrap();
        drop(x);
        // The download submits the pending encoder, whose last use of x's buffer is the add.
        let sum = down(&be, &y);
        assert!(sum.iter().all(|v| v.is_finite() && *v != 0.0));
        // Freed after a submit: handed out after the next one. Submit once more.
        down(&be, &be.zeros(&[1]).unwrap());
        let (hits, _, _) = be.buffer_pool_stats();
        let z = be.zeros(&[n]).unwrap();
        let (hits_after, _, _) = be.buffer_pool_stats();
        assert!(
            hits_after > hits,
            "round {round}: zeros({n}) did not reuse a freed buffer"
        );
        check_exact(
            &format!("round {round}: zeros in a reused buffer"),
            &down(&be, &z),
            &vec![0.0; n],
        );
        drop(z);
        down(&be, &be.zeros(&[1]).unwrap());
        let data = rand_vec(&mut r, n, 1.0);
        let u = up(&be, &data, &[n]);
        check_exact(
            &format!("round {round}: upload into a reused buffer"),
            &down(&be, &u),
            &data,
        );
    }
}

/// Work queued on a tensor, the tensor dropped, then uploads and zero-filled allocations of
/// its size before anything is submitted: the queued work still reads the old values (the
/// freed buffer is not handed out until the work that used it was submitted).
#[test]
fn queued_work_reads_the_values_of_a_dropped_tensor() {
    let Some((be, _one_at_a_time)) = pooled() else {
        return;
    };
    let mut r = rng(32);
    let n = 3000;
    // Warm the pool with buffers of this size class.
    let warm: Vec<_> = (0..4)
        .map(|_| up(&be, &rand_vec(&mut r, n, 1.0), &[n]))
        .collect();
    drop(warm);
    down(&be, &be.zeros(&[1]).unwrap());
    for round in 0..4 {
        let a_vals = rand_vec(&mut r, n, 1.0);
        let a = up(&be, &a_vals, &[n]);
        let copies: Vec<_> = (0..3).map(|_| be.copy(&a).unwrap()).collect();
        drop(a);
        let others: Vec<Vec<f32>> = (0..3).map(|_| rand_vec(&mut r, n, 1.0)).collect();
        let ups: Vec<_> = others.iter().map(|o| up(&be, o, &[n])).collect();
        let zs: Vec<_> = (0..3).map(|_| be.zeros(&[n]).unwrap()).collect();
        for (i, c) in copies.iter().enumerate() {
            check_exact(
                &format!("round {round}: copy {i} of the dropped tensor"),
                &down(&be, c),
                &a_vals,
            );
        }
        for (u, o) in ups.iter().zip(&others) {
            check_exact(
                &format!("round {round}: an upload queued after the drop"),
                &down(&be, u),
                o,
            );
        }
        for z in &zs {
            check_exact(
                &format!("round {round}: zeros queued after the drop"),
                &down(&be, z),
                &vec![0.0; n],
            );
        }
    }
    let (hits, misses, held) = be.buffer_pool_stats();
    println!("  pool: {hits} hits, {misses} misses, {held} bytes held");
    assert!(hits > 0, "nothing was reused");
}

/// `release_cached_memory` lets the pool's free buffers go: it holds less than the freed
/// tensor afterwards, and the next allocation of that size finds nothing to reuse.
#[test]
fn released_cache_is_not_reused() {
    use dflash_core::BackendInfo;
    let Some((be, _one_at_a_time)) = pooled() else {
        return;
    };
    let n = 5000;
    drop(up(&be, &rand_vec(&mut rng(7), n, 1.0), &[n]));
    // Two submits: the freed buffer is handed out only after the one following its free.
    down(&be, &be.zeros(&[1]).unwrap());
    down(&be, &be.zeros(&[1]).unwrap());
    let (_, _, held) = be.buffer_pool_stats();
    assert!(
        held >= 4 * n as u64,
        "the freed buffer is pooled: {held} bytes held"
    );
    be.release_cached_memory();
    let (hits, misses, held_after) = be.buffer_pool_stats();
    assert!(held_after < 4 * n as u64, "{held_after} bytes still held");
    let z = be.zeros(&[n]).unwrap();
    let (hits_after, misses_after, _) = be.buffer_pool_stats();
    assert_eq!(hits_after, hits, "reused a buffer the release let go");
    assert_eq!(misses_after, misses + 1);
    check_exact("zeros after the release", &down(&be, &z), &vec![0.0; n]);
}

//! Collectives (the host path through a `Communicator`) against the reference backend, and
//! the ordering of the in-place write against work recorded before and after it.
//!
//! Skips cleanly without an adapter; inputs, poisoning and tolerances: `common`.

mod common;

use common::*;
use dflash_core::{CollectiveOps, Communicator, MemoryOps};

/// Rank 0 of a pretend world whose other ranks hold fixed buffers.
struct FakeWorld(Vec<Vec<f32>>);
impl Communicator for FakeWorld {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        self.0.len() + 1
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> std::result::Result<(), String> {
        for other in &self.0 {
            if other.len() != data.len() {
                return Err(format!("length {} vs {}", other.len(), data.len()));
            }
            for (d, o) in data.iter_mut().zip(other) {
                *d += o;
            }
        }
        Ok(())
    }
}

#[test]
fn collective_ops_match_reference() {
    let rf = reference();
    let mut r = rng(9);
    for (label, be) in wgpu_both() {
        let n = 4099;
        let x = rand_vec(&mut r, n, 1.0);
        let world = FakeWorld(vec![rand_vec(&mut r, n, 1.0), rand_vec(&mut r, n, 1.0)]);
        let (mut xw, mut xr) = (up(&be, &x, &[n]), up(&rf, &x, &[n]));
        // Recorded before the collective (not yet submitted): must see the old values.
        let before = be.copy(&xw).unwrap();
        be.all_reduce_sum(&mut xw, &world).unwrap();
        let after = be.copy(&xw).unwrap();
        rf.all_reduce_sum(&mut xr, &world).unwrap();
        let want = down(&rf, &xr);
        check_exact(
            &format!("[{label}] all_reduce_sum (host path)"),
            &down(&be, &xw),
            &want,
        );
        check_exact(
            &format!("[{label}] a copy recorded before it"),
            &down(&be, &before),
            &x,
        );
        check_exact(
            &format!("[{label}] a copy recorded after it"),
            &down(&be, &after),
            &want,
        );
        let bad = FakeWorld(vec![vec![0.0; 3]]);
        let e = be.all_reduce_sum(&mut xw, &bad).err().unwrap().to_string();
        assert!(
            e.contains("communicator failed") && e.contains("wgpu:0"),
            "{e}"
        );
    }
}

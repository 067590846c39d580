//! Collectives (the host path through a `Communicator`) against the reference backend.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use common::*;
use dflash_core::{CollectiveOps, Communicator};

// ---------------------------------------------------------------------------------------
// Collectives

/// Rank 0 of a pretend world of 3 whose other ranks hold fixed buffers.
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
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(9);
    let n = 4099;
    let x = rand_vec(&mut r, n, 1.0);
    let world = FakeWorld(vec![rand_vec(&mut r, n, 1.0), rand_vec(&mut r, n, 1.0)]);
    let (mut xc, mut xr) = (up(&cu, &x, &[n]), up(&rf, &x, &[n]));
    cu.all_reduce_sum(&mut xc, &world).unwrap();
    rf.all_reduce_sum(&mut xr, &world).unwrap();
    check_exact(
        "all_reduce_sum (host path)",
        &down(&cu, &xc),
        &down(&rf, &xr),
    );
    let bad = FakeWorld(vec![vec![0.0; 3]]);
    let e = cu.all_reduce_sum(&mut xc, &bad).err().unwrap().to_string();
    assert!(
        e.contains("communicator failed") && e.contains("cuda:0"),
        "{e}"
    );
}

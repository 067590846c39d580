//! The host all-reduce through a [`Communicator`] against the reference backend, and its
//! in-place write ordered against the device work queued before and after it.

use dflash_core::{CollectiveOps, Communicator};

use super::{OpPath, check_exact, down, rand_vec, reference, rng, up};

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

/// A world of 3: the sum is exact against the reference's (the same f32 adds in the same
/// order), a copy queued before the collective sees the old values and one queued after the
/// new, and a communicator's failure is an error naming the device.
pub fn all_reduce(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let mut r = rng(9);
    let n = 4099;
    let x = rand_vec(&mut r, n, 1.0);
    let world = FakeWorld(vec![rand_vec(&mut r, n, 1.0), rand_vec(&mut r, n, 1.0)]);
    let (mut xb, mut xr) = (up(be, &x, &[n]), up(&rf, &x, &[n]));
    let before = be.copy(&xb).unwrap();
    be.all_reduce_sum(&mut xb, &world).unwrap();
    let after = be.copy(&xb).unwrap();
    rf.all_reduce_sum(&mut xr, &world).unwrap();
    let want = down(&rf, &xr);
    let label = path.label();
    check_exact(
        &format!("[{label}] all_reduce_sum (host path)"),
        &down(be, &xb),
        &want,
    );
    check_exact(
        &format!("[{label}] a copy queued before it"),
        &down(be, &before),
        &x,
    );
    check_exact(
        &format!("[{label}] a copy queued after it"),
        &down(be, &after),
        &want,
    );
    let bad = FakeWorld(vec![vec![0.0; 3]]);
    let e = be.all_reduce_sum(&mut xb, &bad).err().unwrap().to_string();
    assert!(
        e.contains("communicator failed") && e.contains(path.device()),
        "{e}"
    );
}

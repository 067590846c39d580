//! Memory ops and the collective: pure data movement is checked bit-exactly.

mod common;

use common::*;
use dflash_core::MemoryOps;

#[test]
fn memory_ops() {
    let be = backend();
    let mut r = rng(4);
    let a = rand_vec(&mut r, 4 * 3 * 2);
    let b = rand_vec(&mut r, 4 * 3 * 2);
    let ta = up(&be, &a, &[4, 3, 2]);
    let tb = up(&be, &b, &[4, 3, 2]);
    // Pure data movement: exact.
    assert_bits_eq("download(upload)", &down(&be, &ta), &a);
    assert_bits_eq("copy", &down(&be, &be.copy(&ta).unwrap()), &a);
    assert_bits_eq("zeros", &down(&be, &be.zeros(&[3, 2]).unwrap()), &[0.0; 6]);
    let n = be.narrow_rows(&ta, 1, 2).unwrap();
    assert_eq!(n.dims(), &[2, 3, 2]);
    assert_bits_eq("narrow_rows", &down(&be, &n), &a[6..18]);
    let c = be.concat_rows(&[&ta, &n]).unwrap();
    assert_eq!(c.dims(), &[6, 3, 2]);
    assert_bits_eq("concat_rows", &down(&be, &c), &[&a[..], &a[6..18]].concat());
    let x = up(&be, &a[..8], &[4, 2]);
    let y = up(&be, &b[..12], &[4, 3]);
    let cc = be.concat_cols(&[&x, &y]).unwrap();
    assert_eq!(cc.dims(), &[4, 5]);
    let want: Vec<f32> = (0..4)
        .flat_map(|r| [&a[r * 2..r * 2 + 2], &b[r * 3..r * 3 + 3]].concat())
        .collect();
    assert_bits_eq("concat_cols", &down(&be, &cc), &want);
    // One f32 add / multiply per element: exact against the same f32 operation.
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_bits_eq("add", &down(&be, &be.add(&ta, &tb).unwrap()), &sum);
    let mut acc = be.copy(&ta).unwrap();
    be.add_assign(&mut acc, &tb).unwrap();
    assert_bits_eq("add_assign", &down(&be, &acc), &sum);
    be.scale_assign(&mut acc, -0.75).unwrap();
    let scaled: Vec<f32> = sum.iter().map(|v| v * -0.75).collect();
    assert_bits_eq("scale_assign", &down(&be, &acc), &scaled);
    // f64 sum of squares of f32 values: only summation order differs, 1e-12 relative.
    let ss: f64 = a.iter().map(|&v| v as f64 * v as f64).sum();
    assert!((be.sum_squares(&ta).unwrap() - ss).abs() <= 1e-12 * ss);
    assert!(be.all_finite(&ta).unwrap());
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut d = a.clone();
        d[17] = bad;
        assert!(
            !be.all_finite(&up(&be, &d, &[4, 3, 2])).unwrap(),
            "{bad} not detected"
        );
    }
}

/// A two-rank communicator seen from rank 0: the other rank contributes `other`.
struct TwoRanks {
    other: Vec<f32>,
    fail: bool,
}
impl dflash_core::Communicator for TwoRanks {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        2
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), String> {
        if self.fail {
            return Err("peer 1 hung up".into());
        }
        data.iter_mut().zip(&self.other).for_each(|(a, b)| *a += b);
        Ok(())
    }
}

#[test]
fn all_reduce_sum_goes_through_the_communicator() {
    use dflash_core::CollectiveOps;
    let be = backend();
    let mut r = rng(10);
    let (a, b) = (rand_vec(&mut r, 12), rand_vec(&mut r, 12));
    let mut t = up(&be, &a, &[3, 4]);
    be.all_reduce_sum(
        &mut t,
        &TwoRanks {
            other: b.clone(),
            fail: false,
        },
    )
    .unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_bits_eq("all_reduce_sum", &down(&be, &t), &want); // one f32 add: exact
    let err = be
        .all_reduce_sum(
            &mut t,
            &TwoRanks {
                other: b,
                fail: true,
            },
        )
        .unwrap_err();
    let s = err.to_string();
    assert!(
        s.contains("all_reduce_sum") && s.contains("peer 1 hung up") && s.contains("rank 0"),
        "{s}"
    );
}

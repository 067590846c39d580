//! The process group's collectives over real sockets on 127.0.0.1, each rank on its own
//! thread: sums, chunks, broadcast, barrier, joining, and mismatches between ranks.

mod group_support;

use std::thread;
use std::time::{Duration, Instant};

use dflash_launch::{LaunchEnv, ProcessGroup};
use group_support::{LONG, connect_all, env, err_text, free_port, on_every_rank};

/// Values of mixed magnitude and sign from a fixed-seed LCG, with -0.0 at every 13th place
/// (on every rank, so the sum there must be +0.0 from the +0.0 start) and a few subnormals.
fn values(seed: u64, len: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = (s >> 40) as u32; // 24 random bits
            let mantissa = (u & 0xffff) as f32 / 65536.0 + 0.5;
            let exp = ((u >> 16) % 60) as i32 - 30;
            let sign = if (u >> 23) & 1 == 1 { -1.0 } else { 1.0 };
            match i % 13 {
                0 => -0.0,
                7 => sign * f32::from_bits(u & 0x3f),
                _ => sign * mantissa * 2f32.powi(exp),
            }
        })
        .collect()
}

/// The sum every rank must get: `acc = 0.0; acc += x_r` in rank order, as bits.
fn host_sum(per_rank: &[Vec<f32>]) -> Vec<u32> {
    (0..per_rank[0].len())
        .map(|i| {
            let mut acc = 0.0f32;
            for x in per_rank {
                acc += x[i];
            }
            acc.to_bits()
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn group_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<ProcessGroup>();
}

#[test]
fn three_ranks_sum_bit_for_bit_in_rank_order() {
    let groups = connect_all(3);
    let results = on_every_rank(groups, |g| {
        let mut got = Vec::new();
        for round in 0..6u64 {
            let len = 1000 + 37 * round as usize;
            let mut mine = values(round * 10 + g.rank() as u64, len);
            g.all_reduce_sum(&mut mine).unwrap();
            got.push(bits(&mine));
        }
        got
    });
    for round in 0..6u64 {
        let len = 1000 + 37 * round as usize;
        let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(round * 10 + r, len)).collect();
        let want = host_sum(&inputs);
        // The order matters for these inputs: summing from the last rank differs somewhere.
        if round == 0 {
            let reversed: Vec<Vec<f32>> = inputs.iter().rev().cloned().collect();
            assert_ne!(
                host_sum(&reversed),
                want,
                "the test data cannot tell orders apart"
            );
            assert_eq!(want[0], 0.0f32.to_bits(), "-0.0 summed from +0.0 is +0.0");
        }
        for (r, got) in results.iter().enumerate() {
            assert_eq!(got[round as usize], want, "rank {r}, round {round}");
        }
    }
}

#[test]
fn small_chunks_give_the_same_bits() {
    let groups = connect_all(3);
    let results = on_every_rank(groups, |g| {
        let mine = values(99 + g.rank() as u64, 100);
        g.set_chunk_elems(7);
        let mut chunked = mine.clone();
        g.all_reduce_sum(&mut chunked).unwrap();
        g.set_chunk_elems(usize::MAX);
        let mut whole = mine.clone();
        g.all_reduce_sum(&mut whole).unwrap();
        // Empty input: still a collective, with nothing to send.
        g.all_reduce_sum(&mut []).unwrap();
        (bits(&chunked), bits(&whole))
    });
    let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(99 + r, 100)).collect();
    let want = host_sum(&inputs);
    for (r, (chunked, whole)) in results.iter().enumerate() {
        assert_eq!(chunked, &want, "rank {r} chunked");
        assert_eq!(whole, &want, "rank {r} whole");
    }
}

#[test]
fn broadcast_and_barrier() {
    let groups = connect_all(3);
    let big: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    let want = big.clone();
    let results = on_every_rank(groups, move |g| {
        let mine = if g.rank() == 0 {
            big.clone()
        } else {
            vec![g.rank() as u8; 5]
        };
        let path = g.broadcast(&mine).unwrap();
        g.set_chunk_elems(7); // 28-byte chunks
        let chunked = g.broadcast(&mine).unwrap();
        let empty = g
            .broadcast(if g.rank() == 0 { &[] } else { &[1, 2] })
            .unwrap();
        // Rank 2 arrives late: nobody may leave the barrier before it.
        if g.rank() == 2 {
            thread::sleep(Duration::from_millis(300));
        }
        let start = Instant::now();
        g.barrier().unwrap();
        (path, chunked, empty, start.elapsed())
    });
    for (r, (path, chunked, empty, waited)) in results.into_iter().enumerate() {
        assert_eq!(path, want, "rank {r}");
        assert_eq!(chunked, want, "rank {r} chunked");
        assert!(empty.is_empty(), "rank {r}: {empty:?}");
        if r != 2 {
            assert!(waited >= Duration::from_millis(200), "rank {r}: {waited:?}");
        }
    }
}

#[test]
fn world_of_one_is_a_no_op() {
    // Nothing listens on, or could bind, this address: a world of one must not try.
    let e = LaunchEnv {
        master_addr: "192.0.2.1".to_owned(),
        ..env(0, 1, 9)
    };
    let g = ProcessGroup::connect(&e, LONG).unwrap();
    assert_eq!((g.rank(), g.world_size()), (0, 1));
    let mut data = vec![-0.0f32, 1.5, f32::from_bits(0x7fc0_0001)];
    let before = bits(&data);
    g.all_reduce_sum(&mut data).unwrap();
    assert_eq!(bits(&data), before);
    assert_eq!(g.broadcast(b"run-dir").unwrap(), b"run-dir");
    g.barrier().unwrap();
}

#[test]
fn length_mismatch_fails_every_rank_naming_both_lengths() {
    let groups = connect_all(3);
    let results = on_every_rank(groups, |g| {
        let mut data = vec![1.0f32; if g.rank() == 1 { 10 } else { 12 }];
        let first = err_text(g.all_reduce_sum(&mut data));
        // The group is broken now: later calls fail at once, with the same message.
        let start = Instant::now();
        let later = err_text(g.barrier());
        (first, later, start.elapsed())
    });
    let msg = "all_reduce_sum: rank 1 has 10 values, rank 0 has 12";
    for (r, (first, later, took)) in results.iter().enumerate() {
        assert_eq!(first, msg, "rank {r}");
        assert_eq!(
            later, "barrier: rank 1 has 10 values, rank 0 has 12",
            "rank {r}"
        );
        assert!(*took < Duration::from_millis(100), "rank {r}: {took:?}");
    }
}

#[test]
fn mismatched_calls_and_chunk_sizes_fail_every_rank() {
    let groups = connect_all(2);
    let results = on_every_rank(groups, |g| {
        if g.rank() == 0 {
            err_text(g.all_reduce_sum(&mut [1.0]))
        } else {
            err_text(g.barrier())
        }
    });
    for (r, e) in results.iter().enumerate() {
        assert!(
            e.contains("rank 1 called barrier but rank 0 called all_reduce_sum (collective #1)"),
            "rank {r}: {e}"
        );
    }
    let groups = connect_all(2);
    let results = on_every_rank(groups, |g| {
        if g.rank() == 1 {
            g.set_chunk_elems(7);
        }
        err_text(g.all_reduce_sum(&mut [1.0; 20]))
    });
    for (r, e) in results.iter().enumerate() {
        assert!(
            e.contains("rank 1 sends chunks of 7 values, rank 0 of 16777216"),
            "rank {r}: {e}"
        );
    }
}

#[test]
fn ranks_may_start_before_rank_zero() {
    let port = free_port();
    let handles: Vec<_> = (0..3)
        .map(|r| {
            thread::spawn(move || {
                if r == 0 {
                    thread::sleep(Duration::from_millis(300));
                }
                let g = ProcessGroup::connect(&env(r, 3, port), LONG).unwrap();
                let mut v = vec![r as f32 + 1.0; 4];
                g.all_reduce_sum(&mut v).unwrap();
                v
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), vec![6.0; 4]);
    }
}

#[test]
fn wrong_world_size_fails_every_rank_with_one_message() {
    let port = free_port();
    let spawn = |r: usize, world: usize| {
        thread::spawn(move || err_text(ProcessGroup::connect(&env(r, world, port), LONG)))
    };
    let root = spawn(0, 3);
    let good = spawn(1, 3);
    // Rank 1 must be connected before the bad hello arrives, to be told.
    thread::sleep(Duration::from_millis(300));
    let bad = spawn(2, 4);
    let root_err = root.join().unwrap();
    assert!(
        root_err.contains("rank 2 has WORLD_SIZE=4 but rank 0 has WORLD_SIZE=3"),
        "{root_err}"
    );
    for (r, h) in [(1, good), (2, bad)] {
        let e = h.join().unwrap();
        assert!(e.contains(&root_err), "rank {r}: {e}");
    }
}

//! The process group's failures over real sockets on 127.0.0.1: aborts, ranks that end, late
//! or silent ranks, garbage, and writes stuck on a peer that stopped reading.

mod group_support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dflash_launch::ProcessGroup;
use group_support::{
    LONG, PROMPT, connect_all, env, err_text, fake_rank_one, frame, free_port, on_every_rank,
    op_frame, welcome,
};

/// Ranks other than `odd` block in an all-reduce; `odd` does `act` after 200 ms instead.
/// Gives each rank's error (`None` for `odd`) and how long after `act` it came.
fn while_others_wait(
    odd: usize,
    act: impl Fn(ProcessGroup) + Send + Sync + 'static,
) -> Vec<Option<(String, Duration)>> {
    let groups = connect_all(3);
    let acted = Arc::new(std::sync::OnceLock::<Instant>::new());
    let seen = acted.clone();
    let results = on_every_rank(groups, move |g| {
        if g.rank() == odd {
            thread::sleep(Duration::from_millis(200));
            let _ = seen.set(Instant::now());
            act(g);
            return None;
        }
        let e = err_text(g.all_reduce_sum(&mut [1.0; 64]));
        Some((e, seen.get().map(|t| t.elapsed()).unwrap_or_default()))
    });
    assert!(acted.get().is_some());
    results
}

#[test]
fn abort_reaches_every_blocked_rank_promptly() {
    for aborter in 0..3 {
        let results = while_others_wait(aborter, |g| g.abort("boom"));
        for (r, res) in results.into_iter().enumerate() {
            let Some((e, after)) = res else { continue };
            assert_eq!(
                e,
                format!("all_reduce_sum: rank {aborter} failed: boom"),
                "rank {r}"
            );
            assert!(after < PROMPT, "rank {r} heard after {after:?}");
        }
    }
}

#[test]
fn abort_from_another_thread_ends_a_blocked_call() {
    // Rank 0 computes (no call); ranks 1 and 2 wait in an all-reduce; a second thread of
    // rank 1 aborts. Rank 1's own call, and rank 2's through rank 0's watch, end at once.
    let mut groups = connect_all(3).into_iter();
    let (g0, g1, g2) = (
        groups.next().unwrap(),
        groups.next().unwrap(),
        groups.next().unwrap(),
    );
    let g1 = Arc::new(g1);
    let both = Arc::new(Barrier::new(3));
    let (b1, b2) = (both.clone(), both.clone());
    let g1c = g1.clone();
    let h1 = thread::spawn(move || {
        b1.wait();
        let e = err_text(g1c.all_reduce_sum(&mut [1.0; 8]));
        (e, Instant::now())
    });
    let h2 = thread::spawn(move || {
        b2.wait();
        let e = err_text(g2.all_reduce_sum(&mut [1.0; 8]));
        (e, Instant::now())
    });
    both.wait();
    thread::sleep(Duration::from_millis(200));
    let aborted = Instant::now();
    g1.abort("drafter replica 0: non-finite loss");
    g1.abort("a second abort changes nothing");
    assert!(
        aborted.elapsed() < PROMPT,
        "abort took {:?}",
        aborted.elapsed()
    );
    let want = "all_reduce_sum: rank 1 failed: drafter replica 0: non-finite loss";
    for (r, h) in [(1, h1), (2, h2)] {
        let (e, at) = h.join().unwrap();
        assert_eq!(e, want, "rank {r}");
        assert!(at.duration_since(aborted) < PROMPT, "rank {r}");
    }
    // Rank 0's next call fails with the same words.
    let e = err_text(g0.barrier());
    assert_eq!(
        e,
        "barrier: rank 1 failed: drafter replica 0: non-finite loss"
    );
}

#[test]
fn a_rank_that_ends_is_named_promptly() {
    for dying in 0..3 {
        let results = while_others_wait(dying, drop);
        for (r, res) in results.into_iter().enumerate() {
            let Some((e, after)) = res else { continue };
            assert_eq!(
                e,
                format!("all_reduce_sum: rank {dying} closed its connection (its process ended)"),
                "rank {r}"
            );
            assert!(after < PROMPT, "rank {r} heard after {after:?}");
        }
    }
}

#[test]
fn late_rank_is_named_at_the_op_timeout() {
    let groups = connect_all(3);
    let results = on_every_rank(groups, |g| {
        g.set_op_timeout(Duration::from_millis(300));
        if g.rank() == 2 {
            // Alive but busy; its own next call hears what happened.
            thread::sleep(Duration::from_millis(800));
            return (err_text(g.barrier()), Duration::ZERO);
        }
        let start = Instant::now();
        (err_text(g.all_reduce_sum(&mut [2.0; 3])), start.elapsed())
    });
    let msg = "rank 0 timed out after 0.3 s waiting for rank 2";
    for (r, (e, took)) in results.iter().enumerate() {
        assert!(e.ends_with(msg), "rank {r}: {e}");
        if r < 2 {
            assert!(e.starts_with("all_reduce_sum: "), "rank {r}: {e}");
            assert!(*took < Duration::from_millis(800), "rank {r}: {took:?}");
        }
    }
}

#[test]
fn garbage_from_a_peer_is_an_error_not_a_panic() {
    // A fake rank 1 joins properly, then sends a 4 GB frame header instead of its op frame.
    let port = free_port();
    let root = thread::spawn(move || {
        let g = ProcessGroup::connect(&env(0, 2, port), LONG)?;
        g.all_reduce_sum(&mut [1.0; 4])
    });
    let mut s = fake_rank_one(port);
    s.write_all(&[0xff, 0xff, 0xff, 0xff, b'D', b'F', b'R', b'V', 5])
        .unwrap();
    let e = err_text(root.join().unwrap());
    assert!(
        e.starts_with("all_reduce_sum: bad data from rank 1: "),
        "{e}"
    );
    assert!(e.contains("more than the 25"), "{e}");
    // And rank 1 is told.
    let mut back = Vec::new();
    s.set_read_timeout(Some(LONG)).unwrap();
    let _ = s.read_to_end(&mut back);
    let told = &e["all_reduce_sum: ".len()..];
    assert_eq!(back, frame(4, told.as_bytes()));
}

#[test]
fn garbage_from_rank_zero_is_an_error_not_a_panic() {
    // A fake rank 0 admits rank 1, then answers its op frame with nonsense.
    let cases: [(&[u8], &str); 3] = [
        (
            &[0xff, 0xff, 0xff, 0xff, b'D', b'F', b'R', b'V', 7],
            "more than the 8",
        ),
        (&frame(6, &[0; 8]), "tag 6 where the go-ahead belongs"),
        (&frame(7, &[0; 3]), "a ready frame of 3 bytes, expected 8"),
    ];
    for (bytes, expected) in cases {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let peer = thread::spawn(move || {
            let g = ProcessGroup::connect(&env(1, 2, port), LONG)?;
            g.barrier()
        });
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 29];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&[welcome(), frame(7, &[])].concat()).unwrap();
        let mut op = [0u8; 9 + 25];
        s.read_exact(&mut op).unwrap();
        assert_eq!(op[8], 5, "an op frame");
        s.write_all(bytes).unwrap();
        let e = err_text(peer.join().unwrap());
        assert!(
            e.starts_with("barrier: rank 1 got bad data from rank 0: "),
            "{e}"
        );
        assert!(e.contains(expected), "{expected}: {e}");
    }
}

/// More than loopback sockets buffer, so a write of it blocks until the other side reads.
const BIG: usize = 8 << 20;

#[test]
fn a_rank_stuck_writing_hears_that_rank_zero_failed() {
    // A fake rank 0 takes rank 1's op frame, says go, then reads none of its 32 MB and fails.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = thread::spawn(move || {
        let g = ProcessGroup::connect(&env(1, 2, port), LONG)?;
        g.all_reduce_sum(&mut vec![1.0; BIG])
    });
    let (mut s, _) = listener.accept().unwrap();
    let mut hello_and_op = [0u8; 29 + 34];
    s.write_all(&[welcome(), frame(7, &[])].concat()).unwrap();
    s.read_exact(&mut hello_and_op).unwrap();
    assert_eq!(&hello_and_op[29..], &op_frame(BIG as u64)[..]);
    s.write_all(&frame(7, &0u64.to_le_bytes())).unwrap();
    thread::sleep(Duration::from_millis(300));
    assert!(!peer.is_finished(), "rank 1 should be stuck in its write");
    let failed = Instant::now();
    s.write_all(&frame(4, b"rank 0 failed: out of memory"))
        .unwrap();
    let e = err_text(peer.join().unwrap());
    assert_eq!(e, "all_reduce_sum: rank 0 failed: out of memory");
    assert!(failed.elapsed() < PROMPT, "{:?}", failed.elapsed());
}

#[test]
fn rank_zero_stuck_writing_hears_that_a_rank_failed() {
    // A fake rank 1 sends its 32 MB, reads none of the sums back, then fails.
    let port = free_port();
    let root = thread::spawn(move || {
        let g = ProcessGroup::connect(&env(0, 2, port), LONG)?;
        g.all_reduce_sum(&mut vec![1.0; BIG])
    });
    let mut s = fake_rank_one(port);
    s.write_all(&op_frame(BIG as u64)).unwrap();
    let mut ready = [0u8; 17];
    s.read_exact(&mut ready).unwrap();
    assert_eq!(ready.to_vec(), frame(7, &0u64.to_le_bytes()));
    let values: Vec<u8> = (0..BIG).flat_map(|_| 2.0f32.to_le_bytes()).collect();
    s.write_all(&frame(6, &values)).unwrap();
    thread::sleep(Duration::from_millis(300));
    assert!(!root.is_finished(), "rank 0 should be stuck in its write");
    let failed = Instant::now();
    s.write_all(&frame(4, b"drafter replica 0: non-finite loss"))
        .unwrap();
    let e = err_text(root.join().unwrap());
    assert_eq!(
        e,
        "all_reduce_sum: rank 1 failed: drafter replica 0: non-finite loss"
    );
    assert!(failed.elapsed() < PROMPT, "{:?}", failed.elapsed());
}

#[test]
fn silent_rank_zero_is_named_at_the_timeout() {
    // Rank 0 admits rank 1 and then never answers: rank 1 gives up at 1.5 x the op timeout.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = thread::spawn(move || {
        let g = ProcessGroup::connect(&env(1, 2, port), LONG)?;
        g.set_op_timeout(Duration::from_millis(200));
        g.barrier()
    });
    let (mut s, _) = listener.accept().unwrap();
    s.write_all(&[welcome(), frame(7, &[])].concat()).unwrap();
    let e = err_text(peer.join().unwrap());
    assert_eq!(
        e,
        "barrier: rank 1 timed out after 0.3 s waiting for rank 0"
    );
    drop(s);
}

#[test]
fn rank_zero_on_a_taken_port_says_what_to_change_then_why() {
    // The port is held for the whole test, so rank 0 cannot listen on it.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = ProcessGroup::connect(&env(0, 2, port), LONG).unwrap_err();
    let source = std::error::Error::source(&e).expect("the io error is the source");
    let text = e.to_string();
    assert!(text.starts_with(&format!("rank 0 could not listen on 127.0.0.1:{port}")));
    assert!(
        text.contains("the port is MASTER_PORT") && text.contains("DFLASH_MASTER_PORT"),
        "{text}"
    );
    // The cause comes last, after ": ", so a printer of the chain can leave out its repeat.
    assert!(text.ends_with(&format!(": {source}")), "{text}");
}

//! What the process-group tests share: ports, environments, ranks on threads, raw frames.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use dflash_launch::{LaunchEnv, LaunchError, PortOrigin, ProcessGroup};

/// Generous for success paths (they take milliseconds); failure paths must beat it by far.
pub const LONG: Duration = Duration::from_secs(10);
/// How soon a failure must reach the other ranks.
pub const PROMPT: Duration = Duration::from_millis(1500);

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().expect("local addr").port()
}

pub fn env(rank: usize, world_size: usize, port: u16) -> LaunchEnv {
    LaunchEnv {
        rank,
        world_size,
        local_rank: rank,
        master_addr: "127.0.0.1".to_owned(),
        master_port: port,
        port_origin: PortOrigin::MasterPort,
    }
}

/// Connects `world` ranks, each from its own thread; gives the groups by rank.
pub fn connect_all(world: usize) -> Vec<ProcessGroup> {
    let port = free_port();
    let handles: Vec<_> = (0..world)
        .map(|r| thread::spawn(move || ProcessGroup::connect(&env(r, world, port), LONG)))
        .collect();
    handles
        .into_iter()
        .enumerate()
        .map(|(r, h)| {
            h.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("rank {r}: {e}"))
        })
        .collect()
}

/// Runs `f(group)` for every rank on its own thread; gives the results by rank.
pub fn on_every_rank<T: Send + 'static>(
    groups: Vec<ProcessGroup>,
    f: impl Fn(ProcessGroup) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = groups
        .into_iter()
        .map(|g| {
            let f = f.clone();
            thread::spawn(move || f(g))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

pub fn err_text<T: std::fmt::Debug>(r: Result<T, LaunchError>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

/// A frame as the crate docs define it: `len u32 LE | "DFRV" | tag | body`.
pub fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut f = ((body.len() + 5) as u32).to_le_bytes().to_vec();
    f.extend_from_slice(b"DFRV");
    f.push(tag);
    f.extend_from_slice(body);
    f
}

/// The protocol version this build speaks.
pub const VERSION: u32 = 2;

pub fn hello(rank: u64, world: u64) -> Vec<u8> {
    let mut b = VERSION.to_le_bytes().to_vec();
    b.extend_from_slice(&rank.to_le_bytes());
    b.extend_from_slice(&world.to_le_bytes());
    frame(1, &b)
}

/// Rank 0's answer to a hello it admitted, sent at once.
pub fn welcome() -> Vec<u8> {
    frame(8, &[])
}

/// A fake rank 1 of a world of 2: connected, said hello, welcomed, got the go-ahead.
pub fn fake_rank_one(port: u16) -> TcpStream {
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    };
    s.write_all(&hello(1, 2)).unwrap();
    let mut answers = [0u8; 18];
    s.read_exact(&mut answers).unwrap();
    assert_eq!(answers.to_vec(), [welcome(), frame(7, &[])].concat());
    s
}

/// An op frame of an all-reduce of `len` values, the first collective, default chunks.
pub fn op_frame(len: u64) -> Vec<u8> {
    let mut b = vec![1u8];
    for v in [1u64, len, 16 << 20] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    frame(5, &b)
}

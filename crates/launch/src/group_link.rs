//! The process group's links: joining (the rendezvous's hello and checks, then a go-ahead
//! instead of a payload), tearing down on a failure, and rank 0's watch over idle links.

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock, TryLockError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::secs;
use crate::frame::{
    FrameError, MAX_ERROR_LEN, TAG_ERROR, TAG_READY, deadline_after, encode, write_all_by,
};
use crate::group::{Inner, Ops, ProcessGroup};
use crate::group_io::SCAN_EVERY;
use crate::group_wire::{DEFAULT_CHUNK_ELEMS, clip};
use crate::rendezvous::join_frame;
use crate::serve::{abort, accept_ranks, peer_error};
use crate::{LaunchEnv, LaunchError};

/// The time `abort` takes at most to tell the peers why before it shuts the sockets.
const TEARDOWN: Duration = Duration::from_secs(1);

pub(crate) fn connect(env: &LaunchEnv, timeout: Duration) -> Result<ProcessGroup, LaunchError> {
    env.validate()?;
    let deadline = deadline_after(timeout);
    let streams = if env.world_size == 1 {
        Vec::new()
    } else if env.rank == 0 {
        accept(env, timeout, deadline)?
    } else {
        let endpoint = env.master_endpoint();
        let (stream, _) = join_frame(
            env,
            &endpoint,
            timeout,
            deadline,
            (TAG_READY, 0),
            ("the go-ahead", "every rank to connect"),
        )?;
        vec![stream]
    };
    build(env, streams, timeout)
}

/// Rank 0: admits every rank, then gives each the go-ahead; gives the links in rank order.
fn accept(
    env: &LaunchEnv,
    timeout: Duration,
    deadline: Instant,
) -> Result<Vec<TcpStream>, LaunchError> {
    let mut peers = accept_ranks(env, timeout, deadline)?;
    let go = encode(TAG_READY, &[]);
    let mut failure = None;
    for (rank, slot) in peers.iter_mut().enumerate() {
        let Some((stream, from)) = slot else { continue };
        if let Err(e) = write_all_by(stream, &go, deadline) {
            failure = Some(match e {
                FrameError::Timeout => LaunchError::Protocol {
                    peer: format!("rank {rank} at {from}"),
                    detail: format!("it took no go-ahead within {} s", secs(&timeout)),
                },
                e => peer_error(e, rank, *from, "sending the go-ahead to", timeout),
            });
            break;
        }
    }
    if let Some(e) = failure {
        return Err(abort(&mut peers, e));
    }
    Ok(peers.into_iter().flatten().map(|(s, _)| s).collect())
}

fn build(
    env: &LaunchEnv,
    streams: Vec<TcpStream>,
    timeout: Duration,
) -> Result<ProcessGroup, LaunchError> {
    let (mut readers, mut writers, mut controls) = (Vec::new(), Vec::new(), Vec::new());
    for (i, s) in streams.into_iter().enumerate() {
        let peer = if env.rank == 0 { i + 1 } else { 0 };
        let io = |source| LaunchError::Io {
            context: format!("rank {} setting up its link to rank {peer}", env.rank),
            source,
        };
        s.set_nonblocking(false).map_err(io)?;
        let _ = s.set_nodelay(true);
        writers.push(Mutex::new(s.try_clone().map_err(io)?));
        controls.push(s.try_clone().map_err(io)?);
        readers.push(s);
    }
    let inner = Arc::new(Inner {
        rank: env.rank,
        world_size: env.world_size,
        op_timeout_ns: AtomicU64::new(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)),
        chunk_elems: AtomicUsize::new(DEFAULT_CHUNK_ELEMS),
        ops: Mutex::new(Ops {
            seq: 0,
            readers,
            buf: Vec::new(),
            out: Vec::new(),
        }),
        writers,
        controls,
        failed: OnceLock::new(),
    });
    if env.rank == 0 && env.world_size > 1 {
        let weak = Arc::downgrade(&inner);
        thread::Builder::new()
            .name("dflash-group-watch".to_owned())
            .spawn(move || watch(weak))
            .map_err(|source| LaunchError::Io {
                context: "rank 0 starting the thread that watches the group".to_owned(),
                source,
            })?;
    }
    Ok(ProcessGroup { inner })
}

/// Rank 0, between collectives: a rank that fails or ends while rank 0 computes would
/// otherwise leave the ranks already waiting in the next collective waiting until rank 0
/// arrives there. Ends with the group.
fn watch(inner: Weak<Inner>) {
    loop {
        thread::sleep(SCAN_EVERY);
        let Some(g) = inner.upgrade() else { return };
        if g.failed.get().is_some() {
            return;
        }
        // A running collective watches its links itself.
        let mut ops = match g.ops.try_lock() {
            Ok(ops) => ops,
            Err(TryLockError::WouldBlock) => continue,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        if let Err(f) = g.scan(&mut ops, None) {
            drop(ops);
            g.record(f);
            return;
        }
    }
}

impl Inner {
    /// Tells every peer `msg` in an error frame, best effort within [`TEARDOWN`] (a link
    /// whose writer is stuck in another frame is skipped), then shuts every socket, which
    /// ends the blocked reads and writes here and the peers' waits there.
    pub(crate) fn teardown(&self, msg: &str) {
        let frame = encode(TAG_ERROR, clip(msg, MAX_ERROR_LEN).as_bytes());
        let deadline = Instant::now() + TEARDOWN;
        let mut pending: Vec<usize> = (0..self.writers.len()).collect();
        loop {
            pending.retain(|&i| {
                let mut w = match self.writers[i].try_lock() {
                    Ok(w) => w,
                    Err(TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(TryLockError::WouldBlock) => return true,
                };
                let _ = write_all_by(&mut w, &frame, deadline);
                false
            });
            if pending.is_empty() || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        for c in &self.controls {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

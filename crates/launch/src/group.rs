//! A persistent group of processes, one per rank, joined once through rank 0 and then summing
//! (or broadcasting) over the same sockets at every step. Protocol in the crate docs; how the
//! group joins, watches and tears down is in `group_link.rs`, its socket I/O in `group_io.rs`.

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::frame::{TAG_DATA, TAG_OP, TAG_READY, deadline_after, encode};
use crate::group_wire::{
    Collective, DEFAULT_CHUNK_ELEMS, OP_LEN, OpHeader, READY_LEN, add_le, copy_le, f32_frame,
    u64_le,
};
use crate::{LaunchEnv, LaunchError};

/// One process's member of a multi-process group: rank 0 in the middle, every other rank
/// connected to it. Collectives run one at a time per process (a second thread's call waits
/// for the first), and every rank must call the same collectives in the same order.
///
/// Once any collective fails, or [`abort`](Self::abort) is called on any rank, the group is
/// broken: every rank's current and later calls return the first failure's message.
pub struct ProcessGroup {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub rank: usize,
    pub world_size: usize,
    pub op_timeout_ns: AtomicU64,
    pub chunk_elems: AtomicUsize,
    /// Held for a whole collective; the sockets' read sides live here.
    pub ops: Mutex<Ops>,
    /// The sockets' write sides, one per link, locked for one whole frame at a time so that
    /// `abort`'s error frame never lands inside another frame.
    pub writers: Vec<Mutex<TcpStream>>,
    /// Clones kept for `abort`, which must shut the sockets while other threads block on them.
    pub controls: Vec<TcpStream>,
    /// The first failure, as every later call reports it.
    pub failed: OnceLock<String>,
}

/// Links are numbered: on rank 0, link `i` goes to rank `i + 1`; elsewhere link 0 to rank 0.
pub(crate) struct Ops {
    pub seq: u64,
    pub readers: Vec<TcpStream>,
    /// The last frame's body, reused.
    pub buf: Vec<u8>,
    /// The next frame out, reused.
    pub out: Vec<u8>,
}

/// A failed collective: what this rank reports, and what a rank other than 0 tells rank 0
/// (which reports "rank r failed: {why}").
pub(crate) struct Fail {
    pub detail: String,
    pub why: String,
}

impl Fail {
    /// A failure reported by another rank, or about one: the same words everywhere.
    pub fn told(detail: String) -> Fail {
        Fail {
            why: detail.clone(),
            detail,
        }
    }
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.inner.rank)
            .field("world_size", &self.inner.world_size)
            .field("failed", &self.inner.failed.get())
            .finish()
    }
}

impl ProcessGroup {
    /// Joins the group `env` describes. Rank 0 listens on `env.master_endpoint()` (the port
    /// as [`LaunchEnv::port_origin`](crate::LaunchEnv::port_origin) says); every
    /// other rank connects (retrying until `timeout`, since rank 0 may start later) and says
    /// hello. Rank 0 checks each hello as [`rendezvous`](crate::rendezvous) does (same world
    /// size, rank in `1..world_size`, no rank twice) and on a mismatch tells every connected
    /// rank, so all fail with one message. Returns once all ranks are connected, so it is a
    /// barrier. A world of one opens no socket. `timeout` bounds the whole call and is the
    /// first timeout of each collective ([`set_op_timeout`](Self::set_op_timeout)).
    pub fn connect(env: &LaunchEnv, timeout: Duration) -> Result<ProcessGroup, LaunchError> {
        crate::group_link::connect(env, timeout)
    }

    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    pub fn world_size(&self) -> usize {
        self.inner.world_size
    }

    /// Sets how long later collectives wait: rank 0 waits at most `t` for all ranks to arrive
    /// at a collective (and for each chunk to come in); the other ranks wait for rank 0 half
    /// as long again, so rank 0, which can name the late ranks, gives up first and tells
    /// them. Training steps can be long; a caller sets e.g. 30 minutes.
    pub fn set_op_timeout(&self, t: Duration) {
        let ns = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
        self.inner.op_timeout_ns.store(ns, Ordering::Relaxed);
    }

    /// Sets the values per all-reduce chunk (bytes per broadcast chunk over 4), clamped to
    /// `1..=16 Mi`; every rank must set the same. For tests of the chunking.
    #[doc(hidden)]
    pub fn set_chunk_elems(&self, n: usize) {
        let n = n.clamp(1, DEFAULT_CHUNK_ELEMS);
        self.inner.chunk_elems.store(n, Ordering::Relaxed);
    }

    /// Sums `data` across the ranks in place. Per element, the sum is
    /// `let mut acc = 0.0f32; for r in 0..world { acc += x_r[i] }`, computed on rank 0 and
    /// sent to every rank, so every rank ends with the same bits, the same as a group of
    /// threads summing their slots in rank order. Every rank must pass as many values;
    /// otherwise every rank gets an error naming both lengths. A world of one changes nothing.
    pub fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), LaunchError> {
        self.inner.run(Collective::AllReduceSum, |g, ops, head| {
            let head = OpHeader {
                len: data.len() as u64,
                ..head
            };
            g.arrive(ops, head, 0)?;
            g.reduce(ops, data)
        })
    }

    /// Rank 0's `bytes` on every rank (the other ranks' argument is ignored): a run
    /// directory's path, an NCCL unique id. Any length; it travels in chunks.
    pub fn broadcast(&self, bytes: &[u8]) -> Result<Vec<u8>, LaunchError> {
        self.inner.run(Collective::Broadcast, |g, ops, head| {
            let total = g.arrive(ops, head, bytes.len() as u64)?;
            g.spread(ops, bytes, total)
        })
    }

    /// Returns once every rank called it.
    pub fn barrier(&self) -> Result<(), LaunchError> {
        self.inner.run(Collective::Barrier, |g, ops, head| {
            g.arrive(ops, head, 0).map(|_| ())
        })
    }

    /// Declares this process failed, from any thread, also while another thread blocks in a
    /// collective: tells the other ranks why (a rank other than 0 tells rank 0, which tells
    /// everyone "rank r failed: {why}"; rank 0 tells everyone itself), then shuts the sockets,
    /// so every blocked call on every rank returns an error at once instead of at its timeout.
    /// Later calls here fail with the same message. Idempotent; returns within about a second
    /// even if a collective holds a socket.
    pub fn abort(&self, why: &str) {
        let g = &self.inner;
        let detail = format!("rank {} failed: {why}", g.rank);
        if g.failed.set(detail.clone()).is_ok() {
            g.teardown(if g.rank == 0 { &detail } else { why });
        }
    }
}

impl Inner {
    pub fn op_timeout(&self) -> Duration {
        Duration::from_nanos(self.op_timeout_ns.load(Ordering::Relaxed))
    }

    /// How long a rank other than 0 waits for rank 0: the op timeout and half again, so rank
    /// 0 times out first when another rank is late, and says which.
    fn peer_timeout(&self) -> Duration {
        let t = self.op_timeout();
        t.saturating_add(t / 2)
    }

    pub(crate) fn chunk(&self) -> usize {
        self.chunk_elems.load(Ordering::Relaxed)
    }

    /// Runs one collective with the group's lock held; on failure, records it and tears the
    /// group down (which tells the others).
    fn run<T>(
        &self,
        op: Collective,
        body: impl FnOnce(&Inner, &mut Ops, OpHeader) -> Result<T, Fail>,
    ) -> Result<T, LaunchError> {
        let broken = |d: &String| LaunchError::Collective {
            op: op.name(),
            detail: d.clone(),
        };
        if let Some(d) = self.failed.get() {
            return Err(broken(d));
        }
        let mut ops = self.ops.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(d) = self.failed.get() {
            return Err(broken(d));
        }
        ops.seq += 1;
        let head = OpHeader {
            op: op as u8,
            seq: ops.seq,
            len: 0,
            chunk: self.chunk() as u64,
        };
        let result = body(self, &mut ops, head);
        drop(ops);
        result.map_err(|f| {
            let detail = f.detail.clone();
            self.record(f);
            broken(self.failed.get().unwrap_or(&detail))
        })
    }

    /// Makes `f` the group's failure, unless one came first, and tears the group down.
    pub fn record(&self, f: Fail) {
        let tell = if self.rank == 0 {
            f.detail.clone()
        } else {
            f.why
        };
        if self.failed.set(f.detail).is_ok() {
            self.teardown(&tell);
        }
    }

    /// Every rank arrives at the collective `head` describes; rank 0 checks that all called
    /// the same with the same shape, then releases them with `value` (a broadcast's length),
    /// which every rank returns.
    fn arrive(&self, ops: &mut Ops, head: OpHeader, value: u64) -> Result<u64, Fail> {
        if self.world_size == 1 {
            return Ok(value);
        }
        if self.rank != 0 {
            let t = self.peer_timeout();
            let frame = encode(TAG_OP, &head.encode());
            self.send(ops, 0, &frame, deadline_after(t), t)?;
            self.recv(
                ops,
                0,
                TAG_READY,
                READY_LEN,
                deadline_after(t),
                t,
                "the go-ahead",
            )?;
            self.expect_len(0, ops.buf.len(), READY_LEN, "a ready frame")?;
            return Ok(u64_le(&ops.buf));
        }
        let t = self.op_timeout();
        let deadline = deadline_after(t);
        for r in 1..self.world_size {
            self.recv(ops, r, TAG_OP, OP_LEN, deadline, t, "its next call")?;
            let theirs = OpHeader::decode(&ops.buf)
                .map_err(|d| Fail::told(format!("bad data from rank {r}: {d}")))?;
            check_same(r, &theirs, &head)?;
        }
        let frame = encode(TAG_READY, &value.to_le_bytes());
        let deadline = deadline_after(t);
        for i in 0..self.world_size - 1 {
            self.send(ops, i, &frame, deadline, t)?;
        }
        Ok(value)
    }

    /// The all-reduce's data: chunk by chunk, every rank sends its values to rank 0, which
    /// sums them in rank order and sends the sums back.
    fn reduce(&self, ops: &mut Ops, data: &mut [f32]) -> Result<(), Fail> {
        if self.world_size == 1 {
            return Ok(());
        }
        let mut out = std::mem::take(&mut ops.out);
        let result = self.reduce_chunks(ops, data, &mut out);
        ops.out = out;
        result
    }

    fn reduce_chunks(
        &self,
        ops: &mut Ops,
        data: &mut [f32],
        out: &mut Vec<u8>,
    ) -> Result<(), Fail> {
        let chunk = self.chunk();
        if self.rank != 0 {
            let t = self.peer_timeout();
            for piece in data.chunks_mut(chunk) {
                f32_frame(piece, out);
                self.send(ops, 0, out, deadline_after(t), t)?;
                let bytes = piece.len() * 4;
                self.recv(ops, 0, TAG_DATA, bytes, deadline_after(t), t, "the sums")?;
                self.expect_len(0, ops.buf.len(), bytes, "a chunk of sums")?;
                copy_le(piece, &ops.buf);
            }
            return Ok(());
        }
        let t = self.op_timeout();
        for piece in data.chunks_mut(chunk) {
            // Exactly `acc = 0.0; acc += x_0; ...; acc += x_last`, element by element: the
            // +0.0 start matters (it turns a lone -0.0 into +0.0, as a host group does).
            for x in piece.iter_mut() {
                let mut acc = 0.0f32;
                acc += *x;
                *x = acc;
            }
            let bytes = piece.len() * 4;
            let deadline = deadline_after(t);
            for r in 1..self.world_size {
                self.recv(ops, r, TAG_DATA, bytes, deadline, t, "a chunk of values")?;
                self.expect_len(r, ops.buf.len(), bytes, "a chunk of values")?;
                add_le(piece, &ops.buf);
            }
            f32_frame(piece, out);
            let deadline = deadline_after(t);
            for i in 0..self.world_size - 1 {
                self.send(ops, i, out, deadline, t)?;
            }
        }
        Ok(())
    }

    /// The broadcast's data: rank 0 sends `bytes` in chunks; the others collect `total` bytes.
    fn spread(&self, ops: &mut Ops, bytes: &[u8], total: u64) -> Result<Vec<u8>, Fail> {
        let chunk = self.chunk() * 4;
        if self.world_size == 1 {
            return Ok(bytes.to_vec());
        }
        if self.rank == 0 {
            let t = self.op_timeout();
            for piece in bytes.chunks(chunk) {
                let frame = encode(TAG_DATA, piece);
                let deadline = deadline_after(t);
                for i in 0..self.world_size - 1 {
                    self.send(ops, i, &frame, deadline, t)?;
                }
            }
            return Ok(bytes.to_vec());
        }
        let t = self.peer_timeout();
        // Grown as chunks arrive, never from the announced length, which a broken peer
        // could make huge.
        let mut got = Vec::new();
        while (got.len() as u64) < total {
            let left = usize::try_from(total - got.len() as u64).unwrap_or(usize::MAX);
            let cap = left.min(chunk);
            self.recv(ops, 0, TAG_DATA, cap, deadline_after(t), t, "the broadcast")?;
            if ops.buf.is_empty() {
                return Err(self.bad_from_root("an empty chunk of the broadcast"));
            }
            got.extend_from_slice(&ops.buf);
        }
        Ok(got)
    }
}

/// Rank 0's check of a rank's op frame against its own.
fn check_same(r: usize, theirs: &OpHeader, ours: &OpHeader) -> Result<(), Fail> {
    let ours_name = Collective::describe(ours.op);
    let detail = if theirs.op != ours.op {
        format!(
            "rank {r} called {} but rank 0 called {ours_name} (collective #{}): every rank \
             must call the same collectives in the same order",
            Collective::describe(theirs.op),
            ours.seq
        )
    } else if theirs.len != ours.len {
        format!(
            "rank {r} has {} values, rank 0 has {}",
            theirs.len, ours.len
        )
    } else if theirs.seq != ours.seq {
        format!(
            "rank {r} is at collective #{} but rank 0 at #{}: every rank must call the same \
             collectives in the same order",
            theirs.seq, ours.seq
        )
    } else if theirs.chunk != ours.chunk {
        format!(
            "rank {r} sends chunks of {} values, rank 0 of {}: every rank must run the same \
             build and settings",
            theirs.chunk, ours.chunk
        )
    } else {
        return Ok(());
    };
    Err(Fail::told(detail))
}

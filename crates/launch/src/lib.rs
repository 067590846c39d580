//! Multi-process launch for data-parallel training across hosts.
//!
//! A launcher (torchrun, a SLURM script, Kubernetes) starts one process per GPU and tells each
//! who it is through five variables: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and
//! `MASTER_PORT` ([`LaunchEnv::from_env`]). Before NCCL can build a communicator, every process
//! must hold the same unique id, an opaque 128-byte blob that rank 0 creates. [`rendezvous`]
//! carries it from rank 0 to every rank over TCP at `MASTER_ADDR:MASTER_PORT`, or at the port
//! [`PortOrigin`] describes: `DFLASH_MASTER_PORT` where set, and `MASTER_PORT + 1` under
//! torchrun, whose own store already listens on `MASTER_PORT`. Where gradients
//! pass through host memory (the CPU reference backend), a [`ProcessGroup`] keeps the
//! processes connected and sums them every step. This crate never links CUDA: it moves opaque
//! bytes and f32s, so it is testable on any machine.
//!
//! # Protocol
//!
//! Rank 0 listens on `MASTER_ADDR` at the rendezvous port (bound on the address as given, with
//! std's `SO_REUSEADDR` so a restarted job can rebind at once); every other rank connects to
//! it, retrying with backoff, since rank 0 may start later. Every message is one frame:
//!
//! ```text
//! len: u32 LE  (bytes after this field)  | magic "DFRV" | tag: u8 | body (len - 5 bytes)
//! ```
//!
//! | tag | direction | body |
//! |---|---|---|
//! | 1 hello | rank r -> 0 | version u32 LE (2), rank u64 LE, world size u64 LE |
//! | 2 payload | 0 -> rank r | the payload, at most [`MAX_PAYLOAD`] bytes |
//! | 3 ack | rank r -> 0 | empty |
//! | 4 error | 0 -> rank r (group: both ways) | a UTF-8 message, at most 64 KiB |
//! | 5 op | rank r -> 0 (group) | collective u8 (1 all_reduce_sum, 2 broadcast, 3 barrier), sequence number u64 LE, value count u64 LE (0 but for all_reduce_sum), chunk size u64 LE |
//! | 6 data | both ways (group) | a chunk: f32 LE values, or broadcast bytes; at most 64 MiB |
//! | 7 ready | 0 -> rank r (group) | connect: empty; a collective: u64 LE (a broadcast's length, else 0) |
//! | 8 welcome | 0 -> rank r | empty: the hello was admitted |
//!
//! The order: each rank connects and sends its hello; rank 0 checks it (magic, version, the
//! same world size, rank in `1..world_size`, no rank twice) and answers at once with a welcome
//! or, on a mismatch, sends the error to that peer *and* every peer already connected, so
//! every process fails with the same message instead of waiting out its timeout. A rank that
//! gets no welcome within 10 s, bytes that are no frame, or a hang-up has reached another
//! service on the port, and says so then rather than at its timeout.
//!
//! Rank 0 reads every connection's hello side by side, without blocking, so one that is slow
//! holds up no other. A connection that is no rank (a TCP health check, a port scan, an HTTP
//! client) is logged in one line and dropped: it closed before a whole hello, sent bytes
//! without the magic, or sent nothing within 5 s. Only a frame of this protocol that is no
//! valid hello, or a valid hello that conflicts, fails the rendezvous.
//!
//! Once all `world_size - 1` ranks arrived, rank 0 sends the payload to each; each rank acks
//! and returns it; rank 0 returns after the last ack.
//! No rank returns before every rank arrived, so the call is a barrier too.
//!
//! The timeout bounds the whole call, not each step: connecting, every read and every write
//! get what is left of it. On timeout rank 0 names the ranks that never arrived (and tells the
//! ranks that did); another rank says that rank 0 could not be reached, or did not answer. The
//! header is read before any body, and a body is never allocated past the cap of the frame
//! expected next, so a peer that sends garbage gets an error, never a panic or a huge buffer.
//!
//! # The persistent group
//!
//! [`ProcessGroup::connect`] joins as the rendezvous does (same hello, same checks, same
//! error to every connected rank), but rank 0 answers with a ready frame instead of a
//! payload, and the connections stay open: a star through rank 0. Each collective then runs:
//!
//! 1. Every rank other than 0 sends an op frame; rank 0 reads them in rank order and checks
//!    that all called the same collective, at the same sequence number, with the same number
//!    of values and chunk size. Then it sends each a ready frame. So no data moves before
//!    every rank arrived, and every collective is also a barrier.
//! 2. `all_reduce_sum`: chunk by chunk (at most 16 Mi values each), every rank sends a data
//!    frame; rank 0 sums per element from +0.0 in rank order (rank 0 first) and sends the sums
//!    back as a data frame. `broadcast`: rank 0 sends its bytes in data frames of at most
//!    4 x 16 Mi bytes, the count announced in the ready frame. `barrier`: nothing more.
//!
//! Any failure, anywhere, breaks the group. A rank that fails or aborts sends an error frame
//! (a rank other than 0 to rank 0, which forwards "rank r failed: why" to every rank) and
//! shuts its sockets. Rank 0 looks at every link while it waits on one (and, between
//! collectives, a watcher thread does), and a rank whose write is stuck looks at its peer's
//! side, so an error frame or a closed connection ends every wait within about 50 ms rather
//! than at the timeout. Rank 0 waits at most the op timeout for all ranks to arrive (and for
//! each chunk); the others wait for rank 0 half as long again, so rank 0 times out first and
//! names the late ranks to all.

mod env;
mod error;
mod frame;
mod group;
mod group_io;
mod group_link;
mod group_wire;
mod rendezvous;
mod serve;

pub use env::{LaunchEnv, PortOrigin};
pub use error::LaunchError;
pub use frame::MAX_PAYLOAD;
pub use group::ProcessGroup;
pub use rendezvous::rendezvous;

//! Multi-process launch for data-parallel training across hosts.
//!
//! A launcher (torchrun, a SLURM script, Kubernetes) starts one process per GPU and tells each
//! who it is through five variables: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and
//! `MASTER_PORT` ([`LaunchEnv::from_env`]). Before NCCL can build a communicator, every process
//! must hold the same unique id, an opaque 128-byte blob that rank 0 creates. [`rendezvous`]
//! carries it from rank 0 to every rank over TCP at `MASTER_ADDR:MASTER_PORT`. This crate
//! never links CUDA: it moves opaque bytes, so it is testable on any machine.
//!
//! # Protocol
//!
//! Rank 0 listens on `MASTER_ADDR:MASTER_PORT` (bound on the address as given, with std's
//! `SO_REUSEADDR` so a restarted job can rebind at once); every other rank connects to it,
//! retrying with backoff, since rank 0 may start later. Every message is one frame:
//!
//! ```text
//! len: u32 LE  (bytes after this field)  | magic "DFRV" | tag: u8 | body (len - 5 bytes)
//! ```
//!
//! | tag | direction | body |
//! |---|---|---|
//! | 1 hello | rank r -> 0 | version u32 LE, rank u64 LE, world size u64 LE |
//! | 2 payload | 0 -> rank r | the payload, at most [`MAX_PAYLOAD`] bytes |
//! | 3 ack | rank r -> 0 | empty |
//! | 4 error | 0 -> rank r | a UTF-8 message, at most 64 KiB |
//!
//! The order: each rank connects and sends its hello; rank 0 checks it (magic, version, the
//! same world size, rank in `1..world_size`, no rank twice) and, on a mismatch, sends the error
//! to that peer *and* every peer already connected, so every process fails with the same
//! message instead of waiting out its timeout. Once all `world_size - 1` ranks arrived, rank 0
//! sends the payload to each; each rank acks and returns it; rank 0 returns after the last ack.
//! No rank returns before every rank arrived, so the call is a barrier too.
//!
//! The timeout bounds the whole call, not each step: connecting, every read and every write
//! get what is left of it. On timeout rank 0 names the ranks that never arrived (and tells the
//! ranks that did); another rank says that rank 0 could not be reached, or did not answer. The
//! header is read before any body, and a body is never allocated past the cap of the frame
//! expected next, so a peer that sends garbage gets an error, never a panic or a huge buffer.

mod env;
mod error;
mod frame;
mod rendezvous;
mod serve;

pub use env::LaunchEnv;
pub use error::LaunchError;
pub use frame::MAX_PAYLOAD;
pub use rendezvous::rendezvous;

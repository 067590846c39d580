//! The one error type: every message names the variable, rank or address at fault, since a
//! multi-host launch fails on one machine while the operator reads the log of another.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::PortOrigin;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{var} is not set: {reason}")]
    MissingVar { var: &'static str, reason: String },

    #[error("{var}={value:?} is invalid: {reason}")]
    InvalidVar {
        var: &'static str,
        value: String,
        reason: &'static str,
    },

    #[error(
        "{var}={rank} is out of range for WORLD_SIZE={world_size} (ranks are 0..={})",
        world_size.saturating_sub(1)
    )]
    RankOutOfRange {
        var: &'static str,
        rank: usize,
        world_size: usize,
    },

    #[error("rank 0 creates the payload and must pass Some(payload) to rendezvous")]
    MissingPayload,

    #[error("rank {rank} passed a payload, but only rank 0 sends one (the other ranks pass None)")]
    UnexpectedPayload { rank: usize },

    #[error("the payload is {len} bytes; the rendezvous carries at most {max}")]
    PayloadTooLarge { len: usize, max: usize },

    #[error(
        "rank 0 could not listen on {endpoint} (MASTER_ADDR must be an address of rank 0's own \
         host, and the port free: {}): {source}",
        origin.advice()
    )]
    Bind {
        endpoint: String,
        origin: PortOrigin,
        source: io::Error,
    },

    #[error(
        "rank {rank} could not reach rank 0 at {endpoint} within {} s (last error: {last}); is rank 0 running, with the same MASTER_ADDR and port? ({})",
        secs(timeout),
        origin.advice()
    )]
    Unreachable {
        rank: usize,
        endpoint: String,
        origin: PortOrigin,
        timeout: Duration,
        last: String,
    },

    /// What answered at the master's address is not dflash's rank 0: another service holds
    /// the port (torchrun's store on `MASTER_PORT`, say). Said within seconds, not at the
    /// timeout, since rank 0 answers every hello at once.
    #[error(
        "rank {rank} reached {endpoint}, but {what}, which dflash's rank 0 does not do: most \
         likely another service listens there ({})",
        origin.advice()
    )]
    ForeignPeer {
        rank: usize,
        endpoint: String,
        origin: PortOrigin,
        what: String,
    },

    #[error(
        "rank 0 at {endpoint} did not answer rank {rank} within {} s (waiting for {waiting})",
        secs(timeout)
    )]
    NoAnswer {
        rank: usize,
        endpoint: String,
        timeout: Duration,
        waiting: &'static str,
    },

    /// Rank 0 failed and said why; `message` is rank 0's own error, word for word.
    #[error("rank 0 at {endpoint} aborted the rendezvous: {message}")]
    Aborted { endpoint: String, message: String },

    #[error(
        "rank 0 at {endpoint}: rank(s) {} of WORLD_SIZE={world_size} never arrived within {} s",
        fmt_ranks(missing),
        secs(timeout)
    )]
    MissingRanks {
        endpoint: String,
        missing: Vec<usize>,
        world_size: usize,
        timeout: Duration,
    },

    #[error(
        "rank {rank} (at {peer}) did not acknowledge the payload within {} s",
        secs(timeout)
    )]
    NoAck {
        rank: usize,
        peer: SocketAddr,
        timeout: Duration,
    },

    #[error(
        "rank {peer_rank} has WORLD_SIZE={peer_world_size} but rank 0 has WORLD_SIZE={world_size}: every process must be launched with the same WORLD_SIZE"
    )]
    WorldSizeMismatch {
        peer_rank: u64,
        peer_world_size: u64,
        world_size: usize,
    },

    #[error(
        "two processes claim RANK={rank} ({first} and {second}): each process needs its own rank"
    )]
    DuplicateRank {
        rank: u64,
        first: String,
        second: String,
    },

    #[error(
        "the peer at {peer} claims RANK={rank}, out of range for WORLD_SIZE={world_size} (ranks are 0..={})",
        world_size.saturating_sub(1)
    )]
    PeerRankOutOfRange {
        peer: SocketAddr,
        rank: u64,
        world_size: usize,
    },

    #[error(
        "the peer at {peer} speaks rendezvous protocol version {theirs}, this build speaks {ours}: every rank must run the same build"
    )]
    VersionMismatch {
        peer: SocketAddr,
        theirs: u32,
        ours: u32,
    },

    /// The other side is not a rendezvous peer of this build, or broke the protocol.
    #[error("bad data from {peer}: {detail}")]
    Protocol { peer: String, detail: String },

    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },

    /// A collective of a [`ProcessGroup`](crate::ProcessGroup) failed. `detail` names the
    /// ranks involved and what happened; rank 0 sends its detail to every other rank, so all
    /// ranks report the same line, each under the name of the call it was in.
    #[error("{op}: {detail}")]
    Collective { op: &'static str, detail: String },
}

/// Seconds as a person writes them: `20`, `0.5`, `1.25`.
pub(crate) fn secs(d: &Duration) -> String {
    let s = format!("{:.3}", d.as_secs_f64());
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Ranks as ranges (`2, 5-9`), so a missing half of a large world stays one line.
pub(crate) fn fmt_ranks(ranks: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secs_reads_like_a_person_writes() {
        assert_eq!(secs(&Duration::from_secs(20)), "20");
        assert_eq!(secs(&Duration::from_millis(500)), "0.5");
        assert_eq!(secs(&Duration::from_millis(1250)), "1.25");
        assert_eq!(secs(&Duration::ZERO), "0");
    }

    #[test]
    fn ranks_collapse_into_ranges() {
        assert_eq!(fmt_ranks(&[]), "");
        assert_eq!(fmt_ranks(&[2]), "2");
        assert_eq!(fmt_ranks(&[1, 2, 3, 5, 7, 8]), "1-3, 5, 7-8");
    }
}

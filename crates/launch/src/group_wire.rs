//! The persistent group's frame bodies, and the look at a socket's next bytes that lets a rank
//! notice a failed peer while it waits on another.

use std::io::{self, ErrorKind};
use std::net::TcpStream;

use crate::frame::{HEADER_LEN, MAGIC, TAG_DATA, TAG_ERROR, TAG_OP};

/// The largest chunk of an all-reduce (and of a broadcast, in bytes times 4): 64 MiB a frame,
/// so gradients of many GB stream through bounded buffers.
pub(crate) const DEFAULT_CHUNK_ELEMS: usize = 16 << 20;
/// An op frame's body: collective u8, sequence number u64, length u64, chunk size u64.
pub(crate) const OP_LEN: usize = 25;
/// A ready frame's body: a u64 (a broadcast's length, 0 otherwise).
pub(crate) const READY_LEN: usize = 8;

/// The collectives, as op frames number them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Collective {
    AllReduceSum = 1,
    Broadcast = 2,
    Barrier = 3,
}

impl Collective {
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduceSum => "all_reduce_sum",
            Collective::Broadcast => "broadcast",
            Collective::Barrier => "barrier",
        }
    }

    /// What a peer's op frame calls its collective, for error messages.
    pub fn describe(code: u8) -> String {
        match code {
            1 => Collective::AllReduceSum.name().to_owned(),
            2 => Collective::Broadcast.name().to_owned(),
            3 => Collective::Barrier.name().to_owned(),
            other => format!("an unknown collective (code {other})"),
        }
    }
}

/// What a rank other than 0 announces at the start of each collective, so rank 0 can check
/// that every rank is in the same call with the same shape before any data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpHeader {
    pub op: u8,
    /// Counts the group's collectives from 1: ranks that skipped a call disagree here.
    pub seq: u64,
    /// The all-reduce's number of values; 0 for the other collectives.
    pub len: u64,
    pub chunk: u64,
}

impl OpHeader {
    pub fn encode(&self) -> [u8; OP_LEN] {
        let mut b = [0u8; OP_LEN];
        b[0] = self.op;
        b[1..9].copy_from_slice(&self.seq.to_le_bytes());
        b[9..17].copy_from_slice(&self.len.to_le_bytes());
        b[17..].copy_from_slice(&self.chunk.to_le_bytes());
        b
    }

    pub fn decode(body: &[u8]) -> Result<OpHeader, String> {
        if body.len() != OP_LEN {
            return Err(format!(
                "an op frame of {} bytes, expected {OP_LEN}",
                body.len()
            ));
        }
        Ok(OpHeader {
            op: body[0],
            seq: u64_le(&body[1..9]),
            len: u64_le(&body[9..17]),
            chunk: u64_le(&body[17..]),
        })
    }
}

/// A u64 from exactly 8 little-endian bytes; callers check the length first.
pub(crate) fn u64_le(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    u64::from_le_bytes(w)
}

/// Encodes a data frame of `values` (little-endian f32) into `out`, reusing its allocation.
/// Callers keep `values` within a chunk, so the length fits the u32 length field.
pub(crate) fn f32_frame(values: &[f32], out: &mut Vec<u8>) {
    let body = values.len() * 4;
    out.clear();
    out.extend_from_slice(&((body + HEADER_LEN - 4) as u32).to_le_bytes());
    out.extend_from_slice(&MAGIC);
    out.push(TAG_DATA);
    // Sized first, then filled in place: a loop the compiler turns into a copy.
    out.resize(HEADER_LEN + body, 0);
    for (b, v) in out[HEADER_LEN..].chunks_exact_mut(4).zip(values) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// `acc[i] += x[i]` for the little-endian f32s in `bytes` (`4 * acc.len()` of them).
pub(crate) fn add_le(acc: &mut [f32], bytes: &[u8]) {
    for (a, b) in acc.iter_mut().zip(bytes.chunks_exact(4)) {
        *a += f32_le(b);
    }
}

/// `dst[i] = x[i]` for the little-endian f32s in `bytes` (`4 * dst.len()` of them).
pub(crate) fn copy_le(dst: &mut [f32], bytes: &[u8]) {
    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
        *d = f32_le(b);
    }
}

fn f32_le(b: &[u8]) -> f32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(b);
    f32::from_le_bytes(w)
}

/// What waits at the front of a socket, seen without taking it.
#[derive(Debug)]
pub(crate) enum Front {
    /// Nothing has arrived.
    Quiet,
    /// Bytes of some frame other than an error (or too few bytes to tell yet).
    Data,
    /// A whole error header: the peer failed and said why.
    Error,
    /// The peer closed the connection: end of stream, or a reset.
    Closed,
    Failed(io::Error),
}

/// The longest look [`front`] takes: an op frame and the header after it.
const PEEK_LEN: usize = 2 * HEADER_LEN + OP_LEN;

/// Peeks at the next bytes of `s` without blocking and without consuming them. An error
/// frame counts whether it comes first or right after an op frame: a rank that arrived at a
/// collective and then failed, while rank 0 was elsewhere. The socket is blocking again on
/// return (other code relies on it), or the answer is `Failed`.
pub(crate) fn front(s: &TcpStream) -> Front {
    if let Err(e) = s.set_nonblocking(true) {
        return Front::Failed(e);
    }
    let mut h = [0u8; PEEK_LEN];
    let peeked = s.peek(&mut h);
    if let Err(e) = s.set_nonblocking(false) {
        return Front::Failed(e);
    }
    match peeked {
        Ok(0) => Front::Closed,
        Ok(n) if error_ahead(&h[..n.min(PEEK_LEN)]) => Front::Error,
        Ok(_) => Front::Data,
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
            Front::Quiet
        }
        Err(e) if is_gone(&e) => Front::Closed,
        Err(e) => Front::Failed(e),
    }
}

/// Whether `b`, a socket's next bytes, starts with an error header, or with a whole op frame
/// followed by one.
fn error_ahead(b: &[u8]) -> bool {
    const OP_FRAME: usize = HEADER_LEN + OP_LEN;
    let header = |b: &[u8], tag: u8| b.len() >= HEADER_LEN && b[4..8] == MAGIC && b[8] == tag;
    header(b, TAG_ERROR)
        || (header(b, TAG_OP)
            && b[..4] == ((OP_FRAME - 4) as u32).to_le_bytes()
            && b.get(OP_FRAME..)
                .is_some_and(|rest| header(rest, TAG_ERROR)))
}

/// The errors by which a socket says that the other side is gone.
pub(crate) fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
            | ErrorKind::NotConnected
    )
}

/// Ranks as a phrase: `rank 2`, `ranks 2, 5-7`.
pub(crate) fn ranks_phrase(ranks: &[usize]) -> String {
    let s = if ranks.len() == 1 { "" } else { "s" };
    format!("rank{s} {}", crate::error::fmt_ranks(ranks))
}

/// `msg` cut to what an error frame carries, on a character boundary.
pub(crate) fn clip(msg: &str, max: usize) -> &str {
    let mut cut = msg.len().min(max);
    while !msg.is_char_boundary(cut) {
        cut -= 1;
    }
    &msg[..cut]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{TAG_DATA, parse_header};

    #[test]
    fn op_headers_round_trip_and_reject_bad_lengths() {
        let h = OpHeader {
            op: Collective::Broadcast as u8,
            seq: 7,
            len: u64::MAX,
            chunk: 16 << 20,
        };
        assert_eq!(OpHeader::decode(&h.encode()), Ok(h));
        let e = OpHeader::decode(&[0; OP_LEN - 1]).unwrap_err();
        assert!(e.contains("24 bytes, expected 25"), "{e}");
        assert_eq!(Collective::describe(1), "all_reduce_sum");
        assert_eq!(Collective::describe(9), "an unknown collective (code 9)");
    }

    #[test]
    fn f32_frames_keep_every_bit() {
        let values = [
            -0.0f32,
            0.0,
            1.5e-42,
            -3.4e38,
            f32::INFINITY,
            f32::from_bits(0x7fc0_1234),
        ];
        let mut out = Vec::new();
        f32_frame(&values, &mut out);
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&out[..HEADER_LEN]);
        assert_eq!(parse_header(&h, 24), Ok((TAG_DATA, 24)));
        let mut back = [1.0f32; 6];
        copy_le(&mut back, &out[HEADER_LEN..]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&values));
        let mut acc = [1.0f32, 2.0];
        add_le(&mut acc, &out[HEADER_LEN..HEADER_LEN + 8]);
        assert_eq!(bits(&acc), bits(&[1.0, 2.0]));
    }

    #[test]
    fn error_frames_are_seen_first_or_behind_an_op_frame() {
        let error = crate::frame::encode(TAG_ERROR, b"boom");
        let op = crate::frame::encode(TAG_OP, &[0; OP_LEN]);
        let data = crate::frame::encode(TAG_DATA, &[0; 8]);
        assert!(error_ahead(&error));
        let behind_op: Vec<u8> = [op.clone(), error.clone()].concat();
        for n in 0..behind_op.len() {
            // Partial bytes never panic, and count only once the error header is whole.
            assert_eq!(
                error_ahead(&behind_op[..n]),
                n >= 2 * HEADER_LEN + OP_LEN,
                "{n}"
            );
        }
        assert!(error_ahead(&behind_op));
        assert!(!error_ahead(&op));
        assert!(!error_ahead(&[data, error].concat()));
        assert!(!error_ahead(b"GET / HTTP/1.1"));
    }

    #[test]
    fn phrases_and_clips() {
        assert_eq!(ranks_phrase(&[2]), "rank 2");
        assert_eq!(ranks_phrase(&[2, 5, 6, 7]), "ranks 2, 5-7");
        assert_eq!(clip("héllo", 2), "h");
        assert_eq!(clip("abc", 10), "abc");
    }
}

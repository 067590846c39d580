//! Frames and socket I/O bounded by a deadline.
//!
//! A frame is `len: u32 LE | magic | tag: u8 | body`, `len` counting magic, tag and body. The
//! 9-byte header is read whole and checked (magic first, so a stray HTTP client reads as "not
//! a rendezvous peer" rather than as a 540 MB length) before a body buffer exists, and the body
//! is capped by what the caller expects next.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The largest payload a rendezvous carries: an NCCL unique id is 128 bytes; the cap only keeps
/// a broken peer from making anyone allocate much.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// 2: rank 0 answers every hello at once with a welcome (or its error), so a rank can tell
/// dflash's rank 0 from another service on the port within seconds.
pub(crate) const VERSION: u32 = 2;
pub(crate) const MAGIC: [u8; 4] = *b"DFRV";
pub(crate) const HEADER_LEN: usize = 9;
pub(crate) const TAG_HELLO: u8 = 1;
pub(crate) const TAG_PAYLOAD: u8 = 2;
pub(crate) const TAG_ACK: u8 = 3;
pub(crate) const TAG_ERROR: u8 = 4;
/// The persistent group's frames ([`crate::ProcessGroup`]; see the crate docs).
pub(crate) const TAG_OP: u8 = 5;
pub(crate) const TAG_DATA: u8 = 6;
pub(crate) const TAG_READY: u8 = 7;
/// Rank 0's answer to a hello it admitted: empty.
pub(crate) const TAG_WELCOME: u8 = 8;
pub(crate) const HELLO_LEN: usize = 20;
pub(crate) const MAX_ERROR_LEN: usize = 64 * 1024;

/// What went wrong on one socket; each call site turns it into a [`crate::LaunchError`] that
/// says who and what.
#[derive(Debug)]
pub(crate) enum FrameError {
    Timeout,
    Closed,
    Io(io::Error),
    Bad(String),
    /// The bytes do not start a frame at all: the peer does not speak this protocol.
    Foreign(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    pub version: u32,
    pub rank: u64,
    pub world_size: u64,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(&self.version.to_le_bytes());
        b[4..12].copy_from_slice(&self.rank.to_le_bytes());
        b[12..].copy_from_slice(&self.world_size.to_le_bytes());
        b
    }

    pub fn decode(body: &[u8]) -> Result<Hello, String> {
        let b: &[u8; HELLO_LEN] = body
            .try_into()
            .map_err(|_| format!("a hello of {} bytes, expected {HELLO_LEN}", body.len()))?;
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Ok(Hello {
            version: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            rank: u64_at(4),
            world_size: u64_at(12),
        })
    }
}

/// One whole frame; callers keep `body` within [`MAX_PAYLOAD`], so the length fits a u32.
pub(crate) fn encode(tag: u8, body: &[u8]) -> Vec<u8> {
    let len = (body.len() + HEADER_LEN - 4) as u32;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&MAGIC);
    out.push(tag);
    out.extend_from_slice(body);
    out
}

/// Why the first bytes `h` (at least 8) are no frame of this protocol, where they are not.
pub(crate) fn foreign(h: &[u8]) -> Option<String> {
    (h[4..8] != MAGIC).then(|| {
        format!(
            "not a dflash rendezvous peer (frame starts {:?}, expected a length and magic {:?})",
            String::from_utf8_lossy(h),
            String::from_utf8_lossy(&MAGIC)
        )
    })
}

/// Checks a header and gives `(tag, body length)`.
pub(crate) fn parse_header(h: &[u8; HEADER_LEN], max_body: usize) -> Result<(u8, usize), String> {
    if let Some(why) = foreign(h) {
        return Err(why);
    }
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let Some(body) = len.checked_sub(HEADER_LEN - 4) else {
        return Err(format!(
            "a frame length of {len}, shorter than its own header"
        ));
    };
    if body > max_body {
        return Err(format!(
            "a frame body of {body} bytes, more than the {max_body} expected here"
        ));
    }
    Ok((h[8], body))
}

/// Reads one frame whose body is at most `max_body` bytes.
pub(crate) fn read_frame(
    stream: &mut TcpStream,
    max_body: usize,
    deadline: Instant,
) -> Result<(u8, Vec<u8>), FrameError> {
    let mut body = Vec::new();
    let tag = read_frame_into(stream, |_| max_body, deadline, &mut body)?;
    Ok((tag, body))
}

/// Reads one frame into `body` (reusing its allocation) and gives its tag; `max_body(tag)`
/// caps the body by what that tag may carry here.
pub(crate) fn read_frame_into(
    stream: &mut TcpStream,
    max_body: impl Fn(u8) -> usize,
    deadline: Instant,
    body: &mut Vec<u8>,
) -> Result<u8, FrameError> {
    let mut header = [0u8; HEADER_LEN];
    read_exact_by(stream, &mut header, deadline)?;
    if let Some(why) = foreign(&header) {
        return Err(FrameError::Foreign(why));
    }
    let (tag, len) = parse_header(&header, max_body(header[8])).map_err(FrameError::Bad)?;
    body.clear();
    body.resize(len, 0);
    read_exact_by(stream, body, deadline)?;
    Ok(tag)
}

pub(crate) fn write_frame(
    stream: &mut TcpStream,
    tag: u8,
    body: &[u8],
    deadline: Instant,
) -> Result<(), FrameError> {
    write_all_by(stream, &encode(tag, body), deadline)
}

/// `timeout` from now; a timeout past what Instant can hold is as good as none.
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

/// What is left before `deadline`, never zero (a zero socket timeout is an error in std).
pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    let now = Instant::now();
    (now < deadline).then(|| (deadline - now).max(Duration::from_millis(1)))
}

/// `read_exact` whose total time, not each `read`'s, is bounded by the deadline, so a peer
/// that trickles bytes cannot stretch it.
fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), FrameError> {
    let mut done = 0;
    while done < buf.len() {
        let left = remaining(deadline).ok_or(FrameError::Timeout)?;
        stream
            .set_read_timeout(Some(left))
            .map_err(FrameError::Io)?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => return Err(FrameError::Closed),
            Ok(n) => done += n,
            // A timed-out read; the next turn sees the deadline passed.
            Err(e) if is_retry(&e) => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}

pub(crate) fn write_all_by(
    stream: &mut TcpStream,
    buf: &[u8],
    deadline: Instant,
) -> Result<(), FrameError> {
    let mut done = 0;
    while done < buf.len() {
        let left = remaining(deadline).ok_or(FrameError::Timeout)?;
        stream
            .set_write_timeout(Some(left))
            .map_err(FrameError::Io)?;
        match stream.write(&buf[done..]) {
            Ok(0) => return Err(FrameError::Closed),
            Ok(n) => done += n,
            Err(e) if is_retry(&e) => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}

pub(crate) fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(frame: &[u8]) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&frame[..HEADER_LEN]);
        h
    }

    #[test]
    fn frames_round_trip() {
        let f = encode(TAG_PAYLOAD, b"abc");
        assert_eq!(f.len(), HEADER_LEN + 3);
        assert_eq!(parse_header(&header(&f), 3), Ok((TAG_PAYLOAD, 3)));
        let empty = encode(TAG_ACK, &[]);
        assert_eq!(parse_header(&header(&empty), 0), Ok((TAG_ACK, 0)));
        let hello = Hello {
            version: VERSION,
            rank: 7,
            world_size: u64::MAX,
        };
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
    }

    #[test]
    fn bad_headers_are_errors() {
        let e = parse_header(b"GET / HTT", MAX_PAYLOAD).unwrap_err();
        assert!(e.contains("not a dflash rendezvous peer"), "{e}");
        let mut h = header(&encode(TAG_PAYLOAD, &[]));
        h[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = parse_header(&h, MAX_PAYLOAD).unwrap_err();
        assert!(e.contains("more than the 1048576"), "{e}");
        h[..4].copy_from_slice(&2u32.to_le_bytes());
        let e = parse_header(&h, MAX_PAYLOAD).unwrap_err();
        assert!(e.contains("shorter than its own header"), "{e}");
        let e = parse_header(&header(&encode(TAG_PAYLOAD, &[0; 4])), 3).unwrap_err();
        assert!(e.contains("4 bytes"), "{e}");
    }

    #[test]
    fn short_hello_is_an_error() {
        assert!(Hello::decode(&[0; HELLO_LEN - 1]).is_err());
        assert!(Hello::decode(&[0; HELLO_LEN + 1]).is_err());
    }
}

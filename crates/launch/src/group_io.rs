//! The process group's socket I/O, link by link: reading a peer's next frame (rank 0 looking
//! at the other links meanwhile), writing one while watching the peer's side, and turning
//! every socket failure into words that name the ranks.

use std::net::TcpStream;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use crate::error::secs;
use crate::frame::{
    FrameError, MAX_ERROR_LEN, TAG_DATA, TAG_ERROR, TAG_OP, TAG_READY, is_retry, read_frame_into,
    remaining,
};
use crate::group::{Fail, Inner, Ops};
use crate::group_wire::{Front, OP_LEN, READY_LEN, front, is_gone, ranks_phrase};

/// How often a rank blocked on one socket looks at the others (rank 0) or at its peer's
/// answer (while its own write is stuck), so a failure anywhere ends every wait promptly.
pub(crate) const SCAN_EVERY: Duration = Duration::from_millis(50);
/// Time to read a failed peer's last words (its error frame) after its socket broke.
const SALVAGE: Duration = Duration::from_millis(200);

/// Whether a failed socket call was a wait for the peer or a send to it.
#[derive(Clone, Copy)]
pub(crate) enum Doing {
    Waiting,
    Sending,
}

impl Inner {
    pub(crate) fn expect_len(
        &self,
        peer: usize,
        got: usize,
        want: usize,
        what: &str,
    ) -> Result<(), Fail> {
        if got == want {
            return Ok(());
        }
        let d = format!("{what} of {got} bytes, expected {want}");
        Err(if peer == 0 {
            self.bad_from_root(&d)
        } else {
            Fail::told(format!("bad data from rank {peer}: {d}"))
        })
    }

    pub(crate) fn bad_from_root(&self, detail: &str) -> Fail {
        self.here(format!("got bad data from rank 0: {detail}"))
    }

    /// A failure this rank found: `rank {me} {what}`.
    pub(crate) fn here(&self, what: String) -> Fail {
        Fail {
            detail: format!("rank {} {what}", self.rank),
            why: what,
        }
    }

    /// The rank at the other end of link `i`.
    pub(crate) fn peer_of(&self, i: usize) -> usize {
        if self.rank == 0 { i + 1 } else { 0 }
    }

    pub(crate) fn link_of(&self, peer: usize) -> usize {
        if self.rank == 0 { peer - 1 } else { 0 }
    }

    /// Reads `peer`'s next frame into `ops.buf`: one of tag `want` with a body of at most
    /// `cap` bytes, or the peer's error. Rank 0 looks at the other links while it waits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn recv(
        &self,
        ops: &mut Ops,
        peer: usize,
        want: u8,
        cap: usize,
        deadline: Instant,
        t: Duration,
        what: &str,
    ) -> Result<(), Fail> {
        let i = self.link_of(peer);
        if self.rank == 0 {
            self.wait_for(ops, peer, deadline, t)?;
        }
        // Any other frame is read (small) so the error can say which tag came instead.
        let caps = |tag| if tag == want { cap } else { MAX_ERROR_LEN };
        let tag = read_frame_into(&mut ops.readers[i], caps, deadline, &mut ops.buf)
            .map_err(|e| self.link_fail(ops, i, e, t, Doing::Waiting))?;
        match tag {
            t if t == want => Ok(()),
            TAG_ERROR => Err(self.peer_failed(peer, &ops.buf)),
            other => {
                let d = format!("a frame of tag {other} where {what} belongs");
                Err(if peer == 0 {
                    self.bad_from_root(&d)
                } else {
                    Fail::told(format!("bad data from rank {peer}: {d}"))
                })
            }
        }
    }

    /// Rank 0 waits until `peer` has sent something, looking every [`SCAN_EVERY`] at the
    /// other links for a rank that failed or ended.
    pub(crate) fn wait_for(
        &self,
        ops: &mut Ops,
        peer: usize,
        deadline: Instant,
        t: Duration,
    ) -> Result<(), Fail> {
        let i = self.link_of(peer);
        loop {
            let Some(left) = remaining(deadline) else {
                return Err(self.timed_out(ops, peer, t));
            };
            let s = &ops.readers[i];
            let peeked = s
                .set_read_timeout(Some(left.min(SCAN_EVERY)))
                .and_then(|()| s.peek(&mut [0u8; 1]));
            match peeked {
                Ok(0) => return Err(self.closed(peer)),
                Ok(_) => return Ok(()),
                Err(e) if is_retry(&e) => {}
                Err(e) => return Err(self.link_fail(ops, i, FrameError::Io(e), t, Doing::Waiting)),
            }
            self.scan(ops, Some(peer))?;
        }
    }

    /// Rank 0: fails if any link but `except`'s holds an error frame or has ended.
    pub(crate) fn scan(&self, ops: &mut Ops, except: Option<usize>) -> Result<(), Fail> {
        for i in 0..ops.readers.len() {
            let peer = self.peer_of(i);
            if except == Some(peer) {
                continue;
            }
            match front(&ops.readers[i]) {
                Front::Quiet | Front::Data => {}
                Front::Error | Front::Closed => return Err(self.last_words(ops, i)),
                Front::Failed(e) => {
                    let t = self.op_timeout();
                    return Err(self.link_fail(ops, i, FrameError::Io(e), t, Doing::Waiting));
                }
            }
        }
        Ok(())
    }

    /// Rank 0 timed out waiting for `peer`: names it and every later rank that has not sent
    /// anything either.
    pub(crate) fn timed_out(&self, ops: &Ops, peer: usize, t: Duration) -> Fail {
        let mut late = vec![peer];
        for r in peer + 1..self.world_size {
            if matches!(front(&ops.readers[self.link_of(r)]), Front::Quiet) {
                late.push(r);
            }
        }
        self.here(format!(
            "timed out after {} s waiting for {}",
            secs(&t),
            ranks_phrase(&late)
        ))
    }

    /// Writes one whole frame to link `i`. While the write is stuck (the peer is not reading)
    /// it looks at the peer's side every [`SCAN_EVERY`]: a peer that failed or ended ends it.
    pub(crate) fn send(
        &self,
        ops: &mut Ops,
        i: usize,
        frame: &[u8],
        deadline: Instant,
        t: Duration,
    ) -> Result<(), Fail> {
        let written = self.write_watched(&ops.readers[i], i, frame, deadline);
        written.map_err(|e| self.link_fail(ops, i, e, t, Doing::Sending))
    }

    pub(crate) fn write_watched(
        &self,
        reader: &TcpStream,
        i: usize,
        frame: &[u8],
        deadline: Instant,
    ) -> Result<(), FrameError> {
        use std::io::Write;
        if self.failed.get().is_some() {
            return Err(FrameError::Closed);
        }
        let mut w = self.writers[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut done = 0;
        while done < frame.len() {
            let left = remaining(deadline).ok_or(FrameError::Timeout)?;
            w.set_write_timeout(Some(left.min(SCAN_EVERY)))
                .map_err(FrameError::Io)?;
            match w.write(&frame[done..]) {
                Ok(0) => return Err(FrameError::Closed),
                Ok(n) => done += n,
                Err(e) if is_retry(&e) => match front(reader) {
                    Front::Quiet | Front::Data => {}
                    Front::Error | Front::Closed => return Err(FrameError::Closed),
                    Front::Failed(e) => return Err(FrameError::Io(e)),
                },
                Err(e) => return Err(FrameError::Io(e)),
            }
        }
        Ok(())
    }

    /// What a failure on link `i` means, in words naming the ranks.
    pub(crate) fn link_fail(
        &self,
        ops: &mut Ops,
        i: usize,
        e: FrameError,
        t: Duration,
        doing: Doing,
    ) -> Fail {
        let peer = self.peer_of(i);
        match (e, doing) {
            (FrameError::Timeout, Doing::Waiting) if self.rank == 0 => self.timed_out(ops, peer, t),
            (FrameError::Timeout, Doing::Waiting) => self.here(format!(
                "timed out after {} s waiting for rank {peer}",
                secs(&t)
            )),
            (FrameError::Timeout, Doing::Sending) => self.here(format!(
                "timed out after {} s sending to rank {peer}",
                secs(&t)
            )),
            (FrameError::Bad(d) | FrameError::Foreign(d), _) if peer == 0 => self.bad_from_root(&d),
            (FrameError::Bad(d) | FrameError::Foreign(d), _) => {
                Fail::told(format!("bad data from rank {peer}: {d}"))
            }
            // A broken socket: the peer may have said why before it went.
            (FrameError::Closed, _) => self.last_words(ops, i),
            (FrameError::Io(e), _) if is_gone(&e) => self.last_words(ops, i),
            (FrameError::Io(e), _) => self.here(format!("lost rank {peer}: {e}")),
        }
    }

    /// The error frame a peer whose link broke sent before it went, if any arrived (frames
    /// queued ahead of it are skipped); otherwise that it closed the connection.
    pub(crate) fn last_words(&self, ops: &mut Ops, i: usize) -> Fail {
        let peer = self.peer_of(i);
        if self.failed.get().is_none() {
            let deadline = Instant::now() + SALVAGE;
            let chunk = self.chunk() * 4;
            let caps = |tag| match tag {
                TAG_ERROR => MAX_ERROR_LEN,
                TAG_DATA => chunk,
                TAG_OP => OP_LEN,
                TAG_READY => READY_LEN,
                _ => 0,
            };
            while let Ok(tag) = read_frame_into(&mut ops.readers[i], caps, deadline, &mut ops.buf) {
                if tag == TAG_ERROR {
                    return self.peer_failed(peer, &ops.buf);
                }
            }
        }
        self.closed(peer)
    }

    pub(crate) fn closed(&self, peer: usize) -> Fail {
        Fail::told(format!(
            "rank {peer} closed its connection (its process ended)"
        ))
    }

    /// `peer` sent an error frame: rank 0 hears a rank's own reason; the others hear rank 0's
    /// account, which already names the rank that failed.
    pub(crate) fn peer_failed(&self, peer: usize, body: &[u8]) -> Fail {
        let text = String::from_utf8_lossy(body).into_owned();
        if peer == 0 {
            Fail::told(text)
        } else {
            Fail::told(format!("rank {peer} failed: {text}"))
        }
    }
}

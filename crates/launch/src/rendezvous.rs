//! The rendezvous itself: the entry point, and every rank but 0 joining (protocol in the
//! crate docs; rank 0's side is in `serve.rs`).

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::frame::{
    FrameError, Hello, MAX_ERROR_LEN, MAX_PAYLOAD, TAG_ACK, TAG_ERROR, TAG_HELLO, TAG_PAYLOAD,
    VERSION, deadline_after, read_frame_into, remaining, write_frame,
};
use crate::serve::serve;
use crate::{LaunchEnv, LaunchError};

/// The first and the largest pause between connection attempts of a joining rank.
const BACKOFF_START: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Gives every rank rank 0's `payload` (an NCCL unique id, say): rank 0 passes `Some(bytes)`,
/// every other rank `None`, and all get the same bytes back. Returns only once every rank of
/// `env.world_size` arrived (rank 0 also waits for every rank's ack), so it is a barrier.
/// `timeout` bounds the whole call. A world of one returns the payload without networking.
pub fn rendezvous(
    env: &LaunchEnv,
    payload: Option<&[u8]>,
    timeout: Duration,
) -> Result<Vec<u8>, LaunchError> {
    env.validate()?;
    let deadline = deadline_after(timeout);
    match (env.rank, payload) {
        (0, None) => Err(LaunchError::MissingPayload),
        (0, Some(p)) if p.len() > MAX_PAYLOAD => Err(LaunchError::PayloadTooLarge {
            len: p.len(),
            max: MAX_PAYLOAD,
        }),
        (0, Some(p)) if env.world_size == 1 => Ok(p.to_vec()),
        (0, Some(p)) => serve(env, p, timeout, deadline),
        (rank, Some(_)) => Err(LaunchError::UnexpectedPayload { rank }),
        (_, None) => join(env, timeout, deadline),
    }
}

/// A rank other than 0: connect, hello, payload (or rank 0's error), ack.
fn join(env: &LaunchEnv, timeout: Duration, deadline: Instant) -> Result<Vec<u8>, LaunchError> {
    let endpoint = env.master_endpoint();
    let (mut stream, body) = join_frame(
        env,
        &endpoint,
        timeout,
        deadline,
        (TAG_PAYLOAD, MAX_PAYLOAD),
        ("the payload", "the payload"),
    )?;
    write_frame(&mut stream, TAG_ACK, &[], deadline)
        .map_err(|e| join_error(env, &endpoint, timeout, e, "its ack to be taken"))?;
    Ok(body)
}

/// Connects to rank 0, says hello and reads rank 0's answer: a frame of tag `want.0` (body at
/// most `want.1` bytes), or rank 0's error. `names` are what that frame is called and what
/// the rank waits for, as error messages say them.
pub(crate) fn join_frame(
    env: &LaunchEnv,
    endpoint: &str,
    timeout: Duration,
    deadline: Instant,
    want: (u8, usize),
    names: (&'static str, &'static str),
) -> Result<(TcpStream, Vec<u8>), LaunchError> {
    let (what, waiting) = names;
    let mut stream = connect(env, endpoint, timeout, deadline)?;
    let _ = stream.set_nodelay(true);
    let fail = |e, waiting| join_error(env, endpoint, timeout, e, waiting);
    let hello = Hello {
        version: VERSION,
        rank: env.rank as u64,
        world_size: env.world_size as u64,
    };
    write_frame(&mut stream, TAG_HELLO, &hello.encode(), deadline)
        .map_err(|e| fail(e, "its hello to be taken"))?;
    let mut body = Vec::new();
    // Any other frame is read (small) so the error can say which tag came instead.
    let caps = |tag| if tag == want.0 { want.1 } else { MAX_ERROR_LEN };
    let tag =
        read_frame_into(&mut stream, caps, deadline, &mut body).map_err(|e| fail(e, waiting))?;
    match tag {
        TAG_ERROR => Err(LaunchError::Aborted {
            endpoint: endpoint.to_owned(),
            message: String::from_utf8_lossy(&body).into_owned(),
        }),
        t if t == want.0 => Ok((stream, body)),
        other => Err(fail(
            FrameError::Bad(format!("a frame of tag {other} where {what} belongs")),
            waiting,
        )),
    }
}

/// A joining rank's failure on its socket to rank 0, saying what it waited for.
pub(crate) fn join_error(
    env: &LaunchEnv,
    endpoint: &str,
    timeout: Duration,
    e: FrameError,
    waiting: &'static str,
) -> LaunchError {
    match e {
        FrameError::Timeout => LaunchError::NoAnswer {
            rank: env.rank,
            endpoint: endpoint.to_owned(),
            timeout,
            waiting,
        },
        FrameError::Closed => LaunchError::Protocol {
            peer: format!("rank 0 at {endpoint}"),
            detail: format!(
                "it closed the connection while rank {} waited for {waiting}",
                env.rank
            ),
        },
        FrameError::Io(source) => LaunchError::Io {
            context: format!(
                "rank {} waiting for {waiting} from rank 0 at {endpoint}",
                env.rank
            ),
            source,
        },
        FrameError::Bad(detail) => LaunchError::Protocol {
            peer: format!("rank 0 at {endpoint}"),
            detail,
        },
    }
}

/// Connects to rank 0, retrying refused or failed attempts (rank 0 may not listen yet, its
/// host name may not resolve yet) with doubling pauses until the deadline.
fn connect(
    env: &LaunchEnv,
    endpoint: &str,
    timeout: Duration,
    deadline: Instant,
) -> Result<TcpStream, LaunchError> {
    let mut backoff = BACKOFF_START;
    let mut last = String::from("no attempt made");
    loop {
        let Some(left) = remaining(deadline) else {
            return Err(LaunchError::Unreachable {
                rank: env.rank,
                endpoint: endpoint.to_owned(),
                timeout,
                last,
            });
        };
        match (env.master_host(), env.master_port).to_socket_addrs() {
            Err(e) => last = format!("cannot resolve {:?}: {e}", env.master_host()),
            Ok(addrs) => {
                for addr in addrs {
                    let Some(left) = remaining(deadline) else {
                        break;
                    };
                    match TcpStream::connect_timeout(&addr, left) {
                        // Connecting to a free port in the ephemeral range can pick that very
                        // port as the source: TCP simultaneous open, a socket talking to itself.
                        Ok(s) if s.local_addr().ok() == Some(addr) => {
                            last = format!("{addr} connected to itself (nothing listens there)");
                        }
                        Ok(s) => return Ok(s),
                        Err(e) => last = format!("{addr}: {e}"),
                    }
                }
            }
        }
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

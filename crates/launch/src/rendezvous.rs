//! The rendezvous itself: the entry point, and every rank but 0 joining (protocol in the
//! crate docs; rank 0's side is in `serve.rs`).

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::frame::{
    FrameError, Hello, MAX_PAYLOAD, TAG_ACK, TAG_ERROR, TAG_HELLO, TAG_PAYLOAD, VERSION,
    read_frame, remaining, write_frame,
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
    let now = Instant::now();
    // A timeout past what Instant can hold is as good as none.
    let deadline = now
        .checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now);
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
    let mut stream = connect(env, &endpoint, timeout, deadline)?;
    let _ = stream.set_nodelay(true);
    let fail = |e: FrameError, waiting: &'static str| match e {
        FrameError::Timeout => LaunchError::NoAnswer {
            rank: env.rank,
            endpoint: endpoint.clone(),
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
    };
    let hello = Hello {
        version: VERSION,
        rank: env.rank as u64,
        world_size: env.world_size as u64,
    };
    write_frame(&mut stream, TAG_HELLO, &hello.encode(), deadline)
        .map_err(|e| fail(e, "its hello to be taken"))?;
    let (tag, body) =
        read_frame(&mut stream, MAX_PAYLOAD, deadline).map_err(|e| fail(e, "the payload"))?;
    match tag {
        TAG_PAYLOAD => {}
        TAG_ERROR => {
            return Err(LaunchError::Aborted {
                endpoint: endpoint.clone(),
                message: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        other => {
            return Err(fail(
                FrameError::Bad(format!("a frame of tag {other} where the payload belongs")),
                "the payload",
            ));
        }
    }
    write_frame(&mut stream, TAG_ACK, &[], deadline).map_err(|e| fail(e, "its ack to be taken"))?;
    Ok(body)
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

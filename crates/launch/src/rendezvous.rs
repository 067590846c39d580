//! The rendezvous itself: the entry point, and every rank but 0 joining (protocol in the
//! crate docs; rank 0's side is in `serve.rs`).

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::frame::{
    FrameError, Hello, MAX_ERROR_LEN, MAX_PAYLOAD, TAG_ACK, TAG_ERROR, TAG_HELLO, TAG_PAYLOAD,
    TAG_WELCOME, VERSION, deadline_after, read_frame_into, remaining, write_frame,
};
use crate::serve::serve;
use crate::{LaunchEnv, LaunchError};

/// The first and the largest pause between connection attempts of a joining rank.
const BACKOFF_START: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// How long a joining rank waits for rank 0's answer to its hello. Rank 0 answers at once, as
/// it reads the hello, so a peer silent this long is another service on the port (a rank
/// that waited its whole timeout there would only then say so). Twice rank 0's own wait for
/// a hello (`serve::HELLO_WAIT`), so a busy rank 0 host is not taken for a stranger.
const WELCOME_WAIT: Duration = Duration::from_secs(10);

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
    welcome(
        env,
        endpoint,
        (timeout, deadline),
        WELCOME_WAIT,
        &mut stream,
        &mut body,
    )?;
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

/// Reads rank 0's answer to the hello within `wait` ([`WELCOME_WAIT`]): a welcome, or rank
/// 0's error. `limit` is the call's timeout and deadline.
/// Silence, bytes that are no frame, or a close are what a service other than dflash's rank 0
/// gives, and fail now with the port's advice rather than at the timeout.
fn welcome(
    env: &LaunchEnv,
    endpoint: &str,
    limit: (Duration, Instant),
    wait: Duration,
    stream: &mut TcpStream,
    body: &mut Vec<u8>,
) -> Result<(), LaunchError> {
    let (timeout, deadline) = limit;
    let by = deadline.min(Instant::now() + wait);
    let caps = |tag| if tag == TAG_WELCOME { 0 } else { MAX_ERROR_LEN };
    let foreign = |what: String| LaunchError::ForeignPeer {
        rank: env.rank,
        endpoint: endpoint.to_owned(),
        origin: env.port_origin,
        what,
    };
    match read_frame_into(stream, caps, by, body) {
        Ok(TAG_WELCOME) => Ok(()),
        Ok(TAG_ERROR) => Err(LaunchError::Aborted {
            endpoint: endpoint.to_owned(),
            message: String::from_utf8_lossy(body).into_owned(),
        }),
        Ok(other) => Err(join_error(
            env,
            endpoint,
            timeout,
            FrameError::Bad(format!(
                "a frame of tag {other} where the answer to its hello belongs"
            )),
            "an answer to its hello",
        )),
        // The rank's own deadline, not the welcome's, ran out: say so as every wait does.
        Err(FrameError::Timeout) if by == deadline => Err(join_error(
            env,
            endpoint,
            timeout,
            FrameError::Timeout,
            "an answer to its hello",
        )),
        Err(FrameError::Timeout) => Err(foreign(format!(
            "nothing answered its hello within {} s",
            crate::error::secs(&wait)
        ))),
        Err(FrameError::Foreign(why)) => Err(foreign(format!("it answered the hello: {why}"))),
        Err(FrameError::Closed) => Err(foreign(
            "the connection was closed without an answer to its hello".to_owned(),
        )),
        Err(e) => Err(join_error(
            env,
            endpoint,
            timeout,
            e,
            "an answer to its hello",
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
        FrameError::Bad(detail) | FrameError::Foreign(detail) => LaunchError::Protocol {
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
                origin: env.port_origin,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PortOrigin;
    use std::net::TcpListener;

    #[test]
    fn a_silent_stranger_is_named_after_the_welcome_wait() {
        // Something that takes the connection and never speaks (a TCPStore of another
        // protocol, say): the rank fails after the welcome wait, long before its timeout.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let env = LaunchEnv {
            rank: 1,
            world_size: 2,
            local_rank: 1,
            master_addr: "127.0.0.1".to_owned(),
            master_port: port,
            port_origin: PortOrigin::AfterTorchrunStore,
        };
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let timeout = Duration::from_secs(30);
        let start = Instant::now();
        let e = welcome(
            &env,
            &env.master_endpoint(),
            (timeout, deadline_after(timeout)),
            Duration::from_millis(200),
            &mut stream,
            &mut Vec::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(
            e.starts_with(&format!(
                "rank 1 reached 127.0.0.1:{port}, but nothing answered its hello within 0.2 s"
            )),
            "{e}"
        );
        assert!(e.contains("MASTER_PORT+1"), "{e}");
    }
}

//! Rank 0's side of the rendezvous: listen, admit the hellos, send the payload, collect the
//! acks; on any failure, tell every connected rank why. A connection that is not a rank (a
//! health check, a port scan) is logged and dropped, and never holds up the ranks.

use std::io::{ErrorKind, Read};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::time::{Duration, Instant};

use crate::error::secs;
use crate::frame::{
    FrameError, HEADER_LEN, HELLO_LEN, Hello, MAX_ERROR_LEN, TAG_ACK, TAG_ERROR, TAG_HELLO,
    TAG_PAYLOAD, TAG_WELCOME, VERSION, foreign, parse_header, read_frame, remaining, write_frame,
};
use crate::{LaunchEnv, LaunchError, PortOrigin};

/// How often rank 0 polls its listener and the connections that owe a hello: std has no
/// accept timeout or poll, and a few milliseconds per arrival is nothing next to loading a
/// model.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Time granted to tell a peer why the rendezvous failed; it is one small frame.
const ERROR_SEND: Duration = Duration::from_secs(1);
/// How long rank 0 gives a new connection to send its hello. A rank sends it as soon as it
/// connects, so only something that is not a rank (a load balancer's or Kubernetes' TCP
/// check, a port scan) stays silent this long; it is dropped then. It never holds up the
/// ranks meanwhile: every connection's hello is read as it comes, side by side.
pub(crate) const HELLO_WAIT: Duration = Duration::from_secs(5);
/// Connections waiting for their hello at once; past it the oldest is dropped, to bound the
/// sockets a flood of connections holds (a rank's hello follows its connect at once, so the
/// oldest is the likeliest stranger).
const MAX_PENDING: usize = 256;

/// Rank 0's connections by rank; slot 0 (rank 0 itself) stays empty.
pub(crate) type Peers = Vec<Option<(TcpStream, SocketAddr)>>;

/// A connection that has not sent a whole hello yet, read without blocking.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    buf: [u8; HEADER_LEN + HELLO_LEN],
    have: usize,
    /// The body's length, once the header is in and checked.
    body: Option<usize>,
    since: Instant,
}

/// What a pending connection said so far.
enum Heard {
    /// Not a whole hello yet.
    Nothing,
    Hello(Hello),
    /// Not a rank: it closed, failed, or sent bytes that start no frame of this protocol.
    Stray(String),
    /// A frame of this protocol that is no valid hello: a rank of another build or a broken
    /// one, which every rank must hear about as of any other mismatch.
    Bad(String),
}

impl Pending {
    fn new(stream: TcpStream, from: SocketAddr) -> std::io::Result<Pending> {
        // Accepted sockets do not inherit the listener's mode everywhere; set it either way.
        stream.set_nonblocking(true)?;
        Ok(Pending {
            stream,
            from,
            buf: [0; HEADER_LEN + HELLO_LEN],
            have: 0,
            body: None,
            since: Instant::now(),
        })
    }

    /// Reads what has arrived, never blocking. The header is checked before the body is
    /// read (magic first), as `read_frame` does.
    fn poll(&mut self) -> Heard {
        loop {
            let need = HEADER_LEN + self.body.unwrap_or(0);
            if self.have < need {
                match self.stream.read(&mut self.buf[self.have..need]) {
                    Ok(0) => {
                        return Heard::Stray(format!(
                            "it closed the connection after {} byte(s), before a whole hello",
                            self.have
                        ));
                    }
                    Ok(n) => self.have += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Heard::Nothing,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Heard::Stray(e.to_string()),
                }
                if self.have >= 8
                    && let Some(why) = foreign(&self.buf[..self.have])
                {
                    return Heard::Stray(why);
                }
                continue;
            }
            let Some(len) = self.body else {
                let mut h = [0u8; HEADER_LEN];
                h.copy_from_slice(&self.buf[..HEADER_LEN]);
                match parse_header(&h, HELLO_LEN) {
                    Ok((TAG_HELLO, len)) => self.body = Some(len),
                    Ok((tag, _)) => {
                        return Heard::Bad(format!("a frame of tag {tag} where a hello belongs"));
                    }
                    Err(detail) => return Heard::Bad(detail),
                }
                continue;
            };
            return match Hello::decode(&self.buf[HEADER_LEN..HEADER_LEN + len]) {
                Ok(hello) => Heard::Hello(hello),
                Err(detail) => Heard::Bad(detail),
            };
        }
    }
}

/// One line per dropped connection, so a stray that keeps coming back is visible in the log
/// without stopping anything.
fn log_stray(endpoint: &str, from: SocketAddr, why: &str) {
    eprintln!("launch: rank 0 on {endpoint} dropped a connection from {from}, not a rank: {why}");
}

/// Rank 0: listens and admits `world_size - 1` hellos, checked, answering each with a
/// welcome; gives the connections by rank (slot 0 empty). Connections that are not ranks are
/// dropped; on a failure every connected rank is told why.
pub(crate) fn accept_ranks(
    env: &LaunchEnv,
    timeout: Duration,
    deadline: Instant,
) -> Result<Peers, LaunchError> {
    let endpoint = env.master_endpoint();
    let listener = bind(env, &endpoint)?;
    listener
        .set_nonblocking(true)
        .map_err(|source| LaunchError::Io {
            context: format!("rank 0 setting up its listener on {endpoint}"),
            source,
        })?;
    let mut peers: Peers = (0..env.world_size).map(|_| None).collect();
    let mut pending: Vec<Pending> = Vec::new();
    let mut arrived = 1;
    while arrived < env.world_size {
        let mut busy = false;
        // Take every connection waiting, so none waits behind a silent one.
        loop {
            match listener.accept() {
                Ok((stream, from)) => {
                    busy = true;
                    match Pending::new(stream, from) {
                        Ok(p) => pending.push(p),
                        Err(e) => log_stray(&endpoint, from, &e.to_string()),
                    }
                    if pending.len() > MAX_PENDING {
                        let oldest = pending.remove(0);
                        log_stray(
                            &endpoint,
                            oldest.from,
                            &format!(
                                "{MAX_PENDING} connections waited for a hello at once; the \
                                 oldest goes"
                            ),
                        );
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // A peer that gave up between its connect and our accept: it will come again.
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted
                            | ErrorKind::ConnectionAborted
                            | ErrorKind::ConnectionReset
                    ) => {}
                Err(source) => {
                    let e = LaunchError::Io {
                        context: format!("rank 0 accepting connections on {endpoint}"),
                        source,
                    };
                    return Err(abort_all(&mut peers, pending, e));
                }
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let heard = pending[i].poll();
            if matches!(heard, Heard::Nothing) && pending[i].since.elapsed() < HELLO_WAIT {
                i += 1;
                continue;
            }
            busy = true;
            let mut p = pending.remove(i);
            let admitted = match heard {
                Heard::Nothing => {
                    let why = format!("it sent no hello within {} s", secs(&HELLO_WAIT));
                    log_stray(&endpoint, p.from, &why);
                    // A rank held up that long (it would be the first) learns why it is
                    // dropped, rather than taking the hang-up for another service's.
                    let _ = p.stream.set_nonblocking(false);
                    let e = LaunchError::Protocol {
                        peer: format!("the peer at {}", p.from),
                        detail: why,
                    };
                    send_error(&mut p.stream, &e);
                    continue;
                }
                Heard::Stray(why) => {
                    log_stray(&endpoint, p.from, &why);
                    continue;
                }
                Heard::Bad(detail) => Err(LaunchError::Protocol {
                    peer: format!("the peer at {}", p.from),
                    detail,
                }),
                Heard::Hello(hello) => check(env, &endpoint, &peers, &hello, p.from)
                    .and_then(|rank| welcome(&mut p.stream, rank, p.from, timeout, deadline)),
            };
            match admitted {
                Ok(rank) => {
                    peers[rank] = Some((p.stream, p.from));
                    arrived += 1;
                }
                Err(e) => {
                    let _ = p.stream.set_nonblocking(false);
                    send_error(&mut p.stream, &e);
                    return Err(abort_all(&mut peers, pending, e));
                }
            }
        }
        if arrived == env.world_size {
            break;
        }
        let Some(left) = remaining(deadline) else {
            let missing = (1..env.world_size)
                .filter(|&r| peers[r].is_none())
                .collect();
            let e = LaunchError::MissingRanks {
                endpoint,
                missing,
                world_size: env.world_size,
                timeout,
            };
            return Err(abort_all(&mut peers, pending, e));
        };
        if !busy {
            std::thread::sleep(left.min(ACCEPT_POLL));
        }
    }
    // Every rank is in; a connection still owing its hello is a stranger, or a process
    // launched with a rank that another already took: that one hears why it is refused.
    for mut p in pending {
        log_stray(&endpoint, p.from, "every rank had joined before its hello");
        let late = LaunchError::Protocol {
            peer: format!("the peer at {}", p.from),
            detail: format!(
                "every rank of WORLD_SIZE={} had joined before its hello (was a rank launched \
                 twice?)",
                env.world_size
            ),
        };
        let _ = p.stream.set_nonblocking(false);
        send_error(&mut p.stream, &late);
    }
    Ok(peers)
}

/// Answers an admitted hello at once, so the rank knows it reached dflash's rank 0 (and not
/// another service on the port) long before the payload or go-ahead comes.
fn welcome(
    stream: &mut TcpStream,
    rank: usize,
    from: SocketAddr,
    timeout: Duration,
    deadline: Instant,
) -> Result<usize, LaunchError> {
    let io = |source| LaunchError::Io {
        context: format!("rank 0 setting up its link to rank {rank} at {from}"),
        source,
    };
    stream.set_nonblocking(false).map_err(io)?;
    let _ = stream.set_nodelay(true);
    write_frame(stream, TAG_WELCOME, &[], deadline).map_err(|e| match e {
        FrameError::Timeout => LaunchError::Protocol {
            peer: format!("rank {rank} at {from}"),
            detail: format!("it took no answer to its hello within {} s", secs(&timeout)),
        },
        e => peer_error(e, rank, from, "answering the hello of", timeout),
    })?;
    Ok(rank)
}

/// Rank 0: listen, admit `world_size - 1` hellos, send the payload to each, collect the acks.
pub(crate) fn serve(
    env: &LaunchEnv,
    payload: &[u8],
    timeout: Duration,
    deadline: Instant,
) -> Result<Vec<u8>, LaunchError> {
    let mut peers = accept_ranks(env, timeout, deadline)?;

    let mut failure = None;
    for (rank, slot) in peers.iter_mut().enumerate() {
        let Some((stream, from)) = slot else { continue };
        if let Err(e) = write_frame(stream, TAG_PAYLOAD, payload, deadline) {
            failure = Some(peer_error(
                e,
                rank,
                *from,
                "sending the payload to",
                timeout,
            ));
            break;
        }
    }
    if let Some(e) = failure {
        return Err(abort(&mut peers, e));
    }
    // Every rank has the payload now; a failed ack fails rank 0 alone.
    for (rank, slot) in peers.iter_mut().enumerate() {
        let Some((stream, from)) = slot else { continue };
        let (tag, _) = read_frame(stream, 0, deadline)
            .map_err(|e| peer_error(e, rank, *from, "waiting for the ack of", timeout))?;
        if tag != TAG_ACK {
            return Err(LaunchError::Protocol {
                peer: format!("rank {rank} at {from}"),
                detail: format!("a frame of tag {tag} where its ack belongs"),
            });
        }
    }
    Ok(payload.to_vec())
}

/// Binds the address as given (every address it resolves to, first that works), so a job on
/// one interface of a multi-homed host does not listen on the others; a host name that
/// resolves only to loopback is the exception ([`listen_addrs`]).
fn bind(env: &LaunchEnv, endpoint: &str) -> Result<TcpListener, LaunchError> {
    let bind_err = |source| LaunchError::Bind {
        endpoint: endpoint.to_owned(),
        origin: env.port_origin,
        source,
    };
    if env.port_origin == PortOrigin::AfterTorchrunStore {
        eprintln!(
            "launch: torchrun's store holds MASTER_PORT, so rank 0 listens on MASTER_PORT+1 = {} \
             (DFLASH_MASTER_PORT sets another)",
            env.master_port
        );
    }
    let resolved: Vec<SocketAddr> = (env.master_host(), env.master_port)
        .to_socket_addrs()
        .map_err(bind_err)?
        .collect();
    let addrs = listen_addrs(env.master_host(), &resolved);
    if addrs != resolved {
        eprintln!(
            "launch: MASTER_ADDR {:?} resolves to loopback here; rank 0 listens on every \
             interface (port {}) so that ranks on other hosts reach it",
            env.master_host(),
            env.master_port
        );
    }
    let mut last = None;
    for addr in addrs {
        match TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(bind_err(last.unwrap_or_else(|| {
        std::io::Error::new(
            ErrorKind::AddrNotAvailable,
            "the address resolves to nothing",
        )
    })))
}

/// Where rank 0 listens for `host` resolved to `resolved`: those addresses, except for a host
/// name (not an IP literal, not `localhost`) that resolves only to loopback — Debian maps a
/// machine's own name to 127.0.1.1 — which ranks on other hosts could never reach: there, the
/// unspecified address of each family, as torchrun's store listens.
fn listen_addrs(host: &str, resolved: &[SocketAddr]) -> Vec<SocketAddr> {
    let named = host.parse::<IpAddr>().is_err() && !host.eq_ignore_ascii_case("localhost");
    if !named || resolved.is_empty() || !resolved.iter().all(|a| a.ip().is_loopback()) {
        return resolved.to_vec();
    }
    let mut out: Vec<SocketAddr> = Vec::new();
    for a in resolved {
        let any = match a.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let a = SocketAddr::new(any, a.port());
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

/// Checks one hello against the world and the ranks already in; gives the peer's rank.
fn check(
    env: &LaunchEnv,
    endpoint: &str,
    peers: &[Option<(TcpStream, SocketAddr)>],
    hello: &Hello,
    from: SocketAddr,
) -> Result<usize, LaunchError> {
    if hello.version != VERSION {
        return Err(LaunchError::VersionMismatch {
            peer: from,
            theirs: hello.version,
            ours: VERSION,
        });
    }
    if hello.world_size != env.world_size as u64 {
        return Err(LaunchError::WorldSizeMismatch {
            peer_rank: hello.rank,
            peer_world_size: hello.world_size,
            world_size: env.world_size,
        });
    }
    if hello.rank == 0 {
        return Err(LaunchError::DuplicateRank {
            rank: 0,
            first: format!("rank 0 itself, listening on {endpoint}"),
            second: format!("the peer at {from}"),
        });
    }
    let Some(slot) = usize::try_from(hello.rank).ok().and_then(|r| peers.get(r)) else {
        return Err(LaunchError::PeerRankOutOfRange {
            peer: from,
            rank: hello.rank,
            world_size: env.world_size,
        });
    };
    if let Some((_, first)) = slot {
        return Err(LaunchError::DuplicateRank {
            rank: hello.rank,
            first: format!("the peer at {first}"),
            second: format!("the peer at {from}"),
        });
    }
    Ok(hello.rank as usize)
}

pub(crate) fn peer_error(
    e: FrameError,
    rank: usize,
    from: SocketAddr,
    doing: &str,
    timeout: Duration,
) -> LaunchError {
    match e {
        FrameError::Timeout => LaunchError::NoAck {
            rank,
            peer: from,
            timeout,
        },
        FrameError::Closed => LaunchError::Protocol {
            peer: format!("rank {rank} at {from}"),
            detail: format!("it closed the connection while rank 0 was {doing} it (did it fail?)"),
        },
        FrameError::Io(source) => LaunchError::Io {
            context: format!("rank 0 {doing} rank {rank} at {from}"),
            source,
        },
        FrameError::Bad(detail) | FrameError::Foreign(detail) => LaunchError::Protocol {
            peer: format!("rank {rank} at {from}"),
            detail,
        },
    }
}

/// [`abort`], and the connections that owe a hello hear it too: one may be a rank that
/// connected a moment late, which had better fail now with rank 0's message.
fn abort_all(peers: &mut Peers, pending: Vec<Pending>, e: LaunchError) -> LaunchError {
    for mut p in pending {
        let _ = p.stream.set_nonblocking(false);
        send_error(&mut p.stream, &e);
    }
    abort(peers, e)
}

/// Tells every connected peer why rank 0 gives up, so they fail now with rank 0's message
/// rather than at their own timeout with a vaguer one; gives `e` back.
pub(crate) fn abort(peers: &mut [Option<(TcpStream, SocketAddr)>], e: LaunchError) -> LaunchError {
    for (stream, _) in peers.iter_mut().flatten() {
        send_error(stream, &e);
    }
    e
}

/// Best effort: the peer may be gone already.
fn send_error(stream: &mut TcpStream, e: &LaunchError) {
    let mut msg = e.to_string();
    if msg.len() > MAX_ERROR_LEN {
        let mut cut = MAX_ERROR_LEN;
        while !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        msg.truncate(cut);
    }
    let _ = write_frame(
        stream,
        TAG_ERROR,
        msg.as_bytes(),
        Instant::now() + ERROR_SEND,
    );
    let _ = stream.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::listen_addrs;
    use std::net::SocketAddr;

    #[test]
    fn a_host_name_that_resolves_to_loopback_listens_everywhere() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let debian = [a("127.0.1.1:29500")];
        assert_eq!(listen_addrs("node7", &debian), [a("0.0.0.0:29500")]);
        let both = [a("[::1]:29500"), a("127.0.0.1:29500")];
        assert_eq!(
            listen_addrs("node7", &both),
            [a("[::]:29500"), a("0.0.0.0:29500")]
        );
        // As given: an IP literal, localhost, and a name with a routable address.
        for (host, resolved) in [
            ("127.0.0.1", [a("127.0.0.1:29500")]),
            ("localhost", [a("127.0.0.1:29500")]),
            ("node7", [a("10.0.0.7:29500")]),
        ] {
            assert_eq!(listen_addrs(host, &resolved), resolved, "{host}");
        }
    }
}

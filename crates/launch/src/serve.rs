//! Rank 0's side of the rendezvous: listen, admit the hellos, send the payload, collect the
//! acks; on any failure, tell every connected rank why.

use std::io::ErrorKind;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::time::{Duration, Instant};

use crate::frame::{
    FrameError, HELLO_LEN, Hello, MAX_ERROR_LEN, TAG_ACK, TAG_ERROR, TAG_HELLO, TAG_PAYLOAD,
    VERSION, read_frame, remaining, write_frame,
};
use crate::{LaunchEnv, LaunchError};

/// How often rank 0 polls its listener: std has no accept timeout, and a few milliseconds per
/// arrival is nothing next to loading a model.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Time granted to tell a peer why the rendezvous failed; it is one small frame.
const ERROR_SEND: Duration = Duration::from_secs(1);

/// Rank 0's connections by rank; slot 0 (rank 0 itself) stays empty.
pub(crate) type Peers = Vec<Option<(TcpStream, SocketAddr)>>;

/// Rank 0: listens and admits `world_size - 1` hellos, checked; gives the connections by
/// rank (slot 0 empty). On a failure every connected rank is told why.
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
    let mut arrived = 1;
    while arrived < env.world_size {
        let (mut stream, from) = match listener.accept() {
            Ok(conn) => conn,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
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
                    return Err(abort(&mut peers, e));
                };
                std::thread::sleep(left.min(ACCEPT_POLL));
                continue;
            }
            // A peer that gave up between its connect and our accept: it will come again.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Interrupted
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::ConnectionReset
                ) =>
            {
                continue;
            }
            Err(source) => {
                let e = LaunchError::Io {
                    context: format!("rank 0 accepting connections on {endpoint}"),
                    source,
                };
                return Err(abort(&mut peers, e));
            }
        };
        match admit(env, &endpoint, &peers, &mut stream, from, timeout, deadline) {
            Ok(rank) => {
                peers[rank] = Some((stream, from));
                arrived += 1;
            }
            Err(e) => {
                send_error(&mut stream, &e);
                return Err(abort(&mut peers, e));
            }
        }
    }
    Ok(peers)
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
        source,
    };
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

/// Reads and checks one hello; gives the peer's rank.
fn admit(
    env: &LaunchEnv,
    endpoint: &str,
    peers: &[Option<(TcpStream, SocketAddr)>],
    stream: &mut TcpStream,
    from: SocketAddr,
    timeout: Duration,
    deadline: Instant,
) -> Result<usize, LaunchError> {
    let protocol = |detail: String| LaunchError::Protocol {
        peer: format!("the peer at {from}"),
        detail,
    };
    let io = |source| LaunchError::Io {
        context: format!("rank 0 reading a hello from {from}"),
        source,
    };
    // Some platforms hand out accepted sockets with the listener's non-blocking mode.
    stream.set_nonblocking(false).map_err(io)?;
    let _ = stream.set_nodelay(true);
    let (tag, body) = read_frame(stream, HELLO_LEN, deadline).map_err(|e| match e {
        FrameError::Timeout => protocol(format!(
            "it connected but sent no hello within {} s",
            crate::error::secs(&timeout)
        )),
        FrameError::Closed => protocol("it closed the connection before its hello".to_owned()),
        FrameError::Io(source) => io(source),
        FrameError::Bad(detail) => protocol(detail),
    })?;
    if tag != TAG_HELLO {
        return Err(protocol(format!(
            "a frame of tag {tag} where a hello belongs"
        )));
    }
    let hello = Hello::decode(&body).map_err(protocol)?;
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
        FrameError::Bad(detail) => LaunchError::Protocol {
            peer: format!("rank {rank} at {from}"),
            detail,
        },
    }
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

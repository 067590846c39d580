//! The rendezvous over real sockets on 127.0.0.1: ranks as threads, as two processes (this test
//! binary run again with `DFLASH_LAUNCH_CHILD` set), and fake peers that break the protocol.

mod group_support;

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use dflash_launch::{LaunchEnv, LaunchError, MAX_PAYLOAD, PortOrigin, ProcessGroup, rendezvous};
use group_support::{VERSION, env, free_port, welcome};

/// Generous for success paths (they take milliseconds); failure paths pass short timeouts.
const LONG: Duration = Duration::from_secs(10);

/// `len` bytes of splitmix64 from `seed`: distinct per seed, never all zeros.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs a rank on its own thread.
fn spawn_rank(
    e: LaunchEnv,
    p: Option<Vec<u8>>,
    timeout: Duration,
) -> thread::JoinHandle<Result<Vec<u8>, LaunchError>> {
    thread::spawn(move || rendezvous(&e, p.as_deref(), timeout))
}

fn err_text(r: Result<Vec<u8>, LaunchError>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(p) => panic!("expected an error, got a payload of {} bytes", p.len()),
    }
}

/// A frame as the crate docs define it: `len u32 LE | "DFRV" | tag | body`.
fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut f = ((body.len() + 5) as u32).to_le_bytes().to_vec();
    f.extend_from_slice(b"DFRV");
    f.push(tag);
    f.extend_from_slice(body);
    f
}

/// Connects to a rank 0 that may not listen yet.
fn connect_retrying(port: u16) -> TcpStream {
    let deadline = Instant::now() + LONG;
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) if Instant::now() > deadline => panic!("no rank 0 on {port}: {e}"),
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
}

#[test]
fn world_of_three_all_get_the_payload() {
    let port = free_port();
    let id = payload(42, 128);
    // The other ranks start first: they must retry until rank 0 listens.
    let others: Vec<_> = (1..3)
        .map(|r| spawn_rank(env(r, 3, port), None, LONG))
        .collect();
    thread::sleep(Duration::from_millis(100));
    let root = spawn_rank(env(0, 3, port), Some(id.clone()), LONG);
    assert_eq!(root.join().unwrap().unwrap(), id);
    for h in others {
        assert_eq!(h.join().unwrap().unwrap(), id);
    }
}

#[test]
fn world_of_one_needs_no_network() {
    // Nothing listens on, or could bind, this address: a world of one must not try.
    let e = LaunchEnv {
        master_addr: "192.0.2.1".to_owned(),
        ..env(0, 1, 9)
    };
    let id = payload(1, 128);
    assert_eq!(rendezvous(&e, Some(&id), LONG).unwrap(), id);
}

#[test]
fn only_rank_zero_brings_the_payload() {
    let port = free_port();
    let e = err_text(rendezvous(&env(0, 2, port), None, LONG));
    assert!(e.contains("rank 0") && e.contains("Some(payload)"), "{e}");
    let e = err_text(rendezvous(&env(1, 2, port), Some(&[1]), LONG));
    assert!(e.contains("rank 1 passed a payload"), "{e}");
    let big = vec![7u8; MAX_PAYLOAD + 1];
    let e = err_text(rendezvous(&env(0, 2, port), Some(&big), LONG));
    assert!(e.contains(&format!("{} bytes", MAX_PAYLOAD + 1)), "{e}");
    let e = err_text(rendezvous(&env(2, 2, port), None, LONG));
    assert!(e.contains("RANK=2") && e.contains("WORLD_SIZE=2"), "{e}");
}

#[test]
fn world_size_mismatch_fails_both_sides() {
    let port = free_port();
    let root = spawn_rank(env(0, 2, port), Some(payload(2, 128)), LONG);
    let peer = spawn_rank(env(1, 3, port), None, LONG);
    let root_err = err_text(root.join().unwrap());
    let peer_err = err_text(peer.join().unwrap());
    assert!(
        root_err.contains("rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2"),
        "{root_err}"
    );
    // The peer fails with rank 0's message, word for word.
    assert!(peer_err.contains(&root_err), "{peer_err}");
    assert!(
        peer_err.contains(&format!("127.0.0.1:{port}")),
        "{peer_err}"
    );
}

#[test]
fn duplicate_rank_fails_everyone() {
    let port = free_port();
    let root = spawn_rank(env(0, 3, port), Some(payload(3, 128)), LONG);
    let twins: Vec<_> = (0..2)
        .map(|_| spawn_rank(env(1, 3, port), None, LONG))
        .collect();
    let root_err = err_text(root.join().unwrap());
    assert!(
        root_err.contains("two processes claim RANK=1"),
        "{root_err}"
    );
    for t in twins {
        let e = err_text(t.join().unwrap());
        assert!(e.contains(&root_err), "{e}");
    }
}

#[test]
fn missing_rank_fails_rank_zero_in_time() {
    let port = free_port();
    let start = Instant::now();
    let root = spawn_rank(
        env(0, 3, port),
        Some(payload(4, 128)),
        Duration::from_millis(400),
    );
    let peer = spawn_rank(env(1, 3, port), None, LONG);
    let root_err = err_text(root.join().unwrap());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(
        root_err.contains("rank(s) 2 of WORLD_SIZE=3 never arrived within 0.4 s"),
        "{root_err}"
    );
    // Rank 1 arrived, and hears why at once rather than at its own (long) timeout.
    let peer_err = err_text(peer.join().unwrap());
    assert!(peer_err.contains(&root_err), "{peer_err}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn no_rank_zero_fails_in_time_naming_the_address() {
    let port = free_port();
    let start = Instant::now();
    let e = err_text(rendezvous(
        &env(1, 2, port),
        None,
        Duration::from_millis(300),
    ));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(
        e.contains(&format!(
            "could not reach rank 0 at 127.0.0.1:{port} within 0.3 s"
        )),
        "{e}"
    );
}

#[test]
fn silent_rank_zero_is_named() {
    // Something listens but never answers: the joining rank names it and what it waited for.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let e = err_text(rendezvous(
        &env(1, 2, port),
        None,
        Duration::from_millis(300),
    ));
    assert!(
        e.contains(&format!(
            "rank 0 at 127.0.0.1:{port} did not answer rank 1 within 0.3 s"
        )),
        "{e}"
    );
    drop(listener);
}

#[test]
fn garbage_to_rank_zero_is_an_error() {
    // Frames of this protocol that are no valid hello: a broken rank, which must hear why.
    // (Bytes that are no frame at all come from strangers: `strangers_do_not_stop_the_ranks`.)
    let cases: [(&[u8], &str); 3] = [
        (
            &[0xff, 0xff, 0xff, 0xff, b'D', b'F', b'R', b'V', 1],
            "more than the 20",
        ),
        (&frame(1, &[0; 3]), "a hello of 3 bytes"),
        (&frame(9, &[]), "tag 9"),
    ];
    for (bytes, expected) in cases {
        let port = free_port();
        let root = spawn_rank(env(0, 2, port), Some(payload(5, 128)), LONG);
        let mut s = connect_retrying(port);
        s.write_all(bytes).unwrap();
        let e = err_text(root.join().unwrap());
        assert!(e.contains("bad data from the peer at 127.0.0.1:"), "{e}");
        assert!(e.contains(expected), "{expected}: {e}");
    }
}

#[test]
fn bad_hellos_are_refused_with_the_reason() {
    let hello = |version: u32, rank: u64, world: u64| {
        let mut b = version.to_le_bytes().to_vec();
        b.extend_from_slice(&rank.to_le_bytes());
        b.extend_from_slice(&world.to_le_bytes());
        frame(1, &b)
    };
    let cases = [
        (hello(99, 1, 2), "protocol version 99, this build speaks 2"),
        (hello(VERSION, 0, 2), "two processes claim RANK=0"),
        (
            hello(VERSION, u64::MAX, 2),
            "claims RANK=18446744073709551615",
        ),
    ];
    for (bytes, expected) in cases {
        let port = free_port();
        let root = spawn_rank(env(0, 2, port), Some(payload(6, 128)), LONG);
        let mut s = connect_retrying(port);
        s.write_all(&bytes).unwrap();
        let e = err_text(root.join().unwrap());
        assert!(e.contains(expected), "{expected}: {e}");
        // The peer is told, in an error frame carrying the same message.
        let mut back = Vec::new();
        s.set_read_timeout(Some(LONG)).unwrap();
        s.read_to_end(&mut back).unwrap();
        assert_eq!(back, frame(4, e.as_bytes()));
    }
}

#[test]
fn a_silent_connection_is_not_a_rank() {
    // It is no rank that arrived: at the timeout rank 0 names rank 1 as missing.
    let port = free_port();
    let root = spawn_rank(
        env(0, 2, port),
        Some(payload(7, 128)),
        Duration::from_millis(300),
    );
    let _s = connect_retrying(port);
    let e = err_text(root.join().unwrap());
    assert!(
        e.contains("rank(s) 1 of WORLD_SIZE=2 never arrived within 0.3 s"),
        "{e}"
    );
}

#[test]
fn strangers_do_not_stop_the_ranks() {
    // A TCP health check (connect, close), one that stays open and silent, and an HTTP
    // client reach rank 0 before rank 1: each is dropped, and rank 1 is admitted at once,
    // not after the silent one's hello wait (5 s) nor the rendezvous timeout.
    let port = free_port();
    let id = payload(8, 128);
    let start = Instant::now();
    let root = spawn_rank(env(0, 2, port), Some(id.clone()), LONG);
    let silent = connect_retrying(port);
    drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    let mut http = TcpStream::connect(("127.0.0.1", port)).unwrap();
    http.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // One that says half a header and closes.
    let mut half = TcpStream::connect(("127.0.0.1", port)).unwrap();
    half.write_all(&frame(1, &[])[..4]).unwrap();
    half.shutdown(Shutdown::Both).unwrap();
    thread::sleep(Duration::from_millis(100));
    let peer = spawn_rank(env(1, 2, port), None, LONG);
    assert_eq!(root.join().unwrap().unwrap(), id);
    assert_eq!(peer.join().unwrap().unwrap(), id);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    drop(silent);
}

#[test]
fn garbage_from_rank_zero_is_an_error() {
    let cases: [(&[u8], &str); 4] = [
        (
            b"HTTP/1.1 400 Bad Request\r\n\r\n",
            "not a dflash rendezvous peer",
        ),
        (
            &[0xff, 0xff, 0xff, 0xff, b'D', b'F', b'R', b'V', 2],
            "more than the 1048576",
        ),
        (&frame(3, &[]), "tag 3 where the payload belongs"),
        (
            &[],
            "closed the connection while rank 1 waited for the payload",
        ),
    ];
    for (bytes, expected) in cases {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let peer = spawn_rank(env(1, 2, port), None, LONG);
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 29];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..9], &frame(1, &[0; 20])[..9]);
        s.write_all(&welcome()).unwrap();
        s.write_all(bytes).unwrap();
        drop(s);
        let e = err_text(peer.join().unwrap());
        assert!(
            e.contains(&format!("bad data from rank 0 at 127.0.0.1:{port}")),
            "{e}"
        );
        assert!(e.contains(expected), "{expected}: {e}");
    }
}

#[test]
fn a_rank_that_reaches_a_stranger_says_so_at_once() {
    // Another service on the port (torchrun's store, a web server) answers the hello with
    // bytes of its own, or hangs up: the rank fails within seconds, not at its timeout.
    let cases: [&[u8]; 2] = [b"HTTP/1.1 400 Bad Request\r\n\r\n", b""];
    for answer in cases {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let start = Instant::now();
        let peer = spawn_rank(env(1, 2, port), None, LONG);
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 29];
        s.read_exact(&mut hello).unwrap();
        s.write_all(answer).unwrap();
        drop(s);
        let e = err_text(peer.join().unwrap());
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        assert!(
            e.starts_with(&format!("rank 1 reached 127.0.0.1:{port}, but ")),
            "{e}"
        );
        assert!(
            e.contains("most likely another service listens there")
                && e.contains("set DFLASH_MASTER_PORT"),
            "{e}"
        );
    }
}

/// Rank `rank` of a world of two as torchrun starts it (its store on `master_port`), with
/// `extra` variables, read as [`LaunchEnv::from_env`] reads the process environment.
fn torchrun_env(rank: usize, master_port: u16, extra: &[(&str, String)]) -> LaunchEnv {
    let vars: HashMap<String, String> = [
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("WORLD_SIZE", "2".to_owned()),
        ("MASTER_ADDR", "127.0.0.1".to_owned()),
        ("MASTER_PORT", master_port.to_string()),
        ("TORCHELASTIC_RUN_ID", "dflash-test".to_owned()),
        ("TORCHELASTIC_USE_AGENT_STORE", "True".to_owned()),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| (k.to_string(), v.clone()))
    .collect();
    LaunchEnv::from_vars(|name| vars.get(name).cloned())
        .unwrap()
        .unwrap()
}

/// Listeners on two neighbouring ports: torchrun's store on `MASTER_PORT`, and whatever may
/// hold the next one.
fn neighbour_listeners() -> (TcpListener, TcpListener) {
    for _ in 0..100 {
        let store = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = store.local_addr().unwrap().port();
        let Some(next) = port.checked_add(1) else {
            continue;
        };
        if let Ok(next) = TcpListener::bind(("127.0.0.1", next)) {
            return (store, next);
        }
    }
    panic!("found no two free neighbouring ports in 100 tries");
}

/// No connection waits on `l`: no rank talked to it.
fn nobody_came(l: &TcpListener) -> bool {
    l.set_nonblocking(true).unwrap();
    matches!(l.accept(), Err(e) if e.kind() == ErrorKind::WouldBlock)
}

/// Both ranks of `envs`: the rendezvous, then the group it starts, then one all-reduce.
fn form_group(envs: [LaunchEnv; 2]) {
    let id = payload(9, 128);
    let handles: Vec<_> = envs
        .into_iter()
        .rev()
        .map(|e| {
            let mine = (e.rank == 0).then(|| id.clone());
            thread::spawn(move || {
                let got = rendezvous(&e, mine.as_deref(), LONG)?;
                let g = ProcessGroup::connect(&e, LONG)?;
                let mut sum = [e.rank as f32 + 1.0];
                g.all_reduce_sum(&mut sum)?;
                Ok::<_, LaunchError>((got, sum[0]))
            })
        })
        .collect();
    for h in handles {
        let (got, sum) = h.join().unwrap().unwrap();
        assert_eq!((got, sum), (id.clone(), 3.0));
    }
}

#[test]
fn under_torchrun_the_group_forms_beside_its_store() {
    // torchrun's agent store holds MASTER_PORT on node 0; every rank moves to MASTER_PORT+1.
    let (store, next) = neighbour_listeners();
    let port = store.local_addr().unwrap().port();
    drop(next);
    let envs = [0, 1].map(|r| torchrun_env(r, port, &[]));
    for e in &envs {
        assert_eq!(e.master_port, port + 1);
        assert_eq!(e.port_origin, PortOrigin::AfterTorchrunStore);
    }
    form_group(envs);
    assert!(nobody_came(&store), "a rank talked to torchrun's store");
}

#[test]
fn dflash_master_port_wins() {
    // MASTER_PORT and the next port are both taken; DFLASH_MASTER_PORT names a free one.
    let (store, next) = neighbour_listeners();
    let port = store.local_addr().unwrap().port();
    let theirs = free_port();
    let extra = [("DFLASH_MASTER_PORT", theirs.to_string())];
    let envs = [0, 1].map(|r| torchrun_env(r, port, &extra));
    for e in &envs {
        assert_eq!(e.master_port, theirs);
        assert_eq!(e.port_origin, PortOrigin::DflashMasterPort);
    }
    form_group(envs);
    assert!(nobody_came(&store) && nobody_came(&next));
    // Without it, rank 0 cannot listen on MASTER_PORT+1, and says what to set.
    let e = err_text(rendezvous(&torchrun_env(0, port, &[]), Some(&[1]), LONG));
    assert!(
        e.starts_with(&format!(
            "rank 0 could not listen on 127.0.0.1:{}",
            port + 1
        )),
        "{e}"
    );
    assert!(
        e.contains("MASTER_PORT+1") && e.contains("torchrun") && e.contains("DFLASH_MASTER_PORT"),
        "{e}"
    );
}

/// Set in the children of `two_processes_agree`; unset, `child_process_entry` does nothing.
const CHILD_SWITCH: &str = "DFLASH_LAUNCH_CHILD";

/// The payload rank 0 of `two_processes_agree` derives from its pid, so the parent (which
/// knows the pid) can check the bytes came from that process.
fn pid_payload(pid: u32) -> Vec<u8> {
    payload(u64::from(pid) ^ 0xD1F1_A5A5, 128)
}

/// A child's side of `two_processes_agree`: the launcher environment, the rendezvous, and the
/// received bytes as hex on stdout.
#[test]
fn child_process_entry() {
    if std::env::var_os(CHILD_SWITCH).is_none() {
        return;
    }
    let env = LaunchEnv::from_env()
        .expect("launcher environment")
        .expect("a multi-process environment");
    let mine = (env.rank == 0).then(|| pid_payload(std::process::id()));
    let got = rendezvous(&env, mine.as_deref(), Duration::from_secs(15)).expect("rendezvous");
    println!("DFLASH_RANK={} DFLASH_PAYLOAD={}", env.rank, hex(&got));
}

/// Kills the children if the test fails before they exit.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn two_processes_agree() {
    let exe = std::env::current_exe().unwrap();
    let port = free_port().to_string();
    let spawn = |rank: &str| {
        Command::new(&exe)
            .args([
                "--exact",
                "child_process_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_SWITCH, "1")
            .env("RANK", rank)
            .env("LOCAL_RANK", rank)
            .env("WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Rank 1 first: it must wait for rank 0 across processes too.
    let mut kids = Children(vec![spawn("1"), spawn("0")]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = [None, None];
    while status.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "children still running after 20 s"
        );
        for (c, s) in kids.0.iter_mut().zip(&mut status) {
            if s.is_none() {
                *s = c.try_wait().unwrap();
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
    let mut printed = Vec::new();
    for (c, s) in kids.0.iter_mut().zip(status) {
        let (mut out, mut err) = (String::new(), String::new());
        c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(s.unwrap().success(), "child failed:\n{out}\n{err}");
        // libtest prints the test's name on the same line, before the child's output.
        let (_, hex) = out
            .lines()
            .find_map(|l| l.split_once("DFLASH_PAYLOAD="))
            .unwrap_or_else(|| panic!("no result line:\n{out}\n{err}"));
        printed.push(hex.trim().to_owned());
    }
    let expected = hex(&pid_payload(kids.0[1].id()));
    assert_eq!(printed[0], printed[1]);
    assert_eq!(printed[1], expected);
}

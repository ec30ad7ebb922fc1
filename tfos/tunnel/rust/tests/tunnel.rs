//! The built binary end to end: two tunnels relay an echo connection (loopback mode, and as root
//! with private namespaces), refuse a client without the secret, answer ErrorReply for a port
//! where nothing listens, drop loopback-mode egress connections of another user, and exit
//! promptly on stdin's EOF or SIGTERM.
//!
//! In loopback mode both tunnels share this host's namespace, so node B cannot hold the address
//! that node A's egress listener binds for it (that is what `local` peers are for). The loopback
//! tests therefore give B another address of the block as its `self_ip` (x.x.n.12) than the
//! address A's peer table names for it (x.x.n.2): the TunnelOpen carries only the port, so the
//! bytes still cross both tunnels.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tfos_tunnel::sys;
use tfos_tunnel::wire::{self, Message};

const SECRET: &str = "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2";
const ECHO_BYTES: usize = 50 * 1000 * 1000;

/// The big transfers run one at a time (2 cores).
static HEAVY: Mutex<()> = Mutex::new(());

fn secret() -> Vec<u8> {
    tfos_tunnel::config::from_hex(SECRET).unwrap()
}

fn is_root() -> bool {
    sys::getuid() == 0
}

/// A private directory for one test's control sockets and logs, removed when dropped.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn tempdir(name: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("tfos-tunnel-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    TempDir(d)
}

struct Node {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
    ready: String,
    ctl: PathBuf,
    log: PathBuf,
}

impl Node {
    fn start(dir: &std::path::Path, name: &str, self_ip: &str, block: &str, netns: &str, secret: &str) -> Node {
        let ctl = dir.join(format!("{name}.sock"));
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_tfos-tunnel"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start tfos-tunnel");
        let mut stdin = child.stdin.take().unwrap();
        let config = format!(
            r#"{{"secret": "{secret}", "self_ip": "{self_ip}", "block": "{block}", "control": "{}", "bind_host": "127.0.0.1", "netns": "{netns}", "future_key": [1]}}"#,
            ctl.display()
        );
        writeln!(stdin, "{config}").unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let ready = line.trim_end().to_string();
        let port =
            ready.strip_prefix("READY ").and_then(|r| r.split(' ').next()).and_then(|p| p.parse().ok()).unwrap_or_else(
                || panic!("{name}: {ready:?}; log: {}", std::fs::read_to_string(&log).unwrap_or_default()),
            );
        Node { child, stdin: Some(stdin), port, ready, ctl, log }
    }

    fn netns(&self) -> bool {
        self.ready.ends_with(" netns")
    }

    /// One control request: (status byte, descriptor, message).
    fn control(&self, line: &str) -> (u8, Option<OwnedFd>, String) {
        let conn = UnixStream::connect(&self.ctl).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (&conn).write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut status = [0u8; 1];
        let (n, fd) = sys::recv_with_fd(conn.as_fd(), &mut status).unwrap();
        assert_eq!(n, 1, "a reply to {line:?}");
        let mut rest = String::new();
        (&conn).read_to_string(&mut rest).unwrap();
        (status[0], fd, rest)
    }

    fn ok(&self, line: &str) -> Option<OwnedFd> {
        let (status, fd, msg) = self.control(line);
        assert_eq!(status, b'Y', "{line:?} -> {msg:?}");
        fd
    }

    /// A TCP connection made by a "TF process" of this node: a socket from CONNECT, connected.
    fn connect(&self, addr: Ipv4Addr, port: u16) -> std::io::Result<TcpStream> {
        let fd = self.ok(&format!("CONNECT 2 1 0 {addr} {port}")).expect("a socket");
        sys::connect_timeout(fd, SocketAddr::from((addr, port)), Duration::from_secs(5))
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Close stdin; the tunnel must exit 0 within a second.
    fn stop(mut self) -> Duration {
        let t = Instant::now();
        drop(self.stdin.take());
        let status = wait_exit(&mut self.child, Duration::from_secs(2));
        assert_eq!(status, Some(0), "exit status; log: {}", self.log_text());
        t.elapsed()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<i32> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// An echo server: every connection gets its bytes back; its EOF is passed on as a half-close.
struct Echo {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

fn echo(listener: TcpListener) -> Echo {
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if conn.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
                let _ = conn.shutdown(Shutdown::Write);
                let _ = conn.read(&mut buf); // until the other side closes
            });
        }
    });
    Echo { port, accepted }
}

fn pattern(n: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Send `ECHO_BYTES` through `conn` while reading them back, half-close, and expect exactly the
/// same bytes then EOF (which proves the half-close went through both tunnels and back). Returns
/// MB/s of payload.
fn echo_through(conn: TcpStream) -> f64 {
    let data = Arc::new(pattern(ECHO_BYTES));
    let start = Instant::now();
    let writer = {
        let mut conn = conn.try_clone().unwrap();
        let data = Arc::clone(&data);
        std::thread::spawn(move || {
            for chunk in data.chunks(1 << 20) {
                conn.write_all(chunk).unwrap();
            }
            conn.shutdown(Shutdown::Write).unwrap();
        })
    };
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut back = Vec::with_capacity(ECHO_BYTES);
    let mut reader = &conn;
    reader.read_to_end(&mut back).expect("the echo, then EOF");
    writer.join().unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(back.len(), data.len(), "echoed length");
    assert!(back == *data, "echoed bytes differ");
    ECHO_BYTES as f64 / 1e6 / secs
}

fn peers_line(addr: &str, ingress: u16) -> String {
    format!(r#"PEERS [["{addr}", "127.0.0.1", {ingress}, false]]"#)
}

#[test]
fn loopback_mode_relays_an_echo_through_two_tunnels() {
    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("loop");
    let a = Node::start(&dir, "a", "127.88.1.1", "127.88", "off", SECRET);
    let b = Node::start(&dir, "b", "127.88.1.12", "127.88", "off", SECRET);
    assert_eq!(a.ready, format!("READY {} loopback netns off", a.port));
    let server = echo(TcpListener::bind("127.88.1.12:0").unwrap());
    assert!(a.ok("PING").is_none());
    assert!(a.ok(&peers_line("127.88.1.2", b.port)).is_none());
    let conn = a.connect(Ipv4Addr::new(127, 88, 1, 2), server.port).expect("connect through A");
    let rate = echo_through(conn);
    println!("loopback mode: {ECHO_BYTES} bytes echoed through two tunnels at {rate:.0} MB/s each way");
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
    // a second connection reuses the egress listener
    let mut conn = a.connect(Ipv4Addr::new(127, 88, 1, 2), server.port).unwrap();
    conn.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    conn.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    assert!(a.stop() < Duration::from_secs(1));
    assert!(b.stop() < Duration::from_secs(1));
    assert!(!dir.join("a.sock").exists() && !dir.join("b.sock").exists(), "control sockets removed");
}

#[test]
fn control_requests_and_errors() {
    let dir = tempdir("control");
    let a = Node::start(&dir, "a", "127.88.2.1", "127.88", "off", SECRET);
    let mode =
        std::fs::metadata(&a.ctl).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777).unwrap();
    assert_eq!(mode, 0o600);
    // SOCKET gives a socket; so does CONNECT to this node's own address
    let fd = a.ok("SOCKET 2 1 0").expect("a socket");
    drop(fd);
    assert!(a.ok("CONNECT 2 1 0 127.88.2.1 7000").is_some());
    let (status, fd, msg) = a.control("CONNECT 2 1 0 127.88.2.9 7000");
    assert_eq!((status, fd.is_none()), (b'N', true));
    assert_eq!(msg, "unknown peer 127.88.2.9");
    for bad in ["", "NOPE", "SOCKET 2", "PEERS [[\"10.0.0.1\", \"h\", 1, false]]", "CONNECT 2 1 0 127.88.2.9 0"] {
        let (status, fd, msg) = a.control(bad);
        assert!(status == b'N' && fd.is_none() && !msg.is_empty() && msg.len() <= 1000, "{bad:?}: {msg:?}");
    }
    let (status, _, msg) = a.control("SOCKET 999 1 0");
    assert_eq!(status, b'N', "{msg}");
    // a request longer than 4096 bytes is refused (the reply may be lost to the reset that
    // closing a socket with unread bytes sends; it must not be a Y)
    let conn = UnixStream::connect(&a.ctl).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = (&conn).write_all(format!("PEERS [{}]\n", " ".repeat(5000)).as_bytes());
    let mut reply = Vec::new();
    let _ = (&conn).read_to_end(&mut reply);
    assert!(reply.is_empty() || reply[0] == b'N', "{reply:?}");
    assert!(a.ok("PING").is_none(), "still serving");
    // a local peer (loopback mode) gets a socket but no egress listener
    a.ok(r#"PEERS [["127.88.2.3", "127.0.0.1", 9, true]]"#);
    let l = TcpListener::bind("127.88.2.3:0").unwrap();
    let port = l.local_addr().unwrap().port();
    assert!(a.ok(&format!("CONNECT 2 1 0 127.88.2.3 {port}")).is_some());
    // a non-local peer whose address:port another process holds (EADDRINUSE): still a socket
    a.ok(r#"PEERS [["127.88.2.3", "127.0.0.1", 9, false]]"#);
    assert!(a.ok(&format!("CONNECT 2 1 0 127.88.2.3 {port}")).is_some());
    // a peer whose tunnel is unreachable: the local connection is reset
    a.ok(r#"PEERS [["127.88.2.4", "127.0.0.1", 1, false]]"#);
    let free = TcpListener::bind("127.88.2.4:0").unwrap().local_addr().unwrap().port();
    // (under load the reset can come before connect() returns: that is the same outcome)
    let r = a.connect(Ipv4Addr::new(127, 88, 2, 4), free).and_then(|mut conn| {
        conn.set_read_timeout(Some(Duration::from_secs(15)))?;
        let mut buf = [0u8; 1];
        conn.read(&mut buf)
    });
    assert!(matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset), "{r:?}");
    assert!(a.log_text().contains(&format!("connection to 127.88.2.4:{free} failed")), "{}", a.log_text());
}

#[test]
fn a_client_without_the_secret_is_refused_before_anything_is_relayed() {
    let dir = tempdir("secret");
    let b = Node::start(&dir, "b", "127.88.3.12", "127.88", "off", SECRET);
    let server = echo(TcpListener::bind("127.88.3.12:0").unwrap());
    let ingress = SocketAddr::from(([127, 0, 0, 1], b.port));
    // the real client handshake with another secret
    let sock = TcpStream::connect(ingress).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = wire::client_handshake(&sock, &[0x42; 32], deadline, "B").err().expect("refused");
    assert!(e.to_string().contains("wrong cluster secret"), "{e}");
    // a forged AUTH followed at once by a TunnelOpen frame in a (forged) record: the tunnel
    // reads nothing past the AUTH and connects nowhere
    let mut sock = TcpStream::connect(ingress).unwrap();
    let mut hello = [0u8; wire::HELLO_LEN];
    sock.read_exact(&mut hello).unwrap();
    let eph = wire::Ephemeral::generate().unwrap();
    let (auth, _) = wire::client_auth(&[0x42; 32], wire::ENCRYPTED, &hello, &[1; 16], Some(&eph), "B").unwrap();
    let mut forged = auth.to_vec();
    forged.extend(
        wire::Sealer::new(&[0; 32], &[0; 12]).seal_to_vec(&Message::TunnelOpen { port: server.port }.frame()).unwrap(),
    );
    sock.write_all(&forged).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    let r = sock.read(&mut buf);
    assert!(matches!(r, Ok(0)) || r.is_err(), "no FINISH: {r:?}");
    // a clear-mode client is refused too
    let mut sock = TcpStream::connect(ingress).unwrap();
    sock.read_exact(&mut hello).unwrap();
    assert_eq!(hello[6], wire::ENCRYPTED);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(server.accepted.load(Ordering::SeqCst), 0, "nothing reached the echo server");
    assert!(b.log_text().contains("refused a tunnel connection"), "{}", b.log_text());
}

#[test]
fn a_tunnel_open_to_a_closed_port_gets_an_error_reply() {
    let dir = tempdir("closed");
    let b = Node::start(&dir, "b", "127.88.4.12", "127.88", "off", SECRET);
    let closed = TcpListener::bind("127.88.4.12:0").unwrap().local_addr().unwrap().port();
    let sock = TcpStream::connect(("127.0.0.1", b.port)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = wire::client_handshake(&sock, &secret(), deadline, "B").unwrap();
    s.writer.send_message(&sock, &Message::TunnelOpen { port: closed }, Some(deadline)).unwrap();
    match s.reader.read_message(&sock, Some(deadline)).unwrap() {
        Message::ErrorReply { message } => {
            assert!(message.contains(&format!("127.88.4.12:{closed}")), "{message}");
        }
        other => panic!("expected ErrorReply, got {other:?}"),
    }
    // then close_notify
    assert!(!s.reader.next_record(&sock, Some(deadline)).unwrap());
    // and a TunnelOpen to a port that listens is acknowledged
    let server = echo(TcpListener::bind("127.88.4.12:0").unwrap());
    let sock = TcpStream::connect(("127.0.0.1", b.port)).unwrap();
    let mut s = wire::client_handshake(&sock, &secret(), deadline, "B").unwrap();
    s.writer.send_message(&sock, &Message::TunnelOpen { port: server.port }, Some(deadline)).unwrap();
    assert_eq!(s.reader.read_message(&sock, Some(deadline)).unwrap(), Message::Ack);
    s.writer.send(&sock, b"hello", Some(deadline)).unwrap();
    let mut got = [0u8; 5];
    s.reader.read_exact(&sock, &mut got, Some(deadline)).unwrap();
    assert_eq!(&got, b"hello");
    // a record that fails its check resets the local side: the echo server sees the end
    let mut bad = s.writer.sealer.seal_to_vec(b"more").unwrap();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    (&sock).write_all(&bad).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let _ = (&sock).read_to_end(&mut rest);
    assert!(rest.is_empty(), "nothing relayed after a bad record");
}

#[test]
fn egress_connections_of_another_user_are_dropped_in_loopback_mode() {
    if !is_root() {
        println!("skipped: needs root to connect as another user");
        return;
    }
    let dir = tempdir("uid");
    let a = Node::start(&dir, "a", "127.88.5.1", "127.88", "off", SECRET);
    let b = Node::start(&dir, "b", "127.88.5.12", "127.88", "off", SECRET);
    let server = echo(TcpListener::bind("127.88.5.12:0").unwrap());
    a.ok(&peers_line("127.88.5.2", b.port));
    // the tunnel's own user gets through (and this makes the egress listener)
    let mut conn = a.connect(Ipv4Addr::new(127, 88, 5, 2), server.port).unwrap();
    conn.write_all(b"x").unwrap();
    conn.read_exact(&mut [0u8; 1]).unwrap();
    // another uid reaches the listener but is dropped
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("exec 3<>/dev/tcp/127.88.5.2/{}; echo hi >&3; timeout 5 cat <&3; echo done", server.port))
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), "done", "{stdout:?} {}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1, "only the tunnel user's connection arrived");
    assert!(a.log_text().contains("not a process of uid 0"), "{}", a.log_text());
}

#[test]
fn private_namespaces_relay_an_echo_and_hide_the_server() {
    if !is_root() {
        println!("skipped: not root");
        return;
    }
    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("netns");
    let a = Node::start(&dir, "a", "127.89.0.1", "127.89", "auto", SECRET);
    let b = Node::start(&dir, "b", "127.89.0.2", "127.89", "auto", SECRET);
    if !a.netns() || !b.netns() {
        println!("skipped: no private namespace here ({:?})", b.ready);
        return;
    }
    // B's "TF server": a socket from B's control socket, bound to B's address in B's namespace
    let fd = b.ok("SOCKET 2 1 0").expect("a socket");
    sys::set_reuseaddr(fd.as_fd()).unwrap();
    let listener = sys::bind_listen(fd, "127.89.0.2:0".parse().unwrap(), 128).unwrap();
    let server = echo(listener);
    // nothing listens there in the host namespace
    let r = TcpStream::connect_timeout(&SocketAddr::from(([127, 89, 0, 2], server.port)), Duration::from_secs(5));
    assert!(matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused), "{r:?}");
    a.ok(&peers_line("127.89.0.2", b.port));
    let conn = a.connect(Ipv4Addr::new(127, 89, 0, 2), server.port).expect("connect through A");
    // A's egress listener is in A's namespace, not the host's
    let r = TcpStream::connect_timeout(&SocketAddr::from(([127, 89, 0, 2], server.port)), Duration::from_secs(5));
    assert!(matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused), "{r:?}");
    let rate = echo_through(conn);
    println!("netns mode: {ECHO_BYTES} bytes echoed through two tunnels at {rate:.0} MB/s each way");
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
    a.stop();
    b.stop();
}

#[test]
fn a_peer_on_this_host_is_reached_straight_in_its_namespace_or_else_through_the_tunnels() {
    if !is_root() {
        println!("skipped: not root");
        return;
    }
    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("direct");
    let a = Node::start(&dir, "a", "127.90.0.1", "127.90", "auto", SECRET);
    let b = Node::start(&dir, "b", "127.90.0.2", "127.90", "auto", SECRET);
    if !a.netns() || !b.netns() {
        println!("skipped: no private namespace here ({:?})", b.ready);
        return;
    }
    let fd = b.ok("SOCKET 2 1 0").expect("a socket");
    sys::set_reuseaddr(fd.as_fd()).unwrap();
    let server = echo(sys::bind_listen(fd, "127.90.0.2:0".parse().unwrap(), 128).unwrap());
    let addr = Ipv4Addr::new(127, 90, 0, 2);
    // B's tunnel named with a port where nothing listens: only the straight path can reach B
    a.ok(&format!(r#"PEERS [["127.90.0.2", "127.0.0.1", 1, true, "{}"]]"#, b.ctl.display()));
    let rate = echo_through(a.connect(addr, server.port).expect("connect straight into B's namespace"));
    println!("same host: {ECHO_BYTES} bytes echoed straight into B's namespace at {rate:.0} MB/s each way");
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
    assert!(a.log_text().contains("node 127.90.0.2 is on this host"), "{}", a.log_text());
    // a control socket that is not there: through the tunnels, as between hosts
    a.ok(&format!(r#"PEERS [["127.90.0.2", "127.0.0.1", {}, true, "{}/gone.sock"]]"#, b.port, dir.display()));
    echo_through(a.connect(addr, server.port).expect("connect through the tunnels"));
    assert_eq!(server.accepted.load(Ordering::SeqCst), 2);
    assert!(a.log_text().contains("its namespace is out of reach"), "{}", a.log_text());
    // a control socket served by another user (uid 65534) that would hand out a socket: refused
    let open_dir = std::env::temp_dir().join(format!("tfos-tunnel-test-foreign-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&open_dir);
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let foreign = open_dir.join("foreign.sock");
    let mut stranger = Command::new("python3")
        .arg("-c")
        .arg(
            "import socket, sys\n\
             l = socket.socket(socket.AF_UNIX); l.bind(sys.argv[1]); l.listen(4); print('up', flush=True)\n\
             while True:\n    c, _ = l.accept()\n    try:\n        c.recv(100)\n        \
             s = socket.socket()\n        socket.send_fds(c, [b'Y'], [s.fileno()])\n    except OSError:\n        pass\n    \
             c.close()\n",
        )
        .arg(&foreign)
        .uid(65534)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut up = String::new();
    BufReader::new(stranger.stdout.take().unwrap()).read_line(&mut up).unwrap();
    assert_eq!(up.trim(), "up");
    a.ok(&format!(r#"PEERS [["127.90.0.2", "127.0.0.1", {}, true, "{}"]]"#, b.port, foreign.display()));
    echo_through(a.connect(addr, server.port).expect("connect through the tunnels"));
    assert_eq!(server.accepted.load(Ordering::SeqCst), 3);
    let _ = stranger.kill();
    let _ = stranger.wait();
    let _ = std::fs::remove_dir_all(&open_dir);
    assert!(a.log_text().contains("is served by uid 65534"), "{}", a.log_text());
    a.stop();
    b.stop();
}

/// The namespace helper's pid(s): children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // pid (comm) state ppid ...
        let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
        if after.split_whitespace().nth(1).and_then(|s| s.parse::<u32>().ok()) == Some(pid) {
            out.push(p);
        }
    }
    out
}

fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').map(|x| x.1.trim_start().starts_with('Z')).unwrap_or(true),
    }
}

#[test]
fn sigterm_and_sigint_end_the_tunnel_and_its_helper_promptly() {
    let dir = tempdir("signals");
    for (i, sig) in [libc::SIGTERM, libc::SIGINT].into_iter().enumerate() {
        let mut a = Node::start(&dir, &format!("s{i}"), "127.88.6.1", "127.88", "auto", SECRET);
        let helpers = if a.netns() { children(a.child.id()) } else { vec![] };
        if a.netns() {
            assert_eq!(helpers.len(), 1, "one namespace helper");
        }
        let t = Instant::now();
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(a.child.id() as i32, sig) };
        assert_eq!(wait_exit(&mut a.child, Duration::from_secs(2)), Some(0), "log: {}", a.log_text());
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(!a.ctl.exists(), "control socket removed");
        let end = Instant::now() + Duration::from_secs(2);
        while !helpers.iter().all(|p| gone(*p)) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(helpers.iter().all(|p| gone(*p)), "the helper ended with the tunnel");
    }
}

#[test]
fn a_bad_config_fails_with_a_reason() {
    let dir = tempdir("bad");
    for (input, needle) in [
        ("{\"secret\": \"zz\"}\n", "FAILED config: secret is not hex"),
        ("\n", "FAILED config is not JSON"),
        ("", "FAILED no config on stdin"),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tfos-tunnel"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.starts_with(needle) && stdout.lines().count() == 1, "{stdout:?}");
        assert_ne!(out.status.code(), Some(0));
    }
    // the control path is taken by something that is not a socket
    std::fs::write(dir.join("taken"), b"x").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tfos-tunnel"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let config = format!(
        r#"{{"secret": "{SECRET}", "self_ip": "127.88.7.1", "block": "127.88", "control": "{}", "netns": "off"}}"#,
        dir.join("taken").display()
    );
    writeln!(child.stdin.take().unwrap(), "{config}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("FAILED "), "{:?}", out);
}

#[test]
fn a_reset_on_one_end_resets_the_other() {
    let dir = tempdir("reset");
    let a = Node::start(&dir, "a", "127.88.8.1", "127.88", "off", SECRET);
    let b = Node::start(&dir, "b", "127.88.8.12", "127.88", "off", SECRET);
    let listener = TcpListener::bind("127.88.8.12:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).unwrap();
        sys::reset(conn); // the "TF server" aborts its connection
    });
    a.ok(&peers_line("127.88.8.2", b.port));
    let mut conn = a.connect(Ipv4Addr::new(127, 88, 8, 2), port).unwrap();
    conn.write_all(b"hello").unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = conn.read(&mut [0u8; 16]);
    assert!(matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset), "{r:?}");
}

#[test]
fn auto_falls_back_to_loopback_mode_when_the_kernel_refuses_a_namespace() {
    // A user namespace whose limit of network namespaces is 0: unshare(CLONE_NEWNET) fails there.
    let dir = tempdir("fallback");
    let ctl = dir.join("f.sock");
    let script = format!("echo 0 > /proc/sys/user/max_net_namespaces && exec '{}'", env!("CARGO_BIN_EXE_tfos-tunnel"));
    let Ok(mut child) = Command::new("unshare")
        .args(["-U", "-r", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        println!("skipped: no unshare command");
        return;
    };
    let config = format!(
        r#"{{"secret": "{SECRET}", "self_ip": "127.88.9.1", "block": "127.88", "control": "{}", "netns": "auto"}}"#,
        ctl.display()
    );
    let mut stdin = child.stdin.take().unwrap();
    let _ = writeln!(stdin, "{config}");
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    drop(stdin);
    let status = wait_exit(&mut child, Duration::from_secs(2));
    let _ = child.kill();
    if !line.starts_with("READY ") {
        println!("skipped: cannot make a limited user namespace here");
        return;
    }
    assert!(line.trim_end().ends_with(" loopback unshare ENOSPC"), "{line:?}");
    assert_eq!(status, Some(0));
}

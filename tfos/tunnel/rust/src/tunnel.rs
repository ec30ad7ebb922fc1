//! The tunnel process: config on stdin, READY on stdout, the control socket, egress listeners
//! (in the private namespace, one per peer address and port asked for), the ingress listener
//! (host namespace), and the exit on stdin's EOF or SIGTERM/SIGINT.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::config::{self, Config, NetnsMode, PeerTable, Request};
use crate::log::{self, Throttle};
use crate::netns::{self, Sockets};
use crate::procnet;
use crate::relay;
use crate::sys;
use crate::wire::{self, Message, Session};

/// Connections relayed at once, per direction (ingress, egress); beyond, new ones are closed.
pub const MAX_CONNECTIONS: usize = 1024;
pub const BACKLOG: i32 = 128;
/// Connect + handshake + TunnelOpen/Ack, each way.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
pub const CONTROL_DEADLINE: Duration = Duration::from_secs(5);
pub const MAX_REQUEST: usize = 4096;
pub const MAX_ERROR: usize = 1000;

/// Outbound connections that failed, and ingress targets where nothing listens.
static DIAL: Throttle = Throttle::new(Duration::from_secs(1));
/// The control socket's path, removed at exit.
static CONTROL_PATH: OnceLock<PathBuf> = OnceLock::new();

/// One node's tunnel.
pub struct Tunnel {
    cfg: Config,
    sockets: Sockets,
    uid: u32,
    peers: RwLock<PeerTable>,
    egress: Mutex<HashSet<(Ipv4Addr, u16)>>,
    /// How the last connection to each same-host peer went (logged when it changes).
    neighbours: Mutex<HashMap<Ipv4Addr, String>>,
    ingress_live: Arc<AtomicUsize>,
    egress_live: Arc<AtomicUsize>,
}

/// A place among the connections relayed at once; given back on drop.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(counter: &Arc<AtomicUsize>) -> Option<Slot> {
        if counter.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(Arc::clone(counter)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Start a thread; false (logged) if the system refuses one (what `f` holds is dropped).
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> bool {
    match std::thread::Builder::new().name(name.into()).stack_size(relay::STACK).spawn(f) {
        Ok(_) => true,
        Err(e) => {
            log::line(format_args!("cannot start a {name} thread: {e}"));
            false
        }
    }
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

impl Tunnel {
    fn private(&self) -> bool {
        self.sockets.is_private()
    }

    // ------------------------------------------------------------------ control socket

    fn serve_control(self: Arc<Self>, listener: UnixListener) {
        loop {
            match listener.accept() {
                Ok((conn, _)) => {
                    let t = Arc::clone(&self);
                    spawn("control", move || t.control_conn(conn));
                }
                Err(e) => {
                    log::ACCEPT.log(format_args!("control socket accept failed: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn control_conn(self: &Arc<Self>, conn: UnixStream) {
        let reply = read_request(&conn).and_then(|line| {
            let req = config::parse_request(&line, self.cfg.block, self.cfg.self_ip)?;
            self.handle(req)
        });
        let _ = conn.set_write_timeout(Some(CONTROL_DEADLINE));
        let sent = match reply {
            Ok(Some(fd)) => sys::send_with_fd(conn.as_fd(), b"Y", Some(fd.as_fd())).map(|_| ()),
            Ok(None) => (&conn).write_all(b"Y"),
            Err(msg) => {
                let mut cut = msg.len().min(MAX_ERROR);
                while !msg.is_char_boundary(cut) {
                    cut -= 1;
                }
                let mut out = Vec::with_capacity(cut + 1);
                out.push(b'N');
                out.extend_from_slice(&msg.as_bytes()[..cut]);
                (&conn).write_all(&out)
            }
        };
        if let Err(e) = sent {
            log::line(format_args!("control socket: cannot reply: {e}"));
        }
    }

    fn handle(self: &Arc<Self>, req: Request) -> Result<Option<OwnedFd>, String> {
        match req {
            Request::Ping => Ok(None),
            Request::Peers(entries) => {
                self.peers.write().unwrap_or_else(|e| e.into_inner()).update(entries);
                Ok(None)
            }
            Request::Socket { domain, ty, protocol } => self.private_socket(domain, ty, protocol).map(Some),
            Request::Connect { domain, ty, protocol, addr, port } => {
                if addr != self.cfg.self_ip {
                    let peer = self.peers.read().unwrap_or_else(|e| e.into_inner()).get(addr).cloned();
                    let peer = peer.ok_or_else(|| format!("unknown peer {addr}"))?;
                    if let (true, Some(control)) = (self.private(), &peer.control) {
                        if let Some(fd) = self.straight_to(addr, control, domain, ty, protocol) {
                            return Ok(Some(fd));
                        }
                    }
                    // in loopback mode a peer on this host holds its own address in the shared namespace
                    if self.private() || !peer.local {
                        self.ensure_egress(addr, port)?;
                    }
                }
                self.private_socket(domain, ty, protocol).map(Some)
            }
        }
    }

    /// For a node on this host: a socket in its namespace, so the connection needs no tunnel; None
    /// (the tunnels then carry it) when its namespace is out of reach. Logs when that changes.
    fn straight_to(&self, addr: Ipv4Addr, control: &Path, domain: i32, ty: i32, protocol: i32) -> Option<OwnedFd> {
        let got = self.neighbour_socket(control, domain, ty, protocol);
        let outcome = match &got {
            Ok(_) => format!(
                "node {addr} is on this host: connections to it go straight into its namespace, not through the tunnels"
            ),
            Err(e) => format!(
                "node {addr} is on this host, but its namespace is out of reach ({e}): connections to it go \
                 through the tunnels"
            ),
        };
        let mut last = self.neighbours.lock().unwrap_or_else(|e| e.into_inner());
        if last.get(&addr) != Some(&outcome) {
            log::line(&outcome);
            last.insert(addr, outcome);
        }
        got.ok()
    }

    /// A socket in the private namespace of a node on this host, from its tunnel's control socket
    /// (served by a process of this user: checked), for a connection that then needs no tunnel.
    fn neighbour_socket(&self, control: &Path, domain: i32, ty: i32, protocol: i32) -> Result<OwnedFd, String> {
        let conn = sys::unix_connect_timeout(control, CONTROL_DEADLINE)
            .map_err(|e| format!("cannot connect to {}: {e}", control.display()))?;
        match sys::peer_uid(conn.as_fd()) {
            Ok(uid) if uid == self.uid => {}
            Ok(uid) => return Err(format!("{} is served by uid {uid}, not {}", control.display(), self.uid)),
            Err(e) => return Err(format!("cannot tell who serves {}: {e}", control.display())),
        }
        let _ = conn.set_read_timeout(Some(CONTROL_DEADLINE));
        let _ = conn.set_write_timeout(Some(CONTROL_DEADLINE));
        (&conn)
            .write_all(format!("SOCKET {domain} {ty} {protocol}\n").as_bytes())
            .map_err(|e| format!("cannot ask {}: {e}", control.display()))?;
        let mut reply = [0u8; 1 + MAX_ERROR];
        let (n, fd) = sys::recv_with_fd(conn.as_fd(), &mut reply)
            .map_err(|e| format!("no answer from {}: {e}", control.display()))?;
        let fd = match (n, reply[0], fd) {
            (1, b'Y', Some(fd)) => fd,
            (0, _, _) => return Err(format!("{} closed without an answer", control.display())),
            (_, b'N', _) => return Err(String::from_utf8_lossy(&reply[1..n]).into_owned()),
            _ => return Err(format!("a malformed answer from {}", control.display())),
        };
        let want = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
        match sys::socket_kind(fd.as_fd()) {
            Ok((d, t)) if d == domain && t == want => Ok(fd),
            Ok((d, t)) => Err(format!("got a socket of domain {d} and type {t}, not {domain} and {want}")),
            Err(e) => Err(format!("got something that is not a socket ({e})")),
        }
    }

    fn private_socket(&self, domain: i32, ty: i32, protocol: i32) -> Result<OwnedFd, String> {
        self.sockets
            .socket(domain, ty, protocol)
            .map_err(|e| format!("cannot make a socket ({domain}, {ty}, {protocol}): {e}"))
    }

    /// The egress listener for (addr, port) in the private namespace, made on first use.
    fn ensure_egress(self: &Arc<Self>, addr: Ipv4Addr, port: u16) -> Result<(), String> {
        let mut live = self.egress.lock().unwrap_or_else(|e| e.into_inner());
        if live.contains(&(addr, port)) {
            return Ok(());
        }
        let at = SocketAddr::new(IpAddr::V4(addr), port);
        let made = self.sockets.socket(libc::AF_INET, libc::SOCK_STREAM, 0).and_then(|fd| {
            sys::set_reuseaddr(fd.as_fd())?;
            sys::bind_listen(fd, at, BACKLOG)
        });
        let listener = match made {
            Ok(l) => l,
            // loopback mode: another node of the cluster on this host already serves it
            Err(e) if !self.private() && e.raw_os_error() == Some(libc::EADDRINUSE) => return Ok(()),
            Err(e) => return Err(format!("cannot listen at {at} for the tunnel to node {addr}: {e}")),
        };
        let t = Arc::clone(self);
        if !spawn("egress", move || t.serve_egress(listener, addr, port)) {
            return Err(format!("cannot start the egress listener for {at}"));
        }
        live.insert((addr, port));
        Ok(())
    }

    // ------------------------------------------------------------------ egress

    fn serve_egress(self: Arc<Self>, listener: TcpListener, addr: Ipv4Addr, port: u16) {
        loop {
            match listener.accept() {
                Ok((local, client)) => {
                    let Some(slot) = Slot::take(&self.egress_live) else {
                        log::RESET.log(format_args!(
                            "{MAX_CONNECTIONS} egress connections at once: one to {addr}:{port} closed"
                        ));
                        continue;
                    };
                    let t = Arc::clone(&self);
                    spawn("egress-conn", move || {
                        let _slot = slot;
                        t.egress_conn(local, client, addr, port)
                    });
                }
                Err(e) => {
                    log::ACCEPT.log(format_args!("egress listener {addr}:{port}: accept failed: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Whether a loopback-mode egress connection comes from a process of the tunnel's own user.
    fn own_user(&self, local: &TcpStream, client: SocketAddr) -> bool {
        match (client, local.local_addr()) {
            (SocketAddr::V4(c), Ok(SocketAddr::V4(s))) => procnet::client_uid(c, s) == Some(self.uid),
            _ => false,
        }
    }

    fn egress_conn(&self, local: TcpStream, client: SocketAddr, addr: Ipv4Addr, port: u16) {
        if !self.private() && !self.own_user(&local, client) {
            log::FOREIGN.log(format_args!(
                "dropped a connection to {addr}:{port} from {client}: not a process of uid {}",
                self.uid
            ));
            return;
        }
        let _ = local.set_nodelay(true);
        match self.open_tunnel(addr, port) {
            Ok((tunnel, session)) => relay::run(local, tunnel, session, format!("connection to {addr}:{port}")),
            Err(e) => {
                DIAL.log(format_args!("connection to {addr}:{port} failed: {e}"));
                sys::reset(local);
            }
        }
    }

    /// Connect to the ingress of the node at `addr`, authenticate, and open `port` there.
    fn open_tunnel(&self, addr: Ipv4Addr, port: u16) -> Result<(TcpStream, Session), String> {
        let peer = self.peers.read().unwrap_or_else(|e| e.into_inner()).get(addr).cloned();
        let peer = peer.ok_or_else(|| format!("unknown peer {addr}"))?;
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        let desc = format!("the tunnel of node {addr} at {}:{}", peer.host, peer.port);
        let targets =
            (peer.host.as_str(), peer.port).to_socket_addrs().map_err(|e| format!("cannot resolve {desc}: {e}"))?;
        let mut last = io::Error::other("no address");
        let mut sock = None;
        for target in targets {
            if left(deadline).is_zero() {
                break;
            }
            match TcpStream::connect_timeout(&target, left(deadline)) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let sock = sock.ok_or_else(|| format!("cannot connect to {desc}: {last}"))?;
        let _ = sock.set_nodelay(true);
        let fail = |e: wire::Error| format!("{desc}: {e}");
        let mut session = wire::client_handshake(&sock, &self.cfg.secret, deadline, &desc).map_err(fail)?;
        session.writer.send_message(&sock, &Message::TunnelOpen { port }, Some(deadline)).map_err(fail)?;
        match session.reader.read_message(&sock, Some(deadline)).map_err(fail)? {
            Message::Ack => {}
            Message::ErrorReply { message } => return Err(format!("{desc} refused port {port}: {message}")),
            other => return Err(format!("{desc} answered {other:?} to TunnelOpen")),
        }
        sock.set_read_timeout(None).and_then(|_| sock.set_write_timeout(None)).map_err(|e| e.to_string())?;
        Ok((sock, session))
    }

    // ------------------------------------------------------------------ ingress

    fn serve_ingress(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept() {
                Ok((sock, peer)) => {
                    let Some(slot) = Slot::take(&self.ingress_live) else {
                        log::REFUSED
                            .log(format_args!("{MAX_CONNECTIONS} tunnel connections at once: one from {peer} closed"));
                        continue;
                    };
                    let t = Arc::clone(&self);
                    spawn("ingress-conn", move || {
                        let _slot = slot;
                        t.ingress_conn(sock, peer)
                    });
                }
                Err(e) => {
                    log::ACCEPT.log(format_args!("ingress accept failed: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn ingress_conn(&self, sock: TcpStream, peer: SocketAddr) {
        let _ = sock.set_nodelay(true);
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        let mut session = match wire::server_handshake(&sock, &self.cfg.secret, deadline, &peer.to_string()) {
            Ok(s) => s,
            Err(e) => return log::REFUSED.log(format_args!("refused a tunnel connection from {peer}: {e}")),
        };
        let port = match session.reader.read_message(&sock, Some(deadline)) {
            Ok(Message::TunnelOpen { port }) => port,
            Ok(other) => {
                return log::REFUSED.log(format_args!("tunnel connection from {peer} sent {other:?}, not TunnelOpen"))
            }
            Err(e) => return log::REFUSED.log(format_args!("tunnel connection from {peer}: {e}")),
        };
        let target = SocketAddr::new(IpAddr::V4(self.cfg.self_ip), port);
        let local = self
            .sockets
            .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
            .and_then(|fd| sys::connect_timeout(fd, target, left(deadline).max(Duration::from_millis(1))));
        let local = match local {
            Ok(l) => l,
            Err(e) => {
                let message = format!("nothing accepts connections at {target} on node {}: {e}", self.cfg.self_ip);
                DIAL.log(format_args!("tunnel connection from {peer}: {message}"));
                let _ = session.writer.send_message(&sock, &Message::ErrorReply { message }, Some(deadline));
                let _ = session.writer.close_notify(&sock, Some(deadline));
                return;
            }
        };
        let _ = local.set_nodelay(true);
        let acked = session
            .writer
            .send_message(&sock, &Message::Ack, Some(deadline))
            .and_then(|_| Ok(sock.set_read_timeout(None).and_then(|_| sock.set_write_timeout(None))?));
        if let Err(e) = acked {
            log::REFUSED.log(format_args!("tunnel connection from {peer}: {e}"));
            sys::reset(local);
            return;
        }
        relay::run(local, sock, session, format!("tunnel connection from {peer} to port {port}"));
    }
}

/// Read one request line (at most [`MAX_REQUEST`] bytes with its newline) within
/// [`CONTROL_DEADLINE`].
fn read_request(conn: &UnixStream) -> Result<String, String> {
    let deadline = Instant::now() + CONTROL_DEADLINE;
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut got = 0;
    loop {
        if let Some(end) = buf[..got].iter().position(|b| *b == b'\n') {
            return String::from_utf8(buf[..end].to_vec()).map_err(|_| "the request is not UTF-8".to_string());
        }
        if got == MAX_REQUEST {
            return Err(format!("the request is longer than {MAX_REQUEST} bytes"));
        }
        let wait = left(deadline);
        if wait.is_zero() {
            return Err("no whole request line within 5 s".into());
        }
        conn.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
        match (&*conn).read(&mut buf[got..]) {
            Ok(0) => return Err("the request ended without a newline".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err("no whole request line within 5 s".into())
            }
            Err(e) => return Err(format!("reading the request: {e}")),
        }
    }
}

/// End the process now (exit 0), removing the control socket.
fn exit_clean(why: &str) -> ! {
    log::line(format_args!("exiting: {why}"));
    if let Some(p) = CONTROL_PATH.get() {
        let _ = std::fs::remove_file(p);
    }
    // SAFETY: _exit ends the process at once; nothing is left to flush (stdout was flushed after
    // READY, stderr is unbuffered), and unlike exit() it is safe if two threads get here.
    unsafe { libc::_exit(0) }
}

fn failed(reason: &str) -> i32 {
    let reason = reason.replace(['\n', '\r'], " ");
    log::line(format_args!("failed: {reason}"));
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "FAILED {reason}");
    let _ = out.flush();
    1
}

fn bind_ingress(host: &str) -> Result<TcpListener, String> {
    let addr = (host, 0)
        .to_socket_addrs()
        .map_err(|e| format!("bind_host {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("bind_host {host} has no address"))?;
    sys::tcp_listen(addr, BACKLOG).map_err(|e| format!("cannot listen at {addr}: {e}"))
}

fn bind_control(path: &Path) -> Result<UnixListener, String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove the old control socket {}: {e}", path.display()))?,
        Ok(_) => return Err(format!("{} exists and is not a socket", path.display())),
        Err(_) => {}
    }
    let listener =
        UnixListener::bind(path).map_err(|e| format!("cannot bind the control socket {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot chmod the control socket {}: {e}", path.display()))?;
    Ok(listener)
}

/// The process: returns its exit code when it fails to start; otherwise it serves until stdin's
/// EOF or SIGTERM/SIGINT and exits 0 from there.
pub fn run() -> i32 {
    let _ = sys::set_parent_death_signal(libc::SIGTERM);
    sys::set_umask(0o077);
    let mut line = String::new();
    match io::stdin().read_line(&mut line) {
        Ok(0) => return failed("no config on stdin"),
        Ok(_) => {}
        Err(e) => return failed(&format!("cannot read the config: {e}")),
    }
    let cfg = match config::parse_config(&line) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    // the namespace helper is forked while this process has one thread
    let (sockets, mode) = match cfg.netns {
        NetnsMode::Off => (Sockets::Host, "loopback netns off".to_string()),
        NetnsMode::Auto => match netns::start() {
            Ok(s) => (s, "netns".to_string()),
            Err(why) => (Sockets::Host, format!("loopback {why}")),
        },
    };
    let signals = sys::block_term_signals();
    let ingress = match bind_ingress(&cfg.bind_host) {
        Ok(l) => l,
        Err(e) => return failed(&e),
    };
    let port = match ingress.local_addr() {
        Ok(a) => a.port(),
        Err(e) => return failed(&format!("ingress address: {e}")),
    };
    let control = match bind_control(&cfg.control) {
        Ok(l) => l,
        Err(e) => return failed(&e),
    };
    let _ = CONTROL_PATH.set(cfg.control.clone());
    let tunnel = Arc::new(Tunnel {
        cfg,
        sockets,
        uid: sys::getuid(),
        peers: RwLock::new(PeerTable::default()),
        egress: Mutex::new(HashSet::new()),
        neighbours: Mutex::new(HashMap::new()),
        ingress_live: Arc::new(AtomicUsize::new(0)),
        egress_live: Arc::new(AtomicUsize::new(0)),
    });
    let t = Arc::clone(&tunnel);
    let t2 = Arc::clone(&tunnel);
    if !spawn("ingress", move || t.serve_ingress(ingress))
        || !spawn("control", move || t2.serve_control(control))
        || !spawn("stdin", watch_stdin)
    {
        let code = failed("cannot start threads");
        if let Some(p) = CONTROL_PATH.get() {
            let _ = std::fs::remove_file(p);
        }
        return code;
    }
    log::line(format_args!("ingress on port {port}, {mode}, node {}", tunnel.cfg.self_ip));
    {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "READY {port} {mode}");
        let _ = out.flush();
    }
    let sig = sys::wait_signal(&signals);
    exit_clean(if sig == libc::SIGINT { "SIGINT" } else { "SIGTERM" });
}

/// Exit when stdin reaches EOF: the parent went away.
fn watch_stdin() {
    let mut buf = [0u8; 1024];
    let stdin = io::stdin();
    loop {
        match stdin.lock().read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    exit_clean("stdin closed");
}

//! The node's private network namespace: a forked helper process that unshares a network
//! namespace (and a user namespace when not root), brings its `lo` up, then makes sockets in it
//! on request and passes them back over a socket pair. A socket keeps the namespace it was made
//! in, so the tunnel (in the host namespace) can bind, connect and relay with sockets of both.
//!
//! When the kernel refuses the namespace, the tunnel runs in loopback mode: its "private"
//! sockets are made in the host namespace.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

use crate::sys;

/// Where the node's private sockets come from.
pub enum Sockets {
    /// From the namespace helper (the socket pair's parent end; one request at a time).
    Private(Mutex<OwnedFd>),
    /// Made by the tunnel itself, in the host namespace (loopback mode).
    Host,
}

impl Sockets {
    pub fn is_private(&self) -> bool {
        matches!(self, Sockets::Private(_))
    }

    /// A new socket in the node's private namespace.
    pub fn socket(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
        let helper = match self {
            Sockets::Host => return sys::new_socket(domain, ty, protocol),
            Sockets::Private(h) => h.lock().unwrap_or_else(|e| e.into_inner()),
        };
        let mut req = [0u8; 12];
        req[0..4].copy_from_slice(&domain.to_ne_bytes());
        req[4..8].copy_from_slice(&ty.to_ne_bytes());
        req[8..12].copy_from_slice(&protocol.to_ne_bytes());
        sys::send_with_fd(helper.as_fd(), &req, None)?;
        let mut reply = [0u8; 8];
        let (n, fd) = sys::recv_with_fd(helper.as_fd(), &mut reply)?;
        match (n, reply[0], fd) {
            (0, _, _) => Err(io::Error::other("the namespace helper is gone")),
            (_, 0, Some(fd)) => Ok(fd),
            (5.., 1, _) => {
                Err(io::Error::from_raw_os_error(i32::from_ne_bytes([reply[1], reply[2], reply[3], reply[4]])))
            }
            _ => Err(io::Error::other("the namespace helper sent a malformed reply")),
        }
    }
}

/// Fork the namespace helper. Must run before any thread exists (the child only makes system
/// calls, but fork() of a threaded process would copy locks held by other threads). Returns the
/// helper's socket, or why there is no private namespace (a few words, for the READY line).
pub fn start() -> Result<Sockets, String> {
    let (parent_end, child_end) =
        sys::socketpair(libc::SOCK_SEQPACKET).map_err(|e| format!("socketpair {}", sys::errno_name(&e)))?;
    // SAFETY: getpid cannot fail.
    let parent_pid = unsafe { libc::getpid() };
    // SAFETY: fork() in a process that has a single thread (see above); the child runs
    // `helper_main`, which never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork {}", sys::errno_name(&io::Error::last_os_error())));
    }
    if pid == 0 {
        drop(parent_end);
        helper_main(child_end, parent_pid);
    }
    drop(child_end);
    let mut status = [0u8; 256];
    let ready = sys::poll_one(parent_end.as_fd(), libc::POLLIN, Some(Duration::from_secs(10))).unwrap_or(0);
    let n =
        if ready == 0 { 0 } else { sys::recv_with_fd(parent_end.as_fd(), &mut status).map(|(n, _)| n).unwrap_or(0) };
    if n >= 1 && status[0] == b'Y' {
        return Ok(Sockets::Private(Mutex::new(parent_end)));
    }
    let why = if n == 0 {
        // SAFETY: kill/waitpid on our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        "namespace helper did not start".to_string()
    } else {
        String::from_utf8_lossy(&status[1..n]).into_owned()
    };
    // SAFETY: reap our own child, which exits after reporting a failure.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    Err(why)
}

fn report(sock: &OwnedFd, msg: &[u8]) {
    let _ = sys::send_with_fd(sock.as_fd(), msg, None);
}

fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the forked child without running the parent's atexit handlers.
    unsafe { libc::_exit(code) }
}

/// The forked helper: set up the namespace, then serve socket requests until the parent closes
/// its end (or dies: PR_SET_PDEATHSIG).
fn helper_main(sock: OwnedFd, parent_pid: libc::pid_t) -> ! {
    if sys::set_parent_death_signal(libc::SIGKILL).is_err() {
        exit_now(1);
    }
    // SAFETY: getppid cannot fail.
    if unsafe { libc::getppid() } != parent_pid {
        exit_now(0); // the parent died before the death signal was armed
    }
    quiet_stdio();
    if let Err(why) = enter_namespace() {
        report(&sock, format!("N{why}").as_bytes());
        exit_now(0);
    }
    report(&sock, b"Y");
    let mut req = [0u8; 12];
    loop {
        let n = match sys::recv_with_fd(sock.as_fd(), &mut req) {
            Ok((n, _)) => n,
            Err(_) => exit_now(0),
        };
        if n == 0 {
            exit_now(0); // the tunnel closed its end
        }
        let made = if n == 12 {
            let int = |i: usize| i32::from_ne_bytes([req[i], req[i + 1], req[i + 2], req[i + 3]]);
            sys::new_socket(int(0), int(4), int(8))
        } else {
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        };
        let sent = match made {
            Ok(fd) => sys::send_with_fd(sock.as_fd(), &[0], Some(fd.as_fd())),
            Err(e) => {
                let mut reply = [1u8; 5];
                reply[1..5].copy_from_slice(&e.raw_os_error().unwrap_or(libc::EIO).to_ne_bytes());
                sys::send_with_fd(sock.as_fd(), &reply, None)
            }
        };
        if sent.is_err() {
            exit_now(0);
        }
    }
}

/// The helper keeps stderr only: stdin and stdout are the tunnel's conversation with its parent.
fn quiet_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        // SAFETY: dup2 of a descriptor we own onto 0 and 1.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
}

fn enter_namespace() -> Result<(), String> {
    // SAFETY: these id getters cannot fail.
    let (uid, gid, euid) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
    let flags = if euid == 0 { libc::CLONE_NEWNET } else { libc::CLONE_NEWUSER | libc::CLONE_NEWNET };
    // SAFETY: unshare() takes flags; it changes only this (single-threaded) process.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(format!("unshare {}", sys::errno_name(&io::Error::last_os_error())));
    }
    if euid != 0 {
        let write = |path: &str, text: String| {
            std::fs::write(path, text)
                .map_err(|e| format!("{} {}", path.trim_start_matches("/proc/self/"), sys::errno_name(&e)))
        };
        write("/proc/self/setgroups", "deny".into())?;
        write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    loopback_up().map_err(|e| format!("lo up {}", sys::errno_name(&e)))
}

/// `ip link set lo up`: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP.
fn loopback_up() -> io::Result<()> {
    let fd = sys::new_socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    // SAFETY: ifreq is plain data; zeroed is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the ifreq we pass.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after SIOCGIFFLAGS the union holds the flags.
    unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the ifreq we pass.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

//! The few system calls std does not offer: descriptor passing, raw socket creation, bind/listen
//! and connect on a descriptor made elsewhere (in the private namespace), SO_LINGER, poll with a
//! wake-up descriptor, signal masks. Every `unsafe` block is one libc call (or the pointer work
//! around a control message) on values owned here.

use std::io;
use std::mem;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// A new socket (close-on-exec for this process's descriptor; the flags in `ty` pass through).
pub fn new_socket(domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket() takes plain integers; a non-negative result is a new descriptor we own.
    let fd = cvt(unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, protocol) })?;
    // SAFETY: fd was just returned by socket() and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A connected pair of unix sockets of type `ty` (close-on-exec).
pub fn socketpair(ty: i32) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds is a valid array of two ints for the kernel to fill.
    cvt(unsafe { libc::socketpair(libc::AF_UNIX, ty | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn setsockopt<T>(fd: BorrowedFd<'_>, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: value points to a live T of the size we pass.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            value as *const T as *const libc::c_void,
            mem::size_of::<T>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

pub fn set_reuseaddr(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, &(1 as libc::c_int))
}

/// SO_LINGER {on, 0}: the socket's close sends a reset instead of a FIN.
pub fn set_linger_zero(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &libc::linger { l_onoff: 1, l_linger: 0 })
}

/// Reset a TCP connection: SO_LINGER {on, 0}, then close.
pub fn reset(stream: TcpStream) {
    let _ = set_linger_zero(stream.as_fd());
    drop(stream);
}

fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeros is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { (&mut storage as *mut libc::sockaddr_storage as *mut libc::sockaddr_in).write(sin) };
            mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { (&mut storage as *mut libc::sockaddr_storage as *mut libc::sockaddr_in6).write(sin6) };
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Bind `fd` (a TCP socket) to `addr` and listen with `backlog`.
pub fn bind_listen(fd: OwnedFd, addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    let (sa, len) = sockaddr(&addr);
    // SAFETY: sa/len describe a valid socket address of this family.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), &sa as *const _ as *const libc::sockaddr, len) })?;
    // SAFETY: listen() on a descriptor we own.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(TcpListener::from(fd))
}

/// A TCP listener in this process's namespace at `addr` (SO_REUSEADDR).
pub fn tcp_listen(addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    let fd = new_socket(domain, libc::SOCK_STREAM, 0)?;
    set_reuseaddr(fd.as_fd())?;
    bind_listen(fd, addr, backlog)
}

fn set_nonblocking_fd(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl F_GETFL/F_SETFL on a descriptor the caller owns.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) })?;
    Ok(())
}

/// Wait until `fd` has one of `events`, for at most `timeout` (None: forever). Returns the
/// revents, 0 on timeout.
pub fn poll_one(fd: BorrowedFd<'_>, events: i16, timeout: Option<Duration>) -> io::Result<i16> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            }
        };
        let mut p = libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 };
        // SAFETY: one valid pollfd.
        match cvt(unsafe { libc::poll(&mut p, 1, ms) }) {
            Ok(0) => return Ok(0),
            Ok(_) => return Ok(p.revents),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Connect `fd` (a TCP socket made anywhere) to `addr` within `timeout`; a blocking stream.
pub fn connect_timeout(fd: OwnedFd, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let raw = fd.as_raw_fd();
    set_nonblocking_fd(raw, true)?;
    let (sa, len) = sockaddr(&addr);
    // SAFETY: sa/len describe a valid socket address of this family.
    let r = unsafe { libc::connect(raw, &sa as *const _ as *const libc::sockaddr, len) };
    if r < 0 {
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINPROGRESS) | Some(libc::EINTR) => {
                if poll_one(fd.as_fd(), libc::POLLOUT, Some(timeout))? == 0 {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr} timed out")));
                }
                let mut err: libc::c_int = 0;
                let mut elen = mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: err/elen are a valid int buffer and its length.
                cvt(unsafe {
                    libc::getsockopt(
                        raw,
                        libc::SOL_SOCKET,
                        libc::SO_ERROR,
                        &mut err as *mut _ as *mut libc::c_void,
                        &mut elen,
                    )
                })?;
                if err != 0 {
                    return Err(io::Error::from_raw_os_error(err));
                }
            }
            _ => return Err(e),
        }
    }
    set_nonblocking_fd(raw, false)?;
    Ok(TcpStream::from(fd))
}

/// Connect to the unix stream socket at `path` within `timeout`; a blocking stream. A listener
/// whose backlog is full refuses a non-blocking connect with EAGAIN: retried until the deadline.
pub fn unix_connect_timeout(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { mem::zeroed() };
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= sa.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a unix socket path"));
    }
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    let fd = new_socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)?;
    let deadline = Instant::now() + timeout;
    loop {
        // SAFETY: sa/len describe a valid unix socket address.
        let r = unsafe { libc::connect(fd.as_raw_fd(), &sa as *const _ as *const libc::sockaddr, len) };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Some(libc::EAGAIN) => return Err(io::Error::new(io::ErrorKind::TimedOut, "its backlog stayed full")),
            _ => return Err(e),
        }
    }
    set_nonblocking_fd(fd.as_raw_fd(), false)?;
    Ok(UnixStream::from(fd))
}

fn getsockopt_int(fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v/len are a valid int buffer and its length.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, &mut v as *mut _ as *mut libc::c_void, &mut len) })?;
    Ok(v)
}

/// The uid of the process at the other end of a unix socket (SO_PEERCRED).
pub fn peer_uid(fd: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: ucred is plain data; all zeros is a valid value.
    let mut cred: libc::ucred = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred/len are a valid ucred buffer and its length.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(cred.uid)
}

/// A socket's (domain, type); an error if `fd` is not a socket.
pub fn socket_kind(fd: BorrowedFd<'_>) -> io::Result<(i32, i32)> {
    Ok((getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)?, getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)?))
}

/// Room for one control message carrying one descriptor, aligned for cmsghdr.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Send `data` on a unix socket, with `fd` attached (SCM_RIGHTS) if given.
pub fn send_with_fd(sock: BorrowedFd<'_>, data: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    let mut cbuf = CmsgBuf([0; 64]);
    // SAFETY: msghdr is plain data; zeroed is valid.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE is arithmetic.
        let space = unsafe { libc::CMSG_SPACE(mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points to `space` (<= 64) aligned bytes we own; CMSG_FIRSTHDR is
        // therefore non-null and the header and its one-int payload fit in it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd.as_raw_fd());
        }
    }
    loop {
        // SAFETY: msg describes live buffers (data, cbuf) for the duration of the call.
        match cvt_size(unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// Receive into `buf` from a unix socket, with a descriptor if one was attached (close-on-exec).
/// Returns the byte count and the descriptor.
pub fn recv_with_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    let mut cbuf = CmsgBuf([0; 64]);
    // SAFETY: msghdr is plain data; zeroed is valid.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = cbuf.0.len() as _;
    let n = loop {
        // SAFETY: msg describes live buffers (buf, cbuf) for the duration of the call.
        match cvt_size(unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r?,
        }
    };
    let mut got: Option<OwnedFd> = None;
    // SAFETY: the kernel filled msg_control with msg_controllen bytes of well-formed control
    // messages; the CMSG_* macros walk exactly those. Every descriptor received is wrapped in an
    // OwnedFd at once, so extras are closed.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if got.is_none() {
                        got = Some(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 && got.is_none() {
        return Err(io::Error::other("a passed descriptor was truncated"));
    }
    Ok((n, got))
}

/// An eventfd: readable once signalled (close-on-exec, non-blocking).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd() takes plain integers; a non-negative result is a new descriptor we own.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Make an eventfd readable (for good: nobody reads it).
pub fn signal_eventfd(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

/// Wait until `fd` has `events` or `wake` is readable. Returns true if woken by `wake`.
pub fn wait_or_wake(fd: BorrowedFd<'_>, events: i16, wake: BorrowedFd<'_>) -> io::Result<bool> {
    let mut p = [
        libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 },
        libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    loop {
        // SAFETY: two valid pollfds.
        match cvt(unsafe { libc::poll(p.as_mut_ptr(), 2, -1) }) {
            Ok(_) => return Ok(p[1].revents != 0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Block SIGTERM and SIGINT in this thread (and the threads it starts later); returns the set
/// for [`wait_signal`].
pub fn block_term_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset/pthread_sigmask get valid pointers.
    unsafe {
        let mut set: libc::sigset_t = mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Wait for one of the signals in `set` (blocked beforehand); returns its number.
pub fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig: libc::c_int = 0;
    loop {
        // SAFETY: valid set and out pointer.
        if unsafe { libc::sigwait(set, &mut sig) } == 0 {
            return sig;
        }
    }
}

/// Have the kernel send `sig` to this process when its parent dies.
pub fn set_parent_death_signal(sig: i32) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number.
    cvt(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) })?;
    Ok(())
}

pub fn getuid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

pub fn set_umask(mask: u32) {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) };
}

/// errno's symbolic name for a few values worth naming in a log line.
pub fn errno_name(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM",
        Some(libc::EACCES) => "EACCES",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::ENOSPC) => "ENOSPC",
        Some(libc::ENOMEM) => "ENOMEM",
        Some(libc::EUSERS) => "EUSERS",
        Some(libc::ENOSYS) => "ENOSYS",
        Some(libc::EADDRINUSE) => "EADDRINUSE",
        Some(n) => return format!("errno {n}"),
        None => return e.to_string(),
    };
    name.to_string()
}

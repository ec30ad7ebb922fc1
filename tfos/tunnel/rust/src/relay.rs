//! Relaying one connection: the local (plain) socket and the tunnel (encrypted) socket, one
//! thread per direction.
//!
//! * plain -> encrypted: up to [`CHUNK`] bytes read from the local socket are sealed in place as
//!   one record; the local end's EOF becomes close_notify and a half-close of the tunnel.
//! * encrypted -> plain: each record is checked, opened in place and written to the local
//!   socket; close_notify becomes a half-close of the local socket.
//! * Anything else (a record that fails its check, a tunnel that ends without close_notify, an
//!   I/O error on either side) resets the local connection (SO_LINGER {on, 0}) and closes the
//!   tunnel connection. The local socket is non-blocking and every wait on it also watches an
//!   eventfd, so the other direction's thread wakes at once; waits on the tunnel socket are woken
//!   by shutting it down.
//!
//! Both sockets are closed when both directions are done (the last thread drops them).

use std::fmt::Display;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::log;
use crate::sys;
use crate::wire::{self, RecordReader, RecordWriter, Session, RECORD_HEADER_LEN, TAG_LEN};

/// Plaintext bytes read from the local socket per record.
pub const CHUNK: usize = 256 * 1024;
/// Stack size of relay threads (their buffers are on the heap).
pub const STACK: usize = 512 * 1024;

struct Conn {
    local: TcpStream,
    tunnel: TcpStream,
    wake: OwnedFd,
    aborted: AtomicBool,
    what: String,
}

impl Conn {
    fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Reset the local connection and close the tunnel; wakes the other direction.
    fn abort(&self, why: impl Display) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        log::RESET.log(format_args!("{}: {why}; connection reset", self.what));
        let _ = sys::set_linger_zero(self.local.as_fd());
        sys::signal_eventfd(self.wake.as_fd());
        let _ = self.tunnel.shutdown(Shutdown::Both);
    }

    /// Read from the local socket; `Ok(None)` when the connection was aborted meanwhile.
    fn read_local(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            if self.aborted() {
                return Ok(None);
            }
            match (&self.local).read(buf) {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if sys::wait_or_wake(self.local.as_fd(), libc::POLLIN, self.wake.as_fd())? {
                        return Ok(None);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Write all of `data` to the local socket; `Ok(false)` when aborted meanwhile.
    fn write_local(&self, data: &[u8]) -> io::Result<bool> {
        let mut off = 0;
        while off < data.len() {
            if self.aborted() {
                return Ok(false);
            }
            match (&self.local).write(&data[off..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if sys::wait_or_wake(self.local.as_fd(), libc::POLLOUT, self.wake.as_fd())? {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// Relay between `local` and `tunnel` (whose handshake is done: `session`) until both
/// directions end. Runs one direction on the calling thread and starts one thread for the other.
/// `what` names the connection in log lines.
pub fn run(local: TcpStream, tunnel: TcpStream, session: Session, what: String) {
    let wake = match local.set_nonblocking(true).and_then(|_| sys::eventfd()) {
        Ok(w) => w,
        Err(e) => {
            log::RESET.log(format_args!("{what}: cannot relay: {e}"));
            sys::reset(local);
            return;
        }
    };
    let conn = Arc::new(Conn { local, tunnel, wake, aborted: AtomicBool::new(false), what });
    let Session { writer, reader } = session;
    let out = Arc::clone(&conn);
    let started =
        std::thread::Builder::new().name("relay-out".into()).stack_size(STACK).spawn(move || outbound(&out, writer));
    if let Err(e) = started {
        conn.abort(format_args!("cannot start a relay thread: {e}"));
        return;
    }
    inbound(&conn, reader);
}

/// encrypted -> plain.
fn inbound(conn: &Conn, mut reader: RecordReader) {
    // plaintext that came in the same record as the last handshake frame
    if !reader.pending().is_empty() {
        match conn.write_local(reader.pending()) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return conn.abort(format_args!("writing to the local socket: {e}")),
        }
    }
    loop {
        match reader.next_record(&conn.tunnel, None) {
            Ok(true) => match conn.write_local(reader.pending()) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => return conn.abort(format_args!("writing to the local socket: {e}")),
            },
            Ok(false) => {
                // close_notify: the peer's stream ended; pass the half-close on
                let _ = conn.local.shutdown(Shutdown::Write);
                return;
            }
            Err(e) => {
                if !conn.aborted() {
                    conn.abort(format_args!("from the tunnel: {e}"));
                }
                return;
            }
        }
    }
}

/// plain -> encrypted.
fn outbound(conn: &Conn, mut writer: RecordWriter) {
    let mut buf = vec![0u8; RECORD_HEADER_LEN + CHUNK + TAG_LEN];
    loop {
        let n = match conn.read_local(&mut buf[RECORD_HEADER_LEN..RECORD_HEADER_LEN + CHUNK]) {
            Ok(Some(n)) => n,
            Ok(None) => return,
            Err(e) => return conn.abort(format_args!("reading the local socket: {e}")),
        };
        if n == 0 {
            // the local end half-closed: close_notify, then half-close the tunnel
            let done =
                writer.close_notify(&conn.tunnel, None).and_then(|_| Ok(conn.tunnel.shutdown(Shutdown::Write)?));
            if let Err(e) = done {
                conn.abort(format_args!("closing the tunnel stream: {e}"));
            }
            return;
        }
        let sent = writer.sealer.seal(&mut buf, n).and_then(|len| wire::write_full(&conn.tunnel, &buf[..len], None));
        if let Err(e) = sent {
            if !conn.aborted() {
                conn.abort(format_args!("sending to the tunnel: {e}"));
            }
            return;
        }
    }
}

"""The TCP listener behind every tfos server (the driver's control service, the TF processes'
feed hubs): accept loop, connection cap, handshake deadline, one thread per connection, and
:class:`Parking` for connections kept open between requests.

The OS picks the port (no bind-then-close race). The accept loop survives any accept error
(e.g. EMFILE): it logs once per burst and keeps serving. Connections beyond
``max_connections`` (4096 by default: every feeding task and every waiting node holds one) are
closed at once. Each connection must finish the secret handshake
within ``handshake_timeout``; then ``serve(channel)`` owns it until it returns, and a peer that
stays silent for ``idle_timeout`` is disconnected. A tfos error raised while serving (malformed
input, schema drift, ...) is answered with ``ErrorReply`` before the connection closes.

A server whose clients keep their connections (the control service: every node's heartbeats and
reports) need not hold a thread per connection: its ``serve`` may hand the channel to
:class:`Parking` and return :data:`KEPT`. One thread then waits on every parked channel at once
and serves a request that arrives, so thousands of heartbeats a second do not each wake a thread
of their own that must take the GIL from the others (the control plane at 2,048 nodes).
"""

from __future__ import annotations

import logging
import queue
import selectors
import socket
import threading
import time

from tfos.errors import ChannelClosed, ProtocolError, TFOSError
from tfos.host.deadline import Deadline
from tfos.wire.channel import MAX_DATA_FRAME, Channel
from tfos.wire.messages import ChannelKey, ErrorReply

logger = logging.getLogger(__name__)

#: what ``serve`` returns when it kept the channel (handed to :class:`Parking`): the listener
#: neither closes it nor frees its slot; :meth:`Listener.release` does, later
KEPT = object()
#: a parked channel's request must arrive whole within this many seconds of its first byte (the
#: parking thread reads it; a peer, already authenticated, that stalls mid-request is cut off)
REQUEST_DEADLINE = 2.0


class Listener:
    def __init__(self, key: ChannelKey, serve, name: str, bind_host: str = "0.0.0.0", max_connections: int = 4096,
                 handshake_timeout: float = 10.0, max_data_frame: int = MAX_DATA_FRAME, backlog: int = 64,
                 idle_timeout: float = 3600.0, port: int = 0):
        self.key = key
        self._serve = serve
        self.name = name
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.max_data_frame = max_data_frame
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closed = threading.Event()
        self._last_warning = 0.0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((bind_host, port))
            self.sock.listen(backlog)
        except OSError:
            self.sock.close()
            raise
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name=f"tfos-{name}-accept", daemon=True)

    def start(self) -> "Listener":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        self._thread.join(timeout=5)

    def _warn(self, text: str, *args) -> None:
        """At most one warning per 10 s: a flood of bad connections is one log line, not thousands."""
        now = time.monotonic()
        if now - self._last_warning >= 10.0:
            self._last_warning = now
            logger.warning("tfos %s: " + text, self.name, *args)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError as e:
                if self._closed.is_set():
                    return
                self._warn("accept failed (%s); still serving", e)
                time.sleep(0.1)
                continue
            if not self._slots.acquire(blocking=False):
                self._warn("too many connections; refusing %s:%s", *addr[:2])
                conn.close()
                continue
            try:
                threading.Thread(target=self._connection, args=(conn, addr), name=f"tfos-{self.name}-conn",
                                 daemon=True).start()
            except RuntimeError as e:  # cannot start a thread: drop this connection, keep serving
                self._slots.release()
                conn.close()
                self._warn("cannot serve %s:%s: %s", addr[0], addr[1], e)

    def release(self, ch: Channel) -> None:
        """Close a channel that ``serve`` kept (:data:`KEPT`) and free its connection slot."""
        ch.close()
        self._slots.release()

    def _connection(self, conn: socket.socket, addr) -> None:
        ch = Channel(conn, f"{addr[0]}:{addr[1]}", max_data_frame=self.max_data_frame)
        kept = False
        try:
            try:
                ch.server_handshake(self.key, self.handshake_timeout)
            except (ProtocolError, OSError) as e:
                self._warn("rejected a connection from %s: %s", ch.peer, e)
                return
            ch.settimeout(self.idle_timeout)
            try:
                kept = self._serve(ch) is KEPT
            except Exception as e:
                self.failed(ch, e)
        finally:
            if not kept:
                self.release(ch)

    def failed(self, ch: Channel, e: Exception) -> None:
        """Serving ``ch`` raised ``e``: answer a tfos error with ``ErrorReply`` (malformed input or a
        refused request changes nothing), log the rest; the caller closes the channel."""
        if isinstance(e, ChannelClosed):
            return
        if isinstance(e, socket.timeout):
            self._warn("closed %s: silent for %.0fs", ch.peer, self.idle_timeout)
        elif isinstance(e, TFOSError):
            self._warn("connection from %s failed: %s", ch.peer, e)
            try:
                ch.send(ErrorReply(str(e)[:2000]))
                _linger(ch.sock)
            except (OSError, ProtocolError):
                pass
        elif isinstance(e, OSError):
            self._warn("connection from %s failed: %s", ch.peer, e)
        else:
            logger.error("tfos %s: error serving %s", self.name, ch.peer, exc_info=e)


class Parking:
    """Channels kept open between requests, waited on by one thread.

    ``handle(ch, state, msg)`` answers one request (the caller sends the reply) and may keep
    per-connection ``state`` (a dict); ``waits(msg)`` says whether answering may block (a long
    poll): such a request gets a thread of its own, and the channel leaves the selector until
    that thread has sent the reply. Every other request is answered by the parking thread itself,
    the channel staying registered (no system call per request beyond its reads and its send).
    ``closed(state)`` runs once when a parked connection ends, however it ended. A connection
    silent for the listener's ``idle_timeout`` is closed; a request must arrive whole within
    REQUEST_DEADLINE of its first byte."""

    def __init__(self, listener: Listener, handle, waits, closed=None):
        self.listener = listener
        self._handle, self._waits, self._closed_fn = handle, waits, closed
        self._selector = selectors.DefaultSelector()
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()  # (channel, state) parked from other threads
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a full wake-up pipe means the loop is awake: never wait on it
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._parked: dict = {}  # channel -> [state, last request: monotonic]; the parking thread's alone
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tfos-{listener.name}-parking", daemon=True)
        self._thread.start()

    def park(self, ch: Channel, state: dict) -> object:
        """Wait for ``ch``'s next request here (called from any thread but the parking one);
        returns :data:`KEPT` for ``serve``."""
        try:
            ch.settimeout(REQUEST_DEADLINE)
        except OSError:
            pass
        self._incoming.put((ch, state))
        if self._closing.is_set():  # closed meanwhile: nobody else will end it
            self._drain_incoming()
            return KEPT
        try:
            self._wake_w.send(b"\0")
        except OSError:  # closing, or the wake-up pipe is full (the loop is awake anyway)
            pass
        return KEPT

    def close(self) -> None:
        self._closing.set()
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        self._thread.join(timeout=5)
        for ch, (state, _) in list(self._parked.items()):
            self._end(ch, state)
        self._parked.clear()
        self._drain_incoming()
        for s in (self._wake_r, self._wake_w):
            s.close()
        self._selector.close()

    def _drain_incoming(self) -> None:
        while True:
            try:
                ch, state = self._incoming.get_nowait()
            except queue.Empty:
                return
            if self._closing.is_set():
                self._end(ch, state)
            else:
                self._register(ch, state)
                if ch.buffered() and ch in self._parked:  # its next request was read with the last one:
                    self._serve(ch)  # no selector would see it

    def _register(self, ch: Channel, state: dict) -> None:
        try:
            self._selector.register(ch.sock, selectors.EVENT_READ, ch)
            self._parked[ch] = [state, time.monotonic()]
        except (OSError, ValueError, KeyError) as e:  # closed meanwhile
            logger.debug("cannot park %s: %s", ch.peer, e)
            self._end(ch, state)

    def _loop(self) -> None:
        last_sweep = time.monotonic()
        while not self._closing.is_set():
            try:
                ready = self._selector.select(timeout=1.0)
            except OSError as e:  # never let one bad descriptor end the serving
                self.listener._warn("parked connections: select failed (%s)", e)
                time.sleep(0.1)
                ready = []
            for key, _ in ready:
                if key.data is None:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                elif key.data in self._parked:
                    self._serve(key.data)
            self._drain_incoming()
            now = time.monotonic()
            if now - last_sweep >= 1.0:
                last_sweep = now
                idle = self.listener.idle_timeout
                for ch, (state, since) in list(self._parked.items()):
                    if now - since > idle:
                        self.listener._warn("closed %s: silent for %.0fs", ch.peer, idle)
                        self._leave(ch)
                        self._end(ch, state)

    def _leave(self, ch: Channel) -> dict:
        entry = self._parked.pop(ch)
        try:
            self._selector.unregister(ch.sock)
        except (KeyError, ValueError, OSError):
            pass
        return entry[0]

    def _serve(self, ch: Channel) -> None:
        """(The parking thread.) Answer ``ch``'s requests while they are already there; a request
        that may wait goes to a thread of its own, the channel off the selector until it is answered."""
        entry = self._parked[ch]
        while True:
            try:
                msg = ch.recv()
            except Exception as e:
                self._drop(ch, self._leave(ch), e)
                return
            entry[1] = time.monotonic()
            if self._waits(msg):
                state = self._leave(ch)
                try:
                    threading.Thread(target=self._answer_and_park, args=(ch, state, msg),
                                     name=f"tfos-{self.listener.name}-wait", daemon=True).start()
                except RuntimeError as e:  # cannot start a thread: drop this connection, keep serving
                    self.listener._warn("cannot serve %s: %s", ch.peer, e)
                    self._end(ch, state)
                return
            try:
                ch.send(self._handle(ch, entry[0], msg))
            except Exception as e:
                self._drop(ch, self._leave(ch), e)
                return
            if not ch.buffered():
                return

    def _drop(self, ch: Channel, state: dict, e: Exception) -> None:
        """End a connection whose request failed with ``e``. A closed one ends here; any other gets
        its error answered (which lingers up to 2 s for the peer to read it) in a thread of its
        own, so that the parking thread goes on serving the others."""
        if isinstance(e, ChannelClosed):
            self._end(ch, state)
            return
        if isinstance(e, socket.timeout):
            e = ProtocolError(f"a request from {ch.peer} did not arrive whole within {REQUEST_DEADLINE:.0f}s")

        def answer():
            self.listener.failed(ch, e)
            self._end(ch, state)

        try:
            threading.Thread(target=answer, name=f"tfos-{self.listener.name}-refuse", daemon=True).start()
        except RuntimeError:
            self._end(ch, state)

    def _answer_and_park(self, ch: Channel, state: dict, msg) -> None:
        try:
            ch.send(self._handle(ch, state, msg))
        except Exception as e:
            self.listener.failed(ch, e)
            self._end(ch, state)
            return
        self.park(ch, state)

    def _end(self, ch: Channel, state: dict) -> None:
        try:
            if self._closed_fn is not None:
                self._closed_fn(state)
        except Exception:
            logger.exception("tfos %s: error ending a parked connection", self.listener.name)
        finally:
            self.listener.release(ch)


def _linger(sock: socket.socket, secs: float = 2.0, max_bytes: int = 64 << 20) -> None:
    """Half-close after an error reply and discard what the peer still sends (bounded), so the
    close does not reset the connection and destroy the reply before the peer reads it."""
    sock.shutdown(socket.SHUT_WR)
    deadline = Deadline(secs)
    drained = 0
    while drained < max_bytes:
        remaining = deadline.remaining()
        if remaining <= 0:
            return
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(1 << 16)
        except OSError:
            return
        if not chunk:
            return
        drained += len(chunk)

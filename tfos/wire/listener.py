"""The TCP listener behind every tfos server (the driver's control service, the TF processes'
feed hubs): accept loop, connection cap, handshake deadline, one thread per connection.

The OS picks the port (no bind-then-close race). The accept loop survives any accept error
(e.g. EMFILE): it logs once per burst and keeps serving. Connections beyond
``max_connections`` (4096 by default: every feeding task and every waiting node holds one) are
closed at once. Each connection must finish the secret handshake
within ``handshake_timeout``; then ``serve(channel)`` owns it until it returns, and a peer that
stays silent for ``idle_timeout`` is disconnected. A tfos error raised while serving (malformed
input, schema drift, ...) is answered with ``ErrorReply`` before the connection closes.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from tfos.errors import ChannelClosed, ProtocolError, TFOSError
from tfos.wire.channel import MAX_DATA_FRAME, Channel
from tfos.wire.messages import ChannelKey, ErrorReply

logger = logging.getLogger(__name__)


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

    def _connection(self, conn: socket.socket, addr) -> None:
        ch = Channel(conn, f"{addr[0]}:{addr[1]}", max_data_frame=self.max_data_frame)
        try:
            try:
                ch.server_handshake(self.key, self.handshake_timeout)
            except (ProtocolError, OSError) as e:
                self._warn("rejected a connection from %s: %s", ch.peer, e)
                return
            ch.settimeout(self.idle_timeout)
            try:
                self._serve(ch)
            except ChannelClosed:
                pass
            except socket.timeout:
                self._warn("closed %s: silent for %.0fs", ch.peer, self.idle_timeout)
            except TFOSError as e:  # malformed input or a refused request: answer it, change nothing
                self._warn("connection from %s failed: %s", ch.peer, e)
                try:
                    ch.send(ErrorReply(str(e)[:2000]))
                    _linger(ch.sock)
                except (OSError, ProtocolError):
                    pass
            except OSError as e:
                self._warn("connection from %s failed: %s", ch.peer, e)
            except Exception:
                logger.exception("tfos %s: error serving %s", self.name, ch.peer)
        finally:
            ch.close()
            self._slots.release()


def _linger(sock: socket.socket, secs: float = 2.0, max_bytes: int = 64 << 20) -> None:
    """Half-close after an error reply and discard what the peer still sends (bounded), so the
    close does not reset the connection and destroy the reply before the peer reads it."""
    sock.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + secs
    drained = 0
    while drained < max_bytes:
        remaining = deadline - time.monotonic()
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

"""The authenticated, framed connection every tfos TCP channel uses.

* Handshake (mutual, per connection): the server sends ``HELLO`` = magic ``b"TFOS"``, the
  protocol version (u16) and a 16-byte nonce. The client answers with its own nonce and
  ``HMAC-SHA256(secret, b"client" + server_nonce + client_nonce)``; the server checks it and
  answers ``HMAC-SHA256(secret, b"server" + client_nonce + server_nonce)``, which the client
  checks. A peer without the per-cluster secret is disconnected before any message is read.
* Frames: one kind byte, a u32 big-endian length, then the payload. Kind ``J`` carries one
  message of :mod:`tfos.wire.messages` as JSON; kind ``A`` carries one Arrow IPC stream.

Transport errors are turned into tfos errors here, once: a closed or reset connection is
:class:`~tfos.errors.ChannelClosed`; ``socket.timeout`` passes through for callers that name
their own timeout setting.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import select
import socket
import struct
import time
from typing import Any

from tfos.errors import AuthenticationError, ChannelClosed, ProtocolError, RequestRefused, TFOSTimeoutError
from tfos.wire.messages import PROTOCOL_VERSION, ErrorReply, decode, encode

MAGIC = b"TFOS"
NONCE_BYTES = 16
MAX_JSON_FRAME = 16 * 1024 * 1024
MAX_DATA_FRAME = 2 * 1024 * 1024 * 1024 - 1
KIND_JSON = b"J"
KIND_ARROW = b"A"
_HEADER = struct.Struct(">cI")
_HELLO = struct.Struct(">4sH16s")
_FIRST_CHUNK = 1 << 20  # receive buffers start at 1 MiB and double as bytes arrive
_FIRST_DATA_CHUNK = 17 << 20  # data frames: a feed chunk (~16 MiB, feed.executor.producer) and its metadata fit
_IOV_MAX = 64  # buffers per sendmsg call (Linux allows 1024)
_ALIGN = 64  # data frame bodies land at this alignment (TF's allocator alignment)
_IPC_CONTINUATION = 0xFFFFFFFF


def new_secret() -> str:
    return os.urandom(32).hex()


def _mac(secret: str, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(bytes.fromhex(secret), label + a + b, hashlib.sha256).digest()


class Channel:
    """An authenticated, framed connection. Not thread-safe for concurrent senders.

    ``max_data_frame`` bounds Arrow frames accepted on this channel (0: none, e.g. the control
    service)."""

    def __init__(self, sock: socket.socket, peer: str = "", max_data_frame: int = MAX_DATA_FRAME):
        self.sock = sock
        self.peer = peer
        self.max_data_frame = max_data_frame
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    # -- setup
    @classmethod
    def connect(cls, host: str, port: int, secret: str, timeout: float, what: str = "tfos service",
                setting: str = "", retry: bool = True, unreachable_hint: str = "") -> "Channel":
        """``unreachable_hint`` replaces the ``setting`` hint when no connection could be made."""
        """Connect and authenticate within ``timeout`` seconds. A refused connection is retried
        with backoff (the service may be starting) unless ``retry=False``."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        last: Exception | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                hint = f"; raise {setting} if the peer is just slow" if setting else ""
                if unreachable_hint:
                    hint = f"; {unreachable_hint}"
                raise TFOSTimeoutError(f"could not connect to the {what} at {host}:{port} within "
                                       f"{timeout:.0f}s: {last}{hint}")
            try:
                sock = socket.create_connection((host, port), timeout=min(remaining, 10.0))
                break
            except OSError as e:
                if not retry:
                    raise ChannelClosed(f"cannot connect to the {what} at {host}:{port}: {e}") from None
                last = e
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, 1.0)
        ch = cls(sock, f"{host}:{port}")
        try:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            ch._client_handshake(secret)
        except BaseException:
            ch.close()
            raise
        return ch

    def _client_handshake(self, secret: str) -> None:
        try:
            magic, version, nonce_s = _HELLO.unpack(self._recv_exact(_HELLO.size))
        except ChannelClosed:
            raise AuthenticationError(f"{self.peer} closed the connection during the handshake") from None
        if magic != MAGIC:
            raise ProtocolError(f"{self.peer} is not a tfos endpoint")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"{self.peer} speaks tfos protocol v{version}, this side v{PROTOCOL_VERSION}; "
                                "install the same tfos version everywhere")
        nonce_c = os.urandom(NONCE_BYTES)
        self._sendall(nonce_c + _mac(secret, b"client", nonce_s, nonce_c))
        try:
            answer = self._recv_exact(32)
        except ChannelClosed:
            raise AuthenticationError(f"{self.peer} rejected this connection: wrong cluster secret") from None
        if not hmac.compare_digest(answer, _mac(secret, b"server", nonce_c, nonce_s)):
            raise AuthenticationError(f"{self.peer} failed to prove it holds the cluster secret")

    def server_handshake(self, secret: str, timeout: float = 10.0) -> None:
        """Authenticate the client; the whole handshake must finish within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        self.sock.settimeout(timeout)
        nonce_s = os.urandom(NONCE_BYTES)
        self._sendall(_HELLO.pack(MAGIC, PROTOCOL_VERSION, nonce_s))
        reply = self._recv_exact(NONCE_BYTES + 32, deadline)
        nonce_c, mac = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
        if not hmac.compare_digest(mac, _mac(secret, b"client", nonce_s, nonce_c)):
            raise AuthenticationError(f"connection from {self.peer} failed authentication")
        self._sendall(_mac(secret, b"server", nonce_c, nonce_s))

    # -- frames
    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def send(self, msg) -> None:
        payload = encode(msg)
        self._sendall(_HEADER.pack(KIND_JSON, len(payload)) + payload)

    def send_data(self, payload) -> None:
        """Send one binary frame (an Arrow IPC stream): ``payload`` supports the buffer protocol, or
        is a list of such parts sent one after the other as one frame (no joining copy)."""
        views = [memoryview(p).cast("B") for p in (payload if isinstance(payload, list) else [payload])]
        views = [v for v in views if v.nbytes]
        total = sum(v.nbytes for v in views)
        if total > MAX_DATA_FRAME:
            raise ProtocolError(f"data frame of {total} bytes exceeds the 2 GiB frame limit; "
                                "use smaller chunks")
        self._sendall_parts([memoryview(_HEADER.pack(KIND_ARROW, total))] + views)

    def recv_frame(self) -> tuple[bytes, Any]:
        """Return ``(kind, value)``: a decoded message for JSON frames, a ``pyarrow.Buffer`` for data."""
        kind, size = _HEADER.unpack(self._recv_exact(_HEADER.size))
        if kind == KIND_JSON:
            if size > MAX_JSON_FRAME:
                raise ProtocolError(f"JSON frame of {size} bytes from {self.peer} exceeds the limit")
            return kind, decode(self._recv_exact(size))
        if kind == KIND_ARROW:
            if size > self.max_data_frame:
                raise ProtocolError(f"data frame of {size} bytes from {self.peer} exceeds this channel's limit "
                                    f"of {self.max_data_frame}")
            return kind, self._recv_data(size)
        raise ProtocolError(f"unknown frame kind {kind!r} from {self.peer}")

    def recv(self):
        kind, value = self.recv_frame()
        if kind != KIND_JSON:
            raise ProtocolError(f"expected a message from {self.peer}, got a data frame")
        return value

    def request(self, msg, while_waiting=None, interval: float = 0.5):
        """Send ``msg`` and return the reply; an ErrorReply raises RequestRefused.

        With ``while_waiting``, the wait for the reply's first byte is cut into ``interval``-second
        slices (bounded by the socket's timeout as a whole) and ``while_waiting()`` runs between them:
        it raises to give up early, e.g. when the cluster learned that the peer's node died, which a
        cut network would otherwise hide until the whole timeout ran out."""
        self.send(msg)
        if while_waiting is not None:
            self._await_readable(while_waiting, interval)
        reply = self.recv()
        if isinstance(reply, ErrorReply):
            raise RequestRefused(reply.message)
        return reply

    def _await_readable(self, while_waiting, interval: float) -> None:
        timeout = self.sock.gettimeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_ = interval if deadline is None else min(interval, deadline - time.monotonic())
            if slice_ <= 0:
                raise socket.timeout(f"no reply from {self.peer}")
            readable, _, _ = select.select([self.sock], [], [], slice_)
            if readable:
                if deadline is not None:
                    self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                return
            while_waiting()

    # -- transport
    def _sendall_parts(self, views: list) -> None:
        """``views`` (byte memoryviews) in order, gathered by ``sendmsg`` into as few system calls
        as the socket takes."""
        i = 0
        while i < len(views):
            try:
                sent = self.sock.sendmsg(views[i:i + _IOV_MAX])
            except socket.timeout:
                raise
            except (BrokenPipeError, ConnectionError) as e:
                raise ChannelClosed(f"connection to {self.peer} closed: {e}") from None
            while sent and i < len(views):  # drop what went; a part that went in part stays, cut
                n = views[i].nbytes
                if sent >= n:
                    sent -= n
                    i += 1
                else:
                    views[i] = views[i][sent:]
                    sent = 0

    def _sendall(self, data) -> None:
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise
        except (BrokenPipeError, ConnectionError) as e:
            raise ChannelClosed(f"connection to {self.peer} closed: {e}") from None

    def _recv_exact(self, n: int, deadline: float | None = None) -> bytearray:
        """Exactly ``n`` bytes. Memory grows with the bytes that arrived (at most doubling), never
        from the length a peer announced: a 2 GiB length prefix alone costs nothing."""
        buf = bytearray(min(n, _FIRST_CHUNK))
        got = 0
        while got < n:
            if got == len(buf):
                buf.extend(bytes(min(len(buf), n - len(buf))))
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout("handshake deadline passed")
                self.sock.settimeout(remaining)
            got += self._recv_some(memoryview(buf)[got:])
        return buf

    def _ipc_head(self, n: int) -> tuple[bytearray, bool]:
        """The start of an ``n``-byte data frame up to where its record batch's body begins: the
        schema message and the batch's metadata, each an IPC message prefix (continuation marker,
        length) and that many bytes; and whether both were there. Stops early, with what it read,
        on anything else (the frame is then checked whole by whoever decodes it)."""
        head = bytearray()
        for _ in range(2):
            if len(head) + 8 > n:
                return head, False
            head += self._recv_exact(8)
            marker, length = struct.unpack_from("<Ii", head, len(head) - 8)
            if marker != _IPC_CONTINUATION or length < 0 or len(head) + length > n:
                return head, False
            head += self._recv_exact(length)
        return head, True

    def _recv_data(self, n: int):
        """Exactly ``n`` bytes of a data frame, in an Arrow buffer that grows as bytes arrive (like
        :meth:`_recv_exact`), placed so that the record batch's body starts 64-byte aligned: the
        body's column buffers then become numpy arrays that TensorFlow uses without copying them
        (Arrow pads buffers to 8 bytes only, and the body follows metadata of any length). The
        buffers come from the system allocator, which the TF process tunes to reuse memory: a
        frame that TF holds while tf.data uses it and frees on its own threads measured slower
        from Arrow's default pool (bench/README, feed)."""
        import pyarrow as pa

        pool = pa.system_memory_pool()  # its allocations are 64-byte aligned too
        head, found = self._ipc_head(n)
        shift = -len(head) % _ALIGN if found else 0  # else the frame itself starts aligned
        buf = pa.allocate_buffer(shift + min(n, max(_FIRST_DATA_CHUNK, len(head))), memory_pool=pool)
        with memoryview(buf) as view, view.cast("B") as raw:
            raw[shift:shift + len(head)] = head
        got = len(head)
        while got < n:
            if shift + got == buf.size:
                bigger = pa.allocate_buffer(shift + min((buf.size - shift) * 2, n), memory_pool=pool)
                with memoryview(bigger) as dst, memoryview(buf) as src:
                    dst[:shift + got] = src
                buf = bigger
            with memoryview(buf) as view:
                got += self._recv_some(view[shift + got:shift + n])
        return buf.slice(shift, n)

    def _recv_some(self, view: memoryview) -> int:
        """Receive at least one byte into ``view``; ChannelClosed when the peer is gone."""
        try:
            k = self.sock.recv_into(view, len(view))
        except ConnectionError as e:
            raise ChannelClosed(f"connection to {self.peer} closed: {e}") from None
        if k == 0:
            raise ChannelClosed(f"connection to {self.peer} closed")
        return k

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

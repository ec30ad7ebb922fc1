"""The authenticated, framed connection every tfos TCP channel uses (protocol v5).

* Handshake (mutual, per connection; :mod:`tfos.wire.crypto`): the server's HELLO names its mode
  (clear or encrypted) and carries a nonce and an ephemeral X25519 key; the client answers in the
  same mode with its own, MAC'd with the per-cluster secret over the transcript; the server proves
  the secret back. A peer without the secret, or in the other mode, is disconnected before any
  message is read.
* Frames: one kind byte, a u32 big-endian length, then the payload. Kind ``J`` carries one
  message of :mod:`tfos.wire.messages` as JSON; kind ``A`` carries one Arrow IPC stream.
* Encrypted mode: the frame stream travels in AES-256-GCM records with keys of the connection's
  own (:mod:`tfos.wire.crypto`); a record is checked before any byte of it is parsed. Each
  direction has its own keys and sequence, so one thread may send while another receives
  (inference does). Large data frames are sealed straight from their buffers and opened in place
  in the buffer they are received into (no copy beyond the cipher's own).

Transport errors are turned into tfos errors here, once: a closed or reset connection is
:class:`~tfos.errors.ChannelClosed`; ``socket.timeout`` passes through for callers that name
their own timeout setting.

One module past 450 lines because the frame reader and the record layer share the receive
buffer (records are opened in place where frames land) and the senders' staging: the seam
between framing and records runs through those buffers, not between functions.
"""

from __future__ import annotations

import hmac
import os
import select
import socket
import struct
import time
from typing import Any

from tfos.errors import AuthenticationError, ChannelClosed, ProtocolError, RequestRefused, TFOSTimeoutError
from tfos.host.deadline import Deadline
from tfos.wire import crypto
from tfos.wire.crypto import new_secret
from tfos.wire.messages import ChannelKey, ErrorReply, decode, encode

MAX_JSON_FRAME = 16 * 1024 * 1024
MAX_DATA_FRAME = 2 * 1024 * 1024 * 1024 - 1
KIND_JSON = b"J"
KIND_ARROW = b"A"
_HEADER = struct.Struct(">cI")
_FIRST_CHUNK = 1 << 20  # receive buffers start at 1 MiB and double as bytes arrive
_FIRST_DATA_CHUNK = 17 << 20  # data frames: a feed chunk (~16 MiB, feed.executor.producer) and its metadata fit
_IOV_MAX = 64  # buffers per sendmsg call (Linux allows 1024)
ALIGN = 64  # data frame bodies (and ring slots' batch bodies, wire.ring) land at this alignment (TF's allocator's)
IPC_CONTINUATION = 0xFFFFFFFF  # an Arrow IPC message prefix starts with it
_SMALL = 64 << 10  # encrypted sends: parts below this are joined into one record, larger ones sealed in place
# Encrypted sends: plaintext bytes per record (receivers take up to MAX_RECORD), and how many bytes of
# sealed records are staged per system call: small enough to stay in the CPU's cache from the seal to
# the kernel's copy, large enough that the per-record cost is small (bench/security.py --only channel).
_SEND_RECORD = 256 << 10
_STAGE = 512 << 10
_ROOM = crypto.TAG_BYTES  # receive buffers keep this much beyond their end: a record's tag lands there


def new_key(encrypt: bool = False) -> ChannelKey:
    """A fresh cluster key: a new secret, in the given mode."""
    return ChannelKey(new_secret(), bool(encrypt))


class Channel:
    """An authenticated, framed connection. Not thread-safe for concurrent senders (or concurrent
    receivers); one sender and one receiver may work at once.

    ``max_data_frame`` bounds Arrow frames accepted on this channel (0: none, e.g. the control
    service)."""

    def __init__(self, sock: socket.socket, peer: str = "", max_data_frame: int = MAX_DATA_FRAME):
        self.sock = sock
        self.peer = peer
        self.max_data_frame = max_data_frame
        self.encrypted = False
        self._tx: crypto.Sealer | None = None
        self._rx: crypto.Opener | None = None
        self._stage: memoryview | None = None  # encrypted sends: staged records (allocated on first large send)
        self._pending = memoryview(b"")  # encrypted receives: plaintext of a record not yet consumed
        self._broken = ""  # why the record stream can no longer be read (an error mid-record)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    # -- setup
    @classmethod
    def connect(cls, host: str, port: int, key: ChannelKey, timeout: float, what: str = "tfos service",
                setting: str = "", retry: bool = True, unreachable_hint: str = "") -> "Channel":
        """Connect and authenticate within ``timeout`` seconds, in ``key``'s mode. A refused connection
        is retried with backoff (the service may be starting) unless ``retry=False``.
        ``unreachable_hint`` replaces the ``setting`` hint when no connection could be made."""
        deadline = Deadline(timeout)
        delay = 0.05
        last: Exception | None = None
        while True:
            remaining = deadline.remaining()
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
                time.sleep(deadline.slice(delay))
                delay = min(delay * 2, 1.0)
        ch = cls(sock, f"{host}:{port}")
        try:
            sock.settimeout(max(0.1, deadline.remaining()))
            ch.client_handshake(key)
        except BaseException:
            ch.close()
            raise
        return ch

    def client_handshake(self, key: ChannelKey, ephemeral: "crypto.Ephemeral | None" = None,
                         nonce: bytes | None = None) -> None:
        """The client's side of the handshake (module notes); ``ephemeral``/``nonce`` for tests."""
        secret = crypto.secret_bytes(key.secret)
        mode = crypto.mode_of(key.encrypt)
        try:
            raw_hello = bytes(self._raw_recv_exact(crypto.HELLO.size))
        except ChannelClosed:
            raise AuthenticationError(f"{self.peer} closed the connection during the handshake") from None
        server = crypto.parse_hello(raw_hello, self.peer)
        if server.mode != mode:
            raise crypto.mode_refusal(mode, server.mode, self.peer, "client")
        mine = ephemeral or (crypto.Ephemeral() if mode == crypto.ENCRYPTED else None)
        public = mine.public if mine else bytes(crypto.KEY_BYTES)
        nonce = nonce or os.urandom(crypto.NONCE_BYTES)
        transcript = raw_hello + struct.pack(">B", mode) + nonce + public
        mac = crypto.client_mac(secret, transcript)
        self._raw_sendall(crypto.AUTH.pack(mode, nonce, public, mac))
        try:
            answer = bytes(self._raw_recv_exact(crypto.MAC_BYTES))
        except ChannelClosed:
            raise AuthenticationError(f"{self.peer} rejected this connection: wrong cluster secret") from None
        expected = crypto.server_mac(secret, transcript, mac)
        if not hmac.compare_digest(answer, expected):
            raise AuthenticationError(f"{self.peer} failed to prove it holds the cluster secret")
        if mode == crypto.ENCRYPTED:
            keys = crypto.derive_keys(secret, mine.shared(server.public), transcript, mac, expected)
            self._start_records(crypto.Sealer(keys.client_key, keys.client_iv),
                                crypto.Opener(keys.server_key, keys.server_iv))

    def server_handshake(self, key: ChannelKey, timeout: float = 10.0, ephemeral: "crypto.Ephemeral | None" = None,
                         nonce: bytes | None = None) -> None:
        """Authenticate the client in ``key``'s mode; the whole handshake must finish within
        ``timeout`` seconds. ``ephemeral``/``nonce`` for tests."""
        deadline = Deadline(timeout)
        self.sock.settimeout(timeout)
        secret = crypto.secret_bytes(key.secret)
        mode = crypto.mode_of(key.encrypt)
        mine = ephemeral or (crypto.Ephemeral() if mode == crypto.ENCRYPTED else None)
        raw_hello = crypto.hello(mode, nonce or os.urandom(crypto.NONCE_BYTES),
                                 mine.public if mine else bytes(crypto.KEY_BYTES))
        self._raw_sendall(raw_hello)
        auth = bytes(self._raw_recv_exact(crypto.AUTH.size, deadline))
        client_mode, _, public, mac = crypto.AUTH.unpack(auth)
        if client_mode not in crypto.MODE_NAMES:
            raise ProtocolError(f"connection from {self.peer} sent a malformed handshake")
        if client_mode != mode:
            raise crypto.mode_refusal(mode, client_mode, f"connection from {self.peer}", "listener")
        transcript = raw_hello + auth[:-crypto.MAC_BYTES]
        if not hmac.compare_digest(mac, crypto.client_mac(secret, transcript)):
            raise AuthenticationError(f"connection from {self.peer} failed authentication")
        answer = crypto.server_mac(secret, transcript, mac)
        if mode == crypto.ENCRYPTED:  # keys before the answer: a bad key share fails here, not on the first record
            keys = crypto.derive_keys(secret, mine.shared(public), transcript, mac, answer)
        self._raw_sendall(answer)
        if mode == crypto.ENCRYPTED:
            self._start_records(crypto.Sealer(keys.server_key, keys.server_iv),
                                crypto.Opener(keys.client_key, keys.client_iv))

    def _start_records(self, tx: "crypto.Sealer", rx: "crypto.Opener") -> None:
        self._tx, self._rx, self.encrypted = tx, rx, True

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

    def recv_frame(self, decode_json: bool = True) -> tuple[bytes, Any]:
        """Return ``(kind, value)``: a decoded message for JSON frames (their bytes with
        ``decode_json=False``: a simulator that plays thousands of nodes in one process only
        counts them), a ``pyarrow.Buffer`` for data."""
        kind, size = _HEADER.unpack(self._recv_exact(_HEADER.size))
        if kind == KIND_JSON:
            if size > MAX_JSON_FRAME:
                raise ProtocolError(f"JSON frame of {size} bytes from {self.peer} exceeds the limit")
            data = self._recv_exact(size)
            return kind, decode(data) if decode_json else bytes(data)
        if kind == KIND_ARROW:
            if size > self.max_data_frame:
                raise ProtocolError(f"data frame of {size} bytes from {self.peer} exceeds this channel's limit "
                                    f"of {self.max_data_frame}")
            return kind, self._recv_data(size)
        raise ProtocolError(f"unknown frame kind {kind!r} from {self.peer}")

    def buffered(self) -> bool:
        """Bytes of the stream already received and opened but not yet read (an encrypted record
        that held more than one frame): a selector would not see them."""
        return self._pending.nbytes > 0

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
        if self._pending.nbytes:
            return
        timeout = self.sock.gettimeout()
        deadline = None if timeout is None else Deadline(timeout)
        while True:
            slice_ = interval if deadline is None else deadline.slice(interval)
            if slice_ <= 0:
                raise socket.timeout(f"no reply from {self.peer}")
            readable, _, _ = select.select([self.sock], [], [], slice_)
            if readable:
                if deadline is not None:
                    self.sock.settimeout(max(deadline.remaining(), 0.001))
                return
            while_waiting()

    # -- transport: what a frame's bytes become (records when encrypted)
    def _sendall(self, data) -> None:
        if self._tx is None:
            self._raw_sendall(data)
        else:
            self._sendall_parts([memoryview(data).cast("B")])

    def _sendall_parts(self, views: list) -> None:
        """``views`` (byte memoryviews) in order: as they are on a clear channel, as records on an
        encrypted one (small parts joined into one record, large ones sealed straight from their
        buffers in records of at most MAX_RECORD bytes)."""
        if self._tx is None:
            self._raw_sendmsg(views)
            return
        small = sum(v.nbytes for v in views)
        if small <= _SMALL:  # a message or a small frame: one record, one system call
            out = memoryview(bytearray(small + crypto.TAG_BYTES + 4))
            pos = 4
            for v in views:
                out[pos:pos + v.nbytes] = v
                pos += v.nbytes
            self._tx.seal_into(out[4:pos], out)
            self._raw_sendall(out)
            return
        if small <= _STAGE and self._stage is None:
            # a large message (a cluster spec to each of thousands of nodes): records in a buffer of
            # its size that nobody keeps; a channel keeps a stage only once it sent a larger frame
            plain = memoryview(b"".join(views))
            out = memoryview(bytearray(small + -(-small // _SEND_RECORD) * (crypto.TAG_BYTES + 4)))
            pos = 0
            for off in range(0, small, _SEND_RECORD):
                pos += self._tx.seal_into(plain[off:off + _SEND_RECORD], out[pos:])
            self._raw_sendall(out)
            return
        if self._stage is None:
            self._stage = memoryview(bytearray(_STAGE + _SEND_RECORD + 2 * (crypto.TAG_BYTES + 4)))
        stage, used, joined = self._stage, 0, 0  # joined: plaintext of small parts gathered at stage[used + 4:]

        def flush_joined():
            nonlocal used, joined
            if joined:
                used += self._tx.seal_into(stage[used + 4:used + 4 + joined], stage[used:])
                joined = 0

        for v in views:
            if v.nbytes < _SMALL and joined + v.nbytes <= _SEND_RECORD:
                stage[used + 4 + joined:used + 4 + joined + v.nbytes] = v
                joined += v.nbytes
                continue
            flush_joined()
            for off in range(0, v.nbytes, _SEND_RECORD):
                if used + _SEND_RECORD + crypto.TAG_BYTES + 4 > stage.nbytes:
                    self._raw_sendall(stage[:used])
                    used = 0
                used += self._tx.seal_into(v[off:off + _SEND_RECORD], stage[used:])
            if used >= _STAGE:
                self._raw_sendall(stage[:used])
                used = 0
        flush_joined()
        if used:
            self._raw_sendall(stage[:used])

    def _recv_exact(self, n: int, deadline: Deadline | None = None) -> bytearray:
        """Exactly ``n`` bytes of the frame stream. Memory grows with the bytes that arrived (at most
        doubling), never from the length a peer announced: a 2 GiB length prefix alone costs nothing."""
        buf = bytearray(min(n, _FIRST_CHUNK) + _ROOM)
        got = 0
        while got < n:
            if got + _ROOM == len(buf):
                buf.extend(bytes(min(len(buf) - _ROOM, n - got)))
            if deadline is not None:
                remaining = deadline.remaining()
                if remaining <= 0:
                    raise socket.timeout("handshake deadline passed")
                self.sock.settimeout(remaining)
            with memoryview(buf) as view:  # released before the buffer grows
                got += self._recv_into(view[got:min(n, len(buf) - _ROOM)], view[got:])
        del buf[n:]
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
            if marker != IPC_CONTINUATION or length < 0 or len(head) + length > n:
                return head, False
            head += self._recv_exact(length)
        return head, True

    def _recv_data(self, n: int):
        """Exactly ``n`` bytes of a data frame, in an Arrow buffer that grows as bytes arrive (like
        :meth:`_recv_exact`), placed so that the record batch's body starts 64-byte aligned: the
        body's column buffers then become numpy arrays that TensorFlow uses without copying them
        (Arrow pads buffers to 8 bytes only, and the body follows metadata of any length). The
        buffers come from the system allocator, which the TF process tunes to reuse memory (not
        Arrow's default pool: bench/README, "Constants": receive buffers). Each buffer keeps a record tag's room
        beyond the frame, so that encrypted records are opened where they land."""
        import pyarrow as pa

        pool = pa.system_memory_pool()  # its allocations are 64-byte aligned too
        head, found = self._ipc_head(n)
        shift = -len(head) % ALIGN if found else 0  # else the frame itself starts aligned
        buf = pa.allocate_buffer(shift + min(n, max(_FIRST_DATA_CHUNK, len(head))) + _ROOM, memory_pool=pool)
        with memoryview(buf) as view, view.cast("B") as raw:
            raw[shift:shift + len(head)] = head
        got = len(head)
        while got < n:
            if shift + got + _ROOM == buf.size:
                bigger = pa.allocate_buffer(shift + min((buf.size - _ROOM - shift) * 2, n) + _ROOM, memory_pool=pool)
                with memoryview(bigger) as dst, memoryview(buf) as src:
                    dst[:shift + got] = src[:shift + got]
                buf = bigger
            with memoryview(buf) as view, view.cast("B") as raw:
                end = min(shift + n, buf.size - _ROOM)
                got += self._recv_into(raw[shift + got:end], raw[shift + got:])
        return buf.slice(shift, n)

    def _recv_into(self, view: memoryview, room: memoryview) -> int:
        """Receive at least one byte of the frame stream into ``view``; ``room`` is ``view`` and the
        writable bytes after it (an encrypted record whose plaintext fits in ``view`` is received
        and opened there, its tag landing in the room). ChannelClosed when the peer is gone."""
        if self._rx is None:
            return self._recv_some(view)
        if self._pending.nbytes:
            k = min(view.nbytes, self._pending.nbytes)
            view[:k] = self._pending[:k]
            self._pending = self._pending[k:]
            return k
        if self._broken:
            raise ProtocolError(self._broken)
        head = bytearray(4)
        got = 0
        try:
            while got < 4:  # a timeout before the first byte leaves the stream whole
                got += self._recv_some(memoryview(head)[got:], cut=got > 0)
            header = bytes(head)
            length = crypto.record_length(header, self.peer)
            plain = length - crypto.TAG_BYTES
            if plain == 0:
                raise ChannelClosed(f"{self.peer} closed the stream")
            if plain <= view.nbytes and length <= room.nbytes:  # received and opened where it belongs
                body = room[:length]
                self._raw_recv_into(body)
                return self._rx.open_in_place(header, body, self.peer)
            body = memoryview(bytearray(length))  # a record that spans what the caller asked for
            self._raw_recv_into(body)
            plain = self._rx.open_in_place(header, body, self.peer)
        except BaseException as e:  # inside a record the stream's position is lost: nothing more can be read
            if got:
                self._broken = f"the connection to {self.peer} broke inside a record ({type(e).__name__}: {e})"
            raise
        k = min(view.nbytes, plain)
        view[:k] = body[:k]
        self._pending = body[k:plain]
        return k

    # -- raw socket I/O (the handshake, and records)
    def _raw_sendmsg(self, views: list) -> None:
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

    def _raw_sendall(self, data) -> None:
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise
        except (BrokenPipeError, ConnectionError) as e:
            raise ChannelClosed(f"connection to {self.peer} closed: {e}") from None

    def _raw_recv_exact(self, n: int, deadline: Deadline | None = None) -> bytearray:
        """Exactly ``n`` raw bytes of the handshake (``n`` is one of its fixed sizes)."""
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            if deadline is not None:
                remaining = deadline.remaining()
                if remaining <= 0:
                    raise socket.timeout("handshake deadline passed")
                self.sock.settimeout(remaining)
            got += self._recv_some(view[got:])
        return buf

    def _raw_recv_into(self, view: memoryview) -> None:
        got = 0
        while got < view.nbytes:
            got += self._recv_some(view[got:], cut=True)

    def _recv_some(self, view: memoryview, cut: bool = False) -> int:
        """Receive at least one raw byte into ``view``; ChannelClosed when the peer is gone (``cut``:
        in the middle of an encrypted record, which the message says)."""
        try:
            k = self.sock.recv_into(view, len(view))
        except ConnectionError as e:
            raise ChannelClosed(f"connection to {self.peer} closed: {e}") from None
        if k == 0:
            raise ChannelClosed(f"connection to {self.peer} closed" + (" inside a record (cut short)" if cut else ""))
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

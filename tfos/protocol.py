"""Everything that crosses a process boundary: typed messages, framing and authentication.

Wire format (every tfos TCP channel, control and feed alike):

* Handshake (mutual, per connection): the server sends ``HELLO`` = magic ``b"TFOS"``, the
  protocol version (u16) and a 16-byte nonce. The client answers with its own nonce and
  ``HMAC-SHA256(secret, b"client" + server_nonce + client_nonce)``; the server checks it and
  answers ``HMAC-SHA256(secret, b"server" + client_nonce + server_nonce)``, which the client
  checks. A peer without the per-cluster secret is disconnected before any message is read.
* Frames: one kind byte, a u32 big-endian length, then the payload. Kind ``J`` carries one
  UTF-8 JSON object ``{"type": ..., "v": PROTOCOL_VERSION, ...fields}`` decoded into one of
  the frozen dataclasses below; kind ``A`` carries one Arrow IPC stream (schema + record
  batch). Nothing is ever unpickled from a socket.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from tfos.errors import AuthenticationError, ProtocolError, TFOSTimeoutError

PROTOCOL_VERSION = 1
MAGIC = b"TFOS"
NONCE_BYTES = 16
MAX_JSON_FRAME = 16 * 1024 * 1024
MAX_DATA_FRAME = 2 * 1024 * 1024 * 1024 - 1
KIND_JSON = b"J"
KIND_ARROW = b"A"
_HEADER = struct.Struct(">cI")
_HELLO = struct.Struct(">4sH16s")

# --------------------------------------------------------------------------- messages

_REGISTRY: dict[str, type] = {}


def message(cls):
    """Class decorator: a frozen dataclass that can travel as a JSON frame."""
    cls = dataclass(frozen=True)(cls)
    _REGISTRY[cls.__name__] = cls
    return cls


def encode(msg) -> bytes:
    if type(msg).__name__ not in _REGISTRY:
        raise ProtocolError(f"{type(msg).__name__} is not a tfos protocol message")
    body = dataclasses.asdict(msg)
    body["type"] = type(msg).__name__
    body["v"] = PROTOCOL_VERSION
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def decode(data: bytes):
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"frame is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ProtocolError("frame is not a JSON object")
    if body.pop("v", None) != PROTOCOL_VERSION:
        raise ProtocolError(f"message version mismatch (this side speaks v{PROTOCOL_VERSION}); "
                            "install the same tfos version on the driver and the executors")
    cls = _REGISTRY.get(body.pop("type", None))
    if cls is None:
        raise ProtocolError("unknown message type")
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in body.items() if k in names})
    except TypeError as e:
        raise ProtocolError(f"bad {cls.__name__} message: {e}") from None


@dataclass(frozen=True)
class NodeInfo:
    """One node of a reserved cluster, as registered by its TF process."""

    node_index: int
    job_name: str
    task_index: int
    host: str
    tf_port: int
    feed_port: int
    pid: int
    executor_id: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.tf_port}"


# TF process -> driver
@message
class RegisterNode:
    cluster_id: str
    node: dict  # NodeInfo fields


@message
class GetClusterSpec:
    cluster_id: str
    node_index: int
    timeout: float


# agent -> driver
@message
class AgentStarted:
    cluster_id: str
    node_index: int
    host: str
    agent_pid: int
    tf_pid: int
    log_path: str


@message
class Heartbeat:
    cluster_id: str
    node_index: int


@message
class NodeExited:
    cluster_id: str
    node_index: int
    exit_code: int
    traceback: str
    log_tail: str
    log_path: str
    stopped_by_driver: bool = False
    reason: str = ""  # why the agent stopped the TF process on its own (JVM gone, driver lost, signal)


# feeding Spark task -> driver
@message
class AssignChunk:
    """Ask which node takes the next ``rows`` rows. ``failed_node`` >= 0 reports that sending to
    that node failed; the driver reassigns if the node had finished reading (terminate / exit 0)."""

    cluster_id: str
    feed_id: str
    rows: int
    failed_node: int = -1


# TF process -> driver: main_fun called feed.terminate(): skip the rest of the feed
@message
class FeedTerminated:
    cluster_id: str
    node_index: int
    qname: str


# node -> driver: progress / metrics
@message
class Report:
    cluster_id: str
    node_index: int
    values: dict
    events: list = field(default_factory=list)  # Chrome trace events for the cluster timeline


# replies
@message
class Ack:
    pass


@message
class ErrorReply:
    message: str


@message
class ClusterSpecReply:
    nodes: list  # list of NodeInfo dicts, ordered by node_index
    backend: dict = field(default_factory=dict)  # the backend's driver_setup() result


@message
class HeartbeatReply:
    stop: bool


@message
class AssignReply:
    node_index: int  # -1: every node stopped reading; skip the rest of the partition


# feed channel (Spark task or driver -> TF process), see tfos/feed
@message
class FeedBegin:
    feed_id: str
    qname: str
    partition: int
    train: bool


@message
class FeedPartitionEnd:
    rows: int


@message
class FeedEnd:
    """Driver -> TF process: the feed ``feed_id`` is complete; ``rows`` were sent to you."""

    feed_id: str
    qname: str
    rows: int


@message
class FeedAck:
    rows: int
    terminated: bool = False


@message
class FeedResults:
    """TF process -> Spark task (inference): results for the next ``rows`` input rows follow."""

    rows: int


# --------------------------------------------------------------------------- channel


def new_secret() -> str:
    return os.urandom(32).hex()


def _mac(secret: str, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(bytes.fromhex(secret), label + a + b, hashlib.sha256).digest()


class Channel:
    """An authenticated, framed connection. Not thread-safe for concurrent senders."""

    def __init__(self, sock: socket.socket, peer: str = ""):
        self.sock = sock
        self.peer = peer
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    # -- setup
    @classmethod
    def connect(cls, host: str, port: int, secret: str, timeout: float, what: str = "tfos service",
                setting: str = "", retry: bool = True) -> "Channel":
        deadline = time.monotonic() + timeout
        delay = 0.05
        last: Exception | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                hint = f"; raise {setting} if the peer is just slow" if setting else ""
                raise TFOSTimeoutError(f"could not connect to the {what} at {host}:{port} within "
                                       f"{timeout:.0f}s: {last}{hint}")
            try:
                sock = socket.create_connection((host, port), timeout=min(remaining, 10.0))
                break
            except OSError as e:  # refused while starting, or transient: retry with backoff
                if not retry:
                    raise
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
        except ProtocolError:
            raise AuthenticationError(f"{self.peer} closed the connection during the handshake") from None
        if magic != MAGIC:
            raise ProtocolError(f"{self.peer} is not a tfos endpoint")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"{self.peer} speaks tfos protocol v{version}, this side v{PROTOCOL_VERSION}; "
                                "install the same tfos version everywhere")
        nonce_c = os.urandom(NONCE_BYTES)
        self.sock.sendall(nonce_c + _mac(secret, b"client", nonce_s, nonce_c))
        try:
            answer = self._recv_exact(32)
        except ProtocolError:
            raise AuthenticationError(f"{self.peer} rejected this connection: wrong cluster secret") from None
        if not hmac.compare_digest(answer, _mac(secret, b"server", nonce_c, nonce_s)):
            raise AuthenticationError(f"{self.peer} failed to prove it holds the cluster secret")

    def server_handshake(self, secret: str, timeout: float = 10.0) -> None:
        self.sock.settimeout(timeout)
        nonce_s = os.urandom(NONCE_BYTES)
        self.sock.sendall(_HELLO.pack(MAGIC, PROTOCOL_VERSION, nonce_s))
        reply = self._recv_exact(NONCE_BYTES + 32)
        nonce_c, mac = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
        if not hmac.compare_digest(mac, _mac(secret, b"client", nonce_s, nonce_c)):
            raise AuthenticationError(f"connection from {self.peer} failed authentication")
        self.sock.sendall(_mac(secret, b"server", nonce_c, nonce_s))

    # -- frames
    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def send(self, msg) -> None:
        payload = encode(msg)
        self.sock.sendall(_HEADER.pack(KIND_JSON, len(payload)) + payload)

    def send_data(self, payload) -> None:
        """Send one binary frame (an Arrow IPC stream); ``payload`` supports the buffer protocol."""
        view = memoryview(payload)
        if view.nbytes > MAX_DATA_FRAME:
            raise ProtocolError(f"data frame of {view.nbytes} bytes exceeds the 2 GiB frame limit; "
                                "use smaller chunks")
        self.sock.sendall(_HEADER.pack(KIND_ARROW, view.nbytes))
        self.sock.sendall(view)

    def recv_frame(self) -> tuple[bytes, Any]:
        """Return ``(kind, value)``: a decoded message for JSON frames, a bytearray for data."""
        kind, size = _HEADER.unpack(self._recv_exact(_HEADER.size))
        if kind == KIND_JSON:
            if size > MAX_JSON_FRAME:
                raise ProtocolError(f"JSON frame of {size} bytes from {self.peer} exceeds the limit")
            return kind, decode(self._recv_exact(size))
        if kind == KIND_ARROW:
            if size > MAX_DATA_FRAME:
                raise ProtocolError(f"data frame of {size} bytes from {self.peer} exceeds the limit")
            return kind, self._recv_exact(size)
        raise ProtocolError(f"unknown frame kind {kind!r} from {self.peer}")

    def recv(self):
        kind, value = self.recv_frame()
        if kind != KIND_JSON:
            raise ProtocolError(f"expected a message from {self.peer}, got a data frame")
        return value

    def request(self, msg):
        self.send(msg)
        reply = self.recv()
        if isinstance(reply, ErrorReply):
            from tfos.errors import TFOSError
            raise TFOSError(reply.message)
        return reply

    def _recv_exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ProtocolError(f"connection to {self.peer} closed")
            got += k
        return buf

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def call(address: tuple[str, int], secret: str, msg, timeout: float, what: str = "tfos driver",
         setting: str = "", retry: bool = True):
    """One request/response on a fresh authenticated connection (control RPCs are idempotent).
    ``retry=False``: a refused connection fails at once instead of being retried until the timeout."""
    host, port = address
    with Channel.connect(host, port, secret, timeout=min(timeout, 30.0), what=what, setting=setting,
                         retry=retry) as ch:
        ch.settimeout(timeout)
        try:
            return ch.request(msg)
        except socket.timeout:
            hint = f"; raise {setting}" if setting else ""
            raise TFOSTimeoutError(f"no answer from the {what} at {host}:{port} within {timeout:.0f}s{hint}") from None

"""The message registry: every type that crosses a process boundary, as a frozen dataclass.

Two kinds of crossing use it:

* network channels (control service, feed hubs): one JSON frame per message,
  ``{"type": name, "v": PROTOCOL_VERSION, ...fields}``;
* local hand-offs: the barrier task gives the node agent its :class:`NodeConfig`, and the agent
  gives the TF process its own, as one encoded line on stdin.

Decoding is typed: each field is checked against its annotation (ints, floats, strings,
bools, tuples, dicts with string keys, optional values and nested registered types), so a
malformed message is a :class:`~tfos.errors.ProtocolError`, never a half-built object.
Nothing is ever unpickled from a socket.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from tfos.errors import ProtocolError

PROTOCOL_VERSION = 3
_MAX_INT = 2 ** 63

_REGISTRY: dict[str, type] = {}
_HINTS: dict[type, dict] = {}


def message(cls):
    """Class decorator: a frozen dataclass in the registry (it can travel as a JSON frame)."""
    cls = dataclass(frozen=True)(cls)
    _REGISTRY[cls.__name__] = cls
    return cls


# --------------------------------------------------------------------------- codec

def _to_wire(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_wire(v) for k, v in value.items()}
    return value


def encode(msg) -> bytes:
    if _REGISTRY.get(type(msg).__name__) is not type(msg):
        raise ProtocolError(f"{type(msg).__name__} is not a tfos message")
    body = _to_wire(msg)
    body["type"] = type(msg).__name__
    body["v"] = PROTOCOL_VERSION
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def decode(data: bytes):
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProtocolError(f"frame is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(body, dict):
        raise ProtocolError("frame is not a JSON object")
    if body.pop("v", None) != PROTOCOL_VERSION:
        raise ProtocolError(f"message version mismatch (this side speaks v{PROTOCOL_VERSION}); "
                            "install the same tfos version on the driver and the executors")
    name = body.pop("type", None)
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ProtocolError("unknown message type")
    return _build(cls, body, cls.__name__)


def _hints(cls) -> dict:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    return hints


def _build(cls, body, where: str):
    if not isinstance(body, dict):
        raise ProtocolError(f"{where}: expected an object")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in body:
            kwargs[f.name] = _check(hints[f.name], body[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where}: missing field {f.name!r}")
    return cls(**kwargs)


def _check(tp, value, where: str):
    """``value`` (decoded JSON) as type ``tp``, or ProtocolError."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(inner[0], value, where)
    if tp in _REGISTRY.values():
        return _build(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if -_MAX_INT <= value < _MAX_INT:
                return value
            raise ProtocolError(f"{where}: integer out of range")
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is tuple or tp is tuple:
        if isinstance(value, list):
            if not args:
                return tuple(value)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_check(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
            if len(args) == len(value):
                return tuple(_check(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    elif origin is list or tp is list:
        if isinstance(value, list):
            return [_check(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)] if args else value
    elif origin is dict or tp is dict:
        if isinstance(value, dict):
            if not args:
                return value
            return {k: _check(args[1], v, f"{where}[{k!r}]") for k, v in value.items()}
    else:
        raise ProtocolError(f"{where}: unsupported field type {tp!r}")
    raise ProtocolError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {type(value).__name__}")


# --------------------------------------------------------------------------- configurations

@message
class NodeInfo:
    """One node of a reserved cluster, as registered by its TF process."""

    node_index: int
    job_name: str
    task_index: int
    host: str
    tf_port: int
    feed_port: int
    pid: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.tf_port}"


@message
class ClusterConfig:
    """Cluster-wide settings, made by the driver at start(); every process of a node reads them."""

    cluster_id: str
    secret: str
    driver_host: str
    driver_port: int
    roles: tuple[tuple[str, int], ...]
    input_mode: int
    reservation_timeout: float
    log_dir: str
    default_fs: str
    num_gpus: int = 0
    env: dict[str, str] = field(default_factory=dict)
    release_port: bool = True
    preimport_tensorflow: bool = True  # the TF process imports TF while it waits for the cluster spec
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 30.0
    stop_grace_secs: float = 5.0
    timeline: bool = False
    report_interval: float = 1.0
    metric_history: bool = False  # ship every ctx.report() call (the MLflow run logs them), not just the latest
    feed_queue_chunks: int = 4
    attempt: int = 0  # 0 on the first start, k after the k-th restart (max_restarts)
    checkpoint_dir: str = ""  # ctx.checkpoint_dir: the same on every attempt


@message
class NodeConfig:
    """What one node's agent and TF process are told by the barrier task (and the agent)."""

    cluster: ClusterConfig
    node_index: int
    job_name: str
    task_index: int
    host: str
    node_dir: str
    fn_path: str
    working_dir: str
    python: str
    sys_path: tuple[str, ...] = ()
    spark_gpus: tuple[str, ...] = ()
    jvm_pid: int | None = None
    gpus: tuple[str, ...] = ()  # chosen by the agent
    watchdog_fd: int = -1  # read end of the agent's watchdog pipe, in the TF process


@message
class FeedConfig:
    """One train()/inference() feed, as the feeding Spark tasks see it."""

    cluster_id: str
    secret: str
    driver_host: str
    driver_port: int
    feed_id: str
    qname: str
    feed_timeout: float
    feed_nodes: tuple[int, ...]
    feed_addresses: tuple[tuple[int, str, int], ...]  # (node index, host, feed port)
    chunk_rows: int | None = None

    def address(self, node: int) -> tuple[str, int]:
        for i, host, port in self.feed_addresses:
            if i == node:
                return host, port
        raise KeyError(node)


# --------------------------------------------------------------------------- control service

@message
class RegisterNode:  # TF process -> driver
    cluster_id: str
    node: NodeInfo


@message
class GetClusterSpec:  # TF process -> driver; answered once every node registered
    cluster_id: str
    node_index: int
    timeout: float


@message
class AgentStarted:  # agent -> driver
    cluster_id: str
    node_index: int
    host: str
    agent_pid: int
    tf_pid: int
    log_path: str


@message
class Heartbeat:  # agent -> driver
    cluster_id: str
    node_index: int


@message
class NodeExited:  # agent -> driver
    cluster_id: str
    node_index: int
    exit_code: int
    traceback: str
    log_tail: str
    log_path: str
    stopped_by_driver: bool = False
    reason: str = ""  # why the agent stopped the TF process on its own (JVM gone, driver lost, signal)
    retryable: bool = True  # False: main_fun raised NonRetryable/ConfigError (a restart would not help)
    peak_rss_mb: int = 0  # the TF process's peak resident memory as the agent last saw it (0: unknown)


@message
class Column:
    """One column of a fed schema, as the driver compares them: name, kind (``number`` for ints,
    floats and bools, else the Arrow type), the Arrow type and the per-row shape of a vector."""

    name: str
    kind: str
    type: str
    shape: str = ""


@message
class AssignChunk:
    """Feeding task -> driver: which node takes the next ``rows`` rows? ``failed_node`` >= 0
    reports that sending to that node failed; the driver reassigns if the node had finished
    reading (terminate / exit 0). A partition's first request carries its ``columns``: the
    driver refuses a partition whose columns drift from the feed's first (whichever node the
    two partitions feed)."""

    cluster_id: str
    feed_id: str
    rows: int
    failed_node: int = -1
    partition: int = -1
    columns: tuple[Column, ...] | None = None


@message
class GetNodeFailure:  # feeding task -> driver: why did this node drop my feed? (waits up to ``wait`` s)
    cluster_id: str
    node_index: int
    wait: float


@message
class NodeFailureReply:
    text: str  # the node's failure as the driver reports it, "" if none is known


@message
class FeedTerminated:  # TF process -> driver: main_fun called feed.terminate()
    cluster_id: str
    node_index: int
    qname: str


@message
class Report:  # TF process -> driver: progress values, timeline events, ctx.report history
    cluster_id: str
    node_index: int
    values: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)  # each ctx.report() call: {"t": ..., values}


@message
class LogModel:  # TF process -> driver: ctx.log_model(path), the model to log with the run
    cluster_id: str
    node_index: int
    path: str


@message
class Ack:
    pass


@message
class ErrorReply:
    message: str


@message
class ClusterSpecReply:
    nodes: tuple[NodeInfo, ...]  # ordered by node_index
    backend: dict[str, Any] = field(default_factory=dict)  # the backend's driver setup() result


@message
class HeartbeatReply:
    stop: bool


@message
class AssignReply:
    node_index: int  # -1: every node stopped reading; skip the rest of the partition


# --------------------------------------------------------------------------- feed channels

@message
class FeedBegin:  # feeding task -> feed hub, then Arrow frames
    feed_id: str
    qname: str
    partition: int
    train: bool


@message
class FeedPartitionEnd:
    rows: int


#: feed_id of the FeedEnd the driver sends at shutdown: no more feeds will come.
SHUTDOWN_FEED = "__shutdown__"


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
    """TF process -> feeding task (inference): results for the next ``rows`` input rows follow."""

    rows: int

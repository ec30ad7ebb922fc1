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

One module on purpose, past 450 lines: it is the registry, the one place that lists every type
that crosses a process boundary (the wire protocol of docs/design.md §3); each part is a handful
of dataclass fields, and splitting it would scatter the protocol over files.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from tfos.errors import Cause
from tfos.wire.codec import PROTOCOL_VERSION, Encoded, decode, encode, message  # noqa: F401 (the registry's API)


# --------------------------------------------------------------------------- configurations

@message
class ChannelKey:
    """What a tfos channel is opened with: the per-cluster secret (hex) and whether the channel is
    encrypted (:mod:`tfos.wire.crypto`). Every process of a cluster uses the cluster's one key."""

    secret: str
    encrypt: bool = False

    def __repr__(self):  # the secret never reaches a log line or a traceback
        return f"ChannelKey(encrypt={self.encrypt})"

    def without_secret(self) -> "ChannelKey":
        """This key's mode and no secret: what travels in a Spark task's closure, which Spark serves
        as a broadcast block to anyone when spark.authenticate is off (docs/security.md)."""
        return ChannelKey("", self.encrypt)

    def with_secret(self, secret: str) -> "ChannelKey":
        return ChannelKey(secret, self.encrypt)


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
    tunnel_port: int = 0  # its tunnel's port on ``host`` (0: no tunnel, TF listens on ``host`` itself)
    # "netns": TF and Gloo in a private namespace; "pod": on a Kubernetes pod's own loopback (as
    # private); "loopback": on the host's loopback (other users of the host can connect)
    tunnel_mode: str = ""
    # "netns" only: its tunnel's control socket, from which another node's tunnel on the same host
    # takes sockets in this node's namespace (connections between them then skip the tunnels)
    tunnel_control: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.tf_port}"


@message
class TunnelInfo:
    """A node's tunnel, as its agent started it (tfos.tunnel): the TF process's private network."""

    port: int  # the tunnel's port on the node's host (other nodes' tunnels connect to it)
    mode: str  # "netns", "pod" (a Kubernetes pod's own loopback) or "loopback" (no private namespace: ``reason``)
    control: str  # the tunnel's control socket (private directory)
    block: str  # the cluster's loopback block, e.g. "127.77"
    address: str  # this node's address in the block
    tf_port: int  # where TF listens at that address
    reason: str = ""


@message
class ClusterConfig:
    """Cluster-wide settings, made by the driver at start(); every process of a node reads them."""

    cluster_id: str
    key: ChannelKey
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
    node_output: str = "chief"  # whose printed lines reach the driver's console: chief (rank 0), all, none
    versions: dict[str, str] = field(default_factory=dict)  # the driver's tfos and TensorFlow (executors compare)
    gpus_per_node: tuple[int, ...] = ()  # by node index: how many of its task's GPUs it uses (-1 or absent: all)
    eviction_grace: float = 30.0  # a node agent told to go saves first, up to this long (0: it stops at once)


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
    tunnel: TunnelInfo | None = None  # started by the agent when the cluster is encrypted


@message
class FeedConfig:
    """One train()/inference() feed, as the feeding Spark tasks see it."""

    cluster_id: str
    key: ChannelKey
    driver_host: str
    driver_port: int
    feed_id: str
    qname: str
    feed_timeout: float
    feed_nodes: tuple[int, ...]
    feed_addresses: tuple[tuple[int, str, int], ...]  # (node index, host, feed port)
    chunk_rows: int | None = None
    uneven: str = "drop"  # equal steps on every rank (tfos.data.uneven); "" turns the gate off
    shared_memory: bool = True  # a feeding task on a TF process's host writes into its ring (wire.ring)

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
    cause: Cause = Cause.EXITED  # why it ended; ``reason`` says it in words (EXITED: on its own)
    memory_limit_mb: int = 0  # the memory limit of the agent's container (cgroup; 0: none or unknown)
    oom_killed: bool = False  # the kernel's OOM killer ended a process of that container meanwhile
    peer_failed: bool = False  # its error is a consequence of another rank's failure (exits.caused_by_a_peer)


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
    host: str = ""  # the feeding task's address: a node on the same host is preferred (locality)


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
    output: list[str] = field(default_factory=list)  # lines main_fun printed, when this node streams them


@message
class LogModel:  # TF process -> driver: ctx.log_model(path), the model to log with the run
    cluster_id: str
    node_index: int
    path: str


@message
class CheckpointSaved:  # TF process -> driver: ctx.checkpoint_saved(step): a safe point to resize at
    cluster_id: str
    node_index: int
    step: int = -1  # the program's step or epoch, -1 when it gave none


@message
class FeedPosition:
    """TF process -> driver, with ``ctx.checkpoint_saved(step)`` on every rank: the rows of train feed
    ``feed_id`` this rank had handed to main_fun at ``step``, as ``(epoch, partition, start, end)``
    (:mod:`tfos.data.positions`): a restart from that checkpoint feeds the rest."""

    cluster_id: str
    node_index: int
    feed_id: str
    step: int
    ranges: tuple[tuple[int, int, int, int], ...] = ()


@message
class EvictionNotice:
    """Agent -> driver: this node must go within ``grace`` seconds (a termination signal, its
    executor ending); answered with an EvictionReply: whether the cluster saves first."""

    cluster_id: str
    node_index: int
    grace: float
    why: str
    executor_gone: bool = False  # its executor JVM ended already (Spark no longer counts its slot)


@message
class EvictionReply:
    save: bool  # the training ranks checkpoint at one step first: the agent waits for the driver's stop


@message
class SavePoll:
    """TF process -> driver (``ctx.should_checkpoint``): this rank's last ``step``, and for save
    round ``round`` its ``proposal`` (-1: none yet), the step it waits at until the round's target is
    known. Answered when the round or its target differs from ``round``/``target``, or after
    ``wait`` seconds (at most 10)."""

    cluster_id: str
    node_index: int
    step: int
    round: int = 0
    proposal: int = -1
    target: int = -1
    wait: float = 10.0


@message
class SaveReply:
    round: int  # the save round open now (0: none): every training rank checkpoints at one step
    target: int = -1  # that step, once every rank proposed one (-1: not yet)


@message
class NodeResult:  # TF process -> driver: what main_fun returned (TFDistributor), as tfos.wire.values made it
    cluster_id: str
    node_index: int
    value: Any


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
    dump: int = 0  # > 0: the driver wants every thread's stack of the TF process (request number)


@message
class NodeStacks:
    """Agent -> driver: the TF process's Python stacks (every thread) for stack request ``request``,
    and the node log's last lines."""

    cluster_id: str
    node_index: int
    request: int
    stacks: str
    log_tail: str = ""


@message
class Gather:
    """TF process -> driver: this training rank's ``value`` (and ``text``: a string such as
    ``BarrierTaskContext.allGather``'s message, at most 64 KiB) for the all-gather ``key``; answered
    once every training rank gave its value, or after ``wait`` seconds (at most 10; ask again)."""

    cluster_id: str
    node_index: int
    key: str
    value: int
    wait: float = 5.0
    text: str = ""


@message
class GatherReply:
    values: tuple[int, ...] = ()  # every training rank's value by rank, once all are in (else empty)
    missing: tuple[int, ...] = ()  # the ranks still to give theirs
    texts: tuple[str, ...] = ()  # every training rank's text by rank, with ``values``


@message
class StoreSet:
    """TF process -> driver: one key of a Gloo rendezvous (``tfos.tf.gloo.DriverStore``); ``value``
    is base64. Keys live in a ``scope``: one group of one attempt."""

    cluster_id: str
    node_index: int
    scope: str
    key: str
    value: str


@message
class StoreGet:
    """TF process -> driver: the values of ``keys`` once every one is set (the driver waits up to
    ``wait`` s, at most 10), else the keys still missing."""

    cluster_id: str
    node_index: int
    scope: str
    keys: tuple[str, ...]
    wait: float = 5.0


@message
class StoreAdd:  # TF process -> driver: add ``amount`` to an integer key; the reply's ``number`` is its value
    cluster_id: str
    node_index: int
    scope: str
    key: str
    amount: int


@message
class StoreCompareSet:  # TF process -> driver: ``desired`` if the key holds ``expected``; the reply holds its value
    cluster_id: str
    node_index: int
    scope: str
    key: str
    expected: str
    desired: str


@message
class StoreDelete:  # TF process -> driver; the reply's ``number``: 1 if the key was there, and the scope's key count
    cluster_id: str
    node_index: int
    scope: str
    key: str = ""  # "" deletes nothing: the reply only counts the scope's keys


@message
class StoreReply:
    values: tuple[str, ...] = ()  # base64, in the order asked for (StoreGet once all are set; StoreCompareSet)
    missing: tuple[str, ...] = ()  # StoreGet: the keys not set yet
    number: int = 0  # StoreAdd: the new value; StoreDelete: whether it deleted
    count: int = 0  # StoreDelete: keys left in the scope


@message
class FeedGate:
    """TF process -> driver: may this node take rows up to ``need`` of feed ``feed_id``? The driver
    answers once every node still reading the feed has been sent that many rows, once the feed is
    complete, or after ``wait`` seconds (at most 10), whichever comes first."""

    cluster_id: str
    node_index: int
    feed_id: str
    need: int
    wait: float = 5.0


@message
class FeedLevel:
    """One node's part in levelling a gated train feed's shares at its end (``uneven.level``):
    the rows it sends, its last ones, to nodes short of rows (``give``: node, host, feed port,
    rows), and how many it receives from others (``take``)."""

    give: tuple[tuple[int, str, int, int], ...] = ()
    take: int = 0
    timeout: float = 600.0  # feed_timeout: bounds each send and the wait for the rows to come


@message
class FeedGateReply:
    safe: int  # the fewest rows sent so far to a node still reading this feed
    complete: bool = False  # every row of the feed has been assigned: ``totals`` is final
    totals: tuple[tuple[int, int], ...] = ()  # (node index, rows) of the nodes still reading, when complete
    own: int = -1  # rows the asking node reads, when complete (after levelling: ``level``)
    level: FeedLevel | None = None  # when complete: the asking node's part in levelling the shares


@message
class AssignReply:
    node_index: int  # -1: every node stopped reading; skip the rest of the partition
    pieces: tuple[tuple[int, int], ...] = ()  # (node, rows): the chunk split to keep shares level
    safe: int = 0  # after this assignment, the fewest rows sent to a node still reading (equal steps)


# --------------------------------------------------------------------------- feed channels

@message
class FeedBegin:  # feeding task -> feed hub, then Arrow frames
    feed_id: str
    qname: str
    partition: int
    train: bool
    uneven: str = ""  # the feed's policy for unequal rows per rank ("": no gate)
    ranks: int = 1  # how many nodes this feed feeds (a lone rank needs no gate)
    local: bool = False  # the sender is on the hub's host and asks for a shared-memory ring (FeedRing)
    mapped: tuple[str, ...] = ()  # tokens of the rings the sender has mapped already (lend one of them)


@message
class FeedRing:
    """Feed hub -> feeding task, the answer to a ``FeedBegin(local=True)``: the shared-memory ring
    lent to this connection (:mod:`tfos.wire.ring`), mapped through ``/proc/<pid>/fd/<fd>`` and
    checked by its random ``token`` (hex); ``pid`` 0: none, ``why`` says why (the data then
    travels on the channel)."""

    pid: int = 0
    fd: int = -1
    token: str = ""
    slots: int = 0
    slot_bytes: int = 0
    why: str = ""


@message
class FeedShm:
    """Feeding task -> feed hub, in place of an Arrow data frame: one IPC stream of ``length``
    bytes at ``offset`` of ring slot ``slot``, the slot's write number ``seq``."""

    slot: int
    seq: int
    offset: int
    length: int


@message
class FeedPartitionEnd:
    rows: int


@message
class FeedSafe:
    """Feeding task -> feed hub, before a data frame of a gated train feed: the driver's safe count
    (:class:`AssignReply`'s ``safe``) as of the frame's assignment; the node may take that many rows
    of the feed without asking the driver (equal steps)."""

    safe: int


@message
class FeedAt:
    """Feeding task (or a node levelling a feed's shares) -> feed hub, before a data frame of a train
    feed that may be resumed (restarts allowed): the frame's rows are rows ``offset``.. of
    ``partition`` in epoch ``epoch`` of the feed (:mod:`tfos.data.positions`)."""

    epoch: int
    partition: int
    offset: int


@message
class TunnelOpen:
    """A node's tunnel -> another node's tunnel, the first frame of a relayed connection: join me to
    ``port`` in your node's private network (its TF server, a Gloo listener). Raw bytes follow."""

    port: int


#: feed_id of the FeedEnd the driver sends at shutdown: no more feeds will come.
SHUTDOWN_FEED = "__shutdown__"


@message
class FeedEnd:
    """Driver -> TF process: the feed ``feed_id`` is complete; ``rows`` were sent to you."""

    feed_id: str
    qname: str
    rows: int
    totals: tuple[tuple[int, int], ...] = ()  # (node index, rows) of every node still reading this feed, levelled
    uneven: str = ""  # the feed's policy for unequal rows (a node that got no rows decides by it)
    level: FeedLevel | None = None  # this node's part in levelling the shares (``rows`` is before it)


@message
class FeedAck:
    rows: int
    terminated: bool = False


@message
class FeedResults:
    """TF process -> feeding task (inference): results for the next ``rows`` input rows follow."""

    rows: int

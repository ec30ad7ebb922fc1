"""The driver's control service: rendezvous, node status, heartbeats, feed assignment.

Runs in the Spark driver process as a threaded TCP server. Every connection must pass the
per-cluster secret handshake (tfos.protocol); requests are typed messages, one reply each.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field

from tfos import protocol as P
from tfos.cluster.progress import MAX_EVENTS_PER_NODE
from tfos.errors import AuthenticationError, ProtocolError

logger = logging.getLogger(__name__)


@dataclass
class NodeFailure:
    """Why one node failed, as the driver learned it."""

    node_index: int
    job_name: str
    task_index: int
    host: str
    reason: str
    exit_code: int | None = None
    traceback: str = ""
    log_tail: str = ""
    log_path: str = ""


@dataclass
class _NodeState:
    job_name: str
    task_index: int
    info: dict | None = None  # NodeInfo fields once the TF process registered
    agent: P.AgentStarted | None = None
    last_heartbeat: float = 0.0
    exited: P.NodeExited | None = None
    stop: bool = False
    metrics: dict = field(default_factory=dict)
    events: list = field(default_factory=list)  # timeline events reported by the node


class ClusterState:
    """All the driver knows about its nodes. Thread-safe; waits use one condition."""

    def __init__(self, cluster_id: str, roles: list[tuple[str, int]]):
        self.cluster_id = cluster_id
        self.roles = roles
        self.cond = threading.Condition()
        self.nodes = {i: _NodeState(job, idx) for i, (job, idx) in enumerate(roles)}
        self.failures: list[NodeFailure] = []
        self.feed_rows: dict[str, dict[int, int]] = {}
        self.feed_ranks: list[int] = []  # node indexes that take fed data
        self.feed_terminated: set[int] = set()
        self.abort_reason: str | None = None
        self.on_complete = None  # called once (under the lock) when every node registered -> backend config
        self.backend_config: dict | None = None

    # -- queries
    def host_of(self, i: int) -> str:
        n = self.nodes[i]
        if n.info:
            return n.info["host"]
        return n.agent.host if n.agent else "?"

    def all_registered(self) -> bool:
        return all(n.info is not None for n in self.nodes.values())

    def unfinished(self, which) -> list[int]:
        return [i for i in which if self.nodes[i].exited is None]

    def fail(self, failure: NodeFailure) -> None:
        """Record a failure and ask every node to stop. Caller holds the condition."""
        if any(f.node_index == failure.node_index for f in self.failures):
            return
        logger.error("tfos node %d (%s:%d on %s) failed: %s", failure.node_index, failure.job_name,
                     failure.task_index, failure.host, failure.reason)
        self.failures.append(failure)
        for n in self.nodes.values():
            n.stop = True
        self.cond.notify_all()

    def request_stop(self, which) -> None:
        with self.cond:
            for i in which:
                self.nodes[i].stop = True
            self.cond.notify_all()

    # -- message handlers (called from server threads)
    def handle(self, msg):
        if getattr(msg, "cluster_id", self.cluster_id) != self.cluster_id:
            return P.ErrorReply(f"message for cluster {msg.cluster_id}, this is {self.cluster_id}")
        handler = getattr(self, "_on_" + type(msg).__name__, None)
        if handler is None:
            return P.ErrorReply(f"the driver does not accept {type(msg).__name__}")
        return handler(msg)

    def _node(self, i):
        if i not in self.nodes:
            raise ProtocolError(f"unknown node index {i}")
        return self.nodes[i]

    def _on_RegisterNode(self, msg: P.RegisterNode):
        info = dict(msg.node)
        with self.cond:
            n = self._node(info["node_index"])
            if (info["job_name"], info["task_index"]) != (n.job_name, n.task_index):
                return P.ErrorReply(f"node {info['node_index']} registered as {info['job_name']}:{info['task_index']}, "
                                    f"expected {n.job_name}:{n.task_index}")
            n.info = info
            self.cond.notify_all()
        logger.info("tfos node %d registered: %s:%d at %s:%d", info["node_index"], info["job_name"],
                    info["task_index"], info["host"], info["tf_port"])
        return P.Ack()

    def _on_GetClusterSpec(self, msg: P.GetClusterSpec):
        deadline = time.monotonic() + msg.timeout
        with self.cond:
            while not self.all_registered():
                if self.failures or self.abort_reason or self.nodes[msg.node_index].stop:
                    return P.ErrorReply("cluster start aborted: " + (self.abort_reason or "another node failed"))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = [i for i, n in self.nodes.items() if n.info is None]
                    return P.ErrorReply(f"nodes {missing} did not register within {msg.timeout:.0f}s "
                                        "(raise reservation_timeout)")
                self.cond.wait(min(remaining, 1.0))
            nodes = [self.nodes[i].info for i in sorted(self.nodes)]
            if self.backend_config is None:
                try:
                    self.backend_config = self.on_complete(nodes) if self.on_complete else {}
                except Exception as e:
                    logger.exception("backend setup failed")
                    self.abort_reason = f"backend setup on the driver failed: {e}"
                    self.cond.notify_all()
                    return P.ErrorReply(self.abort_reason)
            return P.ClusterSpecReply(nodes, self.backend_config)

    def _on_AgentStarted(self, msg: P.AgentStarted):
        with self.cond:
            n = self._node(msg.node_index)
            n.agent = msg
            n.last_heartbeat = time.monotonic()
            self.cond.notify_all()
            return P.HeartbeatReply(stop=n.stop)

    def _on_Heartbeat(self, msg: P.Heartbeat):
        with self.cond:
            n = self._node(msg.node_index)
            n.last_heartbeat = time.monotonic()
            return P.HeartbeatReply(stop=n.stop)

    def _on_NodeExited(self, msg: P.NodeExited):
        with self.cond:
            n = self._node(msg.node_index)
            if n.exited is None:
                n.exited = msg
                if (msg.exit_code != 0 or msg.reason) and not (msg.stopped_by_driver or n.stop):
                    reason = ("the TF process raised an exception" if msg.traceback else
                              f"TF process exited with code {msg.exit_code}" +
                              (f" (killed by signal {-msg.exit_code})" if msg.exit_code < 0 else ""))
                    if msg.reason:
                        reason += f"; the node agent stopped it: {msg.reason}"
                    self.fail(NodeFailure(msg.node_index, n.job_name, n.task_index, self.host_of(msg.node_index),
                                          reason, msg.exit_code, msg.traceback, msg.log_tail, msg.log_path))
                self.cond.notify_all()
        return P.Ack()

    def finished_reading(self, i: int) -> bool:
        """Node ``i`` terminated its feed or ended successfully: data for it may be skipped."""
        n = self.nodes[i]
        return i in self.feed_terminated or (n.exited is not None and n.exited.exit_code == 0)

    def _on_AssignChunk(self, msg: P.AssignChunk):
        with self.cond:
            if not self.feed_ranks:
                return P.ErrorReply("no node of this cluster accepts fed data")
            if msg.failed_node >= 0 and not self.finished_reading(msg.failed_node):
                return P.ErrorReply(f"node {msg.failed_node} stopped accepting data without finishing; "
                                    "see the node's log in the driver's error")
            live = [i for i in self.feed_ranks if not self.finished_reading(i)]
            if not live:
                return P.AssignReply(-1)
            counts = self.feed_rows.setdefault(msg.feed_id, {i: 0 for i in self.feed_ranks})
            target = min(live, key=lambda i: (counts[i], i))
            counts[target] += msg.rows
            return P.AssignReply(target)

    def _on_FeedTerminated(self, msg: P.FeedTerminated):
        with self.cond:
            self.feed_terminated.add(msg.node_index)
        logger.info("tfos node %d terminated its feed %r", msg.node_index, msg.qname)
        return P.Ack()

    def _on_Report(self, msg: P.Report):
        with self.cond:
            n = self._node(msg.node_index)
            n.metrics.update(msg.values)
            room = MAX_EVENTS_PER_NODE - len(n.events)
            if room > 0 and msg.events:
                n.events.extend(e for e in msg.events[:room] if isinstance(e, dict))
        return P.Ack()

    # -- liveness
    def check_heartbeats(self, timeout: float) -> None:
        now = time.monotonic()
        with self.cond:
            for i, n in self.nodes.items():
                if n.agent and n.exited is None and now - n.last_heartbeat > timeout:
                    self.fail(NodeFailure(i, n.job_name, n.task_index, self.host_of(i),
                                          f"lost contact with the node agent (no heartbeat for {timeout:.0f}s; "
                                          "its executor may have died). Raise heartbeat_timeout if executors "
                                          "are merely overloaded"))
                    n.exited = P.NodeExited(self.cluster_id, i, -1, "", "", "", False)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        server: ControlServer = self.server  # type: ignore[assignment]
        ch = P.Channel(self.request, f"{self.client_address[0]}:{self.client_address[1]}")
        try:
            ch.server_handshake(server.secret)
        except (AuthenticationError, ProtocolError, OSError) as e:
            logger.warning("tfos control service rejected a connection: %s", e)
            return
        ch.settimeout(None)
        while True:
            try:
                msg = ch.recv()
            except ProtocolError as e:
                if "closed" not in str(e):
                    logger.warning("tfos control service: bad message from %s: %s", ch.peer, e)
                return
            except OSError:
                return
            try:
                reply = server.state.handle(msg)
            except ProtocolError as e:
                reply = P.ErrorReply(str(e))
            except Exception as e:  # never let a handler bug kill the service
                logger.exception("tfos control service failed on %s", type(msg).__name__)
                reply = P.ErrorReply(f"driver error: {e}")
            try:
                ch.send(reply)
            except OSError:
                return


class ControlServer(socketserver.ThreadingTCPServer):
    """Authenticated control endpoint on the driver. The OS picks the port (no race)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, state: ClusterState, secret: str, bind_host: str = "0.0.0.0"):
        self.state = state
        self.secret = secret
        super().__init__((bind_host, 0), _Handler)
        self.port = self.server_address[1]
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"tfos-control-{state.cluster_id}", daemon=True)

    def start(self) -> "ControlServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)


def driver_host(spark_conf_host: str | None) -> str:
    """The address executors use to reach this driver."""
    if spark_conf_host:
        return spark_conf_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"

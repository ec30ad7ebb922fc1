"""Typed clients of the tfos services: one method per request, one place for timeouts.

* :class:`DriverClient`: agents, TF processes and feeding tasks talking to the driver's
  control service. Requests are idempotent, so each opens a fresh authenticated connection
  unless the client was opened for a series of requests (``with client.session():``, one
  thread) or keeps its connection (:meth:`DriverClient.keep_connection`, any thread: the
  heartbeats and progress reports of thousands of nodes cost the driver no handshake each).
* :class:`FeedClient`: a feeding task's connection to one TF process's feed hub;
  :func:`end_feed`: the driver telling a hub that a feed is complete.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading

from tfos.errors import ProtocolError, RequestRefused, TFOSTimeoutError
from tfos.wire import messages as M
from tfos.wire.channel import Channel


UNREACHABLE_DRIVER = ("this host cannot reach the driver at that address: set TFOS_SERVER_HOST (or spark.driver.host "
                      "for a classic driver; TFOS_ADVERTISE_HOST when only the advertised address differs, e.g. behind "
                      "NAT) to an address of the driver - the Spark Connect client under Connect - that executors can "
                      "reach")


class DriverClient:
    def __init__(self, host: str, port: int, key: M.ChannelKey, cluster_id: str, node_index: int = -1):
        self.host = host
        self.port = port
        self.key = key
        self.cluster_id = cluster_id
        self.node_index = node_index
        self._ch: Channel | None = None
        self._keep = False  # keep_connection(): one connection, reopened after a failure
        self._kept_lock = threading.Lock()  # a kept connection carries one request at a time

    @classmethod
    def for_node(cls, cfg: M.NodeConfig) -> "DriverClient":
        c = cfg.cluster
        return cls(c.driver_host, c.driver_port, c.key, c.cluster_id, cfg.node_index)

    @classmethod
    def for_feed(cls, cfg: M.FeedConfig) -> "DriverClient":
        return cls(cfg.driver_host, cfg.driver_port, cfg.key, cfg.cluster_id)

    # -- transport
    @contextlib.contextmanager
    def session(self, timeout: float = 60.0):
        """Keep one connection open for the requests made inside the block."""
        self._ch = Channel.connect(self.host, self.port, self.key, timeout=timeout, what="tfos driver",
                                   unreachable_hint=UNREACHABLE_DRIVER)
        self._ch.settimeout(timeout)
        try:
            yield self
        finally:
            self._ch.close()
            self._ch = None

    def keep_connection(self) -> "DriverClient":
        """Send this client's requests over one connection from now on, reopened on the next request
        after a failure, until :meth:`close`; threads take turns. The node agent's heartbeats go
        this way (the driver takes the connection's end, with no heartbeat after it, as the end of
        the agent), and so do the TF process's progress reports."""
        self._keep = True
        return self

    def close(self) -> None:
        ch, self._ch = self._ch, None
        if ch is not None:
            ch.close()

    def _request(self, msg, timeout: float = 10.0, setting: str = ""):
        if self._keep:
            with self._kept_lock:
                return self._exchange(msg, timeout, setting)
        if self._ch is not None:  # inside session(): its connection, its timeout
            return self._ch.request(msg)
        return self._exchange(msg, timeout, setting)

    def _exchange(self, msg, timeout: float, setting: str):
        ch = self._ch or Channel.connect(self.host, self.port, self.key, timeout=min(timeout, 30.0),
                                         what="tfos driver", setting=setting, unreachable_hint=UNREACHABLE_DRIVER)
        if self._keep:
            self._ch = ch
        ch.settimeout(timeout)
        ok = False
        try:
            reply = ch.request(msg)
            ok = True
            return reply
        except socket.timeout:
            hint = f"; raise {setting}" if setting else ""
            raise TFOSTimeoutError(f"no answer from the tfos driver at {self.host}:{self.port} within "
                                   f"{timeout:.0f}s{hint}") from None
        finally:
            # one request per connection, or a kept one that failed (its framing is no longer known):
            # the next request connects afresh
            if not (self._keep and ok):
                if ch is self._ch:
                    self._ch = None
                ch.close()

    def local_address(self) -> str:
        """This end's address of the open session (the interface this host reaches the driver on), or ""."""
        try:
            return self._ch.sock.getsockname()[0] if self._ch is not None else ""
        except OSError:
            return ""

    # -- TF process
    def register(self, node: M.NodeInfo) -> None:
        self._request(M.RegisterNode(self.cluster_id, node), timeout=30.0)

    def cluster_spec(self, timeout: float) -> M.ClusterSpecReply:
        """Wait (server side, up to ``timeout``) until every node registered."""
        return self._request(M.GetClusterSpec(self.cluster_id, self.node_index, timeout), timeout=timeout + 30.0,
                             setting="reservation_timeout")

    def report(self, values: dict, events: list, history: list | None = None, output: list | None = None) -> None:
        self._request(M.Report(self.cluster_id, self.node_index, values, events, history or [], output or []))

    def log_model(self, path: str) -> None:
        self._request(M.LogModel(self.cluster_id, self.node_index, path))

    def checkpoint_saved(self, step: int) -> None:
        self._request(M.CheckpointSaved(self.cluster_id, self.node_index, step))

    def feed_position(self, feed_id: str, step: int, ranges: tuple) -> None:
        """The rows of ``feed_id`` this rank had handed to main_fun at checkpoint ``step``."""
        self._request(M.FeedPosition(self.cluster_id, self.node_index, feed_id, int(step), tuple(ranges)))

    def save_poll(self, step: int, round_: int, proposal: int, target: int, wait: float = 10.0) -> M.SaveReply:
        """This rank's step (and its proposal for save round ``round_``); the driver answers when its
        save round or target differs from ``round_``/``target``, or after ``wait`` s (at most 10)."""
        wait = min(max(wait, 0.0), 10.0)
        return self._request(M.SavePoll(self.cluster_id, self.node_index, int(step), round_, int(proposal), target,
                                        wait), timeout=wait + 30.0)

    def send_result(self, tree) -> None:
        """``tree``: a value as :func:`tfos.wire.values.encode` made it."""
        self._request(M.NodeResult(self.cluster_id, self.node_index, tree))

    def node_failure(self, node_index: int, wait: float) -> str:
        """The driver's account of ``node_index``'s failure (it waits up to ``wait`` s, at most
        10), or "" when it knows of none."""
        wait = min(max(wait, 0.0), 10.0)
        return self._request(M.GetNodeFailure(self.cluster_id, node_index, wait), timeout=wait + 10.0).text

    def feed_terminated(self, qname: str) -> None:
        self._request(M.FeedTerminated(self.cluster_id, self.node_index, qname))

    def gather(self, key: str, value: int, wait: float = 5.0, text: str = "") -> M.GatherReply:
        """Give this rank's ``value`` (and ``text``) for all-gather ``key``; the driver answers with
        every rank's once all are in (it waits up to ``wait`` s for them), else with the ranks still
        missing."""
        return self._request(M.Gather(self.cluster_id, self.node_index, key, int(value), wait, text),
                             timeout=wait + 30.0)

    def feed_gate(self, feed_id: str, need: int, wait: float = 5.0) -> M.FeedGateReply:
        """The driver's safe row count of a feed for this node (waits server side up to ``wait`` s
        for it to reach ``need``); ``complete`` with the live nodes' totals once the feed is."""
        return self._request(M.FeedGate(self.cluster_id, self.node_index, feed_id, need, wait), timeout=wait + 30.0)

    # -- Gloo's rendezvous store (tfos.tf.gloo.DriverStore); values are base64
    def store_set(self, scope: str, key: str, value: str) -> None:
        self._request(M.StoreSet(self.cluster_id, self.node_index, scope, key, value))

    def store_get(self, scope: str, keys, wait: float) -> M.StoreReply:
        return self._request(M.StoreGet(self.cluster_id, self.node_index, scope, tuple(keys), wait),
                             timeout=wait + 30.0)

    def store_add(self, scope: str, key: str, amount: int) -> int:
        return self._request(M.StoreAdd(self.cluster_id, self.node_index, scope, key, int(amount))).number

    def store_compare_set(self, scope: str, key: str, expected: str, desired: str) -> str:
        return self._request(M.StoreCompareSet(self.cluster_id, self.node_index, scope, key, expected,
                                               desired)).values[0]

    def store_delete(self, scope: str, key: str) -> M.StoreReply:
        return self._request(M.StoreDelete(self.cluster_id, self.node_index, scope, key))

    # -- agent
    def agent_started(self, host: str, agent_pid: int, tf_pid: int, log_path: str) -> bool:
        """Returns True if the driver already asked this node to stop."""
        return self._request(M.AgentStarted(self.cluster_id, self.node_index, host, agent_pid, tf_pid,
                                            log_path)).stop

    def heartbeat(self, timeout: float = 5.0) -> bool:
        """Returns True when the driver asks this node to stop."""
        return self.heartbeat_reply(timeout).stop

    def heartbeat_reply(self, timeout: float = 5.0) -> M.HeartbeatReply:
        """The driver's answer: whether to stop, and whether it wants the TF process's stacks."""
        return self._request(M.Heartbeat(self.cluster_id, self.node_index), timeout=timeout)

    def eviction_notice(self, grace: float, why: str, executor_gone: bool = False) -> bool:
        """This node must go within ``grace`` s (``executor_gone``: its executor ended already); True
        when the cluster saves first (wait for the stop)."""
        return self._request(M.EvictionNotice(self.cluster_id, self.node_index, float(grace), why, executor_gone),
                             timeout=min(max(grace, 1.0), 5.0)).save

    def node_stacks(self, request: int, stacks: str, log_tail: str) -> None:
        self._request(M.NodeStacks(self.cluster_id, self.node_index, request, stacks, log_tail), timeout=10.0)

    def node_exited(self, exit_code: int, traceback: str, log_tail: str, log_path: str,
                    stopped_by_driver: bool, reason: str, retryable: bool = True, timeout: float = 10.0,
                    peak_rss_mb: int = 0, cause: M.Cause = M.Cause.EXITED, memory_limit_mb: int = 0,
                    oom_killed: bool = False, peer_failed: bool = False) -> None:
        self._request(M.NodeExited(self.cluster_id, self.node_index, exit_code, traceback, log_tail, log_path,
                                   stopped_by_driver, reason, retryable, peak_rss_mb, cause, memory_limit_mb,
                                   oom_killed, peer_failed), timeout=timeout)

    # -- feeding task
    def assign_chunk(self, feed_id: str, rows: int, failed_node: int = -1, partition: int = -1,
                     columns: tuple[M.Column, ...] | None = None) -> list[tuple[int, int]]:
        """Where the next ``rows`` rows go: ``[(node, rows)]`` in order, one piece or several (the
        driver levels the nodes' shares); empty when every node stopped reading. With ``columns``
        (a partition's first chunk) the driver also checks them against the feed's."""
        return self.place_chunk(feed_id, rows, failed_node, partition, columns)[0]

    def place_chunk(self, feed_id: str, rows: int, failed_node: int = -1, partition: int = -1,
                    columns: tuple[M.Column, ...] | None = None) -> tuple[list[tuple[int, int]], int]:
        """:meth:`assign_chunk`'s pieces, and the feed's safe count after this assignment (the
        fewest rows sent to a node still reading: what every node may take under equal steps)."""
        reply = self._request(M.AssignChunk(self.cluster_id, feed_id, rows, failed_node, partition, columns,
                                            self.local_address()))
        if reply.node_index < 0:
            return [], reply.safe
        return list(reply.pieces) or [(reply.node_index, rows)], reply.safe


class FeedClient:
    """A feeding task's stream of one partition into one node's feed hub."""

    def __init__(self, node: int, host: str, port: int, key: M.ChannelKey, timeout: float):
        self.node = node
        self.address = f"{host}:{port}"
        self.timeout = timeout
        self.ch = Channel.connect(host, port, key, timeout=min(60.0, timeout), what=f"feed of node {node}",
                                  setting="feed_timeout", retry=False)
        self.ch.settimeout(timeout)

    def begin(self, feed_id: str, qname: str, partition: int, train: bool, uneven: str = "",
              ranks: int = 1, local: bool = False, mapped=()) -> M.FeedRing | None:
        """Start a partition's stream; with ``local`` (the hub is on this host) ask for a
        shared-memory ring, preferably one of ``mapped`` (tokens), and return the hub's answer
        (:mod:`tfos.wire.ring`)."""
        self.ch.send(M.FeedBegin(feed_id, qname, partition, train, uneven, ranks, local, tuple(mapped)))
        if not local:
            return None
        reply = self.next_reply()
        if not isinstance(reply, M.FeedRing):
            raise ProtocolError(f"expected FeedRing, got {type(reply).__name__}")
        return reply

    def send_batch(self, ipc_payload) -> None:
        self.ch.send_data(ipc_payload)

    def send_shm(self, slot: int, seq: int, offset: int, length: int) -> None:
        """A chunk written into the ring's ``slot`` (in place of :meth:`send_batch`)."""
        self.ch.send(M.FeedShm(slot, seq, offset, length))

    def send_at(self, epoch: int, partition: int, offset: int) -> None:
        """Where the next data frame's rows come from (a train feed that may be resumed)."""
        self.ch.send(M.FeedAt(epoch, partition, offset))

    def send_safe(self, safe: int) -> None:
        """The driver's safe count, ahead of the next data frame (a gated train feed)."""
        self.ch.send(M.FeedSafe(safe))

    def writable(self) -> bool:
        """The connection takes a small frame now without blocking (its hub is not backed up)."""
        try:
            return bool(select.select([], [self.ch.sock], [], 0)[1])
        except (OSError, ValueError):
            return False

    def end_partition(self, rows: int) -> None:
        self.ch.send(M.FeedPartitionEnd(rows))

    def next_reply(self):
        """The hub's next answer: a FeedAck, or (inference) ``(FeedResults, ipc_bytes)``; an ErrorReply
        raises RequestRefused."""
        msg = self.ch.recv()
        if isinstance(msg, M.FeedResults):
            return msg, self.ch.recv_frame()[1]
        if isinstance(msg, M.ErrorReply):
            raise RequestRefused(msg.message)
        return msg

    def refusal(self) -> str | None:
        """After a failed send: the hub's ErrorReply, if it answered before closing (else None)."""
        try:
            self.ch.settimeout(2.0)
            reply = self.ch.recv()
        except (OSError, ProtocolError):
            return None
        return reply.message if isinstance(reply, M.ErrorReply) else None

    def shutdown_io(self) -> None:
        """Wake a reader blocked on this connection (the sender thread failed)."""
        try:
            self.ch.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.ch.close()


def end_feed(host: str, port: int, key: M.ChannelKey, node: int, feed_id: str, qname: str, rows: int,
             timeout: float, setting: str = "feed_timeout", while_waiting=None, totals=(),
             uneven: str = "", level: M.FeedLevel | None = None) -> M.FeedAck:
    """Tell node ``node``'s feed hub that feed ``feed_id`` is complete (``rows`` were sent to it;
    ``totals``: (node, rows) of every node still reading it); returns once the hub queued the end
    marker (which waits for room in a full queue). While waiting, ``while_waiting()`` runs every
    half second and may raise to give up early."""
    with Channel.connect(host, port, key, timeout=min(timeout, 30.0), what=f"feed of node {node}",
                         setting=setting, retry=False) as ch:
        ch.settimeout(timeout)
        try:
            return ch.request(M.FeedEnd(feed_id, qname, rows, tuple(totals), uneven, level), while_waiting)
        except socket.timeout:
            raise TFOSTimeoutError(f"the feed of node {node} at {host}:{port} did not answer within "
                                   f"{timeout:.0f}s; raise {setting}") from None

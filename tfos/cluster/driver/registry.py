"""The driver's registry of nodes: registration, the cluster spec rendezvous, agent liveness,
exits and failures, reported metrics (runs on the driver).

Thread-safe. Its lock is its own: other modules wait with :meth:`NodeRegistry.wait_until` (one
deadline, a timeout that names the setting) and read with :meth:`NodeRegistry.snapshot` (a
consistent, immutable copy), and change state only through its methods.

One module past 450 lines: every handler mutates the same node states under the one lock; the
rendezvous store is already its own module (``rendezvous``) and the pure liveness rule lives in
``lifecycle``; what stays here is the state and its lock, which must not be split.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field

from tfos import topology
from tfos.cluster.driver.lifecycle import agent_lost, exit_reason, failure_cause, shows_progress
from tfos.cluster.driver.evictions import SaveRounds
from tfos.cluster.driver.rendezvous import RendezvousStore
from tfos.errors import Cause, NodeFailure, ProtocolError, TFOSTimeoutError, format_failures
from tfos.host.deadline import Deadline
from tfos.wire import messages as M
from tfos.wire import values

logger = logging.getLogger(__name__)

#: Bound on timeline events kept per node on the driver.
MAX_EVENTS_PER_NODE = 200000
#: ... and on all nodes' together (about 200 bytes each): thousands of nodes do not fill the memory
MAX_EVENTS = 2_000_000
GATHER_TEXT_MAX = 65536  # characters of one rank's text in an all-gather (BarrierTaskContext.allGather)


@dataclass
class NodeState:
    job_name: str
    task_index: int
    info: M.NodeInfo | None = None  # once the TF process registered
    agent: M.AgentStarted | None = None
    last_heartbeat: float = 0.0
    disconnected_at: float | None = None  # when the agent's heartbeat connection closed (monotonic)
    exited: M.NodeExited | None = None
    stop: bool = False
    metrics: dict = field(default_factory=dict)
    events: list = field(default_factory=list)  # timeline events reported by the node
    progress_at: float | None = None  # when a report last showed progress (monotonic)
    stacks: M.NodeStacks | None = None  # the answer to the latest stack request


@dataclass(frozen=True)
class Snapshot:
    """The registry at one instant (:meth:`NodeRegistry.snapshot`)."""

    failures: tuple[NodeFailure, ...]
    lost: tuple[int, ...]
    abort_reason: str | None
    exited: dict  # node index -> its M.NodeExited, or None while it runs
    registered: frozenset  # nodes whose TF process registered
    started: frozenset  # nodes whose agent or TF process was heard from
    stopping: frozenset  # nodes asked to stop

    def unfinished(self, which) -> list[int]:
        return [i for i in which if self.exited[i] is None]

    def all_registered(self) -> bool:
        return len(self.registered) == len(self.exited)

    def missing(self) -> list[int]:
        return [i for i in sorted(self.exited) if i not in self.registered]

    def ended_ok(self, i: int) -> bool:
        """Node ``i`` exited with code 0."""
        return self.exited[i] is not None and self.exited[i].exit_code == 0


def timeline_room(node_events: int, all_events: int) -> int:
    """Pure: how many more timeline events a node may add, with ``node_events`` of its own and
    ``all_events`` kept in all (MAX_EVENTS_PER_NODE, MAX_EVENTS)."""
    return max(0, min(MAX_EVENTS_PER_NODE - node_events, MAX_EVENTS - all_events))


class NodeRegistry:
    def __init__(self, cluster_id: str, roles: list[tuple[str, int]], max_wait: float = 600.0):
        self.cluster_id = cluster_id
        self.max_wait = max_wait  # server-side bound of a GetClusterSpec wait, whatever the client asks
        self.roles = roles
        self._lock = lock = threading.RLock()
        self.cond = threading.Condition(lock)  # any change of the registry
        # the nodes waiting for the cluster spec only: woken once the spec is set or the start is
        # aborted, not at every registration (thousands of waiters would each wake N times)
        self._spec_cond = threading.Condition(lock)
        self._spec: M.Encoded | None = None  # the cluster spec reply, encoded once per attempt
        self.nodes = {i: NodeState(job, idx) for i, (job, idx) in enumerate(roles)}
        # counts the changes of which nodes are registered or running (a registration, an exit, a new
        # attempt): a reader that keeps something derived from them (the feed scheduler's live
        # nodes) recomputes it only when this moved
        self.version = 0
        self.events_kept = 0  # timeline events of this attempt's nodes (timeline_room)
        self.failures: list[NodeFailure] = []  # not yet acted on by the supervisor's loop, or fatal
        self.lost: list[int] = []  # nodes the run goes on without (the supervisor's :meth:`lose`)
        self.abort_reason: str | None = None
        self.backend_config: dict | None = None  # the backend's setup() for this attempt (the supervisor's loop)
        self.on_history = None  # (node_index, [ctx.report entries]) -> None: the MLflow run's metrics
        self.on_output = None  # (node_index, [printed lines]) -> None: the driver's console
        self.model_paths: dict[int, str] = {}  # ctx.log_model(path), by node
        self.results: dict[int, object] = {}  # what main_fun returned (ctx.send_result), by node, this attempt
        self.checkpoint: tuple[float, int] | None = None  # rank 0's last ctx.checkpoint_saved: (monotonic, step)
        self.stack_request = 0  # the latest request for every TF process's stacks (0: none yet)
        self.gathers: dict[str, dict[int, int]] = {}  # all-gather key -> {training rank: value}
        self.store = RendezvousStore()  # Gloo's rendezvous (tfos.tf.gloo.DriverStore); emptied per attempt
        self.saves = SaveRounds(self)  # saving before an eviction (ctx.should_checkpoint); its own lock

    # -- waiting and reading, for every other module
    def wait_until(self, predicate, timeout: float | None, what: str = "", setting: str | None = None,
                   poll: float | None = None) -> bool:
        """Block until ``predicate(snapshot)`` holds; True then. It is checked after every change of
        the registry, and every ``poll`` seconds too when it also watches something outside (a
        Spark job's end; :meth:`notify` wakes it sooner). ``timeout`` None: no deadline of its
        own (only for a predicate that watches something with one). After ``timeout`` seconds it
        raises TFOSTimeoutError saying ``what`` did not happen and naming ``setting``, the setting
        that raises the limit; without ``setting`` it returns False."""
        deadline = None if timeout is None else Deadline(max(0.0, timeout))
        with self.cond:
            while not predicate(self.snapshot()):
                remaining = None if deadline is None else deadline.remaining()
                if remaining is not None and remaining <= 0:
                    if setting is None:
                        return False
                    text = what(self.snapshot()) if callable(what) else what
                    raise TFOSTimeoutError(f"{text} after {timeout:.0f}s; raise {setting}")
                waits = [w for w in (remaining, poll) if w is not None]
                self.cond.wait(min(waits) if waits else 1.0)
        return True

    def notify(self) -> None:
        """Wake every :meth:`wait_until` to check its predicate again."""
        with self.cond:
            self.cond.notify_all()

    def _notify_all(self) -> None:
        """A change that may end the cluster-spec waits too (a failure, an abort, a stop, the spec).
        Caller holds the lock."""
        self.cond.notify_all()
        self._spec_cond.notify_all()

    def snapshot(self) -> Snapshot:
        with self.cond:
            nodes = self.nodes
            return Snapshot(tuple(self.failures), tuple(self.lost), self.abort_reason,
                            {i: n.exited for i, n in nodes.items()},
                            frozenset(i for i, n in nodes.items() if n.info is not None),
                            frozenset(i for i, n in nodes.items() if n.info is not None or n.agent is not None),
                            frozenset(i for i, n in nodes.items() if n.stop))

    def peers_running(self, node_index: int) -> int:
        """Other nodes of ``node_index``'s role still running and not asked to stop."""
        with self.cond:
            job = self.nodes[node_index].job_name
            return sum(1 for i, n in self.nodes.items()
                       if n.job_name == job and i != node_index and n.exited is None and not n.stop)

    # -- queries (callers hold ``cond`` where consistency matters)
    def node(self, i) -> NodeState:
        if not isinstance(i, int) or i not in self.nodes:
            raise ProtocolError(f"unknown node index {i!r}")
        return self.nodes[i]

    def host_of(self, i: int) -> str:
        n = self.nodes[i]
        if n.info:
            return n.info.host
        return n.agent.host if n.agent else "?"

    def all_registered(self) -> bool:
        return all(n.info is not None for n in self.nodes.values())

    def missing(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.info is None]

    def unfinished(self, which) -> list[int]:
        with self.cond:
            return [i for i in which if self.nodes[i].exited is None]

    def registered(self) -> list[M.NodeInfo]:
        with self.cond:
            return [n.info for _, n in sorted(self.nodes.items()) if n.info]

    def started(self, which) -> list[int]:
        with self.cond:
            return [i for i in which if self.nodes[i].agent or self.nodes[i].info]

    # -- state changes
    def fail(self, failure: NodeFailure) -> None:
        """Record a node's failure (once per node); the supervisor's loop decides what it means."""
        with self.cond:
            if any(f.node_index == failure.node_index for f in self.failures) or failure.node_index in self.lost:
                return
            logger.error("tfos node %d (%s:%d on %s) failed: %s", failure.node_index, failure.job_name,
                         failure.task_index, failure.host, failure.reason)
            self.failures.append(failure)
            self._notify_all()

    def lose(self, node_index: int) -> None:
        """The run goes on without failed node ``node_index``: it is listed in ``lost``, not ``failures``."""
        with self.cond:
            self.failures = [f for f in self.failures if f.node_index != node_index]
            if node_index not in self.lost:
                self.lost.append(node_index)
            self.cond.notify_all()

    def set_backend_config(self, config: dict | None, error: str = "") -> None:
        """The backend's setup for this attempt's nodes (computed by the supervisor outside this
        lock): the cluster-spec waiters get it; with ``error`` they get the error instead."""
        with self.cond:
            if error:
                self.abort_reason = self.abort_reason or error
            else:
                self.backend_config = dict(config or {})
            self._spec = None
            self._notify_all()

    def abort(self, reason: str) -> None:
        with self.cond:
            self.abort_reason = self.abort_reason or reason
            self._notify_all()

    def exit_failure(self, i: int) -> NodeFailure:
        """The failure that node ``i``'s exit report describes. Caller holds the condition."""
        n, msg = self.nodes[i], self.nodes[i].exited
        reason = exit_reason(msg.exit_code, bool(msg.traceback), msg.reason, msg.peak_rss_mb, msg.memory_limit_mb,
                             msg.oom_killed)
        return NodeFailure(i, n.job_name, n.task_index, self.host_of(i), reason, msg.exit_code, msg.traceback,
                           msg.log_tail, msg.log_path, retryable=msg.retryable,
                           cause=failure_cause(msg.exit_code, bool(msg.traceback), msg.cause),
                           peer_failed=msg.peer_failed)

    def ended_on_their_own(self) -> list[NodeFailure]:
        """Nodes that failed by themselves after the first failure made the driver stop them all
        (a peer killed mid-collective: the survivor's exception can arrive first)."""
        with self.cond:
            known = {f.node_index for f in self.failures} | set(self.lost)
            return [self.exit_failure(i) for i, n in sorted(self.nodes.items())
                    if i not in known and n.exited is not None and n.agent is not None
                    and not n.exited.stopped_by_driver and _failed(n.exited)]

    def new_attempt(self, cluster_id: str, roles, unless=None) -> bool:
        """Forget the nodes of the previous attempt (a restart): fresh node states under a new
        cluster id, so the control service refuses whatever the old attempt's processes still send.
        Does nothing and returns False when ``unless()``, checked under the lock, is true."""
        with self.cond:
            if unless is not None and unless():
                return False
            self.cluster_id = cluster_id
            self.roles = list(roles)
            self.nodes = {i: NodeState(job, idx) for i, (job, idx) in enumerate(self.roles)}
            self.version += 1
            self.events_kept = 0
            self.failures = []
            self.lost = []
            self.abort_reason = None
            self.backend_config = None
            self.gathers = {}
            self.results = {}
            self.checkpoint = None
            self.store.clear()
            self.saves.new_attempt()  # its lock after this one: it never takes this one under its own
            self._spec = None
            self._notify_all()
        return True

    def indexes(self) -> list[int]:
        """This attempt's node indexes."""
        with self.cond:
            return sorted(self.nodes)

    def request_stop(self, which) -> None:
        with self.cond:
            for i in which:
                self.nodes[i].stop = True
            self._notify_all()

    # -- control service handlers (server threads)
    def on_register(self, msg: M.RegisterNode):
        info = msg.node
        with self.cond:
            n = self.node(info.node_index)
            if (info.job_name, info.task_index) != (n.job_name, n.task_index):
                return M.ErrorReply(f"node {info.node_index} registered as {info.job_name}:{info.task_index}, "
                                    f"expected {n.job_name}:{n.task_index}")
            if n.info is not None and (n.info.host, n.info.pid) != (info.host, info.pid):
                return self._second_copy(info.node_index, f"TF process {info.pid} on {info.host}",
                                         f"TF process {n.info.pid} on {n.info.host}")
            n.info = info
            self.version += 1
            self._spec = None
            self.cond.notify_all()
        logger.info("tfos node %d registered: %s:%d at %s:%d", info.node_index, info.job_name, info.task_index,
                    info.host, info.tf_port)
        return M.Ack()

    def _second_copy(self, i: int, new: str, first: str):
        """Refuse a second copy of node ``i`` (a barrier stage retried by Spark) and fail the cluster:
        the first copy may still be running, and two copies of one rank corrupt training.
        Caller holds the condition."""
        self.fail(NodeFailure(i, self.nodes[i].job_name, self.nodes[i].task_index, self.host_of(i),
                              f"Spark started this node a second time ({new}; the first is {first}): the tfos "
                              "barrier stage was retried (spark.task.maxFailures > 1) after a task failed. tfos "
                              "never runs two copies of a node; see the first failure", cause=Cause.DUPLICATE))
        return M.ErrorReply(f"node {i} is already running ({first}); a retried Spark task may not start a second "
                            "copy")

    def on_cluster_spec(self, msg: M.GetClusterSpec):
        """The cluster spec, once every node registered and the supervisor set up the backend (it
        wakes this wait; registrations do not). Encoded once per attempt for all the nodes."""
        wait = max(0.0, min(msg.timeout, self.max_wait))
        deadline = Deadline(wait)
        with self.cond:
            me = self.node(msg.node_index)
            while self.backend_config is None:
                if self.failures or self.abort_reason or me.stop:
                    return M.ErrorReply("cluster start aborted: " + (self.abort_reason or "another node failed"))
                if deadline.expired():
                    return M.ErrorReply(f"nodes {self.missing()} did not register within {wait:.0f}s "
                                        "(raise reservation_timeout)")
                self._spec_cond.wait(deadline.slice(5.0))
            if self._spec is None:
                nodes = tuple(self.nodes[i].info for i in sorted(self.nodes))
                self._spec = M.Encoded(M.ClusterSpecReply(nodes, self.backend_config))
            return self._spec

    def on_agent_started(self, msg: M.AgentStarted):
        with self.cond:
            n = self.node(msg.node_index)
            if n.agent is not None and (n.agent.host, n.agent.agent_pid) != (msg.host, msg.agent_pid):
                return self._second_copy(msg.node_index, f"agent {msg.agent_pid} on {msg.host}",
                                         f"agent {n.agent.agent_pid} on {n.agent.host}")
            n.agent = msg
            n.last_heartbeat = time.monotonic()
            self.cond.notify_all()
            return M.HeartbeatReply(stop=n.stop)

    def on_heartbeat(self, msg: M.Heartbeat):
        with self.cond:
            n = self.node(msg.node_index)
            n.last_heartbeat = time.monotonic()
            answered = n.stacks is not None and n.stacks.request == self.stack_request
            return M.HeartbeatReply(stop=n.stop, dump=0 if answered else self.stack_request)

    def on_gather(self, msg: M.Gather):
        """A training rank's value for an all-gather (``ctx.all_gather``): every rank's, by rank,
        once all are in; else after ``wait`` seconds the ranks still missing."""
        rank = topology.training_rank(*self.roles[msg.node_index], self.roles) if 0 <= msg.node_index < len(
            self.roles) else None
        if rank is None:
            raise ProtocolError(f"node {msg.node_index} is not a training rank: it takes no part in all-gathers")
        if len(msg.text) > GATHER_TEXT_MAX:
            return M.ErrorReply(f"an all-gather's text is at most {GATHER_TEXT_MAX} characters, got {len(msg.text)}")
        size = topology.num_training_nodes(self.roles)
        with self.cond:
            if msg.key not in self.gathers and len(self.gathers) >= 1024:
                return M.ErrorReply("too many all-gathers in one attempt (at most 1024 keys)")
            values = self.gathers.setdefault(msg.key, {})
            values[rank] = (msg.value, msg.text)
            self.cond.notify_all()
            self.cond.wait_for(lambda: len(values) == size, timeout=min(max(msg.wait, 0.0), 10.0))
            if len(values) < size:
                return M.GatherReply((), tuple(r for r in range(size) if r not in values))
            return M.GatherReply(tuple(values[r][0] for r in range(size)), texts=tuple(values[r][1] for r in range(size)))

    # Gloo's rendezvous: the store has its own lock (a wait for a key holds no registry lock)
    def on_store_set(self, msg: M.StoreSet):
        self.node(msg.node_index)
        self.store.set(msg.scope, msg.key, _unb64(msg.value))
        return M.StoreReply()

    def on_store_get(self, msg: M.StoreGet):
        self.node(msg.node_index)
        values, missing = self.store.get(msg.scope, msg.keys, msg.wait)
        return M.StoreReply(missing=tuple(missing)) if values is None else M.StoreReply(tuple(map(_b64, values)))

    def on_store_add(self, msg: M.StoreAdd):
        self.node(msg.node_index)
        return M.StoreReply(number=self.store.add(msg.scope, msg.key, msg.amount))

    def on_store_compare_set(self, msg: M.StoreCompareSet):
        self.node(msg.node_index)
        return M.StoreReply((_b64(self.store.compare_set(msg.scope, msg.key, _unb64(msg.expected),
                                                         _unb64(msg.desired))),))

    def on_store_delete(self, msg: M.StoreDelete):
        self.node(msg.node_index)
        deleted = bool(msg.key) and self.store.delete(msg.scope, msg.key)
        return M.StoreReply(number=int(deleted), count=self.store.num_keys(msg.scope))

    def on_node_stacks(self, msg: M.NodeStacks):
        with self.cond:
            n = self.node(msg.node_index)
            if msg.request == self.stack_request:
                n.stacks = msg
                self.cond.notify_all()
        return M.Ack()

    def collect_stacks(self, timeout: float) -> dict[int, M.NodeStacks]:
        """Ask every running node's agent for its TF process's stacks (through the heartbeat
        replies) and wait up to ``timeout`` for the answers; the answers by node."""
        with self.cond:
            self.stack_request += 1
            request = self.stack_request

            def answered():
                return {i: n.stacks for i, n in self.nodes.items() if n.stacks and n.stacks.request == request}

            running = [i for i, n in self.nodes.items() if n.agent and n.exited is None]
            self.cond.wait_for(lambda: set(running) <= set(answered()), timeout)
            return answered()

    def last_progress(self, which) -> float | None:
        """When the most recent progress of any of ``which`` nodes was reported (monotonic), None
        while none has reported any."""
        with self.cond:
            times = [self.nodes[i].progress_at for i in which if self.nodes[i].progress_at is not None]
            return max(times) if times else None

    def on_node_exited(self, msg: M.NodeExited):
        with self.cond:
            n = self.node(msg.node_index)
            if n.exited is None:
                n.exited = msg
                self.version += 1
                if _failed(msg) and not (msg.stopped_by_driver or n.stop):
                    self.fail(self.exit_failure(msg.node_index))
                self.cond.notify_all()
        return M.Ack()

    def on_report(self, msg: M.Report):
        with self.cond:
            n = self.node(msg.node_index)
            if msg.history or shows_progress(n.metrics, msg.values):
                n.progress_at = time.monotonic()
            n.metrics.update(msg.values)
            room = timeline_room(len(n.events), self.events_kept)
            if room > 0 and msg.events:
                n.events.extend(msg.events[:room])
                self.events_kept += min(room, len(msg.events))
            listener, printer = self.on_history, self.on_output
        if msg.history and listener is not None:
            listener(msg.node_index, msg.history)
        if msg.output and printer is not None:
            printer(msg.node_index, msg.output)
        return M.Ack()

    def on_get_node_failure(self, msg: M.GetNodeFailure):
        """A feeding task lost its node: the node's failure, once the driver knows it (bounded wait)."""
        wait = min(max(float(msg.wait), 0.0), 10.0)
        i = msg.node_index

        def found() -> list[NodeFailure]:  # the node's own failure, else the failures the driver stopped it for
            own = [f for f in self.failures if f.node_index == i]
            return own or (list(self.failures) if self.nodes[i].stop else [])

        with self.cond:
            self.node(i)
            self.cond.wait_for(lambda: bool(found()), timeout=wait)
            failures = found()
        if not failures:
            return M.NodeFailureReply("")
        text = format_failures(failures)[-6000:]
        if all(f.node_index != i for f in failures):
            text = f"node {i} was stopped because another node failed. {text}"
        return M.NodeFailureReply(text)

    def on_log_model(self, msg: M.LogModel):
        with self.cond:
            self.node(msg.node_index)  # a known node
            self.model_paths[msg.node_index] = msg.path
        return M.Ack()

    def on_checkpoint_saved(self, msg: M.CheckpointSaved):
        """Rank 0 wrote a checkpoint: a safe point (the supervisor's loop may resize the cluster)."""
        with self.cond:
            self.node(msg.node_index)  # a known node
            self.checkpoint = (time.monotonic(), msg.step)
            self.cond.notify_all()
        return M.Ack()

    def on_node_result(self, msg: M.NodeResult):
        value = values.decode(msg.value)  # ProtocolError: the node gets an ErrorReply, nothing is stored
        with self.cond:
            self.node(msg.node_index)  # a known node
            self.results[msg.node_index] = value
        return M.Ack()

    # -- liveness (monitor thread)
    def check_heartbeats(self, timeout: float, grace: float | None = None) -> None:
        """Fail every running node whose agent is lost (:func:`lifecycle.agent_lost`): silent for
        ``timeout``, or its heartbeat connection closed ``grace`` ago with no heartbeat since."""
        now = time.monotonic()
        with self.cond:
            for i, n in self.nodes.items():
                if not n.agent or n.exited is not None:
                    continue
                why = agent_lost(now, n.last_heartbeat, n.disconnected_at, timeout,
                                 timeout if grace is None else grace, stopping=n.stop)
                if why:
                    self.fail(NodeFailure(i, n.job_name, n.task_index, self.host_of(i), why, cause=Cause.AGENT_LOST))
                    n.exited = M.NodeExited(self.cluster_id, i, -1, "", "", "", False, cause=Cause.AGENT_LOST)
                    self.version += 1

    def on_agent_disconnected(self, cluster_id: str, node_index: int) -> None:
        """The connection that carried node ``node_index``'s heartbeats closed (service.py)."""
        with self.cond:
            n = self.nodes.get(node_index) if cluster_id == self.cluster_id else None
            if n is not None and n.agent and n.exited is None:
                n.disconnected_at = time.monotonic()
                self.cond.notify_all()

    def silent(self, quiet_for: float) -> list[int]:
        """Running nodes whose agent has not been heard from for ``quiet_for`` seconds: their
        verdict (alive again, or lost at heartbeat_timeout) is still to come."""
        now = time.monotonic()
        with self.cond:
            return [i for i, n in self.nodes.items()
                    if n.agent and n.exited is None and now - n.last_heartbeat > quiet_for]

    # -- reporting
    def metrics(self) -> dict[int, dict]:
        with self.cond:
            return {i: dict(n.metrics) for i, n in self.nodes.items()}

    def summary(self) -> tuple[dict, dict, dict] | None:
        """``(per-node state, events, hosts)`` for the end-of-run table and timeline; None if no node started."""
        with self.cond:
            if not any(n.info or n.agent for n in self.nodes.values()):
                return None
            state = {i: {"metrics": dict(n.metrics), "host": self.host_of(i),
                         "exit": n.exited.exit_code if n.exited else None,
                         "log": n.agent.log_path if n.agent else ""} for i, n in self.nodes.items()}
            events = {i: list(n.events) for i, n in self.nodes.items()}
            hosts = {i: self.host_of(i) for i in self.nodes}
        return state, events, hosts

    def node_dicts(self) -> list[dict]:
        return [dataclasses.asdict(n) for n in self.registered()]


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("a store value is not base64") from None


def _failed(msg: M.NodeExited) -> bool:
    """Pure: an exit report that says the node failed (an exit code, or its agent stopped it)."""
    return msg.exit_code != 0 or msg.cause not in (Cause.EXITED, Cause.STOPPED)

"""The driver's cluster lifecycle: phases and the one transition function (runs on the driver).

::

    RESERVED --start()--> STARTING --all registered--> RUNNING --shutdown()--> SHUTTING_DOWN --> SHUT_DOWN
        |                     |                            |                        |
        +---------------------+------------ any failure ---+------------------------+--> FAILED
    RESERVED --shutdown() before start()--> SHUT_DOWN

The first error that fails the cluster is recorded once; every later call re-raises it.
A restart (``max_restarts``) keeps the phase: the cluster stays RUNNING (or SHUTTING_DOWN) while
the supervisor's control loop stops the failed attempt's nodes and starts the next attempt. What
node failures mean (restart, go on without the node, hold, fail) is decided by one pure function,
:func:`decide`.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import signal
import threading

from tfos.errors import EXECUTOR_CAUSES, Cause, ClusterStateError, TFOSError


class Phase(enum.Enum):
    RESERVED = "reserved"
    STARTING = "starting"
    RUNNING = "running"
    SHUTTING_DOWN = "shutting down"
    SHUT_DOWN = "shut down"
    FAILED = "failed"


TRANSITIONS: dict[Phase, frozenset] = {
    Phase.RESERVED: frozenset({Phase.STARTING, Phase.SHUT_DOWN, Phase.FAILED}),
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.FAILED}),
    Phase.RUNNING: frozenset({Phase.SHUTTING_DOWN, Phase.FAILED}),
    Phase.SHUTTING_DOWN: frozenset({Phase.SHUT_DOWN, Phase.FAILED}),
    Phase.SHUT_DOWN: frozenset(),
    Phase.FAILED: frozenset(),
}


def allowed(current: Phase, target: Phase) -> bool:
    """Pure: whether the lifecycle may go from ``current`` to ``target``."""
    return target in TRANSITIONS[current]


class Lifecycle:
    def __init__(self):
        self._lock = threading.Lock()
        self.phase = Phase.RESERVED
        self.error: TFOSError | None = None

    def to(self, target: Phase, error: TFOSError | None = None) -> None:
        """Move to ``target``; an illegal transition raises ClusterStateError. Going to FAILED
        records ``error`` (the first one only)."""
        with self._lock:
            if not allowed(self.phase, target):
                raise ClusterStateError(f"the cluster cannot go from {self.phase.value} to {target.value}")
            if target is Phase.FAILED and self.error is None:
                self.error = error
            self.phase = target

    def fail(self, error: TFOSError) -> bool:
        """Fail the cluster unless it already ended; returns whether this call failed it."""
        with self._lock:
            if self.phase in (Phase.SHUT_DOWN, Phase.FAILED):
                return False
            self.phase = Phase.FAILED
            self.error = self.error or error
            return True

    @property
    def ended(self) -> bool:
        return self.phase in (Phase.SHUT_DOWN, Phase.FAILED)

    def require(self, phase: Phase, what: str) -> None:
        """Raise the recorded error if the cluster failed, ClusterStateError if it is not in ``phase``."""
        if self.phase is Phase.FAILED and self.error is not None:
            raise self.error
        if self.phase is not phase:
            raise ClusterStateError(f"cannot {what}: the cluster is {self.phase.value} (expected {phase.value})")


@dataclasses.dataclass(frozen=True)
class NodeLoss:
    """A node lost while the others went on (``cluster.lost_nodes``; see :func:`decide`)."""

    time: float  # wall-clock seconds (time.time()) when the driver acted on it
    attempt: int  # the attempt that failed (0: the first start)
    node_index: int
    job_name: str
    task_index: int
    host: str
    cause: Cause  # why its TF process ended, as the driver decides on it
    reason: str  # the same in words: an exit code, a signal, what the agent saw


@dataclasses.dataclass(frozen=True)
class Restart(NodeLoss):
    """One node failure that made tfos restart the cluster (``cluster.restarts``)."""


@dataclasses.dataclass(frozen=True)
class Resize:
    """A planned restart at another size (``cluster.resizes``): the cluster grew back when Spark
    offered more slots, at rank 0's checkpoint of ``step``."""

    time: float  # wall-clock seconds (time.time()) when the driver acted on it
    attempt: int  # the attempt that was stopped
    from_nodes: int
    to_nodes: int
    step: int  # ctx.checkpoint_saved(step): -1 when the program gave none


@dataclasses.dataclass(frozen=True)
class Eviction:
    """Nodes told to go (``cluster.evictions``) after which every training rank checkpointed at
    ``step`` (``ctx.should_checkpoint``) and the cluster went on without them by a planned restart."""

    time: float  # wall-clock seconds (time.time()) when the driver acted on it
    attempt: int  # the attempt that was stopped
    nodes: tuple[int, ...]  # the nodes told to go
    hosts: tuple[str, ...]
    step: int  # every training rank's checkpoint
    why: str  # the first node's notice, in words


class Action(enum.Enum):
    RESTART = "restart every node"
    LOSE_NODE = "go on without the node"
    HOLD = "hold the failure until a call can resume the feed"
    FAIL = "fail the cluster"


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """What the failure policy decides from (:func:`decide`): the supervisor's snapshot of the
    cluster when nodes failed."""

    failures: tuple  # NodeFailure of this attempt, not yet acted on
    max_restarts: int = 0
    restarts_done: int = 0  # attempts restarted so far
    running: bool = True  # the cluster started (RUNNING or SHUTTING_DOWN); False while the first attempt starts
    all_started: bool = True  # every node of this attempt registered
    survivable_jobs: tuple = ()  # roles the backend can lose (backend='ps': workers)
    peers_running: int = 0  # for one failure: the other nodes of its role still running
    resumable: bool = True  # a restart can resume the work: InputMode.TENSORFLOW, or a train() waits to feed
    final: bool = False  # shutdown() is waiting: no later call will resume a feed


def decide(view: ClusterView) -> Decision:
    """Pure: what node failures mean for the cluster.

    * LOSE_NODE: the run goes on without one failed node. Only with restarts on (``max_restarts=0``
      keeps failing fast), for a role the backend can lose (``survivable_jobs``; ``backend='ps'``:
      workers, whose scheduled functions TF's ClusterCoordinator moves to the other workers), once
      every node has started, and while another node of that role runs (``peers_running``).
    * FAIL: the cluster is not running (starting, or already ended), restarts are off, a node
      raised NonRetryable/ConfigError, every restart allowed was used, or (InputMode.SPARK) the
      last feed ended so nothing can be resumed; ``reason`` says which.
    * HOLD: InputMode.SPARK between feeds: the nodes stop, and the next ``train()`` restarts them.
    * RESTART: otherwise: stop every node and start them all again (at the size Spark offers).
    """
    failures = view.failures
    if (len(failures) == 1 and view.max_restarts > 0 and failures[0].job_name in view.survivable_jobs
            and view.all_started and view.peers_running > 0):
        return Decision(Action.LOSE_NODE, f"{view.peers_running} other {failures[0].job_name} node(s) go on")
    if not view.running:
        return Decision(Action.FAIL, "the cluster is not running")
    if view.max_restarts <= 0:
        return Decision(Action.FAIL, "restarts are off (max_restarts=0)")
    fatal = [f for f in failures if not f.retryable]
    if fatal:
        return Decision(Action.FAIL, f"node {fatal[0].node_index} raised NonRetryable or ConfigError, which a "
                                     "restart cannot fix")
    if view.restarts_done >= view.max_restarts:
        return Decision(Action.FAIL, f"all {view.max_restarts} restart(s) allowed by max_restarts were used")
    if not view.resumable:
        if view.final:
            return Decision(Action.FAIL, "InputMode.SPARK: the feeds ended, so a restart has no data to resume")
        return Decision(Action.HOLD, "InputMode.SPARK: the next train() restarts the cluster")
    return Decision(Action.RESTART, f"restart {view.restarts_done + 1} of {view.max_restarts}")


def grow_to(size: int, max_nodes: int, offered: int | None) -> int | None:
    """Pure: the size a cluster of ``size`` nodes grows to when Spark offers ``offered`` task slots
    (its own nodes' included), at most ``max_nodes``; None when there is nothing to grow into (or
    Spark cannot say)."""
    if offered is None or size >= max_nodes or offered <= size:
        return None
    return min(offered, max_nodes)


#: Cluster managers' words for a container killed for its memory (YARN's NodeManager, via Spark's
#: YarnAllocator; Kubernetes; a kernel OOM kill of the executor, exit code 137).
MEMORY_KILL = re.compile(r"exceeding (physical |virtual )?memory|beyond the '?(physical|virtual)'? memory limit|"
                         r"OOMKilled|exit code 137", re.I)
MEMORY_HINT = ("The node's TF process is a child of the Spark executor, so its memory counts against the "
               "executor's container: raise spark.executor.memoryOverhead (or set spark.executor.pyspark.memory)")


def save_target(proposals: dict[int, int], ranks) -> int:
    """Pure: the step every training rank checkpoints at before an eviction: the highest of their
    proposals (each rank waits at its own until it learns the target, so none is past it), once
    every rank of ``ranks`` (the training ranks still running) gave one; -1 before."""
    ranks = list(ranks)
    if not ranks or any(r not in proposals for r in ranks):
        return -1
    return max(proposals[r] for r in ranks)


def failure_cause(exit_code: int, raised: bool, agent_cause: Cause) -> Cause:
    """Pure: the cause of a node's end from its exit report: the agent's own cause when it stopped
    the TF process, else RAISED (a traceback), KILLED (a signal) or EXITED (an exit code)."""
    if agent_cause is not Cause.EXITED:
        return agent_cause
    if raised:
        return Cause.RAISED
    return Cause.KILLED if exit_code < 0 else Cause.EXITED


def explain_executor_loss(host: str, cause: Cause, removed, since: float) -> str:
    """Pure: what to add to the reason a node on ``host`` failed with (``cause``), from the executors Spark
    ``removed`` (objects with ``executor_id``, ``host``, ``reason``, ``time``) since ``since``: those
    on the node's host (any, when none was there), each with the reason its cluster manager gave,
    and for a container killed for memory, the setting to raise. "" when nothing explains it."""
    if cause not in EXECUTOR_CAUSES:
        return ""
    recent = [r for r in removed if not r.time or r.time >= since]
    chosen = [r for r in recent if r.host == host] or recent
    if not chosen:
        return ""
    text = "; Spark removed " + "; ".join(f"executor {r.executor_id} on {r.host}: {r.reason.strip().rstrip('.')}"
                                          for r in chosen)
    if any(MEMORY_KILL.search(r.reason) for r in chosen):
        text += ". " + MEMORY_HINT
    return text


def first_cause_first(failures) -> list:
    """Pure: ``failures`` with the nodes that failed on their own first, then those whose TF process
    found that its error came from another rank's failure (``NodeFailure.peer_failed``: an aborted
    collective, a lost peer, from the exception's types); otherwise in the order given."""
    return sorted(failures, key=lambda f: f.peer_failed)


def exit_reason(exit_code: int, raised: bool, agent_reason: str = "", peak_rss_mb: int = 0,
                memory_limit_mb: int = 0, oom_killed: bool = False) -> str:
    """Pure: why a node's TF process ended, as the driver says it. A SIGKILL the node agent did not
    send is most often the kernel's OOM killer: say so, with the peak memory the agent saw; when the
    agent's container (a Kubernetes pod, a cgroup) counted an OOM kill, name its limit and the
    setting that sizes it."""
    if raised:
        reason = "the TF process raised an exception"
    else:
        reason = f"TF process exited with code {exit_code}"
        if exit_code < 0:
            reason += f" (killed by signal {-exit_code})"
        if exit_code == -signal.SIGKILL and not agent_reason and oom_killed:
            limit = f"its memory limit of {memory_limit_mb} MiB" if memory_limit_mb else "its memory limit"
            reason += (", by the kernel's OOM killer: the executor's container (a Kubernetes pod: "
                       f"spark.executor.memory + spark.executor.memoryOverhead) reached {limit}"
                       + (f" (the TF process's peak RSS {peak_rss_mb} MB)" if peak_rss_mb else "")
                       + ". The node's TF process counts against it: raise spark.executor.memoryOverhead, "
                       "or make main_fun use less")
        elif exit_code == -signal.SIGKILL and not agent_reason:
            reason += (", likely by the kernel's OOM killer" + (f" (peak RSS {peak_rss_mb} MB)" if peak_rss_mb else "")
                       + ": give the node more memory (spark.executor.memoryOverhead, or fewer nodes per host) "
                       "or make main_fun use less; the host's kernel log (dmesg) names the OOM kill")
    if agent_reason:
        reason += f"; the node agent stopped it: {agent_reason}"
    return reason


#: report values that change without the node making progress
NOT_PROGRESS = frozenset({"time", "feed_wait_secs"})


def shows_progress(before: dict, values: dict) -> bool:
    """Pure: a report whose ``values`` show progress over the node's last ones: a step, a loss, rows
    read... anything but the clock and the time spent waiting for data changed."""
    return any(before.get(k, object()) != v for k, v in values.items() if k not in NOT_PROGRESS)


def disconnect_grace(heartbeat_interval: float, heartbeat_timeout: float) -> float:
    """Pure: how long an agent whose heartbeat connection closed may take to come back before its
    node counts as lost: a few heartbeats (an agent reconnects on its next one), never longer than
    ``heartbeat_timeout``."""
    return min(heartbeat_timeout, max(2.0, 2.5 * heartbeat_interval))


def agent_lost(now: float, last_heartbeat: float, disconnected_at: float | None, timeout: float,
               grace: float, stopping: bool = False) -> str | None:
    """Pure: why a running node's agent counts as lost at ``now``, or None.

    Silence alone takes ``timeout`` (``heartbeat_timeout``: a host that vanished from the network,
    or a stalled agent). An agent keeps one connection for its heartbeats, so a connection that
    closed (``disconnected_at``) with no heartbeat since says its process died, or its host did:
    the kernel closed the socket. That takes only ``grace``, the time a live agent needs to
    reconnect, so that a restart need not wait ``heartbeat_timeout`` for a node that is gone.
    A node the driver is ``stopping`` (a restart, the end) gets no grace: the grace only lets a live
    agent come back to be told to stop, which the driver has then done without it."""
    closed = disconnected_at is not None and disconnected_at >= last_heartbeat
    if closed and stopping:
        return ("lost the node agent: its connection to the driver closed while the driver was stopping the "
                "nodes (its executor or host died)")
    if closed and now - disconnected_at > grace:
        return (f"lost the node agent: its connection to the driver closed and it did not come back within "
                f"{grace:.0f}s (its executor or host died)")
    if now - last_heartbeat > timeout:
        return (f"lost contact with the node agent (no heartbeat for {timeout:.0f}s; its executor may have "
                "died). Raise heartbeat_timeout if executors are merely overloaded")
    return None

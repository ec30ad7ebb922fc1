"""A Spark stand-in for fast tests of the driver: no JVM, no executors, no TF processes.

``FakeSpark`` is a Spark entry point (what ``TFCluster.reserve`` accepts): its barrier stage runs
one thread per node, and each thread is a :class:`FakeNode` that plays the node's agent and TF
process on the real control channel (authenticated, typed messages): it announces its agent,
registers, waits for the cluster spec, sends heartbeats, and reports its exit. What node ``i``
does on attempt ``a`` is ``behaviour(i, a)``, one of :class:`Does`, so a test can make any node
fail, hang, go silent or never start on any attempt, and watch the driver's supervisor, registry
and failure policy answer in milliseconds to a second. The real-Spark integration tests check the
same paths end to end with real processes.

    spark = FakeSpark(slots=3, behaviour=lambda i, attempt: Does.RAISE if (i, attempt) == (1, 0) else Does.FINISH)
    cluster = TFCluster.reserve(spark, 3, max_restarts=1, restart_backoff=0, progress=False)
    cluster.start(lambda args, ctx: None)
    cluster.shutdown()
    assert spark.started == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time

from tfos.errors import ReservationTimeoutError, TFOSError
from tfos.host.deadline import Deadline
from tfos.topology import InputMode
from tfos.wire import messages as M
from tfos.wire.clients import DriverClient

logger = logging.getLogger(__name__)


class Does(enum.Enum):
    FINISH = "run for `run_secs`, then exit 0"
    RAISE = "run for `run_secs`, then exit 1 with a traceback (retryable)"
    NON_RETRYABLE = "run for `run_secs`, then exit 1 with NonRetryable"
    HANG = "run until the driver stops it"
    GO_SILENT = "register, then send nothing more (a lost host)"
    STALL = "report progress once, then stay alive (heartbeats) without progress; answer stack requests"
    NEVER_REGISTER = "start its agent, never register a TF process"
    CHECKPOINTS = "run until the driver stops it; node 0 says ctx.checkpoint_saved(step) every 0.1 s"
    SAVES = ("a step every 0.05 s, each followed by ctx.should_checkpoint(step) (the TF process's own SavePoint); "
             "node 0 says ctx.checkpoint_saved(step) after each save; FakeSpark.evict(i) tells the driver that "
             "node i must go, as its agent would")
    HANDLER_SAVES = ("as SAVES, but the step is agreed as TF's PreemptionCheckpointHandler does (the SavePoint's "
                     "on_round): every node saves at the step after rank 0 heard of the round, then says "
                     "ctx.checkpoint_saved and waits for the stop")


class _Agreement(threading.Event):
    """Does.HANDLER_SAVES: what TF's coordination service agrees on (rank 0 heard of a round, and
    the step every node saves at)."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()
        self.step = -1


class FakeNode(threading.Thread):
    """One node's agent and TF process, as the driver sees them over the control channel."""

    def __init__(self, cluster: M.ClusterConfig, index: int, does: Does, run_secs: float, cancelled: threading.Event,
                 evict: threading.Event | None = None):
        super().__init__(name=f"fake-node-{index}-{cluster.attempt}", daemon=True)
        self.cluster = cluster
        self.index = index
        self.does = does
        self.run_secs = run_secs
        self.cancelled = cancelled
        self.evict = evict or threading.Event()  # set: this node's agent was told to go
        self.handler_heard = _Agreement()  # Does.HANDLER_SAVES: shared by the attempt's nodes
        self.executor_gone = False  # the notice says its executor ended already (FakeSpark.evict)
        self.saved: list[int] = []  # the steps this node saved at (Does.SAVES)
        self.steps = 0  # the steps it made (Does.SAVES)
        self.error: BaseException | None = None

    def run(self) -> None:
        c = self.cluster
        client = DriverClient(c.driver_host, c.driver_port, c.key, c.cluster_id, self.index)
        pid = os.getpid()
        try:
            stop = client.agent_started("127.0.0.1", pid, pid, "")
        except Exception as e:  # the driver moved on (a new attempt, or the cluster ended)
            self.error = e
            return
        try:
            code, traceback, retryable, stop = self._run(client, stop)
        except Exception as e:  # e.g. the cluster spec refused: the TF process would exit with it
            self.error = e
            code, traceback, retryable, stop = 1, f"Traceback (most recent call last):\n{e!r}", True, False
        if code is None:  # gone silent: nothing more is sent
            return
        try:
            client.node_exited(code, traceback, "", "", stopped_by_driver=stop, reason="", retryable=retryable)
        except Exception as e:
            logger.debug("fake node %d could not report its exit: %s", self.index, e)

    def _run(self, client: DriverClient, stop: bool):
        """What the node does; returns ``(exit code or None when silent, traceback, retryable, stopped)``."""
        c = self.cluster
        job, task_index = c.roles[self.index]
        long = c.reservation_timeout + 60
        if self.does is Does.NEVER_REGISTER:
            return -15, "", True, stop or self._heartbeat_until(client, Deadline(long))
        client.register(M.NodeInfo(self.index, job, task_index, "127.0.0.1", 20000 + self.index, 0, os.getpid()))
        client.cluster_spec(c.reservation_timeout)
        if self.does is Does.GO_SILENT:
            return None, "", True, False
        if self.does is Does.STALL:
            client.report({"step": 1}, [])
        if self.does is Does.CHECKPOINTS:
            for step in range(int(long * 10)):
                if self._heartbeat_until(client, Deadline(0.1)):
                    return -15, "", True, True
                if self.index == 0:
                    client.checkpoint_saved(step)
        if self.does in (Does.SAVES, Does.HANDLER_SAVES):
            return self._saves(client, long)
        run = Deadline(long if self.does in (Does.HANG, Does.STALL) else self.run_secs)
        if stop or self._heartbeat_until(client, run):
            return -15, "", True, True
        if self.does is Does.FINISH:
            return 0, "", True, False
        kind = "RuntimeError" if self.does is Does.RAISE else "tfos.errors.NonRetryable"
        return (1, f"Traceback (most recent call last):\n{kind}: node {self.index} failed on purpose",
                self.does is not Does.NON_RETRYABLE, False)

    def _saves(self, client: DriverClient, long: float):
        """Does.SAVES: the program's steps on the main thread, the agent's heartbeats and its
        eviction notice on another (a saving node waits in should_checkpoint, as a real one does)."""
        from tfos.cluster.node.saving import SavePoint

        c = self.cluster
        stopped, declined = threading.Event(), threading.Event()
        handler = self.does is Does.HANDLER_SAVES
        heard = self.handler_heard  # shared by the attempt's nodes, as TF's coordination service is
        point = SavePoint(DriverClient(c.driver_host, c.driver_port, c.key, c.cluster_id, self.index),
                          c.eviction_grace, on_round=(lambda _r: self.index == 0 and heard.set()) if handler else None)
        if handler:
            point.start()

        def agent():
            told = False
            while not stopped.is_set():
                if self._heartbeat_until(client, Deadline(0.05)):
                    stopped.set()
                    point.close()  # the process ends: a wait in should_checkpoint with it
                    return
                if self.evict.is_set() and not told:
                    told = True
                    if not client.eviction_notice(c.eviction_grace, f"fake node {self.index} was told to go",
                                                  executor_gone=self.executor_gone):
                        declined.set()  # the agent stops its TF process at once: a failure
                        stopped.set()
                        point.close()

        beats = threading.Thread(target=agent, name=f"fake-agent-{self.index}", daemon=True)
        beats.start()
        run = Deadline(long)
        try:
            while not stopped.is_set() and not run.expired():
                time.sleep(0.05)
                self.steps += 1
                if handler:
                    with heard.lock:  # rank 0 heard of the round: every node saves at the step after
                        if heard.is_set() and heard.step < 0 and self.index == 0:
                            heard.step = self.steps + 10  # the fake nodes' steps are not in lockstep
                        due = 0 <= heard.step <= self.steps and not self.saved
                    if due and point.saved_by_handler():
                        self.saved.append(self.steps)
                        if self.index == 0:
                            client.checkpoint_saved(self.steps)
                        point.after_save(self.steps)
                elif point.check(self.steps):
                    self.saved.append(self.steps)
                    if self.index == 0:
                        client.checkpoint_saved(self.steps)
                    point.after_save(self.steps)  # ctx.checkpoint_saved on every rank
        finally:
            point.close()
        stopped.set()
        beats.join()
        return -15, "", True, not declined.is_set()

    def _heartbeat_until(self, client: DriverClient, end: Deadline) -> bool:
        """Heartbeat until ``end`` passed; True when the driver (or a cancelled stage) asks to
        stop first."""
        interval = max(0.05, self.cluster.heartbeat_interval)
        answered = 0
        while not end.expired():
            if self.cancelled.is_set():
                return True
            reply = client.heartbeat_reply()
            if reply.stop:
                return True
            if reply.dump > answered:  # the stall watchdog or dump_stacks(): this thread's real stack
                answered = reply.dump
                client.node_stacks(reply.dump, _own_stack(), f"fake node {self.index}: last log line")
            self.cancelled.wait(end.slice(interval))
        return False


def _own_stack() -> str:
    """faulthandler's dump of the calling thread, as a node agent would send it for a TF process."""
    import faulthandler
    import tempfile

    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=False)
        f.flush()
        f.seek(0)
        return f.read()


class FakeSpark:
    """A Spark entry point whose barrier stages run :class:`FakeNode` threads (see the module).
    ``run_secs``: how long a node runs before it finishes or fails, in seconds, or ``run_secs(i)``."""

    connect = False
    master = "fake"

    def __init__(self, slots: int = 2, behaviour=None, run_secs=0.2):
        self.slots = slots
        self.behaviour = behaviour or (lambda index, attempt: Does.FINISH)
        self.run_secs = run_secs
        self.started: list[tuple[int, int]] = []  # (node index, attempt) of every node started
        self.nodes: list[FakeNode] = []  # every node started
        self._evict: dict[tuple[int, int], threading.Event] = {}  # (node index, attempt) -> told to go
        self._lock = threading.Lock()
        self._jobs: dict[int, str] = {}  # thread id -> job group
        self._cancel: dict[str, threading.Event] = {}

    def conf(self) -> dict:
        return {}

    def evict(self, index: int, attempt: int, executor_gone: bool = False) -> None:
        """Node ``index`` of ``attempt`` is told to go (its agent sends an eviction notice; with
        ``executor_gone``, as after its executor JVM ended)."""
        with self._lock:
            for node in self.nodes:
                if (node.index, node.cluster.attempt) == (index, attempt):
                    node.executor_gone = executor_gone
            self._evict.setdefault((index, attempt), threading.Event()).set()

    def wait_for_slots(self, num_executors: int, timeout: float) -> int:
        if num_executors > self.slots:
            raise ReservationTimeoutError(f"cannot reserve {num_executors} executors: the fake Spark offers "
                                          f"{self.slots} slot(s)")
        return self.slots

    def slots_offered(self) -> int:
        """``slots``: a test changes it to play executors lost or returning."""
        return self.slots

    def default_fs(self) -> str:
        return "file:///"

    def control_address(self, environ: dict):
        from tfos.cluster.driver.spark import ControlAddress

        return ControlAddress("127.0.0.1", "127.0.0.1", 0, "spark.driver.host")

    def enter_job(self, group: str, description: str) -> None:
        with self._lock:
            self._jobs[threading.get_ident()] = group
            self._cancel.setdefault(group, threading.Event())

    def lend_secret(self, secret: str) -> None:
        pass  # no Spark task is launched

    def cancel_job(self, group: str) -> None:
        with self._lock:
            self._cancel.setdefault(group, threading.Event()).set()

    def quiet_console(self) -> None:
        pass

    def removed_executors(self) -> list:
        return []

    def barrier_stage(self, n: int, bootstrap):
        cluster: M.ClusterConfig = bootstrap.keyed()  # what the stage was made for, with its secret

        def action():
            with self._lock:
                cancelled = self._cancel.setdefault(self._jobs.get(threading.get_ident(), ""), threading.Event())
            secs = self.run_secs if callable(self.run_secs) else (lambda i: self.run_secs)
            with self._lock:
                evict = [self._evict.setdefault((i, cluster.attempt), threading.Event()) for i in range(n)]
            nodes = [FakeNode(cluster, i, self.behaviour(i, cluster.attempt), secs(i), cancelled, evict[i])
                     for i in range(n)]
            heard = _Agreement()
            for node in nodes:
                node.handler_heard = heard
            with self._lock:
                self.started += [(i, cluster.attempt) for i in range(n)]
                self.nodes += nodes
            for node in nodes:
                node.start()
            if cluster.input_mode != InputMode.TENSORFLOW:
                return [f"node {i}: STARTED" for i in range(n)]
            for node in nodes:  # TENSORFLOW: the barrier tasks hold their slots until the nodes end
                node.join()
            if cancelled.is_set():
                raise TFOSError("the fake barrier stage was cancelled")
            return [f"node {i}: ended" for i in range(n)]

        return action

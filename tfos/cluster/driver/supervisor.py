"""The supervisor: owns the cluster's phases and answers "a node failed: what now" (runs on the
driver).

One object holds what changes over the life of a cluster: the lifecycle's phase, the attempt's
configuration, the reservation (the barrier stage), the monitor thread, the restarts and lost
nodes. Every path that meets a node failure (``start``, ``train``, ``inference``, ``shutdown``,
the monitor thread) calls :meth:`Supervisor.handle_failures`, and every decision is
:func:`tfos.cluster.driver.lifecycle.failure_policy`: restart every node, go on without the node
(recorded in ``lost_nodes``), or fail the cluster with every attempt's failures.

One module past 450 lines: it is the one owner of the cluster's phases (start, restarts, the
monitor, shutdown); the pure decisions already live in ``lifecycle``, and what is left is the
sequence that carries them out, which reads best in one place.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time

from tfos import topology
from tfos.cluster.driver import security
from tfos.cluster.driver import spark as S
from tfos.cluster.driver import stall
from tfos.cluster.driver.lifecycle import (Action, Lifecycle, NodeLoss, Phase, Restart, disconnect_grace,
                                          explain_executor_loss,
                                          failure_policy, first_cause_first)
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.executor.bootstrap import make_bootstrap, node_dir_hint
from tfos.errors import FeedError, NodeFailedError, ReservationTimeoutError, StallError, TFOSError, remote_error
from tfos.topology import InputMode
from tfos.wire import messages as M

logger = logging.getLogger(__name__)

#: How long a failure whose node saw its executor die waits for Spark to learn why the executor went
#: (YARN reports a finished container to the ApplicationMaster within a few seconds).
EXPLAIN_WAIT_SECS = 10.0

#: How long a failing cluster waits for the other nodes' exit reports, so that the node whose own
#: error started the failure leads the driver's error even when it reports last.
FIRST_CAUSE_WAIT_SECS = 3.0
#: how often the monitor looks at the nodes (agents lost, a failure to restart after, a stall): the
#: delay between a node's exit report or a lost agent's grace running out and the driver acting
MONITOR_TICK_SECS = 0.25


class Supervisor:
    def __init__(self, spark, roles, backend, config: M.ClusterConfig, registry: NodeRegistry, scheduler,
                 max_restarts: int = 0, restart_backoff: float = 0.0):
        self.spark = spark
        self.cluster_id = config.cluster_id  # the first attempt's; attempt k runs as "<id>-k"
        self.roles = roles
        self.backend = backend
        self.config = config
        self.registry = registry
        self.scheduler = scheduler
        self.feeds = None  # FeedJobs, set by the cluster (it needs this supervisor's callbacks)
        self.max_restarts = max_restarts
        self.restart_backoff = restart_backoff
        self.lifecycle = Lifecycle()
        self.input_mode: InputMode | None = None
        self.restarts: list[Restart] = []  # each failure that restarted the cluster
        self.lost_nodes: list[NodeLoss] = []  # each node lost while the others went on (backend='ps' workers)
        self.on_release = None  # () -> None: the cluster's reporting, TensorBoard and control service end
        self._failed_before: list = []  # NodeFailures of the attempts that were restarted
        self._main = None  # (main_fun, tf_args, node_hooks), kept for restarts
        self._attempt_started = time.time()  # when this attempt's barrier stage was submitted
        self._restart_lock = threading.RLock()  # one restart at a time (monitor thread or a waiting call)
        self._restarter: threading.Thread | None = None
        self._reservation: S.SparkJob | None = None
        self._monitor: threading.Thread | None = None
        self._closing = threading.Event()
        self.stall_timeout: float | None = None  # reserve(stall_timeout=...)
        self.allow_unprotected = False  # reserve(allow_unprotected=...): no warning for hosts without namespaces
        self._stall: threading.Thread | None = None  # the watchdog's report, once a stall was seen
        registry.tolerate = self._tolerate_loss
        registry.on_complete = self._backend_setup

    # ------------------------------------------------------------------ starting
    def start(self, main, input_mode: InputMode, on_starting=None) -> None:
        """Start the first attempt: every node registered when this returns (RUNNING), else the
        cluster failed and the error is raised."""
        self.input_mode = input_mode
        self.config = dataclasses.replace(self.config, input_mode=int(input_mode))
        self._main = main
        self.lifecycle.to(Phase.STARTING)
        try:
            self._monitor = threading.Thread(target=self._monitor_loop, name=f"tfos-monitor-{self.cluster_id}",
                                             daemon=True)
            self._monitor.start()
            if on_starting is not None:
                on_starting()
            err = self._launch()
        except BaseException as e:  # interrupted (Ctrl-C) or broken: nothing may be left running
            self.abort(e if isinstance(e, TFOSError) else TFOSError(f"start() interrupted by {type(e).__name__}"))
            raise
        if err is not None:
            self.abort(err)
            raise err
        self.lifecycle.to(Phase.RUNNING)
        logger.info("tfos cluster %s started: %s", self.cluster_id, json.dumps(self.cluster_spec))
        exposed = security.exposure(self.registry.registered(), self.allow_unprotected)
        if exposed:
            logger.warning("tfos cluster %s: %s", self.cluster_id, exposed)

    @property
    def cluster_spec(self) -> dict:
        return topology.cluster_spec(self.registry.registered())

    def _launch(self) -> TFOSError | None:
        """Run this attempt's barrier stage (one task per node) and wait until every node registered;
        the error that stopped it, if any."""
        n = len(self.roles)
        attempt = self.config.attempt
        self._attempt_started = time.time()
        bootstrap = make_bootstrap(self.config, *self._main)

        def reservation_ended(job):
            if job.error is not None and not self._closing.is_set() and self.config.attempt == attempt:
                self.registry.abort(f"the tfos reservation job failed: {_short(job.error)}")

        cid = self.config.cluster_id
        self._reservation = S.SparkJob(self.spark, f"tfos-{cid}", f"tfos cluster {cid}: {n} TF nodes"
                                       + (f" (attempt {attempt})" if attempt else ""),
                                       self.spark.barrier_stage(n, bootstrap), on_done=reservation_ended)
        return self._wait_registered(n)

    def _wait_registered(self, n: int) -> TFOSError | None:
        timeout = self.config.reservation_timeout
        reg = self.registry
        reg.wait_until(lambda s: s.all_registered() or bool(s.failures) or bool(s.abort_reason), timeout)
        snap = reg.snapshot()
        if snap.failures:
            return NodeFailedError(list(snap.failures))
        if snap.abort_reason:
            return TFOSError(snap.abort_reason.rstrip(".") + "." + _node_logs_hint(self.config.cluster_id))
        if not snap.all_registered():
            return ReservationTimeoutError(
                f"nodes {snap.missing()} of {n} did not start within {timeout:.0f}s (reservation_timeout). Spark "
                "may lack free slots (other jobs running?) or the TF processes are slow to import; raise "
                "reservation_timeout or free executors." + _node_logs_hint(self.config.cluster_id))
        return None

    def _backend_setup(self, nodes) -> dict:
        config = self.backend.setup(nodes)
        return dict(config, driver_host=self.config.driver_host, log_dir=self.config.log_dir)

    # ------------------------------------------------------------------ failures
    def _decide(self, failures, peers_running: int = 0) -> "tuple[Action, str]":
        phase = self.lifecycle.phase
        running = phase in (Phase.RUNNING, Phase.SHUTTING_DOWN)
        d = failure_policy(failures, max_restarts=self.max_restarts,
                           restarts_done=len({r.attempt for r in self.restarts}), running=running,
                           survivable_jobs=self.backend.survivable_jobs, peers_running=peers_running,
                           all_started=running and self.registry.snapshot().all_registered())
        return d.action, d.reason

    def _tolerate_loss(self, failure) -> bool:
        """The registry's loss policy (called as it records ``failure``): True to go on without the
        failed node, recording it in ``lost_nodes``."""
        peers = self.registry.peers_running(failure.node_index)
        action, _ = self._decide([failure], peers)
        if action is not Action.LOSE_NODE:
            return False
        self.lost_nodes.append(NodeLoss(time.time(), self.config.attempt, failure.node_index, failure.job_name,
                                        failure.task_index, failure.host, failure.reason))
        logger.warning("tfos cluster %s: %s:%d on %s lost (%s); the %d other %s node(s) go on without it",
                       self.cluster_id, failure.job_name, failure.task_index, failure.host, failure.reason,
                       peers, failure.job_name)
        return True

    def raise_if_failed(self) -> None:
        """Raise NodeFailedError if any node has failed; later calls raise it again. With restarts
        left (``max_restarts``) the cluster is restarted instead. A cluster failed otherwise (the
        stall watchdog, an abort) raises its error."""
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        if self.registry.snapshot().failures:
            self.handle_failures()

    def feed_check_failed(self) -> None:
        """For a feed in progress: raise NodeFailedError if a node failed, leaving the restart (if
        one is allowed) to train(), which knows which epoch to feed again."""
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        failures = list(self.registry.snapshot().failures)
        if not failures:
            return
        if self._decide(failures)[0] is Action.RESTART:
            raise NodeFailedError(failures)
        self.handle_failures()

    def handle_failures(self) -> None:
        """Nodes failed: stop every node of this attempt and start the next one (``ctx.attempt`` + 1),
        or, when the policy says no, fail the cluster with every attempt's failures (raises)."""
        with self._restart_lock:
            self._handle_failures_locked()

    def _handle_failures_locked(self) -> None:
        reg = self.registry
        attempt = self.config.attempt
        failures = [dataclasses.replace(f, attempt=attempt) for f in reg.snapshot().failures]
        if not failures:  # another thread restarted the cluster meanwhile
            return
        failures = self._explained(failures)
        action, why = self._decide(failures)
        if action is not Action.RESTART:
            if self.max_restarts > 0:
                logger.error("tfos cluster %s cannot restart: %s", self.cluster_id, why)
            self.abort(NodeFailedError(self._failed_before + self._with_first_cause(failures)))
            raise self.lifecycle.error
        now = time.time()
        logger.warning("tfos cluster %s: restarting all nodes after the failure of %s (restart %d of %d)",
                       self.cluster_id, ", ".join(f"node {f.node_index} on {f.host}: {f.reason}" for f in failures),
                       attempt + 1, self.max_restarts)
        reg.abort("the cluster is restarting after a node failure")
        t_stop = time.monotonic()
        self.stop_nodes(range(len(self.roles)))
        t_stopped = time.monotonic()
        # every node that failed by itself, not only the first one the driver heard of
        failures += [dataclasses.replace(f, attempt=attempt) for f in reg.ended_on_their_own()]
        self.restarts += [Restart(now, attempt, f.node_index, f.job_name, f.task_index, f.host, f.reason)
                          for f in sorted(failures, key=lambda f: f.node_index)]
        self._failed_before += failures
        job = self._reservation
        if job is not None:
            job.cancel()
        self.backend.teardown()
        time.sleep(self.restart_backoff)
        self.config = dataclasses.replace(self.config, cluster_id=f"{self.cluster_id}-{attempt + 1}",
                                          attempt=attempt + 1)
        self.feeds.cluster = self.config
        # an abort() from another thread fails the lifecycle first, then the registry: both under its lock
        if not reg.new_attempt(self.config.cluster_id, unless=lambda: self.lifecycle.ended):
            raise self.lifecycle.error or TFOSError("the cluster ended while restarting")
        self.scheduler.new_attempt()
        t_launch = time.monotonic()
        err = self._launch()
        if isinstance(err, NodeFailedError):  # the new attempt failed while starting: restart again, or stop
            self._handle_failures_locked()
            return
        if err is not None:  # e.g. ReservationTimeoutError: Spark did not offer the slots again
            self.abort(err)
            raise self.lifecycle.error
        t_end = time.monotonic()
        logger.info("tfos cluster %s: attempt %d started in %.1fs (stopping the nodes %.1fs, cancel and "
                    "teardown %.1fs, reservation to registered %.1fs): %s", self.cluster_id, attempt + 1,
                    t_end - t_stop, t_stopped - t_stop, t_launch - t_stopped, t_end - t_launch,
                    json.dumps(self.cluster_spec))

    def _explained(self, failures: list) -> list:
        """``failures`` with what Spark knows of their executors' loss (YARN's "Container killed by
        YARN for exceeding physical memory limits", ...). An executor whose node agent saw it die is
        reported by the cluster manager moments later: wait up to EXPLAIN_WAIT_SECS for that."""
        wait = any("executor JVM" in f.reason for f in failures)
        deadline = time.monotonic() + (EXPLAIN_WAIT_SECS if wait else 0)
        while True:
            removed = self.spark.removed_executors()
            notes = [explain_executor_loss(f.host, f.reason, removed, self._attempt_started) for f in failures]
            if any(notes) or time.monotonic() >= deadline or self._closing.is_set():
                break
            time.sleep(0.5)
        return [dataclasses.replace(f, reason=f.reason + note) if note else f for f, note in zip(failures, notes)]

    def _with_first_cause(self, failures: list) -> list:
        """``failures`` and the nodes that failed on their own meanwhile, the first cause first.
        The node whose own error started it may report after a peer whose collective it aborted:
        wait up to FIRST_CAUSE_WAIT_SECS for the other nodes' exit reports."""
        reg, attempt = self.registry, self.config.attempt
        started = reg.started(range(len(self.roles)))
        reg.wait_until(lambda snap: not snap.unfinished(started), FIRST_CAUSE_WAIT_SECS)
        known = {f.node_index for f in failures}
        more = [dataclasses.replace(f, attempt=attempt) for f in reg.ended_on_their_own() if f.node_index not in known]
        return first_cause_first(failures + more)

    def every_failure(self) -> list:
        """The failures of the restarted attempts, then this attempt's."""
        return self._failed_before + [dataclasses.replace(f, attempt=self.config.attempt)
                                      for f in self.registry.snapshot().failures]

    def _monitor_loop(self) -> None:
        while not self._closing.wait(MONITOR_TICK_SECS):
            c = self.config
            self.registry.check_heartbeats(c.heartbeat_timeout, disconnect_grace(c.heartbeat_interval,
                                                                                 c.heartbeat_timeout))
            self._maybe_restart_in_background()
            self._check_stall()

    def _trainers(self) -> list[int]:
        return [i for i, (job, _) in enumerate(self.roles) if job in self.backend.finishing_jobs]

    def _check_stall(self) -> None:
        """The stall watchdog: no training rank made progress for ``stall_timeout`` while every node
        is alive -> every TF process's stacks, and the cluster fails with StallError."""
        if self.lifecycle.phase not in (Phase.RUNNING, Phase.SHUTTING_DOWN) or self._stall is not None:
            return
        last = self.registry.last_progress(self._trainers())
        if not stall.stalled(time.monotonic(), last, self.stall_timeout) or self.registry.snapshot().failures:
            return
        secs = time.monotonic() - last
        self._stall = threading.Thread(target=lambda: self.abort(StallError(self.stall_report(secs))),
                                       name=f"tfos-stall-{self.cluster_id}", daemon=True)
        self._stall.start()

    def stall_report(self, secs: float | None, timeout: float = 10.0) -> str:
        return stall.stall_message(secs, [(label, dump, tail)
                                          for label, (dump, tail) in self.dump_stacks(timeout).items()])

    def dump_stacks(self, timeout: float = 10.0) -> dict[str, tuple[str, str]]:
        """Every running node's TF process stacks and last log lines, by a label naming the node."""
        answers = self.registry.collect_stacks(timeout)
        out = {}
        for i, (job, idx) in enumerate(self.roles):
            a = answers.get(i)
            label = f"node {i} ({job}:{idx} on {self.registry.host_of(i)})"
            out[label] = (a.stacks, a.log_tail) if a else ("(no answer: the node is not running or did not "
                                                           f"answer within {timeout:.0f}s)", "")
        return out

    def _maybe_restart_in_background(self) -> None:
        """InputMode.TENSORFLOW: restart as soon as a node fails, whether or not a call is waiting.
        (InputMode.SPARK restarts in train(), which knows which epoch to feed again.)"""
        if self.input_mode != InputMode.TENSORFLOW or self.max_restarts <= 0:
            return
        if self._restarter is not None and self._restarter.is_alive():
            return
        failures = list(self.registry.snapshot().failures)
        if not failures or self._decide(failures)[0] is not Action.RESTART:
            return  # nothing to do, or the waiting call raises the failure

        def restart():
            try:
                self.handle_failures()
            except TFOSError as e:  # the cluster failed; the next call raises it
                logger.debug("background restart ended the cluster: %s", e)

        self._restarter = threading.Thread(target=restart, name=f"tfos-restart-{self.cluster_id}", daemon=True)
        self._restarter.start()

    # ------------------------------------------------------------------ feeding
    def train(self, feed, num_epochs: int) -> int:
        """``feed(epochs, epochs_done)`` (FeedJobs.train) for ``num_epochs`` epochs; returns the rows fed.
        With restarts allowed, a node failure restarts the cluster and the new attempt is fed the
        interrupted epoch again in full, then the rest (``epochs_done`` collects each finished
        epoch's rows, so the feed knows where it was interrupted)."""
        if self.max_restarts <= 0:
            return feed(num_epochs, None)
        fed, done = 0, 0
        while True:
            epochs_done: list[int] = []  # rows of each epoch fed completely in this attempt
            try:
                return fed + feed(num_epochs - done, epochs_done)
            except NodeFailedError:
                done += len(epochs_done)
                fed += sum(epochs_done)
                logger.warning("tfos: a node failed while feeding epoch %d of %d; restarting the cluster",
                               done + 1, num_epochs)
                self.handle_failures()  # raises when no restart is allowed

    # ------------------------------------------------------------------ stopping
    def shutdown(self, grace_secs: float, timeout: float) -> None:
        """Wait for the training nodes (restarting them after failures while allowed), stop the
        others, release everything; raises NodeFailedError or TFOSTimeoutError."""
        if timeout is None or timeout < 0:  # TensorFlowOnSpark: timeout=-1 waits forever
            timeout = float("inf")
        if self.input_mode == InputMode.SPARK:
            unreached = self.feeds.close_feeds()
            if unreached:  # those nodes would wait for data forever
                raise FeedError("could not end the feed of " + "; ".join(f"node {i}: {e}" for i, e in unreached)
                                + ". Their TF processes cannot finish; see the nodes' logs")
        reg = self.registry
        trainers = self._trainers()
        others = [i for i in range(len(self.roles)) if i not in trainers]
        waiting = reg.unfinished(trainers)
        if waiting:
            logger.info("tfos cluster %s: waiting up to %s for training nodes %s to finish "
                        "(cluster.shutdown(timeout=...))",
                        self.cluster_id, "ever" if timeout == float("inf") else f"{timeout:.0f}s", waiting)
        deadline = time.monotonic() + timeout
        while True:
            reg.wait_until(lambda s: not s.unfinished(trainers) or bool(s.failures) or self.lifecycle.ended,
                           deadline - time.monotonic(),
                           lambda s: f"training nodes {s.unfinished(trainers)} still running",
                           "shutdown(timeout=...)", poll=1.0 if timeout == float("inf") else None)
            # InputMode.TENSORFLOW: main_fun runs again from its checkpoint (or, with no restart left,
            # handle_failures raises every attempt's failures). InputMode.SPARK restarts only while
            # train() feeds: after the last feed there is no data to resume from.
            if reg.snapshot().failures and self.input_mode == InputMode.TENSORFLOW:
                self.handle_failures()
                continue
            break
        if self.lifecycle.phase is Phase.FAILED:  # the stall watchdog (or an abort) ended it meanwhile
            if self._stall is not None:
                self._stall.join(timeout=60)  # it stops every node first
            raise self.lifecycle.error
        if others and not reg.snapshot().failures:
            reg.wait_until(lambda s: not s.unfinished(others), grace_secs)
        self.stop_nodes(range(len(self.roles)))
        if reg.snapshot().failures:
            self.lifecycle.fail(NodeFailedError(self.every_failure()))
            self.release()
            raise self.lifecycle.error
        self.release()
        self.lifecycle.to(Phase.SHUT_DOWN)
        logger.info("tfos cluster %s shut down", self.cluster_id)

    def stop_nodes(self, which) -> None:
        """Ask the agents of ``which`` nodes to stop and wait until they report their exits."""
        which = list(which)
        reg = self.registry
        reg.request_stop(which)
        c = self.config
        timeout = c.heartbeat_interval * 2 + c.stop_grace_secs + 15
        started = reg.started(which)
        if not reg.wait_until(lambda s: not s.unfinished(started), timeout):
            logger.warning("tfos nodes %s did not confirm their exit within %.0fs", reg.unfinished(started), timeout)

    def abort(self, err: TFOSError) -> None:
        """Fail the cluster (once): stop every node and release everything."""
        if not self.lifecycle.fail(err):
            return
        self.registry.abort(str(err).splitlines()[0] if str(err) else type(err).__name__)
        self.stop_nodes(range(len(self.roles)))
        restarter = self._restarter
        if restarter is not None and restarter is not threading.current_thread() and restarter.is_alive():
            restarter.join(timeout=60)  # it sees the failed lifecycle and ends; then stop what it started
            self.stop_nodes(range(len(self.roles)))
        self.release()

    def release(self) -> None:
        self._closing.set()
        job = self._reservation
        if job is not None and not job.done.is_set():
            job.thread.join(timeout=10)
            job.cancel()
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        self.backend.teardown()
        if self.on_release is not None:
            self.on_release()


def _short(e: BaseException) -> str:
    remote = remote_error(e)
    if remote is not None:
        return str(remote)[:1000]
    text = str(e).strip().splitlines()
    for line in text:
        if "TFOSError" in line or "Error:" in line:
            return line.strip()[:500]
    return (text[0] if text else type(e).__name__)[:500]


def _node_logs_hint(cluster_id: str) -> str:
    return f" Node logs: {node_dir_hint(cluster_id)}/ on each executor host."

"""The supervisor: one control loop owns the cluster's phases and every decision after a failure
(runs on the driver).

One thread, the control loop, does everything that changes an attempt: it starts an attempt's
barrier stage, sees its nodes register, checks the agents' heartbeats, and each time a node fails
it takes a registry snapshot, asks the pure policy (:func:`tfos.cluster.driver.lifecycle.decide`)
what to do, and carries it out: go on without the node, restart every node at the size Spark
offers now (``min_executors`` .. ``num_executors``), hold the failure until a call that can resume
the feed is waiting, or fail the cluster. The stall watchdog runs in the same loop. API calls
(``start``, ``train``, ``shutdown``, ``raise_if_failed``) never act on a failure themselves: they
wait, each with a deadline, until the loop has acted (:meth:`Supervisor._wait`), then read the
outcome. Tests drive the loop with the fake Spark (``tfos.testing.fake_spark``).

One module past 450 lines (about 760): it is the one owner of the cluster's phases (start,
restarts, resizes, the watchdog, shutdown); the pure decisions live in ``lifecycle`` and
``settings``. A seam exists between the loop (which acts) and the API side (``_wait``,
``raise_if_failed``, ``feed_check_failed``, ``train``, ``shutdown``, which only wait on the loop's
state under ``_cv``); splitting it there is the next refactor, left whole here because both halves
read and write the same few fields under one condition and the split was not re-verified in CI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time

from tfos import topology
from tfos.cluster.driver import security
from tfos.cluster.driver import spark as S
from tfos.cluster.driver import stall
from tfos.cluster.driver.lifecycle import (Action, ClusterView, Eviction, Lifecycle, NodeLoss, Phase, Resize, Restart,
                                          decide, disconnect_grace, explain_executor_loss, first_cause_first, grow_to)
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.settings import ClusterShape, RestartSettings, Supervision
from tfos.cluster.executor.bootstrap import make_bootstrap, node_dir_hint
from tfos.errors import (Cause, FeedError, Resizing, NodeFailedError, ReservationTimeoutError, StallError,
                         TFOSError, TFOSTimeoutError, remote_error)
from tfos.topology import InputMode
from tfos.wire import messages as M

logger = logging.getLogger(__name__)

#: How long a failure whose node saw its executor die waits for Spark to learn why the executor went
#: (YARN reports a finished container to the ApplicationMaster within a few seconds).
EXPLAIN_WAIT_SECS = 10.0

#: How long a failing cluster waits for the other nodes' exit reports, so that the node whose own
#: error started the failure leads the driver's error even when it reports last.
FIRST_CAUSE_WAIT_SECS = 3.0
#: how often the control loop looks at the nodes (agents lost, a failure, a stall) when nothing
#: wakes it sooner: the most a node's exit report or a lost agent's grace waits for the driver
LOOP_TICK_SECS = 0.25
#: how long a planned restart (grow, eviction) waits after rank 0's checkpoint for the other ranks'
#: feed positions at that step (InputMode.SPARK; each follows its own save by moments)
SAFE_POINT_WAIT_SECS = 10.0


class Supervisor:
    def __init__(self, spark, shape: ClusterShape, backend, config: M.ClusterConfig, registry: NodeRegistry,
                 scheduler, *, restarts: RestartSettings, supervision: Supervision, on_attempt=None,
                 on_release=None, close_feeds=None, at_safe_point=None):
        self.spark = spark
        self.cluster_id = config.cluster_id  # the first attempt's; attempt k runs as "<id>-k"
        self.shape = shape
        self.backend = backend
        self.config = config
        self.registry = registry
        self.scheduler = scheduler
        self.settings = restarts
        self.supervision = supervision
        self.on_attempt = on_attempt  # (config) -> None: a new attempt's configuration (the feeds need it)
        self.on_release = on_release  # () -> None: the cluster's reporting, TensorBoard and control service end
        self.close_feeds = close_feeds  # () -> [(node, error)]: end every node's feed (InputMode.SPARK)
        # (step) -> bool: a planned restart from the checkpoint at step may go (the feed knows every
        # rank's position there, FeedJobs.ready_to_restart); waited for up to SAFE_POINT_WAIT_SECS
        self.at_safe_point = at_safe_point or (lambda step: True)
        self.lifecycle = Lifecycle()
        self.input_mode: InputMode | None = None
        self.restarts: list[Restart] = []  # each failure that restarted the cluster
        self.lost_nodes: list[NodeLoss] = []  # each node lost while the others went on (backend='ps' workers)
        self.resizes: list[Resize] = []  # each planned restart at another size (growing back)
        self.evictions: list[Eviction] = []  # each save before nodes went, and the restart without them
        self._evicted: tuple[float, int | None] | None = None  # after one: (until when, slots left) to wait for
        self._failed_before: list = []  # NodeFailures of the attempts that were restarted
        self._main = None  # (main_fun, tf_args, node_hooks), kept for restarts
        self._attempt_started = time.time()  # when this attempt's barrier stage was submitted
        self._reservation: S.SparkJob | None = None
        self._loop: threading.Thread | None = None
        self._closing = threading.Event()
        self._released = threading.Event()  # release() finished: every node stopped, everything let go
        self._release_lock = threading.Lock()
        self._stall_thread: threading.Thread | None = None  # the watchdog's report, once a stall was seen
        # the loop's state, read by the API calls under _cv (the loop notifies after every change)
        self._cv = threading.Condition()
        self._launch_deadline: float | None = None  # an attempt is starting: when it times out (monotonic)
        self._restart_due: float | None = None  # the nodes were stopped: when the next attempt starts
        self._wanting = 0  # API calls waiting to resume a feed (InputMode.SPARK restarts only for them)
        self._held = -1  # the attempt whose failure the loop holds (logged once)
        self._stalled = False
        self._grow: tuple[int, float] | None = None  # (size to grow to, since when: monotonic), at the next checkpoint
        self._looked = time.monotonic()  # when the loop last asked Spark for more slots
        self._t_stopped = (0.0, 0.0)  # the last stop of an attempt: (began, ended), monotonic

    @property
    def roles(self) -> list[tuple[str, int]]:
        """This attempt's roles (node index -> (job, task index))."""
        return list(self.config.roles)

    @property
    def max_restarts(self) -> int:
        return self.settings.max_restarts

    # ------------------------------------------------------------------ starting
    def start(self, main, input_mode: InputMode, on_starting=None) -> None:
        """Start the first attempt: every node registered when this returns (RUNNING), else the
        cluster failed and the error is raised."""
        self.input_mode = input_mode
        self.config = dataclasses.replace(self.config, input_mode=int(input_mode))
        self._main = main
        self.lifecycle.to(Phase.STARTING)
        try:
            if on_starting is not None:
                on_starting()
            self._submit()
            self._loop = threading.Thread(target=self._run_loop, name=f"tfos-supervisor-{self.cluster_id}",
                                          daemon=True)
            self._loop.start()
            self._wait(lambda: self.lifecycle.phase is not Phase.STARTING, "the cluster to start")
        except BaseException as e:  # interrupted (Ctrl-C) or broken: nothing may be left running
            self.abort(e if isinstance(e, TFOSError) else TFOSError(f"start() interrupted by {type(e).__name__}"))
            raise
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        exposed = security.exposure(self.registry.registered(), self.supervision.allow_unprotected)
        if exposed:
            logger.warning("tfos cluster %s: %s", self.cluster_id, exposed)

    @property
    def cluster_spec(self) -> dict:
        return topology.cluster_spec(self.registry.registered())

    def _submit(self) -> None:
        """Submit this attempt's barrier stage (one task per node); the loop watches its nodes register."""
        n = len(self.config.roles)
        attempt = self.config.attempt
        self._attempt_started = time.time()
        bootstrap = make_bootstrap(self.config, *self._main)

        def reservation_ended(job):
            if job.error is not None and not self._closing.is_set() and self.config.attempt == attempt:
                self.registry.abort(f"the tfos reservation job failed: {_short(job.error)}")

        cid = self.config.cluster_id
        with self._cv:
            self._launch_deadline = time.monotonic() + self.config.reservation_timeout
        self._reservation = S.SparkJob(self.spark, f"tfos-{cid}", f"tfos cluster {cid}: {n} TF nodes"
                                       + (f" (attempt {attempt})" if attempt else ""),
                                       self.spark.barrier_stage(n, bootstrap), on_done=reservation_ended)

    def _backend_setup(self) -> bool:
        """Every node registered: the backend's configuration for them (outside the registry's
        lock), which the nodes' cluster-spec waits then get; False if it failed (the cluster fails)."""
        try:
            config = self.backend.setup(tuple(self.registry.registered()))
        except Exception as e:
            logger.exception("backend setup failed")
            self.registry.set_backend_config(None, f"backend setup on the driver failed: {e}")
            return False
        self.registry.set_backend_config(dict(config, driver_host=self.config.driver_host,
                                              log_dir=self.config.log_dir))
        return True

    # ------------------------------------------------------------------ the control loop
    def _run_loop(self) -> None:
        while not self._closing.is_set() and not self.lifecycle.ended:
            try:
                self.step()
            except Exception as e:  # a bug here must not leave the nodes running unsupervised
                logger.exception("tfos cluster %s: the supervisor's loop failed", self.cluster_id)
                self.abort(TFOSError(f"the tfos supervisor failed: {type(e).__name__}: {e}"))
                return
            due = self._launch_deadline
            ahead = None if due is None else due - time.monotonic()
            wait = LOOP_TICK_SECS if ahead is None or ahead <= 0 else min(LOOP_TICK_SECS, ahead + 0.01)
            with self.registry.cond:  # a registration, an exit report, a failure wakes it at once
                if not self._closing.is_set():
                    self.registry.cond.wait(wait)

    def step(self) -> None:
        """One turn of the control loop: look at the registry, decide, act."""
        if self.lifecycle.ended:
            return
        c = self.config
        self.registry.check_heartbeats(c.heartbeat_timeout, disconnect_grace(c.heartbeat_interval,
                                                                             c.heartbeat_timeout))
        if self._restart_due is not None:
            if time.monotonic() >= self._restart_due and self._evicted_gone():
                self._next_attempt()
            return
        snap = self.registry.snapshot()
        starting = self._launch_deadline is not None
        if starting and time.monotonic() > self._launch_deadline and not snap.all_registered():
            self._start_timed_out(snap)  # first: a node's own spec wait ends at the same time, as a failure
        elif snap.failures:
            self._on_failures(list(snap.failures))
        elif starting:
            self._watch_start(snap)
        else:
            self._check_stall()
            self._save_before_eviction()
            self._maybe_grow()

    def _maybe_grow(self) -> None:
        """A cluster running smaller than ``num_executors``: every ``grow_interval`` ask Spark how many
        slots it offers; with more, grow (:func:`lifecycle.grow_to`) at rank 0's next checkpoint
        (``ctx.checkpoint_saved``) by a planned restart, which counts against no ``max_restarts``."""
        s = self.settings
        if not s.elastic or s.grow_interval is None or self.lifecycle.phase not in (Phase.RUNNING, Phase.SHUTTING_DOWN):
            return
        with self._cv:
            resumable = self.input_mode == InputMode.TENSORFLOW or self._wanting > 0
        if not resumable:
            return
        now = time.monotonic()
        size = len(self.config.roles)
        if now - self._looked >= s.grow_interval:
            self._looked = now
            target = grow_to(size, s.max_nodes, self.spark.slots_offered())
            if target is None:
                self._grow = None
            elif self._grow is None or self._grow[0] != target:
                self._grow = (target, now)
                logger.warning("tfos cluster %s: Spark offers slots for %d nodes; the cluster grows from %d at rank "
                               "0's next checkpoint (ctx.checkpoint_saved)", self.cluster_id, target, size)
        saved = self.registry.checkpoint
        if self._grow is not None and saved is not None and saved[0] >= self._grow[1] and self._safe_point(saved):
            target = self._grow[0]
            self._grow = None
            self.resizes.append(Resize(time.time(), self.config.attempt, size, target, saved[1]))
            logger.warning("tfos cluster %s: growing from %d to %d nodes after rank 0's checkpoint at step %d",
                           self.cluster_id, size, target, saved[1])
            self._stop_attempt([])

    def _save_before_eviction(self) -> None:
        """Nodes told to go (an EvictionNotice, :mod:`evictions`): once every training rank
        checkpointed at the save round's target and rank 0 said so (``ctx.checkpoint_saved``), go on
        without them by a planned restart (no ``max_restarts`` used) once Spark no longer offers
        the slots of those whose executors still run (up to their grace and EXPLAIN_WAIT_SECS more)."""
        saves = self.registry.saves
        with self._cv:
            resumable = self.input_mode == InputMode.TENSORFLOW or self._wanting > 0
        saves.allowed = resumable and self.lifecycle.phase in (Phase.RUNNING, Phase.SHUTTING_DOWN)
        state = saves.state()
        if not state.open:
            return
        target = saves.settle()
        saved = self.registry.checkpoint
        if target < 0 or saved is None or saved[0] < state.opened_at or saved[1] < target \
                or not self._safe_point(saved):
            return
        nodes = tuple(sorted(state.evicting))
        hosts = tuple(self.registry.host_of(i) for i in nodes)
        why = state.evicting[nodes[0]][1]
        self.evictions.append(Eviction(time.time(), self.config.attempt, nodes, hosts, saved[1], why))
        # executors still running (told to go, not yet gone): wait for Spark to stop counting their
        # slots; one that ended already is not counted (a standalone worker may start a new one there)
        running = [deadline for deadline, _why, gone in state.evicting.values() if not gone]
        offered = self.spark.slots_offered() if running else None
        self._evicted = (max(running) + EXPLAIN_WAIT_SECS, offered - len(running)) if offered is not None else None
        logger.warning("tfos cluster %s: every rank saved at step %d before node(s) %s on %s go (%s); the cluster "
                       "goes on without them", self.cluster_id, saved[1], ", ".join(map(str, nodes)),
                       ", ".join(hosts), why)
        self._stop_attempt([])

    def _safe_point(self, saved: tuple[float, int]) -> bool:
        """Rank 0's checkpoint ``saved`` (monotonic time, step) is one to restart from: the feed has
        every rank's position there (their reports follow rank 0's by moments), or
        SAFE_POINT_WAIT_SECS passed (the feed then resumes without positions, and says so)."""
        return self.at_safe_point(saved[1]) or time.monotonic() - saved[0] > SAFE_POINT_WAIT_SECS

    def _evicted_gone(self) -> bool:
        """After a save before an eviction: Spark no longer offers the evicted nodes' slots, or
        their grace (and EXPLAIN_WAIT_SECS) passed; True at once after any other stop."""
        if self._evicted is None:
            return True
        until, left = self._evicted
        if left is not None and time.monotonic() < until:
            offered = self.spark.slots_offered()
            if offered is not None and offered > left:
                return False
        self._evicted = None
        return True

    def _start_timed_out(self, snap) -> None:
        c = self.config
        self.abort(ReservationTimeoutError(
            f"nodes {snap.missing()} of {len(c.roles)} did not start within {c.reservation_timeout:.0f}s "
            "(reservation_timeout). Spark may lack free slots (other jobs running?) or the TF processes are "
            "slow to import; raise reservation_timeout or free executors." + _node_logs_hint(c.cluster_id)))

    def _watch_start(self, snap) -> None:
        if snap.abort_reason:
            self.abort(TFOSError(snap.abort_reason.rstrip(".") + "." + _node_logs_hint(self.config.cluster_id)))
        elif snap.all_registered():
            if not self._backend_setup():
                return  # the next turn fails the cluster with the setup's error
            with self._cv:
                self._launch_deadline = None
                if self.lifecycle.phase is Phase.STARTING:
                    self.lifecycle.to(Phase.RUNNING)
                self._cv.notify_all()
            logger.info("tfos cluster %s%s started: %s", self.cluster_id,
                        f" attempt {self.config.attempt}" if self.config.attempt else "", json.dumps(self.cluster_spec))

    def view(self, failures) -> ClusterView:
        """What the policy decides from: the failures and the cluster's state now."""
        phase = self.lifecycle.phase
        running = phase in (Phase.RUNNING, Phase.SHUTTING_DOWN)
        with self._cv:
            resumable = self.input_mode == InputMode.TENSORFLOW or self._wanting > 0
        one = failures[0].node_index if len(failures) == 1 else -1
        return ClusterView(failures=tuple(failures), max_restarts=self.settings.max_restarts,
                           restarts_done=len({r.attempt for r in self.restarts}), running=running,
                           all_started=running and self._launch_deadline is None,
                           survivable_jobs=tuple(self.backend.survivable_jobs),
                           peers_running=self.registry.peers_running(one) if one >= 0 else 0,
                           resumable=resumable, final=phase is Phase.SHUTTING_DOWN)

    def _on_failures(self, failures) -> None:
        attempt = self.config.attempt
        failures = [dataclasses.replace(f, attempt=attempt) for f in failures]
        if len(failures) > 1:  # e.g. a host with two ps workers died: each one the backend can lose, on its own
            failures = [f for f in failures if not self._lost(f, decide(self.view([f])))]
            if not failures:
                return
        d = decide(self.view(failures))
        if self._lost(failures[0], d):
            return
        if d.action is Action.HOLD:
            if self._held != attempt:  # once: asking to stop wakes this loop again
                self._held = attempt
                self.registry.request_stop(self.registry.indexes())
                with self._cv:
                    self._launch_deadline = None  # the attempt stops: nothing is starting any more
                logger.warning("tfos cluster %s: node %s failed while no feed runs; the next train() restarts the "
                               "cluster, shutdown() raises the failure", self.cluster_id,
                               ", ".join(str(f.node_index) for f in failures))
            return
        self.registry.request_stop(self.registry.indexes())  # the others stop now, whatever comes next
        failures = self._explained(failures)
        if d.action is Action.FAIL:
            if self.settings.max_restarts > 0:
                logger.error("tfos cluster %s cannot restart: %s", self.cluster_id, d.reason)
            self.abort(NodeFailedError(self._failed_before + self._with_first_cause(failures)))
            return
        self._stop_attempt(failures)

    def _lost(self, f, d) -> bool:
        """Carry out LOSE_NODE for failure ``f`` (the run goes on without its node); False for any
        other decision ``d``."""
        if d.action is not Action.LOSE_NODE:
            return False
        self.registry.lose(f.node_index)
        self.lost_nodes.append(NodeLoss(time.time(), f.attempt, f.node_index, f.job_name, f.task_index, f.host,
                                        f.cause, f.reason))
        logger.warning("tfos cluster %s: %s:%d on %s lost (%s); %s without it", self.cluster_id, f.job_name,
                       f.task_index, f.host, f.reason, d.reason)
        with self._cv:
            self._cv.notify_all()
        return True

    def _stop_attempt(self, failures) -> None:
        """Stop every node of this attempt (failed, or ``failures`` empty: a planned resize); the
        next one starts ``restart_backoff`` later."""
        reg, attempt = self.registry, self.config.attempt
        with self._cv:
            self._restart_due = float("inf")  # restarting: the API calls wait for the next attempt
            self._launch_deadline = None
        if failures:
            logger.warning("tfos cluster %s: restarting after the failure of %s (restart %d of %d)", self.cluster_id,
                           ", ".join(f"node {f.node_index} on {f.host}: {f.reason}" for f in failures),
                           len({r.attempt for r in self.restarts}) + 1, self.settings.max_restarts)
        reg.abort("the cluster is restarting after a node failure" if failures else "the cluster is resizing")
        t_stop = time.monotonic()
        self.stop_nodes(self.registry.indexes())
        # every node that failed by itself, not only the first one the driver heard of; a planned
        # resize's stop is no failure (a node that ends as it stops is not a restart: none is used)
        known = {f.node_index for f in failures}
        if failures:
            failures += [dataclasses.replace(f, attempt=attempt) for f in reg.ended_on_their_own()
                         if f.node_index not in known]
        self.restarts += [Restart(time.time(), attempt, f.node_index, f.job_name, f.task_index, f.host, f.cause,
                                  f.reason) for f in sorted(failures, key=lambda f: f.node_index)]
        self._failed_before += failures
        job = self._reservation
        if job is not None:
            job.cancel()
        self.backend.teardown()
        self._t_stopped = (t_stop, time.monotonic())
        with self._cv:
            self._restart_due = time.monotonic() + self.settings.backoff
            self._cv.notify_all()

    def _next_attempt(self) -> None:
        """Start the attempt after a failure with as many nodes as Spark offers now (within
        ``min_executors`` .. ``num_executors``: :meth:`restart_size`)."""
        attempt = self.config.attempt + 1
        before = len(self.config.roles)
        size = self.restart_size()
        if size is None:
            return  # the cluster failed or ended meanwhile
        self._looked = time.monotonic()
        roles = self.shape.roles(size)
        config = dataclasses.replace(self.config, cluster_id=f"{self.cluster_id}-{attempt}", attempt=attempt,
                                     roles=tuple(roles))
        # an abort() from another thread fails the lifecycle first, then the registry: both under its lock
        if not self.registry.new_attempt(config.cluster_id, roles, unless=lambda: self.lifecycle.ended):
            return
        self.config = config
        self.scheduler.new_attempt([i for i, (job, _) in enumerate(roles) if job in self.backend.feed_jobs])
        if self.on_attempt is not None:
            self.on_attempt(config)
        if size != before:
            logger.warning("tfos cluster %s: attempt %d runs %d node(s), the last ran %d (min_executors=%d, "
                           "num_executors=%d: what Spark offers now)", self.cluster_id, attempt, size, before,
                           self.settings.min_nodes, self.settings.max_nodes)
        with self._cv:  # one step: a waiting call never sees "neither restarting nor starting" in between
            self._restart_due = None
            self._launch_deadline = time.monotonic() + self.config.reservation_timeout
            self._cv.notify_all()
        self._submit()
        t_stop, t_stopped = self._t_stopped
        logger.info("tfos cluster %s: attempt %d submitted (stopping the nodes took %.1fs)", self.cluster_id,
                    attempt, t_stopped - t_stop)

    def restart_size(self) -> int | None:
        """How many nodes the next attempt runs: ``num_executors`` for a fixed size (the barrier stage
        waits for them); in a range, what Spark offers once ``restart_backoff`` passed (the time a
        cluster manager has to bring a lost executor back), at most ``num_executors``, at least
        ``min_executors``: below that it waits up to reservation_timeout, then fails with
        ReservationTimeoutError (:func:`spark.wait_for_size`, as reserve() waits)."""
        s = self.settings
        if not s.elastic:
            return s.max_nodes
        try:
            return S.wait_for_size(self.spark.slots_offered, s.min_nodes, s.max_nodes, self.config.reservation_timeout,
                                   why=lambda offered, secs: (
                                       f"cannot restart the cluster: Spark offers {offered} task slot(s) after "
                                       f"{secs:.0f}s (reservation_timeout), below min_executors={s.min_nodes}. Add "
                                       "executors, lower min_executors, or raise reservation_timeout"),
                                   pause=lambda secs: self._closing.wait(secs) or self.lifecycle.ended)
        except ReservationTimeoutError as e:
            self.abort(e)
            return None

    def _explained(self, failures: list) -> list:
        """``failures`` with what Spark knows of their executors' loss (YARN's "Container killed by
        YARN for exceeding physical memory limits", ...). An executor whose node agent saw it die is
        reported by the cluster manager moments later: wait up to EXPLAIN_WAIT_SECS for that."""
        # only when the node saw its executor go (or be told to): a lost agent or a crash is known now
        wait = any(f.cause in (Cause.EXECUTOR_LOST, Cause.EVICTED) for f in failures)
        deadline = time.monotonic() + (EXPLAIN_WAIT_SECS if wait else 0)
        while True:
            removed = self.spark.removed_executors()
            notes = [explain_executor_loss(f.host, f.cause, removed, self._attempt_started) for f in failures]
            if any(notes) or time.monotonic() >= deadline or self._closing.is_set():
                break
            time.sleep(0.5)
        return [dataclasses.replace(f, reason=f.reason + note) if note else f for f, note in zip(failures, notes)]

    def _with_first_cause(self, failures: list) -> list:
        """``failures`` and the nodes that failed on their own meanwhile, the first cause first.
        The node whose own error started it may report after a peer whose collective it aborted:
        wait up to FIRST_CAUSE_WAIT_SECS for the other nodes' exit reports."""
        reg, attempt = self.registry, self.config.attempt
        started = reg.started(reg.indexes())
        reg.wait_until(lambda snap: not snap.unfinished(started), FIRST_CAUSE_WAIT_SECS)
        known = {f.node_index for f in failures}
        more = [dataclasses.replace(f, attempt=attempt) for f in reg.ended_on_their_own() if f.node_index not in known]
        return first_cause_first(failures + more)

    def every_failure(self) -> list:
        """The failures of the restarted attempts, then this attempt's."""
        return self._failed_before + [dataclasses.replace(f, attempt=self.config.attempt)
                                      for f in self.registry.snapshot().failures]

    def _trainers(self) -> list[int]:
        return [i for i, (job, _) in enumerate(self.config.roles) if job in self.backend.finishing_jobs]

    def _check_stall(self) -> None:
        """The stall watchdog: no training rank made progress for ``stall_timeout`` while every node
        is alive -> every TF process's stacks, and the cluster fails with StallError."""
        if self.lifecycle.phase not in (Phase.RUNNING, Phase.SHUTTING_DOWN) or self._stalled:
            return
        last = self.registry.last_progress(self._trainers())
        if not stall.stalled(time.monotonic(), last, self.supervision.stall_timeout):
            return
        self._stalled = True
        secs = time.monotonic() - last
        # the report waits up to 10 s for the nodes' stacks: the loop keeps watching meanwhile
        self._stall_thread = threading.Thread(target=lambda: self.abort(StallError(self.stall_report(secs))),
                                              name=f"tfos-stall-{self.cluster_id}", daemon=True)
        self._stall_thread.start()

    def stall_report(self, secs: float | None, timeout: float = 10.0) -> str:
        return stall.stall_message(secs, [(label, dump, tail)
                                          for label, (dump, tail) in self.dump_stacks(timeout).items()])

    def dump_stacks(self, timeout: float = 10.0) -> dict[str, tuple[str, str]]:
        """Every running node's TF process stacks and last log lines, by a label naming the node."""
        answers = self.registry.collect_stacks(timeout)
        out = {}
        for i, (job, idx) in enumerate(self.config.roles):
            a = answers.get(i)
            label = f"node {i} ({job}:{idx} on {self.registry.host_of(i)})"
            out[label] = (a.stacks, a.log_tail) if a else ("(no answer: the node is not running or did not "
                                                           f"answer within {timeout:.0f}s)", "")
        return out

    # ------------------------------------------------------------------ what the API calls wait for
    def _limit(self) -> float:
        """The longest the loop may take to act on a failure: explain it, stop the nodes, back off,
        wait for slots, start the next attempt (each step has its own deadline; this bounds them all)."""
        c, s = self.config, self.settings
        return (EXPLAIN_WAIT_SECS + FIRST_CAUSE_WAIT_SECS + 2 * c.heartbeat_interval + c.stop_grace_secs + 15
                + s.backoff + s.size_wait + 2 * c.reservation_timeout + 60)

    def _wait(self, ready, what: str) -> None:
        """Wait until ``ready()`` (checked under the loop's condition) or the cluster ended, and then
        until its nodes were stopped and everything released (an abort by the loop finishes before
        the call that waited raises); TFOSTimeoutError after :meth:`_limit` seconds (the loop has its
        own, shorter deadlines)."""
        limit = self._limit()
        deadline = time.monotonic() + limit
        with self._cv:
            while not (ready() or self.lifecycle.ended):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TFOSTimeoutError(f"the supervisor did not finish {what} within {limit:.0f}s; see the "
                                           "driver's log (raise reservation_timeout if Spark is slow to offer slots)")
                self._cv.wait(min(remaining, LOOP_TICK_SECS))
        if self.lifecycle.phase is Phase.FAILED:
            self._released.wait(max(1.0, min(deadline - time.monotonic(), self._stop_secs() + 60)))

    def _stop_secs(self) -> float:
        """How long stopping every node may take (:meth:`stop_nodes`)."""
        c = self.config
        return c.heartbeat_interval * 2 + c.stop_grace_secs + 15

    def _settled(self) -> bool:
        """The loop has acted on every failure it knows: no attempt stopping or starting, none failed."""
        return (self._restart_due is None and self._launch_deadline is None
                and not self.registry.snapshot().failures)

    def raise_if_failed(self) -> None:
        """Raise the cluster's error if it failed; with restarts left, wait while the loop restarts
        it after a node failure (an InputMode.SPARK call waiting here lets it restart)."""
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        if self._settled():
            return
        with self._wanted():
            self._wait(self._settled, "acting on a node failure")
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error

    def feed_check_failed(self) -> None:
        """For a feed in progress: raise NodeFailedError once the loop restarts the cluster after a
        node failure (train() then feeds the new attempt), the cluster's error if it failed; return
        when the loop went on without the failed node."""
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        failures = list(self.registry.snapshot().failures)
        if not failures and self._restart_due is None:
            return
        attempt = self.config.attempt
        self._wait(lambda: self._restart_due is not None or self.config.attempt != attempt
                   or not self.registry.snapshot().failures, "acting on a node failure")
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        if self._restart_due is not None or self.config.attempt != attempt:
            if failures:
                raise NodeFailedError(failures)
            raise Resizing(f"the cluster restarts at another size (attempt {attempt} stopped): the feed goes to "
                           "the next attempt")

    @contextlib.contextmanager
    def _wanted(self):
        """While inside: a call waits to resume a feed, so an InputMode.SPARK failure restarts."""
        with self._cv:
            self._wanting += 1
        try:
            yield
        finally:
            with self._cv:
                self._wanting -= 1

    # ------------------------------------------------------------------ feeding
    def train(self, feed, resume=None) -> int:
        """``feed(resume)`` (FeedJobs.train); returns the rows fed. With restarts allowed
        (``resume``: the feed's FeedResume), a restart of the cluster while it feeds (a failure, a
        resize, an eviction) or right after (before the nodes trained on the last rows) feeds the
        new attempt again, from where ``resume`` says the checkpoint is."""
        if resume is None:
            return feed(None)
        with self._wanted():
            while True:
                attempt = self.config.attempt
                try:
                    feed(resume)
                except (NodeFailedError, Resizing):  # a failure, or a planned restart at another size
                    self._wait(self._settled, "restarting the cluster")
                    if self.lifecycle.phase is Phase.FAILED:
                        raise self.lifecycle.error from None
                    logger.warning("tfos: the cluster restarted while feeding; %s", resume.restarted(during_feed=True))
                    continue
                self._wait(self._settled, "acting on a node failure")
                if self.lifecycle.phase is Phase.FAILED:
                    raise self.lifecycle.error
                if self.config.attempt == attempt:
                    return resume.fed
                # restarted after the last rows were handed over, before the nodes trained on them
                logger.warning("tfos: the cluster restarted at the end of the feed; %s",
                               resume.restarted(during_feed=False))

    # ------------------------------------------------------------------ stopping
    def shutdown(self, grace_secs: float, timeout: float) -> None:
        """Wait for the training nodes (the loop restarts them after failures while allowed), stop
        the others, release everything; raises NodeFailedError or TFOSTimeoutError."""
        if timeout is None or timeout < 0:  # TensorFlowOnSpark: timeout=-1 waits forever
            timeout = float("inf")
        if self.input_mode == InputMode.SPARK:
            unreached = self.close_feeds()
            if unreached:  # those nodes would wait for data forever
                raise FeedError("could not end the feed of " + "; ".join(f"node {i}: {e}" for i, e in unreached)
                                + ". Their TF processes cannot finish; see the nodes' logs")
        reg = self.registry
        if reg.unfinished(self._trainers()):
            logger.info("tfos cluster %s: waiting up to %s for training nodes %s to finish "
                        "(cluster.shutdown(timeout=...))", self.cluster_id,
                        "ever" if timeout == float("inf") else f"{timeout:.0f}s", reg.unfinished(self._trainers()))
        deadline = time.monotonic() + timeout
        while True:
            trainers = self._trainers()
            reg.wait_until(lambda s: not s.unfinished(trainers) or bool(s.failures) or self.lifecycle.ended
                           or self._restart_due is not None,
                           deadline - time.monotonic(),
                           lambda s: f"training nodes {s.unfinished(trainers)} still running",
                           "shutdown(timeout=...)", poll=1.0 if timeout == float("inf") else LOOP_TICK_SECS)
            if self.lifecycle.ended:
                break
            if not self._settled():
                # InputMode.TENSORFLOW: the loop runs main_fun again from its checkpoint, or fails the
                # cluster. InputMode.SPARK: after the last feed there is nothing to resume: it fails.
                self._wait(self._settled, "acting on a node failure")
                continue
            if not reg.unfinished(self._trainers()):
                break
        if self.lifecycle.phase is Phase.FAILED:  # a failure, the stall watchdog or an abort ended it
            self._released.wait(self._stop_secs() + 60)
            raise self.lifecycle.error
        others = [i for i in reg.indexes() if i not in self._trainers()]
        if others and not reg.snapshot().failures:
            reg.wait_until(lambda s: not s.unfinished(others), grace_secs)
        self._closing.set()  # the loop ends: what happens now is the end, not a failure to act on
        self._join_loop()
        if self.lifecycle.phase is Phase.FAILED:  # the loop failed it before it ended
            self._released.wait(self._stop_secs() + 60)
            raise self.lifecycle.error
        self.stop_nodes(self.registry.indexes())
        if reg.snapshot().failures:
            self.lifecycle.fail(NodeFailedError(self.every_failure()))
            self.release()
            raise self.lifecycle.error
        self.release()
        self.lifecycle.to(Phase.SHUT_DOWN)
        logger.info("tfos cluster %s shut down", self.cluster_id)

    def stop_nodes(self, which) -> None:
        """Ask the agents of ``which`` nodes to stop and wait until they report their exits (an
        agent that is gone counts as exited at once: :func:`lifecycle.agent_lost` while stopping)."""
        which = list(which)
        reg = self.registry
        reg.request_stop(which)
        c = self.config
        timeout = self._stop_secs()
        deadline = time.monotonic() + timeout
        started = reg.started(which)
        grace = disconnect_grace(c.heartbeat_interval, c.heartbeat_timeout)
        while not reg.wait_until(lambda s: not s.unfinished(started), min(LOOP_TICK_SECS, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                logger.warning("tfos nodes %s did not confirm their exit within %.0fs", reg.unfinished(started),
                               timeout)
                return
            reg.check_heartbeats(c.heartbeat_timeout, grace)

    def abort(self, err: TFOSError) -> None:
        """Fail the cluster (once): stop every node and release everything."""
        with self._cv:
            failed = self.lifecycle.fail(err)
            self._cv.notify_all()
        if not failed:
            return
        try:
            self.registry.abort(str(err).splitlines()[0] if str(err) else type(err).__name__)
            self.stop_nodes(self.registry.indexes())
            if self._join_loop():  # it may have started an attempt meanwhile: stop that one too
                self.stop_nodes(self.registry.indexes())
        finally:
            self.release()

    def _join_loop(self) -> bool:
        """Wait for the control loop to end (unless this is it); True if it was running."""
        loop = self._loop
        if loop is None or loop is threading.current_thread() or not loop.is_alive():
            return False
        with self.registry.cond:
            self.registry.cond.notify_all()
        loop.join(timeout=120)
        return True

    def release(self) -> None:
        """Let go of everything (once): the barrier job, the control loop, the backend, and the
        cluster's reporting, TensorBoard and control service (``on_release``)."""
        with self._release_lock:
            if self._released.is_set():
                return
            try:
                self._closing.set()
                with self._cv:
                    self._cv.notify_all()
                job = self._reservation
                if job is not None and not job.done.is_set():
                    job.thread.join(timeout=10)
                    job.cancel()
                self._join_loop()
                self.backend.teardown()
                if self.on_release is not None:
                    self.on_release()
            finally:
                self._released.set()
                with self._cv:
                    self._cv.notify_all()


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

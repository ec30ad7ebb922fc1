"""The control loop: the one actor of a cluster (runs on the driver, one thread per cluster).

Everything that changes a cluster happens in this loop's thread: it submits each attempt's
barrier stage, sets the backend up once every node registered, checks the agents' heartbeats,
decides on node failures (the pure policy :func:`tfos.cluster.driver.lifecycle.decide`), stops an
attempt's nodes for a restart, a resize or a save before an eviction, starts the next attempt,
watches for stalls, fails the cluster and ends it (every node stopped, everything released).
Other threads never act: an API call, the stall watchdog's report, a feed that broke *post* a
request (:class:`Start`, :class:`Abort`, :class:`Finish`) and wait on the loop's state
(:mod:`tfos.cluster.driver.supervisor` holds those waits).

The attempt's state is one immutable value (:mod:`tfos.cluster.driver.attempt`): ``Idle`` ->
``Starting`` -> ``Running`` (-> ``Holding`` while an InputMode.SPARK failure waits for a feed
call) -> ``Stopping`` -> ``BackingOff`` -> ``Starting`` (the next attempt) ..., and ``Ended``.
Each turn (:meth:`Controller.step`) looks (a ``Look``), asks the pure ``next_move`` what to do,
and carries it out; docs/design.md has the table, tests/unit/test_controller.py turns it by hand.

One module past 450 lines (about 620): every act here reads and writes the attempt's state in
the loop's one thread; the pure parts are in ``attempt``, ``lifecycle`` and ``settings``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import threading
import time

from tfos import topology
from tfos.cluster.driver import spark as S
from tfos.cluster.driver import stall
from tfos.cluster.driver.attempt import (Abort, BackingOff, Ended, Holding, Idle, Look, Move, Running, Start, Starting,
                                         Stopping, next_move)
from tfos.cluster.driver.lifecycle import (Action, ClusterView, Eviction, Lifecycle, NodeLoss, Phase, Resize, Restart,
                                          decide, disconnect_grace, explain_executor_loss, first_cause_first, grow_to)
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.settings import ClusterShape, RestartSettings, Supervision
from tfos.cluster.executor.bootstrap import make_bootstrap, node_dir_hint
from tfos.errors import (Cause, NodeFailedError, ReservationTimeoutError, StallError, TFOSError, remote_error)
from tfos.host.deadline import Deadline
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


class Controller:
    """The loop and its acts (see the module's docstring). ``clock`` is monotonic seconds;
    ``spark_job(spark, group, description, action, on_done=)`` runs a barrier stage (a thread of
    its own: :class:`tfos.cluster.driver.spark.SparkJob`). Tests give both, to turn the loop by hand."""

    def __init__(self, spark, shape: ClusterShape, backend, config: M.ClusterConfig, registry: NodeRegistry,
                 scheduler, *, restarts: RestartSettings, supervision: Supervision, on_attempt=None,
                 on_release=None, close_feeds=None, at_safe_point=None, clock=time.monotonic,
                 spark_job=S.SparkJob):
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
        self.clock = clock
        self.spark_job = spark_job
        self.lifecycle = Lifecycle()
        self.input_mode: InputMode | None = None
        self.restarts: list[Restart] = []  # each failure that restarted the cluster
        self.lost_nodes: list[NodeLoss] = []  # each node lost while the others went on (backend='ps' workers)
        self.resizes: list[Resize] = []  # each planned restart at another size (growing back)
        self.evictions: list[Eviction] = []  # each save before nodes went, and the restart without them
        self._failed_before: list = []  # NodeFailures of the attempts that were restarted
        self._main = None  # (main_fun, tf_args, node_hooks), kept for restarts
        self._attempt_started = time.time()  # when this attempt's barrier stage was submitted
        self._reservation: S.SparkJob | None = None
        self._loop: threading.Thread | None = None
        self._loop_lock = threading.Lock()
        self._released = threading.Event()  # every node stopped, everything let go
        self._releasing = False
        # the loop's state and the posted requests, read by the API side under _cv (notified on change)
        self._cv = threading.Condition()
        self.state = Idle()
        self._requests: collections.deque = collections.deque()
        self._wanting = 0  # API calls waiting to resume a feed (InputMode.SPARK restarts only for them)
        self._grow: tuple[int, float] | None = None  # (size to grow to, since when), at the next checkpoint
        self._looked = clock()  # when the loop last asked Spark for more slots
        self._stall_thread: threading.Thread | None = None  # the watchdog's report, once a stall was seen

    @property
    def roles(self) -> list[tuple[str, int]]:
        """This attempt's roles (node index -> (job, task index))."""
        return list(self.config.roles)

    @property
    def max_restarts(self) -> int:
        return self.settings.max_restarts

    @property
    def cluster_spec(self) -> dict:
        return topology.cluster_spec(self.registry.registered())

    # ------------------------------------------------------------------ posting (any thread)
    def post(self, request) -> None:
        """Hand ``request`` to the loop (started here if it is not running yet) and wake it."""
        with self._cv:
            self._requests.append(request)
            self._cv.notify_all()
        with self._loop_lock:
            if self._loop is None:
                self._loop = threading.Thread(target=self._run_loop, name=f"tfos-supervisor-{self.cluster_id}",
                                              daemon=True)
                self._loop.start()
        self.registry.notify()

    def in_loop(self) -> bool:
        return self._loop is threading.current_thread()

    def _interrupted(self) -> bool:
        """A request waits, or the cluster ended: a long act (a slot wait, an explanation) stops early."""
        return bool(self._requests) or self.lifecycle.ended

    # ------------------------------------------------------------------ the loop
    def _run_loop(self) -> None:
        while not isinstance(self.state, Ended):
            try:
                self.step()
            except Exception as e:  # a bug here must not leave the nodes running unsupervised
                logger.exception("tfos cluster %s: the supervisor's loop failed", self.cluster_id)
                self._end(TFOSError(f"the tfos supervisor failed: {type(e).__name__}: {e}"))
                return
            if isinstance(self.state, Ended):
                return
            due = self.state.deadline if isinstance(self.state, Starting) else None
            ahead = None if due is None else due - self.clock()
            wait = LOOP_TICK_SECS if ahead is None or ahead <= 0 else min(LOOP_TICK_SECS, ahead + 0.01)
            with self.registry.cond:  # a registration, an exit report, a failure, a request wakes it at once
                if not self._requests:
                    self.registry.cond.wait(wait)

    def _set(self, state) -> None:
        with self._cv:
            self.state = state
            self._cv.notify_all()

    def look(self) -> Look:
        with self._cv:
            request = self._requests[0] if self._requests else None
        snap = self.registry.snapshot()
        return Look(self.clock(), request, bool(snap.failures), snap.all_registered(), snap.abort_reason or "")

    def step(self) -> Move:
        """One turn: look, decide (:func:`next_move`), act. Returns the move made."""
        if isinstance(self.state, Ended):
            return Move.NOTHING
        c = self.config
        if not isinstance(self.state, (Idle, BackingOff)):
            self.registry.check_heartbeats(c.heartbeat_timeout, disconnect_grace(c.heartbeat_interval,
                                                                                 c.heartbeat_timeout))
        look = self.look()
        move = next_move(self.state, look)
        if look.request is not None and (move in (Move.SUBMIT, Move.ABORT, Move.FINISH)
                                         or isinstance(look.request, Start)):  # a Start once started: stale
            with self._cv:
                self._requests.popleft()
        if move is Move.SUBMIT:
            self._submit(0)
        elif move is Move.ABORT:
            self._end(look.request.error)
        elif move is Move.FINISH:
            self._finish(look.request.grace_secs)
        elif move is Move.TIMED_OUT:
            self._start_timed_out()
        elif move is Move.ON_FAILURES:
            self._on_failures(list(self.registry.snapshot().failures))
        elif move is Move.START_BROKEN:
            self._end(TFOSError(look.abort_reason.rstrip(".") + "." + _node_logs_hint(self.config.cluster_id)))
        elif move is Move.STARTED:
            self._started()
        elif move is Move.WATCH:
            self._check_stall()
            self._save_before_eviction()
            self._maybe_grow()
        elif move is Move.NEXT_ATTEMPT:
            if self._evicted_gone():
                self._next_attempt()
        return move

    # ------------------------------------------------------------------ starting an attempt
    def _submit(self, attempt: int) -> None:
        """Submit ``attempt``'s barrier stage (one task per node); the next turns watch its nodes register."""
        n = len(self.config.roles)
        self._attempt_started = time.time()
        bootstrap = make_bootstrap(self.config, *self._main)

        def reservation_ended(job):
            if job.error is not None and not self._interrupted() and not self._releasing \
                    and self.config.attempt == attempt:
                self.registry.abort(f"the tfos reservation job failed: {_short(job.error)}")

        cid = self.config.cluster_id
        self._set(Starting(attempt, self.clock() + self.config.reservation_timeout))
        self._reservation = self.spark_job(self.spark, f"tfos-{cid}", f"tfos cluster {cid}: {n} TF nodes"
                                           + (f" (attempt {attempt})" if attempt else ""),
                                           self.spark.barrier_stage(n, bootstrap), on_done=reservation_ended)

    def _start_timed_out(self) -> None:
        c, snap = self.config, self.registry.snapshot()
        self._end(ReservationTimeoutError(
            f"nodes {snap.missing()} of {len(c.roles)} did not start within {c.reservation_timeout:.0f}s "
            "(reservation_timeout). Spark may lack free slots (other jobs running?) or the TF processes are "
            "slow to import; raise reservation_timeout or free executors." + _node_logs_hint(c.cluster_id)))

    def _started(self) -> None:
        """Every node registered: the backend's configuration for them (outside the registry's
        lock), which the nodes' cluster-spec waits then get; if it fails, the next turn fails the
        cluster with the setup's error (the nodes' spec waits fail)."""
        try:
            config = self.backend.setup(tuple(self.registry.registered()))
        except Exception as e:
            logger.exception("backend setup failed")
            self.registry.set_backend_config(None, f"backend setup on the driver failed: {e}")
            return
        self.registry.set_backend_config(dict(config, driver_host=self.config.driver_host,
                                              log_dir=self.config.log_dir))
        with self._cv:
            if self.lifecycle.phase is Phase.STARTING:
                self.lifecycle.to(Phase.RUNNING)
            self.state = Running(self.config.attempt)
            self._cv.notify_all()
        logger.info("tfos cluster %s%s started: %s", self.cluster_id,
                    f" attempt {self.config.attempt}" if self.config.attempt else "", json.dumps(self.cluster_spec))

    # ------------------------------------------------------------------ failures
    def resumable(self) -> bool:
        with self._cv:
            return self.input_mode == InputMode.TENSORFLOW or self._wanting > 0

    def view(self, failures) -> ClusterView:
        """What the policy decides from: the failures and the cluster's state now."""
        phase = self.lifecycle.phase
        running = phase in (Phase.RUNNING, Phase.SHUTTING_DOWN)
        one = failures[0].node_index if len(failures) == 1 else -1
        return ClusterView(failures=tuple(failures), max_restarts=self.settings.max_restarts,
                           restarts_done=len({r.attempt for r in self.restarts}), running=running,
                           all_started=running and not isinstance(self.state, Starting),
                           survivable_jobs=tuple(self.backend.survivable_jobs),
                           peers_running=self.registry.peers_running(one) if one >= 0 else 0,
                           resumable=self.resumable(), final=phase is Phase.SHUTTING_DOWN)

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
            if not isinstance(self.state, Holding):  # once: asking to stop wakes this loop again
                self.registry.request_stop(self.registry.indexes())
                self._set(Holding(attempt))
                logger.warning("tfos cluster %s: node %s failed while no feed runs; the next train() restarts the "
                               "cluster, shutdown() raises the failure", self.cluster_id,
                               ", ".join(str(f.node_index) for f in failures))
            return
        self.registry.request_stop(self.registry.indexes())  # the others stop now, whatever comes next
        failures = self._explained(failures)
        if d.action is Action.FAIL:
            if self.settings.max_restarts > 0:
                logger.error("tfos cluster %s cannot restart: %s", self.cluster_id, d.reason)
            self._end(NodeFailedError(self._failed_before + self._with_first_cause(failures)))
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

    def _explained(self, failures: list) -> list:
        """``failures`` with what Spark knows of their executors' loss (YARN's "Container killed by
        YARN for exceeding physical memory limits", ...). An executor whose node agent saw it die is
        reported by the cluster manager moments later: wait up to EXPLAIN_WAIT_SECS for that."""
        # only when the node saw its executor go (or be told to): a lost agent or a crash is known now
        wait = any(f.cause in (Cause.EXECUTOR_LOST, Cause.EVICTED) for f in failures)
        deadline = Deadline(EXPLAIN_WAIT_SECS if wait else 0, self.clock)
        while True:
            removed = self.spark.removed_executors()
            notes = [explain_executor_loss(f.host, f.cause, removed, self._attempt_started) for f in failures]
            if any(notes) or deadline.expired() or self._interrupted():
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

    # ------------------------------------------------------------------ restarts and resizes
    def _stop_attempt(self, failures, evicted: tuple[float, int] | None = None) -> None:
        """Stop every node of this attempt (failed, or ``failures`` empty: a planned resize or a save
        before an eviction); the next one starts ``restart_backoff`` later."""
        reg, attempt = self.registry, self.config.attempt
        self._set(Stopping(attempt))  # the API calls wait for the next attempt
        if failures:
            logger.warning("tfos cluster %s: restarting after the failure of %s (restart %d of %d)", self.cluster_id,
                           ", ".join(f"node {f.node_index} on {f.host}: {f.reason}" for f in failures),
                           len({r.attempt for r in self.restarts}) + 1, self.settings.max_restarts)
        reg.abort("the cluster is restarting after a node failure" if failures else "the cluster is resizing")
        t_stop = self.clock()
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
        logger.info("tfos cluster %s: attempt %d stopped in %.1fs", self.cluster_id, attempt, self.clock() - t_stop)
        self._set(BackingOff(attempt, self.clock() + self.settings.backoff, evicted))

    def _evicted_gone(self) -> bool:
        """After a save before an eviction: Spark no longer offers the evicted nodes' slots, or
        their grace (and EXPLAIN_WAIT_SECS) passed; True at once after any other stop."""
        evicted = self.state.evicted
        if evicted is None:
            return True
        until, left = evicted
        if self.clock() < until:
            offered = self.spark.slots_offered()
            if offered is not None and offered > left:
                return False
        return True

    def _next_attempt(self) -> None:
        """Start the attempt after a stop with as many nodes as Spark offers now (within
        ``min_executors`` .. ``num_executors``: :meth:`restart_size`)."""
        attempt = self.config.attempt + 1
        before = len(self.config.roles)
        size = self.restart_size()
        if size is None:
            return  # a request came, or the cluster failed: the next turn acts on it
        self._looked = self.clock()
        roles = self.shape.roles(size)
        config = dataclasses.replace(self.config, cluster_id=f"{self.cluster_id}-{attempt}", attempt=attempt,
                                     roles=tuple(roles))
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
        self._submit(attempt)  # Starting, in one step: a waiting call never sees "neither restarting nor starting"
        logger.info("tfos cluster %s: attempt %d submitted", self.cluster_id, attempt)

    def restart_size(self) -> int | None:
        """How many nodes the next attempt runs: ``num_executors`` for a fixed size (the barrier stage
        waits for them); in a range, what Spark offers once ``restart_backoff`` passed (the time a
        cluster manager has to bring a lost executor back), at most ``num_executors``, at least
        ``min_executors``: below that it waits up to reservation_timeout, then fails with
        ReservationTimeoutError (:func:`spark.wait_for_size`, as reserve() waits). None when a
        request came meanwhile (the next turn acts on it)."""
        s = self.settings
        if not s.elastic:
            return s.max_nodes
        try:
            return S.wait_for_size(self.spark.slots_offered, s.min_nodes, s.max_nodes, self.config.reservation_timeout,
                                   why=lambda offered, secs: (
                                       f"cannot restart the cluster: Spark offers {offered} task slot(s) after "
                                       f"{secs:.0f}s (reservation_timeout), below min_executors={s.min_nodes}. Add "
                                       "executors, lower min_executors, or raise reservation_timeout"),
                                   pause=self._pause)
        except ReservationTimeoutError as e:
            self._end(e)
            return None

    def _pause(self, secs: float) -> bool:
        """Sleep ``secs`` unless a request comes; True if one did (the slot wait gives up)."""
        with self.registry.cond:
            if not self._interrupted():
                self.registry.cond.wait(secs)
        return self._interrupted()

    def _maybe_grow(self) -> None:
        """A cluster running smaller than ``num_executors``: every ``grow_interval`` ask Spark how many
        slots it offers; with more, grow (:func:`lifecycle.grow_to`) at rank 0's next checkpoint
        (``ctx.checkpoint_saved``) by a planned restart, which counts against no ``max_restarts``."""
        s = self.settings
        if not s.elastic or s.grow_interval is None or self.lifecycle.phase not in (Phase.RUNNING, Phase.SHUTTING_DOWN):
            return
        if not self.resumable():
            return
        now = self.clock()
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
        saves.allowed = self.resumable() and self.lifecycle.phase in (Phase.RUNNING, Phase.SHUTTING_DOWN)
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
        evicted = (max(running) + EXPLAIN_WAIT_SECS, offered - len(running)) if offered is not None else None
        logger.warning("tfos cluster %s: every rank saved at step %d before node(s) %s on %s go (%s); the cluster "
                       "goes on without them", self.cluster_id, saved[1], ", ".join(map(str, nodes)),
                       ", ".join(hosts), why)
        self._stop_attempt([], evicted)

    def _safe_point(self, saved: tuple[float, int]) -> bool:
        """Rank 0's checkpoint ``saved`` (monotonic time, step) is one to restart from: the feed has
        every rank's position there (their reports follow rank 0's by moments), or
        SAFE_POINT_WAIT_SECS passed (the feed then resumes without positions, and says so)."""
        return self.at_safe_point(saved[1]) or self.clock() - saved[0] > SAFE_POINT_WAIT_SECS

    # ------------------------------------------------------------------ the stall watchdog
    def _trainers(self) -> list[int]:
        return [i for i, (job, _) in enumerate(self.config.roles) if job in self.backend.finishing_jobs]

    def _check_stall(self) -> None:
        """No training rank made progress for ``stall_timeout`` while every node is alive -> every TF
        process's stacks are gathered by a thread of their own (up to 10 s, the loop keeps watching),
        which posts the cluster's StallError."""
        if self.lifecycle.phase not in (Phase.RUNNING, Phase.SHUTTING_DOWN) or not isinstance(self.state, Running) \
                or self.state.stalled:
            return
        last = self.registry.last_progress(self._trainers())
        if not stall.stalled(self.clock(), last, self.supervision.stall_timeout):
            return
        self._set(dataclasses.replace(self.state, stalled=True))
        self.report_stall(self.clock() - last)

    def report_stall(self, secs: float) -> None:
        """Gather every node's stacks in a thread of its own (up to 10 s) and post the StallError."""
        self._stall_thread = threading.Thread(target=lambda: self.post(Abort(StallError(self.stall_report(secs)))),
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

    # ------------------------------------------------------------------ the end
    def stop_secs(self) -> float:
        """How long stopping every node may take (:meth:`stop_nodes`)."""
        c = self.config
        return c.heartbeat_interval * 2 + c.stop_grace_secs + 15

    def stop_nodes(self, which) -> None:
        """Ask the agents of ``which`` nodes to stop and wait until they report their exits (an
        agent that is gone counts as exited at once: :func:`lifecycle.agent_lost` while stopping)."""
        which = list(which)
        reg = self.registry
        reg.request_stop(which)
        c = self.config
        timeout = self.stop_secs()
        deadline = Deadline(timeout, self.clock)
        started = reg.started(which)
        grace = disconnect_grace(c.heartbeat_interval, c.heartbeat_timeout)
        while not reg.wait_until(lambda s: not s.unfinished(started), deadline.slice(LOOP_TICK_SECS)):
            if deadline.expired():
                logger.warning("tfos nodes %s did not confirm their exit within %.0fs", reg.unfinished(started),
                               timeout)
                return
            reg.check_heartbeats(c.heartbeat_timeout, grace)

    def _finish(self, grace_secs: float) -> None:
        """shutdown()'s end (the training nodes are done): up to ``grace_secs`` for the other nodes
        (ps, evaluator), then every node stopped and everything released; the cluster fails if a
        node failed meanwhile. Before start(): only the release."""
        reg = self.registry
        started = not isinstance(self.state, Idle)
        if started:
            others = [i for i in reg.indexes() if i not in self._trainers()]
            if others and not reg.snapshot().failures:
                reg.wait_until(lambda s: not s.unfinished(others), grace_secs)
            self.stop_nodes(reg.indexes())
            if reg.snapshot().failures:
                self._end(NodeFailedError(self.every_failure()))
                return
        self._release()
        with self._cv:
            if self.lifecycle.phase is Phase.SHUTTING_DOWN:
                self.lifecycle.to(Phase.SHUT_DOWN)
            self.state = Ended()
            self._cv.notify_all()
        self._released.set()
        if started:
            logger.info("tfos cluster %s shut down", self.cluster_id)

    def _end(self, err: TFOSError) -> None:
        """Fail the cluster with ``err`` (the first error only): stop every node, release everything."""
        with self._cv:
            self.lifecycle.fail(err)
            self._cv.notify_all()
        try:
            self.registry.abort(str(err).splitlines()[0] if str(err) else type(err).__name__)
            self.stop_nodes(self.registry.indexes())
            self._release()
        finally:
            with self._cv:
                self.state = Ended()
                self._cv.notify_all()
            self._released.set()

    def _release(self) -> None:
        """Let go of everything: the barrier job, the backend, and the cluster's reporting,
        TensorBoard and control service (``on_release``)."""
        self._releasing = True  # the barrier job's end (cancelled here) is no failure any more
        job = self._reservation
        if job is not None and not job.done.is_set():
            job.thread.join(timeout=10)
            job.cancel()
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

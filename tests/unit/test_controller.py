"""The control loop one turn at a time (issue 52, items 1 and 5).

* :func:`next_move`, the loop's pure decision, from a table.
* :meth:`Controller.step` turned by hand: the real registry, backend, feed scheduler and failure
  policy, a clock the test moves, barrier stages recorded instead of run, and the nodes' agents
  played by calling the registry's handlers with the messages they send (an agent told to stop
  reports its exit at once). No thread, no sleep: each row is a path of failure, eviction, resize,
  stall or shutdown, with the states the loop goes through.
* The loop as the only actor: no code outside the controller stops nodes or releases (read from
  the source), and on the fake Spark every stop and release of every path runs in the loop's thread.
"""

from __future__ import annotations

import ast
import os
import threading
import time

import pytest

from tfos import TFCluster
from tfos.backends import make_backend
from tfos.cluster.driver.attempt import (Abort, BackingOff, Ended, Finish, Holding, Idle, Look, Move, Running, Start,
                                         Starting, Stopping, next_move)
from tfos.cluster.driver.controller import Controller
from tfos.cluster.driver.lifecycle import Phase
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.settings import ClusterShape, RestartSettings, Supervision
from tfos.errors import Cause, NodeFailedError, ReservationTimeoutError, StallError, TFOSError
from tfos.feed.driver.scheduler import FeedScheduler
from tfos.testing.fake_spark import Does, FakeSpark
from tfos.topology import InputMode
from tfos.wire import messages as M

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tfos")
T = 1000.0
ERR = TFOSError("boom")


# ---------------------------------------------------------------------- the pure decision
@pytest.mark.parametrize("state,look,move", [
    (Idle(), Look(T), Move.NOTHING),
    (Idle(), Look(T, Start()), Move.SUBMIT),
    (Idle(), Look(T, Finish(0)), Move.FINISH),  # shutdown() before start(): release only
    (Idle(), Look(T, Abort(ERR)), Move.ABORT),
    (Starting(0, T + 1), Look(T), Move.NOTHING),
    (Starting(0, T + 1), Look(T, all_registered=True), Move.STARTED),
    (Starting(0, T - 1), Look(T), Move.TIMED_OUT),
    (Starting(0, T - 1), Look(T, failures=True), Move.TIMED_OUT),  # the timeout leads: it is the cause
    (Starting(0, T - 1), Look(T, all_registered=True), Move.STARTED),
    (Starting(0, T + 1), Look(T, failures=True), Move.ON_FAILURES),
    (Starting(0, T + 1), Look(T, abort_reason="the reservation job failed"), Move.START_BROKEN),
    (Starting(0, T + 1), Look(T, Abort(ERR), all_registered=True), Move.ABORT),  # a request first
    (Starting(1, T + 1), Look(T, Start()), Move.NOTHING),  # a stale Start: dropped
    (Running(0), Look(T), Move.WATCH),
    (Running(0), Look(T, failures=True), Move.ON_FAILURES),
    (Running(0), Look(T, Finish(5), failures=True), Move.FINISH),
    (Running(0, stalled=True), Look(T, Abort(StallError("stalled"))), Move.ABORT),
    (Holding(0), Look(T, failures=True), Move.ON_FAILURES),  # decided again: a feed call may wait now
    (Holding(0), Look(T, Finish(0), failures=True), Move.FINISH),
    (Stopping(0), Look(T, failures=True), Move.NOTHING),
    (BackingOff(0, T + 1), Look(T, failures=True), Move.NOTHING),
    (BackingOff(0, T), Look(T), Move.NEXT_ATTEMPT),
    (BackingOff(0, T + 1), Look(T, Abort(ERR)), Move.ABORT),
    (Ended(), Look(T, Abort(ERR), failures=True), Move.NOTHING),
    (Ended(), Look(T, Finish(0)), Move.NOTHING),
])
def test_next_move(state, look, move):
    assert next_move(state, look) is move


# ---------------------------------------------------------------------- the loop, turned by hand
class Clock:
    """Monotonic seconds from the real clock's now (the registry stamps with it), moved by the test."""

    def __init__(self):
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


class Agents(NodeRegistry):
    """The real registry; an agent told to stop reports its exit at once, as a real one does."""

    def request_stop(self, which) -> None:
        super().request_stop(which)
        for i in which:
            n = self.nodes[i]
            if (n.agent or n.info) and n.exited is None:
                self.on_node_exited(M.NodeExited(self.cluster_id, i, 0, "", "", "", stopped_by_driver=True,
                                                 cause=Cause.STOPPED))


class StandIn:
    """Spark as the loop asks it: slots offered now, executors removed; barrier stages are recorded."""

    def __init__(self, slots: int):
        self.slots = slots
        self.stages: list[str] = []

    def barrier_stage(self, n, bootstrap):
        return lambda: None

    def slots_offered(self) -> int:
        return self.slots

    def removed_executors(self) -> list:
        return []

    def job(self, spark, group, description, action, on_done=None):
        self.stages.append(description)
        job = type("Job", (), {})()
        job.done, job.thread, job.cancel = threading.Event(), None, lambda timeout=30.0: None
        job.done.set()
        return job


class Loop:
    """A Controller of ``n`` nodes turned by hand, with the registry's handlers as the nodes."""

    def __init__(self, n=2, *, backend="mwms", num_ps=0, input_mode=InputMode.TENSORFLOW, slots=None,
                 stall_timeout=None, **restarts):
        self.clock = Clock()
        self.shape = ClusterShape(num_ps=num_ps)
        roles = self.shape.roles(n)
        self.registry = Agents("cid", roles)
        self.backend = make_backend(backend)
        self.spark = StandIn(n if slots is None else slots)
        config = M.ClusterConfig("cid", M.ChannelKey("ab" * 32, True), "127.0.0.1", 1, tuple(roles), int(input_mode),
                                 60.0, "/logs", "file:///", stop_grace_secs=0.0)
        self.stalls: list[float] = []
        settings = RestartSettings(**dict(dict(backoff=2.0, min_nodes=n, max_nodes=n), **restarts))
        loop = self

        class Turned(Controller):
            def report_stall(self, secs):  # the stacks are the watchdog thread's business: post at once
                loop.stalls.append(secs)
                self._requests.append(Abort(StallError(f"no progress for {secs:.0f}s")))

        self.c = Turned(self.spark, self.shape, self.backend, config, self.registry,
                        FeedScheduler(self.registry, list(range(n))), restarts=settings,
                        supervision=Supervision(stall_timeout=stall_timeout), clock=self.clock,
                        spark_job=self.spark.job)
        self.c.input_mode = input_mode
        self.c._main = (lambda args, ctx: None, None, None)

    def ask(self, request) -> None:
        with self.c._cv:
            self.c._requests.append(request)

    def turn(self, seconds: float = 0.0) -> Move:
        self.clock.now += seconds
        return self.c.step()

    def started(self) -> None:
        """The first attempt submitted, every node registered, the loop says RUNNING."""
        self.c.lifecycle.to(Phase.STARTING)
        self.ask(Start())
        assert self.turn() is Move.SUBMIT and isinstance(self.c.state, Starting)
        self.register()
        assert self.turn() is Move.STARTED and self.c.state == Running(self.c.config.attempt)

    def register(self) -> None:
        cid = self.c.config.cluster_id
        self.registry.cluster_id = cid
        for i, (job, idx) in enumerate(self.c.config.roles):
            self.registry.on_agent_started(M.AgentStarted(cid, i, "h", 100 + i, 200 + i, "/log"))
            self.registry.on_register(M.RegisterNode(cid, M.NodeInfo(i, job, idx, "h", 3000 + i, 4000 + i, 200 + i)))

    def saved(self, step: int) -> None:
        """Rank 0's ctx.checkpoint_saved(step), stamped by the test's clock (the registry uses the real one)."""
        self.registry.on_checkpoint_saved(M.CheckpointSaved(self.c.config.cluster_id, 0, step))
        self.clock.now = max(self.clock.now, time.monotonic())  # after what the registry stamped meanwhile
        self.registry.checkpoint = (self.clock.now, step)

    def exits(self, i: int, code: int = 1, retryable: bool = True) -> None:
        self.registry.on_node_exited(M.NodeExited(self.c.config.cluster_id, i, code, "Traceback: boom", "", "",
                                                  retryable=retryable))


def test_the_first_attempt_starts_once_every_node_registered():
    loop = Loop()
    loop.c.lifecycle.to(Phase.STARTING)
    loop.ask(Start())
    assert loop.turn() is Move.SUBMIT
    assert loop.c.state == Starting(0, loop.clock.now + 60.0) and loop.spark.stages == ["tfos cluster cid: 2 TF nodes"]
    assert loop.turn(1) is Move.NOTHING
    loop.register()
    assert loop.turn() is Move.STARTED and loop.c.lifecycle.phase is Phase.RUNNING
    loop.ask(Start())  # a second Start (a stale one) is dropped, the loop goes on
    assert loop.turn() is Move.WATCH and not loop.c._requests


def test_nodes_that_never_register_fail_the_start_naming_reservation_timeout():
    loop = Loop()
    loop.c.lifecycle.to(Phase.STARTING)
    loop.ask(Start())
    loop.turn()
    assert loop.turn(59) is Move.NOTHING
    assert loop.turn(2) is Move.TIMED_OUT and loop.c.state == Ended()
    assert isinstance(loop.c.lifecycle.error, ReservationTimeoutError)
    assert "reservation_timeout" in str(loop.c.lifecycle.error) and loop.c._released.is_set()


def test_a_failure_restarts_after_the_backoff_and_the_next_attempt_starts():
    loop = Loop(max_restarts=1)
    loop.started()
    loop.exits(1)
    assert loop.turn() is Move.ON_FAILURES
    assert loop.c.state == BackingOff(0, loop.clock.now + 2.0)
    assert [(r.node_index, r.attempt, r.cause) for r in loop.c.restarts] == [(1, 0, Cause.RAISED)]
    assert loop.turn(1.9) is Move.NOTHING and loop.spark.stages[1:] == []
    assert loop.turn(0.1) is Move.NEXT_ATTEMPT and isinstance(loop.c.state, Starting)
    assert loop.c.config.attempt == 1 and loop.spark.stages[1:] == ["tfos cluster cid-1: 2 TF nodes (attempt 1)"]
    loop.register()
    assert loop.turn() is Move.STARTED and loop.c.state == Running(1)


@pytest.mark.parametrize("max_restarts,retryable,why", [
    (0, True, "no restarts"),
    (2, False, "not retryable"),
])
def test_a_failure_that_cannot_restart_fails_the_cluster(max_restarts, retryable, why):
    loop = Loop(max_restarts=max_restarts)
    loop.started()
    loop.exits(1, retryable=retryable)
    assert loop.turn() is Move.ON_FAILURES and loop.c.state == Ended()
    assert isinstance(loop.c.lifecycle.error, NodeFailedError) and "node 1" in str(loop.c.lifecycle.error)
    assert loop.c.restarts == [] and loop.c._released.is_set()
    assert all(loop.registry.nodes[i].stop for i in (0, 1))


def test_a_feed_failure_is_held_until_a_feed_call_waits_then_restarts():
    loop = Loop(input_mode=InputMode.SPARK, max_restarts=1)
    loop.started()
    loop.exits(1)
    assert loop.turn() is Move.ON_FAILURES and loop.c.state == Holding(0)
    assert loop.turn(5) is Move.ON_FAILURES and loop.c.state == Holding(0)  # still nobody to resume the feed
    loop.c._wanting = 1  # train() waits to resume
    assert loop.turn() is Move.ON_FAILURES and isinstance(loop.c.state, BackingOff)


def test_a_lost_ps_worker_is_gone_and_the_others_go_on():
    loop = Loop(4, backend="ps", num_ps=1, max_restarts=1)  # ps, chief, worker 0, worker 1
    loop.started()
    worker = [i for i, (job, _) in enumerate(loop.c.config.roles) if job == "worker"][-1]
    loop.exits(worker)
    assert loop.turn() is Move.ON_FAILURES and loop.c.state == Running(0)
    assert [n.node_index for n in loop.c.lost_nodes] == [worker] and loop.c.restarts == []


def test_a_silent_agent_is_lost_at_heartbeat_timeout_and_restarts():
    loop = Loop(max_restarts=1)
    loop.started()
    loop.registry.nodes[1].last_heartbeat = time.monotonic() - 31  # heartbeat_timeout is 30 s
    assert loop.turn() is Move.ON_FAILURES and isinstance(loop.c.state, BackingOff)
    assert [(r.node_index, r.cause) for r in loop.c.restarts] == [(1, Cause.AGENT_LOST)]


def test_a_stall_posts_its_report_and_the_next_turn_fails_the_cluster():
    loop = Loop(stall_timeout=30)
    loop.started()
    loop.registry.on_report(M.Report("cid", 0, {"step": 1}))
    assert loop.turn(29) is Move.WATCH and loop.c.state == Running(0)
    assert loop.turn(2) is Move.WATCH and loop.c.state == Running(0, stalled=True) and len(loop.stalls) == 1
    assert loop.turn() is Move.ABORT and loop.c.state == Ended()
    assert isinstance(loop.c.lifecycle.error, StallError) and len(loop.stalls) == 1


def test_a_smaller_cluster_grows_at_rank_0s_next_checkpoint():
    loop = Loop(2, slots=2, min_nodes=1, max_nodes=3, grow_interval=10.0)
    loop.started()
    assert loop.turn(5) is Move.WATCH and loop.c._grow is None
    loop.spark.slots = 3
    assert loop.turn(6) is Move.WATCH and loop.c._grow is not None and loop.c.state == Running(0)
    loop.saved(40)
    assert loop.turn() is Move.WATCH and isinstance(loop.c.state, BackingOff)
    assert [(r.from_nodes, r.to_nodes, r.step) for r in loop.c.resizes] == [(2, 3, 40)] and loop.c.restarts == []
    assert loop.turn(2) is Move.NEXT_ATTEMPT and len(loop.c.config.roles) == 3


def test_nodes_told_to_go_save_at_one_step_then_the_cluster_goes_on_without_them():
    loop = Loop(3, slots=3, min_nodes=1, max_nodes=3, grow_interval=None)
    loop.started()
    assert loop.turn() is Move.WATCH  # the loop allows save rounds now
    saves = loop.registry.saves
    for i in range(3):
        saves.on_poll(M.SavePoll("cid", i, 10, wait=0))
    assert saves.on_notice(M.EvictionNotice("cid", 2, 30.0, "SIGTERM", executor_gone=True)).save
    for i in range(3):
        saves.on_poll(M.SavePoll("cid", i, 10 + i, round=saves.round, proposal=10 + i, wait=0))
    assert loop.turn() is Move.WATCH and loop.c.state == Running(0)  # nobody saved yet
    loop.saved(12)
    assert loop.turn() is Move.WATCH and isinstance(loop.c.state, BackingOff)
    assert [(e.nodes, e.step) for e in loop.c.evictions] == [((2,), 12)] and loop.c.restarts == []
    loop.spark.slots = 2  # Spark no longer offers the evicted executor's slot
    assert loop.turn(2) is Move.NEXT_ATTEMPT and len(loop.c.config.roles) == 2


@pytest.mark.parametrize("fails", [False, True])
def test_finish_stops_every_node_then_releases(fails):
    loop = Loop(3, num_ps=1)
    loop.started()
    loop.c.lifecycle.to(Phase.SHUTTING_DOWN)
    for i, (job, _) in enumerate(loop.c.config.roles):
        if job != "ps":
            loop.exits(i, 1 if fails and job == "worker" else 0)
    loop.ask(Finish(0.0))
    assert loop.turn() is Move.FINISH and loop.c.state == Ended() and loop.c._released.is_set()
    assert all(n.exited is not None for n in loop.registry.nodes.values())
    if fails:
        assert loop.c.lifecycle.phase is Phase.FAILED and isinstance(loop.c.lifecycle.error, NodeFailedError)
    else:
        assert loop.c.lifecycle.phase is Phase.SHUT_DOWN


@pytest.mark.parametrize("state_before", ["idle", "running", "backing off"])
def test_an_abort_posted_in_any_state_stops_and_releases_in_one_turn(state_before):
    loop = Loop(max_restarts=1)
    if state_before != "idle":
        loop.started()
    if state_before == "backing off":
        loop.exits(0)
        loop.turn()
        assert isinstance(loop.c.state, BackingOff)
    loop.ask(Abort(ERR))
    assert loop.turn() is Move.ABORT and loop.c.state == Ended() and loop.c.lifecycle.error is ERR
    assert loop.c._released.is_set() and loop.turn() is Move.NOTHING


def test_finish_before_start_only_releases():
    loop = Loop()
    loop.ask(Finish(0.0))
    assert loop.turn() is Move.FINISH and loop.c.state == Ended() and loop.spark.stages == []
    assert loop.c._released.is_set() and loop.c.lifecycle.phase is Phase.RESERVED  # the API says SHUT_DOWN


# ---------------------------------------------------------------------- the only actor
#: what stops nodes, ends or releases the cluster: called by the controller's own code only
ACTS = {"stop_nodes", "request_stop", "_end", "_finish", "_release", "_stop_attempt", "_next_attempt", "_submit",
        "fail"}


#: the driver's code: the cluster's and the feed's driver side, and what is built on them
DRIVER = ("cluster/driver/", "feed/driver/", "api.py", "distributor.py", "run.py", "cli.py", "ml/", "pipeline.py")


def calls_outside_the_controller() -> list[str]:
    found = []
    for d, _dirs, files in os.walk(ROOT):
        for f in files:
            path = os.path.join(d, f)
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            if not f.endswith(".py") or not rel.startswith(DRIVER) or rel == "cluster/driver/controller.py":
                continue
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ACTS:
                    owner = ast.unparse(node.func.value)
                    if node.func.attr == "fail" and "lifecycle" not in owner:
                        continue  # registry.fail (a node's failure noted), not the cluster's end
                    found.append(f"{rel}:{node.lineno} {owner}.{node.func.attr}()")
    return found


def test_no_code_outside_the_controller_stops_nodes_or_ends_the_cluster():
    assert calls_outside_the_controller() == []


FAST = dict(heartbeat_interval=0.1, heartbeat_timeout=5, stop_grace_secs=0, restart_backoff=0, progress=False)


def actors(monkeypatch) -> list[str]:
    """The names of the threads that stop nodes or release, on any controller from now on."""
    seen: list[str] = []
    for name in ("stop_nodes", "_release"):
        real = getattr(Controller, name)

        def spy(self, *args, _real=real, **kwargs):
            seen.append(threading.current_thread().name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Controller, name, spy)
    return seen


def main_fun(args, ctx):  # never runs: the fake nodes play the TF processes
    raise AssertionError("not called")


@pytest.mark.parametrize("path", ["shutdown", "restart then shutdown", "abort from the caller", "stall",
                                  "shutdown before start", "failure"])
def test_every_stop_and_release_runs_in_the_loops_thread(monkeypatch, path):
    seen = actors(monkeypatch)
    behaviour = {"restart then shutdown": lambda i, a: Does.RAISE if (i, a) == (1, 0) else Does.FINISH,
                 "abort from the caller": lambda i, a: Does.HANG, "stall": lambda i, a: Does.STALL,
                 "failure": lambda i, a: Does.RAISE if i == 1 else Does.HANG}.get(path, lambda i, a: Does.FINISH)
    spark = FakeSpark(2, behaviour, run_secs=0.3)
    extra = dict(max_restarts=1) if path == "restart then shutdown" else {}
    if path == "stall":
        extra = dict(stall_timeout=1.0)
    cluster = TFCluster.reserve(spark, 2, 0, **dict(FAST, **extra))
    if path == "shutdown before start":
        cluster.shutdown()
    else:
        cluster.start(main_fun)
        if path == "abort from the caller":
            with pytest.raises(RuntimeError):
                with cluster:
                    raise RuntimeError("the caller's own error")
        elif path in ("stall", "failure"):
            with pytest.raises((StallError, NodeFailedError)):
                cluster.shutdown(timeout=60)
        else:
            cluster.shutdown()
    assert cluster.lifecycle.ended and cluster.supervisor._released.is_set()
    loop = f"tfos-supervisor-{cluster.cluster_id}"
    assert seen and set(seen) == {loop}, seen

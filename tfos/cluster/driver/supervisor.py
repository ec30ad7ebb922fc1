"""The supervisor: the API side of the control loop (runs on the driver, in the callers' threads).

The control loop (:mod:`tfos.cluster.driver.controller`) is the one actor: it starts attempts,
decides on failures, restarts, resizes, fails and ends the cluster. TFCluster's calls (``start``,
``shutdown``, ``raise_if_failed``, a feed's checks, an abort) never act themselves: they post a
request to the loop (:class:`~tfos.cluster.driver.attempt.Start`, ``Abort``, ``Finish``) and
wait, each with a deadline, until the loop's state says it acted (:meth:`Supervisor.wait`), then
read the outcome. Tests drive both with the fake Spark (``tfos.testing.fake_spark``) and the loop
one turn at a time (tests/unit/test_controller.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from tfos.cluster.driver import security
from tfos.cluster.driver.attempt import RESTARTING, Abort, Ended, Finish, Holding, Idle, Running, Start
from tfos.cluster.driver.controller import EXPLAIN_WAIT_SECS, FIRST_CAUSE_WAIT_SECS, LOOP_TICK_SECS, Controller
from tfos.cluster.driver.lifecycle import Phase
from tfos.errors import FeedError, NodeFailedError, Resizing, TFOSError, TFOSTimeoutError
from tfos.host.deadline import Deadline
from tfos.topology import InputMode

logger = logging.getLogger(__name__)

class Supervisor(Controller):
    """The control loop (:class:`Controller`, the state it owns) and the waits of the API calls on it."""

    # ------------------------------------------------------------------ start
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
            self.post(Start())
            self.wait(lambda: self.lifecycle.phase is not Phase.STARTING, "the cluster to start")
        except BaseException as e:  # interrupted (Ctrl-C) or broken: nothing may be left running
            self.abort(e if isinstance(e, TFOSError) else TFOSError(f"start() interrupted by {type(e).__name__}"))
            raise
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        exposed = security.exposure(self.registry.registered(), self.supervision.allow_unprotected)
        if exposed:
            logger.warning("tfos cluster %s: %s", self.cluster_id, exposed)

    # ------------------------------------------------------------------ waiting on the loop
    def limit(self) -> float:
        """The longest the loop may take to act on a failure: explain it, stop the nodes, back off,
        wait for slots, start the next attempt (each step has its own deadline; this bounds them all)."""
        c, s = self.config, self.settings
        return (EXPLAIN_WAIT_SECS + FIRST_CAUSE_WAIT_SECS + 2 * c.heartbeat_interval + c.stop_grace_secs + 15
                + s.backoff + s.size_wait + 2 * c.reservation_timeout + 60)

    def wait(self, ready, what: str) -> None:
        """Wait until ``ready()`` (checked under the loop's condition) or the cluster ended, and then
        until its nodes were stopped and everything released (an end by the loop finishes before
        the call that waited raises); TFOSTimeoutError after :meth:`limit` seconds (the loop has its
        own, shorter deadlines)."""
        limit = self.limit()
        deadline = Deadline(limit)
        with self._cv:
            while not (ready() or self.lifecycle.ended):
                if deadline.expired():
                    raise TFOSTimeoutError(f"the supervisor did not finish {what} within {limit:.0f}s; see the "
                                           "driver's log (raise reservation_timeout if Spark is slow to offer slots)")
                self._cv.wait(deadline.slice(LOOP_TICK_SECS))
        if self.lifecycle.phase is Phase.FAILED:
            self._released.wait(max(1.0, min(deadline.remaining(), self.stop_secs() + 60)))

    def settled(self) -> bool:
        """The loop has acted on every failure it knows: no attempt stopping or starting, none failed."""
        return isinstance(self.state, (Idle, Running, Holding, Ended)) and not self.registry.snapshot().failures

    def restarting(self) -> bool:
        return isinstance(self.state, RESTARTING)

    def wait_settled(self, what: str) -> None:
        """:meth:`wait` until :meth:`settled`; the cluster's error if it failed."""
        self.wait(self.settled, what)
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error

    @property
    def attempt(self) -> int:
        return self.config.attempt

    def raise_if_failed(self) -> None:
        """Raise the cluster's error if it failed; with restarts left, wait while the loop restarts
        it after a node failure (an InputMode.SPARK call waiting here lets it restart)."""
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        if self.settled():
            return
        with self.wanted():
            self.wait_settled("acting on a node failure")

    def feed_check_failed(self) -> None:
        """For a feed in progress: raise NodeFailedError once the loop restarts the cluster after a
        node failure (train() then feeds the new attempt), the cluster's error if it failed; return
        when the loop went on without the failed node."""
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        failures = list(self.registry.snapshot().failures)
        if not failures and not self.restarting():
            return
        attempt = self.config.attempt
        self.wait(lambda: self.restarting() or self.config.attempt != attempt
                  or not self.registry.snapshot().failures, "acting on a node failure")
        if self.lifecycle.phase is Phase.FAILED:
            raise self.lifecycle.error
        if self.restarting() or self.config.attempt != attempt:
            if failures:
                raise NodeFailedError(failures)
            raise Resizing(f"the cluster restarts at another size (attempt {attempt} stopped): the feed goes to "
                           "the next attempt")

    @contextlib.contextmanager
    def wanted(self):
        """While inside: a call waits to resume a feed, so an InputMode.SPARK failure restarts."""
        with self._cv:
            self._wanting += 1
        try:
            yield
        finally:
            with self._cv:
                self._wanting -= 1

    # ------------------------------------------------------------------ the end
    def shutdown(self, grace_secs: float, timeout: float) -> None:
        """Wait for the training nodes (the loop restarts them after failures while allowed), then
        have the loop stop the others and release everything; raises NodeFailedError or
        TFOSTimeoutError."""
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
        deadline = Deadline(timeout)
        while True:
            trainers = self._trainers()
            reg.wait_until(lambda s: not s.unfinished(trainers) or bool(s.failures) or self.lifecycle.ended
                           or self.restarting(),
                           deadline.remaining(),
                           lambda s: f"training nodes {s.unfinished(trainers)} still running",
                           "shutdown(timeout=...)", poll=1.0 if timeout == float("inf") else LOOP_TICK_SECS)
            if self.lifecycle.ended:
                break
            if not self.settled():
                # InputMode.TENSORFLOW: the loop runs main_fun again from its checkpoint, or fails the
                # cluster. InputMode.SPARK: after the last feed there is nothing to resume: it fails.
                self.wait(self.settled, "acting on a node failure")
                continue
            if not reg.unfinished(self._trainers()):
                break
        if not self.lifecycle.ended:
            self.post(Finish(grace_secs))
        self._await_end(grace_secs + self.stop_secs() + 60)
        if self.lifecycle.phase is Phase.FAILED:  # a failure, the stall watchdog or an abort ended it
            raise self.lifecycle.error

    def release_unstarted(self) -> None:
        """shutdown() before start(): the loop lets go of the control service and the backend."""
        self.post(Finish(0.0))
        self._await_end(60.0)

    def abort(self, err: TFOSError) -> None:
        """Fail the cluster with ``err`` (the first error wins) and return once the loop stopped
        every node and released everything."""
        if self.in_loop():  # a callback of the loop's (on_release, on_attempt): the next turn ends it
            self.post(Abort(err))
            return
        if self._released.is_set():
            return
        self.post(Abort(err))
        if not self._released.wait(self.limit()):  # never raises: it runs where another error is raised
            logger.warning("tfos cluster %s: the control loop did not stop the nodes within %.0fs of an abort",
                           self.cluster_id, self.limit())

    def _await_end(self, timeout: float) -> None:
        if not self._released.wait(timeout):
            raise TFOSTimeoutError(f"the supervisor did not stop the cluster's nodes within {timeout:.0f}s; see the "
                                   "driver's log")

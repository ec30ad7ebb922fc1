"""A training rank's side of saving before an eviction (runs in the TF process): behind
``ctx.should_checkpoint(step)``.

When a node is told to go (docs/elastic.md), the driver opens a *save round*. A thread of each
rank hears of it by a long poll, and proposes the step after the last one its program finished;
from then on the program's next ``should_checkpoint`` waits at that step until the driver knows
every rank's proposal and names the highest as the round's target. No rank is past its own
proposal, so every rank reaches the target: there ``should_checkpoint`` is True on every rank at
the same step, the program saves and says ``ctx.checkpoint_saved(step)`` (rank 0's tells the
driver), which then waits for the driver's stop (as does a later ``should_checkpoint``), so no
step is done that the checkpoint lacks.

The poll thread starts at the first ``should_checkpoint`` call: a program that never calls it
costs nothing, and the driver then knows not to wait for a save.

With TF's own ``PreemptionCheckpointHandler`` (tf_keras' ``BackupAndRestore(save_before_preemption=
True)``, :mod:`tfos.cluster.node.preemption`) the step is agreed by TF instead: the poll thread
starts at once, proposes 0 (any step of the handler's suits the driver) and hands each new round
to ``on_round``.
"""

from __future__ import annotations

import logging
import threading

from tfos.errors import TFOSError
from tfos.host.deadline import Deadline

logger = logging.getLogger(__name__)

#: how long one poll waits on the driver for news (a round opens, its target is known)
POLL_WAIT = 10.0
#: how long a poll that failed waits before the next try
RETRY_SECS = 1.0


class SavePoint:
    """This rank's place in the driver's save rounds (``ctx.should_checkpoint``)."""

    def __init__(self, client, grace: float, on_round=None):
        self._client = client  # a DriverClient of its own (the poll thread holds it between calls)
        self._grace = grace  # eviction_grace: how long a rank waits at its proposal or after a save
        self._on_round = on_round  # TF's handler agrees on the step: called (poll thread) as a round opens
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.last = -1  # the last step the program finished (should_checkpoint's argument)
        self.round = 0  # the save round heard of (0: none)
        self.proposal = -1  # this rank's proposal for it
        self.target = -1  # the round's target, once the driver knows it
        self.saved_round = 0  # the round whose target this rank reached (it saved there)

    def start(self) -> None:
        """Start polling the driver (this rank can save: the driver counts it among the savers)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, name="tfos-save-poll", daemon=True)
                self._thread.start()

    def check(self, step: int) -> bool:
        """``ctx.should_checkpoint(step)``: True when every rank checkpoints at ``step`` now."""
        step = int(step)
        self.start()
        with self._cond:
            self.last = step
            if self.saved_round and self.saved_round == self.round:
                self._wait_for_stop(step)  # saved for an eviction: the driver stops this process
                return False
            if self._reaches_target(step):
                if step > self.target:  # cannot be (the target is every rank's highest proposal): say so
                    logger.error("tfos: step %d is past the save round's target %d; saving now", step, self.target)
                self.saved_round = self.round
                logger.warning("tfos: checkpoint at step %d before a node of the cluster goes (save round %d)",
                               step, self.round)
                return True
            return False

    def saved_by_handler(self) -> bool:
        """TF's handler saved for the current round: wait for the stop in ``after_save``. False
        when no round is open (it saved for a notice tfos did not give)."""
        with self._cond:
            if not self.round:
                return False
            self.saved_round = self.round
            return True

    def after_save(self, step: int) -> None:
        """``ctx.checkpoint_saved(step)``: after a save for an eviction, wait for the driver's stop
        here, before the program starts a step that the checkpoint would lack.

        A save of the program's own at or past this rank's proposal serves an open round too
        (``if step % 1000 == 0 or ctx.should_checkpoint(step)`` skips the call at such a step, and
        the rank proposed the step it was finishing): it waits for the target and, when the save
        reaches it, for the stop, instead of stepping past the checkpoint that the driver takes."""
        step = int(step)
        with self._cond:
            self.last = max(self.last, step)
            # (with TF's handler, the handler's save serves the round)
            if self._on_round is None and self.saved_round != self.round and self._reaches_target(step):
                self.saved_round = self.round
            if self.saved_round and self.saved_round == self.round:
                self._wait_for_stop(step)

    def _reaches_target(self, step: int) -> bool:
        """(Under the lock.) Whether ``step`` reaches the open round's target; a rank at or past its
        proposal first waits for the target (up to the grace)."""
        if self.round and self.target < 0 and 0 <= self.proposal <= step:
            self._wait_for_target(step)
        return bool(self.round) and 0 <= self.target <= step

    def _wait_for_target(self, step: int) -> None:
        deadline = Deadline(self._grace)
        while self.round and self.target < 0 and not self._stop.is_set():
            if deadline.expired():
                logger.warning("tfos: the save round's target did not come within %.0f s (eviction_grace); "
                               "going on from step %d", self._grace, step)
                return
            self._cond.wait(deadline.slice(1.0))

    def _wait_for_stop(self, step: int) -> None:
        """After a save for an eviction the cluster restarts from it: a step done now would be lost.
        Wait (up to the grace) for the driver's stop; the round ending without one goes on."""
        deadline = Deadline(self._grace)
        saved = self.saved_round
        while self.round == saved and not self._stop.is_set():
            if deadline.expired():
                logger.warning("tfos: the cluster did not restart within %.0f s after the save at step %d; going on",
                               self._grace, step)
                self.saved_round = 0
                return
            self._cond.wait(deadline.slice(1.0))

    def _poll(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                step, rnd, proposal, target = self.last, self.round, self.proposal, self.target
            try:
                reply = self._client.save_poll(step, rnd, proposal, target, POLL_WAIT)
            except (TFOSError, OSError) as e:  # the driver restarts or ends the cluster: this process goes
                logger.debug("save poll failed: %s", e)
                if self._stop.wait(RETRY_SECS):
                    return
                continue
            opened = 0
            with self._cond:
                if reply.round != self.round:  # a new round (or none any more): propose the next step
                    self.round, self.target = reply.round, -1
                    if not reply.round:
                        self.proposal = -1
                    elif self._on_round is not None:
                        self.proposal, opened = 0, reply.round
                        logger.warning("tfos: a node of the cluster must go: TF's preemption handler saves "
                                       "(save round %d)", reply.round)
                    else:
                        self.proposal = self.last + 1
                        logger.warning("tfos: a node of the cluster must go: this rank proposes to checkpoint at "
                                       "step %d (save round %d)", self.proposal, reply.round)
                if reply.round and reply.target >= 0:
                    self.target = reply.target
                self._cond.notify_all()
            if opened:
                self._on_round(opened)

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

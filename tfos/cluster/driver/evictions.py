"""The driver's side of saving before an eviction (runs in the control service and the loop).

A node agent told to go (a termination signal, its executor ending) sends an EvictionNotice. When
every training rank's program asks ``ctx.should_checkpoint`` (each polls here: SavePoll) and the
loop says a planned restart could resume the work now (``allowed``), a *save round* opens: each
rank proposes a step, the highest is the target (:func:`lifecycle.save_target`), every rank
checkpoints there, and once rank 0 says ``ctx.checkpoint_saved(target)`` the supervisor's loop
restarts the cluster without the evicted nodes. Otherwise the notice is declined and the agent
stops its TF process at once (a failure, restarted from the last checkpoint as before).

Its lock is its own, taken before the registry's, never under it.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from tfos import topology
from tfos.cluster.driver.lifecycle import save_target
from tfos.errors import ProtocolError
from tfos.wire import messages as M

#: a poll waits on the driver at most this long (the client asks again)
MAX_POLL_WAIT = 10.0


@dataclasses.dataclass(frozen=True)
class SaveState:
    """The save round at one instant (:meth:`SaveRounds.state`)."""

    open: bool
    round: int
    opened_at: float  # monotonic
    target: int  # -1 until every running training rank proposed
    evicting: dict  # node -> (deadline: monotonic, why, its executor ended already)


class SaveRounds:
    def __init__(self, registry):
        self.registry = registry
        self.cond = threading.Condition()
        self.allowed = False  # set by the supervisor's loop: a planned restart can resume the work now
        self.round = 0  # the latest round's number (never reused: a late poll cannot mistake an old one)
        self._reset()

    def _reset(self) -> None:
        self.open = False
        self.opened_at = 0.0
        self.proposals: dict[int, int] = {}  # node -> proposed step, this round
        self.target = -1
        self.savers: set[int] = set()  # training nodes whose program polls (ctx.should_checkpoint)
        self.evicting: dict[int, tuple[float, str, bool]] = {}

    def new_attempt(self) -> None:
        with self.cond:
            self._reset()
            self.cond.notify_all()

    def state(self) -> SaveState:
        with self.cond:
            return SaveState(self.open, self.round, self.opened_at, self.target, dict(self.evicting))

    def _trainers(self) -> list[int]:
        """This attempt's training nodes still running."""
        roles = self.registry.roles
        snap = self.registry.snapshot()
        return [i for i, (job, idx) in enumerate(roles)
                if topology.training_rank(job, idx, roles) is not None and snap.exited.get(i) is None]

    def settle(self) -> int:
        """The round's target once every running training rank proposed (-1 before)."""
        trainers = self._trainers()
        with self.cond:
            if self.open and self.target < 0:
                self.target = save_target(self.proposals, trainers)
                if self.target >= 0:
                    self.cond.notify_all()
            return self.target

    # -- control service handlers
    def on_notice(self, msg: M.EvictionNotice):
        """A node must go: open a save round (EvictionReply(True)) when every running training rank
        polls and the loop allows it, else decline (the agent stops its TF process now)."""
        self.registry.node(msg.node_index)  # a known node
        trainers = self._trainers()
        with self.cond:
            save = self.allowed and bool(trainers) and all(i in self.savers for i in trainers)
            if save:
                self.evicting.setdefault(msg.node_index, (time.monotonic() + max(0.0, msg.grace), msg.why,
                                                          msg.executor_gone))
                if not self.open:
                    self.round += 1
                    self.open, self.opened_at, self.proposals, self.target = True, time.monotonic(), {}, -1
                self.cond.notify_all()
        self.registry.notify()  # the loop acts on it
        return M.EvictionReply(save)

    def on_poll(self, msg: M.SavePoll):
        i = msg.node_index
        roles = self.registry.roles
        if not (0 <= i < len(roles)) or topology.training_rank(*roles[i], roles) is None:
            raise ProtocolError(f"node {i} is not a training rank: it takes no part in save rounds")
        with self.cond:
            self.savers.add(i)
            if self.open and msg.round == self.round and msg.proposal >= 0:
                self.proposals[i] = msg.proposal
        if self.settle() >= 0:
            self.registry.notify()
        with self.cond:
            self.cond.wait_for(lambda: self._news() != (msg.round, msg.target),
                               timeout=min(max(msg.wait, 0.0), MAX_POLL_WAIT))
            return M.SaveReply(*self._news())

    def _news(self) -> tuple[int, int]:
        return (self.round, self.target) if self.open else (0, -1)

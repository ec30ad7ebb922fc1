"""The control loop's states, the requests other threads post to it, and its pure decision
(runs on the driver; :mod:`tfos.cluster.driver.controller` carries the decisions out).

Each turn the loop looks (:class:`Look`: the time, the oldest request, the registry's view) and
:func:`next_move` says what to do in the attempt's state; docs/design.md has the table.
"""

from __future__ import annotations

import dataclasses
import enum

from tfos.errors import TFOSError


# ---------------------------------------------------------------------- the attempt's states
@dataclasses.dataclass(frozen=True)
class Idle:
    """Reserved, not started: no barrier stage submitted."""


@dataclasses.dataclass(frozen=True)
class Starting:
    """Attempt ``attempt``'s barrier stage is submitted; its nodes register until ``deadline`` (monotonic)."""

    attempt: int
    deadline: float


@dataclasses.dataclass(frozen=True)
class Running:
    """Every node of ``attempt`` registered and the backend is set up; ``stalled`` once the watchdog
    saw no progress (its report is on its way as an :class:`Abort`)."""

    attempt: int
    stalled: bool = False


@dataclasses.dataclass(frozen=True)
class Holding:
    """A node of ``attempt`` failed while no feed call waits to resume (InputMode.SPARK): the nodes
    are told to stop; the next train() restarts the cluster, shutdown() raises the failure."""

    attempt: int


@dataclasses.dataclass(frozen=True)
class Stopping:
    """The loop is stopping ``attempt``'s nodes for a restart, a resize or a save before an eviction."""

    attempt: int


@dataclasses.dataclass(frozen=True)
class BackingOff:
    """``attempt``'s nodes stopped; the next attempt starts at ``due`` (monotonic), after a save before
    an eviction once Spark no longer offers the evicted slots (``evicted``: until when, slots left)."""

    attempt: int
    due: float
    evicted: tuple[float, int] | None = None


@dataclasses.dataclass(frozen=True)
class Ended:
    """Shut down or failed (the lifecycle's phase says which): every node stopped, everything released."""


RESTARTING = (Stopping, BackingOff)


# ---------------------------------------------------------------------- what other threads post
@dataclasses.dataclass(frozen=True)
class Start:
    """start(): submit the first attempt."""


@dataclasses.dataclass(frozen=True)
class Abort:
    """Fail the cluster with ``error``: an API call interrupted or failing, a broken feed, a stall."""

    error: TFOSError


@dataclasses.dataclass(frozen=True)
class Finish:
    """shutdown(): the training nodes are done; give the others ``grace_secs``, stop every node,
    release. Before start(): only release."""

    grace_secs: float


# ---------------------------------------------------------------------- the pure decision
class Move(enum.Enum):
    NOTHING = "nothing"
    SUBMIT = "submit the first attempt"
    ABORT = "fail the cluster"
    FINISH = "stop every node and release"
    TIMED_OUT = "fail: nodes did not register in time"
    ON_FAILURES = "decide on the failures"
    START_BROKEN = "fail: the attempt could not start"
    STARTED = "set the backend up and run"
    WATCH = "watch: stall, eviction, growing"
    NEXT_ATTEMPT = "start the next attempt"


@dataclasses.dataclass(frozen=True)
class Look:
    """What a turn sees: the time, the oldest request posted, and the registry's view."""

    now: float
    request: object | None = None
    failures: bool = False
    all_registered: bool = False
    abort_reason: str = ""


def next_move(state, look: Look) -> Move:
    """Pure: what the loop does this turn in ``state`` given ``look`` (docs/design.md's table)."""
    if isinstance(state, Ended):
        return Move.NOTHING
    r = look.request
    if isinstance(r, Abort):
        return Move.ABORT
    if isinstance(r, Finish):
        return Move.FINISH
    if isinstance(state, Idle):
        return Move.SUBMIT if isinstance(r, Start) else Move.NOTHING
    if isinstance(state, BackingOff):
        return Move.NEXT_ATTEMPT if look.now >= state.due else Move.NOTHING
    if isinstance(state, Stopping):
        return Move.NOTHING  # a stop is one act of one turn: no turn sees it
    starting = isinstance(state, Starting)
    if starting and look.now > state.deadline and not look.all_registered:
        return Move.TIMED_OUT  # first: a node's own spec wait ends at the same time, as a failure
    if look.failures:
        return Move.ON_FAILURES
    if starting:
        return Move.START_BROKEN if look.abort_reason else Move.STARTED if look.all_registered else Move.NOTHING
    return Move.WATCH

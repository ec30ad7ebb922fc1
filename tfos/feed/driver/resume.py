"""Resuming a train feed where the checkpoint is (runs on the driver, InputMode.SPARK with restarts).

With restarts allowed every epoch of ``cluster.train`` is its own Spark job, and every piece of
rows carries where it comes from (epoch, partition, offset: :mod:`tfos.data.positions`). Each
rank's ``ctx.checkpoint_saved(step)`` sends the rows it had handed to main_fun
(:class:`FeedPositions` keeps them by feed and step). When the cluster restarts, at any size,
:meth:`FeedResume.restarted` works out what the checkpoint the program resumes from has trained
on: the union of every rank's rows at the last step they all reported. The next attempt then
feeds, from the first epoch not trained in full, each epoch without those rows; every row reaches
exactly one rank once per epoch across restarts.

A program that does not call ``ctx.checkpoint_saved`` on every rank reports no positions: the
feed then resumes as before positions existed (the interrupted epoch again in full).
"""

from __future__ import annotations

import collections
import logging
import threading

from tfos.data import positions
from tfos.errors import NodeFailedError, Resizing
from tfos.wire import messages as M

logger = logging.getLogger(__name__)

#: checkpoint steps whose positions the driver keeps per feed, and feeds it keeps them for
KEEP_STEPS = 8
KEEP_FEEDS = 8


class FeedPositions:
    """Every rank's consumed rows at each reported checkpoint step, per feed (the newest few)."""

    def __init__(self, registry):
        self.registry = registry
        self._lock = threading.Lock()
        self._feeds: collections.OrderedDict = collections.OrderedDict()  # feed -> {step: {node: Position}}

    def handlers(self) -> dict:
        return {M.FeedPosition: self.on_position}

    def on_position(self, msg: M.FeedPosition):
        self.registry.node(msg.node_index)  # a known node (ProtocolError otherwise: nothing stored)
        if msg.step < 0 or any(min(r) < 0 for r in msg.ranges):
            return M.ErrorReply(f"a feed position needs a step and row ranges >= 0, got step {msg.step}")
        position = positions.from_wire(msg.ranges)
        with self._lock:
            steps = self._feeds.get(msg.feed_id)
            if steps is None:
                steps = self._feeds[msg.feed_id] = collections.OrderedDict()
                while len(self._feeds) > KEEP_FEEDS:
                    self._feeds.popitem(last=False)
            steps.setdefault(msg.step, {})[msg.node_index] = position
            steps.move_to_end(msg.step)
            while len(steps) > KEEP_STEPS:
                steps.popitem(last=False)
        return M.Ack()

    def reported(self, feed_id: str) -> bool:
        with self._lock:
            return bool(self._feeds.get(feed_id))

    def latest(self, feed_id: str) -> int | None:
        """The highest step any rank reported for ``feed_id``."""
        with self._lock:
            steps = self._feeds.get(feed_id)
            return max(steps) if steps else None

    def newest_complete(self, feed_id: str, nodes) -> int | None:
        """The highest step every one of ``nodes`` reported for ``feed_id`` (None: no such step)."""
        with self._lock:
            steps = self._feeds.get(feed_id, {})
            return max((s for s, got in steps.items() if all(i in got for i in nodes)), default=None)

    def at(self, feed_id: str, step: int, nodes) -> positions.Position | None:
        """The rows ``nodes`` had consumed together at ``step``; None unless every one reported it."""
        with self._lock:
            got = self._feeds.get(feed_id, {}).get(step, {})
            if any(i not in got for i in nodes):
                return None
            return positions.merge(*(got[i] for i in nodes))


class FeedResume:
    """One ``cluster.train`` call with restarts allowed: what each attempt fed, what the checkpoint
    has trained, and what the next attempt feeds (:meth:`skip`, from epoch ``first``)."""

    def __init__(self, num_epochs: int, store: FeedPositions):
        self.num_epochs = num_epochs
        self.store = store
        self.trained: positions.Position = {}  # rows the checkpoint to resume from had consumed
        self.sizes: dict[int, int] = {}  # rows of each epoch whose feed completed in some attempt
        self.first = 0  # the epoch the next attempt feeds from
        self.tracked = False  # the program reports positions: restarts resume from them
        self.fed = 0  # rows sent over every attempt
        self.feed_id = ""  # this attempt's
        self.ranks: tuple = ()  # the nodes this attempt feeds
        self.epochs: list[tuple[int, int, int]] = []  # this attempt's epochs fed in full: (epoch, rows sent, rows in it)

    def begin(self, feed_id: str, ranks) -> None:
        """An attempt's feed starts."""
        self.feed_id, self.ranks, self.epochs = feed_id, tuple(ranks), []

    def skip(self, epoch: int) -> dict[int, list]:
        """``{partition: ranges}`` of ``epoch`` the checkpoint has trained on: not fed again."""
        return positions.of_epoch(self.trained, epoch)

    def epoch_fed(self, epoch: int, sent: int, size: int) -> None:
        """Epoch ``epoch``'s Spark job sent ``sent`` rows; the epoch has ``size`` rows (-1: unknown)."""
        self.epochs.append((epoch, sent, size))
        self.fed += sent
        if size >= 0:
            self.sizes[epoch] = size

    def ready(self, step: int) -> bool:
        """Whether a planned restart at checkpoint ``step`` may go ahead: every rank of this attempt
        reported its position there (or the program reports none)."""
        if not (self.tracked or self.store.reported(self.feed_id)):
            return True
        return self.store.at(self.feed_id, step, self.ranks) is not None

    def restarted(self, during_feed: bool) -> str:
        """The cluster restarted (``during_feed``: while this attempt's feed ran, else after it
        ended): work out where the next attempt's feed starts; returns what to log."""
        step = self.store.latest(self.feed_id)
        if step is not None:  # a checkpoint in this attempt, with positions: resume from it
            at = self.store.at(self.feed_id, step, self.ranks)
            if at is not None:
                self.trained = positions.merge(self.trained, at)
                self.tracked = True
                return self._resume(f"its checkpoint at step {step}")
            missing = [i for i in self.ranks if self.store.at(self.feed_id, step, (i,)) is None]
            complete = self.store.newest_complete(self.feed_id, self.ranks)
            if complete is not None:
                # A rank ended between its save at `step` and its report. The program resumes from
                # `step` or from an earlier save no older than `complete` (every rank saved there):
                # what `complete` had trained is a subset of it, so skipping just that drops nothing.
                logger.warning("tfos: nodes %s did not report the feed position of the checkpoint at step %d "
                               "(they ended between their save and ctx.checkpoint_saved); the feed resumes from "
                               "the positions at step %d, every rank's last: the rows those nodes took after "
                               "it are fed again", missing, step, complete)
                self.trained = positions.merge(self.trained, self.store.at(self.feed_id, complete, self.ranks))
                self.tracked = True
                return self._resume(f"its checkpoint at step {complete}")
            logger.warning("tfos: nodes %s did not report the feed position of the checkpoint at step %d "
                           "(ctx.checkpoint_saved on every rank); the feed resumes without positions: rows "
                           "since the start of the interrupted epoch are fed again", missing, step)
            self.tracked, self.trained = False, {}
        elif self.tracked:  # no checkpoint in this attempt: the program resumes from the same one again
            return self._resume("the same checkpoint as the last attempt")
        done = [e for e, _sent, _size in self.epochs]
        if not during_feed and done:
            done = done[:-1]  # handed over but maybe not trained on: that epoch again
        self.first = done[-1] + 1 if done else self.first
        return (f"the new attempt is fed from epoch {self.first + 1} of {self.num_epochs} in full "
                "(no feed position: call ctx.checkpoint_saved(step) on every rank after each save to resume "
                "where the checkpoint is)")

    def _resume(self, where: str) -> str:
        self.first = positions.resume(self.trained, self.sizes, self.num_epochs)
        left = sum(positions.count(r) for r in positions.of_epoch(self.trained, self.first).values())
        return (f"the new attempt resumes the feed where {where} is: epoch {self.first + 1} of {self.num_epochs} "
                f"without the {left} rows of it already trained on" if self.first < self.num_epochs else
                f"every epoch was trained on by {where}")



def feed_across_restarts(supervisor, feed, resume: FeedResume | None) -> int:
    """``feed(resume)`` (FeedJobs.train); returns the rows fed. With restarts allowed (``resume``),
    a restart of the cluster while it feeds (a failure, a resize, an eviction) or right after
    (before the nodes trained on the last rows) feeds the new attempt again, from where ``resume``
    says the checkpoint is. ``supervisor`` is the API side of the control loop: while this runs a
    call waits to resume a feed (``wanted``), so an InputMode.SPARK failure restarts the cluster."""
    if resume is None:
        return feed(None)
    with supervisor.wanted():
        while True:
            attempt = supervisor.attempt
            try:
                feed(resume)
                cut_short = False
            except (NodeFailedError, Resizing):  # a failure, or a planned restart at another size
                cut_short = True
            if cut_short:
                supervisor.wait_settled("restarting the cluster")
                logger.warning("tfos: the cluster restarted while feeding; %s", resume.restarted(during_feed=True))
                continue
            supervisor.wait_settled("acting on a node failure")
            if supervisor.attempt == attempt:
                return resume.fed
            # restarted after the last rows were handed over, before the nodes trained on them
            logger.warning("tfos: the cluster restarted at the end of the feed; %s", resume.restarted(during_feed=False))

"""Ending the feeds of many nodes at once (tfos.feed.driver.jobs.for_each_node): one at a time, a
node whose hub waits for room in its queue held up every other, and 512 nodes took 26 s."""

import threading
import time

import pytest

from tfos.errors import TFOSError
from tfos.feed.driver import jobs


def test_each_node_is_called_once_and_the_answers_keep_node_order():
    assert jobs.for_each_node(lambda n: n * 10, [3, 1, 2]) == [30, 10, 20]
    assert jobs.for_each_node(lambda n: n, []) == []


def test_the_nodes_are_told_at_once_not_one_after_the_other():
    together = threading.Barrier(8, timeout=5)  # broken (BrokenBarrierError) unless 8 calls wait at once
    assert jobs.for_each_node(lambda n: together.wait() is not None, range(8)) == [True] * 8


def test_at_most_end_feed_parallel_calls_run_at_once(monkeypatch):
    monkeypatch.setattr(jobs, "END_FEED_PARALLEL", 3)
    running, peak, lock = [0], [0], threading.Lock()

    def call(n):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    jobs.for_each_node(call, range(10))
    assert peak[0] == 3


def test_the_first_failure_in_node_order_is_raised_after_every_call_ended():
    ended = []

    def call(n):
        if n in (2, 5):
            time.sleep(0.1 if n == 2 else 0.0)  # node 5 fails first in time; node 2 comes first in order
            raise TFOSError(f"node {n} failed")
        ended.append(n)

    with pytest.raises(TFOSError, match="node 2 failed"):
        jobs.for_each_node(call, range(8))
    assert sorted(ended) == [0, 1, 3, 4, 6, 7]

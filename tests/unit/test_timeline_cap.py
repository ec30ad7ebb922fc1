"""The driver's bound on timeline events: per node and over all nodes (registry.timeline_room)."""

import pytest

from tfos.cluster.driver import registry as R
from tfos.wire import messages as M


@pytest.mark.parametrize("node,total,expected", [
    (0, 0, R.MAX_EVENTS_PER_NODE), (R.MAX_EVENTS_PER_NODE, 10, 0), (10, R.MAX_EVENTS - 5, 5),
    (0, R.MAX_EVENTS, 0), (R.MAX_EVENTS_PER_NODE - 3, R.MAX_EVENTS - 100, 3),
])
def test_timeline_room(node, total, expected):
    assert R.timeline_room(node, total) == expected


def test_many_nodes_keep_at_most_max_events_in_all(monkeypatch):
    monkeypatch.setattr(R, "MAX_EVENTS_PER_NODE", 50)
    monkeypatch.setattr(R, "MAX_EVENTS", 120)
    reg = R.NodeRegistry("c1", [("worker", i) for i in range(4)])
    event = {"name": "step", "ph": "X", "ts": 0, "dur": 1}
    for _ in range(3):
        for i in range(4):
            reg.on_report(M.Report("c1", i, {"step": 1}, [event] * 30))
    kept = [len(reg.nodes[i].events) for i in range(4)]
    assert sum(kept) == 120 == reg.events_kept and max(kept) <= 50, kept
    assert reg.new_attempt("c2", [("worker", 0)])  # a new attempt starts counting again
    reg.on_report(M.Report("c2", 0, {"step": 1}, [event] * 30))
    assert reg.events_kept == 30

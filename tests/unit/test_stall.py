"""The stall watchdog's decisions and report (tfos.cluster.driver.stall), from tables and from real
faulthandler dumps; what counts as progress in the registry."""

import faulthandler
import tempfile
import threading

import pytest

from tfos.cluster.driver import stall
from tfos.cluster.driver.lifecycle import shows_progress


@pytest.mark.parametrize("now,last,timeout,expected", [
    (100.0, None, 30.0, False),  # nothing reported yet: not armed
    (100.0, 80.0, 30.0, False), (100.0, 69.0, 30.0, True), (100.0, 0.0, None, False),  # None: no watchdog
])
def test_stalled(now, last, timeout, expected):
    assert stall.stalled(now, last, timeout) is expected


@pytest.mark.parametrize("before,values,expected", [
    ({}, {"step": 1, "time": 5.0}, True), ({"step": 1}, {"step": 1, "time": 6.0}, False),
    ({"step": 1}, {"step": 2}, True), ({"rows_read": 10, "feed_wait_secs": 1.0}, {"rows_read": 10, "feed_wait_secs": 9.0},
                                       False),
    ({"rows_read": 10}, {"rows_read": 11}, True), ({"loss": 0.5}, {"loss": 0.4}, True),
])
def test_what_counts_as_progress(before, values, expected):
    assert shows_progress(before, values) is expected


def _dump_from(stack_of):
    """A real faulthandler dump of every thread, taken while ``stack_of(dump)`` runs on this thread."""
    with tempfile.TemporaryFile("w+") as f:
        def dump():
            faulthandler.dump_traceback(f, all_threads=True)
            f.flush()
        stack_of(dump)
        f.seek(0)
        return f.read()


def run_node(dump):  # the TF process's runtime frame, under which main_fun runs
    main_fun(dump)


def main_fun(dump):
    all_reduce(dump)


def all_reduce(dump):
    dump()


def test_where_names_the_innermost_frame_the_callers_line_and_a_collective():
    side = threading.Event()
    t = threading.Thread(target=side.wait, daemon=True)  # another thread, as the reporter's
    t.start()
    try:
        text = _dump_from(run_node)
    finally:
        side.set()
    found = stall.threads(text)
    assert len(found) >= 2 and any(f[2] == "run_node" for _, frames in found for f in frames)
    w = stall.where(text)
    assert w.startswith("in dump (test_stall.py:") and "waiting in a collective (all_reduce)" in w, w


def test_where_without_a_collective_and_without_main_thread():
    text = _dump_from(lambda dump: run_node_sleeping(dump))
    assert "waiting in a collective" not in stall.where(text) and "in dump" in stall.where(text)
    assert stall.where("") == "no stack came back"
    assert "not in the dump" in stall.where('Thread 0x1 (most recent call first):\n  File "x.py", line 3 in f\n')


def run_node_sleeping(dump):
    def main_fun_sleeps():
        dump()
    main_fun_sleeps()


run_node_sleeping.__code__ = run_node_sleeping.__code__.replace(co_name="run_node")


def test_stall_message_lists_every_rank_then_the_stacks_and_log_tails():
    dump = _dump_from(run_node)
    text = stall.stall_message(301, [("node 0 (chief:0 on h0)", dump, "last line 0"),
                                     ("node 1 (worker:0 on h1)", "", "")])
    head = text.splitlines()
    assert head[0].startswith("no training rank made progress for 301s") and "stall_timeout" in head[0]
    assert head[1].startswith("  node 0 (chief:0 on h0): in dump") and head[2] == "  node 1 (worker:0 on h1): no stack came back"
    assert "--- node 0 (chief:0 on h0): last log lines ---\nlast line 0" in text and "(none)" in text


@pytest.mark.parametrize("labels,expected", [
    (["node 1 (worker:0 on h1)"], "node 1 (worker:0 on h1)"),
    ([f"node {i} (worker:{i} on h)" for i in (0, 3)], "node 0 (worker:0 on h), node 3 (worker:3 on h)"),
    ([f"node {i} (w on h)" for i in (9, 0, 2, 3, 4, 5, 7)], "nodes 0, 2-5, 7, 9 (7 nodes, e.g. node 9 (w on h))"),
    ([f"n{i}" for i in range(6)], "n0, n1, n2, n3 and 2 more"),
])
def test_group_label(labels, expected):
    assert stall.group_label(labels) == expected


def _fake_dump(main_line: int) -> str:
    return (f"Thread 0x00007f{main_line:08x} (most recent call first):\n"
            f'  File "/x/site-packages/tensorflow/ops.py", line 10 in all_reduce\n'
            f'  File "/home/u/train.py", line {main_line} in main_fun\n'
            f'  File "/x/tfos/cluster/node/runtime.py", line 118 in run_node\n')


def test_a_report_of_2048_nodes_groups_ranks_and_stacks_and_stays_under_1_mb():
    """2,047 ranks wait in the same all-reduce (their thread ids differ), one stands elsewhere: two
    lines say where they stand, each stack is shown once, log tails of at most MAX_TAILS nodes."""
    nodes = [(f"node {i} (worker:{i} on fakehost-{i // 8})", _fake_dump(42 if i != 5 else 77),
              f"log of node {i}\n" * 40) for i in range(2048)]
    text = stall.stall_message(300, nodes)
    assert len(text.encode()) < 1_000_000
    lines = text.splitlines()
    assert lines[1].startswith("  nodes 0-4, 6-2047 (2047 nodes, e.g. node 0 (worker:0 on fakehost-0)): in all_reduce")
    assert lines[2].startswith("  node 5 (worker:5 on fakehost-0): in all_reduce") and "train.py:77" in lines[2]
    assert text.count("stacks (most recent call first)") == 2
    assert text.count("last log lines ---") == stall.MAX_TAILS and "--- node 5 (worker:5 on fakehost-0): last log" in text
    assert f"the last log lines of {2048 - stall.MAX_TAILS} more node(s)" in text


def test_a_report_of_thousands_of_distinct_stacks_is_cut_under_1_mb():
    nodes = [(f"node {i} (worker:{i} on h)", _fake_dump(1000 + i) * 20, "") for i in range(2048)]
    text = stall.stall_message(None, nodes)
    assert len(text.encode()) < 1_000_000 and text.endswith("cluster.dump_stacks() gives every node's stacks)")

"""The driver's end-of-run table and merged timeline (pure)."""

import json

from tfos.cluster.driver import progress as prog


def test_rank_table_lists_every_node():
    roles = [("chief", 0), ("worker", 0), ("ps", 0)]
    state = {0: {"metrics": {"step": 10, "loss": 0.5, "examples_per_sec": 1234.5}, "host": "h0", "exit": 0},
             1: {"metrics": {"step": 9}, "host": "h1", "exit": 0}, 2: {"metrics": {}, "host": "h2", "exit": -15}}
    table = prog.rank_table(roles, state, {0: 100, 1: 90}).splitlines()
    assert len(table) == 2 + 3
    assert "chief:0" in table[2] and "0.5000" in table[2] and "1234" in table[2] and "100" in table[2]
    assert "worker:0" in table[3] and " 9 " in table[3] and "ps:0" in table[4] and "-15" in table[4]


def test_chrome_trace_merges_nodes_and_driver():
    roles = [("chief", 0), ("worker", 0)]
    ev = lambda name, cat, ts: {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": 5}  # noqa: E731
    trace = prog.chrome_trace(roles, {0: "a", 1: "b"}, {0: [ev("step", "step", 1)], 1: [ev("feed wait", "feed", 2)]},
                              [ev("feed job", "feed", 0)])
    evs = trace["traceEvents"]
    assert {e["pid"] for e in evs if e["ph"] == "X"} == {0, 1, 2}
    names = {e["args"]["name"] for e in evs if e["name"] == "process_name"}
    assert names == {"node 0 chief:0 @ a", "node 1 worker:0 @ b", "driver (Spark feeding)"}
    json.dumps(trace)

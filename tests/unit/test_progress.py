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
    assert "dropped" not in table[0]


def test_rank_table_shows_rows_dropped_for_equal_steps():
    state = {0: {"metrics": {"rows_dropped": 150}, "host": "h0", "exit": 0}, 1: {"metrics": {}, "host": "h1", "exit": 0}}
    table = prog.rank_table([("chief", 0), ("worker", 0)], state, {0: 1150, 1: 1000}).splitlines()
    assert table[0].split()[-1] == "dropped" and table[2].split()[-1] == "150" and table[3].split()[-1] == "0"


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


def test_node_output_reaches_the_driver_from_rank_0_or_all():
    from tfos.cluster.node.reporting import streams_output

    assert [streams_output(s, r) for s, r in (("chief", 0), ("chief", 1), ("chief", None), ("all", 1),
                                               ("all", None), ("none", 0))] == [True, False, False, True, True, False]


def test_line_tee_writes_through_and_hands_on_whole_lines():
    import io

    from tfos.cluster.node.reporting import LineTee

    out, lines = io.StringIO(), []
    tee = LineTee(out, lines.append)
    print("accuracy 0.93", file=tee)
    tee.write("partial ")
    tee.write("line\r\nnext")
    assert out.getvalue() == "accuracy 0.93\npartial line\r\nnext" and lines == ["accuracy 0.93", "partial line"]

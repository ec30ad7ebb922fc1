"""The driver at 512 nodes, a guard against control-plane regressions (issue 40): the fleet
simulator (tfos.testing.fleet, a process of its own on the real authenticated control channel)
against the real driver. Loose bounds; the figures are bench/scale.py's."""

import logging
import time

from tfos import TFCluster
from tfos.testing.fleet import FleetSpark

NODES = 512


def main_fun(args, ctx):  # never runs: the fleet plays the TF processes
    raise AssertionError("not called")


def test_512_nodes_start_report_and_stop_with_no_false_loss_and_no_emfile(caplog):
    caplog.set_level(logging.WARNING)
    spark = FleetSpark(NODES, run_secs=4.0)
    t0 = time.monotonic()
    cluster = TFCluster.reserve(spark, NODES, progress=False, heartbeat_interval=1.0, report_interval=1.0)
    cluster.start(main_fun)
    started = time.monotonic() - t0
    cluster.shutdown(timeout=180)
    assert started < 20, f"{NODES} nodes took {started:.1f}s to start"
    assert cluster.lost_nodes == [] and cluster.restarts == [] and cluster.registry.failures == []
    assert len({cluster.registry.host_of(i) for i in range(NODES)}) == NODES // 8
    assert all(m.get("step", 0) >= 1 for m in cluster.metrics().values())  # every node reported
    assert all(p.returncode == 0 for p in spark.processes)
    problems = [r.getMessage() for r in caplog.records if "open files" in r.getMessage()
                or "accept failed" in r.getMessage() or "too many connections" in r.getMessage()]
    assert problems == []

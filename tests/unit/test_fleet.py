"""The fleet simulator (tfos.testing.fleet): simulated nodes in a process of their own on the real
control channel, against the real driver (bench/scale.py measures with it at up to 2,048 nodes)."""

import pytest

from tfos import TFCluster
from tfos.errors import TFOSError
from tfos.testing.fake_spark import Does
from tfos.testing.fleet import FleetSpark, host_of

FAST = dict(heartbeat_interval=0.2, heartbeat_timeout=3, stop_grace_secs=0, restart_backoff=0, progress=False,
            report_interval=0.2)


def main_fun(args, ctx):  # never runs: the fleet plays the TF processes
    raise AssertionError("not called")


@pytest.mark.parametrize("index,host", [(0, "fakehost-0"), (7, "fakehost-0"), (8, "fakehost-1"), (2047, "fakehost-255")])
def test_host_of(index, host):
    assert host_of(index) == host


def test_a_fleet_of_48_nodes_starts_reports_and_shuts_down_with_no_loss():
    spark = FleetSpark(48, run_secs=1.0)
    cluster = TFCluster.reserve(spark, 48, **FAST)
    cluster.start(main_fun)
    hosts = {cluster.registry.host_of(i) for i in range(48)}
    assert hosts == {f"fakehost-{k}" for k in range(6)}, hosts  # registered as its hosts, not 127.0.0.1
    cluster.shutdown(timeout=60)
    assert cluster.lost_nodes == [] and cluster.restarts == [] and cluster.registry.failures == []
    assert all(m.get("step", 0) >= 1 for m in cluster.metrics().values())  # every node reported
    assert all(p.returncode == 0 for p in spark.processes)


def test_a_silent_fleet_node_is_found_lost_and_the_cluster_restarts_without_it():
    spark = FleetSpark(8, behaviour=lambda i, attempt: Does.GO_SILENT if (i, attempt) == (5, 0) else Does.FINISH,
                       run_secs=3.0)
    cluster = TFCluster.reserve(spark, 8, max_restarts=1, **FAST)
    cluster.start(main_fun)
    cluster.shutdown(timeout=120)
    assert [r.node_index for r in cluster.restarts] == [5] and cluster.attempt == 1


def test_the_fleet_refuses_what_it_does_not_play():
    spark = FleetSpark(2, behaviour=lambda i, attempt: Does.SAVES)
    cluster = TFCluster.reserve(spark, 2, **FAST)
    with pytest.raises(TFOSError):
        cluster.start(main_fun)
        cluster.shutdown(timeout=30)

"""The driver's supervisor, registry and failure policy on a fake Spark (tfos.testing.fake_spark):
the real control service and wire, scripted nodes instead of executors and TF processes, so each
case runs in about a second. The same paths run end to end on Spark in tests/integration."""

import time

import pytest

from tfos import TFCluster
from tfos.cluster.driver.lifecycle import Phase
from tfos.errors import NodeFailedError, ReservationTimeoutError
from tfos.testing.fake_spark import Does, FakeSpark
from tfos.topology import InputMode

FAST = dict(heartbeat_interval=0.1, heartbeat_timeout=5, stop_grace_secs=0, restart_backoff=0, progress=False)


def main_fun(args, ctx):  # never runs: the fake nodes play the TF processes
    raise AssertionError("not called")


def run(spark, n=2, num_ps=0, **kwargs):
    cluster = TFCluster.reserve(spark, n, num_ps, **dict(FAST, **kwargs))
    cluster.start(main_fun)
    return cluster


def scripted(plan: dict, default=Does.FINISH):
    """behaviour(i, attempt) from {(i, attempt): Does}."""
    return lambda i, attempt: plan.get((i, attempt), default)


def test_every_node_finishes():
    spark = FakeSpark()
    cluster = run(spark)
    assert set(cluster.cluster_spec) == {"chief", "worker"}
    cluster.shutdown()
    assert cluster.lifecycle.phase is Phase.SHUT_DOWN and spark.started == [(0, 0), (1, 0)]
    assert cluster.restarts == [] and cluster.attempt == 0


def test_a_failed_node_restarts_every_node_once():
    spark = FakeSpark(3, scripted({(1, 0): Does.RAISE}), run_secs=0.5)
    cluster = run(spark, 3, max_restarts=1)
    cluster.shutdown()
    assert spark.started == [(i, a) for a in (0, 1) for i in range(3)]
    assert [(r.node_index, r.attempt) for r in cluster.restarts] == [(1, 0)]
    assert cluster.attempt == 1 and cluster.lifecycle.phase is Phase.SHUT_DOWN


def test_without_restarts_the_failure_is_raised():
    spark = FakeSpark(2, scripted({(1, 0): Does.RAISE}))
    cluster = run(spark)
    with pytest.raises(NodeFailedError, match="node 1") as e:
        cluster.shutdown()
    assert "failed on purpose" in str(e.value) and spark.started == [(0, 0), (1, 0)]
    assert cluster.lifecycle.phase is Phase.FAILED


def test_restarts_used_up_raise_every_attempts_failure():
    spark = FakeSpark(2, lambda i, attempt: Does.RAISE if i == 1 else Does.HANG)
    cluster = run(spark, max_restarts=2)
    with pytest.raises(NodeFailedError) as e:
        cluster.shutdown(timeout=60)
    assert [f.attempt for f in e.value.failures if f.node_index == 1] == [0, 1, 2]
    assert len(cluster.restarts) == 2 and max(a for _, a in spark.started) == 2


def test_non_retryable_is_never_restarted():
    spark = FakeSpark(2, scripted({(0, 0): Does.NON_RETRYABLE}, Does.HANG))
    cluster = run(spark, max_restarts=3)
    with pytest.raises(NodeFailedError, match="node 0"):
        cluster.shutdown(timeout=60)
    assert spark.started == [(0, 0), (1, 0)] and cluster.restarts == []


def test_a_node_that_never_registers_times_out_naming_the_setting():
    spark = FakeSpark(2, scripted({(1, 0): Does.NEVER_REGISTER}))
    t0 = time.monotonic()
    with pytest.raises(ReservationTimeoutError, match=r"nodes \[1\] of 2 did not start within 2s \(reservation_timeout\)"):
        run(spark, reservation_timeout=2)
    assert time.monotonic() - t0 < 15


def test_a_silent_node_is_lost_at_heartbeat_timeout():
    spark = FakeSpark(2, scripted({(1, 0): Does.GO_SILENT}, Does.HANG))
    cluster = run(spark, heartbeat_timeout=1)
    with pytest.raises(NodeFailedError, match="lost contact with the node agent"):
        cluster.shutdown(timeout=30)


def test_ps_backend_goes_on_without_a_lost_worker():
    # roles: ps, chief, worker 0, worker 1; worker 1 fails while worker 0 runs: the chief goes on
    spark = FakeSpark(4, lambda i, attempt: {1: Does.FINISH, 3: Does.RAISE}.get(i, Does.HANG),
                      run_secs=lambda i: 1.5 if i == 1 else 0.3)
    cluster = run(spark, 4, num_ps=1, backend="ps", max_restarts=1)
    cluster.shutdown(timeout=30)
    assert [(n.node_index, n.job_name) for n in cluster.lost_nodes] == [(3, "worker")]
    assert cluster.restarts == [] and spark.started == [(i, 0) for i in range(4)]


def test_shutdown_timeout_names_its_setting():
    spark = FakeSpark(2, scripted({}, Does.HANG))
    cluster = run(spark)
    with pytest.raises(Exception, match=r"training nodes \[0, 1\] still running after 1s; raise shutdown\(timeout=\.\.\.\)"):
        cluster.shutdown(timeout=1)
    assert cluster.lifecycle.phase is Phase.FAILED


def test_too_few_slots_fail_before_anything_starts():
    with pytest.raises(ReservationTimeoutError, match="offers 1 slot"):
        TFCluster.reserve(FakeSpark(1), 2, **FAST)


def test_spark_input_mode_restarts_are_left_to_train():
    """InputMode.SPARK: a failure while no feed runs is raised by shutdown (no data to resume from)."""
    spark = FakeSpark(2, scripted({(1, 0): Does.RAISE}, Does.FINISH), run_secs=0.3)
    cluster = TFCluster.reserve(spark, 2, **dict(FAST, max_restarts=1))
    cluster.start(main_fun, input_mode=InputMode.SPARK)
    time.sleep(1)
    with pytest.raises(NodeFailedError):
        cluster.shutdown()


def test_a_stall_fails_the_cluster_with_every_nodes_stack():
    """Both nodes report a step, then stay alive without progress: StallError within stall_timeout
    plus a few heartbeats, naming where each node stands, with their stacks; every node stopped."""
    from tfos.errors import StallError

    spark = FakeSpark(2, scripted({}, Does.STALL))
    cluster = run(spark, stall_timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(StallError) as e:
        cluster.shutdown(timeout=60)
    text = str(e.value)
    assert time.monotonic() - t0 < 8, text
    assert "no training rank made progress for 1s" in text and "stall_timeout" in text
    for i, role in ((0, "chief:0"), (1, "worker:0")):
        assert f"  node {i} ({role} on 127.0.0.1): " in text and f"fake node {i}: last log line" in text
    assert "_heartbeat_until" in text  # each node's own stack
    assert cluster.lifecycle.phase is Phase.FAILED


def test_dump_stacks_on_demand():
    spark = FakeSpark(2, scripted({}, Does.STALL))
    cluster = run(spark, stall_timeout=None)
    text = cluster.dump_stacks(timeout=5)
    assert text.startswith("Where each rank stands:") and "fake node 1: last log line" in text
    cluster._abort(__import__("tfos").TFOSError("done"))


# ---------------------------------------------------------------- a size range (min_executors)

def test_a_lost_executor_restarts_the_cluster_smaller_without_waiting_for_it():
    """3 nodes, min_executors=2: node 2 fails and its slot is gone: the restart runs on the 2 slots
    Spark offers, far sooner than reservation_timeout; nodes 0 and 1 keep their roles."""
    spark = FakeSpark(3, scripted({(2, 0): Does.RAISE}), run_secs=0.6)
    cluster = TFCluster.reserve(spark, 3, min_executors=2, **dict(FAST, max_restarts=1,
                                                                 reservation_timeout=600))
    cluster.start(main_fun)
    spark.slots = 2  # the failed node's executor is gone for good
    t0 = time.monotonic()
    cluster.shutdown(timeout=60)
    assert time.monotonic() - t0 < 15
    assert spark.started == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]
    assert cluster.roles == [("chief", 0), ("worker", 0)] and cluster.attempt == 1
    assert [(r.node_index, r.attempt) for r in cluster.restarts] == [(2, 0)]


def test_the_restart_takes_every_slot_there_is_again():
    """With the lost slot back by the restart, the next attempt runs all 3 nodes."""
    spark = FakeSpark(3, scripted({(2, 0): Does.RAISE}), run_secs=0.3)
    cluster = TFCluster.reserve(spark, (2, 3), **dict(FAST, max_restarts=1))
    cluster.start(main_fun)
    cluster.shutdown(timeout=60)
    assert spark.started[3:] == [(0, 1), (1, 1), (2, 1)] and len(cluster.roles) == 3


def test_below_min_executors_the_restart_fails_saying_what_spark_offered():
    spark = FakeSpark(3, scripted({(1, 0): Does.RAISE}, Does.HANG), run_secs=0.3)
    cluster = TFCluster.reserve(spark, 3, min_executors=2, **dict(FAST, max_restarts=1, size_wait=0,
                                                                 reservation_timeout=1.5))
    cluster.start(main_fun)
    spark.slots = 1
    with pytest.raises(ReservationTimeoutError, match=r"Spark offers 1 task slot\(s\) after 2s.*min_executors=2"):
        cluster.shutdown(timeout=60)
    assert spark.started == [(0, 0), (1, 0), (2, 0)] and cluster.lifecycle.phase is Phase.FAILED


def test_a_range_starts_with_what_spark_offers_after_size_wait():
    spark = FakeSpark(2)
    t0 = time.monotonic()
    cluster = TFCluster.reserve(spark, 4, min_executors=2, **dict(FAST, size_wait=0.5))
    assert 0.4 < time.monotonic() - t0 < 5 and cluster.roles == [("chief", 0), ("worker", 0)]
    cluster.start(main_fun)
    cluster.shutdown()
    assert spark.started == [(0, 0), (1, 0)]


def test_the_loop_is_the_only_thread_that_restarts():
    """Callers waiting in shutdown() and raise_if_failed() at once: one restart, by the loop."""
    import threading

    spark = FakeSpark(2, scripted({(1, 0): Does.RAISE}), run_secs=0.5)
    cluster = run(spark, max_restarts=2)
    callers = [threading.Thread(target=cluster.raise_if_failed) for _ in range(3)]
    time.sleep(0.55)
    for t in callers:
        t.start()
    cluster.shutdown(timeout=60)
    for t in callers:
        t.join(10)
    assert spark.started == [(0, 0), (1, 0), (0, 1), (1, 1)] and len(cluster.restarts) == 1
    names = {t.name for t in threading.enumerate()}
    assert not any(n.startswith("tfos-supervisor") for n in names)

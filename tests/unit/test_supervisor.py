"""The driver's supervisor, registry and failure policy on a fake Spark (tfos.testing.fake_spark):
the real control service and wire, scripted nodes instead of executors and TF processes, so each
case runs in about a second. The same paths run end to end on Spark in tests/integration."""

import time

import pytest

from tfos import TFCluster
from tfos.cluster.driver.lifecycle import Phase
from tfos.errors import NodeFailedError, ReservationTimeoutError
from tfos.testing import wait_for
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


def test_the_restart_takes_every_slot_there_is_once_the_backoff_passed():
    """The lost slot comes back during restart_backoff: the next attempt runs all 3 nodes (the size
    is what Spark offers when the attempt starts, not when the node failed)."""
    import threading

    spark = FakeSpark(3, scripted({(2, 0): Does.RAISE}), run_secs=0.5)
    cluster = TFCluster.reserve(spark, (2, 3), **dict(FAST, max_restarts=1, restart_backoff=1.5))
    cluster.start(main_fun)
    spark.slots = 2
    threading.Timer(1.0, lambda: setattr(spark, "slots", 3)).start()  # back within the backoff
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
    """Callers waiting in raise_if_failed() at once while the loop restarts: one restart (the old
    callers each restarted, so several waiting callers could restart twice), and every caller
    returns once the new attempt runs."""
    import threading

    from tfos.testing import wait_for

    spark = FakeSpark(2, scripted({(1, 0): Does.RAISE}), run_secs=0.5)
    cluster = run(spark, max_restarts=3, restart_backoff=1.0)
    assert wait_for(lambda: bool(cluster.restarts), 10)  # the loop acted: the callers come during the backoff
    seen, errors = [], []

    def caller():
        try:
            cluster.raise_if_failed()
            seen.append(cluster.attempt)
        except BaseException as e:
            errors.append(e)

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    assert errors == [] and seen == [1, 1, 1]
    cluster.shutdown(timeout=60)
    assert spark.started == [(0, 0), (1, 0), (0, 1), (1, 1)] and len(cluster.restarts) == 1
    assert not any(t.name.startswith("tfos-supervisor") for t in threading.enumerate())


def test_a_loop_abort_finishes_before_the_waiting_call_raises():
    """max_restarts=0: the loop fails the cluster; shutdown() raises only after everything was
    released (no node left, the control service stopped)."""
    spark = FakeSpark(2, scripted({(1, 0): Does.RAISE}, Does.HANG), run_secs=0.3)
    cluster = run(spark)
    with pytest.raises(NodeFailedError):
        cluster.shutdown(timeout=60)
    assert cluster.supervisor._released.is_set() and not cluster.registry.unfinished(cluster.registry.indexes())


def test_a_host_with_two_ps_workers_lost_goes_on_without_both():
    """backend='ps': two workers (on one dead host) silent at once: each is lost on its own while the
    third worker runs; nothing restarts."""
    spark = FakeSpark(5, lambda i, attempt: {1: Does.FINISH, 3: Does.GO_SILENT, 4: Does.GO_SILENT}.get(i, Does.HANG),
                      run_secs=lambda i: 3.0 if i == 1 else 0.3)
    cluster = run(spark, 5, num_ps=1, backend="ps", max_restarts=1, heartbeat_timeout=1)
    cluster.shutdown(timeout=30)
    assert sorted(n.node_index for n in cluster.lost_nodes) == [3, 4] and cluster.restarts == []


def test_a_smaller_cluster_grows_back_at_rank_0s_next_checkpoint():
    """Started on 2 of 3 slots; the third comes back: at rank 0's next ctx.checkpoint_saved the loop
    stops the 2 nodes and starts 3 (a planned restart: no max_restarts used, none in restarts)."""
    spark = FakeSpark(2, lambda i, attempt: Does.CHECKPOINTS if attempt == 0 else Does.FINISH)
    cluster = TFCluster.reserve(spark, 3, min_executors=2, **dict(FAST, size_wait=0.2, grow_interval=0.3))
    cluster.start(main_fun)
    assert len(cluster.roles) == 2
    time.sleep(0.5)
    assert len(spark.started) == 2  # nothing to grow into yet
    spark.slots = 3
    cluster.shutdown(timeout=60)
    assert spark.started == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 1)], spark.started
    assert [(r.from_nodes, r.to_nodes, r.attempt) for r in cluster.resizes] == [(2, 3, 0)]
    assert cluster.resizes[0].step >= 0 and cluster.restarts == [] and len(cluster.roles) == 3


def test_grow_interval_none_never_grows():
    spark = FakeSpark(2, lambda i, attempt: Does.CHECKPOINTS if attempt == 0 else Does.FINISH)
    cluster = TFCluster.reserve(spark, 3, min_executors=2, **dict(FAST, size_wait=0.2, grow_interval=None))
    cluster.start(main_fun)
    spark.slots = 3
    time.sleep(1.0)
    assert len(spark.started) == 2 and cluster.resizes == []
    cluster._abort(__import__("tfos").TFOSError("done"))


def test_a_node_told_to_go_every_rank_saves_at_one_step_and_the_cluster_goes_on_without_it():
    """3 nodes whose program asks ctx.should_checkpoint (the real SavePoint); node 2's agent is told
    to go: every node saves at the same step, rank 0 says so, and the loop restarts on the 2 slots
    Spark still offers once the evicted slot is gone (no max_restarts used); no node steps past
    the save."""
    spark = FakeSpark(3, lambda i, attempt: Does.SAVES if attempt == 0 else Does.FINISH)
    cluster = TFCluster.reserve(spark, 3, min_executors=2, **dict(FAST, size_wait=0.2, grow_interval=None,
                                                                  eviction_grace=20))
    cluster.start(main_fun)
    time.sleep(0.5)  # every node polls its save point by now
    spark.evict(2, 0)
    assert wait_for(lambda: cluster.evictions, 20), "no save"
    spark.slots = 2  # the evicted executor goes
    cluster.shutdown(timeout=60)
    first = [n for n in spark.nodes if n.cluster.attempt == 0]
    saved = [n.saved for n in first]
    assert saved[0] and all(s == saved[0] for s in saved), saved  # the same step on every rank, once
    assert all(n.steps == saved[0][0] for n in first), [n.steps for n in first]  # no step past the save
    ev = cluster.evictions
    assert [(e.nodes, e.step, e.attempt) for e in ev] == [((2,), saved[0][0], 0)], ev
    assert cluster.restarts == [] and cluster.attempt == 1 and len(cluster.roles) == 2


def test_a_node_told_to_go_saves_where_tfs_preemption_handler_agrees_and_the_cluster_goes_on():
    """The ranks' SavePoints hand the round to TF's PreemptionCheckpointHandler (on_round: tf_keras'
    save_before_preemption) instead of agreeing on a step through the driver: each proposes 0, only
    rank 0 hears of the round, every node saves at the step agreed (as TF's coordination service
    would), and rank 0's checkpoint_saved there lets the loop go on without the evicted node."""
    spark = FakeSpark(3, lambda i, attempt: Does.HANDLER_SAVES if attempt == 0 else Does.FINISH)
    cluster = TFCluster.reserve(spark, 3, min_executors=2, **dict(FAST, size_wait=0.2, grow_interval=None,
                                                                  eviction_grace=20))
    cluster.start(main_fun)
    time.sleep(0.5)
    spark.evict(1, 0)
    assert wait_for(lambda: cluster.evictions, 20), "no save"
    spark.slots = 2
    cluster.shutdown(timeout=60)
    first = [n for n in spark.nodes if n.cluster.attempt == 0]
    saved = [n.saved for n in first]
    assert saved[0] and all(s == saved[0] for s in saved), saved  # one step on every rank
    assert all(n.steps == saved[0][0] for n in first), [n.steps for n in first]  # none went past it
    assert [(e.nodes, e.step) for e in cluster.evictions] == [((1,), saved[0][0])], cluster.evictions
    assert cluster.restarts == [] and cluster.attempt == 1 and len(cluster.roles) == 2


def test_an_eviction_notice_is_declined_when_a_rank_does_not_ask_should_checkpoint():
    """Node 1's program never asks should_checkpoint: the notice is declined (nothing to wait for),
    the agent stops at once, and the failure restarts the cluster as before."""
    spark = FakeSpark(2, lambda i, attempt: (Does.SAVES if i == 0 else Does.HANG) if attempt == 0 else Does.FINISH)
    cluster = TFCluster.reserve(spark, 2, max_restarts=1, **dict(FAST, eviction_grace=20))
    cluster.start(main_fun)
    time.sleep(0.5)
    spark.evict(0, 0)
    cluster.shutdown(timeout=60)
    assert cluster.evictions == [] and [r.node_index for r in cluster.restarts] == [0], cluster.restarts


def test_after_a_save_for_an_executor_that_ended_the_restart_does_not_wait_for_its_slot_to_go():
    """The notice says the executor JVM ended (Spark counts its slot no more; a standalone worker
    may start another there): the restart after the save waits for no slot to go, not the grace."""
    spark = FakeSpark(3, lambda i, attempt: Does.SAVES if attempt == 0 else Does.FINISH)
    cluster = TFCluster.reserve(spark, 3, min_executors=2, **dict(FAST, size_wait=0.2, grow_interval=None,
                                                                  eviction_grace=30))
    cluster.start(main_fun)
    time.sleep(0.5)
    spark.evict(2, 0, executor_gone=True)  # Spark offers 3 slots still: a replacement executor
    assert wait_for(lambda: cluster.attempt == 1, 10), "the restart waited for the slot to go"
    cluster.shutdown(timeout=60)
    assert [e.nodes for e in cluster.evictions] == [(2,)] and len(cluster.roles) == 3 and cluster.restarts == []


def test_dynamic_allocation_is_refused_before_any_job_starts():
    """Spark runs no barrier stage under dynamic allocation (measured on Kubernetes: the reservation
    failed late with BarrierJobRunWithDynamicAllocationException): reserve() says so first."""
    from tfos.errors import ConfigError

    spark = FakeSpark(slots=2)
    spark.conf = lambda: {"spark.dynamicAllocation.enabled": "true"}
    with pytest.raises(ConfigError, match="spark.dynamicAllocation.enabled=false"):
        TFCluster.reserve(spark, 2)
    assert spark.started == []


def test_what_sparks_rpc_leaves_open_is_warned_once_per_process(caplog, monkeypatch):
    """Issue 53: with Spark's defaults (FakeSpark's empty conf) the secret travels in launch messages
    Spark sends in clear; the first reserve() of the process warns, later ones say it at INFO."""
    import logging

    import tfos.api

    monkeypatch.setattr(tfos.api, "_SAID", set())
    levels = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tfos.api"):
            cluster = run(FakeSpark())
        cluster.shutdown()
        levels.append([r.levelno for r in caplog.records if "launch messages" in r.getMessage()])
    assert levels == [[logging.WARNING], [logging.INFO]]
    assert "spark.authenticate=true with spark.network.crypto.enabled=true" in tfos.api._SAID.pop()

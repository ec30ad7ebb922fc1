"""Restarts (max_restarts) on the shared local-cluster: a failed node makes tfos stop every node
and start them all again from main_fun, which resumes from ctx.checkpoint_dir.

Elsewhere: an MWMS program on file shards killed and resumed from its checkpoint
(tests/hadoop/test_training_on_hdfs.py, Horovod's in tests/e2e/test_horovod.py); an executor JVM
that dies and the restart on the executor Spark starts in its place (here the told-to-go test with
``executor_ends``; a YARN container killed in tests/hadoop/test_yarn.py; an executor pod deleted in
tests/kubernetes)."""

import collections
import json
import os
import signal
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tfos import InputMode, NonRetryable
from tfos.errors import NodeFailedError, ReservationTimeoutError
from tfos.testing import wait_for

from restart_programs import fed_steps, trained_ids


def read_ids_slowly(args, ctx):
    """Report how many rows this node read; write the ids it read in this attempt at the end."""
    feed = ctx.get_data_feed(train_mode=True)
    ids = []
    for batch_ids, _x in feed.batches(10):
        ids.extend(int(i) for i in batch_ids)
        ctx.report(rows=len(ids))
        time.sleep(0.05)
    with open(os.path.join(args, f"ids-{ctx.node_index}-attempt{ctx.attempt}.json"), "w") as f:
        json.dump(ids, f)


def test_spark_feed_node_killed_in_epoch_2_feeds_that_epoch_again(tfos_cluster, spark, tmp_path):
    n = 1600
    df = spark.range(0, n, 1, 6).selectExpr("id", "cast(id as float) as x")
    cluster = tfos_cluster(2, 0, max_restarts=1, restart_backoff=0, stop_grace_secs=2, report_interval=0.2)
    cluster.start(read_ids_slowly, str(tmp_path), input_mode=InputMode.SPARK)

    def kill_in_epoch_2():
        if wait_for(lambda: sum(m.get("rows", 0) for m in cluster.metrics().values()) >= 1.3 * n, 300):
            os.kill(cluster.nodes[1]["pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_in_epoch_2, daemon=True)
    killer.start()
    fed = cluster.train(df, num_epochs=3, chunk_rows=100, uneven=None)  # every row, no equal-steps drop
    killer.join()
    cluster.shutdown(timeout=120)

    assert [r.node_index for r in cluster.restarts] == [1] and cluster.attempt == 1
    assert fed == 3 * n  # epoch 1 before the failure, epochs 2 and 3 after it
    final = [json.loads((tmp_path / f"ids-{i}-attempt1.json").read_text()) for i in range(2)]
    counts = collections.Counter(final[0] + final[1])
    assert set(counts) == set(range(n)) and set(counts.values()) == {2}  # the epochs fed after the restart


def test_spark_feed_resumes_where_the_checkpoint_is_every_row_once_per_epoch(tfos_cluster, spark, tmp_path):
    """MWMS on fed rows, a checkpoint every 10 steps with ctx.checkpoint_saved on every rank (which
    sends each rank's feed position). Node 1 is killed in epoch 2, past a checkpoint: the new
    attempt resumes from it and is fed the rest of epoch 2 (not all of it), then epoch 3. What
    the final model trained on holds every row once per epoch (counted), but for the rows equal
    steps dropped at the end of the feed."""
    n, epochs, batch = 2400, 3, 20
    df = spark.range(0, n, 1, 6)
    cluster = tfos_cluster(2, 0, max_restarts=1, restart_backoff=0, stop_grace_secs=2, report_interval=0.2,
                           checkpoint_dir=str(tmp_path / "ckpt"))
    per_epoch = n // (2 * batch)  # steps of one epoch on 2 ranks
    # node 1's TF process SIGKILLs itself 5 steps past the checkpoint at 1.5 epochs: at an exact
    # step (a kill from here, on the step the metrics show, could land between a save and its report)
    cluster.start(fed_steps, {"out": str(tmp_path), "batch": batch, "every": 10, "sleep": 0.02,
                              "kill": [1, per_epoch * 3 // 2 + 5]}, input_mode=InputMode.SPARK)
    fed = cluster.train(df, num_epochs=epochs, chunk_rows=100)
    cluster.shutdown(timeout=120)

    assert cluster.attempt == 1 and 1 in [r.node_index for r in cluster.restarts]  # rank 0's collective broke too
    resumed = [json.loads(line) for line in open(tmp_path / "ids-a1-r0.jsonl")][0]["resumed_from"]
    assert resumed % per_epoch, resumed  # resumed mid-epoch: from a checkpoint inside epoch 2
    counts = collections.Counter(trained_ids(tmp_path))
    dropped = sum(m.get("rows_dropped", 0) for m in cluster.metrics().values())
    assert set(counts) <= set(range(n)) and max(counts.values()) == epochs, counts.most_common(3)  # none twice
    assert sum(epochs - counts[i] for i in range(n)) == dropped <= 2 * (batch - 1)  # every other row once
    # the new attempt was fed every row but those the checkpoint had: not epoch 2 again from its start
    assert cluster.feeds.events[-1]["args"]["rows"] == epochs * n - resumed * 2 * batch, (cluster.feeds.events, fed)


def fail_every_time(args, ctx):
    if ctx.node_index == 1:
        if args == "nonretryable":
            raise NonRetryable("row 17 of the input is not a digit image")
        raise RuntimeError(f"transient failure in attempt {ctx.attempt}")
    time.sleep(600)


def test_restarts_exhausted_raise_every_attempts_failure(tfos_cluster):
    cluster = tfos_cluster(2, 0, max_restarts=1, restart_backoff=0, stop_grace_secs=2)
    cluster.start(fail_every_time, None)
    with pytest.raises(NodeFailedError) as exc:
        cluster.shutdown()
    assert [(f.node_index, f.attempt) for f in exc.value.failures] == [(1, 0), (1, 1)]
    text = str(exc.value)
    assert "transient failure in attempt 0" in text and "transient failure in attempt 1" in text
    assert len(cluster.restarts) == 1


def test_non_retryable_failure_is_not_restarted(tfos_cluster):
    cluster = tfos_cluster(2, 0, max_restarts=3, restart_backoff=0, stop_grace_secs=2)
    cluster.start(fail_every_time, "nonretryable")
    t0 = time.monotonic()
    with pytest.raises(NodeFailedError, match="row 17 of the input") as exc:
        cluster.shutdown()
    assert time.monotonic() - t0 < 30
    assert len(exc.value.failures) == 1 and not exc.value.failures[0].retryable
    assert cluster.restarts == [] and cluster.attempt == 0


def wait_for_feed(args, ctx):
    for _ in ctx.get_data_feed(train_mode=True).batches(10):
        pass


def test_slots_taken_while_restarting_raise_reservation_timeout(tfos_cluster, sc):
    cluster = tfos_cluster(2, 0, max_restarts=1, restart_backoff=0, stop_grace_secs=2, reservation_timeout=5)
    cluster.start(wait_for_feed, None, input_mode=InputMode.SPARK)

    def occupy_both_slots():  # another job takes the executors the restart needs
        sc.setJobGroup("tfos-test-blocker", "holds both slots", interruptOnCancel=True)
        try:
            sc.parallelize(range(2), 2).foreach(lambda _: __import__("time").sleep(120))
        except Exception:
            pass

    blocker = threading.Thread(target=occupy_both_slots, daemon=True)
    blocker.start()
    try:
        assert wait_for(lambda: len(sc.statusTracker().getActiveJobsIds()) >= 1, 30)
        time.sleep(2)
        os.kill(cluster.nodes[1]["pid"], signal.SIGKILL)
        assert wait_for(lambda: bool(cluster.registry.failures), 60)
        t0 = time.monotonic()
        with pytest.raises(ReservationTimeoutError, match="reservation_timeout"):
            cluster.train(sc.parallelize([(1.0,)] * 10, 2))
        assert time.monotonic() - t0 < 5 + 40
    finally:
        sc.cancelJobGroup("tfos-test-blocker")
        blocker.join(30)


def answer_slowly(args, ctx):
    """Inference: answer each id with id * 2 and the attempt, reporting rows answered."""
    feed = ctx.get_data_feed(train_mode=False)
    answered = 0
    while not feed.should_stop():
        rows = feed.next_batch(10)
        if rows:
            feed.batch_results([[float(r[0]) * 2, float(ctx.attempt)] for r in rows])
            answered += len(rows)
            ctx.report(rows=answered)
            time.sleep(0.02)


def test_inference_losing_a_node_fails_with_its_error_then_runs_on_the_restarted_cluster(tfos_cluster, spark):
    n = 2000
    df = spark.range(0, n, 1, 4)
    cluster = tfos_cluster(2, 0, max_restarts=1, restart_backoff=0, stop_grace_secs=2, report_interval=0.2)
    cluster.start(answer_slowly, None, input_mode=InputMode.SPARK)

    def kill_mid_job():
        if wait_for(lambda: sum(m.get("rows", 0) for m in cluster.metrics().values()) >= n // 4, 300):
            os.kill(cluster.nodes[1]["pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_mid_job, daemon=True)
    killer.start()
    with pytest.raises(Exception, match="killed by signal 9"):  # never a short result
        cluster.inference(df, chunk_rows=50, output_type="array<double>").collect()
    killer.join()

    rows = cluster.inference(df, chunk_rows=50, output_type="array<double>").collect()  # restarts first
    assert cluster.attempt == 1 and [r.node_index for r in cluster.restarts] == [1]
    assert sorted(r.id for r in rows) == list(range(n))
    assert all(r.prediction == [2.0 * r.id, 1.0] for r in rows)
    cluster.shutdown(timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("keras_version", ["3", "2"])
def test_keras_fit_killed_mid_training_resumes_at_the_epoch_after_its_backup(tfos_cluster, tmp_path, keras_version):
    """Keras 3 through tfos.keras_dist (rank 0's BackupAndRestore, restored on every rank) and
    tf_keras fit under MWMS (tf.keras.callbacks.BackupAndRestore)."""
    import digits_keras_fit
    import digits_tf

    epochs = 10
    args = SimpleNamespace(keras=keras_version, epochs=epochs, batch_size=32, learning_rate=0.01, compression=None,
                           data_dir=str(tmp_path / "data"), output_dir=str(tmp_path / "out"))
    os.makedirs(args.output_dir)
    args.rows_per_rank = digits_tf.prepare_shards(args.data_dir)["train_rows"] // 2 - 40
    cluster = tfos_cluster(2, 0, max_restarts=1, restart_backoff=1, stop_grace_secs=2, report_interval=0.2,
                           checkpoint_dir=str(tmp_path / "ckpt"))
    cluster.start(digits_keras_fit.main_fun, args)
    assert wait_for(lambda: min(m.get("epoch", 0) for m in cluster.metrics().values()) >= epochs // 2, 600,
                    interval=0.05)
    os.kill(cluster.nodes[1]["pid"], signal.SIGKILL)
    cluster.shutdown(timeout=900)

    assert cluster.attempt == 1 and any(r.node_index == 1 for r in cluster.restarts), cluster.restarts
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["attempt"] == 1, result
    resumed = result["epochs_run"][0]
    assert epochs // 2 - 2 <= resumed < epochs and result["epochs_run"] == list(range(resumed, epochs)), result
    w0, w1 = np.load(tmp_path / "out" / "weights-rank0.npz"), np.load(tmp_path / "out" / "weights-rank1.npz")
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])


# SIGTERM with Keras 3: tests/multihost/test_restarts.py::test_keras_fit_across_hosts_told_to_go_...
@pytest.mark.parametrize("notice,keras_version", [("executor_ends", "3"), ("sigterm", "2")])
def test_keras_fit_told_to_go_saves_at_one_step_and_resumes_from_it(tfos_cluster, tmp_path, notice, keras_version):
    """Keras 3 fit through tfos.keras_dist, and tf_keras fit under MWMS with
    BackupAndRestore(save_before_preemption=True) (TF's PreemptionCheckpointHandler agrees on the
    step), each with tfos.callbacks.save_before_eviction: node 1 is told to go mid-training
    (SIGTERM to its agent, then its executor goes as the platform would end it; or its executor JVM
    just ends, as after Spark's decommission), every rank saves at one step, the cluster restarts
    without using max_restarts and fit resumes from that step (Keras 3: in the epoch of the backup;
    tf_keras: at the batch after it), replicas identical."""
    import psutil

    import digits_keras_fit
    import digits_tf

    epochs = 20  # about 3 s of fit: the agent sees its JVM end at its next heartbeat_interval check
    args = SimpleNamespace(keras=keras_version, epochs=epochs, batch_size=32, learning_rate=0.01, compression=None,
                           data_dir=str(tmp_path / "data"), output_dir=str(tmp_path / "out"))
    os.makedirs(args.output_dir)
    args.rows_per_rank = digits_tf.prepare_shards(args.data_dir)["train_rows"] // 2 - 40
    per_epoch = args.rows_per_rank // args.batch_size
    cluster = tfos_cluster(2, 0, max_restarts=0, restart_backoff=1, stop_grace_secs=2, report_interval=0.2,
                           checkpoint_dir=str(tmp_path / "ckpt"), eviction_grace=60, reservation_timeout=180,
                           heartbeat_interval=0.5,
                           env={"GCE_METADATA_IP": "127.0.0.1:9"})  # TF's "on Google Cloud?" probe stays local
    cluster.start(digits_keras_fit.main_fun, args)
    assert wait_for(lambda: min(m.get("epoch", 0) for m in cluster.metrics().values()) >= 2, 600, interval=0.05)
    agent = psutil.Process(cluster.registry.nodes[1].agent.agent_pid)
    jvm = next(p for p in agent.parents() if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline()))
    if notice == "sigterm":
        agent.send_signal(signal.SIGTERM)
        assert wait_for(lambda: cluster.evictions, 60), "no save"
        jvm.kill()  # the platform ends the executor after the notice
    else:
        jvm.kill()  # the agent (its own session) outlives it: the notice
    cluster.shutdown(timeout=900)

    (ev,) = cluster.evictions
    why = "termination signal" if notice == "sigterm" else "executor JVM"
    assert ev.nodes == (1,) and ev.step >= 2 * per_epoch and why in ev.why, (ev, per_epoch)
    assert cluster.attempt == 1 and cluster.restarts == [], cluster.restarts
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    first = (ev.step - 1) // per_epoch if keras_version == "3" else ev.step // per_epoch
    assert result["attempt"] == 1 and result["epochs_run"] == list(range(first, epochs)), (result, ev)
    assert result["first_step"] == ev.step, (result, ev)  # restored at the saved step: 0 steps lost
    w0, w1 = np.load(tmp_path / "out" / "weights-rank0.npz"), np.load(tmp_path / "out" / "weights-rank1.npz")
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])
    assert result["accuracy"] >= 0.85, result

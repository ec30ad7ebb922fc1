"""Hang-free by construction, on the shared local-cluster with real TF processes: unequal data per
rank gives equal steps on every feed path (a collective per step), a rank that stops is caught by
the stall watchdog with every rank's stack, and failures whose own message says something else
carry their cause."""

import time

import numpy as np
import pytest

from tfos import InputMode
from tfos.errors import NodeFailedError, StallError

#: the issue's run: 2,150 rows in 3 unequal partitions
SIZES = (1000, 700, 450)


def unequal_rdd(sc, sizes=SIZES):
    parts, start = [], 0
    for s in sizes:
        parts.append([(start + k, [float((start + k) % 7)] * 8, float((start + k) % 2)) for k in range(s)])
        start += s
    return sc.parallelize(parts, len(parts)).flatMap(lambda p: p), start


def mwms_allreduce_per_batch(args, ctx):
    """An MWMS custom loop over feed.batches(100) with one all-reduce per step."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = ctx.get_data_feed(train_mode=True)
    steps = rows = 0
    for ids, _x, _y in feed.batches(100):
        total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                                strategy.run(lambda n=len(ids): tf.constant(float(n))), axis=None)
        steps, rows = steps + 1, rows + len(ids)
        ctx.report(step=steps, rows=rows, last_total=float(total))


def keras_fit_on_the_feed(args, ctx):
    """model.fit over feed.dataset(32): Keras 3 with tfos.keras_dist, or tf_keras under MWMS."""
    import os

    if args == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tf_keras as keras

        strategy = ctx.strategy()
        with strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
            model.compile(keras.optimizers.SGD(0.01), "mse")
        opt_callbacks = []
    else:
        import keras

        from tfos import keras_dist

        keras_dist.init_collectives()
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(keras_dist.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
        opt_callbacks = [keras_dist.BroadcastInitialWeights(0)]
    feed = ctx.get_data_feed(train_mode=True)
    ds = feed.dataset(32).map(lambda ids, x, y: (x, y))
    steps = []
    model.fit(ds, epochs=1, verbose=0, callbacks=opt_callbacks + [keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: steps.append(b))])
    ctx.report(step=len(steps))


def _check_equal_steps(cluster, fed_per_node, batch, steps_per_batch=1):
    m = cluster.metrics()
    steps = [m[i]["step"] for i in (0, 1)]
    assert steps[0] == steps[1], m
    fewest = min(fed_per_node.values())
    assert steps[0] == -(-fewest // batch) * steps_per_batch, (steps, fed_per_node)
    steps[0] //= steps_per_batch
    dropped = [m[i].get("rows_dropped", 0) for i in (0, 1)]
    assert sum(dropped) == sum(max(0, r - steps[0] * batch) for r in fed_per_node.values()), (dropped, m)


@pytest.mark.slow
def test_unequal_partitions_run_equal_steps_with_an_allreduce_per_step(sc, tfos_cluster):
    rdd, n = unequal_rdd(sc)
    cluster = tfos_cluster(2, 0, report_interval=0.2)
    cluster.start(mwms_allreduce_per_batch, None, input_mode=InputMode.SPARK)
    assert cluster.train(rdd) == n
    cluster.shutdown(timeout=120)
    _check_equal_steps(cluster, cluster.feed_rows_total, 100)
    m = cluster.metrics()
    assert m[0]["rows"] + m[0].get("rows_dropped", 0) == cluster.feed_rows_total[0]


@pytest.mark.slow
@pytest.mark.parametrize("keras", ["keras3", "tf_keras"])
def test_keras_fit_over_feed_dataset_with_unequal_partitions(sc, tfos_cluster, keras):
    rdd, n = unequal_rdd(sc, (700, 5, 1200, 245))
    cluster = tfos_cluster(2, 0, report_interval=0.2)
    cluster.start(keras_fit_on_the_feed, keras, input_mode=InputMode.SPARK)
    cluster.train(rdd)
    cluster.shutdown(timeout=180)
    # tf_keras fit under MWMS takes a dataset's batch as the global one: 2 steps of 16 rows per 32
    _check_equal_steps(cluster, cluster.feed_rows_total, 32, 2 if keras == "tf_keras" else 1)


def allreduce_per_batch_of_rank_files(args, ctx):
    """InputMode.TENSORFLOW: each rank reads its own TFRecord file (unequal record counts) in batches
    of 10 with one all-reduce per step."""
    import tensorflow as tf

    from tfos import data

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    files = data.rank_files(ctx, args)
    ds = data.tfrecord_dataset(files, features={"x": tf.io.FixedLenFeature([], tf.float32)}, batch_size=10)
    steps = 0
    for batch in ds:
        strategy.reduce("SUM", strategy.run(lambda n=len(batch["x"]): tf.constant(float(n))), axis=None)
        steps += 1
    ctx.report(step=steps)


@pytest.mark.slow
def test_unequal_tfrecord_shards_run_equal_steps(tfos_cluster, tmp_path):
    from tfos import data
    from tfos.data.tfrecord import tfrecord_frame

    for name, n in (("part-0.tfrecord", 95), ("part-1.tfrecord", 37)):
        with open(tmp_path / name, "wb") as f:
            for i in range(n):
                f.write(tfrecord_frame(data.encode_example({"x": float(i)})))
    cluster = tfos_cluster(2, 0, report_interval=0.2)
    cluster.start(allreduce_per_batch_of_rank_files, str(tmp_path))
    cluster.shutdown(timeout=180)
    m = cluster.metrics()
    assert m[0]["step"] == m[1]["step"] == 4, m  # ceil(37 / 10) on both ranks
    assert sorted(m[i]["rows_dropped"] for i in (0, 1)) == [0, 55], m


def sleeps_while_the_other_waits(args, ctx):
    """Both ranks report a step; then rank 1 sleeps 'forever' while rank 0 waits in an all-reduce."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    ctx.report(step=1)
    if ctx.task_index == 0 and ctx.job_name == "worker":
        time.sleep(3600)
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)), axis=None)


@pytest.mark.slow
def test_a_rank_that_sleeps_forever_gets_stall_error_with_both_stacks(tfos_cluster):
    stall_timeout = 4
    cluster = tfos_cluster(2, 0, stall_timeout=stall_timeout, report_interval=0.2)
    cluster.start(sleeps_while_the_other_waits, None)
    t0 = time.monotonic()
    with pytest.raises(StallError) as e:
        cluster.shutdown(timeout=300)
    text = str(e.value)
    assert time.monotonic() - t0 < stall_timeout + 15 + 20, text  # + the start of main_fun (TF import)
    lines = text.splitlines()
    chief = next(line for line in lines if line.startswith("  node 0 (chief:0"))
    worker = next(line for line in lines if line.startswith("  node 1 (worker:0"))
    assert "waiting in a collective" in chief and "sleeps_while_the_other_waits" in chief, chief
    assert worker.split(": ", 1)[1].startswith("in sleeps_while_the_other_waits (test_hang_free.py:"), worker
    assert "waiting in a collective" not in worker, worker
    assert text.count("stacks (most recent call first)") == 2


def keras3_fit_under_the_strategy(args, ctx):
    import keras

    with ctx.strategy().scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse")
    model.fit(np.zeros((8, 4)), np.zeros((8, 2)), epochs=1, verbose=0)


@pytest.mark.slow
def test_keras3_fit_under_mwms_names_keras_dist_and_tf_keras(tfos_cluster):
    cluster = tfos_cluster(2, 0)
    cluster.start(keras3_fit_under_the_strategy, None)
    with pytest.raises(NodeFailedError) as e:
        cluster.shutdown(timeout=180)
    text = str(e.value)
    assert "tfos hint: Keras 3's model.fit cannot run under tf.distribute.MultiWorkerMirroredStrategy" in text
    assert "tfos.keras_dist" in text and "TF_USE_LEGACY_KERAS" in text


def test_a_different_tfos_on_the_executors_fails_before_any_node_starts(tfos_cluster, monkeypatch):
    """The driver's versions travel in the cluster config; each barrier task compares its own
    before it starts an agent (the driver here claims tfos 9.9.9)."""
    from tfos.cluster.driver import settings
    from tfos.errors import TFOSError

    monkeypatch.setattr(settings, "local_versions", lambda: {"tfos": "9.9.9", "tensorflow": ""})
    cluster = tfos_cluster(2, 0, reservation_timeout=60)
    with pytest.raises(TFOSError) as e:
        cluster.start(lambda args, ctx: None)
    text = str(e.value)
    assert "tfos 9.9.9 on the driver but tfos 0.1.0 on executor host" in text and "Install the same versions" in text

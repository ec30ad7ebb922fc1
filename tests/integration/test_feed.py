"""InputMode.SPARK on the real local-cluster: training feeds, inference, faults."""

import collections
import json
import os
import signal
import time

import numpy as np
import pytest

from tfos import InputMode, TFCluster, TFNode
from tfos.errors import FeedError, FeedTimeoutError, NodeFailedError


def uneven_rdd(sc, n=1000):
    """Rows (id, vector) in 6 partitions of very different sizes, two of them empty."""
    sizes = [0, int(0.6 * n), 5, 0, int(0.3 * n)]
    sizes.append(n - sum(sizes))
    parts, start = [], 0
    for s in sizes:
        parts.append([(i, np.full(8, i, np.float32)) for i in range(start, start + s)])
        start += s
    return sc.parallelize(parts, len(parts)).flatMap(lambda p: p), n


def count_ids(args, ctx):
    feed = ctx.get_data_feed(train_mode=True)
    ids, batches = [], 0
    for ids_batch, vec in feed.batches(64):
        assert vec.shape[1:] == (8,) and np.all(vec[:, 0] == ids_batch)
        ids.extend(int(i) for i in ids_batch)
        batches += 1
    with open(os.path.join(args, f"ids-{ctx.node_index}.json"), "w") as f:
        json.dump({"ids": ids, "stopped": feed.should_stop()}, f)


def check_ids(out, n, epochs):
    got = [json.loads((out / f"ids-{i}.json").read_text()) for i in range(2)]
    assert all(g["stopped"] for g in got)
    counts = collections.Counter(got[0]["ids"] + got[1]["ids"])
    assert sum(counts.values()) == n * epochs
    assert set(counts) == set(range(n)) and set(counts.values()) == {epochs}
    shares = [len(g["ids"]) for g in got]
    assert min(shares) > 0.35 * n * epochs, shares  # balanced despite uneven partitions


def test_rdd_three_epochs_every_row_exactly_once_per_epoch(sc, tmp_path):
    rdd, n = uneven_rdd(sc)
    cluster = TFCluster.run(sc, count_ids, str(tmp_path), 2, 0, input_mode=InputMode.SPARK, master_node="chief")
    assert cluster.train(rdd, num_epochs=3, chunk_rows=50, uneven=None) == 3 * n
    cluster.shutdown(timeout=120)
    check_ids(tmp_path, n, 3)


def test_dataframe_three_epochs_every_row_exactly_once_per_epoch(spark, sc, tmp_path):
    rdd, n = uneven_rdd(sc)
    df = spark.createDataFrame(rdd.map(lambda r: (r[0], [float(v) for v in r[1]])), "id long, vec array<float>")
    cluster = TFCluster.run(sc, count_ids, str(tmp_path), 2, 0, input_mode=InputMode.SPARK, master_node="chief")
    assert cluster.train(df, num_epochs=3, chunk_rows=50, uneven=None) == 3 * n
    cluster.shutdown(timeout=120)
    check_ids(tmp_path, n, 3)


def test_a_dataframe_of_a_session_made_after_an_rdd_feed_is_fed_too(spark, sc, tmp_path):
    """A feeding task's secret comes as a local property, whose name tfos registers in the SparkConf
    (so Spark's event log redacts it). A session whose SQL conf is built after that (here a new
    one) copies the registered placeholder, and Spark SQL sets every conf of its own whose name
    starts with "spark" as a local property of the query's jobs: the property's name must not,
    or a DataFrame's feeding tasks get the placeholder instead of the secret."""
    rdd, n = uneven_rdd(sc, 300)
    cluster = TFCluster.run(sc, count_ids, str(tmp_path), 2, 0, input_mode=InputMode.SPARK, master_node="chief")
    try:
        assert cluster.train(rdd, num_epochs=1, chunk_rows=50, uneven=None) == n  # registers the name
        fresh = spark.newSession()
        df = fresh.createDataFrame(rdd.map(lambda r: (r[0], [float(v) for v in r[1]])),
                                   "id long, vec array<float>").repartition(3)
        assert cluster.train(df, num_epochs=1, chunk_rows=50, uneven=None) == n
    finally:
        cluster.shutdown(timeout=120)


def count_paths(args, ctx):
    """Two feeds, each read whole; after each, how many chunks reached this node's hub through
    its shared-memory rings and how many on the channel."""
    seen = []
    for _ in range(2):
        feed = ctx.get_data_feed(train_mode=True)
        rows = sum(len(ids) for ids, _vec in feed.batches(64))
        seen.append({"rows": rows, "shm": feed.hub.shm_chunks, "channel": feed.hub.channel_chunks})
    with open(os.path.join(args, f"paths-{ctx.node_index}.json"), "w") as f:
        json.dump(seen, f)


def test_same_host_chunks_come_through_shared_memory_unless_told_not_to(sc, tmp_path):
    """Every feeding task of the local-cluster runs on the TF processes' host: its chunks are
    written into the hubs' rings (wire.ring), none on the channel; ``shared_memory=False`` sends
    them all on the channel. Either way every row arrives once."""
    rdd, n = uneven_rdd(sc, 600)
    cluster = TFCluster.run(sc, count_paths, str(tmp_path), 2, 0, input_mode=InputMode.SPARK, master_node="chief")
    try:
        assert cluster.train(rdd, num_epochs=1, chunk_rows=50, uneven=None) == n
        assert cluster.train(rdd, num_epochs=1, chunk_rows=50, uneven=None, shared_memory=False) == n
    finally:
        cluster.shutdown(timeout=120)
    seen = [json.loads((tmp_path / f"paths-{i}.json").read_text()) for i in range(2)]
    assert [sum(s[k]["rows"] for s in seen) for k in range(2)] == [n, n]
    for ring_feed, channel_feed in seen:
        assert ring_feed["shm"] >= 1 and ring_feed["channel"] == 0, seen
        assert channel_feed["shm"] == ring_feed["shm"] and channel_feed["channel"] >= 1, seen


def count_ids_through_dataset(args, ctx):
    """feed.dataset(37) read to exhaustion: the ids read and every batch's size."""
    feed = ctx.get_data_feed(train_mode=True)
    ids, sizes = [], []
    for ids_batch, vec in feed.dataset(37):
        assert vec.shape[1:] == (8,) and np.all(vec.numpy()[:, 0] == ids_batch.numpy())
        ids.extend(int(i) for i in ids_batch.numpy())
        sizes.append(int(ids_batch.shape[0]))
    with open(os.path.join(args, f"ids-{ctx.node_index}.json"), "w") as f:
        json.dump({"ids": ids, "stopped": feed.should_stop(), "sizes": sizes}, f)


def test_dataset_three_epochs_every_row_exactly_once_per_epoch_in_whole_batches(spark, sc, tmp_path):
    """feed.dataset() cuts batches from the Arrow chunks in blocks: with 37-row batches over
    50-row chunks, batches span chunks; only each node's last batch may be short."""
    rdd, n = uneven_rdd(sc)
    df = spark.createDataFrame(rdd.map(lambda r: (r[0], [float(v) for v in r[1]])), "id long, vec array<float>")
    cluster = TFCluster.run(sc, count_ids_through_dataset, str(tmp_path), 2, 0, input_mode=InputMode.SPARK,
                            master_node="chief")
    assert cluster.train(df, num_epochs=3, chunk_rows=50, uneven=None) == 3 * n
    cluster.shutdown(timeout=120)
    check_ids(tmp_path, n, 3)
    for i in range(2):
        sizes = json.loads((tmp_path / f"ids-{i}.json").read_text())["sizes"]
        assert set(sizes[:-1]) == {37} and 0 < sizes[-1] <= 37, sizes


def dataset_inference(args, ctx):
    """Inference through feed.dataset(): it reads ahead on a tf.data thread while this loop
    answers each batch."""
    feed = ctx.get_data_feed(train_mode=False)
    for ids, vec in feed.dataset(5):
        feed.batch_results([{"id": int(i), "sum": float(v)} for i, v in zip(ids.numpy(), np.sum(vec.numpy(), 1))])


def test_inference_through_dataset_answers_every_row_once_in_order(sc):
    rdd, n = uneven_rdd(sc, 400)
    cluster = TFCluster.run(sc, dataset_inference, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief")
    try:
        out = cluster.inference(rdd, chunk_rows=16)
        per_part_in = rdd.glom().map(lambda p: [int(r[0]) for r in p]).collect()
        assert out.glom().map(lambda p: [r["id"] for r in p]).collect() == per_part_in
        assert all(r["sum"] == 8.0 * r["id"] for r in out.collect())
    finally:
        cluster.shutdown(timeout=60)


def tfos_style_inference(args, ctx):
    feed = TFNode.DataFeed(ctx.mgr, False)
    while not feed.should_stop():
        rows = feed.next_batch(7)
        if rows:
            feed.batch_results([{"id": int(r[0]), "sum": float(np.sum(r[1]))} for r in rows])


def test_inference_rdd_and_dataframe_keep_count_and_order(spark, sc):
    rdd, n = uneven_rdd(sc, 400)
    cluster = TFCluster.run(sc, tfos_style_inference, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief")
    try:
        out = cluster.inference(rdd, chunk_rows=16)
        per_part_in = rdd.glom().map(lambda p: [int(r[0]) for r in p]).collect()
        per_part_out = out.glom().map(lambda p: [r["id"] for r in p]).collect()
        assert per_part_out == per_part_in
        res = out.collect()
        assert len(res) == n and all(r["sum"] == 8.0 * r["id"] for r in res)

        def summing(args, ctx):  # not used: the running main_fun answers every inference
            pass
        df = spark.createDataFrame(rdd.map(lambda r: (int(r[0]), [float(v) for v in r[1]])), "id long, vec array<float>")
        with pytest.raises(FeedError, match="output_type"):
            cluster.inference(df)
        out_df = cluster.inference(df, output_type="struct<id:bigint,sum:double>")
        rows = out_df.collect()
        assert len(rows) == n and [r.id for r in rows] == [r.prediction.id for r in rows]
        assert out_df.columns == ["id", "vec", "prediction"]
    finally:
        cluster.shutdown(timeout=60)


def test_bad_row_fails_on_the_driver_naming_partition_and_row(sc):
    cluster = TFCluster.run(sc, count_ids, "/tmp", 2, 0, input_mode=InputMode.SPARK, master_node="chief")
    rows = [(i, np.zeros(8, np.float32)) for i in range(20)]
    rows[13] = (13, np.zeros(9, np.float32))
    with pytest.raises(FeedError, match=r"partition 1, row 3, column '_1'.*expected shape \(8,\), got \(9,\)"):
        cluster.train(sc.parallelize(rows, 2))
    with pytest.raises(FeedError):
        cluster.shutdown(timeout=60)


def reads_everything(args, ctx):
    feed = ctx.get_data_feed()
    while not feed.should_stop():
        feed.next_batch(10)


@pytest.mark.parametrize("rows,slices,match", [
    # int then string within one partition (chunks of 10 rows): the feeding task refuses it
    ([(i, 1.0) for i in range(20)] + [(str(i), 1.0) for i in range(20)], 1,
     r"partition 0, row 20: column '_0' holds string, but earlier rows of this feed hold int64"),
    # 2 columns in one partition, 3 in the other: the node's feed hub refuses whichever comes second
    ([(i, 1.0) for i in range(20)] + [(i, 1.0, 2) for i in range(20)], 2,
     r"partition [01], row 0: column '_2' (appears|is missing)"),
])
def test_schema_drift_fails_on_the_driver_naming_partition_row_and_column(sc, rows, slices, match):
    cluster = TFCluster.run(sc, reads_everything, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief")
    with pytest.raises(FeedError, match=match):
        cluster.train(sc.parallelize(rows, slices), chunk_rows=10)
    with pytest.raises(FeedError):
        cluster.shutdown(timeout=60)


def never_reads(args, ctx):
    import time

    ctx.get_data_feed()
    time.sleep(600)


def test_consumer_that_stops_reading_raises_feed_timeout(sc):
    cluster = TFCluster.run(sc, never_reads, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            stop_grace_secs=1)
    rdd = sc.parallelize(range(64), 2).map(lambda i: (i, np.zeros(100_000, np.float32)))  # 25 MB
    t0 = time.monotonic()
    try:
        with pytest.raises(FeedTimeoutError, match="feed_timeout"):
            cluster.train(rdd, feed_timeout=5, chunk_rows=4)
        assert time.monotonic() - t0 < 5 + 10
    finally:
        with pytest.raises(FeedTimeoutError):  # the nodes were stopped; the error sticks
            cluster.shutdown(timeout=5)


def reads_slowly(args, ctx):
    import time

    feed = ctx.get_data_feed()
    while not feed.should_stop():
        feed.next_batch(10)
        time.sleep(0.05)


def test_tf_process_killed_mid_feed_fails_the_job_quickly(sc):
    cluster = TFCluster.run(sc, reads_slowly, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            stop_grace_secs=1)
    victim = cluster.nodes[1]["pid"]
    rdd = sc.parallelize(range(100_000), 4).map(lambda i: (i, np.zeros(16, np.float32)))
    import threading
    threading.Timer(3.0, lambda: os.kill(victim, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(NodeFailedError, match="killed by signal 9"):
        cluster.train(rdd, feed_timeout=600, chunk_rows=100)
    assert time.monotonic() - t0 < 3 + 30
    with pytest.raises(NodeFailedError):
        cluster.shutdown()


def tfos_keras_program(args, ctx):
    """A TensorFlowOnSpark 2.x Keras program for InputMode.SPARK; only the import names changed."""
    import os
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 API on TF 2.21 (as it would be on TFoS)
    import numpy as np
    import tensorflow as tf
    from tfos import TFNode, compat

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf_feed = TFNode.DataFeed(ctx.mgr, False)

    def rdd_generator():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(1)
            if len(batch) > 0:
                example = batch[0]
                yield (np.array(example[0]).astype(np.float32), np.array(example[1]).astype(np.float32))
            else:
                return

    ds = tf.data.Dataset.from_generator(rdd_generator, (tf.float32, tf.float32),
                                        (tf.TensorShape([64]), tf.TensorShape([])))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.batch(args["batch_size"]).with_options(options)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(64,)),
                                     tf.keras.layers.Dense(10)])
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    steps_per_worker = int(0.9 * args["rows"] / args["batch_size"] / ctx.num_workers)
    model.fit(x=ds, epochs=args["epochs"], steps_per_epoch=steps_per_worker, verbose=2)
    compat.export_saved_model(model, args["export_dir"], ctx.job_name == "chief")
    tf_feed.terminate()


@pytest.mark.slow
def test_tensorflowonspark_keras_program_runs_unchanged(sc, tmp_path):
    from sklearn.datasets import load_digits

    d = load_digits()
    data = [(list((x / 16.0).astype(float)), int(y)) for x, y in zip(d.data, d.target)]
    args = {"batch_size": 32, "epochs": 3, "rows": len(data), "export_dir": str(tmp_path / "export")}
    cluster = TFCluster.run(sc, tfos_keras_program, args, 2, 0, False, InputMode.SPARK, master_node="chief")
    cluster.train(sc.parallelize(data, 4), num_epochs=args["epochs"])
    cluster.shutdown(timeout=300)
    assert (tmp_path / "export" / "saved_model.pb").exists()

"""TensorFlowOnSpark programs after the rename, on the real local-cluster: inference values,
dfutil, TFParallel, pipeline.TFEstimator/TFModel, compat exports, Structured Streaming feeds."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tfos import InputMode, TFCluster, TFNode, TFParallel, dfutil
from tfos.errors import NodeFailedError


def squares(args, ctx):
    """Answers each row [x] with main_fun's numpy values, as a TensorFlowOnSpark program does."""
    feed = TFNode.DataFeed(ctx.mgr, False)
    while not feed.should_stop():
        batch = feed.next_batch(batch_size=10)
        if len(batch) == 0:
            continue
        x = np.asarray(batch, dtype=np.int64)                # (n, 1)
        if args == "scalars":
            feed.batch_results(np.square(x[:, 0]))          # 1-D array: one numpy scalar per row
        elif args == "arrays":
            feed.batch_results(np.concatenate([x, x * x], axis=1).astype(np.float32))  # one (2,) array per row
        else:
            feed.batch_results([[int(v), int(v * v)] for v in x[:, 0]])  # Python lists stay lists


@pytest.mark.parametrize("kind", ["scalars", "arrays", "lists"])
def test_inference_hands_back_the_values_main_fun_gave(sc, kind):
    rdd = sc.parallelize([[x] for x in range(200)], 5)
    cluster = TFCluster.run(sc, squares, kind, 2, 0, input_mode=TFCluster.InputMode.SPARK)
    try:
        out = cluster.inference(rdd)
        if kind == "scalars":
            assert out.sum() == sum(x * x for x in range(200))  # TensorFlowOnSpark's test: int + numpy, not a list
            assert {type(v) for v in out.collect()} == {np.int64}
        elif kind == "arrays":
            got = out.collect()
            assert {type(v) for v in got} == {np.ndarray} and {v.shape for v in got} == {(2,)}
            assert {v.dtype for v in got} == {np.dtype(np.float32)}
            assert sorted(float(v[1]) for v in got) == [float(x * x) for x in range(200)]
        else:
            got = out.collect()
            assert {type(v) for v in got} == {list}
            assert sorted(got) == [[x, x * x] for x in range(200)]
    finally:
        cluster.shutdown(timeout=120)


def test_dfutil_round_trip_keeps_values_and_remembers_loaded_frames(spark, sc, tmp_path):
    row = ("text string", 1, [2, 3, 4, 5], -1.1, [-2.2, -3.3, -4.4, -5.5], bytearray(b"\xff\xfe\xfd\xfc"))
    df = spark.createDataFrame(sc.parallelize([row, row]), ["a", "b", "c", "d", "e", "f"])
    out = str(tmp_path / "tfr")
    dfutil.saveAsTFRecords(df, out)
    loaded = dfutil.loadTFRecords(sc, out, binary_features=["f"])
    assert loaded.dtypes == [("a", "string"), ("b", "bigint"), ("c", "array<bigint>"), ("d", "double"),
                             ("e", "array<double>"), ("f", "binary")]
    got = loaded.take(1)[0]
    assert (got.a, got.b, got.c, bytes(got.f)) == (row[0], row[1], row[2], bytes(row[5]))
    assert got.d == pytest.approx(row[3], abs=1e-6) and got.e == pytest.approx(row[4], abs=1e-6)
    assert dfutil.isLoadedDF(loaded) and not dfutil.isLoadedDF(df)
    assert not dfutil.isLoadedDF(loaded.filter(loaded.a == "other"))
    with pytest.raises(Exception, match="not empty|exists"):
        dfutil.saveAsTFRecords(df, out)  # as Hadoop's output format: never into an existing directory


def add_and_write(args, ctx):
    import tensorflow as tf

    assert int(tf.math.add(tf.constant(args["x"]), tf.constant(args["y"])).numpy()) == 3
    if ctx.worker_num == args.get("fail_on", -1):
        raise ValueError(f"instance {ctx.worker_num} fails on purpose")
    with open(os.path.join(args["out"], f"done-{ctx.worker_num}"), "w") as f:
        f.write(f"{ctx.num_workers} {len(ctx.nodes)} {ctx.absolute_path('rel')}")


@pytest.mark.parametrize("use_barrier", [True, False])
def test_tfparallel_runs_independent_instances(sc, tmp_path, use_barrier):
    TFParallel.run(sc, add_and_write, {"x": 1, "y": 2, "out": str(tmp_path)}, 2, use_barrier=use_barrier)
    for i in range(2):
        num_workers, nodes, path = (tmp_path / f"done-{i}").read_text().split()
        assert num_workers == "2" and int(nodes) == (2 if use_barrier else 0)
        assert path.startswith("file:///") and path.endswith("/rel")


def test_tfparallel_failure_names_the_instance_and_its_traceback(sc, tmp_path):
    with pytest.raises(NodeFailedError, match="instance 1 fails on purpose") as e:
        TFParallel.run(sc, add_and_write, {"x": 1, "y": 2, "out": str(tmp_path), "fail_on": 1}, 2)
    [failure] = e.value.failures
    assert failure.node_index == 1 and "ValueError" in failure.traceback and failure.host
    assert (tmp_path / "done-0").exists()  # the other instance is independent and finished


def test_tfparallel_without_enough_slots_fails_within_reservation_timeout(sc, tmp_path):
    from tfos.errors import ReservationTimeoutError

    with pytest.raises(ReservationTimeoutError, match="reservation_timeout"):
        TFParallel.run(sc, add_and_write, {"x": 1, "y": 2, "out": str(tmp_path)}, 3, reservation_timeout=2)


def linear_train_fn(args, ctx):
    """TensorFlowOnSpark's pipeline training pattern: tf_keras under MWMS, DataFeed with input_mapping."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from tfos import TFNode, compat

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, activation="linear", input_shape=[2])])
        model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=0.1), loss="mse")
    feed = TFNode.DataFeed(ctx.mgr, input_mapping=args.input_mapping)

    def rows():
        while not feed.should_stop():
            batch = feed.next_batch(args.batch_size)
            if len(batch["x"]) == 0:
                return
            yield np.asarray(batch["x"], np.float32), np.asarray(batch["y_"], np.float32)

    ds = tf.data.Dataset.from_generator(rows, output_signature=(tf.TensorSpec([None, 2], tf.float32),
                                                                 tf.TensorSpec([None, 1], tf.float32)))
    options = tf.data.Options()
    compat.disable_auto_shard(options)
    steps = int(0.9 * args.rows * args.epochs / (args.batch_size * ctx.num_workers))
    history = model.fit(ds.with_options(options), epochs=1, steps_per_epoch=steps, verbose=2)
    ctx.report(loss=float(history.history["loss"][-1]))
    compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")
    feed.terminate()


@pytest.mark.slow
def test_pipeline_estimator_and_model_with_tensorflowonspark_params(spark, sc, tmp_path):
    from tfos.pipeline import TFEstimator, TFModel

    rng = np.random.default_rng(1234)
    features = rng.random((1000, 2))
    weights = np.array([3.14, 1.618])
    labels = features @ weights
    train = spark.createDataFrame([(features[i].tolist(), [float(labels[i])]) for i in range(1000)], ["col1", "col2"])
    export_dir = str(tmp_path / "export")
    est = (TFEstimator(linear_train_fn, {"rows": 1000})
           .setInputMapping({"col1": "x", "col2": "y_"}).setExportDir(export_dir).setModelDir(str(tmp_path / "m"))
           .setClusterSize(2).setMasterNode("chief").setNumPS(0).setBatchSize(10).setEpochs(8))
    model = est.fit(train)
    assert isinstance(model, TFModel) and model.getExportDir() == export_dir and model.args.rows == 1000
    assert os.path.exists(os.path.join(export_dir, "saved_model.pb"))

    test = spark.createDataFrame([([1.0, 1.0], [0.0]), ([0.5, 0.0], [0.0])], ["c1", "c2"])
    model.setTagSet("serve").setSignatureDefKey("serving_default") \
        .setInputMapping({"c1": "dense_input"}).setOutputMapping({"dense": "cout"})
    preds = model.transform(test)
    assert preds.columns == ["cout"] and preds.dtypes == [("cout", "array<double>")]
    got = [r.cout[0] for r in preds.collect()]
    assert got == pytest.approx([weights.sum(), 0.5 * weights[0]], abs=0.05)


def test_tf_keras_export_loads_as_a_keras_model(tmp_path):
    """compat.export_saved_model writes what TensorFlowOnSpark wrote for tf_keras:
    tf.keras.models.load_model gives the Keras model back (run in a fresh Python with Keras 2)."""
    code = f"""
import os, numpy as np, tensorflow as tf
from tfos import compat
m = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=[4])])
x = np.ones((2, 4), np.float32)
assert compat.export_saved_model(m, {str(tmp_path / 'worker')!r}, is_chief=False) is None
assert not os.path.exists({str(tmp_path / 'worker')!r})
compat.export_saved_model(m, {str(tmp_path / 'm')!r}, is_chief=True)
back = tf.keras.models.load_model({str(tmp_path / 'm')!r})
assert type(back).__module__.startswith("tf_keras"), type(back)
np.testing.assert_allclose(back.predict(x, verbose=0), m.predict(x, verbose=0), rtol=1e-6)
print("ok")
"""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def held_port_then_mwms(_args, ctx):
    """TensorFlowOnSpark's test_port_unreleased: with release_port=False main_fun holds TF's port as
    ctx.tmp_socket until it releases it; then TF's server takes that port (one MWMS all-reduce)."""
    import json

    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    me = tf_config["cluster"][tf_config["task"]["type"]][tf_config["task"]["index"]]
    held = ctx.tmp_socket
    on_tf_port = held is not None and held.getsockname()[1] == int(me.rsplit(":", 1)[1])
    ctx.release_port()
    strategy = ctx.strategy()
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    ctx.report(on_tf_port=on_tf_port, released=ctx.tmp_socket is None, total=float(total))


@pytest.mark.parametrize("encrypt", [True, False])
def test_release_port_false_gives_tf_port_as_tmp_socket(sc, encrypt):
    """Issue 51 item 4: ctx.tmp_socket is TF's own port, held, in an encrypted cluster (in the node's
    private network) as in a clear one; released, TF serves on it."""
    cluster = TFCluster.run(sc, held_port_then_mwms, None, 2, 0, release_port=False, encrypt=encrypt,
                            report_interval=0.1)
    cluster.shutdown(timeout=120)
    metrics = list(cluster.metrics().values())
    assert len(metrics) == 2 and all(m["on_tf_port"] and m["released"] and m["total"] == 2.0 for m in metrics), metrics


def stream_trainer(args, ctx):
    """One DataFeed per micro-batch, until the feed ends because the cluster shuts down."""
    import json

    feeds, rows = 0, []
    while True:
        feed = ctx.get_data_feed(train_mode=True)
        for (values,) in feed.batches(64):
            rows.extend(int(v) for v in values)
        if feed.closed:
            break
        feeds += 1
    with open(os.path.join(args, f"stream-{ctx.node_index}.json"), "w") as f:
        json.dump({"feeds": feeds, "rows": rows}, f)


@pytest.mark.slow
def test_structured_streaming_feeds_each_micro_batch(spark, sc, tmp_path):
    """docs/migration.md's replacement of the DStream example: foreachBatch -> cluster.train."""
    import json

    from pyspark.sql import functions as F

    cluster = TFCluster.run(sc, stream_trainer, str(tmp_path), 2, 0, input_mode=InputMode.SPARK, master_node="chief")
    fed = []

    def train_batch(df, batch_id):
        if fed and fed[-1] >= 250:
            return
        n = cluster.train(df.select(F.col("value")), num_epochs=1)
        fed.append((fed[-1] if fed else 0) + n)

    stream = spark.readStream.format("rate").option("rowsPerSecond", 100).load()
    query = stream.writeStream.foreachBatch(train_batch).trigger(processingTime="1 second").start()
    try:
        deadline = time.monotonic() + 90
        while (not fed or fed[-1] < 250 or len(fed) < 3) and time.monotonic() < deadline:
            query.awaitTermination(1)
    finally:
        query.stop()
    cluster.shutdown(timeout=120)
    assert len(fed) >= 3 and fed[-1] >= 250, fed
    got = [json.loads((tmp_path / f"stream-{i}.json").read_text()) for i in range(2)]
    values = sorted(v for g in got for v in g["rows"])
    assert len(values) == fed[-1] and len(set(values)) == len(values)  # every streamed row once
    assert all(g["feeds"] == len(fed) for g in got)

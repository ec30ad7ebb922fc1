"""tfos over Spark Connect: a Connect SparkSession (no SparkContext, no RDDs) on an embedded
local-cluster[2,1,1024] server. The barrier stage and the feeds are DataFrame jobs
(mapInArrow), cancelled by tag; the control service runs in this client process."""

import json
import os
import signal
import time

import pytest

from tfos import InputMode, TFCluster
from tfos.errors import ConfigError, NodeFailedError, ReservationTimeoutError, TFOSError


def test_the_session_is_a_connect_session_without_spark_context(connect_spark):
    from pyspark.errors import PySparkException

    assert type(connect_spark).__module__.startswith("pyspark.sql.connect")
    with pytest.raises(PySparkException):
        connect_spark.sparkContext  # noqa: B018 - what a Connect user has: no SparkContext


@pytest.mark.slow
def test_digits_example_trains_and_infers_over_connect(connect_spark, tmp_path):
    """The digits example (MWMS, InputMode.SPARK from a DataFrame, then DataFrame inference):
    the same accuracy bar as the classic path (tests/e2e/test_examples.py), every test row once."""
    import digits_spark

    acc = digits_spark.main(["--source", "dataframe", "--epochs", "8", "--output-dir", str(tmp_path)],
                            spark=connect_spark)
    assert acc >= 0.9
    rows = [json.loads(line) for p in (tmp_path / "predictions").glob("part-*") for line in p.read_text().splitlines()]
    (_, _), (_, yte) = digits_spark.load()
    assert len(rows) == len(yte)
    assert sorted(r["label"] for r in rows) == sorted(yte.tolist())


@pytest.mark.slow
def test_notebook_runs_top_to_bottom_on_a_classic_session(tmp_path, monkeypatch):
    """The notebook's cells in their own kernel, which starts its own classic session (an embedded
    local-cluster): here beside its Connect twin, so that the main suite stays short."""
    from notebook_runner import run_notebook

    outputs = run_notebook(tmp_path, monkeypatch)
    assert "test accuracy" in outputs and "on 450 rows" in outputs
    assert "pyspark.sql.connect" not in outputs  # the session the kernel got


@pytest.mark.slow
def test_notebook_runs_top_to_bottom_over_connect(connect_spark, tmp_path, monkeypatch):
    """The notebook's cells in their own kernel, whose session is a Connect client of this suite's
    server (``TFOS_NOTEBOOK_REMOTE=sc://...``): the cells a Connect user runs, without a second
    server."""
    from notebook_runner import run_notebook

    b = connect_spark.client._builder  # the embedded server's address (its token is in the environment)
    outputs = run_notebook(tmp_path, monkeypatch, f"sc://{b.endpoint}")
    assert "test accuracy" in outputs and "on 450 rows" in outputs
    assert "pyspark.sql.connect" in outputs  # the session the kernel got


def record_node(args, ctx):
    """What the node learnt from its task context: GPU addresses, the default filesystem, its role."""
    with open(os.path.join(args, f"node-{ctx.node_index}.json"), "w") as f:
        json.dump({"job_name": ctx.job_name, "gpus": ctx.gpus, "defaultFS": ctx.defaultFS,
                   "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "tf_config": json.loads(os.environ["TF_CONFIG"])},
                  f)


def test_tensorflow_mode_nodes_read_gpus_and_default_fs_from_their_task(connect_cluster, tmp_path):
    cluster = connect_cluster(2, 0)
    cluster.start(record_node, str(tmp_path), input_mode=InputMode.TENSORFLOW)
    cluster.shutdown(timeout=120)
    nodes = [json.loads((tmp_path / f"node-{i}.json").read_text()) for i in range(2)]
    assert sorted(n["job_name"] for n in nodes) == ["chief", "worker"]
    for n in nodes:
        assert len(n["gpus"]) == 1 and n["gpus"][0] in ("0", "1") and n["cuda"] == n["gpus"][0]
        assert n["defaultFS"] == "file://"  # no Hadoop configuration on these executors
        assert set(n["tf_config"]["cluster"]) == {"chief", "worker"}


def fail_on_node_1(args, ctx):
    import time

    if ctx.node_index == 1:
        raise RuntimeError("deliberate failure on node 1 over connect")
    time.sleep(600)


def test_main_fun_raising_reaches_the_client_with_traceback_and_log_lines(connect_cluster):
    cluster = connect_cluster(2, 0, stop_grace_secs=2)
    t0 = time.monotonic()
    cluster.start(fail_on_node_1, None)
    with pytest.raises(NodeFailedError) as exc:
        cluster.shutdown()
    assert time.monotonic() - t0 < 30
    f = exc.value.failures[0]
    assert (f.node_index, f.job_name) == (1, "worker") and f.host
    assert "RuntimeError: deliberate failure on node 1 over connect" in f.traceback
    assert "Last log lines" in str(exc.value)


def consume_feed(args, ctx):
    feed = ctx.get_data_feed(train_mode=True)
    for _batch in feed.batches(8):
        time.sleep(0.05)  # slow enough that the feed is still running when the test kills a node


def test_tf_process_killed_mid_feed_fails_train_within_30s(connect_cluster, connect_spark):
    cluster = connect_cluster(2, 0, stop_grace_secs=2)
    cluster.start(consume_feed, None, input_mode=InputMode.SPARK)
    with pytest.raises(ConfigError, match="DataFrame"):  # no RDDs under Connect: said at once
        cluster.train([(1.0, 0)] * 10)
    df = connect_spark.range(0, 200_000, 1, 8).selectExpr("cast(id as float) as x", "id % 10 as label")
    victim = cluster.nodes[1]["pid"]

    import threading

    killer = threading.Timer(3.0, os.kill, (victim, signal.SIGKILL))
    killer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(NodeFailedError, match="killed by signal 9") as exc:
            cluster.train(df, num_epochs=5)
    finally:
        killer.cancel()
    assert time.monotonic() - t0 < 3.0 + 30
    assert exc.value.failures[0].node_index == 1
    with pytest.raises(NodeFailedError):
        cluster.shutdown()


def test_too_few_slots_fails_within_reservation_timeout_and_frees_the_executors(connect_spark):
    t0 = time.monotonic()
    cluster = TFCluster.reserve(connect_spark, 3, 0, reservation_timeout=10)  # 2 slots
    with pytest.raises(ReservationTimeoutError, match="reservation_timeout"):
        cluster.start(record_node, "/nonexistent")
    assert time.monotonic() - t0 < 10 + 15
    # the barrier job was interrupted by its tag: both slots run new work at once
    assert connect_spark.range(0, 4, 1, 2).count() == 4
    assert time.monotonic() - t0 < 10 + 30


def test_client_the_executors_cannot_reach_fails_within_60s_naming_the_setting(connect_spark, monkeypatch):
    """The control service runs in the client; told an address no executor can reach (TEST-NET-2,
    198.51.100.0/24, nothing there), the nodes cannot report and the client says what to set."""
    monkeypatch.setenv("TFOS_ADVERTISE_HOST", "198.51.100.77")
    t0 = time.monotonic()
    with pytest.raises(TFOSError) as exc:
        TFCluster.run(connect_spark, record_node, "/nonexistent", 2, 0, reservation_timeout=120)
    assert time.monotonic() - t0 < 60
    text = str(exc.value)
    assert "198.51.100.77" in text and "TFOS_SERVER_HOST" in text and "TFOS_ADVERTISE_HOST" in text, text


def record_ids(args, ctx):
    feed = ctx.get_data_feed(train_mode=True)
    ids = []
    for ids_batch, vec in feed.batches(64):
        assert vec.shape[1:] == (8,) and all(vec[:, 0] == ids_batch)
        ids.extend(int(i) for i in ids_batch)
    with open(os.path.join(args, f"ids-{ctx.node_index}.json"), "w") as f:
        json.dump(ids, f)


def test_dataframe_three_epochs_every_row_exactly_once_per_epoch(connect_cluster, connect_spark, tmp_path):
    import collections

    n = 1000
    df = connect_spark.range(0, n, 1, 5).selectExpr("id", "array_repeat(cast(id as float), 8) as vec")
    cluster = connect_cluster(2, 0)
    cluster.start(record_ids, str(tmp_path), input_mode=InputMode.SPARK)
    assert cluster.train(df, num_epochs=3, chunk_rows=50, uneven=None) == 3 * n
    cluster.shutdown(timeout=120)
    got = [json.loads((tmp_path / f"ids-{i}.json").read_text()) for i in range(2)]
    counts = collections.Counter(got[0] + got[1])
    assert set(counts) == set(range(n)) and set(counts.values()) == {3}
    assert min(len(g) for g in got) > 0.35 * 3 * n  # both nodes took a share


def sum_rows(args, ctx):
    feed = ctx.get_data_feed(train_mode=False)
    for ids, vec in feed.batches(7):
        feed.batch_results([{"id": int(i), "sum": float(v.sum())} for i, v in zip(ids, vec)])


def test_dataframe_inference_answers_every_row_once_in_order(connect_cluster, connect_spark):
    n = 400
    df = connect_spark.range(0, n, 1, 3).selectExpr("id", "array_repeat(cast(id as float), 8) as vec")
    cluster = connect_cluster(2, 0)
    cluster.start(sum_rows, None, input_mode=InputMode.SPARK)
    try:
        out = cluster.inference(df, chunk_rows=16, output_type="struct<id:bigint,sum:double>")
        assert out.columns == ["id", "vec", "prediction"]
        rows = out.collect()
        assert [r.id for r in rows] == list(range(n))  # the input's order, every row once
        assert all(r.prediction.id == r.id and r.prediction.sum == 8.0 * r.id for r in rows)
    finally:
        cluster.shutdown(timeout=60)


@pytest.mark.slow
def test_spark_ml_estimator_fits_and_model_transforms_over_connect(connect_spark, tmp_path):
    """tfos.ml needs no SparkContext: TFEstimator.fit feeds the DataFrame, TFModel.transform is a
    mapInArrow; the same accuracy bar as the classic test."""
    import numpy as np

    from tfos.ml import TFEstimator
    from tfos_ml_digits import digits_data, digits_train_fn

    train, test = digits_data(connect_spark)
    est = TFEstimator(digits_train_fn, {"learning_rate": 0.01}, inputCols=["features"], labelCol="label",
                      exportDir=str(tmp_path / "digits.keras"), numExecutors=2, epochs=8, batchSize=32,
                      reservationTimeout=120)
    rows = est.fit(train).setOutputMode("argmax").transform(test).select("label", "prediction").collect()
    assert len(rows) == test.count()
    assert float(np.mean([r.label == r.prediction for r in rows])) >= 0.9


def rank_summary(scale):
    import numpy as np

    cfg = json.loads(os.environ["TF_CONFIG"])
    return {"rank": cfg["task"]["index"], "workers": len(cfg["cluster"]["worker"]),
            "values": np.arange(4, dtype=np.int32) * scale}


def fails_on_rank_1():
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
        raise ValueError("rank 1 rejects its data")
    time.sleep(600)


@pytest.mark.slow
def test_tf_distributor_over_connect_returns_rank_0s_value_and_errors(connect_spark):
    """TFDistributor on a Connect session (the active one, as a notebook has it): its barrier stage is
    a DataFrame job; rank 0's value comes back; a failing rank's error names it."""
    import numpy as np

    from tfos import TFDistributor

    value = TFDistributor(num_processes=2).run(rank_summary, 3)  # the active session: connect_spark
    assert value["rank"] == 0 and value["workers"] == 2
    np.testing.assert_array_equal(value["values"], np.arange(4, dtype=np.int32) * 3)
    with pytest.raises(NodeFailedError, match="rank 1 rejects its data"):
        TFDistributor(num_processes=2, spark=connect_spark, stop_grace_secs=1).run(fails_on_rank_1)

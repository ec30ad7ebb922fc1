"""Structured Streaming inference through long-lived TF nodes: the rate source and a memory sink."""

import os
import signal
import time

import numpy as np
import pytest

from tfos import InputMode, TFCluster


def doubler(args, ctx):
    """Loads its 'model' once, then answers every streamed row until shutdown."""
    import json

    loaded_at = time.time()
    feed = ctx.get_data_feed(train_mode=False)
    batches = 0
    for (values,) in feed.batches(64):
        if args.get("slow_every") and batches and batches % args["slow_every"] == 0:
            time.sleep(args["slow_secs"])  # a slow micro-batch
        feed.batch_results(2.0 * values.astype(np.float64))
        batches += 1
    with open(os.path.join(args["out"], f"node-{ctx.node_index}.json"), "w") as f:
        json.dump({"loaded_at": loaded_at, "batches": batches}, f)


def _wait_rows(spark, name, n, query, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise query.exception()
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        if len(progress) >= n:
            return
        time.sleep(0.5)
    raise TimeoutError(f"fewer than {n} non-empty micro-batches within {timeout}s")


@pytest.mark.slow
def test_every_streamed_row_answered_once_per_micro_batch(spark, sc, tmp_path):
    """A slow micro-batch every third one, and micro-batches that feed no row at all (the filter
    keeps two seconds of every three), through one long-lived TF process per node."""
    import json

    cluster = TFCluster.run(sc, doubler, {"out": str(tmp_path), "slow_every": 3, "slow_secs": 3}, 2, 0,
                            input_mode=InputMode.SPARK, master_node=None)
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 40).option("numPartitions", 2).load()
              .where("floor(value / 40) % 3 != 1"))
    preds = cluster.inference(stream.selectExpr("CAST(value AS DOUBLE) AS x"), output_type="double",
                              output_column="y")
    assert preds.isStreaming
    query = (preds.writeStream.format("memory").queryName("tfos_preds").outputMode("append")
             .trigger(processingTime="1 second").start())
    try:
        _wait_rows(spark, "tfos_preds", 6, query)
    finally:
        query.stop()
    rows = spark.sql("SELECT x, y FROM tfos_preds").collect()
    cluster.shutdown(timeout=120)
    xs = sorted(int(r.x) for r in rows)
    assert len(xs) == len(set(xs)), "a row was answered twice"
    expected = [v for v in range(xs[-1] + 1) if (v // 40) % 3 != 1]
    assert xs == expected[:len(xs)] and len(xs) >= len(expected) - 80  # none missing up to the last batch
    assert all(r.y == 2 * r.x for r in rows)
    nodes = [json.loads((tmp_path / f"node-{i}.json").read_text()) for i in range(2)]
    assert all(n["batches"] > 1 for n in nodes)  # one TF process per node served every micro-batch


def answers_then_dies(args, ctx):
    feed = ctx.get_data_feed(train_mode=False)
    for (values,) in feed.batches(16):
        if ctx.node_index == 1 and values.max() >= args:
            os.kill(os.getpid(), signal.SIGKILL)
        feed.batch_results(values.astype(np.float64))


@pytest.mark.slow
def test_node_failure_stops_the_query_with_the_nodes_error(spark, sc):
    cluster = TFCluster.run(sc, answers_then_dies, 100, 2, 0, input_mode=InputMode.SPARK, master_node=None)
    stream = spark.readStream.format("rate").option("rowsPerSecond", 50).option("numPartitions", 2).load()
    preds = cluster.inference(stream.selectExpr("CAST(value AS DOUBLE) AS x"), output_type="double")
    query = preds.writeStream.format("memory").queryName("tfos_dies").trigger(processingTime="1 second").start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Exception, match="STREAM_FAILED") as e:  # the query stops with the task's error
            query.awaitTermination(120)
    finally:
        query.stop()
    text = str(e.value)
    assert "node 1" in text and "killed by signal 9" in text, text[-3000:]
    assert time.monotonic() - t0 < 60
    with pytest.raises(Exception):
        cluster.shutdown(timeout=60)

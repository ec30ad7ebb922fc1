"""Driver experience: progress reports, per-rank table, merged timeline, TensorBoard on the driver."""

import json
import os
import time
import urllib.request

import numpy as np
import pytest

from tfos import InputMode
from tfos.errors import ConfigError


def reporting_main(args, ctx):
    import time

    import tensorflow as tf

    writer = tf.summary.create_file_writer(os.path.join(ctx.log_dir, f"rank{ctx.rank}"))
    feed = ctx.get_data_feed()
    step = 0
    for ids, _vec in feed.batches(50):
        with ctx.trace("step", step=step):
            step += 1
            loss = 1.0 / step
            with writer.as_default():
                tf.summary.scalar("tfos_test_loss", loss, step=step)
            ctx.report(step=step, loss=loss, examples_per_sec=1000.0)
    writer.flush()
    while not os.path.exists(args):  # hold the cluster so the test can query TensorBoard
        time.sleep(0.2)


@pytest.mark.slow
def test_tensorboard_progress_and_timeline(sc, tfos_cluster, tmp_path):
    go = tmp_path / "go"
    timeline = tmp_path / "trace.json"
    cluster = tfos_cluster(2, 0, tensorboard=True, timeline=str(timeline), log_dir=str(tmp_path / "logs"),
                                report_interval=0.2, input_mode=InputMode.SPARK)
    try:
        assert cluster.tensorboard_url.startswith("http://")
        cluster.start(reporting_main, str(go))
        cluster.train(sc.parallelize([(i, np.zeros(4, np.float32)) for i in range(2000)], 4), num_epochs=2)
        deadline = time.monotonic() + 60
        tags = ""
        while time.monotonic() < deadline:
            with urllib.request.urlopen(cluster.tensorboard_url + "data/plugin/scalars/tags", timeout=10) as r:
                assert r.status == 200
                tags = r.read().decode()
            if "tfos_test_loss" in tags and "rank0" in tags and "rank1" in tags:
                break
            time.sleep(1)
        assert "tfos_test_loss" in tags, tags
        m = cluster.metrics()
        assert all(m[i].get("step", 0) > 0 for i in (0, 1)), m
    finally:
        go.write_text("1")
    url = cluster.tensorboard_url
    cluster.shutdown(timeout=120)
    with pytest.raises(OSError):  # stopped with the cluster
        urllib.request.urlopen(url, timeout=3)
    trace = json.loads(timeline.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for pid in (0, 1):
        assert any(e["pid"] == pid and e["name"] == "step" for e in spans)
    assert any(e["pid"] == 2 and e["name"].startswith("feed job") for e in spans)


def test_missing_tensorboard_is_a_clear_error(tfos_cluster, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        tfos_cluster(2, 0, tensorboard=True)

"""One MLflow run per cluster, logged by the driver: a local file store and a real tracking server."""

import os
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from tfos import TFCluster
from tfos.testing.ports import free_port

mlflow = pytest.importorskip("mlflow")


def reporting_fun(args, ctx):
    """Both ranks report loss per step; the chief exports a small Keras 3 model and returns its path."""
    import keras

    for step in range(1, args["steps"] + 1):
        ctx.report(step=step, loss=1.0 / step + ctx.rank, lr=args["lr"])
    ctx.report(note="no step here", examples=10 * (ctx.rank + 1))
    if ctx.is_chief:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.export(args["export"])
        return args["export"]
    return None


def check_run(client, run_id, steps, export_logged=True):
    run = client.get_run(run_id)
    params = run.data.params
    assert params["num_executors"] == "2" and params["args.lr"] == "0.01" and params["input_mode"] == "TENSORFLOW"
    for rank in (0, 1):
        hist = client.get_metric_history(run_id, f"rank{rank}/loss")
        assert [m.step for m in hist] == list(range(1, steps + 1))
        assert [m.value for m in hist] == pytest.approx([1.0 / s + rank for s in range(1, steps + 1)])
    mean = client.get_metric_history(run_id, "loss")  # the ranks' mean, once both reported a step
    assert [(m.step, round(m.value, 6)) for m in mean] == [(s, round(1.0 / s + 0.5, 6)) for s in range(1, steps + 1)]
    ex = client.get_metric_history(run_id, "rank1/examples")
    assert [m.value for m in ex] == [20.0], [(m.step, m.timestamp, m.value) for m in ex]
    arts = {a.path for a in client.list_artifacts(run_id, "tfos")}
    assert {"tfos/summary.json", "tfos/ranks.txt"} <= arts
    if export_logged:
        import pandas as pd

        model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
        assert model.predict(pd.DataFrame(np.ones((2, 4), np.float32))).shape == (2, 3)
    return run


@pytest.fixture
def tracking(monkeypatch):
    """Restore the tracking URI afterwards (the session's driver is shared)."""
    before = mlflow.get_tracking_uri()
    yield
    mlflow.set_tracking_uri(before)


@pytest.mark.slow
def test_one_run_in_a_local_file_store(sc, tmp_path, monkeypatch, tracking):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    mlflow.set_tracking_uri(f"file://{tmp_path}/mlruns")
    args = {"steps": 4, "lr": 0.01, "export": str(tmp_path / "export")}
    cluster = TFCluster.run(sc, reporting_fun, args, 2, 0, master_node="chief", mlflow=True,
                            mlflow_experiment="tfos-file-store")
    cluster.shutdown(timeout=300)
    client = mlflow.tracking.MlflowClient()
    run = check_run(client, cluster.mlflow_run_id, 4)
    assert run.info.status == "FINISHED"
    runs = client.search_runs([client.get_experiment_by_name("tfos-file-store").experiment_id])
    assert len(runs) == 1  # one run per training, not one per worker


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` on 127.0.0.1 with a sqlite store; stopped (and killed) afterwards."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db",
                             "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "wb"),
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start: " + (tmp_path / "server.log").read_text()[-2000:])
            time.sleep(0.5)
        yield url
    finally:
        from tfos.host.processes import terminate

        terminate(proc, 10.0, "mlflow server")


@pytest.mark.slow
def test_logs_into_a_run_the_user_started_on_a_tracking_server(sc, tmp_path, mlflow_server, tracking):
    mlflow.set_tracking_uri(mlflow_server)
    mlflow.set_experiment("tfos-server")
    args = {"steps": 3, "lr": 0.01, "export": str(tmp_path / "export")}
    with mlflow.start_run() as active:
        cluster = TFCluster.run(sc, reporting_fun, args, 2, 0, master_node="chief", mlflow_run=active)
        cluster.shutdown(timeout=300)
        assert cluster.mlflow_run_id == active.info.run_id
        client = mlflow.tracking.MlflowClient()
        assert client.get_run(active.info.run_id).info.status == "RUNNING"  # the user's run stays theirs
        check_run(client, active.info.run_id, 3)
    assert client.get_run(active.info.run_id).info.status == "FINISHED"


def test_mlflow_flag_needs_the_package_only_when_asked(sc, monkeypatch):
    import importlib.util

    from tfos.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match="tfos\\[mlflow\\]"):
        TFCluster.reserve(sc, 2, 0, mlflow=True)

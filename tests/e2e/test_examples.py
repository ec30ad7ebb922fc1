"""The bundled examples end to end: on the shared local-cluster, under spark-submit on a real
standalone master + worker, and the parameter-server example on its own local-cluster[3,1,1024].
The notebook runs in the Spark Connect suite (tests/connect), on a classic and a Connect session."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.parametrize("source,epochs,min_acc", [("dataframe", 8, 0.9), ("rdd", 2, None)])
def test_digits_spark_example_trains_and_writes_predictions(spark, source, epochs, min_acc, tmp_path, capfd, caplog):
    """InputMode.SPARK to accuracy from a DataFrame (one of the suite's three trainings to accuracy);
    from an RDD the same mechanics on 2 epochs."""
    import logging

    import digits_spark

    caplog.set_level(logging.INFO, logger="tfos")
    acc = digits_spark.main(["--source", source, "--epochs", str(epochs), "--output-dir", str(tmp_path)],
                            spark=spark)
    assert acc >= min_acc if min_acc else 0.0 <= acc <= 1.0
    assert list((tmp_path / "predictions").glob("part-*"))
    err = capfd.readouterr().err
    assert "tfos " in err  # the progress bar, with step and loss once training reports them:
    assert source == "rdd" or ("step" in err and "loss=" in err)  # 2 epochs may end before it redraws
    assert "per-rank summary" in caplog.text and "chief:0" in caplog.text and "rows fed" in caplog.text


def _submit_digits_example(tmp_path, env, spark_args, epochs=4, min_acc=0.9):
    """spark-submit examples/digits/digits_tf.py with ``spark_args``; it must print its test accuracy,
    at least ``min_acc`` when given."""
    import os
    import re
    import shutil
    import subprocess
    import sys

    root = ROOT
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    submit = submit if os.path.exists(submit) else shutil.which("spark-submit")
    out = subprocess.run([submit] + spark_args + ["--conf", "spark.ui.enabled=false",
                          os.path.join(root, "examples", "digits", "digits_tf.py"), "--epochs", str(epochs),
                          "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    m = re.search(r"test accuracy ([\d.]+)", out.stdout)
    assert m and float(m.group(1)) >= (min_acc or 0.0), out.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("keras_version", ["3", "2"])
def test_digits_keras_fit_example(spark, tmp_path, keras_version):
    import numpy as np

    import digits_keras_fit

    acc = digits_keras_fit.main(["--keras", keras_version, "--epochs", "2", "--output-dir", str(tmp_path)],
                                spark=spark)
    assert 0.0 <= acc <= 1.0  # mechanics: keras_dist's accuracy is checked in tests/integration/test_keras_dist.py
    w0, w1 = np.load(tmp_path / "weights-rank0.npz"), np.load(tmp_path / "weights-rank1.npz")
    for k in w0.files:
        np.testing.assert_allclose(w0[k], w1[k], atol=1e-6)


@pytest.mark.slow
def test_digits_example_under_spark_submit_on_a_standalone_cluster(tmp_path):
    """The README's spark-submit command against a real Spark standalone master + worker on this
    host: MWMS with per-rank file shards to accuracy (one of the suite's three trainings to
    accuracy; the main job's test runs the same script on the embedded local-cluster)."""
    import os
    import re
    import subprocess
    import sys
    import time

    from tfos.host import processes

    bindir = os.path.dirname(sys.executable)
    spark_class = os.path.join(bindir, "spark-class")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", SPARK_WORKER_DIR=str(tmp_path / "work"))
    procs = []

    def start(args, log, pattern, timeout=90):
        f = open(tmp_path / log, "w+")
        p = subprocess.Popen([spark_class] + args, stdout=f, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        procs.append(p)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, (tmp_path / log).read_text())
            if m:
                return m
            assert p.poll() is None, (tmp_path / log).read_text()[-3000:]
            time.sleep(0.5)
        raise AssertionError(f"{log}: no {pattern!r} within {timeout}s\n" + (tmp_path / log).read_text()[-3000:])

    try:
        m = start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                   "--webui-port", "0"], "master.log", r"Starting Spark master at (spark://[\d.]+:\d+)")
        master = m.group(1)
        start(["org.apache.spark.deploy.worker.Worker", master, "--cores", "2", "--memory", "3g",
               "--webui-port", "0", "--host", "127.0.0.1"], "worker.log", r"Successfully registered with master")
        _submit_digits_example(tmp_path, env, ["--master", master, "--conf", "spark.executor.cores=1",
                                               "--conf", "spark.executor.memory=1g"])
    finally:
        for p in reversed(procs):
            processes.terminate(p, 5.0, "spark daemon")


# InputMode.TENSORFLOW on per-worker file shards (--input files): tests/multihost/test_outsiders.py
# trains digits_ps that way across three hosts
PS_VARIANTS = [["--input", "spark"], ["--keras-fit"]]


@pytest.mark.slow
def test_parameter_server_example_trains_and_counts_steps():
    """ps + chief + worker need 3 executors, so the variants share one local-cluster[3,1,1024]
    application of their own (a subprocess: this one already has the suite's SparkContext):
    InputMode.SPARK (fed to the chief) and tf_keras model.fit with a DatasetCreator."""
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import digits_ps\n"
              "from tfos.testing import local_cluster_session\n"
              "spark = local_cluster_session(3, app_name='tfos-digits-ps')\n"
              f"for flags in {PS_VARIANTS!r}:\n"
              "    print('variant', flags, flush=True); digits_ps.main(['--epochs', '1'] + flags, spark=spark)\n"
              "spark.stop()\n")
    out = subprocess.run([sys.executable, "-c", script, os.path.join(ROOT, "examples", "digits")],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    found = re.findall(r"test accuracy ([\d.]+); steps scheduled (\d+), counted on the ps (\d+)", out.stdout)
    assert len(found) == len(PS_VARIANTS), out.stdout[-3000:]
    for _acc, scheduled, counted in found:
        assert scheduled == counted  # no step lost

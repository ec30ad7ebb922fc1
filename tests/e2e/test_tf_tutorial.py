"""TensorFlow's own multi-worker Keras tutorial (tests/tf_tutorial: its main.py and mnist_setup.py, the
data from scikit-learn instead of a download) through ``tfos run``, as a newcomer would run it: its
sibling module is shipped with it, the default layout is the workers the tutorial counts, and it
trains under TF_USE_LEGACY_KERAS=1. Under Keras 3 its model.fit fails with a hint that names that fix:
tests/integration/test_hang_free.py::test_keras3_fit_under_mwms_names_keras_dist_and_tf_keras checks
the hint on the shared cluster, without a Spark application of its own."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAIN = os.path.join(ROOT, "tests", "tf_tutorial", "main.py")


def tfos_run(*args):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return subprocess.run([sys.executable, "-m", "tfos.cli", "run", "--master", "local-cluster[2,1,1024]",
                           "--num-executors", "2", *args], env=env, capture_output=True, text=True, timeout=900,
                          cwd="/tmp")


@pytest.mark.slow
def test_the_tutorial_runs_unchanged_under_tf_keras():
    out = tfos_run("--env", "TF_USE_LEGACY_KERAS=1", MAIN)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ModuleNotFoundError" not in out.stderr  # mnist_setup.py travelled with main.py
    m = re.search(r"\[worker:0\] workers 2 global batch 128 held-out accuracy ([0-9.]+)", out.stdout)
    assert m, out.stdout[-3000:]  # both workers counted: the global batch is not halved
    assert float(m.group(1)) >= 0.85, out.stdout[-2000:]

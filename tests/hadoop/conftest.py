"""The Hadoop suite (``pytest --hadoop``): one real Hadoop cluster for the session, started with
the command a user runs (``python -m tfos.testing.hadoop up``) and stopped with ``down``; the
tests talk to it with Hadoop's own clients (FsShell, the RM's REST API, WebHDFS), not tfos's."""

import subprocess
import sys

import pytest


def _cluster(base, *flags):
    """A cluster started with ``up --dir base FLAGS`` (the command a user runs) and stopped with
    ``down``, which must leave no process; yields the handle and the ``export`` lines of ``up``."""
    from tfos.testing.hadoop import HadoopCluster
    from tfos.testing.hadoop.cluster import processes_of

    up = subprocess.run([sys.executable, "-m", "tfos.testing.hadoop", "up", "--dir", str(base), *flags],
                        capture_output=True, text=True, timeout=1800)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-4000:]
    assert up.stdout.strip().splitlines()[-1] == f"export HADOOP_CONF_DIR={base}/conf"
    exports = dict(line[len("export "):].split("=", 1) for line in up.stdout.splitlines()
                   if line.startswith("export "))
    try:
        yield HadoopCluster.attach(base), exports
    finally:
        down = subprocess.run([sys.executable, "-m", "tfos.testing.hadoop", "down", "--dir", str(base)],
                              capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr[-3000:]
        left = processes_of(base)
        assert not left, f"Hadoop processes left after down: {left}"


@pytest.fixture(scope="session")
def hadoop(tmp_path_factory):
    for cluster, _ in _cluster(tmp_path_factory.mktemp("hadoop")):
        yield cluster


@pytest.fixture(scope="module")
def secure_hadoop(tmp_path_factory):
    """The Kerberos cluster (``up --kerberos``): (handle, the test user's KRB5_* and HADOOP_CONF_DIR)."""
    yield from _cluster(tmp_path_factory.mktemp("secure-hadoop"), "--kerberos")


@pytest.fixture(scope="session")
def plugin():
    """TensorFlow's own hdfs:// (tfos.data.tfhdfs): built once per source and TF version; CI builds
    it before the suite."""
    from tfos.data import tfhdfs

    return tfhdfs.build()

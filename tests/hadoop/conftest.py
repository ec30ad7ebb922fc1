"""The Hadoop suite (``pytest --hadoop``): one real Hadoop cluster for the session, started with
the command a user runs (``python -m tfos.testing.hadoop up``) and stopped with ``down``; the
tests talk to it with Hadoop's own clients (FsShell, the RM's REST API, WebHDFS), not tfos's."""

import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def hadoop(tmp_path_factory):
    from tfos.testing.hadoop import HadoopCluster
    from tfos.testing.hadoop.cluster import processes_of

    base = tmp_path_factory.mktemp("hadoop")
    up = subprocess.run([sys.executable, "-m", "tfos.testing.hadoop", "up", "--dir", str(base)],
                        capture_output=True, text=True, timeout=1800)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-4000:]
    assert up.stdout.strip().splitlines()[-1] == f"export HADOOP_CONF_DIR={base}/conf"
    cluster = HadoopCluster.attach(base)
    try:
        yield cluster
    finally:
        down = subprocess.run([sys.executable, "-m", "tfos.testing.hadoop", "down", "--dir", str(base)],
                              capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr[-3000:]
        left = processes_of(base)
        assert not left, f"Hadoop processes left after down: {left}"

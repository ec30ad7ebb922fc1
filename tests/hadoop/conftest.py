"""The Hadoop suite (``pytest --hadoop``): one real Hadoop cluster for the session, started with
the command a user runs (``python -m tfos.testing.hadoop up``) and stopped with ``down``; the
tests talk to it with Hadoop's own clients (FsShell, the RM's REST API, WebHDFS), not tfos's."""

import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def hadoop(tmp_path_factory):
    from tfos.testing.hadoop import HadoopCluster

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
        left = [p for p in os.listdir("/proc") if p.isdigit() and _cluster_marker(p, base)]
        assert not left, f"Hadoop processes left after down: {left}"


def _cluster_marker(pid: str, base) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f"-Dtfos.hadoop.cluster={base}".encode() in f.read()
    except OSError:
        return False
